//! A share of a memory-shared GPU (`--memory-sharing`,
//! `--consumable-shares=memory`): one MPS daemon per GPU, shared by every
//! claim on it (started with the first, stopped after the last), compute
//! mode `ExclusiveProcess` while it runs, and per-client limits derived from
//! the `memory` the allocation consumed, lowered further by the claim's own
//! MPS config if it has one. The daemon is stopped after the last claim by
//! the MPS kind's undo, which owns every daemon of the MPS directory
//! (`super::mps`).
//!
//! A claim with an MPS config on a GPU shared by counted consumable shares
//! (`unlimited`, `<N>`) joins the same per-GPU daemon, with the config's
//! limits as its per-client limits: MPS needs one daemon per GPU, so claims
//! sharing a GPU cannot each start their own.

use std::collections::BTreeMap;

use gpu_dra_api::config::{DeviceConfig, MpsConfig, TimeSliceInterval};
use gpu_nvml::ComputeMode;

use super::{Kind, Setup};
use crate::prepare::cdi::ContainerEdits;
use crate::prepare::checkpoint::{ComputeModeChange, DeviceKind};
use crate::prepare::compute_mode;
use crate::prepare::error::PrepareError;
use crate::prepare::journal::failpoint;
use crate::prepare::mps::config::parse_limit_mib;
use crate::prepare::mps::{DaemonConfig, client_limit_edits};
use crate::prepare::plan::{ClaimPlan, GpuTarget, PlannedDevice, Target};

const MIB: u64 = 1024 * 1024;

/// The memory-share kind.
pub(crate) struct MemoryShare;

impl Kind for MemoryShare {
    fn setup(&self, claim: &mut Setup<'_>, i: usize) -> Result<(), PrepareError> {
        let d = claim.device(i);
        match &d.target {
            Target::Gpu(g) if g.counted_share && !d.admin => check_counted_mix(claim, i, g.minor)?,
            Target::Mig(_) if d.share_id.is_some() && !d.admin => check_mig_share(claim, i)?,
            _ => {}
        }
        if !claim.is_memory_share(i) {
            return Ok(());
        }
        let (Target::Gpu(g), Some((_, total))) = (&claim.device(i).target, claim.memory_share)
        else {
            return Ok(());
        };
        let edits = shared_gpu(claim, i, g, total)?;
        claim.spec.add_edits(&claim.names[i], edits)?;
        Ok(())
    }
}

/// The memory-shared GPU of the claim's shares (its index) and what they
/// consumed together (admin requests change nothing and are left out).
/// Every share of one GPU in the claim is served by that GPU's one MPS
/// daemon, and all its containers see the sum as their limit: the runtime
/// merges the devices' environments, so each device carries the same
/// values. Shares of two GPUs are refused: the containers would need two
/// daemons at one `CUDA_MPS_PIPE_DIRECTORY`.
pub(crate) fn of_claim(plan: &ClaimPlan) -> Result<Option<(u32, u64)>, PrepareError> {
    let mut share: Option<(&PlannedDevice, u32, u64)> = None;
    for d in plan.devices.iter().filter(|d| !d.admin) {
        let Target::Gpu(g) = &d.target else { continue };
        let joins = g.memory_shared
            || if g.counted_share {
                mps_config(d).is_some()
            } else {
                d.consumed_memory.is_some()
            };
        if !joins {
            continue;
        }
        let consumed = d.consumed_memory.unwrap_or(0);
        share = match share {
            None => Some((d, g.index, consumed)),
            Some((first, index, total)) if first.device == d.device => {
                Some((first, index, total.saturating_add(consumed)))
            }
            Some((first, ..)) => {
                return Err(PrepareError::Unsupported {
                    device: d.device.clone(),
                    reason: format!(
                        "the claim holds memory shares of two GPUs ({} and {}); a container reaches one MPS daemon, which serves one memory-shared GPU: put the shares in separate claims",
                        first.device, d.device
                    ),
                });
            }
        };
    }
    Ok(share.map(|(_, index, total)| (index, total)))
}

/// The MPS settings of device `d`'s config, if it asks for MPS.
fn mps_config(d: &PlannedDevice) -> Option<&MpsConfig> {
    match &d.config {
        Some(DeviceConfig::Gpu(cfg)) if cfg.time_slice().is_none() => cfg.mps(),
        _ => None,
    }
}

