//! The health functions at the C ABI: bad arguments are INVALID_ARGUMENT
//! (never a crash), MIG handles and unsupported fields NOT_SUPPORTED, a
//! freed set is gone, nvml-wrapper's safe event API works against the fake
//! too, and `MOCK_NVML_CONTROL` from the environment drives it.
#![allow(unsafe_code)]

#[macro_use]
mod common;

use std::ffi::{c_int, c_uint, c_ulonglong};

use common::{Fake, assert_success, gpu, is_child, nvml_from_env, run_child};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;

const SUCCESS: u32 = 0;
const INVALID_ARGUMENT: u32 = 2;
const NOT_SUPPORTED: u32 = 3;
const TIMEOUT: u32 = 10;

fn empty_event() -> sys::nvmlEventData_t {
    sys::nvmlEventData_t {
        device: std::ptr::null_mut(),
        eventType: 0,
        eventData: 0,
        gpuInstanceId: 0,
        computeInstanceId: 0,
    }
}

#[test]
fn bad_arguments_are_refused_without_harm() {
    let fake = Fake::bundled("mixed");
    let nvml = fake.nvml();
    let h100 = gpu(&nvml, 0);
    assert_eq!(
        call!(nvml, nvmlEventSetCreate(std::ptr::null_mut())),
        INVALID_ARGUMENT
    );
    let mut set: sys::nvmlEventSet_t = std::ptr::null_mut();
    assert_eq!(call!(nvml, nvmlEventSetCreate(&raw mut set)), SUCCESS);
    // Unknown set handles.
    let bogus: sys::nvmlEventSet_t = std::ptr::without_provenance_mut(0x1234);
    assert_eq!(
        call!(nvml, nvmlDeviceRegisterEvents(h100, 8, bogus)),
        INVALID_ARGUMENT
    );
    assert_eq!(call!(nvml, nvmlEventSetFree(bogus)), INVALID_ARGUMENT);
    let mut data = empty_event();
    assert_eq!(
        call!(nvml, nvmlEventSetWait_v2(bogus, &raw mut data, 0)),
        INVALID_ARGUMENT
    );
    // Null outputs.
    assert_eq!(
        call!(nvml, nvmlEventSetWait_v2(set, std::ptr::null_mut(), 0)),
        INVALID_ARGUMENT
    );
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetSupportedEventTypes(h100, std::ptr::null_mut())
        ),
        INVALID_ARGUMENT
    );
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetFieldValues(h100, 1, std::ptr::null_mut())
        ),
        INVALID_ARGUMENT
    );
    let mut value = field(230);
    assert_eq!(
        call!(nvml, nvmlDeviceGetFieldValues(h100, 0, &raw mut value)),
        INVALID_ARGUMENT
    );
    assert_eq!(
        call!(nvml, nvmlDeviceGetFieldValues(h100, -1, &raw mut value)),
        INVALID_ARGUMENT
    );
    let mut n: c_uint = 0;
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetRemappedRows(
                h100,
                &raw mut n,
                std::ptr::null_mut(),
                &raw mut n,
                &raw mut n
            )
        ),
        INVALID_ARGUMENT
    );
    let mut count: c_ulonglong = 0;
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetTotalEccErrors(h100, 9, 0, &raw mut count)
        ),
        INVALID_ARGUMENT
    );
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetTotalEccErrors(h100, 1, 9, &raw mut count)
        ),
        INVALID_ARGUMENT
    );
    // Unsupported types: nothing is registered.
    assert_eq!(
        call!(nvml, nvmlDeviceRegisterEvents(h100, 1 << 40, set)),
        NOT_SUPPORTED
    );
    // A bogus device handle.
    let not_a_device: sys::nvmlDevice_t = std::ptr::without_provenance_mut(0x99);
    assert_eq!(
        call!(nvml, nvmlDeviceRegisterEvents(not_a_device, 8, set)),
        INVALID_ARGUMENT
    );
    // The set still works, and a freed set is gone.
    assert_eq!(call!(nvml, nvmlDeviceRegisterEvents(h100, 8, set)), SUCCESS);
    assert_eq!(
        call!(nvml, nvmlEventSetWait_v2(set, &raw mut data, 1)),
        TIMEOUT
    );
    assert_eq!(call!(nvml, nvmlEventSetFree(set)), SUCCESS);
    assert_eq!(call!(nvml, nvmlEventSetFree(set)), INVALID_ARGUMENT);
    assert_eq!(
        call!(nvml, nvmlEventSetWait_v2(set, &raw mut data, 1)),
        INVALID_ARGUMENT
    );
}

fn field(id: u32) -> sys::nvmlFieldValue_t {
    sys::nvmlFieldValue_t {
        fieldId: id,
        scopeId: 0,
        timestamp: 0,
        latencyUsec: 0,
        valueType: 0,
        nvmlReturn: 0,
        value: sys::nvmlValue_t { ullVal: 0 },
    }
}

