//! Concurrent claim preparation, end to end (real plugin binary, fake NVML,
//! kubelet simulator, test API server):
//!
//! - 64 claims on the 8 GPUs of a DGX H100 with `--dynamic-mig`, prepared at
//!   once (64 concurrent kubelet calls, and one call of 64 claims): every
//!   one of the seven 1g.10gb placements of every GPU, plus one claim per GPU
//!   for the whole GPU, which overlaps them. Every call is answered (no lock
//!   timeout, no hang) and no device goes to two claims: per GPU, whichever
//!   claim got the GPU's lock first decides: either the seven MIG claims
//!   hold the GPU and the whole-GPU claim is refused, or the whole-GPU claim
//!   holds it and the seven are refused, each refusal with the exclusivity
//!   message naming a claim that holds the GPU, and leaving nothing. The MIG
//!   devices created have distinct UUIDs. A retry of every refused claim is
//!   refused again; unprepare of all 64 at once leaves nothing.
//! - Prepares on different GPUs overlap: while a prepare on GPU 0 waits for
//!   its MPS daemon, a prepare on GPU 1 completes, and one on GPU 0 waits.
//!   Shown by the order of completion (with the margin of the plugin's MPS
//!   readiness timeout), never by measuring durations.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::prepare::{LOCK_LOGS, Node, gpu_config, node, node_with, result};
use common::{DRIVER, NODE};
use futures::FutureExt;
use gpu_dra_sim::kubelet::{Claim, DraVersion, PrepareResult};
use serde_json::{Value, json};

/// Bound on everything one round of 64 calls may take: generous, a hang or
/// a lock timeout shows as a failure instead of a stuck test.
const ROUND_LIMIT: Duration = Duration::from_secs(120);
const GPUS: u32 = 8;
const PLACEMENTS: usize = 7;

/// The exclusivity refusal (preparer's `PrepareError::Conflict`).
const CONFLICT: &str = "a device is never given to two claims";

/// One claim of the 64.
struct Planned {
    claim: Claim,
    gpu: u32,
    /// Whole GPU (else a 1g.10gb MIG device).
    whole: bool,
}

/// The 64 claims: per GPU its seven 1g.10gb placements (from the published
/// slices) and the whole GPU, the whole-GPU claim among the MIG claims.
async fn sixty_four(n: &Node) -> Vec<Planned> {
    let names = n.device_names().await;
    let mut out = Vec::new();
    for gpu in 0..GPUS {
        let prefix = format!("gpu-{gpu}-mig-1g10gb-19-");
        let mut placements: Vec<&String> =
            names.iter().filter(|d| d.starts_with(&prefix)).collect();
        placements.sort();
        assert_eq!(
            placements.len(),
            PLACEMENTS,
            "1g.10gb placements of GPU {gpu}: {placements:?}"
        );
        for (i, device) in placements.into_iter().enumerate() {
            if i == 3 {
                let claim = n
                    .claim(
                        &format!("whole-{gpu}"),
                        json!([result("gpu", &format!("gpu-{gpu}"))]),
                        json!([]),
                    )
                    .await;
                out.push(Planned {
                    claim,
                    gpu,
                    whole: true,
                });
            }
            let claim = n
                .claim(
                    &format!("mig-{gpu}-{i}"),
                    json!([result("mig", device)]),
                    json!([]),
                )
                .await;
            out.push(Planned {
                claim,
                gpu,
                whole: false,
            });
        }
    }
    assert_eq!(out.len(), 64);
    out
}

/// Prepares every claim with one concurrent kubelet call each.
async fn prepare_concurrently(n: &Node, claims: &[Claim]) -> BTreeMap<String, PrepareResult> {
    let calls = claims
        .iter()
        .map(|c| n.kubelet.prepare(std::slice::from_ref(c)));
    let answers = tokio::time::timeout(ROUND_LIMIT, futures::future::join_all(calls))
        .await
        .unwrap_or_else(|_| panic!("prepares still running after {ROUND_LIMIT:?}\n{}", n.logs()));
    let mut out = BTreeMap::new();
    for (claim, answer) in claims.iter().zip(answers) {
        let mut answer = answer
            .unwrap_or_else(|e| panic!("prepare of {} failed: {e}\n{}", claim.name, n.logs()));
        out.insert(claim.uid.clone(), answer.remove(&claim.uid).unwrap());
    }
    out
}

