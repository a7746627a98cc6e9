//! MIG partitioning rules of one GPU: creating and destroying GPU instances
//! (GIs) and compute instances (CIs) on placements, with the hardware's
//! constraints (a profile's placements, instance counts, no overlapping memory
//! slices or compute slices, a GI with CIs cannot be destroyed). Pure logic,
//! no FFI: the C functions and the profile loader both go through here.

use std::fmt;

use crate::codes::{self, Code};
use crate::hardware::{CiProfile, GiProfile, MigTable};

/// A GPU instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInstance {
    /// GPU instance id, unique on the GPU.
    pub id: u32,
    /// GI profile id (e.g. 19 for 1g.10gb).
    pub profile_id: u32,
    /// First memory slice.
    pub start: u32,
    /// Memory slices occupied.
    pub size: u32,
    /// Its compute instances, ordered by id.
    pub compute_instances: Vec<ComputeInstance>,
    /// Process-unique number, used in handles.
    pub serial: u64,
}

/// A compute instance; with its GPU instance it is a "MIG device".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComputeInstance {
    /// Compute instance id, unique within its GPU instance.
    pub id: u32,
    /// CI profile id (an `NVML_COMPUTE_INSTANCE_PROFILE_*` value).
    pub profile_id: u32,
    /// First compute slice within the GPU instance.
    pub start: u32,
    /// Placement size (compute slices of the placement grid).
    pub size: u32,
    /// Compute slices used (the profile's slice count).
    pub slices: u32,
    /// The MIG device UUID (`MIG-...`).
    pub uuid: String,
    /// Process-unique number, used in handles.
    pub serial: u64,
}

/// Why a MIG operation failed; maps to the NVML code the hardware returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MigError {
    /// No such profile on this GPU.
    UnknownProfile(String),
    /// The placement is not one of the profile's placements.
    BadPlacement {
        /// Profile name.
        profile: String,
        /// Requested start.
        start: u32,
        /// Allowed starts.
        allowed: Vec<u32>,
    },
    /// The placement overlaps an existing instance.
    Overlap {
        /// Profile name.
        profile: String,
        /// Requested start.
        start: u32,
        /// What is in the way.
        with: String,
    },
    /// Every instance of the profile allowed on the GPU already exists.
    TooMany {
        /// Profile name.
        profile: String,
        /// The profile's instance count.
        max: u32,
    },
    /// No free placement is left for the profile.
    NoRoom(String),
    /// The GPU instance still has compute instances.
    InUse(u32),
    /// No such GPU or compute instance.
    NotFound(String),
    /// An instance id given explicitly (state file) is already taken.
    DuplicateId(String),
}

impl MigError {
    /// The NVML return code of this failure.
    pub fn code(&self) -> Code {
        match self {
            MigError::UnknownProfile(_) | MigError::BadPlacement { .. } => codes::INVALID_ARGUMENT,
            MigError::Overlap { .. }
            | MigError::TooMany { .. }
            | MigError::NoRoom(_)
            | MigError::DuplicateId(_) => codes::INSUFFICIENT_RESOURCES,
            MigError::InUse(_) => codes::IN_USE,
            MigError::NotFound(_) => codes::NOT_FOUND,
        }
    }
}

impl fmt::Display for MigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MigError::UnknownProfile(p) => write!(f, "unknown MIG profile {p}"),
            MigError::BadPlacement {
                profile,
                start,
                allowed,
            } => write!(
                f,
                "placement {start} is not a placement of {profile} (allowed: {allowed:?})"
            ),
            MigError::Overlap {
                profile,
                start,
                with,
            } => write!(f, "{profile} at placement {start} overlaps {with}"),
            MigError::TooMany { profile, max } => {
                write!(f, "at most {max} instance(s) of {profile} fit on the GPU")
            }
            MigError::NoRoom(p) => write!(f, "no free placement left for {p}"),
            MigError::InUse(id) => {
                write!(f, "GPU instance {id} still has compute instances")
            }
            MigError::NotFound(what) => write!(f, "{what} not found"),
            MigError::DuplicateId(what) => write!(f, "{what} is used twice"),
        }
    }
}

/// The lowest id not in `taken`.
pub fn lowest_free_id(taken: &[u32]) -> u32 {
    (0..=u32::MAX)
        .find(|id| !taken.contains(id))
        .unwrap_or(u32::MAX)
}