/// On a GPU shared by counted consumable shares, claims with an MPS config
/// (on the GPU's daemon, compute mode `ExclusiveProcess`) and claims
/// without one (CUDA processes outside MPS, which that mode locks out)
/// cannot run together: the later one is refused, naming the other claim.
fn check_counted_mix(claim: &Setup<'_>, i: usize, minor: u32) -> Result<(), PrepareError> {
    let joins = claim.is_memory_share(i);
    let daemon = shared_daemon_id(minor);
    for (uid, entry) in claim.others {
        let on_gpu = entry.devices.iter().filter(|r| {
            !r.admin && matches!(r.kind, DeviceKind::Gpu { minor: m, .. } if m == minor)
        });
        for r in on_gpu {
            let theirs = r
                .sharing
                .mps_daemon
                .as_ref()
                .is_some_and(|m| m.id == daemon);
            if joins == theirs {
                continue;
            }
            let other = format!("{}/{} ({})", entry.namespace, entry.name, uid.0);
            let reason = if joins {
                format!(
                    "claim {other} shares this GPU without MPS; an MPS config needs the GPU in compute mode EXCLUSIVE_PROCESS, which would lock that claim's CUDA processes out: give every claim on the GPU an MPS config, or none"
                )
            } else {
                format!(
                    "claim {other} runs this GPU's MPS daemon (compute mode EXCLUSIVE_PROCESS), which locks out CUDA processes outside MPS: give this claim an MPS config too"
                )
            };
            return Err(PrepareError::Unsupported {
                device: claim.device(i).device.clone(),
                reason,
            });
        }
    }
    Ok(())
}

/// A share of a MIG device (consumable shares) runs an MPS daemon of its
/// claim's own only while it has the device alone: a claim with an MPS
/// config is refused beside other shares of the device, and a share beside
/// one whose claim runs a daemon on it, naming the other claim.
fn check_mig_share(claim: &Setup<'_>, i: usize) -> Result<(), PrepareError> {
    let d = claim.device(i);
    let Target::Mig(m) = &d.target else {
        return Ok(());
    };
    let mine =
        matches!(claim.sharing_config(i), Some(DeviceConfig::Mig(cfg)) if cfg.mps().is_some());
    let place = (
        m.request.parent_minor,
        m.request.placement_start,
        m.request.placement_size,
    );
    for (uid, entry) in claim.others {
        for r in entry.devices.iter().filter(|r| !r.admin) {
            let DeviceKind::Mig {
                parent_minor,
                placement_start,
                placement_size,
                ..
            } = &r.kind
            else {
                continue;
            };
            if (*parent_minor, *placement_start, *placement_size) != place {
                continue;
            }
            let theirs = r.sharing.mps_daemon.is_some();
            if !(mine || theirs) {
                continue;
            }
            let other = format!("{}/{} ({})", entry.namespace, entry.name, uid.0);
            let reason = if theirs {
                format!(
                    "claim {other} runs an MPS daemon on this MIG device, which serves only that claim: no other share of the device can be prepared beside it"
                )
            } else {
                format!(
                    "claim {other} holds a share of this MIG device: an MPS config on a MIG device's share needs the device alone (one daemon serves one claim); leave the MPS config out"
                )
            };
            return Err(PrepareError::Unsupported {
                device: d.device.clone(),
                reason,
            });
        }
    }
    Ok(())
}

/// Id of the MPS daemon shared by the claims of a memory-shared GPU.
fn shared_daemon_id(minor: u32) -> String {
    format!("shared-gpu{minor}")
}

