//! What the GPU health monitor asks of NVML: a stream of events per physical
//! GPU and a cheap poll of the conditions NVML reports only when asked.
//!
//! [`HealthSource`] is the seam: [`crate::NvmlBackend`] implements it over
//! the NVML event API and field queries (and so runs against the project's
//! fake `libnvidia-ml.so` in tests); the plugin's unit tests use a fake of
//! their own. Everything here is owned data, as in [`crate::types`].

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::Result;

/// What happened, as NVML's event type says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// `nvmlEventTypeXidCriticalError` with its XID number.
    Xid(u64),
    /// `nvmlEventTypeDoubleBitEccError`.
    DoubleBitEcc,
    /// `nvmlEventTypeSingleBitEccError`.
    SingleBitEcc,
    /// `nvmlEventTypeGpuRecoveryAction` (0x8000) with the action NVML gave.
    RecoveryAction(RecoveryAction),
    /// `nvmlEventTypeGpuUnavailableError` (0x4000).
    GpuUnavailable,
    /// `nvmlEventTypeDramRetirementEvent` (0x400).
    DramRetirement,
    /// `nvmlEventTypeDramRetirementFailure` (0x800).
    DramRetirementFailure,
    /// `nvmlEventTypeFatalPoisonError` (0x2000).
    FatalPoison,
}

/// NVML's recovery action (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, field
/// 230, R565 and later; `nvmlDeviceGpuRecoveryAction_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RecoveryAction {
    /// `NVML_GPU_RECOVERY_ACTION_NONE` (0).
    None,
    /// `NVML_GPU_RECOVERY_ACTION_GPU_RESET` (1).
    GpuReset,
    /// `NVML_GPU_RECOVERY_ACTION_NODE_REBOOT` (2).
    NodeReboot,
    /// `NVML_GPU_RECOVERY_ACTION_DRAIN_P2P` (3).
    DrainP2p,
    /// `NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET` (4).
    DrainAndReset,
    /// A value this build does not know.
    Other(u32),
}

impl RecoveryAction {
    /// From NVML's number.
    pub fn from_raw(value: u32) -> Self {
        match value {
            0 => Self::None,
            1 => Self::GpuReset,
            2 => Self::NodeReboot,
            3 => Self::DrainP2p,
            4 => Self::DrainAndReset,
            other => Self::Other(other),
        }
    }

    /// NVML's name without the `NVML_GPU_RECOVERY_ACTION_` prefix, as taint
    /// values and messages show it (`GPU_RESET`).
    pub fn name(self) -> String {
        match self {
            Self::None => "NONE".to_owned(),
            Self::GpuReset => "GPU_RESET".to_owned(),
            Self::NodeReboot => "NODE_REBOOT".to_owned(),
            Self::DrainP2p => "DRAIN_P2P".to_owned(),
            Self::DrainAndReset => "DRAIN_AND_RESET".to_owned(),
            Self::Other(n) => format!("UNKNOWN_{n}"),
        }
    }
}

/// One NVML event of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthEvent {
    /// NVML index of the physical GPU whose event set delivered it.
    pub gpu_index: u32,
    /// What happened.
    pub kind: EventKind,
    /// The GPU instance id, when NVML attributed the event to one MIG
    /// device (`None` for `0xFFFFFFFF`: the whole GPU).
    pub gpu_instance_id: Option<u32>,
    /// The compute instance id, likewise.
    pub compute_instance_id: Option<u32>,
    /// When the monitor received it.
    pub at: SystemTime,
}

/// Whether the GPU answers NVML at all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Liveness {
    /// It answers.
    Alive,
    /// `NVML_ERROR_GPU_IS_LOST`: fallen off the bus.
    Lost,
    /// `NVML_ERROR_RESET_REQUIRED`.
    ResetRequired,
    /// Another error; the text says which.
    Error(String),
}