/// Prepares every claim in one kubelet call.
async fn prepare_batch(n: &Node, claims: &[Claim]) -> BTreeMap<String, PrepareResult> {
    tokio::time::timeout(ROUND_LIMIT, n.kubelet.prepare(claims))
        .await
        .unwrap_or_else(|_| panic!("batch still running after {ROUND_LIMIT:?}\n{}", n.logs()))
        .unwrap_or_else(|e| panic!("batch prepare failed: {e}\n{}", n.logs()))
}

/// Our entries in the claim's `status.devices`, once there are
/// `expected` entries (written in the background after the answer).
async fn our_status(n: &Node, claim: &Claim, expected: usize) -> Vec<Value> {
    n.status_devices_eventually(claim, expected)
        .await
        .into_iter()
        .filter(|d| d["driver"] == DRIVER && d["pool"] == NODE)
        .collect()
}

/// The claim a refusal names (`... already prepared for claim ns/name (uid)`).
fn holder(error: &str) -> &str {
    error
        .split_once("already prepared for claim default/")
        .and_then(|(_, rest)| rest.split_once(' '))
        .map_or("", |(name, _)| name)
}

/// Checks the outcome of a round (see the module docs); returns the names
/// of the claims that hold devices.
async fn check_round(
    n: &Node,
    planned: &[Planned],
    results: &BTreeMap<String, PrepareResult>,
) -> BTreeSet<String> {
    let ok = |p: &Planned| results[&p.claim.uid].error.is_none();
    let winners: BTreeSet<String> = planned
        .iter()
        .filter(|p| ok(p))
        .map(|p| p.claim.name.clone())
        .collect();
    let mut mig_uuids = BTreeSet::new();
    for gpu in 0..GPUS {
        let on_gpu: Vec<&Planned> = planned.iter().filter(|p| p.gpu == gpu).collect();
        let whole = on_gpu.iter().find(|p| p.whole).unwrap();
        let migs_ok = on_gpu.iter().filter(|p| !p.whole && ok(p)).count();
        let expected = if ok(whole) { 0 } else { PLACEMENTS };
        assert_eq!(
            migs_ok,
            expected,
            "GPU {gpu}: whole-GPU claim {}, {migs_ok} MIG claims prepared: {:?}\n{}",
            if ok(whole) { "prepared" } else { "refused" },
            on_gpu
                .iter()
                .map(|p| (&p.claim.name, &results[&p.claim.uid].error))
                .collect::<Vec<_>>(),
            n.logs()
        );
        for p in on_gpu {
            let r = &results[&p.claim.uid];
            let status = our_status(n, &p.claim, usize::from(r.error.is_none())).await;
            if let Some(error) = &r.error {
                // Refused by the exclusivity rule, in favour of a claim that
                // holds this GPU; nothing left behind.
                assert!(
                    error.contains(CONFLICT),
                    "{}: {error}\n{}",
                    p.claim.name,
                    n.logs()
                );
                let by = holder(error);
                let same_gpu = planned
                    .iter()
                    .any(|q| q.claim.name == by && q.gpu == gpu && winners.contains(by));
                assert!(
                    same_gpu,
                    "{} refused for {by:?}, not a holder of GPU {gpu}: {error}",
                    p.claim.name
                );
                assert!(r.devices.is_empty(), "{}: {:?}", p.claim.name, r.devices);
                assert!(!n.spec_path(&p.claim).exists(), "{}", p.claim.name);
                assert!(status.is_empty(), "{}: {status:?}", p.claim.name);
                continue;
            }
            assert_eq!(r.devices.len(), 1, "{}: {:?}", p.claim.name, r.devices);
            assert!(n.spec_path(&p.claim).is_file(), "{}", p.claim.name);
            assert_eq!(status.len(), 1, "{}: {status:?}", p.claim.name);
            let uuid = status[0]["data"]["uuid"].as_str().unwrap_or_default();
            if p.whole {
                assert!(uuid.starts_with("GPU-"), "{}: {status:?}", p.claim.name);
            } else {
                assert!(uuid.starts_with("MIG-"), "{}: {status:?}", p.claim.name);
                assert!(
                    mig_uuids.insert(uuid.to_owned()),
                    "MIG UUID {uuid} given twice (again to {})",
                    p.claim.name
                );
            }
        }
    }
    let whole_won = planned.iter().filter(|p| p.whole && ok(p)).count();
    eprintln!(
        "GPUs held by their MIG claims: {}, by their whole-GPU claim: {whole_won}",
        GPUS as usize - whole_won
    );
    // What the node holds matches the answers exactly.
    let mut entries = n.checkpoint_claims();
    entries.sort();
    let mut expected: Vec<String> = planned
        .iter()
        .filter(|p| ok(p))
        .map(|p| p.claim.uid.clone())
        .collect();
    expected.sort();
    assert_eq!(entries, expected, "checkpoint entries\n{}", n.logs());
    assert_eq!(n.cdi_files().len(), winners.len(), "{:?}", n.cdi_files());
    assert_eq!(
        n.mig_instances().len(),
        mig_uuids.len(),
        "MIG instances in NVML: {:?}",
        n.mig_instances()
    );
    assert_eq!(
        n.mig_caps().len(),
        2 * mig_uuids.len(),
        "{:?}",
        n.mig_caps()
    );
    winners
}

