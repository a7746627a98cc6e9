//! The running-process functions at the C ABI: NVML's in/out count
//! contract (size query, too small a buffer, null arguments), the lists the
//! control file sets, MIG handles and a lost GPU, and nvml-wrapper's safe
//! API over them.
#![allow(unsafe_code)]

#[macro_use]
mod common;

use std::ffi::c_uint;
use std::time::{Duration, Instant};

use common::gpu;
use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;

const SUCCESS: u32 = 0;
const INVALID_ARGUMENT: u32 = 2;
const NOT_SUPPORTED: u32 = 3;
const INSUFFICIENT_SIZE: u32 = 7;
const GPU_IS_LOST: u32 = 15;

fn empty() -> sys::nvmlProcessInfo_t {
    sys::nvmlProcessInfo_t {
        pid: 0,
        usedGpuMemory: 0,
        gpuInstanceId: 0,
        computeInstanceId: 0,
    }
}

/// A private copy of the library on the `mixed` profile, following
/// `control` (which holds `commands` before init).
fn fake(commands: &str) -> (common::Fake, std::path::PathBuf, Nvml) {
    let (fake, control) = common::Fake::with_control("mixed", commands);
    let nvml = fake.nvml();
    (fake, control, nvml)
}

fn append(control: &std::path::Path, line: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(control)
        .unwrap();
    writeln!(f, "{line}").unwrap();
}

/// Waits until `check` holds (the control file is followed every 50 ms).
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One `nvmlDevice{Graphics,Compute}RunningProcesses_v3` call on `device`
/// with `*infoCount` starting at `capacity`: the return code and the count
/// the call left.
fn list(
    nvml: &Nvml,
    graphics: bool,
    device: sys::nvmlDevice_t,
    capacity: c_uint,
    infos: *mut sys::nvmlProcessInfo_t,
) -> (u32, c_uint) {
    let mut n = capacity;
    let code = if graphics {
        call!(
            nvml,
            nvmlDeviceGetGraphicsRunningProcesses_v3(device, &raw mut n, infos)
        )
    } else {
        call!(
            nvml,
            nvmlDeviceGetComputeRunningProcesses_v3(device, &raw mut n, infos)
        )
    };
    (code, n)
}

#[test]
fn the_count_contract_is_nvmls() {
    let (_dir, _control, nvml) = fake("processes 2 4242:512 4243\ngraphics-processes 2 77\n");
    let l4 = gpu(&nvml, 2);
    let idle = gpu(&nvml, 3);
    let none = std::ptr::null_mut();

    // Size query: null array, count 0.
    assert_eq!(list(&nvml, false, l4, 0, none), (INSUFFICIENT_SIZE, 2));
    assert_eq!(list(&nvml, false, idle, 0, none), (SUCCESS, 0));

    // Too small a buffer: the number is written, nothing is copied.
    let mut infos = [empty(); 3];
    assert_eq!(
        list(&nvml, false, l4, 1, infos.as_mut_ptr()),
        (INSUFFICIENT_SIZE, 2)
    );
    assert_eq!(infos[0].pid, 0);

    // Enough room.
    assert_eq!(list(&nvml, false, l4, 3, infos.as_mut_ptr()), (SUCCESS, 2));
    assert_eq!(infos[0].pid, 4242);
    assert_eq!(infos[0].usedGpuMemory, 512 << 20);
    assert_eq!(infos[0].gpuInstanceId, 0xFFFF_FFFF);
    assert_eq!(infos[0].computeInstanceId, 0xFFFF_FFFF);
    assert_eq!(infos[1].pid, 4243);
    assert_eq!(infos[1].usedGpuMemory, u64::MAX, "not available");
    assert_eq!(infos[2].pid, 0, "untouched past the count");

    assert_eq!(list(&nvml, true, l4, 3, infos.as_mut_ptr()), (SUCCESS, 1));
    assert_eq!(infos[0].pid, 77);

    // Null count; null array with a capacity.
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetComputeRunningProcesses_v3(l4, std::ptr::null_mut(), infos.as_mut_ptr())
        ),
        INVALID_ARGUMENT
    );
    let (code, n) = list(&nvml, true, l4, 4, none);
    assert_eq!(code, INVALID_ARGUMENT);
    assert_eq!(n, 4, "unchanged");
    // A bogus handle.
    let bogus: sys::nvmlDevice_t = std::ptr::without_provenance_mut(0x99);
    assert_eq!(list(&nvml, false, bogus, 0, none).0, INVALID_ARGUMENT);
    // A MIG device handle (GPU 1 has one).
    let mig = nvml
        .device_by_index(1)
        .unwrap()
        .mig_device_by_index(0)
        .unwrap();
    // SAFETY: only the opaque handle value is taken.
    let mig = unsafe { mig.handle() };
    assert_eq!(list(&nvml, false, mig, 0, none).0, NOT_SUPPORTED);
}

