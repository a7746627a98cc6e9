//! [`HealthSource`] for [`NvmlBackend`]: one NVML event set per physical GPU,
//! waited on with the raw `nvmlEventSetWait_v2` (nvml-wrapper 0.13 drops the
//! GPU and compute instance ids and the newer event types), and a poll of
//! the conditions NVML reports only when asked.
//!
//! Every NVML call that nvml-wrapper does not wrap faithfully is made here
//! through the symbol table of the loaded library; each `unsafe` block is one
//! such call and says why it is sound.
#![allow(unsafe_code)]

use std::os::raw::{c_int, c_uint, c_ulonglong};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings as sys;

use super::NvmlBackend;
use super::raw::RawDevice;
use crate::health::{
    EventKind, EventWatch, HealthEvent, HealthPoll, HealthSource, LinkState, Liveness,
    RecoveryAction, RemapState,
};
use crate::{Error, Result};

/// `nvmlEventTypeSingleBitEccError`.
pub(crate) const EVENT_SBE: u64 = 0x1;
/// `nvmlEventTypeDoubleBitEccError`.
pub(crate) const EVENT_DBE: u64 = 0x2;
/// `nvmlEventTypeXidCriticalError`.
pub(crate) const EVENT_XID: u64 = 0x8;
/// `nvmlEventTypeDramRetirementEvent`.
pub(crate) const EVENT_DRAM_RETIREMENT: u64 = 0x400;
/// `nvmlEventTypeDramRetirementFailure`.
pub(crate) const EVENT_DRAM_RETIREMENT_FAILURE: u64 = 0x800;
/// `nvmlEventTypeFatalPoisonError`.
pub(crate) const EVENT_FATAL_POISON: u64 = 0x2000;
/// `nvmlEventTypeGpuUnavailableError`.
pub(crate) const EVENT_GPU_UNAVAILABLE: u64 = 0x4000;
/// `nvmlEventTypeGpuRecoveryAction`.
pub(crate) const EVENT_RECOVERY_ACTION: u64 = 0x8000;

/// Every event type the monitor wants, registered as far as the GPU
/// supports them.
pub(crate) const HEALTH_EVENTS: u64 = EVENT_XID
    | EVENT_DBE
    | EVENT_SBE
    | EVENT_RECOVERY_ACTION
    | EVENT_GPU_UNAVAILABLE
    | EVENT_DRAM_RETIREMENT
    | EVENT_DRAM_RETIREMENT_FAILURE
    | EVENT_FATAL_POISON;

/// What is registered when the full mask is refused.
pub(crate) const FALLBACK_EVENTS: u64 = EVENT_XID | EVENT_DBE;

/// The id NVML puts in `gpuInstanceId`/`computeInstanceId` for an event of
/// the whole GPU.
const WHOLE_GPU: u32 = 0xFFFF_FFFF;

