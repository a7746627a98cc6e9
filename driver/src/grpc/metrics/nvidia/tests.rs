//! Tests of the `nvidia_dra_*` families: names, labels, buckets and the
//! prepared-device bookkeeping, read back from the text exposition.

use std::time::Duration;

use prometheus_client::registry::Registry;

use super::{DeviceType, NvidiaMetrics, Operation};

fn scrape(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

fn registered() -> (Registry, NvidiaMetrics) {
    let mut registry = Registry::default();
    let m = NvidiaMetrics::new("gpu.nvidia.com", "node-a");
    m.register(&mut registry);
    (registry, m)
}

#[test]
fn first_scrape_has_the_series_nvidia_precreates() {
    let (registry, _m) = registered();
    let text = scrape(&registry);
    for op in ["prepare", "unprepare"] {
        let labels = format!(r#"{{driver="gpu.nvidia.com",operation="{op}"}}"#);
        for line in [
            format!("nvidia_dra_requests_total{labels} 0"),
            format!("nvidia_dra_requests_inflight{labels} 0"),
            format!("nvidia_dra_request_duration_seconds_count{labels} 0"),
        ] {
            assert!(text.contains(&line), "{line} missing:\n{text}");
        }
    }
    for t in ["gpu", "mig", "vfio", "unknown"] {
        let line = format!(
            r#"nvidia_dra_prepared_devices{{node="node-a",driver="gpu.nvidia.com",device_type="{t}"}} 0"#
        );
        assert!(text.contains(&line), "{line} missing:\n{text}");
    }
    assert!(
        text.contains("# TYPE nvidia_dra_requests counter"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE nvidia_dra_request_duration_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE nvidia_dra_requests_inflight gauge"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE nvidia_dra_prepared_devices gauge"),
        "{text}"
    );
    // The error counters appear with their first error, as in NVIDIA's
    // plugin (a labelled family without series is not written).
    assert!(!text.contains("nvidia_dra_node_prepare_errors"), "{text}");
    assert!(!text.contains("nvidia_dra_node_unprepare_errors"), "{text}");
}

#[test]
fn duration_has_nine_buckets_from_50ms_doubling() {
    let (registry, m) = registered();
    m.succeeded(Operation::prepare, Duration::from_millis(3));
    m.succeeded(Operation::prepare, Duration::from_millis(150));
    let text = scrape(&registry);
    let bounds: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("nvidia_dra_request_duration_seconds_bucket")
                && l.contains(r#"operation="prepare""#)
        })
        .map(|l| l.split("le=\"").nth(1).unwrap().split('"').next().unwrap())
        .collect();
    assert_eq!(
        bounds,
        [
            "0.05", "0.1", "0.2", "0.4", "0.8", "1.6", "3.2", "6.4", "12.8", "+Inf"
        ],
        "{text}"
    );
    let p = r#"driver="gpu.nvidia.com",operation="prepare""#;
    for line in [
        format!(r#"nvidia_dra_request_duration_seconds_bucket{{le="0.05",{p}}} 1"#),
        format!(r#"nvidia_dra_request_duration_seconds_bucket{{le="0.1",{p}}} 1"#),
        format!(r#"nvidia_dra_request_duration_seconds_bucket{{le="0.2",{p}}} 2"#),
        format!("nvidia_dra_request_duration_seconds_count{{{p}}} 2"),
        format!("nvidia_dra_requests_total{{{p}}} 2"),
    ] {
        assert!(text.contains(&line), "{line} missing:\n{text}");
    }
}

#[test]
fn failures_count_by_error_type_and_not_as_requests() {
    let (registry, m) = registered();
    m.failed(Operation::prepare);
    m.failed(Operation::prepare);
    m.failed(Operation::unprepare);
    let text = scrape(&registry);
    for line in [
        r#"nvidia_dra_node_prepare_errors_total{driver="gpu.nvidia.com",error_type="prepare_devices"} 2"#,
        r#"nvidia_dra_node_unprepare_errors_total{driver="gpu.nvidia.com",error_type="unprepare_devices"} 1"#,
        r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="prepare"} 0"#,
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
}

#[test]
fn in_flight_counts_claims_until_the_guard_drops() {
    let (registry, m) = registered();
    let a = m.in_flight(Operation::unprepare, 3);
    let b = m.in_flight(Operation::unprepare, 1);
    let line = |n: i64| {
        format!(
            r#"nvidia_dra_requests_inflight{{driver="gpu.nvidia.com",operation="unprepare"}} {n}"#
        )
    };
    assert!(scrape(&registry).contains(&line(4)));
    drop(a);
    assert!(scrape(&registry).contains(&line(1)));
    drop(b);
    assert!(scrape(&registry).contains(&line(0)));
}

#[test]
fn prepared_devices_follow_claims_by_type() {
    let (registry, m) = registered();
    m.prepared("a", ["gpu-0", "gpu-1-mig-1g10gb-19-0"]);
    m.prepared("b", ["gpu-1-mig-1g10gb-19-1", "gpu-vfio-3"]);
    // A retried prepare of the same claim replaces, never adds.
    m.prepared("a", ["gpu-0", "gpu-1-mig-1g10gb-19-0"]);
    assert_eq!(m.prepared_count(DeviceType::gpu), 1);
    assert_eq!(m.prepared_count(DeviceType::mig), 2);
    assert_eq!(m.prepared_count(DeviceType::vfio), 1);
    m.unprepared("a");
    m.unprepared("never-prepared");
    assert_eq!(m.prepared_count(DeviceType::gpu), 0);
    assert_eq!(m.prepared_count(DeviceType::mig), 1);
    let text = scrape(&registry);
    assert!(
        text.contains(r#"nvidia_dra_prepared_devices{node="node-a",driver="gpu.nvidia.com",device_type="mig"} 1"#),
        "{text}"
    );
}

#[test]
fn device_types_by_name_refuse_near_misses() {
    for (name, t) in [
        ("gpu-0", DeviceType::gpu),
        ("gpu-17", DeviceType::gpu),
        ("gpu-1-mig-2g47gb-14-0", DeviceType::mig),
        ("gpu-vfio-0", DeviceType::vfio),
        ("gpu-", DeviceType::unknown),
        ("gpu-x", DeviceType::unknown),
        ("gpu-vfio-", DeviceType::unknown),
        ("gpu-vfio-a", DeviceType::unknown),
        ("gpu--mig-1g", DeviceType::unknown),
        ("gpu-1-mig-", DeviceType::unknown),
        ("mig-1", DeviceType::unknown),
        ("", DeviceType::unknown),
        ("channel-0", DeviceType::unknown),
    ] {
        assert_eq!(DeviceType::of_device(name), t, "{name:?}");
    }
}
