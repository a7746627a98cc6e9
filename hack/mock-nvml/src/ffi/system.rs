//! Library lifetime and system queries: init/shutdown, error strings,
//! driver/NVML/CUDA versions, the device count, and `mockNvmlLastError`.

use std::ffi::{c_char, c_int, c_uint};

use nvml_wrapper_sys::bindings as sys;

use super::{export, guard, library_dir, write, write_str};
use crate::codes;
use crate::runtime;

/// Initialises the library: loads the machine profile named by
/// `MOCK_NVML_PROFILE` (or a `mock-nvml.env` next to the library). Reference
/// counted like NVML's.
///
/// # Safety
///
/// No preconditions; declared unsafe like every NVML entry point.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> sys::nvmlReturn_t {
    guard(
        || match runtime::init("nvmlInit_v2", library_dir().as_deref()) {
            codes::SUCCESS => Ok(()),
            code => Err(code),
        },
    )
}

/// `nvmlInit_v2` with flags (`NVML_INIT_FLAG_NO_GPUS`, `NVML_INIT_FLAG_NO_ATTACH`),
/// which change nothing here.
///
/// # Safety
///
/// No preconditions; declared unsafe like every NVML entry point.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(flags: c_uint) -> sys::nvmlReturn_t {
    let _ = flags;
    guard(
        || match runtime::init("nvmlInitWithFlags", library_dir().as_deref()) {
            codes::SUCCESS => Ok(()),
            code => Err(code),
        },
    )
}

/// Drops one reference taken by an init; the machine's state is kept for
/// the next init.
///
/// # Safety
///
/// No preconditions; declared unsafe like every NVML entry point.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> sys::nvmlReturn_t {
    guard(|| match runtime::shutdown() {
        codes::SUCCESS => Ok(()),
        code => Err(code),
    })
}

/// The text of a return code; the pointer is static.
///
/// # Safety
///
/// No preconditions; declared unsafe like every NVML entry point.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: sys::nvmlReturn_t) -> *const c_char {
    codes::description(result).as_ptr()
}

/// Not an NVML function: why the last `nvmlInit` failed (the profile error,
/// with file, line and column), or an empty string. The pointer stays valid
/// for the life of the process.
///
/// # Safety
///
/// No preconditions.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mockNvmlLastError() -> *const c_char {
    runtime::last_error().as_ptr()
}

export! {
    /// The driver version of the profile, e.g. "580.95.05".
    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) {
        let text = runtime::with_machine(|m| {
            m.injected(NAME, None)?;
            Ok(m.profile.spec.driver_version.clone())
        })?;
        // SAFETY: buffer of `length` bytes per the contract.
        unsafe { write_str(version, length, &text) }
    }
}

export! {
    /// The NVML version, e.g. "13.580.95.05".
    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) {
        let text = runtime::with_machine(|m| {
            m.injected(NAME, None)?;
            Ok(m.profile.nvml_version.clone())
        })?;
        // SAFETY: buffer of `length` bytes per the contract.
        unsafe { write_str(version, length, &text) }
    }
}

export! {
    /// The CUDA driver version, e.g. 13000.
    fn nvmlSystemGetCudaDriverVersion(cuda_driver_version: *mut c_int) {
        let v = runtime::with_machine(|m| {
            m.injected(NAME, None)?;
            Ok(m.profile.spec.cuda_driver_version)
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(cuda_driver_version, v) }
    }
}

export! {
    /// The CUDA driver version, e.g. 13000.
    fn nvmlSystemGetCudaDriverVersion_v2(cuda_driver_version: *mut c_int) {
        let v = runtime::with_machine(|m| {
            m.injected(NAME, None)?;
            Ok(m.profile.spec.cuda_driver_version)
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(cuda_driver_version, v) }
    }
}

export! {
    /// The number of GPUs of the profile.
    fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) {
        let n = runtime::with_machine(|m| {
            m.injected(NAME, None)?;
            Ok(m.gpus.len() as c_uint)
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(device_count, n) }
    }
}
