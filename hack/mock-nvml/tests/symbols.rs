//! The built library exports every function the crate claims to (the list
//! that failure-injection keys are checked against), under NVML's exact
//! versioned names, plus `mockNvmlLastError`.
#![allow(unsafe_code)]

use nvidia_ml::exports::{LAST_ERROR_FUNCTION, NVML_FUNCTIONS};
use nvidia_ml::fixture::cdylib_path;

#[test]
fn every_listed_function_is_exported() {
    let path = cdylib_path().unwrap();
    // SAFETY: loading the fake library runs no initialisers with preconditions.
    let lib = unsafe { libloading::Library::new(&path) }.unwrap();
    let mut missing = Vec::new();
    for name in NVML_FUNCTIONS.iter().chain([&LAST_ERROR_FUNCTION]) {
        // SAFETY: only the symbol's presence is checked; it is not called.
        let found = unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok();
        if !found {
            missing.push(*name);
        }
    }
    assert!(
        missing.is_empty(),
        "not exported by {}: {missing:?}",
        path.display()
    );
}

#[test]
fn nvml_wrapper_finds_what_the_driver_calls() {
    let path = cdylib_path().unwrap();
    // SAFETY: as above; nvml-wrapper-sys resolves every symbol it knows.
    let lib = unsafe { nvml_wrapper_sys::bindings::NvmlLib::new(&path) }.unwrap();
    assert!(lib.nvmlInit_v2.is_ok());
    assert!(lib.nvmlShutdown.is_ok());
    assert!(lib.nvmlDeviceGetHandleByIndex_v2.is_ok());
    assert!(lib.nvmlDeviceGetMemoryInfo_v2.is_ok());
    assert!(lib.nvmlDeviceGetPciInfo_v3.is_ok());
    assert!(lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.is_ok());
    assert!(lib.nvmlComputeInstanceGetInfo_v2.is_ok());
    // and not what it does not implement
    assert!(lib.nvmlDeviceGetTemperature.is_err());
}