/// The row-remapping state (`nvmlDeviceGetRemappedRows`, Ampere and later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemapState {
    /// A remap waits for the next GPU reset.
    pub pending: bool,
    /// A remap failed: the memory is beyond repair.
    pub failure: bool,
}

/// One NVLink's state at the poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkState {
    /// Link number.
    pub link: u32,
    /// `nvmlDeviceGetNvLinkState` says active.
    pub active: bool,
}

/// Everything one poll of one GPU learned. A field is `None` when the GPU
/// or driver does not support the query (or the GPU did not answer); the
/// monitor never reads a missing value as healthy or unhealthy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthPoll {
    /// Whether the GPU answered.
    pub liveness: Liveness,
    /// The recovery action (R565+).
    pub recovery_action: Option<RecoveryAction>,
    /// Row remapping (Ampere+).
    pub remap: Option<RemapState>,
    /// Retired pages waiting for a reset (pre-Ampere page retirement).
    pub retired_pages_pending: Option<bool>,
    /// Volatile uncorrected ECC errors since the driver loaded.
    pub volatile_uncorrected_ecc: Option<u64>,
    /// Clock-event reason HW_SLOWDOWN or HW_POWER_BRAKE is active.
    pub hw_slowdown: Option<bool>,
    /// Clock-event reason HW_THERMAL_SLOWDOWN (or SW thermal) is active.
    pub thermal_slowdown: Option<bool>,
    /// PCIe replay counter (monotonic).
    pub pcie_replays: Option<u64>,
    /// Every NVLink the GPU has, with its state; empty without NVLink.
    pub nvlinks: Vec<LinkState>,
}

impl HealthPoll {
    /// What a healthy GPU answers on an R565+ driver with row remapping
    /// (Ampere and later): recovery action none, nothing remapped, no
    /// uncorrected ECC error or PCIe replay, no slowdown; no NVLinks (set
    /// them where the GPU has some). A reference to compare polls with and
    /// to build faults from.
    #[must_use]
    pub fn healthy() -> Self {
        Self {
            liveness: Liveness::Alive,
            recovery_action: Some(RecoveryAction::None),
            remap: Some(RemapState {
                pending: false,
                failure: false,
            }),
            retired_pages_pending: None,
            volatile_uncorrected_ecc: Some(0),
            hw_slowdown: Some(false),
            thermal_slowdown: Some(false),
            pcie_replays: Some(0),
            nvlinks: Vec::new(),
        }
    }

    /// A poll that learned nothing but `liveness`: a GPU that did not
    /// answer, or a driver too old for every other query.
    #[must_use]
    pub fn liveness_only(liveness: Liveness) -> Self {
        Self {
            liveness,
            recovery_action: None,
            remap: None,
            retired_pages_pending: None,
            volatile_uncorrected_ecc: None,
            hw_slowdown: None,
            thermal_slowdown: None,
            pcie_replays: None,
            nvlinks: Vec::new(),
        }
    }
}

/// The event set of one GPU, waited on by one blocking thread.
pub trait EventWatch: Send {
    /// Waits up to `timeout` for the next event; `Ok(None)` on timeout.
    /// An error means the watch is broken (the GPU is lost, NVML shut
    /// down): the monitor drops it and relies on the poll.
    fn wait(&mut self, timeout: Duration) -> Result<Option<HealthEvent>>;
}

/// Where the health monitor gets its facts. Blocking, like
/// [`crate::GpuBackend`].
pub trait HealthSource: Send + Sync + 'static {
    /// Registers an event set on GPU `index` for every health event type the
    /// GPU supports (falling back to XID and double-bit ECC alone when the
    /// full mask is refused). An error means the GPU cannot be watched by
    /// events: the monitor marks it unmonitored and keeps polling it.
    fn watch(&self, index: u32) -> Result<Box<dyn EventWatch>>;

    /// One poll of GPU `index`. Only a failure to reach NVML at all is an
    /// error; a GPU that does not answer is [`Liveness`] in the result.
    fn poll(&self, index: u32) -> Result<HealthPoll>;
}