/// Unprepares all claims at once and checks nothing is left.
async fn unprepare_all(n: &Node, planned: &[Planned]) {
    let calls = planned
        .iter()
        .map(|p| n.kubelet.unprepare(std::slice::from_ref(&p.claim)));
    let answers = tokio::time::timeout(ROUND_LIMIT, futures::future::join_all(calls))
        .await
        .unwrap_or_else(|_| panic!("unprepares still running after {ROUND_LIMIT:?}"));
    for (p, answer) in planned.iter().zip(answers) {
        let answer = answer.unwrap_or_else(|e| panic!("unprepare of {}: {e}", p.claim.name));
        assert_eq!(
            answer[&p.claim.uid].error,
            None,
            "{}\n{}",
            p.claim.name,
            n.logs()
        );
        let status = our_status(n, &p.claim, 0).await;
        assert!(status.is_empty(), "{}: {status:?}", p.claim.name);
    }
    assert!(n.checkpoint_claims().is_empty(), "{:?}", n.checkpoint());
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
    assert!(n.mig_instances().is_empty(), "{:?}", n.mig_instances());
    assert!(n.mig_caps().is_empty(), "{:?}", n.mig_caps());
}

/// The whole scenario, the first round sent by `round`.
async fn sixty_four_claims(batch: bool) {
    let n = node("dgx-h100", &["--dynamic-mig"], DraVersion::V1).await;
    let planned = sixty_four(&n).await;
    let claims: Vec<Claim> = planned.iter().map(|p| p.claim.clone()).collect();
    let results = if batch {
        prepare_batch(&n, &claims).await
    } else {
        prepare_concurrently(&n, &claims).await
    };
    assert_eq!(results.len(), 64);
    let winners = check_round(&n, &planned, &results).await;

    // The state is settled now: every refused claim is refused again.
    let losers: Vec<Claim> = planned
        .iter()
        .filter(|p| !winners.contains(&p.claim.name))
        .map(|p| p.claim.clone())
        .collect();
    assert_eq!(losers.len(), 64 - winners.len());
    let again = prepare_concurrently(&n, &losers).await;
    for c in &losers {
        let e = again[&c.uid].error.as_deref().unwrap_or_default();
        assert!(e.contains(CONFLICT), "{}: {e:?}", c.name);
    }
    // And the prepared ones answer the same devices again.
    let mut all = results.clone();
    all.extend(again);
    assert_eq!(
        check_round(&n, &planned, &all).await,
        winners,
        "a retry changed the outcome"
    );

    unprepare_all(&n, &planned).await;
}

