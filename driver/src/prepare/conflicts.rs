//! The last line of defence against double allocation: a device is
//! refused when it overlaps a device another claim on the node holds
//! (admin access and shares of a memory-shared GPU excepted), with an error
//! that says how the other claim holds it and what to do.

use super::checkpoint::{ClaimEntry, ClaimState, ClaimUid, DeviceKind, PreparedDeviceRecord};
use super::error::{Held, PrepareError};
use super::plan::{ClaimPlan, PlannedDevice, Target};

/// What part of a physical GPU a device occupies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Footprint {
    /// The whole GPU, exclusively.
    Whole(u32),
    /// A share of the GPU's memory (memory-fraction sharing).
    Share(u32),
    /// Memory slices `[start, start + size)` of the GPU.
    Slices(u32, u32, u32),
    /// A share of the MIG device at these slices (consumable shares).
    SliceShare(u32, u32, u32),
}

impl Footprint {
    fn overlaps(self, other: Footprint) -> bool {
        use Footprint::{Share, SliceShare, Slices, Whole};
        match (self, other) {
            (Share(_), Share(_)) => false,
            // Shares of one MIG device go together; of overlapping
            // placements (a stale entry), not.
            (SliceShare(_, s1, n1), SliceShare(_, s2, n2)) if (s1, n1) == (s2, n2) => false,
            (SliceShare(a, s1, n1), other) => Slices(a, s1, n1).overlaps(other),
            (this, SliceShare(b, s2, n2)) => this.overlaps(Slices(b, s2, n2)),
            (Whole(a) | Share(a), Whole(b) | Share(b) | Slices(b, _, _))
            | (Slices(a, _, _), Whole(b) | Share(b)) => a == b,
            // In u64: the placements of a checkpoint entry are whatever
            // its file holds.
            (Slices(a, s1, n1), Slices(b, s2, n2)) => {
                let end = |s: u32, n: u32| u64::from(s) + u64::from(n);
                a == b && u64::from(s1) < end(s2, n2) && u64::from(s2) < end(s1, n1)
            }
        }
    }
}

fn planned_footprint(d: &PlannedDevice) -> Footprint {
    match &d.target {
        Target::Gpu(g) if d.share_id.is_some() || g.memory_shared => Footprint::Share(g.minor),
        Target::Gpu(g) => Footprint::Whole(g.minor),
        Target::Vfio(v) => Footprint::Whole(v.minor),
        Target::Mig(m) if d.share_id.is_some() => Footprint::SliceShare(
            m.request.parent_minor,
            m.request.placement_start,
            m.request.placement_size,
        ),
        Target::Mig(m) => Footprint::Slices(
            m.request.parent_minor,
            m.request.placement_start,
            m.request.placement_size,
        ),
    }
}

fn record_footprint(d: &PreparedDeviceRecord) -> Footprint {
    match &d.kind {
        DeviceKind::Gpu { minor, .. } if d.share_id.is_some() => Footprint::Share(*minor),
        DeviceKind::Gpu { minor, .. } | DeviceKind::Vfio { minor, .. } => Footprint::Whole(*minor),
        DeviceKind::Mig {
            parent_minor,
            placement_start,
            placement_size,
            ..
        } if d.share_id.is_some() => {
            Footprint::SliceShare(*parent_minor, *placement_start, *placement_size)
        }
        DeviceKind::Mig {
            parent_minor,
            placement_start,
            placement_size,
            ..
        } => Footprint::Slices(*parent_minor, *placement_start, *placement_size),
    }
}