#[test]
fn nvml_wrapper_reads_the_lists_and_the_control_file_changes_them() {
    let (_dir, control, nvml) = fake("processes 0 10:1 11:2 12:3\n");
    let device = nvml.device_by_index(0).unwrap();
    // Taken now: a lost GPU's handle can no longer be looked up.
    let handle = gpu(&nvml, 0);
    let pids = |v: Vec<nvml_wrapper::struct_wrappers::device::ProcessInfo>| {
        v.into_iter().map(|p| p.pid).collect::<Vec<_>>()
    };
    let compute = device.running_compute_processes().unwrap();
    assert_eq!(compute[2].used_gpu_memory, UsedGpuMemory::Used(3 << 20));
    assert_eq!(compute[0].gpu_instance_id, None);
    assert_eq!(pids(compute), [10, 11, 12]);
    assert!(device.running_graphics_processes().unwrap().is_empty());

    append(&control, "graphics-processes 0 11 99");
    eventually("the graphics list", || {
        pids(device.running_graphics_processes().unwrap()) == [11, 99]
    });
    // A bad line changes nothing: once a good line after it has applied,
    // the compute list is still the one before it.
    append(&control, "processes 0 10 0");
    append(&control, "graphics-processes 0 5");
    eventually("the graphics list after the bad line", || {
        pids(device.running_graphics_processes().unwrap()) == [5]
    });
    assert_eq!(
        pids(device.running_compute_processes().unwrap()),
        [10, 11, 12]
    );
    append(&control, "processes 0 10");
    eventually("the compute list", || {
        pids(device.running_compute_processes().unwrap()) == [10]
    });
    // No pid clears the list.
    append(&control, "processes 0");
    eventually("an empty compute list", || {
        device.running_compute_processes().unwrap().is_empty()
    });
    // A lost GPU.
    append(&control, "lose 0");
    eventually("a lost GPU", || {
        matches!(device.running_compute_processes(), Err(NvmlError::GpuLost))
    });
    assert_eq!(
        list(&nvml, true, handle, 0, std::ptr::null_mut()).0,
        GPU_IS_LOST
    );
}

#[test]
fn profile_processes_are_there_at_start() {
    let yaml = std::fs::read_to_string(nvidia_ml::fixture::bundled_profile("t4-inference"))
        .unwrap()
        .replacen(
            "    minor: 1\n",
            "    minor: 1\n    processes:\n      - {pid: 5, usedMib: 100}\n      - {pid: 6, graphics: true}\n",
            1,
        );
    assert!(yaml.contains("pid: 5"));
    let fake = common::Fake::with_yaml(&yaml);
    let nvml = fake.nvml();
    let device = nvml.device_by_index(1).unwrap();
    let compute = device.running_compute_processes().unwrap();
    assert_eq!(compute.len(), 1);
    assert_eq!(compute[0].pid, 5);
    assert_eq!(compute[0].used_gpu_memory, UsedGpuMemory::Used(100 << 20));
    let graphics = device.running_graphics_processes().unwrap();
    assert_eq!(graphics.len(), 1);
    assert_eq!(graphics[0].pid, 6);
    assert!(
        nvml.device_by_index(0)
            .unwrap()
            .running_compute_processes()
            .unwrap()
            .is_empty()
    );
}