#[tokio::test]
async fn sixty_four_concurrent_calls_on_eight_gpus_never_share_a_device() {
    sixty_four_claims(false).await;
}

#[tokio::test]
async fn one_call_of_sixty_four_claims_on_eight_gpus_never_shares_a_device() {
    sixty_four_claims(true).await;
}

#[tokio::test]
async fn prepares_on_different_gpus_overlap() {
    let n = node("t4-inference", &[], DraVersion::V1).await;
    // A: an MPS claim on GPU 0 whose daemon never gets ready, so its
    // prepare holds GPU 0's lock until the plugin's readiness timeout
    // (seconds) and then fails.
    n.fake_behaves(fake_driver_root::Behaviour {
        mps_never_ready: true,
        ..fake_driver_root::Behaviour::default()
    });
    let slow = n
        .claim(
            "slow",
            json!([result("gpu", "gpu-0")]),
            json!([gpu_config(json!({"strategy": "MPS"}))]),
        )
        .await;
    // B: GPU 1. C: GPU 0 again.
    let other = n.gpu_claim("other-gpu", "gpu-1").await;
    let same = n.gpu_claim("same-gpu", "gpu-0").await;

    let call_a = n.kubelet.prepare(std::slice::from_ref(&slow));
    tokio::pin!(call_a);
    // Drive A until it is inside its hardware step (the daemon was
    // started), that is, holding GPU 0.
    let limit = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        tokio::select! {
            r = &mut call_a => panic!("A finished before its daemon started: {r:?}\n{}", n.logs()),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        let started = n
            .env
            .driver_root
            .mps_control_calls()
            // A line being written reads as malformed: not yet.
            .unwrap_or_default()
            .iter()
            .any(|c| c.args.first().is_some_and(|a| a == "-d"));
        if started {
            break;
        }
        assert!(
            tokio::time::Instant::now() < limit,
            "A's daemon never started\n{}",
            n.logs()
        );
    }

    // B, on another GPU, completes while A still runs.
    let call_b = n.kubelet.prepare(std::slice::from_ref(&other));
    tokio::pin!(call_b);
    let (rb, mut ra) = tokio::select! {
        biased;
        r = &mut call_b => (r.unwrap(), None),
        r = &mut call_a => match (&mut call_b).now_or_never() {
            // Both answered by the time this task ran: no order to see.
            Some(rb) => (rb.unwrap(), Some(r)),
            None => panic!("A finished before B (B waited for GPU 0's lock?): {r:?}\n{}", n.logs()),
        },
    };
    assert_eq!(rb[&other.uid].error, None, "{}", n.logs());

    // C, on A's GPU, is answered only after A: when C's answer is there,
    // A's is too (within 2.5 s, room for A's rollback on a loaded machine;
    // a C that did not wait would be ahead by most of A's 5 s readiness
    // timeout).
    let call_c = n.kubelet.prepare(std::slice::from_ref(&same));
    tokio::pin!(call_c);
    let rc = if ra.is_some() {
        call_c.await
    } else {
        let (a_done, rc) = tokio::select! {
            biased;
            r = &mut call_a => (r, call_c.await),
            r = &mut call_c => match tokio::time::timeout(Duration::from_millis(2500), &mut call_a).await {
                Ok(a_done) => (a_done, r),
                Err(elapsed) => panic!("C finished before A ({elapsed}) on the same GPU: {r:?}\n{}", n.logs()),
            },
        };
        ra = Some(a_done);
        rc
    };
    let ra = ra.unwrap().unwrap();
    let rc = rc.unwrap();
    let error = ra[&slow.uid].error.clone().unwrap_or_default();
    assert!(error.contains("not ready"), "A: {error:?}\n{}", n.logs());
    assert_eq!(rc[&same.uid].error, None, "{}", n.logs());

    // A's failure left nothing: no daemon, compute mode back.
    assert_eq!(n.mps_daemons(), 0, "{}", n.logs());
    assert_eq!(n.processes(), 0, "{}", n.logs());
    assert!(!n.spec_path(&slow).exists());
    let mut entries = n.checkpoint_claims();
    entries.sort();
    let mut expected = vec![other.uid.clone(), same.uid.clone()];
    expected.sort();
    assert_eq!(entries, expected);
    let modes = n.compute_modes();
    assert!(modes.values().all(|m| m == "Default"), "{modes:?}");

    n.unprepare_ok(&other).await;
    n.unprepare_ok(&same).await;
    assert!(n.checkpoint_claims().is_empty());
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
}