fn overlaps(a_start: u32, a_size: u32, b_start: u32, b_size: u32) -> bool {
    a_start < b_start + b_size && b_start < a_start + a_size
}

/// The order in which a placement is picked when none is given. It mirrors
/// what `nvidia-smi mig -cgi` does on A100/H100: the upper half of the memory
/// first, starting with its last placement (seven 1g instances land on 6, 4,
/// 5, 0, 1, 2, 3; a 3g instance on 4, then 0).
fn preference_order(placements: &[u32], memory_slices: u32) -> Vec<u32> {
    let half = memory_slices / 2;
    let mut upper: Vec<u32> = placements.iter().copied().filter(|s| *s >= half).collect();
    let lower = placements.iter().copied().filter(|s| *s < half);
    let mut order = Vec::with_capacity(placements.len());
    if let Some(last) = upper.pop() {
        order.push(last);
    }
    order.extend(upper);
    order.extend(lower);
    order
}

/// The GI id for a placement: the position of its memory slices in a
/// heap-ordered buddy tree (whole GPU 0, halves 1-2, quarters 3-6, eighths
/// 7-14), as the hardware's swizzle ids; falls back to the lowest free id.
fn gi_id(table: &MigTable, start: u32, size: u32, taken: &[u32]) -> u32 {
    let n = table.memory_slices;
    if n.is_power_of_two() && size.is_power_of_two() && size <= n && start.is_multiple_of(size) {
        let id = n / size - 1 + start / size;
        if !taken.contains(&id) {
            return id;
        }
    }
    lowest_free_id(taken)
}

/// The MIG state of one GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigState {
    /// GPU instances, ordered by id.
    pub gpu_instances: Vec<GpuInstance>,
}

impl MigState {
    /// The GPU instance with this id.
    pub fn gpu_instance(&self, id: u32) -> Option<&GpuInstance> {
        self.gpu_instances.iter().find(|g| g.id == id)
    }

    fn gpu_instance_mut(&mut self, id: u32) -> Result<&mut GpuInstance, MigError> {
        self.gpu_instances
            .iter_mut()
            .find(|g| g.id == id)
            .ok_or_else(|| MigError::NotFound(format!("GPU instance {id}")))
    }

    fn occupant(&self, table: &MigTable, start: u32, size: u32) -> Option<String> {
        self.gpu_instances
            .iter()
            .find(|g| overlaps(start, size, g.start, g.size))
            .map(|g| {
                let name = table
                    .profiles
                    .iter()
                    .find(|p| p.id == g.profile_id)
                    .map_or("?", |p| p.name.as_str());
                format!("GPU instance {} ({name} at {}:{})", g.id, g.start, g.size)
            })
    }

    fn count_of(&self, profile_id: u32) -> u32 {
        self.gpu_instances
            .iter()
            .filter(|g| g.profile_id == profile_id)
            .count() as u32
    }

    /// How many more instances of `profile` could be created.
    pub fn remaining_gi_capacity(&self, table: &MigTable, profile: &GiProfile) -> u32 {
        let left = profile
            .instance_count
            .saturating_sub(self.count_of(profile.id));
        let free = profile
            .placements
            .iter()
            .filter(|s| self.occupant(table, **s, profile.placement_size).is_none())
            .count() as u32;
        left.min(free)
    }

    /// Creates a GPU instance of `profile`, at `start` or at the first free
    /// placement. `id`: the id to use (when reloading state), else allocated.
    pub fn create_gpu_instance(
        &mut self,
        table: &MigTable,
        profile: &GiProfile,
        start: Option<u32>,
        id: Option<u32>,
        serial: u64,
    ) -> Result<&GpuInstance, MigError> {
        if let Some(s) = start
            && !profile.placements.contains(&s)
        {
            return Err(MigError::BadPlacement {
                profile: profile.name.clone(),
                start: s,
                allowed: profile.placements.clone(),
            });
        }
        let size = profile.placement_size;
        let start = match start {
            Some(s) => {
                if let Some(with) = self.occupant(table, s, size) {
                    return Err(MigError::Overlap {
                        profile: profile.name.clone(),
                        start: s,
                        with,
                    });
                }
                s
            }
            None => preference_order(&profile.placements, table.memory_slices)
                .into_iter()
                .find(|s| self.occupant(table, *s, size).is_none())
                .ok_or_else(|| MigError::NoRoom(profile.name.clone()))?,
        };
        if self.count_of(profile.id) >= profile.instance_count {
            return Err(MigError::TooMany {
                profile: profile.name.clone(),
                max: profile.instance_count,
            });
        }
        let taken: Vec<u32> = self.gpu_instances.iter().map(|g| g.id).collect();
        let id = match id {
            Some(id) if taken.contains(&id) => {
                return Err(MigError::DuplicateId(format!("GPU instance id {id}")));
            }
            Some(id) => id,
            None => gi_id(table, start, size, &taken),
        };
        let pos = self.gpu_instances.partition_point(|g| g.id < id);
        self.gpu_instances.insert(
            pos,
            GpuInstance {
                id,
                profile_id: profile.id,
                start,
                size,
                compute_instances: Vec::new(),
                serial,
            },
        );
        Ok(&self.gpu_instances[pos])
    }

