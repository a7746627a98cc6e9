//! A MIG device: created at the allocated placement (dynamic MIG) or found
//! (static), its capability nodes in the claim's CDI spec; undone by
//! destroying what this plugin created (verified by UUID). At start, with
//! dynamic MIG, MIG devices that no entry and no lost claim names are
//! destroyed (a crash between creating an instance and recording it).

use std::collections::HashSet;

use super::{Kind, Recovery, Release, Setup, Undo};
use crate::prepare::Inner;
use crate::prepare::checkpoint::{DeviceKind, PreparedDeviceRecord};
use crate::prepare::compute_mode::index_of;
use crate::prepare::error::PrepareError;
use crate::prepare::journal::failpoint;
use crate::prepare::mig;
use crate::prepare::plan::{MigTarget, PlannedDevice, Target};

/// The MIG kind.
pub(crate) struct Mig;

impl Kind for Mig {
    fn setup(&self, claim: &mut Setup<'_>, i: usize) -> Result<(), PrepareError> {
        let d = claim.device(i);
        let Target::Mig(m) = &d.target else {
            return Ok(());
        };
        let (gi, ci, _) = mig_device(claim.inner, d, m, &mut claim.entry.devices[i])?;
        let nodes = claim.inner.nodes.mig(m.request.parent_minor, gi, ci)?;
        claim.spec.add_mig(&claim.names[i], &nodes)?;
        Ok(())
    }

    fn undo(&self, cx: &mut Undo<'_>, record: &PreparedDeviceRecord) {
        let DeviceKind::Mig {
            parent_uuid,
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(ci),
            mig_uuid: Some(mig_uuid),
            created: true,
            ..
        } = &record.kind
        else {
            return;
        };
        match index_of(cx.inner, parent_uuid) {
            Some(index) => {
                // Verified by UUID: after a first destroy, another
                // claim's new device may have got the same ids.
                if let Err(e) = mig::destroy_verified(&*cx.inner.backend, index, *gi, *ci, mig_uuid)
                {
                    cx.errors
                        .push(format!("destroy MIG device {}: {e}", record.device));
                }
            }
            None => cx.errors.push(format!(
                "destroy MIG device {}: parent GPU {parent_uuid} is not known to this plugin",
                record.device
            )),
        }
    }

    fn sweep(&self, cx: &mut Recovery<'_>) {
        if !cx.inner.opts.build.dynamic_mig {
            return;
        }
        let keep: HashSet<String> = cx
            .remaining
            .claims
            .values()
            .flat_map(|e| e.devices.iter())
            .filter_map(|d| match &d.kind {
                DeviceKind::Mig {
                    mig_uuid: Some(u), ..
                } => Some(u.clone()),
                _ => None,
            })
            .chain(cx.lost.values().flat_map(|l| l.mig_uuids.iter().cloned()))
            .collect();
        let swept = mig::sweep(&*cx.inner.backend, &keep);
        cx.found.mig.extend(swept.kept);
        for instance in swept.destroyed {
            if instance.uuids.is_empty() {
                cx.report.mig_destroyed.push(format!(
                    "{} GPU instance {} (no compute instance)",
                    instance.gpu_uuid, instance.gpu_instance_id
                ));
            }
            cx.report.mig_destroyed.extend(instance.uuids);
        }
        cx.report
            .errors
            .extend(swept.failures.iter().map(|f| format!("MIG sweep: {f}")));
    }

    fn release_lost(&self, cx: &mut Release<'_>) {
        if !cx.inner.opts.build.dynamic_mig {
            return;
        }
        let named: HashSet<&str> = cx
            .records()
            .filter_map(|r| match &r.kind {
                DeviceKind::Mig {
                    mig_uuid: Some(u), ..
                } => Some(u.as_str()),
                DeviceKind::Mig { .. } | DeviceKind::Gpu { .. } | DeviceKind::Vfio { .. } => None,
            })
            .chain(
                cx.other_lost
                    .iter()
                    .flat_map(|l| l.mig_uuids.iter().map(String::as_str)),
            )
            .collect();
        let mut errors = Vec::new();
        for uuid in cx
            .claim
            .mig_uuids
            .iter()
            .filter(|u| !named.contains(u.as_str()))
        {
            if let Err(e) = mig::destroy_by_uuid(&*cx.inner.backend, uuid) {
                errors.push(format!("destroy MIG device {uuid}: {e}"));
            }
        }
        cx.errors.extend(errors);
    }
}

/// Creates (dynamic) or finds (static) the MIG device; returns GI, CI, UUID.
fn mig_device(
    inner: &Inner,
    d: &PlannedDevice,
    m: &MigTarget,
    record: &mut PreparedDeviceRecord,
) -> Result<(u32, u32, String), PrepareError> {
    let mig_error = |error| PrepareError::Mig {
        device: d.device.clone(),
        error,
    };
    let (gi, ci, uuid, created) = if m.dynamic && !d.admin {
        let made = match inner.gpus.get(&m.request.gpu_index) {
            Some(info) => mig::create_on(&*inner.backend, info, &m.request),
            None => mig::create(&*inner.backend, &m.request),
        }
        .map_err(mig_error)?;
        (
            made.gpu_instance_id,
            made.compute_instance_id,
            made.uuid,
            true,
        )
    } else {
        let info = inner
            .backend
            .gpu(m.request.gpu_index)
            .map_err(|error| PrepareError::Nvml {
                device: d.device.clone(),
                error,
            })?;
        let found = info
            .mig
            .iter()
            .flat_map(|mig| mig.devices.iter())
            .find(|x| {
                x.profile_id == m.request.profile_id
                    && x.placement.start == m.request.placement_start
            })
            .ok_or_else(|| PrepareError::Unsupported {
                device: d.device.clone(),
                reason: if d.admin {
                    "admin access to a MIG placement that no claim has created: nothing to monitor"
                        .to_owned()
                } else {
                    "the MIG device no longer exists on the GPU (changed behind the driver's back?)"
                        .to_owned()
                },
            })?;
        (
            found.gpu_instance_id,
            found.compute_instance_id,
            found.uuid.clone(),
            false,
        )
    };
    if let DeviceKind::Mig {
        gpu_instance_id,
        compute_instance_id,
        mig_uuid,
        created: was_created,
        ..
    } = &mut record.kind
    {
        *gpu_instance_id = Some(gi);
        *compute_instance_id = Some(ci);
        *mig_uuid = Some(uuid.clone());
        *was_created = created;
    }
    if created {
        failpoint("prepare-after-mig");
    }
    Ok((gi, ci, uuid))
}