/// A share of a memory-shared GPU: the GPU's daemon (started by the first
/// claim) and the claim's per-client limits, from `total`, what all the
/// claim's shares of the GPU consumed (see [`of_claim`]).
fn shared_gpu(
    claim: &mut Setup<'_>,
    i: usize,
    g: &GpuTarget,
    total: u64,
) -> Result<ContainerEdits, PrepareError> {
    let (inner, uid, others) = (claim.inner, &claim.plan.uid, claim.others);
    let (d, entry) = (claim.device(i), &mut *claim.entry);
    let unsupported = |reason: String| PrepareError::Unsupported {
        device: d.device.clone(),
        reason,
    };
    // Resolved configs are normalized: a `GpuConfig` without sharing
    // reads as time-slicing at the default interval, which changes
    // nothing and is no reason to refuse. An MPS config sets the claim's
    // own limits within its share.
    if let Some(DeviceConfig::Gpu(cfg)) = &d.config
        && cfg.sharing.is_some()
        && cfg
            .time_slice()
            .is_some_and(|t| t != TimeSliceInterval::Default)
    {
        return Err(unsupported(
            "a memory-shared GPU always runs MPS with limits derived from the consumed memory, and its time slice is the GPU's, not a claim's; remove the time-slicing config or use an MPS config".to_owned(),
        ));
    }
    let own = mps_config(d);
    if own.is_some_and(|m| m.multi_user == Some(true)) {
        return Err(unsupported(
            "mpsConfig.multiUser applies to a claim's own MPS daemon; a shared GPU's daemon serves every claim on it: leave multiUser out".to_owned(),
        ));
    }
    // The client limits: from the consumed memory when enforced, lowered
    // by the claim's MPS config; from the config alone when only counted.
    let (mut pinned_mib, mut percent) = if g.memory_shared {
        let consumed = d.consumed_memory.ok_or_else(|| {
            unsupported("the GPU is shared by memory fraction but the allocation consumed no memory (allocated by a scheduler without DRAConsumableCapacity?)".to_owned())
        })?;
        if g.memory_bytes == 0 || consumed == 0 || total > g.memory_bytes {
            return Err(unsupported(format!(
                "consumed memory {total} bytes does not fit the GPU's {} bytes",
                g.memory_bytes
            )));
        }
        // Rounded down (at least 1): the claims' shares of the GPU's
        // threads add up to no more than their shares of its memory.
        let percent = (u128::from(total) * 100 / u128::from(g.memory_bytes)).clamp(1, 100);
        ((total / MIB).max(1), u8::try_from(percent).unwrap_or(100))
    } else {
        ((g.memory_bytes / MIB).max(1), 100)
    };
    if let Some(own) = own {
        if let Some(p) = own.default_active_thread_percentage {
            percent = percent.min(u8::try_from(p.clamp(1, 100)).unwrap_or(100));
        }
        let limits = own
            .pinned_memory_limits(&[g.uuid.as_str()])
            .map_err(|e| unsupported(format!("MPS config: {e}")))?;
        if let Some(limit) = limits.get(&g.uuid) {
            let mib = parse_limit_mib(limit).map_err(|e| {
                unsupported(format!("MPS config: pinned memory limit {limit}: {e}"))
            })?;
            pinned_mib = pinned_mib.min(mib);
        }
    }
    let id = shared_daemon_id(g.minor);
    // The compute mode to restore after the last claim: recorded by the
    // first claim, copied by every later one. If the first claim's entry
    // was lost, the ledger kept it (else a claim joining now, last out,
    // would leave the GPU in the mode).
    let inherited = others
        .iter()
        .flat_map(|(_, e)| e.devices.iter())
        .filter(|r| r.sharing.mps_daemon.as_ref().is_some_and(|m| m.id == id))
        .find_map(|r| r.sharing.compute_mode.clone())
        .or_else(|| {
            inner.store.find_lost(|l| {
                let previous = l.compute_modes.get(&g.uuid)?;
                l.mps_daemons.contains(&id).then(|| ComputeModeChange {
                    set: compute_mode::mode_name(ComputeMode::ExclusiveProcess).to_owned(),
                    previous: previous.clone(),
                })
            })
        });
    if inherited.is_none() {
        compute_mode::set(inner, uid, entry, i, g.index, ComputeMode::ExclusiveProcess)?;
    }
    let daemon = inner.mps.start(&DaemonConfig {
        id: id.clone(),
        gpu_uuids: vec![g.uuid.clone()],
        active_thread_percentage: None,
        pinned_memory_limits: BTreeMap::new(),
        multi_user: false,
    })?;
    // A joining claim copies the change only now, together with the
    // daemon: the undo restores the mode only for a record that names the
    // daemon and only when no other claim uses it. A copy recorded before
    // a failed start would have the rollback restore the mode under the
    // claims that still share the GPU.
    if let Some(change) = inherited {
        entry.devices[i].sharing.compute_mode = Some(change);
    }
    entry.devices[i].sharing.mps_daemon = Some(daemon);
    failpoint("prepare-after-mps");
    let mut edits = inner.mps.container_edits(&id);
    let limits = client_limit_edits(&g.uuid, pinned_mib, percent);
    edits.env.extend(limits.env);
    edits.mounts.extend(limits.mounts);
    Ok(edits)
}