    /// Destroys a GPU instance; fails while it has compute instances.
    pub fn destroy_gpu_instance(&mut self, id: u32) -> Result<(), MigError> {
        let gi = self.gpu_instance_mut(id)?;
        if !gi.compute_instances.is_empty() {
            return Err(MigError::InUse(id));
        }
        self.gpu_instances.retain(|g| g.id != id);
        Ok(())
    }

    /// How many more compute instances of `profile` fit in GPU instance `gi`
    /// (which has `gi_slices` compute slices).
    pub fn remaining_ci_capacity(
        &self,
        gi: u32,
        gi_slices: u32,
        profile: &CiProfile,
    ) -> Result<u32, MigError> {
        let gi = self
            .gpu_instance(gi)
            .ok_or_else(|| MigError::NotFound(format!("GPU instance {gi}")))?;
        let cis = &gi.compute_instances;
        let free = profile
            .placements
            .iter()
            .filter(|s| {
                !cis.iter()
                    .any(|c| overlaps(**s, profile.placement_size, c.start, c.size))
            })
            .count() as u32;
        let used: u32 = cis.iter().map(|c| c.slices).sum();
        let by_slices = gi_slices.saturating_sub(used) / profile.slices.max(1);
        let same = cis.iter().filter(|c| c.profile_id == profile.id).count() as u32;
        Ok(free
            .min(by_slices)
            .min(profile.instance_count.saturating_sub(same)))
    }

    /// Creates a compute instance in GPU instance `gi`, which has
    /// `gi_slices` compute slices.
    #[allow(clippy::too_many_arguments)]
    pub fn create_compute_instance(
        &mut self,
        gi: u32,
        gi_slices: u32,
        profile: &CiProfile,
        start: Option<u32>,
        id: Option<u32>,
        uuid: String,
        serial: u64,
    ) -> Result<&ComputeInstance, MigError> {
        let gpu_instance = self.gpu_instance_mut(gi)?;
        if let Some(s) = start
            && !profile.placements.contains(&s)
        {
            return Err(MigError::BadPlacement {
                profile: profile.name.clone(),
                start: s,
                allowed: profile.placements.clone(),
            });
        }
        let size = profile.placement_size;
        let occupant = |cis: &[ComputeInstance], s: u32| {
            cis.iter()
                .find(|c| overlaps(s, size, c.start, c.size))
                .map(|c| format!("compute instance {} at {}:{}", c.id, c.start, c.size))
        };
        let cis = &gpu_instance.compute_instances;
        let start = match start {
            Some(s) => {
                if let Some(with) = occupant(cis, s) {
                    return Err(MigError::Overlap {
                        profile: profile.name.clone(),
                        start: s,
                        with,
                    });
                }
                s
            }
            None => profile
                .placements
                .iter()
                .copied()
                .find(|s| occupant(cis, *s).is_none())
                .ok_or_else(|| MigError::NoRoom(profile.name.clone()))?,
        };
        let used: u32 = cis.iter().map(|c| c.slices).sum();
        if used + profile.slices > gi_slices {
            return Err(MigError::NoRoom(profile.name.clone()));
        }
        if cis.iter().filter(|c| c.profile_id == profile.id).count() as u32
            >= profile.instance_count
        {
            return Err(MigError::TooMany {
                profile: profile.name.clone(),
                max: profile.instance_count,
            });
        }
        let taken: Vec<u32> = cis.iter().map(|c| c.id).collect();
        let id = match id {
            Some(id) if taken.contains(&id) => {
                return Err(MigError::DuplicateId(format!(
                    "compute instance id {id} in GPU instance {gi}"
                )));
            }
            Some(id) => id,
            None => lowest_free_id(&taken),
        };
        let cis = &mut gpu_instance.compute_instances;
        let pos = cis.partition_point(|c| c.id < id);
        cis.insert(
            pos,
            ComputeInstance {
                id,
                profile_id: profile.id,
                start,
                size,
                slices: profile.slices,
                uuid,
                serial,
            },
        );
        Ok(&cis[pos])
    }

