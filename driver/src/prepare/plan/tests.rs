use serde_json::json;

use super::*;

const DRIVER: &str = "gpu.nvidia.com";
const NODE: &str = "node-a";
const UID: &str = "0b8e5a5c-1111-2222-3333-444455556666";

fn catalog() -> HashMap<String, Target> {
    let gpu = |minor: u32, shared: bool| {
        Target::Gpu(GpuTarget {
            index: minor,
            minor,
            uuid: format!("GPU-{minor}"),
            memory_bytes: 80 << 30,
            memory_shared: shared,
            counted_share: false,
            compute_capability: (9, 0),
            dynamic_mig: false,
        })
    };
    HashMap::from([
        ("gpu-0".to_owned(), gpu(0, false)),
        ("gpu-1".to_owned(), gpu(1, true)),
        (
            "gpu-2-mig-1g10gb-19-3".to_owned(),
            Target::Mig(MigTarget {
                request: MigRequest {
                    gpu_index: 2,
                    parent_minor: 2,
                    parent_uuid: "GPU-2".into(),
                    profile_id: 19,
                    placement_start: 3,
                    placement_size: 1,
                },
                dynamic: true,
            }),
        ),
    ])
}

fn claim(results: serde_json::Value, config: serde_json::Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": UID},
        "spec": {},
        "status": {"allocation": {"devices": {"results": results, "config": config}}},
    }))
    .unwrap()
}

fn result(request: &str, device: &str) -> serde_json::Value {
    json!({"request": request, "driver": DRIVER, "pool": NODE, "device": device})
}

fn gpu_config(source: &str, requests: &[&str], interval: &str) -> serde_json::Value {
    json!({
        "source": source,
        "requests": requests,
        "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}}},
    })
}

fn run(c: &ResourceClaim) -> Result<ClaimPlan, PlanError> {
    plan(c, UID, DRIVER, NODE, &catalog())
}

#[test]
fn whole_gpu_without_config_plans_one_device_and_no_config() {
    let p = run(&claim(json!([result("gpu", "gpu-0")]), json!([]))).unwrap();
    assert_eq!(p.uid.0, UID);
    assert_eq!((p.namespace.as_str(), p.name.as_str()), ("ns", "c"));
    assert_eq!(p.devices.len(), 1);
    let d = &p.devices[0];
    assert_eq!(d.requests, ["gpu"]);
    assert_eq!(d.device, "gpu-0");
    assert!(d.config.is_none() && !d.admin && d.consumed_memory.is_none());
    assert_eq!(p.gpu_minors(), [0]);
}

#[test]
fn a_recreated_claim_is_refused_naming_both_uids() {
    let c = claim(json!([result("gpu", "gpu-0")]), json!([]));
    let e = plan(&c, "other-uid", DRIVER, NODE, &catalog()).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, PlanError::UidMismatch { .. }));
    assert!(text.contains("other-uid") && text.contains(UID), "{text}");
}

#[test]
fn an_unallocated_claim_is_refused() {
    let mut c = claim(json!([]), json!([]));
    c.status = None;
    let e = run(&c).unwrap_err();
    assert_eq!(
        e.to_string(),
        "ResourceClaim ns/c is not allocated (status.allocation is empty)"
    );
}

#[test]
fn results_of_other_drivers_and_nodes_are_skipped_and_named_when_nothing_is_ours() {
    let other_driver =
        json!({"request": "a", "driver": "net.example.com", "pool": NODE, "device": "eth0"});
    let other_node = json!({"request": "b", "driver": DRIVER, "pool": "node-b", "device": "gpu-0"});
    let e = run(&claim(
        json!([other_driver.clone(), other_node.clone()]),
        json!([]),
    ))
    .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, PlanError::NothingForUs { .. }));
    assert!(
        text.contains("gpu.nvidia.com/node-b") && text.contains("net.example.com/node-a"),
        "{text}"
    );
    let p = run(&claim(
        json!([other_driver, result("gpu", "gpu-0"), other_node]),
        json!([]),
    ))
    .unwrap();
    assert_eq!(p.devices.len(), 1);
}

#[test]
fn a_device_we_do_not_publish_is_a_precise_error() {
    let e = run(&claim(json!([result("gpu", "gpu-7")]), json!([]))).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("\"gpu-7\"") && text.contains("\"gpu\"") && text.contains(NODE),
        "{text}"
    );
}

#[test]
fn claim_configs_win_over_class_configs_and_other_drivers_are_ignored() {
    let foreign = json!({"source": "FromClaim", "opaque": {"driver": "other.example.com",
        "parameters": {"anything": true}}});
    let c = claim(
        json!([result("gpu", "gpu-0")]),
        json!([
            gpu_config("FromClaim", &[], "Long"),
            gpu_config("FromClass", &[], "Short"),
            foreign
        ]),
    );
    let p = run(&c).unwrap();
    let Some(DeviceConfig::Gpu(cfg)) = &p.devices[0].config else {
        panic!("{:?}", p.devices[0].config)
    };
    assert_eq!(
        cfg.time_slice(),
        Some(gpu_dra_api::config::TimeSliceInterval::Long)
    );
}

