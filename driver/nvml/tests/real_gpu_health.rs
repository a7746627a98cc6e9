//! A read-only health check for a machine with a real NVIDIA GPU
//! (`hack/real-gpu/run.sh` runs it; ignored elsewhere): through
//! `NvmlBackend`'s `HealthSource`, every GPU's event registration must
//! succeed, a wait must end in time (a timeout, or a real event that is
//! printed), and the poll must read the GPU as alive, with the recovery
//! action (driver R565+) and the row-remapping state (Ampere+) readable.
//! Nothing is injected and nothing is changed on the GPU.
//!
//! The same check runs in CI against the fake NVML (a healthy DGX H100), so
//! it cannot rot unnoticed.
//!
//! Environment: `GPU_DRA_REAL_DRIVER_ROOT` (where `libnvidia-ml.so.1` is
//! looked for; default: the loader's search path), `GPU_DRA_REAL_OUT` (the
//! poll results are saved there as `health.json`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpu_nvml::{GpuBackend, HealthSource, Liveness, NvmlBackend};

/// How long each real GPU's event set is waited on.
const WAIT: Duration = Duration::from_secs(2);

/// What the check found on one GPU.
#[derive(Debug, serde::Serialize)]
struct Finding {
    index: u32,
    uuid: String,
    waited_ms: u128,
    event: Option<String>,
    poll: gpu_nvml::HealthPoll,
}

/// The driver's major version, e.g. 580 for `580.95.05`.
fn driver_major(version: &str) -> u32 {
    version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

/// Runs the read-only check on every GPU of `backend`, waiting `wait` for
/// events on each; panics with what is wrong.
fn check(backend: &NvmlBackend, wait: Duration) -> Vec<Finding> {
    let system = backend.system().expect("driver version");
    let count = backend.gpu_count().expect("GPU count");
    assert!(count > 0, "NVML sees no GPU");
    let recovery_expected = driver_major(&system.driver_version) >= 565;
    let mut findings = Vec::new();
    for index in 0..count {
        let info = backend.gpu(index).expect("GPU facts");
        let mut watch = backend.watch(index).unwrap_or_else(|e| {
            panic!(
                "GPU {index} ({}): events cannot be registered: {e}",
                info.uuid
            )
        });
        let start = Instant::now();
        let event = watch
            .wait(wait)
            .unwrap_or_else(|e| panic!("GPU {index}: waiting for events failed: {e}"));
        let waited = start.elapsed();
        match &event {
            None => assert!(
                waited >= wait && waited < wait * 5 + Duration::from_secs(1),
                "GPU {index}: a wait of {wait:?} timed out after {waited:?}"
            ),
            Some(e) => {
                assert_eq!(
                    e.gpu_index, index,
                    "GPU {index}: event of another GPU: {e:?}"
                );
                eprintln!("!!!!!!!! GPU {index} reported a real event while checked: {e:?}");
            }
        }
        drop(watch);
        let poll = backend.poll(index).expect("poll");
        assert_eq!(poll.liveness, Liveness::Alive, "GPU {index}: {poll:?}");
        if recovery_expected {
            assert!(
                poll.recovery_action.is_some(),
                "GPU {index}: driver {} should report the recovery action (field 230): {poll:?}",
                system.driver_version
            );
        }
        if info.cuda_compute_capability.0 >= 8 {
            assert!(
                poll.remap.is_some(),
                "GPU {index}: an Ampere-or-later GPU should report remapped rows: {poll:?}"
            );
        }
        eprintln!(
            "GPU {index} {}: driver {}, recovery action {:?}, remap {:?}, retired pages pending {:?}, \
             volatile uncorrected ECC {:?}, slowdown hw {:?} thermal {:?}, PCIe replays {:?}, \
             {} NVLinks ({} active); wait: {}",
            info.uuid,
            system.driver_version,
            poll.recovery_action,
            poll.remap,
            poll.retired_pages_pending,
            poll.volatile_uncorrected_ecc,
            poll.hw_slowdown,
            poll.thermal_slowdown,
            poll.pcie_replays,
            poll.nvlinks.len(),
            poll.nvlinks.iter().filter(|l| l.active).count(),
            event.as_ref().map_or_else(
                || format!("timed out after {waited:?}"),
                |e| format!("{e:?}")
            ),
        );
        findings.push(Finding {
            index,
            uuid: info.uuid,
            waited_ms: waited.as_millis(),
            event: event.map(|e| format!("{e:?}")),
            poll,
        });
    }
    findings
}

/// `libnvidia-ml.so.1` under the driver root, if it is there.
fn library(root: &Path) -> Option<PathBuf> {
    [
        "lib64",
        "usr/lib64",
        "usr/lib/x86_64-linux-gnu",
        "lib/x86_64-linux-gnu",
        "usr/lib/aarch64-linux-gnu",
    ]
    .iter()
    .map(|dir| root.join(dir).join("libnvidia-ml.so.1"))
    .find(|p| p.exists())
}

#[test]
#[ignore = "needs a real NVIDIA GPU and driver: hack/real-gpu/run.sh"]
fn a_real_gpu_is_watched_and_polled_read_only() {
    let root = std::env::var_os("GPU_DRA_REAL_DRIVER_ROOT").map(PathBuf::from);
    let lib = root.as_deref().and_then(library);
    let backend = NvmlBackend::open(lib.as_deref()).expect("open the system's NVML");
    let findings = check(&backend, WAIT);
    if let Some(dir) = std::env::var_os("GPU_DRA_REAL_OUT") {
        let path = Path::new(&dir).join("health.json");
        std::fs::write(&path, serde_json::to_string_pretty(&findings).unwrap())
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

#[test]
fn the_check_passes_on_a_healthy_fake_machine() {
    let dir = tempfile::tempdir().unwrap();
    let lib = nvidia_ml::fixture::install(
        dir.path(),
        &nvidia_ml::fixture::bundled_profile("dgx-h100"),
        None,
    )
    .unwrap();
    let backend = NvmlBackend::open(Some(&lib)).unwrap();
    let findings = check(&backend, Duration::from_millis(50));
    assert_eq!(findings.len(), 8);
    assert!(findings.iter().all(|f| f.event.is_none()));
}

#[test]
fn the_check_fails_on_a_faulty_fake_machine() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control");
    std::fs::write(&control, "refuse-events 0\n").unwrap();
    let lib = nvidia_ml::fixture::install_with(
        &dir.path().join("lib"),
        &nvidia_ml::fixture::bundled_profile("t4-inference"),
        &nvidia_ml::fixture::InstallOptions {
            control: Some(control),
            ..Default::default()
        },
    )
    .unwrap();
    let backend = NvmlBackend::open(Some(&lib)).unwrap();
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check(&backend, Duration::from_millis(50))
    }))
    .expect_err("a GPU that refuses events fails the check");
    let text = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(text.contains("events cannot be registered"), "{text}");
}