/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`.
pub(crate) const FIELD_RECOVERY_ACTION: u32 = 230;

/// Clock-event reasons (`nvmlClocksEventReason*`).
const CLOCKS_SW_THERMAL: u64 = 0x20;
const CLOCKS_HW_SLOWDOWN: u64 = 0x8;
const CLOCKS_HW_THERMAL: u64 = 0x40;
const CLOCKS_HW_POWER_BRAKE: u64 = 0x80;

/// An NVML event set, freed on drop.
#[derive(Debug)]
struct EventSet(sys::nvmlEventSet_t);

// SAFETY: an nvmlEventSet_t is an opaque token; NVML's API is thread-safe and
// the set is used by one thread at a time (the watch owns it and `wait` takes
// `&mut self`). nvml-wrapper makes the same claim for its `EventSet` (Send).
unsafe impl Send for EventSet {}

/// The event watch of one GPU.
pub(crate) struct NvmlEventWatch {
    /// Keeps NVML initialised while the set lives.
    nvml: Arc<Nvml>,
    set: EventSet,
    gpu: u32,
    device: RawDevice,
    /// The event types registered.
    mask: u64,
}

impl std::fmt::Debug for NvmlEventWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlEventWatch")
            .field("gpu", &self.gpu)
            .field("mask", &format_args!("{:#x}", self.mask))
            .finish_non_exhaustive()
    }
}

impl Drop for NvmlEventWatch {
    fn drop(&mut self) {
        if let Err(e) = free_event_set(&self.nvml, &self.set) {
            tracing::debug!(gpu = self.gpu, error = %e, "freeing the NVML event set failed");
        }
    }
}

/// `nvmlEventSetCreate`.
fn create_event_set(nvml: &Nvml) -> Result<EventSet, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlEventSetCreate.as_ref())?;
    let mut set: sys::nvmlEventSet_t = std::ptr::null_mut();
    // SAFETY: a valid out pointer for the new set's handle.
    nvml_try(unsafe { sym(&raw mut set) })?;
    Ok(EventSet(set))
}

/// `nvmlEventSetFree`.
fn free_event_set(nvml: &Nvml, set: &EventSet) -> Result<(), NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlEventSetFree.as_ref())?;
    // SAFETY: the set came from nvmlEventSetCreate of this library and is
    // freed once (only by the owner's drop or on a failed registration,
    // after which the owner is gone).
    nvml_try(unsafe { sym(set.0) })
}

/// `nvmlDeviceGetSupportedEventTypes`.
fn supported_event_types(nvml: &Nvml, device: RawDevice) -> Result<u64, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetSupportedEventTypes.as_ref())?;
    let mut types: c_ulonglong = 0;
    // SAFETY: valid device handle (see RawDevice) and a valid out pointer.
    nvml_try(unsafe { sym(device.raw(), &raw mut types) })?;
    Ok(types)
}

/// `nvmlDeviceRegisterEvents`.
fn register_events(
    nvml: &Nvml,
    device: RawDevice,
    mask: u64,
    set: &EventSet,
) -> Result<(), NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceRegisterEvents.as_ref())?;
    // SAFETY: valid device handle and a live event set of this library.
    nvml_try(unsafe { sym(device.raw(), mask, set.0) })
}

/// One raw event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RawEvent {
    device: usize,
    event_type: u64,
    data: u64,
    gpu_instance_id: u32,
    compute_instance_id: u32,
}

/// `nvmlEventSetWait_v2`: `Ok(None)` on NVML_ERROR_TIMEOUT.
fn wait_raw(nvml: &Nvml, set: &EventSet, timeout_ms: u32) -> Result<Option<RawEvent>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlEventSetWait_v2.as_ref())?;
    let mut data = sys::nvmlEventData_t {
        device: std::ptr::null_mut(),
        eventType: 0,
        eventData: 0,
        gpuInstanceId: WHOLE_GPU,
        computeInstanceId: WHOLE_GPU,
    };
    // SAFETY: a live event set of this library and a valid out struct of the
    // layout the v2 entry point writes (nvml-wrapper-sys's bindings).
    match nvml_try(unsafe { sym(set.0, &raw mut data, timeout_ms) }) {
        Ok(()) => Ok(Some(RawEvent {
            device: data.device.addr(),
            event_type: data.eventType,
            data: data.eventData,
            gpu_instance_id: data.gpuInstanceId,
            compute_instance_id: data.computeInstanceId,
        })),
        Err(NvmlError::Timeout) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What an event type means, or `None` for a type the monitor did not ask for.
fn event_kind(event_type: u64, data: u64) -> Option<EventKind> {
    Some(match event_type {
        EVENT_XID => EventKind::Xid(data),
        EVENT_DBE => EventKind::DoubleBitEcc,
        EVENT_SBE => EventKind::SingleBitEcc,
        EVENT_RECOVERY_ACTION => {
            EventKind::RecoveryAction(RecoveryAction::from_raw(u32::try_from(data).ok()?))
        }
        EVENT_GPU_UNAVAILABLE => EventKind::GpuUnavailable,
        EVENT_DRAM_RETIREMENT => EventKind::DramRetirement,
        EVENT_DRAM_RETIREMENT_FAILURE => EventKind::DramRetirementFailure,
        EVENT_FATAL_POISON => EventKind::FatalPoison,
        _ => return None,
    })
}

/// An instance id as the event carries it: `None` for the whole GPU.
fn instance_id(raw: u32) -> Option<u32> {
    (raw != WHOLE_GPU).then_some(raw)
}

/// A timeout in whole milliseconds for NVML, rounded up (so a short wait
/// is not a busy poll) and capped at `u32::MAX`.
fn timeout_ms(timeout: Duration) -> u32 {
    let ms = timeout.as_nanos().div_ceil(1_000_000);
    u32::try_from(ms).unwrap_or(u32::MAX)
}

impl EventWatch for NvmlEventWatch {
    fn wait(&mut self, timeout: Duration) -> Result<Option<HealthEvent>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(raw) = wait_raw(&self.nvml, &self.set, timeout_ms(left))
                .map_err(super::call("nvmlEventSetWait_v2", self.gpu))?
            else {
                return Ok(None);
            };
            if raw.device != self.device.raw().addr() {
                // One set per GPU: anything else is NVML's mistake. The
                // event is still this set's, so it counts for this GPU.
                tracing::debug!(gpu = self.gpu, "NVML event with a foreign device handle");
            }
            if let Some(kind) = event_kind(raw.event_type, raw.data) {
                return Ok(Some(HealthEvent {
                    gpu_index: self.gpu,
                    kind,
                    gpu_instance_id: instance_id(raw.gpu_instance_id),
                    compute_instance_id: instance_id(raw.compute_instance_id),
                    at: SystemTime::now(),
                }));
            }
            tracing::debug!(
                gpu = self.gpu,
                event_type = raw.event_type,
                data = raw.data,
                "NVML event of a type not asked for, skipped"
            );
            if left.is_zero() {
                return Ok(None);
            }
        }
    }
}

/// `nvmlDeviceGetFieldValues` for one field: `Ok(None)` when the field is
/// not supported (the call or the value says NOT_SUPPORTED).
fn field_value(nvml: &Nvml, device: RawDevice, field: u32) -> Result<Option<u64>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetFieldValues.as_ref())?;
    let mut value = sys::nvmlFieldValue_t {
        fieldId: field,
        scopeId: 0,
        timestamp: 0,
        latencyUsec: 0,
        valueType: 0,
        nvmlReturn: 0,
        value: sys::nvmlValue_t { ullVal: 0 },
    };
    // SAFETY: valid device handle; one initialised element, count 1.
    match nvml_try(unsafe { sym(device.raw(), 1 as c_int, &raw mut value) }) {
        Ok(()) => {}
        Err(NvmlError::NotSupported) => return Ok(None),
        Err(e) => return Err(e),
    }
    match nvml_try(value.nvmlReturn) {
        Ok(()) => {}
        Err(NvmlError::NotSupported) => return Ok(None),
        Err(e) => return Err(e),
    }
    // SAFETY: NVML wrote the member that `valueType` names; every member is
    // plain data, so reading the named one is sound.
    let number = unsafe {
        match value.valueType {
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT => u64::from(value.value.uiVal),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG => value.value.ulVal,
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG => value.value.ullVal,
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG => {
                u64::try_from(value.value.sllVal).map_err(|_| NvmlError::UnexpectedVariant(0))?
            }
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT => {
                u64::try_from(value.value.siVal).map_err(|_| NvmlError::UnexpectedVariant(0))?
            }
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_SHORT => u64::from(value.value.usVal),
            other => return Err(NvmlError::UnexpectedVariant(other)),
        }
    };
    Ok(Some(number))
}

/// `nvmlDeviceGetRemappedRows`: (corrected, uncorrected, pending, failure).
fn remapped_rows(nvml: &Nvml, device: RawDevice) -> Result<RemapState, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corrected, mut uncorrected, mut pending, mut failure): (
        c_uint,
        c_uint,
        c_uint,
        c_uint,
    ) = (0, 0, 0, 0);
    // SAFETY: valid device handle and four valid out pointers.
    nvml_try(unsafe {
        sym(
            device.raw(),
            &raw mut corrected,
            &raw mut uncorrected,
            &raw mut pending,
            &raw mut failure,
        )
    })?;
    Ok(RemapState {
        pending: pending != 0,
        failure: failure != 0,
    })
}

/// `nvmlDeviceGetCurrentClocksEventReasons`, or the older
/// `nvmlDeviceGetCurrentClocksThrottleReasons` where the library lacks it.
fn clock_event_reasons(nvml: &Nvml, device: RawDevice) -> Result<u64, NvmlError> {
    let sym = match nvml.lib().nvmlDeviceGetCurrentClocksEventReasons.as_ref() {
        Ok(sym) => sym,
        Err(_) => nvml_sym(
            nvml.lib()
                .nvmlDeviceGetCurrentClocksThrottleReasons
                .as_ref(),
        )?,
    };
    let mut reasons: c_ulonglong = 0;
    // SAFETY: valid device handle and a valid out pointer; both entry points
    // have this signature.
    nvml_try(unsafe { sym(device.raw(), &raw mut reasons) })?;
    Ok(reasons)
}

/// `nvmlDeviceGetNvLinkState` of one link.
fn nvlink_active(nvml: &Nvml, device: RawDevice, link: u32) -> Result<bool, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetNvLinkState.as_ref())?;
    let mut state: sys::nvmlEnableState_t = 0;
    // SAFETY: valid device handle and a valid out pointer.
    nvml_try(unsafe { sym(device.raw(), link, &raw mut state) })?;
    Ok(state == sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED)
}

/// Collects one poll, remembering whether the GPU was found lost on the way.
struct Poller {
    gpu: u32,
    lost: Option<Liveness>,
}

impl Poller {
    /// The value of an optional query: NOT_SUPPORTED (or a symbol the
    /// library lacks) is `None`; a lost GPU is remembered and `None`;
    /// another error is logged and `None`.
    fn optional<T>(&mut self, what: &'static str, result: Result<T, NvmlError>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => None,
            Err(e) => {
                if let Some(liveness) = liveness_of(&e) {
                    self.lost.get_or_insert(liveness);
                } else {
                    tracing::debug!(gpu = self.gpu, query = what, error = %e, "health query failed, value unknown");
                }
                None
            }
        }
    }
}

/// The liveness a call's error means; `None` for errors that do not say
/// anything about the GPU's state.
fn liveness_of(e: &NvmlError) -> Option<Liveness> {
    match e {
        NvmlError::GpuLost => Some(Liveness::Lost),
        NvmlError::ResetRequired => Some(Liveness::ResetRequired),
        _ => None,
    }
}

/// Every NVLink of the GPU with its state: links are asked in order until
/// NVML says the chip has no such link; a GPU without NVLink (NOT_SUPPORTED
/// on every link) has none.
fn nvlinks(poller: &mut Poller, nvml: &Nvml, device: RawDevice) -> Vec<LinkState> {
    let mut links = Vec::new();
    for link in 0..sys::NVML_NVLINK_MAX_LINKS {
        match nvlink_active(nvml, device, link) {
            Ok(active) => links.push(LinkState { link, active }),
            Err(NvmlError::InvalidArg) => break,
            Err(e) => {
                // NOT_SUPPORTED: no such link (or no NVLink at all); a lost
                // GPU ends the poll.
                let _: Option<()> = poller.optional("nvmlDeviceGetNvLinkState", Err(e));
                if poller.lost.is_some() {
                    break;
                }
            }
        }
    }
    links
}

impl NvmlBackend {
    /// The cached handle of GPU `index`, with NVML's own error (so a lost
    /// GPU can be told from a bad index).
    pub(super) fn health_handle(&self, index: u32) -> Result<RawDevice, NvmlError> {
        if let Some(handle) = self.lock_handles().get(&index) {
            return Ok(*handle);
        }
        let device = self.nvml.device_by_index(index)?;
        let handle = RawDevice::of(&device);
        self.lock_handles().insert(index, handle);
        Ok(handle)
    }
}

impl HealthSource for NvmlBackend {
    fn watch(&self, index: u32) -> Result<Box<dyn EventWatch>> {
        let device = self
            .health_handle(index)
            .map_err(super::call("nvmlDeviceGetHandleByIndex", index))?;
        let supported = supported_event_types(&self.nvml, device)
            .map_err(super::call("nvmlDeviceGetSupportedEventTypes", index))?;
        let set = create_event_set(&self.nvml).map_err(super::call("nvmlEventSetCreate", index))?;
        let mut last = None;
        for mask in [supported & HEALTH_EVENTS, supported & FALLBACK_EVENTS] {
            if mask == 0 || last.as_ref().is_some_and(|(m, _)| *m == mask) {
                continue;
            }
            match register_events(&self.nvml, device, mask, &set) {
                Ok(()) => {
                    tracing::debug!(
                        gpu = index,
                        mask = format_args!("{mask:#x}"),
                        "NVML events registered"
                    );
                    return Ok(Box::new(NvmlEventWatch {
                        nvml: Arc::clone(&self.nvml),
                        set,
                        gpu: index,
                        device,
                        mask,
                    }));
                }
                Err(e) => {
                    tracing::debug!(gpu = index, mask = format_args!("{mask:#x}"), error = %e, "NVML refused the event registration");
                    last = Some((mask, e));
                }
            }
        }
        if let Err(e) = free_event_set(&self.nvml, &set) {
            tracing::debug!(gpu = index, error = %e, "freeing the NVML event set failed");
        }
        Err(match last {
            Some((_, e)) => super::call("nvmlDeviceRegisterEvents", index)(e),
            None => Error::Call {
                call: "nvmlDeviceGetSupportedEventTypes",
                gpu: Some(index),
                reason: format!(
                    "the GPU supports none of the health event types (supported mask {supported:#x})"
                ),
            },
        })
    }

    fn poll(&self, index: u32) -> Result<HealthPoll> {
        let device = match self.health_handle(index) {
            Ok(device) => device,
            Err(e) => {
                return match liveness_of(&e) {
                    Some(liveness) => Ok(HealthPoll::liveness_only(liveness)),
                    None => Err(super::call("nvmlDeviceGetHandleByIndex", index)(e)),
                };
            }
        };
        let nvml: &Nvml = &self.nvml;
        let wrapped = device.device(nvml);
        match wrapped.uuid() {
            Ok(_) => {}
            Err(e) => {
                return match liveness_of(&e) {
                    Some(liveness) => Ok(HealthPoll::liveness_only(liveness)),
                    None => match e {
                        NvmlError::Uninitialized | NvmlError::FailedToLoadSymbol(_) => {
                            Err(super::call("nvmlDeviceGetUUID", index)(e))
                        }
                        other => Ok(HealthPoll::liveness_only(Liveness::Error(
                            other.to_string(),
                        ))),
                    },
                };
            }
        }
        let mut p = Poller {
            gpu: index,
            lost: None,
        };
        let recovery_action = p
            .optional(
                "nvmlDeviceGetFieldValues(230)",
                field_value(nvml, device, FIELD_RECOVERY_ACTION),
            )
            .flatten()
            .map(|v| RecoveryAction::from_raw(u32::try_from(v).unwrap_or(u32::MAX)));
        let remap = p.optional("nvmlDeviceGetRemappedRows", remapped_rows(nvml, device));
        let retired_pages_pending = p.optional(
            "nvmlDeviceGetRetiredPagesPendingStatus",
            wrapped.are_pages_pending_retired(),
        );
        let volatile_uncorrected_ecc = p.optional(
            "nvmlDeviceGetTotalEccErrors",
            wrapped.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
        );
        let reasons = p.optional(
            "nvmlDeviceGetCurrentClocksEventReasons",
            clock_event_reasons(nvml, device),
        );
        let pcie_replays = p
            .optional(
                "nvmlDeviceGetPcieReplayCounter",
                wrapped.pcie_replay_counter(),
            )
            .map(u64::from);
        let links = nvlinks(&mut p, nvml, device);
        if let Some(liveness) = p.lost {
            return Ok(HealthPoll::liveness_only(liveness));
        }
        Ok(HealthPoll {
            liveness: Liveness::Alive,
            recovery_action,
            remap,
            retired_pages_pending,
            volatile_uncorrected_ecc,
            hw_slowdown: reasons.map(|r| r & (CLOCKS_HW_SLOWDOWN | CLOCKS_HW_POWER_BRAKE) != 0),
            thermal_slowdown: reasons.map(|r| r & (CLOCKS_HW_THERMAL | CLOCKS_SW_THERMAL) != 0),
            pcie_replays,
            nvlinks: links,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_map_to_kinds() {
        for (mask, data, kind) in [
            (EVENT_XID, 79, EventKind::Xid(79)),
            (EVENT_DBE, 0, EventKind::DoubleBitEcc),
            (EVENT_SBE, 0, EventKind::SingleBitEcc),
            (
                EVENT_RECOVERY_ACTION,
                1,
                EventKind::RecoveryAction(RecoveryAction::GpuReset),
            ),
            (
                EVENT_RECOVERY_ACTION,
                9,
                EventKind::RecoveryAction(RecoveryAction::Other(9)),
            ),
            (EVENT_GPU_UNAVAILABLE, 0, EventKind::GpuUnavailable),
            (EVENT_DRAM_RETIREMENT, 0, EventKind::DramRetirement),
            (
                EVENT_DRAM_RETIREMENT_FAILURE,
                0,
                EventKind::DramRetirementFailure,
            ),
            (EVENT_FATAL_POISON, 0, EventKind::FatalPoison),
        ] {
            assert_eq!(event_kind(mask, data), Some(kind), "{mask:#x} {data}");
        }
        // An unknown recovery action code; PState, clock and combined bits
        // are not health events.
        for (mask, data) in [
            (EVENT_RECOVERY_ACTION, u64::MAX),
            (0x4, 0),
            (0x10, 0),
            (EVENT_XID | EVENT_DBE, 0),
        ] {
            assert_eq!(event_kind(mask, data), None, "{mask:#x} {data}");
        }
    }

    #[test]
    fn whole_gpu_ids_are_none() {
        assert_eq!(instance_id(0xFFFF_FFFF), None);
        assert_eq!(instance_id(0), Some(0));
        assert_eq!(instance_id(13), Some(13));
    }

    #[test]
    fn timeouts_round_up_and_saturate() {
        assert_eq!(timeout_ms(Duration::ZERO), 0);
        assert_eq!(timeout_ms(Duration::from_micros(1)), 1);
        assert_eq!(timeout_ms(Duration::from_millis(4999)), 4999);
        assert_eq!(timeout_ms(Duration::from_secs(u64::MAX)), u32::MAX);
    }

    #[test]
    fn the_masks_are_nvidias_numbers() {
        for (ours, nvidias) in [
            (EVENT_XID, sys::nvmlEventTypeXidCriticalError),
            (EVENT_DBE, sys::nvmlEventTypeDoubleBitEccError),
            (EVENT_SBE, sys::nvmlEventTypeSingleBitEccError),
            (EVENT_RECOVERY_ACTION, sys::nvmlEventTypeGpuRecoveryAction),
            (EVENT_GPU_UNAVAILABLE, sys::nvmlEventTypeGpuUnavailableError),
            (EVENT_DRAM_RETIREMENT, sys::nvmlEventTypeDramRetirementEvent),
            (
                EVENT_DRAM_RETIREMENT_FAILURE,
                sys::nvmlEventTypeDramRetirementFailure,
            ),
            (EVENT_FATAL_POISON, sys::nvmlEventTypeFatalPoisonError),
            (CLOCKS_HW_SLOWDOWN, sys::nvmlClocksThrottleReasonHwSlowdown),
            (
                CLOCKS_HW_THERMAL,
                sys::nvmlClocksThrottleReasonHwThermalSlowdown,
            ),
            (
                CLOCKS_HW_POWER_BRAKE,
                sys::nvmlClocksThrottleReasonHwPowerBrakeSlowdown,
            ),
            (
                CLOCKS_SW_THERMAL,
                sys::nvmlClocksEventReasonSwThermalSlowdown,
            ),
        ] {
            assert_eq!(ours, u64::from(nvidias), "{ours:#x}");
        }
        assert_eq!(HEALTH_EVENTS, 0xEC0B);
    }
}
