//! The GPU health monitor with `--passthrough`, through the real plugin
//! binary and the fake NVML: a whole-GPU fault injected through the fake's
//! control file taints the GPU's VFIO sibling `gpu-vfio-<index>` as it
//! taints `gpu-<minor>` (issue #43), and the KEP-4680 health stream lists
//! every VFIO device, with the fault on the faulty GPU's sibling. A GPU a
//! VFIO claim put on `vfio-pci` (the stand-in sysfs and kernel of
//! `fake_driver_root::sysfs`) is not probed: Unknown, never tainted for what
//! NVML then says of it, and probed again once back on `nvidia`.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::health::{health_of, health_stream, is, wait_health};
use common::prepare::{node_with_control, vfio_of};
use common::{NODE, Plugin, TestEnv, inject, short_dir, taints_of};
use futures::StreamExt;
use gpu_dra_sim::kubelet::DraVersion;

/// Four A100 PCIe GPUs, each with a VFIO sibling under `--passthrough`.
const PROFILE: &str = "pcie-a100-bridged";
/// Two poll periods, the debounce and the publisher's write, with room.
const FAULT_WAIT: Duration = Duration::from_secs(5);

/// `--passthrough` and fast health timing.
const FLAGS: &[&str] = &[
    "--passthrough",
    "--health-poll-interval=300ms",
    "--health-quiet-period=1s",
];

/// A plugin with [`FLAGS`] on the [`PROFILE`] machine, its fake NVML
/// driven by the control file `dir/control`.
fn start(dir: &Path) -> (Plugin, std::path::PathBuf) {
    let control = dir.join("control");
    std::fs::write(&control, "").unwrap();
    let env = TestEnv::builder(dir)
        .bundled(PROFILE)
        .control(&control)
        .build();
    let plugin = Plugin::launch(&Arc::new(env), dir, "run", FLAGS);
    (plugin, control)
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
        is(l, "gpu-vfio-0", "Unhealthy")
    })
    .await;
    let vfio = health_of(&list, "gpu-vfio-0").unwrap();
    assert!(vfio.message.contains("79"), "{vfio:?}");
    let gpu = health_of(&list, "gpu-0").unwrap_or_else(|| panic!("{list:#?}"));
    assert_eq!(vfio.message, gpu.message);
    assert!(is(&list, "gpu-vfio-1", "Healthy"), "{list:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gpu_passed_through_is_not_probed_then_probed_again_once_back() {
    let (n, control) = node_with_control(PROFILE, FLAGS, DraVersion::V1, "").await;
    // The stand-in kernel rebinds GPUs as the plugin writes sysfs.
    let v = vfio_of(&n, false);
    let mut stream = n.kubelet.watch_health().await.unwrap();
    wait_health(&mut stream, FAULT_WAIT, |l| {
        !l.is_empty() && l.iter().all(|d| d.health == "Healthy")
    })
    .await;

    let claim = n.vfio_claim("vm", "gpu-vfio-0").await;
    n.prepare_ok(&claim).await;
    let bus = v.sysfs.gpus()[0].bus.clone();
    assert_eq!(v.sysfs.driver_of(&bus).as_deref(), Some("vfio-pci"));
    // What NVML does with a GPU taken from `nvidia`: it is lost to it (the
    // fake fails the GPU's event wait and answers polls "GPU is lost").
    inject(&control, "lose 0");
    let list = wait_health(&mut stream, FAULT_WAIT, |l| {
        is(l, "gpu-vfio-0", "Unknown") && is(l, "gpu-0", "Unknown")
    })
    .await;
    let vfio = health_of(&list, "gpu-vfio-0").unwrap();
    assert!(
        vfio.message.contains("not probed") && vfio.message.contains("vfio-pci"),
        "{vfio:?}"
    );
    assert!(is(&list, "gpu-vfio-1", "Healthy"), "{list:#?}");
    // Five polls and the event thread's retries later: every message still
    // says Unknown, and no taint was published.
    let until = tokio::time::Instant::now() + Duration::from_millis(1500);
    while let Ok(Some(Ok(list))) = tokio::time::timeout_at(until, stream.next()).await {
        assert!(is(&list, "gpu-vfio-0", "Unknown"), "{list:#?}");
    }
    let slices = n.env.slices(NODE);
    for device in ["gpu-0", "gpu-vfio-0"] {
        assert!(
            taints_of(&slices, device).is_empty(),
            "{device} tainted: {:?}",
            taints_of(&slices, device)
        );
    }

    // NVML sees it again, the VM ends: back on `nvidia`, probed, Healthy.
    inject(&control, "restore 0");
    n.unprepare_ok(&claim).await;
    assert_eq!(v.sysfs.driver_of(&bus).as_deref(), Some("nvidia"));
    wait_health(&mut stream, FAULT_WAIT, |l| {
        is(l, "gpu-vfio-0", "Healthy") && is(l, "gpu-0", "Healthy")
    })
    .await;

    // Probed for real again: a GPU lost while on `nvidia` is tainted.
    inject(&control, "lose 0");
    let slices = n
        .env
        .wait_slices(FAULT_WAIT, |s| {
            taints_of(s, "gpu-0")
                .iter()
                .any(|(k, _, _)| k == "gpu.nvidia.com/gpu-lost")
        })
        .await;
    assert_eq!(
        taints_of(&slices, "gpu-vfio-0"),
        taints_of(&slices, "gpu-0")
    );
}
