//! The processes on a GPU through the real NVML code path: `NvmlBackend`
//! against the fake `libnvidia-ml.so`, whose lists come from the profile's
//! `processes:` and its control file. Compute and graphics lists merge by
//! pid; a lost GPU is `Error::GpuLost`; the trait's default is
//! `Error::NotSupported`.

mod common;

use common::Controlled as Machine;
use common::{Minimal, until};
use gpu_nvml::{Error, GpuBackend, GpuProcess};

/// Two T4s (minors 0 and 1); GPU 1 starts with processes.
const PROFILE: &str = r#"
driverVersion: "580.95.05"
cudaDriverVersion: 13000
gpus:
  - model: T4
    uuid: GPU-00000000-f29d-4da9-953f-48f1a09f76b5
    pciBusId: "0000:18:00.0"
    minor: 0
    numaNode: 0
    pcieRoot: pci0000:00
  - model: T4
    uuid: GPU-00000001-f29d-4da9-953f-48f1a09f76b5
    pciBusId: "0000:19:00.0"
    minor: 1
    numaNode: 0
    pcieRoot: pci0000:00
    processes:
      - {pid: 300, usedMib: 64}
      - {pid: 300, graphics: true}
"#;

/// The machine of [`PROFILE`], its control file holding `initial`.
fn on_profile(initial: &str) -> Machine {
    Machine::new(PROFILE, initial)
}

fn p(pid: u32, mib: Option<u64>, compute: bool, graphics: bool) -> GpuProcess {
    GpuProcess {
        pid,
        used_memory_bytes: mib.map(|m| m << 20),
        compute,
        graphics,
    }
}

#[test]
fn compute_and_graphics_processes_merge_by_pid() {
    let machine = on_profile("processes 0 4243:100 4242\ngraphics-processes 0 4242:20 77\n");
    let backend = machine.open();
    assert_eq!(
        backend.processes(0).unwrap(),
        vec![
            p(77, None, false, true),
            p(4242, Some(20), true, true),
            p(4243, Some(100), true, false),
        ]
    );
    // From the profile.
    assert_eq!(
        backend.processes(1).unwrap(),
        vec![p(300, Some(64), true, true)]
    );
    // Cleared by the control file.
    machine.command("processes 0");
    machine.command("graphics-processes 0");
    until(
        "GPU 0 idle",
        || backend.processes(0).unwrap(),
        Vec::is_empty,
    );
    // A bad index is a call error, not "not supported".
    let err = backend.processes(9).unwrap_err();
    assert!(matches!(err, Error::Call { .. }), "{err}");
}

#[test]
fn a_lost_gpu_is_gpu_lost_even_before_its_first_use() {
    let machine = on_profile("");
    let backend = machine.open();
    assert!(backend.processes(0).unwrap().is_empty());
    machine.command("lose 0");
    machine.command("lose 1");
    let err = until(
        "GPU 0 lost",
        || backend.processes(0),
        |r| matches!(r, Err(Error::GpuLost { gpu: 0, .. })),
    )
    .unwrap_err();
    assert!(err.to_string().contains("the GPU is lost"), "{err}");
    // GPU 1's handle was never looked up: the lookup itself is lost.
    let err = backend.processes(1).unwrap_err();
    assert!(
        matches!(
            err,
            Error::GpuLost {
                call: "nvmlDeviceGetHandleByIndex",
                gpu: 1
            }
        ),
        "{err}"
    );
}

#[test]
fn the_default_is_not_supported() {
    let err = Minimal(on_profile("").open()).processes(2).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotSupported {
                call: "processes",
                gpu: Some(2)
            }
        ),
        "{err}"
    );
    assert_eq!(err.to_string(), "NVML processes is not supported on GPU 2");
}
