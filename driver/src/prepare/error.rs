//! [`PrepareError`]: why preparing or unpreparing one claim failed, in the
//! words the user reads in the pod's events.

use super::cdi::CdiError;
use super::{mig, mps, timeslice};

/// Why preparing or unpreparing a claim failed; the text goes to the user.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// Another prepared claim holds an overlapping device.
    #[error(
        "device {device} overlaps device {other_device} {} claim {other} ({other_uid}); a device is never given to two claims: {}",
        .held.how(),
        .held.remedy()
    )]
    Conflict {
        /// Our device.
        device: String,
        /// The other claim's device.
        other_device: String,
        /// How the other claim holds it.
        held: Held,
        /// The other claim (namespace/name).
        other: String,
        /// Its UID.
        other_uid: String,
    },
    /// The checkpoint could not be written.
    #[error("cannot record the claim in the checkpoint ({step}): {reason}")]
    Checkpoint {
        /// The protocol step.
        step: String,
        /// The store's error.
        reason: String,
    },
    /// CDI spec generation or writing failed.
    #[error("CDI spec: {0}")]
    Cdi(#[from] CdiError),
    /// The claim's device metadata files could not be written.
    #[error(transparent)]
    Metadata(#[from] super::metadata::MetadataError),
    /// A MIG operation failed.
    #[error("device {device}: {error}")]
    Mig {
        /// The device.
        device: String,
        /// What failed.
        error: mig::MigError,
    },
    /// An MPS daemon could not be started or stopped.
    #[error("MPS: {0}")]
    Mps(#[from] mps::MpsError),
    /// Time-slicing could not be set.
    #[error("device {device}: {error}")]
    TimeSlice {
        /// The device.
        device: String,
        /// What failed.
        error: timeslice::TimeSliceError,
    },
    /// An NVML call failed.
    #[error("device {device}: {error}")]
    Nvml {
        /// The device.
        device: String,
        /// What failed.
        error: gpu_nvml::Error,
    },
    /// The allocation or config cannot be served as asked.
    #[error("device {device}: {reason}")]
    Unsupported {
        /// The device.
        device: String,
        /// Why.
        reason: String,
    },
    /// Undo failed for some steps (each listed).
    #[error("could not undo everything: {}", .0.join("; "))]
    Undo(Vec<String>),
}

/// How another claim holds a device (for [`PrepareError::Conflict`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Its prepare completed.
    Prepared,
    /// Its prepare failed and the rollback could not undo everything: the
    /// entry stays (`PrepareStarted`) until a retry undoes it.
    FailedPrepare,
}

impl Held {
    pub(super) fn how(self) -> &'static str {
        match self {
            Held::Prepared => "already prepared for",
            Held::FailedPrepare => "still held by a failed prepare of",
        }
    }

    pub(super) fn remedy(self) -> &'static str {
        match self {
            Held::Prepared => "unprepare the other claim first",
            Held::FailedPrepare => {
                "its rollback could not undo everything (see the plugin's log); it is retried at that claim's next prepare or unprepare and at the plugin's start"
            }
        }
    }
}
