//! The prepare checkpoint: a durable, versioned record of every claim the
//! plugin has started or finished preparing on this node, with enough detail
//! per device to undo the preparation without the API server.
//!
//! The protocol the prepare code follows: record [`ClaimState::PrepareStarted`]
//! for all claims of a kubelet batch in one [`Store::commit`] *before*
//! touching hardware, then [`ClaimState::PrepareCompleted`] for all of them
//! in one commit afterwards; unprepare undoes what the entry records and then
//! removes it. A crash between the two commits leaves `PrepareStarted`, which
//! tells the restarted plugin to redo (or undo) the preparation.
//!
//! On disk (`format`, version 1) it is one JSON document with a CRC-32 per
//! entry, so one corrupted entry is quarantined instead of blocking the node
//! (NVIDIA's driver keeps one checksum over the whole file, and a mismatch
//! stops the plugin from starting). The file is replaced atomically
//! (`store`: temp file, fsync, rename, fsync of the directory), and
//! concurrent commits are grouped into one write.
//!
//! What the text of lost entries (quarantined, or in a file set aside)
//! still names is kept in a ledger beside it (`lost`), so that what their
//! claims' running pods use is neither swept nor forgotten.

mod format;
mod lost;
mod near;
mod store;

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use format::{CURRENT_VERSION, MAX_FILE_BYTES};
pub use lost::{LOST_FILE_NAME, LostClaim, MAX_SCAN_BYTES, UNATTRIBUTED, daemon_id, is_daemon_of};
pub use store::{Batch, FAILPOINT_ENV, Store};

/// File name of the checkpoint inside the plugin's state directory.
pub const FILE_NAME: &str = "checkpoint.json";
/// File name of the human-readable record of quarantined entries.
pub const QUARANTINE_FILE_NAME: &str = "checkpoint.quarantine.json";
/// Where the checkpoint of an earlier boot is kept when a start discards it.
pub const PREVIOUS_BOOT_FILE_NAME: &str = "checkpoint.previous-boot.json";

/// The UID of a ResourceClaim (`metadata.uid`), the checkpoint's key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ClaimUid(pub String);

impl fmt::Display for ClaimUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for ClaimUid {
    fn from(uid: &str) -> Self {
        Self(uid.to_owned())
    }
}

/// The checkpoint's content in memory: every claim this node has prepared
/// or started to prepare since boot, and the boot it belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// The kernel boot id the entries belong to
    /// (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    /// One entry per claim.
    pub claims: BTreeMap<ClaimUid, ClaimEntry>,
}

/// How far the preparation of a claim got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimState {
    /// Recorded before any hardware is touched: the devices listed may be
    /// partly set up, so a restart must redo or undo them.
    PrepareStarted,
    /// Every device is set up and the CDI specs are written; a repeated
    /// prepare returns the stored result.
    PrepareCompleted,
}

/// What the plugin did for one claim.
///
/// Serde rules for every record type here: fields added later carry
/// `#[serde(default)]`, enums are tagged by a `type` field, and unknown
/// fields are ignored (see `format` for why).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimEntry {
    /// How far preparation got.
    pub state: ClaimState,
    /// Namespace of the claim (for logs and events; unprepare does not need it).
    pub namespace: String,
    /// Name of the claim.
    pub name: String,
    /// One record per prepared device (or device share).
    #[serde(default)]
    pub devices: Vec<PreparedDeviceRecord>,
    /// CDI spec files written for this claim, to delete on unprepare.
    #[serde(default)]
    pub cdi_spec_paths: Vec<PathBuf>,
}

/// What was done for one allocated device of a claim: enough to answer a
/// repeated prepare and to undo everything without the API server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDeviceRecord {
    /// The hardware behind the device.
    pub kind: DeviceKind,
    /// The claim's request names this device satisfies.
    #[serde(default)]
    pub requests: Vec<String>,
    /// The ResourceSlice pool of the device.
    pub pool: String,
    /// The device name in the pool.
    pub device: String,
    /// The share id, for devices allocated with consumable capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Fully qualified CDI device ids handed to the kubelet.
    #[serde(default)]
    pub cdi_device_ids: Vec<String>,
    /// Sharing settings applied to the hardware, to revert on unprepare.
    #[serde(default)]
    pub sharing: SharingApplied,
    /// Allocated with admin access: no exclusivity, nothing configured.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin: bool,
}

impl PreparedDeviceRecord {
    /// Minor of the physical GPU the device is on (a MIG device's parent):
    /// the unit of locking.
    pub fn gpu_minor(&self) -> u32 {
        match &self.kind {
            DeviceKind::Gpu { minor, .. } | DeviceKind::Vfio { minor, .. } => *minor,
            DeviceKind::Mig { parent_minor, .. } => *parent_minor,
        }
    }

    /// UUID of the physical GPU the device is on (a MIG device's parent).
    pub fn gpu_uuid(&self) -> &str {
        match &self.kind {
            DeviceKind::Gpu { uuid, .. } | DeviceKind::Vfio { uuid, .. } => uuid,
            DeviceKind::Mig { parent_uuid, .. } => parent_uuid,
        }
    }
}

