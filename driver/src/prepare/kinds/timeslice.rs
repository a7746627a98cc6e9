//! A time-sliced whole GPU (`GpuConfig` with `TimeSlicing`): compute mode
//! `Default` and the interval set through `nvidia-smi`, each journalled
//! before it is made; undone by setting the default interval again (the
//! compute mode is restored by `compute_mode::restore`).

use gpu_dra_api::config::{DeviceConfig, TimeSliceInterval};
use gpu_nvml::ComputeMode;

use super::{Kind, Release, Setup, Undo};
use crate::prepare::Inner;
use crate::prepare::checkpoint::{ClaimEntry, ClaimUid, DeviceKind, PreparedDeviceRecord};
use crate::prepare::compute_mode::{self, index_of};
use crate::prepare::error::PrepareError;
use crate::prepare::journal::journal;
use crate::prepare::plan::{GpuTarget, Target};
use crate::prepare::timeslice::{self, TimeSliceError};

/// The time-slice kind.
pub(crate) struct TimeSlice;

impl Kind for TimeSlice {
    fn setup(&self, claim: &mut Setup<'_>, i: usize) -> Result<(), PrepareError> {
        let d = claim.device(i);
        let (Target::Gpu(g), Some(DeviceConfig::Gpu(cfg))) = (&d.target, claim.sharing_config(i))
        else {
            return Ok(());
        };
        let Some(interval) = cfg.time_slice() else {
            return Ok(());
        };
        time_slice(claim.inner, &claim.plan.uid, claim.entry, i, g, interval)
    }

    fn undo(&self, cx: &mut Undo<'_>, record: &PreparedDeviceRecord) {
        if let Some(interval) = &record.sharing.time_slice_interval
            && interval != "Default"
            && let Err(e) = timeslice::set_timeslice(
                &cx.inner.opts.driver_root,
                record.gpu_uuid(),
                TimeSliceInterval::Default,
            )
        {
            cx.errors
                .push(format!("reset time-slice of {}: {e}", record.device));
        }
    }

    fn release_lost(&self, cx: &mut Release<'_>) {
        let mut errors = Vec::new();
        for gpu in &cx.claim.time_slices {
            let set_since = cx.records().any(|r| {
                matches!(&r.kind, DeviceKind::Gpu { uuid, .. } if uuid == gpu)
                    && r.sharing
                        .time_slice_interval
                        .as_deref()
                        .is_some_and(|i| i != "Default")
            });
            // A GPU this plugin does not know is no name to hand nvidia-smi.
            if set_since || index_of(cx.inner, gpu).is_none() {
                continue;
            }
            if let Err(e) = timeslice::set_timeslice(
                &cx.inner.opts.driver_root,
                gpu,
                TimeSliceInterval::Default,
            ) {
                errors.push(format!("reset the time slice of GPU {gpu}: {e}"));
            }
        }
        cx.errors.extend(errors);
    }
}

/// Compute mode `Default` and the time slice, each recorded durably
/// before it is set.
fn time_slice(
    inner: &Inner,
    uid: &ClaimUid,
    entry: &mut ClaimEntry,
    i: usize,
    g: &GpuTarget,
    interval: TimeSliceInterval,
) -> Result<(), PrepareError> {
    compute_mode::set(inner, uid, entry, i, g.index, ComputeMode::Default)?;
    entry.devices[i].sharing.time_slice_interval = Some(format!("{interval:?}"));
    journal(inner, uid, entry, "record a time-slice change")?;
    timeslice::set_timeslice(&inner.opts.driver_root, &g.uuid, interval).map_err(|error| {
        // Refused, or never run: the time slice is as it was. A reset in
        // the rollback would fail the same way and keep the half-done
        // entry holding the GPU. Only a timed-out or unwaited run may
        // have changed it, and stays for the rollback to reset.
        if !matches!(
            error,
            TimeSliceError::TimedOut { .. } | TimeSliceError::Spawn { .. }
        ) {
            entry.devices[i].sharing.time_slice_interval = None;
        }
        PrepareError::TimeSlice {
            device: entry.devices[i].device.clone(),
            error,
        }
    })
}