#[tokio::test]
async fn concurrent_calls_for_one_claim_prepare_it_once() {
    let n = node("dgx-h100", &["--dynamic-mig"], DraVersion::V1).await;
    let mig = n.device_starting_with("gpu-0-mig-1g").await;
    let claim = n
        .claim("once", json!([result("mig", &mig)]), json!([]))
        .await;
    // Four kubelet calls for the same claim at once (a retry racing the
    // first call): one prepare, four identical answers.
    let calls = (0..4).map(|_| n.kubelet.prepare(std::slice::from_ref(&claim)));
    let answers = tokio::time::timeout(ROUND_LIMIT, futures::future::join_all(calls))
        .await
        .unwrap_or_else(|_| panic!("prepares still running\n{}", n.logs()));
    let answers: Vec<PrepareResult> = answers
        .into_iter()
        .map(|a| {
            let mut a = a.unwrap_or_else(|e| panic!("prepare call failed: {e}\n{}", n.logs()));
            a.remove(&claim.uid).unwrap()
        })
        .collect();
    for a in &answers {
        assert!(a.error.is_none(), "{:?}\n{}", a.error, n.logs());
        assert_eq!(
            a.devices, answers[0].devices,
            "every call gets the same answer"
        );
    }
    assert_eq!(
        n.mig_instances().len(),
        1,
        "one MIG device: {:?}",
        n.mig_instances()
    );
    assert_eq!(n.cdi_files().len(), 1, "{:?}", n.cdi_files());
    assert_eq!(n.checkpoint_claims(), vec![claim.uid.clone()]);
    // Two unprepares at once: one undoes, the other finds nothing.
    let calls = (0..2).map(|_| n.kubelet.unprepare(std::slice::from_ref(&claim)));
    for answer in futures::future::join_all(calls).await {
        let answer = answer.unwrap_or_else(|e| panic!("unprepare call failed: {e}\n{}", n.logs()));
        assert_eq!(answer[&claim.uid].error, None, "{}", n.logs());
    }
    assert!(n.mig_instances().is_empty(), "{:?}", n.mig_instances());
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
    assert!(n.checkpoint_claims().is_empty());
}

