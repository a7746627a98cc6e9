//! The allocation rules, one test per rule, through the public API.

mod allocator_support;

use allocator_support::*;
use serde_json::json;

fn four_gpus() -> Vec<k8s_openapi::api::resource::v1::ResourceSlice> {
    vec![slice(
        "node-a-gpus",
        "node-a",
        Some("node-a"),
        json!([gpu("gpu-0", 0, "40Gi"), gpu("gpu-1", 1, "40Gi"), gpu("gpu-2", 2, "80Gi"), gpu("gpu-3", 3, "80Gi")]),
    )]
}

#[test]
fn exact_count_takes_the_first_devices_in_order() {
    let c = claim("c", json!([exact("gpu", "gpu", 2)]), json!(null));
    let out = simulate(&four_gpus(), &[gpu_class()], &[], &c);
    assert_eq!(devices(&out), ["gpu-0", "gpu-1"]);
}