/// The hardware a prepared device stands for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum DeviceKind {
    /// A whole GPU.
    Gpu {
        /// GPU UUID (`GPU-...`).
        uuid: String,
        /// Minor number (`/dev/nvidiaN`).
        minor: u32,
    },
    /// A MIG device, created dynamically or found at discovery.
    Mig {
        /// UUID of the parent GPU.
        parent_uuid: String,
        /// Minor number of the parent GPU.
        parent_minor: u32,
        /// NVML GPU instance profile id.
        profile_id: u32,
        /// First memory slice of the placement.
        placement_start: u32,
        /// Number of memory slices of the placement.
        placement_size: u32,
        /// GPU instance id, once created.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu_instance_id: Option<u32>,
        /// Compute instance id, once created.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        compute_instance_id: Option<u32>,
        /// MIG device UUID (`MIG-...`), once created.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mig_uuid: Option<String>,
        /// Whether this plugin created the instance (and so must destroy it
        /// on unprepare) rather than finding it already there.
        #[serde(default)]
        created: bool,
    },
    /// A whole GPU handed over through VFIO: rebound from its driver to
    /// `vfio-pci` at prepare, back at unprepare.
    Vfio {
        /// GPU UUID (`GPU-...`).
        uuid: String,
        /// Minor number (`/dev/nvidiaN`, while on `nvidia`).
        minor: u32,
        /// PCI bus id, its name in sysfs.
        pci_bus_id: String,
        /// The driver found on the GPU, journalled before the first sysfs
        /// write: set means a rebind may have started, and undo binds the
        /// GPU back to `nvidia`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        previous_driver: Option<String>,
        /// The IOMMU group, once bound to `vfio-pci`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        iommu_group: Option<String>,
    },
}

/// Sharing settings a prepare applied to a device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SharingApplied {
    /// Time-slice interval set on the GPU (`Default`, `Short`, `Medium`, `Long`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slice_interval: Option<String>,
    /// Compute mode set on the GPU, with the mode to restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_mode: Option<ComputeModeChange>,
    /// MPS control daemon started for this claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_daemon: Option<MpsDaemonRecord>,
}

/// A compute mode change to revert.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComputeModeChange {
    /// The mode set (e.g. `ExclusiveProcess`).
    pub set: String,
    /// The mode found before (e.g. `Default`).
    pub previous: String,
}

/// An MPS control daemon the plugin started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsDaemonRecord {
    /// The daemon's id (also the name of its pipe and log directories).
    pub id: String,
    /// The daemon's pipe directory on the host.
    #[serde(default)]
    pub pipe_dir: PathBuf,
    /// The daemon's pid when it was started or last re-adopted (for logs;
    /// liveness is always read from its pid file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The daemon's log directory on the host (`control.log`).
    #[serde(default)]
    pub log_dir: PathBuf,
    /// The directory that is the daemon's and its clients' `/dev/shm`, on the host.
    #[serde(default)]
    pub shm_dir: PathBuf,
    /// The devices it serves (`CUDA_VISIBLE_DEVICES`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_uuids: Vec<String>,
}

/// What loading the checkpoint found, for logs and events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Entries loaded.
    pub loaded: usize,
    /// Entries quarantined (bad checksum or undecodable), with the reason.
    pub quarantined: Vec<(String, String)>,
    /// Entries dropped because they belong to an earlier boot.
    pub discarded_for_reboot: usize,
    /// The boot id of the file when it differed from the current one.
    pub previous_boot_id: Option<String>,
    /// Where the file of that earlier boot was kept when it held entries
    /// (one copy, the latest: a boot id damaged on disk reads as a reboot
    /// too, and the entries are then not lost for a human).
    pub previous_boot_copy: Option<PathBuf>,
    /// The file was unusable as a whole (too large, not JSON, bad header)
    /// and moved to this path; the node started with the entries salvaged
    /// from it.
    pub moved_aside: Option<(PathBuf, String)>,
    /// Entries of the file moved aside that still verified, taken from it
    /// one by one (see `format::salvage`).
    pub salvaged: usize,
    /// Every entry of the file moved aside was taken from it (verified,
    /// or quarantined and reported as such).
    pub salvaged_all: bool,
}

impl LoadReport {
    /// Whether entries of the file were dropped without being undone:
    /// quarantined, in a file moved aside and not salvaged, or of an
    /// earlier boot (after a
    /// real reboot nothing they set up is left, but a damaged boot id reads
    /// as a reboot too). What they had set up on the node is no longer
    /// recorded.
    pub fn lost_entries(&self) -> bool {
        !self.quarantined.is_empty()
            || (self.moved_aside.is_some() && !self.salvaged_all)
            || self.previous_boot_copy.is_some()
    }
}

/// A failed filesystem step of a checkpoint write; shared by every commit of
/// the group that write carried.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{step} {path}: {source}")]
pub struct WriteFailure {
    /// The step that failed (`write temp file`, `rename`, ...).
    pub step: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The I/O error.
    pub source: Arc<io::Error>,
}

/// Errors of the checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The boot id file could not be read or was empty.
    #[error("cannot read the boot id from {path}: {reason}")]
    BootId {
        /// The boot id file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The checkpoint file exists but could not be read (permissions, a
    /// directory in its place): refusing to start rather than forgetting
    /// prepared claims.
    #[error("cannot read checkpoint {path}: {source}")]
    Read {
        /// The checkpoint file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The checkpoint was written by a newer plugin.
    #[error(
        "checkpoint {path} has version {version}, newer than this plugin understands \
         (at most {CURRENT_VERSION}); refusing to start so that the claims it records \
         are not forgotten: to downgrade, unprepare all claims on this node (drain it) \
         or move the file away by hand"
    )]
    NewerVersion {
        /// The checkpoint file.
        path: PathBuf,
        /// The version found.
        version: u64,
    },
    /// The unusable checkpoint could not be moved aside.
    #[error("cannot move the unusable checkpoint {path} aside: {source}")]
    MoveAside {
        /// The checkpoint file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A write of the checkpoint failed; the commit is not durable and the
    /// in-memory state is unchanged.
    #[error("checkpoint write failed: {0}")]
    Write(#[from] WriteFailure),
}

#[cfg(test)]
mod damage_tests;
#[cfg(test)]
mod tests;