#[test]
fn a_broken_config_of_ours_fails_the_claim_even_for_another_request() {
    let bad = json!({"source": "FromClaim", "requests": ["other"], "opaque": {"driver": DRIVER,
        "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "Nope"}}}});
    let e = run(&claim(json!([result("gpu", "gpu-0")]), json!([bad]))).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, PlanError::Config { .. }), "{text}");
    assert!(text.contains("Nope"), "{text}");
    let unknown = json!({"source": "FromClaim", "opaque": {"driver": DRIVER,
        "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "shareing": {}}}});
    let text = run(&claim(json!([result("gpu", "gpu-0")]), json!([unknown])))
        .unwrap_err()
        .to_string();
    assert!(text.contains("shareing"), "{text}");
}

#[test]
fn a_gpu_config_named_for_a_mig_request_is_a_kind_error() {
    let c = claim(
        json!([result("mig", "gpu-2-mig-1g10gb-19-3")]),
        json!([gpu_config("FromClaim", &["mig"], "Long")]),
    );
    let text = run(&c).unwrap_err().to_string();
    assert!(
        text.contains("GpuConfig") && text.contains("\"mig\""),
        "{text}"
    );
}

#[test]
fn one_device_for_two_requests_is_planned_once_with_base_names() {
    let c = claim(
        json!([
            result("main/sub", "gpu-0"),
            result("other", "gpu-0"),
            result("main/sub2", "gpu-0")
        ]),
        json!([]),
    );
    let p = run(&c).unwrap();
    assert_eq!(p.devices.len(), 1);
    assert_eq!(p.devices[0].requests, ["main", "other"]);
}

#[test]
fn shares_admin_access_and_consumed_memory_are_carried() {
    let mut a = result("a", "gpu-1");
    a["shareID"] = json!("aaaaaaaa-0000-0000-0000-000000000001");
    a["consumedCapacity"] = json!({"memory": "10Gi"});
    let mut b = result("b", "gpu-1");
    b["shareID"] = json!("aaaaaaaa-0000-0000-0000-000000000002");
    b["consumedCapacity"] = json!({"memory": "1500m"});
    let mut admin = result("mon", "gpu-0");
    admin["adminAccess"] = json!(true);
    let p = run(&claim(json!([a, b, admin]), json!([]))).unwrap();
    assert_eq!(
        p.devices.len(),
        3,
        "two shares of one device are two devices"
    );
    assert_eq!(p.devices[0].consumed_memory, Some(10 << 30));
    assert_eq!(
        p.devices[1].consumed_memory,
        Some(2),
        "rounded up to whole bytes"
    );
    assert!(p.devices[2].admin);
    assert_eq!(p.gpu_minors(), [0, 1]);
}

#[test]
fn hostile_consumed_capacities_are_errors() {
    for bad in ["-1Gi", "lots", "99999999999999999999999Ei"] {
        let mut r = result("a", "gpu-1");
        r["consumedCapacity"] = json!({"memory": bad});
        let e = run(&claim(json!([r]), json!([]))).unwrap_err();
        assert!(matches!(e, PlanError::Capacity { .. }), "{bad}: {e}");
        assert!(e.to_string().contains(bad), "{e}");
    }
}

#[test]
fn an_unknown_config_source_fails_the_claim_naming_it() {
    // NVIDIA's GetOpaqueDeviceConfigs: "invalid config source", whatever the
    // driver. A forged source must not rank as FromClaim.
    for (driver, requests) in [(DRIVER, vec!["gpu"]), ("other.example.com", vec![])] {
        let mut forged = gpu_config("FromAdmin", &[], "Long");
        forged["opaque"]["driver"] = json!(driver);
        forged["requests"] = json!(requests);
        let c = claim(
            json!([result("gpu", "gpu-0")]),
            json!([gpu_config("FromClass", &[], "Short"), forged]),
        );
        let e = run(&c).unwrap_err();
        assert!(
            matches!(e, PlanError::ConfigSource { index: 1, .. }),
            "{driver}: {e:?}"
        );
        assert_eq!(
            e.to_string(),
            "ResourceClaim ns/c: status.allocation.devices.config[1]: invalid config source \"FromAdmin\": expected FromClass or FromClaim"
        );
    }
    let empty = gpu_config("", &[], "Long");
    let e = run(&claim(json!([result("gpu", "gpu-0")]), json!([empty]))).unwrap_err();
    assert!(
        e.to_string()
            .contains("config[0]: invalid config source \"\""),
        "{e}"
    );
}

#[test]
fn one_device_in_two_results_is_admin_only_if_both_are() {
    let mut mon = result("mon", "gpu-0");
    mon["adminAccess"] = json!(true);
    let work = result("work", "gpu-0");
    for results in [
        json!([mon.clone(), work.clone()]),
        json!([work, mon.clone()]),
    ] {
        let p = run(&claim(results.clone(), json!([]))).unwrap();
        assert_eq!(p.devices.len(), 1, "{results}");
        assert!(!p.devices[0].admin, "{results}");
        assert_eq!(p.devices[0].requests.len(), 2, "{results}");
    }
    let mut mon2 = result("mon2", "gpu-0");
    mon2["adminAccess"] = json!(true);
    let p = run(&claim(json!([mon, mon2]), json!([]))).unwrap();
    assert!(p.devices[0].admin);
}

#[test]
fn one_device_in_two_results_keeps_a_config_given_to_either_request() {
    let interval = |p: &ClaimPlan| match &p.devices[0].config {
        Some(DeviceConfig::Gpu(cfg)) => cfg.time_slice(),
        other => panic!("{other:?}"),
    };
    // the config is named for the second request only: not dropped
    let c = claim(
        json!([result("mon", "gpu-0"), result("work", "gpu-0")]),
        json!([gpu_config("FromClaim", &["work"], "Long")]),
    );
    let p = run(&c).unwrap();
    assert_eq!(
        interval(&p),
        Some(gpu_dra_api::config::TimeSliceInterval::Long)
    );
    // the same config for both (by value) is fine
    let c = claim(
        json!([result("a", "gpu-0"), result("b", "gpu-0")]),
        json!([
            gpu_config("FromClaim", &["a"], "Short"),
            gpu_config("FromClaim", &["b"], "Short")
        ]),
    );
    assert_eq!(
        interval(&run(&c).unwrap()),
        Some(gpu_dra_api::config::TimeSliceInterval::Short)
    );
}

/// Admin access changes nothing on the device: its config is checked but
/// neither applied nor in conflict with the one a normal request gives.
#[test]
fn the_config_of_an_admin_access_result_is_checked_not_applied() {
    let mut mon = result("mon", "gpu-0");
    mon["adminAccess"] = json!(true);
    let interval = |c: &ResourceClaim| match &run(c).unwrap().devices[0].config {
        Some(DeviceConfig::Gpu(cfg)) => cfg.time_slice(),
        None => None,
        other => panic!("{other:?}"),
    };
    let mon_config = gpu_config("FromClaim", &["mon"], "Short");
    for results in [
        json!([mon.clone(), result("work", "gpu-0")]),
        json!([result("work", "gpu-0"), mon.clone()]),
    ] {
        let with_work = claim(
            results.clone(),
            json!([
                mon_config.clone(),
                gpu_config("FromClaim", &["work"], "Long")
            ]),
        );
        assert_eq!(
            interval(&with_work),
            Some(gpu_dra_api::config::TimeSliceInterval::Long),
            "{results}"
        );
        let alone = claim(results.clone(), json!([mon_config.clone()]));
        assert_eq!(interval(&alone), None, "{results}");
    }
    // Still checked: a wrong-kind config of the admin request fails.
    let mut mig_mon = result("mon", "gpu-2-mig-1g10gb-19-3");
    mig_mon["adminAccess"] = json!(true);
    let e = run(&claim(json!([mig_mon]), json!([mon_config]))).unwrap_err();
    assert!(
        matches!(&e, PlanError::Config { request, .. } if request == "mon"),
        "{e}"
    );
}

#[test]
fn one_device_in_two_results_with_different_configs_is_an_error_naming_both() {
    let c = claim(
        json!([result("mon", "gpu-0"), result("work/fast", "gpu-0")]),
        json!([
            gpu_config("FromClaim", &["mon"], "Short"),
            gpu_config("FromClaim", &["work"], "Long")
        ]),
    );
    let e = run(&c).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, PlanError::ConflictingConfigs { .. }), "{text}");
    assert!(
        text.starts_with(
            "ResourceClaim ns/c: device \"gpu-0\" is allocated to both request \"mon\" and request \"work/fast\", but their configs differ ("
        ),
        "{text}"
    );
    assert!(
        text.contains("\"Short\"") && text.contains("\"Long\""),
        "{text}"
    );
    // a wrong-kind config for the second request is no longer skipped
    let c = claim(
        json!([
            result("a", "gpu-2-mig-1g10gb-19-3"),
            result("b", "gpu-2-mig-1g10gb-19-3")
        ]),
        json!([gpu_config("FromClaim", &["b"], "Long")]),
    );
    let e = run(&c).unwrap_err();
    assert!(
        matches!(&e, PlanError::Config { request, .. } if request == "b"),
        "{e}"
    );
}
