//! GPU health: event sets (create, register, wait, free, supported types),
//! field values (recovery action, remapped rows, retired pages), remapped
//! rows, retired pages, ECC totals, clock-event reasons and the PCIe replay
//! counter. The values come from the live fault state in `faults`, which
//! the profile's `health:` blocks and the control file set.

use std::ffi::{c_int, c_uint, c_ulonglong};
use std::time::Duration;

use nvml_wrapper_sys::bindings as sys;

use super::{export, full_gpu, handle_of, non_null, pointer_of, write};
use crate::codes::{self, Code};
use crate::faults;
use crate::health::GpuHealth;
use crate::runtime;

/// `NVML_FI_DEV_RETIRED_PENDING`.
const FI_RETIRED_PENDING: u32 = 31;
/// `NVML_FI_DEV_REMAPPED_COR`.
const FI_REMAPPED_COR: u32 = 142;
/// `NVML_FI_DEV_REMAPPED_UNC`.
const FI_REMAPPED_UNC: u32 = 143;
/// `NVML_FI_DEV_REMAPPED_PENDING`.
const FI_REMAPPED_PENDING: u32 = 144;
/// `NVML_FI_DEV_REMAPPED_FAILURE`.
const FI_REMAPPED_FAILURE: u32 = 145;
/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`.
const FI_RECOVERY_ACTION: u32 = 230;

/// The GPU index of a whole-GPU handle (MIG handles: NOT_SUPPORTED), with
/// the injected failures and a lost GPU applied, and its health.
fn gpu_health<T>(handle: *mut T, name: &str) -> Result<(usize, GpuHealth), Code> {
    let gpu = runtime::with_machine(|m| full_gpu(m, handle, name))?;
    let health = faults::with_gpu(gpu, Clone::clone).ok_or(codes::UNKNOWN)?;
    Ok((gpu, health))
}

export! {
    /// A new, empty event set.
    fn nvmlEventSetCreate(set: *mut sys::nvmlEventSet_t) {
        non_null(set)?;
        runtime::with_machine(|m| m.injected(NAME, None))?;
        let handle = faults::create_set();
        // SAFETY: output pointer per the contract.
        unsafe { write(set, pointer_of(handle)) }
    }
}

export! {
    /// Frees an event set; threads waiting on it get INVALID_ARGUMENT.
    fn nvmlEventSetFree(set: sys::nvmlEventSet_t) {
        faults::free_set(handle_of(set))
    }
}

export! {
    /// The event types a GPU supports (see `GpuHealth::supported_events`).
    fn nvmlDeviceGetSupportedEventTypes(device: sys::nvmlDevice_t, event_types: *mut c_ulonglong) {
        non_null(event_types)?;
        let (_, health) = gpu_health(device, NAME)?;
        // SAFETY: output pointer per the contract.
        unsafe { write(event_types, health.supported_events()) }
    }
}

export! {
    /// Registers event types of a GPU in a set: NOT_SUPPORTED when a type
    /// is not supported or the GPU refuses events (`refuse-events`).
    fn nvmlDeviceRegisterEvents(device: sys::nvmlDevice_t, event_types: c_ulonglong, set: sys::nvmlEventSet_t) {
        let (gpu, _) = gpu_health(device, NAME)?;
        faults::register(handle_of(set), gpu, handle_of(device), event_types)
    }
}

/// Waits for the next event of a set and writes it out.
///
/// # Safety
///
/// `data` must be null or valid for a write of `nvmlEventData_t`.
unsafe fn wait_into(
    name: &str,
    set: sys::nvmlEventSet_t,
    data: *mut sys::nvmlEventData_t,
    timeout_ms: c_uint,
) -> Result<(), Code> {
    non_null(data)?;
    runtime::with_machine(|m| m.injected(name, None))?;
    let event = faults::wait(handle_of(set), Duration::from_millis(u64::from(timeout_ms)))?;
    let out = sys::nvmlEventData_t {
        device: pointer_of(event.device),
        eventType: event.event_type,
        eventData: event.data,
        gpuInstanceId: event.gpu_instance_id,
        computeInstanceId: event.compute_instance_id,
    };
    // SAFETY: forwarded caller contract.
    unsafe { write(data, out) }
}

export! {
    /// Waits up to `timeoutms` for an event: TIMEOUT when none comes,
    /// GPU_IS_LOST while a registered GPU is lost. GI and CI are the MIG
    /// instance of an XID injected with them, 0xFFFFFFFF otherwise.
    fn nvmlEventSetWait_v2(set: sys::nvmlEventSet_t, data: *mut sys::nvmlEventData_t, timeoutms: c_uint) {
        // SAFETY: forwarded caller contract.
        unsafe { wait_into(NAME, set, data, timeoutms) }
    }
}

export! {
    /// The unversioned wait: the same as `nvmlEventSetWait_v2`.
    fn nvmlEventSetWait(set: sys::nvmlEventSet_t, data: *mut sys::nvmlEventData_t, timeoutms: c_uint) {
        // SAFETY: forwarded caller contract.
        unsafe { wait_into(NAME, set, data, timeoutms) }
    }
}

/// One field's value, or the per-field return code.
fn field(health: &GpuHealth, field_id: u32) -> Result<u64, Code> {
    let remap = |v: bool| {
        if health.row_remapping {
            Ok(u64::from(v))
        } else {
            Err(codes::NOT_SUPPORTED)
        }
    };
    match field_id {
        FI_RECOVERY_ACTION if health.has_recovery_action => Ok(u64::from(health.recovery_action)),
        FI_REMAPPED_COR => remap(false),
        FI_REMAPPED_UNC => remap(health.remap_pending || health.remap_failure),
        FI_REMAPPED_PENDING => remap(health.remap_pending),
        FI_REMAPPED_FAILURE => remap(health.remap_failure),
        FI_RETIRED_PENDING if !health.row_remapping => Ok(u64::from(health.remap_pending)),
        _ => Err(codes::NOT_SUPPORTED),
    }
}

export! {
    /// Field values: the recovery action (230, R565+), remapped rows
    /// (142-145, Ampere+), retired pages pending (31, before Ampere); any
    /// other field has NOT_SUPPORTED in its `nvmlReturn`.
    fn nvmlDeviceGetFieldValues(device: sys::nvmlDevice_t, values_count: c_int, values: *mut sys::nvmlFieldValue_t) {
        non_null(values)?;
        let count = usize::try_from(values_count).map_err(|_| codes::INVALID_ARGUMENT)?;
        if count == 0 {
            return Err(codes::INVALID_ARGUMENT);
        }
        let (_, health) = gpu_health(device, NAME)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        for i in 0..count {
            // SAFETY: the caller's array holds `values_count` elements.
            let slot = unsafe { values.add(i) };
            // SAFETY: as above; the element is initialised by the caller
            // (fieldId and scopeId are inputs).
            let mut value = unsafe { slot.read_unaligned() };
            value.timestamp = now;
            value.latencyUsec = 0;
            match field(&health, value.fieldId) {
                Ok(v) => {
                    value.nvmlReturn = codes::SUCCESS;
                    value.valueType = sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                    value.value = sys::nvmlValue_t { ullVal: v };
                }
                Err(code) => value.nvmlReturn = code,
            }
            // SAFETY: as above.
            unsafe { slot.write_unaligned(value) };
        }
        Ok(())
    }
}

export! {
    /// Remapped rows (Ampere and later): corrected 0, uncorrected 1 while a
    /// remap is pending or failed, and the two flags.
    fn nvmlDeviceGetRemappedRows(
        device: sys::nvmlDevice_t,
        corr_rows: *mut c_uint,
        unc_rows: *mut c_uint,
        is_pending: *mut c_uint,
        failure_occurred: *mut c_uint,
    ) {
        non_null(corr_rows)?;
        non_null(unc_rows)?;
        non_null(is_pending)?;
        non_null(failure_occurred)?;
        let (_, h) = gpu_health(device, NAME)?;
        if !h.row_remapping {
            return Err(codes::NOT_SUPPORTED);
        }
        // SAFETY: output pointers per the contract.
        unsafe {
            write(corr_rows, 0)?;
            write(unc_rows, c_uint::from(h.remap_pending || h.remap_failure))?;
            write(is_pending, c_uint::from(h.remap_pending))?;
            write(failure_occurred, c_uint::from(h.remap_failure))
        }
    }
}

export! {
    /// Whether retired pages wait for a reset (GPUs before Ampere; later
    /// ones remap rows and answer NOT_SUPPORTED).
    fn nvmlDeviceGetRetiredPagesPendingStatus(device: sys::nvmlDevice_t, is_pending: *mut sys::nvmlEnableState_t) {
        non_null(is_pending)?;
        let (_, h) = gpu_health(device, NAME)?;
        if h.row_remapping {
            return Err(codes::NOT_SUPPORTED);
        }
        let state = if h.remap_pending {
            sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED
        } else {
            sys::nvmlEnableState_enum_NVML_FEATURE_DISABLED
        };
        // SAFETY: output pointer per the contract.
        unsafe { write(is_pending, state) }
    }
}

export! {
    /// ECC error totals: uncorrected errors are the fault state's count
    /// (volatile and aggregate alike), corrected ones 0.
    fn nvmlDeviceGetTotalEccErrors(
        device: sys::nvmlDevice_t,
        error_type: sys::nvmlMemoryErrorType_t,
        counter_type: sys::nvmlEccCounterType_t,
        ecc_counts: *mut c_ulonglong,
    ) {
        non_null(ecc_counts)?;
        if error_type >= sys::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_COUNT
            || counter_type >= sys::nvmlEccCounterType_enum_NVML_ECC_COUNTER_TYPE_COUNT
        {
            return Err(codes::INVALID_ARGUMENT);
        }
        let (_, h) = gpu_health(device, NAME)?;
        let count = if error_type == sys::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED {
            h.ecc_uncorrected
        } else {
            0
        };
        // SAFETY: output pointer per the contract.
        unsafe { write(ecc_counts, count) }
    }
}

export! {
    /// The active clock-event reasons.
    fn nvmlDeviceGetCurrentClocksEventReasons(device: sys::nvmlDevice_t, reasons: *mut c_ulonglong) {
        non_null(reasons)?;
        let (_, h) = gpu_health(device, NAME)?;
        // SAFETY: output pointer per the contract.
        unsafe { write(reasons, h.clock_reasons) }
    }
}

export! {
    /// The deprecated name of `nvmlDeviceGetCurrentClocksEventReasons`.
    fn nvmlDeviceGetCurrentClocksThrottleReasons(device: sys::nvmlDevice_t, reasons: *mut c_ulonglong) {
        non_null(reasons)?;
        let (_, h) = gpu_health(device, NAME)?;
        // SAFETY: output pointer per the contract.
        unsafe { write(reasons, h.clock_reasons) }
    }
}

export! {
    /// The PCIe replay counter.
    fn nvmlDeviceGetPcieReplayCounter(device: sys::nvmlDevice_t, value: *mut c_uint) {
        non_null(value)?;
        let (_, h) = gpu_health(device, NAME)?;
        // SAFETY: output pointer per the contract.
        unsafe { write(value, h.pcie_replays) }
    }
}
