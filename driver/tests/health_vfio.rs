//! The GPU health monitor with `--passthrough`, through the real plugin
//! binary and the fake NVML: a whole-GPU fault injected through the fake's
//! control file taints the GPU's VFIO sibling `gpu-vfio-<index>` as it
//! taints `gpu-<minor>` (issue #43), and the KEP-4680 health stream lists
//! every VFIO device, with the fault on the faulty GPU's sibling.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::health::{health_stream, wait_health};
use common::{NODE, Plugin, TestEnv, inject, short_dir, taints_of};
use gpu_dra_sim::kubelet::DeviceHealth;

/// Four A100 PCIe GPUs, each with a VFIO sibling under `--passthrough`.
const PROFILE: &str = "pcie-a100-bridged";
/// Two poll periods, the debounce and the publisher's write, with room.
const FAULT_WAIT: Duration = Duration::from_secs(5);

/// A plugin with `--passthrough` and fast health timing, its fake NVML
/// driven by the control file `dir/control`.
fn start(dir: &Path) -> (Plugin, std::path::PathBuf) {
    let control = dir.join("control");
    std::fs::write(&control, "").unwrap();
    let env = Arc::new(
        TestEnv::builder(dir)
            .bundled(PROFILE)
            .control(&control)
            .build(),
    );
    let plugin = Plugin::launch(
        &env,
        dir,
        "run",
        &[
            "--passthrough",
            "--health-poll-interval=300ms",
            "--health-quiet-period=1s",
        ],
    );
    (plugin, control)
}

fn health<'a>(list: &'a [DeviceHealth], device: &str) -> &'a DeviceHealth {
    list.iter()
        .find(|d| d.device_name == device)
        .unwrap_or_else(|| panic!("{device} not in {list:#?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gpu_fault_taints_its_vfio_sibling_and_the_stream_lists_it() {
    let dir = short_dir();
    let (plugin, control) = start(dir.path());
    let env = plugin.env.clone();
    env.wait_pool(NODE, Duration::from_secs(20)).await;
    let mut stream = health_stream(&plugin).await;
    let first = wait_health(&mut stream, FAULT_WAIT, |_| true).await;
    let mut names: Vec<&str> = first.iter().map(|d| d.device_name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "gpu-0",
            "gpu-1",
            "gpu-2",
            "gpu-3",
            "gpu-vfio-0",
            "gpu-vfio-1",
            "gpu-vfio-2",
            "gpu-vfio-3"
        ],
        "every published device, the VFIO ones included"
    );
    assert!(first.iter().all(|d| d.health == "Healthy"), "{first:#?}");

    inject(&control, "xid 0 79");
    let slices = env
        .wait_slices(FAULT_WAIT, |slices| {
            !taints_of(slices, "gpu-vfio-0").is_empty() && !taints_of(slices, "gpu-0").is_empty()
        })
        .await;
    let vfio = taints_of(&slices, "gpu-vfio-0");
    assert_eq!(vfio, taints_of(&slices, "gpu-0"), "the same taints");
    for (key, value) in [
        ("gpu.nvidia.com/gpu-lost", ""),
        ("gpu.nvidia.com/xid", "79"),
    ] {
        assert!(
            vfio.iter()
                .any(|(k, v, e)| k == key && v == value && e == "NoSchedule"),
            "{key}={value} on gpu-vfio-0: {vfio:?}"
        );
    }
    for other in [
        "gpu-1",
        "gpu-vfio-1",
        "gpu-2",
        "gpu-vfio-2",
        "gpu-3",
        "gpu-vfio-3",
    ] {
        assert!(taints_of(&slices, other).is_empty(), "{other}");
    }

    let list = wait_health(&mut stream, FAULT_WAIT, |l| {
        l.iter()
            .any(|d| d.device_name == "gpu-vfio-0" && d.health == "Unhealthy")
    })
    .await;
    let vfio = health(&list, "gpu-vfio-0");
    assert!(vfio.message.contains("79"), "{vfio:?}");
    assert_eq!(vfio.message, health(&list, "gpu-0").message);
    assert_eq!(health(&list, "gpu-vfio-1").health, "Healthy");
}