#[tokio::test]
async fn memory_shares_prepared_and_unprepared_at_once_keep_the_daemon_while_used() {
    let n = node("t4-inference", &["--memory-sharing=all"], DraVersion::V1).await;
    let mut claims = Vec::new();
    for i in 0..8 {
        let mut r = result("share", "gpu-1");
        r["shareID"] = json!(format!("11111111-0000-4000-8000-00000000000{i}"));
        r["consumedCapacity"] = json!({"memory": "1Gi"});
        claims.push(n.claim(&format!("share-{i}"), json!([r]), json!([])).await);
    }
    let answers = prepare_concurrently(&n, &claims).await;
    for (uid, a) in &answers {
        assert!(a.error.is_none(), "{uid}: {:?}\n{}", a.error, n.logs());
    }
    assert_eq!(n.mps_daemons(), 1, "one daemon for the GPU\n{}", n.logs());
    assert_eq!(n.checkpoint_claims().len(), 8);
    assert_eq!(
        n.exclusive_gpus().len(),
        1,
        "the shared GPU: {:?}",
        n.compute_modes()
    );

    // Half leave at once while the other half are prepared again (answered
    // from the checkpoint): the daemon stays for the four left.
    let (leaving, staying) = claims.split_at(4);
    let unprepares = leaving
        .iter()
        .map(|c| n.kubelet.unprepare(std::slice::from_ref(c)));
    let again = prepare_concurrently(&n, staying);
    let (gone, again) = tokio::join!(futures::future::join_all(unprepares), again);
    for g in gone {
        assert!(
            g.unwrap().values().all(|r| r.error.is_none()),
            "{}",
            n.logs()
        );
    }
    assert!(again.values().all(|r| r.error.is_none()), "{}", n.logs());
    assert_eq!(n.mps_daemons(), 1, "four claims still use the daemon");

    let unprepares = staying
        .iter()
        .map(|c| n.kubelet.unprepare(std::slice::from_ref(c)));
    for g in futures::future::join_all(unprepares).await {
        assert!(
            g.unwrap().values().all(|r| r.error.is_none()),
            "{}",
            n.logs()
        );
    }
    assert_eq!(
        n.mps_daemons(),
        0,
        "stopped after the last claim\n{}",
        n.logs()
    );
    assert_eq!(n.processes(), 0, "no process left");
    assert_eq!(
        n.exclusive_gpus().len(),
        0,
        "mode restored: {:?}",
        n.compute_modes()
    );
    assert!(n.checkpoint_claims().is_empty());
}

/// A `dgx-h100` node whose plugin logs, at debug level, who holds and who
/// waits for a GPU's lock, which orders concurrent calls without sleeps.
async fn node_logging_locks() -> Node {
    node_with("dgx-h100", &[], DraVersion::V1, &[LOCK_LOGS]).await
}

#[tokio::test]
async fn a_second_unprepare_waiting_for_the_gpu_does_not_undo_the_claim_prepared_meanwhile() {
    let n = node_logging_locks().await;
    let first = n.mps_claim("first").await;
    let first_ref = std::slice::from_ref(&first);
    n.prepare_ok(&first).await;
    let next = n.mps_claim("next").await;
    // Every answer of an MPS daemon now takes a while (under the plugin's
    // 5 s command timeout), so the first unprepare holds GPU 0 (stopping
    // the daemon) while the others queue.
    n.fake_behaves(fake_driver_root::Behaviour {
        mps_reply_delay_ms: 3500,
        ..Default::default()
    });
    let mark = n.log_mark();
    let unprepare_1 = n.kubelet.unprepare(first_ref);
    // Once the first unprepare holds GPU 0, a new MPS claim on GPU 0 queues
    // for its lock; then a second unprepare of the first claim (a kubelet
    // retry) queues behind it, having seen the first claim's entry still
    // there.
    let prepare = async {
        n.wait_line(mark, &["GPU locks held", &first.uid]).await;
        n.kubelet.prepare(std::slice::from_ref(&next)).await
    };
    let unprepare_2 = async {
        n.wait_line(mark, &["waiting for a GPU's lock", &next.uid])
            .await;
        // The daemon's `quit` took its delay already; the new claim's
        // daemon, started after it, answers at once.
        n.fake_behaves(fake_driver_root::Behaviour::default());
        n.kubelet.unprepare(first_ref).await
    };
    let (u1, p, u2) = tokio::time::timeout(
        ROUND_LIMIT,
        Box::pin(async { tokio::join!(unprepare_1, prepare, unprepare_2) }),
    )
    .await
    .unwrap_or_else(|_| panic!("calls still running\n{}", n.logs()));
    // The race took place: the retry saw the entry and queued for GPU 0.
    assert_eq!(
        n.lines_after(mark, &["waiting for a GPU's lock", &first.uid])
            .len(),
        1,
        "the second unprepare never waited for GPU 0\n{}",
        n.logs()
    );
    for u in [u1, u2] {
        let u = u.unwrap_or_else(|e| panic!("unprepare call failed: {e}\n{}", n.logs()));
        assert_eq!(u[&first.uid].error, None, "{}", n.logs());
    }
    let p = p.unwrap_or_else(|e| panic!("prepare call failed: {e}\n{}", n.logs()));
    assert_eq!(p[&next.uid].error, None, "{}", n.logs());

    // The new claim keeps what it set up: its daemon, its compute mode,
    // its spec and its entry.
    assert_eq!(
        n.checkpoint_claims(),
        vec![next.uid.clone()],
        "{}",
        n.logs()
    );
    assert_eq!(n.mps_daemons(), 1, "{}", n.logs());
    assert_eq!(n.cdi_files().len(), 1, "{:?}", n.cdi_files());
    let exclusive = n.exclusive_gpus();
    assert_eq!(exclusive.len(), 1, "GPU 0 for the new claim\n{}", n.logs());
    n.unprepare_ok(&next).await;
    assert_eq!(n.mps_daemons(), 0);
    assert!(n.checkpoint_claims().is_empty());
    assert!(n.exclusive_gpus().is_empty(), "{:?}", n.compute_modes());
}

