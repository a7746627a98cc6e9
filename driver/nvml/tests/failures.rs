//! Injected NVML failures through the real nvml-wrapper path: a failing GPU
//! fails alone, optional facts degrade to "absent", and a library that cannot
//! start is a clear `Error::Init`.

mod common;

use common::Machine;
use gpu_nvml::{Error, GpuBackend, NvLinkRemote, NvmlBackend};

/// Three A100-SXM4-80GB GPUs, each with one NVLink to each other GPU, MIG on for all; GPU
/// `failing` gets `fail` as its failure-injection map.
fn three_gpus(failing: usize, fail: &str) -> String {
    use std::fmt::Write;
    let mut yaml = String::from("driverVersion: \"580.95.05\"\ncudaDriverVersion: 13000\ngpus:\n");
    let buses = ["0000:07:00.0", "0000:0f:00.0", "0000:47:00.0"];
    for (i, bus) in buses.iter().enumerate() {
        let (next, prev) = (buses[(i + 1) % 3], buses[(i + 2) % 3]);
        write!(
            yaml,
            "  - model: A100-SXM4-80GB\n    uuid: GPU-0000000{i}-f29d-4da9-953f-48f1a09f76b5\n    \
             pciBusId: \"{bus}\"\n    minor: {i}\n    numaNode: 0\n    pcieRoot: pci0000:00\n    \
             mig:\n      current: true\n      devices: [{{profile: 7g.80gb, placement: 0}}]\n    \
             nvlinks: [{{link: 0, remote: \"{next}\"}}, {{link: 1, remote: \"{prev}\"}}]\n"
        )
        .unwrap();
        if i == failing {
            writeln!(yaml, "    fail: {fail}").unwrap();
        }
    }
    yaml
}

fn failing_call(backend: &NvmlBackend, index: u32) -> (&'static str, String) {
    match backend.gpu(index) {
        Err(Error::Call { call, gpu, reason }) => {
            assert_eq!(gpu, Some(index));
            (call, reason)
        }
        other => panic!("GPU {index}: expected a call error, got {other:?}"),
    }
}

#[test]
fn a_lost_gpu_fails_alone() {
    let machine = Machine::from_yaml(&three_gpus(1, "{nvmlDeviceGetUUID: GPU_IS_LOST}"));
    let backend = machine.open();
    assert_eq!(backend.gpu_count().unwrap(), 3);
    let (call, reason) = failing_call(&backend, 1);
    assert_eq!(call, "nvmlDeviceGetUUID");
    assert!(reason.contains("fell off the bus"), "{reason}");
    let err = backend.gpu(1).unwrap_err().to_string();
    assert!(err.contains("on GPU 1"), "{err}");
    for ok in [0, 2] {
        let gpu = backend.gpu(ok).unwrap();
        assert_eq!(gpu.mig.unwrap().devices.len(), 1);
        assert_eq!(gpu.nvlinks.len(), 2);
    }
}

#[test]
fn every_required_query_failing_fails_the_gpu() {
    for (function, call) in [
        ("nvmlDeviceGetName", "nvmlDeviceGetName"),
        ("nvmlDeviceGetMinorNumber", "nvmlDeviceGetMinorNumber"),
        ("nvmlDeviceGetBrand", "nvmlDeviceGetBrand"),
        ("nvmlDeviceGetArchitecture", "nvmlDeviceGetArchitecture"),
        (
            "nvmlDeviceGetCudaComputeCapability",
            "nvmlDeviceGetCudaComputeCapability",
        ),
        ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2"),
        ("nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v3"),
        ("nvmlDeviceGetComputeMode", "nvmlDeviceGetComputeMode"),
        ("nvmlDeviceGetMigMode", "nvmlDeviceGetMigMode"),
        (
            "nvmlDeviceGetGpuInstanceProfileInfo",
            "nvmlDeviceGetGpuInstanceProfileInfo",
        ),
        (
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
        ),
        (
            "nvmlDeviceGetMaxMigDeviceCount",
            "nvmlDeviceGetMaxMigDeviceCount",
        ),
        (
            "nvmlDeviceGetMigDeviceHandleByIndex",
            "nvmlDeviceGetMigDeviceHandleByIndex",
        ),
        (
            "nvmlDeviceGetGpuInstanceById",
            "nvmlDeviceGetGpuInstanceById",
        ),
        ("nvmlGpuInstanceGetInfo", "nvmlGpuInstanceGetInfo"),
        ("nvmlDeviceGetAddressingMode", "nvmlDeviceGetAddressingMode"),
    ] {
        let machine = Machine::from_yaml(&three_gpus(2, &format!("{{{function}: UNKNOWN}}")));
        let backend = machine.open();
        let (failed, reason) = failing_call(&backend, 2);
        assert_eq!(failed, call, "injected {function}");
        assert!(
            reason.contains("internal driver error"),
            "{function}: {reason}"
        );
        assert!(
            backend.gpu(0).is_ok() && backend.gpu(1).is_ok(),
            "{function}"
        );
    }
}

#[test]
fn not_supported_mig_means_not_mig_capable() {
    let machine = Machine::from_yaml(&three_gpus(0, "{nvmlDeviceGetMigMode: NOT_SUPPORTED}"));
    let backend = machine.open();
    assert_eq!(backend.gpu(0).unwrap().mig, None);
    assert!(backend.gpu(1).unwrap().mig.is_some());
}

