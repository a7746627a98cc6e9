use std::sync::Mutex;

use dra_proto::dra::v1beta1::dra_plugin_server::DraPlugin as _;
use futures::future::BoxFuture;

use super::*;
use crate::grpc::dra::NotImplementedPreparer;

fn claim(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        name: format!("claim-{}", uid.to_lowercase()),
        uid: uid.into(),
    }
}

/// Answers a fixed set of UIDs (ignoring what was asked), and records the
/// batches it was given.
struct Scripted {
    answer: Vec<&'static str>,
    share_id: Option<&'static str>,
    seen: Mutex<Vec<Vec<String>>>,
}

impl Scripted {
    fn new(answer: Vec<&'static str>) -> Self {
        Self {
            answer,
            share_id: None,
            seen: Mutex::new(Vec::new()),
        }
    }
}

impl ClaimPreparer for Scripted {
    fn prepare<'a>(
        &'a self,
        claims: &'a [ClaimRef],
    ) -> BoxFuture<'a, ClaimResults<Vec<PreparedDevice>>> {
        self.seen
            .lock()
            .unwrap()
            .push(claims.iter().map(|c| c.uid.clone()).collect());
        Box::pin(async move {
            self.answer
                .iter()
                .map(|u| {
                    let dev = PreparedDevice {
                        pool_name: "node-a".into(),
                        device_name: "gpu-0".into(),
                        cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={u}-gpu-0")],
                        share_id: self.share_id.map(str::to_owned),
                        ..PreparedDevice::default()
                    };
                    ((*u).to_owned(), Ok(vec![dev]))
                })
                .collect()
        })
    }

    fn unprepare<'a>(&'a self, claims: &'a [ClaimRef]) -> BoxFuture<'a, ClaimResults<()>> {
        self.seen
            .lock()
            .unwrap()
            .push(claims.iter().map(|c| c.uid.clone()).collect());
        Box::pin(async move {
            self.answer
                .iter()
                .map(|u| ((*u).to_owned(), Ok(())))
                .collect()
        })
    }
}

fn core(p: Arc<dyn ClaimPreparer>) -> (DraCore, GrpcMetrics) {
    let m = GrpcMetrics::default();
    (DraCore::new(p, m.clone()), m)
}

#[tokio::test]
async fn not_implemented_prepare_is_a_per_claim_error_and_unprepare_succeeds() {
    let (core, metrics) = core(Arc::new(NotImplementedPreparer));
    let answers = core.prepare(vec![claim("a"), claim("b")]).await;
    assert_eq!(answers.keys().collect::<Vec<_>>(), ["a", "b"]);
    for r in answers.values() {
        let e = r.as_ref().unwrap_err();
        assert!(e.to_string().contains("not implemented yet"), "{e}");
    }
    assert_eq!(metrics.claim_count(Operation::prepare, Outcome::error), 2);
    let answers = core.unprepare(vec![claim("never-seen")]).await;
    assert_eq!(answers["never-seen"], Ok(()));
}

#[tokio::test]
async fn preparer_gaps_and_extras_never_reach_kubelet() {
    // The preparer answers "a" and "zzz" but not "b".
    let p = Arc::new(Scripted::new(vec!["a", "zzz"]));
    let (core, _) = core(p.clone());
    let answers = core.prepare(vec![claim("a"), claim("b")]).await;
    assert_eq!(answers.keys().collect::<Vec<_>>(), ["a", "b"]);
    assert!(answers["a"].is_ok());
    assert_eq!(answers["b"], Err(ClaimError::Missing("b".into())));
}

#[tokio::test]
async fn invalid_and_duplicate_claims_are_answered_without_the_preparer() {
    let p = Arc::new(Scripted::new(vec!["ok"]));
    let (core, _) = core(p.clone());
    let mut bad_ns = claim("badns");
    bad_ns.namespace = "Not/A/Namespace".into();
    let answers = core
        .prepare(vec![
            claim("ok"),
            claim("dup"),
            claim(""),
            claim("dup"),
            claim("../x"),
            bad_ns,
        ])
        .await;
    assert_eq!(
        answers.keys().collect::<Vec<_>>(),
        ["", "../x", "badns", "dup", "ok"]
    );
    assert!(answers["ok"].is_ok());
    assert_eq!(answers["dup"], Err(ClaimError::Duplicate("dup".into())));
    for k in ["", "../x", "badns"] {
        assert!(matches!(answers[k], Err(ClaimError::Invalid(_))), "{k}");
    }
    // Only the valid, distinct claim reached the preparer.
    assert_eq!(*p.seen.lock().unwrap(), vec![vec!["ok".to_owned()]]);
}

#[tokio::test]
async fn empty_requests_get_empty_answers_without_calling_the_preparer() {
    let p = Arc::new(Scripted::new(vec!["x"]));
    let (core, _) = core(p.clone());
    assert!(core.prepare(Vec::new()).await.is_empty());
    assert!(core.unprepare(vec![claim("")]).await.contains_key(""));
    assert!(p.seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn share_ids_cannot_go_to_a_v1beta1_kubelet() {
    let mut p = Scripted::new(vec!["a"]);
    p.share_id = Some("share-1");
    let (core, _) = core(Arc::new(p));
    let svc = DraV1beta1(core);
    let resp = svc
        .node_prepare_resources(Request::new(v1beta1::NodePrepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: "default".into(),
                uid: "a".into(),
                name: "claim-a".into(),
            }],
        }))
        .await
        .unwrap()
        .into_inner();
    let a = &resp.claims["a"];
    assert!(a.devices.is_empty());
    assert!(a.error.contains("share ID"), "{}", a.error);
}