/// Kubelet gives up on a prepare (the pod was deleted while its claim
/// waited for a GPU) and sends the unprepare at once. The prepare runs on
/// in the plugin, so the unprepare waits for it and then undoes it:
/// answered before, it would have found nothing, and the prepare's devices
/// would have stayed prepared with no unprepare left to come.
#[tokio::test]
async fn an_unprepare_sent_while_its_claim_still_prepares_undoes_that_prepare() {
    let n = node_logging_locks().await;
    let first = n.mps_claim("first").await;
    n.prepare_ok(&first).await;
    let late = n.gpu_claim("late", "gpu-0").await;
    let late_ref = std::slice::from_ref(&late);
    // Stopping the first claim's daemon holds GPU 0 for a while.
    n.fake_behaves(fake_driver_root::Behaviour {
        mps_reply_delay_ms: 3500,
        ..Default::default()
    });
    let mark = n.log_mark();
    let unprepare_first = n.unprepare_ok(&first);
    let late_calls = async {
        n.wait_line(mark, &["GPU locks held", &first.uid]).await;
        // The prepare waits for GPU 0; kubelet gives up on it (the call
        // is dropped) and unprepares the claim.
        let prepare = n.kubelet.prepare(late_ref);
        let waiting = ["waiting for a GPU's lock", late.uid.as_str()];
        tokio::select! {
            answer = prepare => panic!("answered while GPU 0 was held: {answer:?}\n{}", n.logs()),
            () = n.wait_line(mark, &waiting) => {}
        }
        n.fake_behaves(fake_driver_root::Behaviour::default());
        n.unprepare_ok(&late).await;
    };
    tokio::time::timeout(
        ROUND_LIMIT,
        Box::pin(async { tokio::join!(unprepare_first, late_calls) }),
    )
    .await
    .unwrap_or_else(|_| panic!("calls still running\n{}", n.logs()));
    // The given-up prepare ran to its end before the unprepare undid it.
    let prepared = n.lines_after(mark, &["claim prepared", &late.uid]);
    let unprepared = n.lines_after(mark, &["claim unprepared", &late.uid]);
    assert_eq!((prepared.len(), unprepared.len()), (1, 1), "{}", n.logs());
    // Nothing of it is left: no entry, no spec, GPU 0 free for the next.
    assert!(n.checkpoint_claims().is_empty(), "{}", n.checkpoint());
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
    let next = n.gpu_claim("next", "gpu-0").await;
    n.prepare_ok(&next).await;
    n.unprepare_ok(&next).await;
}