#[test]
fn unreadable_nvlinks_count_as_absent() {
    for fail in [
        "{nvmlDeviceGetNvLinkState: UNKNOWN}",
        "{nvmlDeviceGetNvLinkState: NOT_SUPPORTED}",
    ] {
        let machine = Machine::from_yaml(&three_gpus(1, fail));
        let backend = machine.open();
        let gpu = backend.gpu(1).unwrap_or_else(|e| panic!("{fail}: {e}"));
        assert!(gpu.nvlinks.is_empty(), "{fail}: {:?}", gpu.nvlinks);
        assert_eq!(backend.gpu(0).unwrap().nvlinks.len(), 2);
    }
}

/// An active link whose far end cannot be read still counts (nvlinkCount is
/// every active link); it names no peer, and what NVML's device type says is
/// kept, or Unknown when that fails too.
#[test]
fn active_links_with_unreadable_far_ends_are_kept_without_a_peer() {
    for (fail, kind) in [
        (
            "{nvmlDeviceGetNvLinkRemotePciInfo: GPU_IS_LOST}",
            NvLinkRemote::Gpu,
        ),
        (
            "{nvmlDeviceGetNvLinkRemotePciInfo: UNKNOWN, nvmlDeviceGetNvLinkRemoteDeviceType: UNKNOWN}",
            NvLinkRemote::Unknown,
        ),
    ] {
        let machine = Machine::from_yaml(&three_gpus(1, fail));
        let backend = machine.open();
        let gpu = backend.gpu(1).unwrap_or_else(|e| panic!("{fail}: {e}"));
        assert_eq!(gpu.nvlinks.len(), 2, "{fail}");
        assert!(
            gpu.nvlinks
                .iter()
                .all(|l| l.remote == kind && l.remote_pci_bus_id.is_none()),
            "{fail}: {:?}",
            gpu.nvlinks
        );
        assert_eq!(backend.gpu(0).unwrap().nvlinks.len(), 2);
    }
}

#[test]
fn a_missing_addressing_mode_is_left_out() {
    let machine = Machine::from_yaml(&three_gpus(
        0,
        "{nvmlDeviceGetAddressingMode: NOT_SUPPORTED}",
    ));
    assert_eq!(machine.open().gpu(0).unwrap().addressing_mode, None);
}

#[test]
fn node_wide_failures_are_errors_without_a_gpu() {
    let yaml = three_gpus(9, "").replacen(
        "gpus:\n",
        "fail: {nvmlDeviceGetCount: UNKNOWN, nvmlSystemGetDriverVersion: UNKNOWN}\ngpus:\n",
        1,
    );
    let machine = Machine::from_yaml(&yaml);
    let backend = machine.open();
    assert!(matches!(
        backend.gpu_count(),
        Err(Error::Call { gpu: None, .. })
    ));
    let err = backend.system().unwrap_err().to_string();
    assert!(err.contains("nvmlSystemGetDriverVersion"), "{err}");
}

#[test]
fn a_failing_init_is_a_clear_init_error() {
    let yaml =
        three_gpus(9, "").replacen("gpus:\n", "fail: {nvmlInit: DRIVER_NOT_LOADED}\ngpus:\n", 1);
    let machine = Machine::from_yaml(&yaml);
    let err = NvmlBackend::open(Some(&machine.library)).unwrap_err();
    let Error::Init { library, reason } = &err else {
        panic!("{err}")
    };
    assert_eq!(library, &machine.library.display().to_string());
    assert!(reason.contains("kernel driver is not loaded"), "{reason}");
}

#[test]
fn an_unusable_profile_is_an_init_error_not_a_panic() {
    let machine = Machine::from_yaml("driverVersion: [not a string\n");
    let err = NvmlBackend::open(Some(&machine.library)).unwrap_err();
    assert!(matches!(err, Error::Init { .. }), "{err}");
}

#[test]
fn the_fake_librarys_explanation_is_part_of_the_init_error() {
    // A MIG device on a GPU that has MIG off: the fake NVML refuses the
    // profile and says why through `mockNvmlLastError`.
    let yaml = three_gpus(9, "").replacen(
        "      current: true\n      devices: [{profile: 7g.80gb, placement: 0}]\n",
        "      current: false\n      devices: [{profile: 7g.80gb, placement: 0}]\n",
        1,
    );
    let machine = Machine::from_yaml(&yaml);
    let err = NvmlBackend::open(Some(&machine.library)).unwrap_err();
    let Error::Init { reason, .. } = &err else {
        panic!("{err}")
    };
    assert!(reason.contains("internal driver error"), "{reason}");
    assert!(reason.contains("gpus[0]"), "{reason}");
    assert!(reason.contains("MIG"), "{reason}");
    assert!(!reason.contains('\n'), "{reason}");

    // NVML's own refusal (an injected init code) has no explanation to add
    // beyond NVML's text, and a good profile opens as before.
    let yaml =
        three_gpus(9, "").replacen("gpus:\n", "fail: {nvmlInit: DRIVER_NOT_LOADED}\ngpus:\n", 1);
    let machine = Machine::from_yaml(&yaml);
    let err = NvmlBackend::open(Some(&machine.library)).unwrap_err();
    assert!(
        err.to_string().contains("kernel driver is not loaded"),
        "{err}"
    );
    Machine::from_yaml(&three_gpus(9, "")).open();
}

#[test]
fn a_missing_library_is_an_init_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("lib/libnvidia-ml.so.1");
    let err = NvmlBackend::open(Some(&missing)).unwrap_err();
    let text = err.to_string();
    assert!(text.contains(&missing.display().to_string()), "{text}");
    assert!(text.contains("cannot be loaded"), "{text}");
    assert!(text.contains("--nvml-lib"), "{text}");
}
