//! Running processes: `nvmlDeviceGetComputeRunningProcesses_v3` and
//! `nvmlDeviceGetGraphicsRunningProcesses_v3`, from the live lists in
//! `faults` (set by the profile's `processes:` and the control file).
//!
//! NVML's contract: `*infoCount` is the array's capacity on input and the
//! number of processes on output; a null `infos` with `*infoCount == 0`
//! asks for the number (SUCCESS when there are none, INSUFFICIENT_SIZE
//! with the number written otherwise); too small a capacity is
//! INSUFFICIENT_SIZE with the number written and nothing copied; a null
//! `infoCount`, or a null `infos` with a nonzero capacity, is
//! INVALID_ARGUMENT. MIG device handles are NOT_SUPPORTED.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings as sys;

use super::{export, full_gpu, read, write_counted};
use crate::codes::{self, Code};
use crate::faults::{self, WHOLE_GPU};
use crate::processes::Process;
use crate::runtime;

/// The `nvmlProcessInfo_t` (v2 layout) of one process on a whole GPU.
fn info(p: &Process) -> sys::nvmlProcessInfo_t {
    sys::nvmlProcessInfo_t {
        pid: p.pid,
        usedGpuMemory: p.used_bytes(),
        gpuInstanceId: WHOLE_GPU,
        computeInstanceId: WHOLE_GPU,
    }
}

/// Answers one of the two calls for the graphics or the compute list.
///
/// # Safety
///
/// `count` null or valid for a read and a write of `c_uint`; `infos` null
/// or valid for writes of `*count` elements.
unsafe fn running(
    name: &str,
    device: sys::nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut sys::nvmlProcessInfo_t,
    graphics: bool,
) -> Result<(), Code> {
    // SAFETY: forwarded caller contract for `count` (null: INVALID_ARGUMENT).
    let capacity = unsafe { read(count) }?;
    if infos.is_null() && capacity != 0 {
        return Err(codes::INVALID_ARGUMENT);
    }
    let gpu = runtime::with_machine(|m| full_gpu(m, device, name))?;
    let list: Vec<sys::nvmlProcessInfo_t> =
        faults::processes(gpu, graphics).iter().map(info).collect();
    // SAFETY: forwarded caller contract for `count` and `infos` (a non-null
    // `infos` holds `capacity` elements).
    unsafe { write_counted(infos, count, &list) }?;
    // write_counted has set `*count`; unlike its null-array case, NVML's
    // size query fails with INSUFFICIENT_SIZE when there are processes.
    if infos.is_null() && !list.is_empty() {
        return Err(codes::INSUFFICIENT_SIZE);
    }
    Ok(())
}

export! {
    /// The processes with a compute context on a GPU.
    fn nvmlDeviceGetComputeRunningProcesses_v3(device: sys::nvmlDevice_t, info_count: *mut c_uint, infos: *mut sys::nvmlProcessInfo_t) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { running(NAME, device, info_count, infos, false) }
    }
}

export! {
    /// The processes with a graphics context on a GPU.
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(device: sys::nvmlDevice_t, info_count: *mut c_uint, infos: *mut sys::nvmlProcessInfo_t) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { running(NAME, device, info_count, infos, true) }
    }
}