    /// Destroys compute instance `ci` of GPU instance `gi`.
    pub fn destroy_compute_instance(&mut self, gi: u32, ci: u32) -> Result<(), MigError> {
        let gpu_instance = self.gpu_instance_mut(gi)?;
        let before = gpu_instance.compute_instances.len();
        gpu_instance.compute_instances.retain(|c| c.id != ci);
        if gpu_instance.compute_instances.len() == before {
            return Err(MigError::NotFound(format!(
                "compute instance {ci} of GPU instance {gi}"
            )));
        }
        Ok(())
    }

    /// All MIG devices (GI, CI pairs) in the order NVML enumerates them.
    pub fn mig_devices(&self) -> impl Iterator<Item = (&GpuInstance, &ComputeInstance)> {
        self.gpu_instances
            .iter()
            .flat_map(|g| g.compute_instances.iter().map(move |c| (g, c)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::model;

    fn table(key: &str) -> MigTable {
        model(key).unwrap().mig.unwrap()
    }

    fn profile(t: &MigTable, name: &str) -> GiProfile {
        t.profiles.iter().find(|p| p.name == name).unwrap().clone()
    }

    fn create(
        s: &mut MigState,
        t: &MigTable,
        name: &str,
        start: Option<u32>,
    ) -> Result<(u32, u32), MigError> {
        let p = profile(t, name);
        s.create_gpu_instance(t, &p, start, None, 0)
            .map(|g| (g.id, g.start))
    }

    #[test]
    fn seven_1g_instances_fill_the_gpu_in_hardware_order() {
        let t = table("A100-SXM4-80GB");
        let mut s = MigState::default();
        let got: Vec<(u32, u32)> = (0..7)
            .map(|_| create(&mut s, &t, "1g.10gb", None).unwrap())
            .collect();
        // ids 13, 11, 12, 7, 8, 9, 10 as `nvidia-smi mig -cgi 19,19,...` reports
        assert_eq!(
            got,
            [(13, 6), (11, 4), (12, 5), (7, 0), (8, 1), (9, 2), (10, 3)]
        );
        let err = create(&mut s, &t, "1g.10gb", None).unwrap_err();
        assert_eq!(err.code(), codes::INSUFFICIENT_RESOURCES);
        assert_eq!(s.remaining_gi_capacity(&t, &profile(&t, "1g.10gb")), 0);
    }

    #[test]
    fn overlapping_placement_fails_and_destroy_frees_it() {
        let t = table("A100-SXM4-80GB");
        let mut s = MigState::default();
        assert_eq!(create(&mut s, &t, "3g.40gb", Some(4)).unwrap(), (2, 4));
        let err = create(&mut s, &t, "2g.20gb", Some(4)).unwrap_err();
        assert_eq!(err.code(), codes::INSUFFICIENT_RESOURCES);
        assert!(
            err.to_string()
                .contains("overlaps GPU instance 2 (3g.40gb at 4:4)"),
            "{err}"
        );
        // 4g.40gb still fits in the lower half: 3g + 4g = the whole GPU.
        assert_eq!(create(&mut s, &t, "4g.40gb", None).unwrap(), (1, 0));
        assert_eq!(
            create(&mut s, &t, "1g.10gb", None).unwrap_err().code(),
            codes::INSUFFICIENT_RESOURCES
        );
        s.destroy_gpu_instance(2).unwrap();
        assert_eq!(create(&mut s, &t, "2g.20gb", Some(4)).unwrap(), (5, 4));
    }

    #[test]
    fn placement_not_in_the_table_is_an_invalid_argument() {
        let t = table("A100-SXM4-80GB");
        let mut s = MigState::default();
        let err = create(&mut s, &t, "2g.20gb", Some(6)).unwrap_err();
        assert_eq!(err.code(), codes::INVALID_ARGUMENT);
        assert!(err.to_string().contains("allowed: [0, 2, 4]"), "{err}");
        assert!(s.gpu_instances.is_empty());
    }

    #[test]
    fn media_extension_profile_allows_one_instance() {
        let t = table("H100-SXM5-80GB");
        let mut s = MigState::default();
        create(&mut s, &t, "1g.10gb+me", Some(0)).unwrap();
        let err = create(&mut s, &t, "1g.10gb+me", Some(1)).unwrap_err();
        assert_eq!(
            err,
            MigError::TooMany {
                profile: "1g.10gb+me".into(),
                max: 1
            }
        );
        assert_eq!(s.remaining_gi_capacity(&t, &profile(&t, "1g.10gb+me")), 0);
        assert_eq!(s.remaining_gi_capacity(&t, &profile(&t, "1g.10gb")), 6);
    }

    #[test]
    fn gpu_instance_with_compute_instances_is_in_use() {
        let t = table("A100-SXM4-80GB");
        let mut s = MigState::default();
        let gi = create(&mut s, &t, "3g.40gb", None).unwrap().0;
        let cis = profile(&t, "3g.40gb").compute_instance_profiles();
        let one = &cis[0];
        let a = s
            .create_compute_instance(gi, 3, one, None, None, "MIG-a".into(), 1)
            .unwrap()
            .id;
        let b = s
            .create_compute_instance(gi, 3, one, None, None, "MIG-b".into(), 2)
            .unwrap()
            .id;
        assert_eq!((a, b), (0, 1));
        // the full 3g CI overlaps both
        let err = s
            .create_compute_instance(gi, 3, &cis[2], None, None, "MIG-c".into(), 3)
            .unwrap_err();
        assert_eq!(err.code(), codes::INSUFFICIENT_RESOURCES);
        assert_eq!(s.remaining_ci_capacity(gi, 3, one).unwrap(), 1);
        assert_eq!(
            s.destroy_gpu_instance(gi).unwrap_err().code(),
            codes::IN_USE
        );
        s.destroy_compute_instance(gi, a).unwrap();
        s.destroy_compute_instance(gi, b).unwrap();
        assert_eq!(
            s.destroy_compute_instance(gi, b).unwrap_err().code(),
            codes::NOT_FOUND
        );
        s.destroy_gpu_instance(gi).unwrap();
        assert!(s.gpu_instances.is_empty());
    }

    #[test]
    fn explicit_ids_are_kept_and_duplicates_rejected() {
        let t = table("A100-SXM4-80GB");
        let mut s = MigState::default();
        let p = profile(&t, "1g.10gb");
        assert_eq!(
            s.create_gpu_instance(&t, &p, Some(0), Some(3), 0)
                .unwrap()
                .id,
            3
        );
        let err = s
            .create_gpu_instance(&t, &p, Some(1), Some(3), 0)
            .unwrap_err();
        assert!(matches!(err, MigError::DuplicateId(_)), "{err}");
    }

    #[test]
    fn mig_devices_enumerate_by_gi_then_ci() {
        let t = table("A100-SXM4-80GB");
        let mut s = MigState::default();
        let g1 = create(&mut s, &t, "1g.10gb", Some(0)).unwrap().0;
        let g2 = create(&mut s, &t, "4g.40gb", None).unwrap_err();
        assert_eq!(g2.code(), codes::INSUFFICIENT_RESOURCES);
        let g3 = create(&mut s, &t, "3g.40gb", None).unwrap().0;
        let full1 = profile(&t, "1g.10gb")
            .compute_instance_profiles()
            .pop()
            .unwrap();
        let full3 = profile(&t, "3g.40gb")
            .compute_instance_profiles()
            .pop()
            .unwrap();
        s.create_compute_instance(g3, 3, &full3, None, None, "MIG-3".into(), 0)
            .unwrap();
        s.create_compute_instance(g1, 1, &full1, None, None, "MIG-1".into(), 0)
            .unwrap();
        let order: Vec<&str> = s.mig_devices().map(|(_, c)| c.uuid.as_str()).collect();
        assert_eq!(
            order,
            ["MIG-3", "MIG-1"],
            "GI 2 (3g at 4) sorts before GI 7 (1g at 0)"
        );
    }
}
