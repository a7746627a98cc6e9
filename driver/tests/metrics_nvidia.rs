//! NVIDIA's `nvidia_dra_*` metrics on the real plugin's `/metrics`: a scrape
//! after successful prepares (a whole GPU, a static MIG device), a failed
//! prepare, an unprepare and a restart shows every series with NVIDIA's
//! names and labels, beside ours.

mod common;

use common::http_get;
use common::prepare::{Node, node};
use gpu_dra_sim::kubelet::DraVersion;
use serde_json::json;

const DRIVER: &str = "gpu.nvidia.com";

async fn scrape(n: &Node) -> String {
    let addr = n.plugin.metrics_addr().await;
    let text = http_get(&addr, "/metrics").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text
}

/// The value of the sample line `series` (name and labels as written).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse().expect("a number"))
}

fn req(name: &str, op: &str) -> String {
    format!(r#"nvidia_dra_{name}{{driver="{DRIVER}",operation="{op}"}}"#)
}

fn devices(t: &str) -> String {
    format!(
        r#"nvidia_dra_prepared_devices{{node="{}",driver="{DRIVER}",device_type="{t}"}}"#,
        common::NODE
    )
}

fn errors(op: &str) -> String {
    format!(r#"nvidia_dra_node_{op}_errors_total{{driver="{DRIVER}",error_type="{op}_devices"}}"#)
}

#[tokio::test]
async fn a_scrape_after_prepares_and_failures_shows_every_nvidia_series() {
    let mut n = node("mixed", &["--metrics-addr", "127.0.0.1:0"], DraVersion::V1).await;

    // Before any claim: the series NVIDIA creates at start, at zero.
    let text = scrape(&n).await;
    for op in ["prepare", "unprepare"] {
        assert_eq!(
            sample(&text, &req("requests_total", op)),
            Some(0.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, &req("requests_inflight", op)),
            Some(0.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, &req("request_duration_seconds_count", op)),
            Some(0.0),
            "{text}"
        );
    }
    for t in ["gpu", "mig", "vfio", "unknown"] {
        assert_eq!(sample(&text, &devices(t)), Some(0.0), "{text}");
    }

    let mig = n.device_starting_with("gpu-1-mig-").await;
    let whole = n.gpu_claim("whole", "gpu-0").await;
    let part = n
        .claim(
            "part",
            json!([common::prepare::result("mig", &mig)]),
            json!([]),
        )
        .await;
    // A device this node does not have: the prepare fails.
    let bad = n.gpu_claim("bad", "gpu-99").await;
    n.prepare_ok(&whole).await;
    n.prepare_ok(&part).await;
    let r = n.prepare(std::slice::from_ref(&bad)).await;
    assert!(r[&bad.uid].error.is_some(), "{r:?}");

    let text = scrape(&n).await;
    assert_eq!(
        sample(&text, &req("requests_total", "prepare")),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, &req("request_duration_seconds_count", "prepare")),
        Some(2.0),
        "{text}"
    );
    let p = format!(r#"driver="{DRIVER}",operation="prepare""#);
    // prometheus-client writes `le` first.
    let le = |b: &str| format!(r#"nvidia_dra_request_duration_seconds_bucket{{le="{b}",{p}}}"#);
    for b in [
        "0.05", "0.1", "0.2", "0.4", "0.8", "1.6", "3.2", "6.4", "12.8",
    ] {
        assert!(
            sample(&text, &le(b)).is_some(),
            "bucket {b} missing:\n{text}"
        );
    }
    assert_eq!(sample(&text, &le("+Inf")), Some(2.0), "{text}");
    assert_eq!(sample(&text, &errors("prepare")), Some(1.0), "{text}");
    assert_eq!(sample(&text, &devices("gpu")), Some(1.0), "{text}");
    assert_eq!(sample(&text, &devices("mig")), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, &req("requests_inflight", "prepare")),
        Some(0.0),
        "{text}"
    );
    // Ours are still there, under our names.
    assert!(
        text.contains(
            r#"gpu_kubelet_plugin_kubelet_claims_total{operation="prepare",result="error"} 1"#
        ),
        "{text}"
    );

    // A restart counts the claims it finds prepared in the checkpoint.
    n.restart(&[]).await;
    let text = scrape(&n).await;
    assert_eq!(sample(&text, &devices("gpu")), Some(1.0), "{text}");
    assert_eq!(sample(&text, &devices("mig")), Some(1.0), "{text}");

    n.unprepare_ok(&whole).await;
    let text = scrape(&n).await;
    assert_eq!(
        sample(&text, &req("requests_total", "unprepare")),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, &devices("gpu")), Some(0.0), "{text}");
    assert_eq!(sample(&text, &devices("mig")), Some(1.0), "{text}");
    // An unprepare error: a request kubelet could not send (empty UID).
    let broken = gpu_dra_sim::kubelet::Claim::new("default", "broken", "");
    let r = n
        .kubelet
        .unprepare(std::slice::from_ref(&broken))
        .await
        .unwrap();
    assert!(r.values().all(|c| c.error.is_some()), "{r:?}");
    let text = scrape(&n).await;
    assert_eq!(sample(&text, &errors("unprepare")), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, &req("requests_total", "unprepare")),
        Some(1.0),
        "{text}"
    );
}