/// Refuses a device that overlaps a non-admin device of another claim.
pub(super) fn check_conflicts(
    plan: &ClaimPlan,
    others: &[(&ClaimUid, &ClaimEntry)],
) -> Result<(), PrepareError> {
    for d in plan.devices.iter().filter(|d| !d.admin) {
        let mine = planned_footprint(d);
        for (uid, entry) in others {
            for theirs in entry.devices.iter().filter(|r| !r.admin) {
                if mine.overlaps(record_footprint(theirs)) {
                    let held = if entry.state == ClaimState::PrepareCompleted {
                        Held::Prepared
                    } else {
                        Held::FailedPrepare
                    };
                    return Err(PrepareError::Conflict {
                        device: d.device.clone(),
                        other_device: theirs.device.clone(),
                        held,
                        other: format!("{}/{}", entry.namespace, entry.name),
                        other_uid: uid.0.clone(),
                    });
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Footprint::{Share, SliceShare, Slices, Whole};
    use crate::prepare::error::{Held, PrepareError};

    #[test]
    fn footprints_overlap_exactly_when_they_share_hardware() {
        // Whole GPUs and shares conflict on the same GPU only.
        assert!(Whole(0).overlaps(Whole(0)));
        assert!(!Whole(0).overlaps(Whole(1)));
        assert!(Whole(0).overlaps(Share(0)) && Share(0).overlaps(Whole(0)));
        // Shares of one GPU coexist.
        assert!(!Share(0).overlaps(Share(0)));
        // MIG placements: memory slice ranges.
        assert!(Slices(0, 0, 2).overlaps(Slices(0, 1, 1)));
        assert!(!Slices(0, 0, 2).overlaps(Slices(0, 2, 2)));
        assert!(!Slices(0, 0, 2).overlaps(Slices(1, 0, 2)));
        assert!(Slices(0, 4, 4).overlaps(Slices(0, 0, 8)));
        // A placement and the whole GPU or a share of it.
        assert!(Slices(0, 6, 1).overlaps(Whole(0)) && Whole(0).overlaps(Slices(0, 6, 1)));
        assert!(Slices(0, 6, 1).overlaps(Share(0)) && Share(0).overlaps(Slices(0, 6, 1)));
        assert!(!Slices(0, 6, 1).overlaps(Whole(1)));
        // Shares of one MIG device (consumable shares) coexist; they
        // conflict with the device held whole, an overlapping placement or
        // the GPU.
        assert!(!SliceShare(0, 4, 4).overlaps(SliceShare(0, 4, 4)));
        assert!(SliceShare(0, 4, 4).overlaps(Slices(0, 4, 4)));
        assert!(Slices(0, 4, 4).overlaps(SliceShare(0, 4, 4)));
        assert!(SliceShare(0, 4, 4).overlaps(SliceShare(0, 0, 8)));
        assert!(SliceShare(0, 4, 4).overlaps(Whole(0)) && Share(0).overlaps(SliceShare(0, 4, 4)));
        assert!(!SliceShare(0, 4, 4).overlaps(SliceShare(0, 0, 4)));
        assert!(!SliceShare(0, 4, 4).overlaps(SliceShare(1, 0, 8)));
        assert!(!SliceShare(0, 4, 4).overlaps(Whole(1)));
    }

    #[test]
    fn a_conflict_says_how_the_other_claim_holds_the_device() {
        let conflict = |held| {
            PrepareError::Conflict {
                device: "gpu-0".into(),
                other_device: "gpu-0".into(),
                held,
                other: "ns/other".into(),
                other_uid: "u-1".into(),
            }
            .to_string()
        };
        let prepared = conflict(Held::Prepared);
        assert!(
            prepared.contains("already prepared for claim ns/other (u-1)")
                && prepared.ends_with("unprepare the other claim first"),
            "{prepared}"
        );
        let failed = conflict(Held::FailedPrepare);
        assert!(
            failed.contains("still held by a failed prepare of claim ns/other (u-1)")
                && failed.contains("retried at that claim's next prepare"),
            "{failed}"
        );
    }

    #[test]
    fn placements_from_a_hostile_checkpoint_neither_overflow_nor_wrap() {
        let max = u32::MAX;
        // Would overflow in u32 (a panic with overflow checks, a wrap to a
        // missed overlap without).
        assert!(Slices(0, max, 2).overlaps(Slices(0, max, 1)));
        assert!(Slices(0, 0, 8).overlaps(Slices(0, 7, max)));
        assert!(Slices(0, 7, max).overlaps(Slices(0, 0, 8)));
        assert!(!Slices(0, 0, 7).overlaps(Slices(0, 7, max)));
        assert!(!Slices(0, max, max).overlaps(Slices(0, 0, max)));
    }
}