#[test]
fn field_values_answer_per_field_and_mig_handles_are_not_supported() {
    let fake = Fake::bundled("mixed");
    let nvml = fake.nvml();
    let h100 = gpu(&nvml, 1);
    let mut values = [field(230), field(144), field(31), field(1), field(145)];
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetFieldValues(h100, values.len() as c_int, values.as_mut_ptr())
        ),
        SUCCESS
    );
    let returns: Vec<u32> = values.iter().map(|v| v.nvmlReturn).collect();
    assert_eq!(
        returns,
        [SUCCESS, SUCCESS, NOT_SUPPORTED, NOT_SUPPORTED, SUCCESS]
    );
    assert!(values[0].timestamp > 0);
    // SAFETY: the fake writes the unsigned long long member for its fields.
    assert_eq!(unsafe { values[0].value.ullVal }, 0);

    // MIG device handles take no part in health queries.
    let mig = nvml
        .device_by_index(1)
        .unwrap()
        .mig_device_by_index(0)
        .unwrap();
    // SAFETY: only the opaque handle value is taken.
    let mig = unsafe { mig.handle() };
    let mut mask: c_ulonglong = 0;
    assert_eq!(
        call!(nvml, nvmlDeviceGetSupportedEventTypes(mig, &raw mut mask)),
        NOT_SUPPORTED
    );
    let mut set: sys::nvmlEventSet_t = std::ptr::null_mut();
    assert_eq!(call!(nvml, nvmlEventSetCreate(&raw mut set)), SUCCESS);
    assert_eq!(
        call!(nvml, nvmlDeviceRegisterEvents(mig, 8, set)),
        NOT_SUPPORTED
    );
    let mut one = [field(230)];
    assert_eq!(
        call!(nvml, nvmlDeviceGetFieldValues(mig, 1, one.as_mut_ptr())),
        NOT_SUPPORTED
    );
    assert_eq!(call!(nvml, nvmlEventSetFree(set)), SUCCESS);

    // An L4 (Ada) remaps rows too; its supported events include them.
    let l4 = gpu(&nvml, 2);
    assert_eq!(
        call!(nvml, nvmlDeviceGetSupportedEventTypes(l4, &raw mut mask)),
        SUCCESS
    );
    assert_eq!(mask & 0xC0B, 0xC0B, "{mask:#x}");
}

#[test]
fn nvml_wrappers_safe_event_api_works_too() {
    let (fake, control) = Fake::with_control("t4-inference", "");
    let nvml = fake.nvml();
    let device = nvml.device_by_index(1).unwrap();
    let supported = device.supported_event_types().unwrap();
    assert!(supported.contains(EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR));
    let set = device
        .register_events(
            EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR,
            nvml.create_event_set().unwrap(),
        )
        .unwrap();
    assert!(matches!(set.wait(10), Err(NvmlError::Timeout)));
    std::fs::write(&control, "xid 1 79\necc 1 1\n").unwrap();
    let event = set.wait(10_000).unwrap();
    assert_eq!(event.event_type, EventTypes::CRITICAL_XID_ERROR);
    assert!(matches!(
        event.event_data,
        Some(nvml_wrapper::enums::event::XidError::Value(79))
    ));
    let event = set.wait(10_000).unwrap();
    assert_eq!(event.event_type, EventTypes::DOUBLE_BIT_ECC_ERROR);
    assert_eq!(
        device
            .total_ecc_errors(
                nvml_wrapper::enum_wrappers::device::MemoryError::Uncorrected,
                nvml_wrapper::enum_wrappers::device::EccCounter::Volatile
            )
            .unwrap(),
        1
    );
    // The T4 retires pages.
    assert!(!device.are_pages_pending_retired().unwrap());
}

#[test]
#[ignore = "run in a child process by control_file_from_the_environment"]
fn child_reads_control_from_the_environment() {
    if !is_child() {
        return;
    }
    let nvml = nvml_from_env().unwrap();
    // `lose 0` was in the file before init: the GPU is lost at once, even
    // to a handle lookup.
    assert!(matches!(nvml.device_by_index(0), Err(NvmlError::GpuLost)));
    assert!(nvml.device_by_index(1).unwrap().uuid().is_ok());
}

#[test]
fn control_file_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control");
    std::fs::write(&control, "bogus line\nlose 0\n").unwrap();
    let profile = nvidia_ml::fixture::bundled_profile("t4-inference");
    let out = run_child(
        "child_reads_control_from_the_environment",
        &[
            ("MOCK_NVML_PROFILE", profile.as_os_str()),
            ("MOCK_NVML_CONTROL", control.as_os_str()),
        ],
    );
    assert_success(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("line 1: unknown command \"bogus\""),
        "{stderr}"
    );
}
