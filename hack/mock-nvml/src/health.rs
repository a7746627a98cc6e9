//! GPU health in the fake: the faults a profile may declare present at start
//! (`health:` of a GPU), the live fault state of one GPU ([`GpuHealth`]) that
//! control commands change (see [`crate::control`] and [`crate::faults`]),
//! and what the health queries answer from it: the recovery action (field
//! 230), remapped rows, retired pages, ECC counts, clock-event reasons, the
//! PCIe replay counter and the supported event types. The GPU's process
//! lists live beside its faults (the control file changes both; see
//! [`crate::processes`]).

use std::collections::BTreeSet;

use nvml_wrapper_sys::bindings as sys;
use serde::{Deserialize, Serialize};

use crate::hardware::GpuModel;
use crate::processes::Process;

/// `nvmlEventTypeSingleBitEccError`.
pub const EVENT_SBE: u64 = 0x1;
/// `nvmlEventTypeDoubleBitEccError`.
pub const EVENT_DBE: u64 = 0x2;
/// `nvmlEventTypePState`.
pub const EVENT_PSTATE: u64 = 0x4;
/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID: u64 = 0x8;
/// `nvmlEventTypeClock`.
pub const EVENT_CLOCK: u64 = 0x10;
/// `nvmlEventTypeDramRetirementEvent`.
pub const EVENT_DRAM_RETIREMENT: u64 = 0x400;
/// `nvmlEventTypeDramRetirementFailure`.
pub const EVENT_DRAM_RETIREMENT_FAILURE: u64 = 0x800;
/// `nvmlEventTypeFatalPoisonError`.
pub const EVENT_FATAL_POISON: u64 = 0x2000;
/// `nvmlEventTypeGpuUnavailableError`.
pub const EVENT_GPU_UNAVAILABLE: u64 = 0x4000;
/// `nvmlEventTypeGpuRecoveryAction`.
pub const EVENT_RECOVERY_ACTION: u64 = 0x8000;

/// The first driver branch with the recovery action (field and event).
pub const RECOVERY_ACTION_DRIVER: u32 = 565;

/// Clock-event reason bits (`nvmlClocksEventReason*`).
pub const CLOCKS_HW_SLOWDOWN: u64 = 0x8;
/// `nvmlClocksEventReasonSwThermalSlowdown`.
pub const CLOCKS_SW_THERMAL: u64 = 0x20;
/// `nvmlClocksEventReasonHwThermalSlowdown`.
pub const CLOCKS_HW_THERMAL: u64 = 0x40;
/// `nvmlClocksEventReasonHwPowerBrakeSlowdown`.
pub const CLOCKS_HW_POWER_BRAKE: u64 = 0x80;

/// NVML's recovery action, by the word profiles and control commands use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Recovery {
    /// `NVML_GPU_RECOVERY_ACTION_NONE` (0).
    None,
    /// `NVML_GPU_RECOVERY_ACTION_GPU_RESET` (1).
    Reset,
    /// `NVML_GPU_RECOVERY_ACTION_NODE_REBOOT` (2).
    Reboot,
    /// `NVML_GPU_RECOVERY_ACTION_DRAIN_P2P` (3).
    Drain,
}

impl Recovery {
    /// The words, in the order of their values.
    pub const WORDS: &'static [&'static str] = &["none", "reset", "reboot", "drain"];

    /// The NVML value.
    pub fn value(self) -> u32 {
        match self {
            Recovery::None => 0,
            Recovery::Reset => 1,
            Recovery::Reboot => 2,
            Recovery::Drain => 3,
        }
    }

    /// The action of a word.
    pub fn from_word(word: &str) -> Option<Recovery> {
        Some(match word {
            "none" => Recovery::None,
            "reset" => Recovery::Reset,
            "reboot" => Recovery::Reboot,
            "drain" => Recovery::Drain,
            _ => return None,
        })
    }
}

/// Which clock-event reason is active, by the word profiles and control
/// commands use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Slowdown {
    /// No reason.
    None,
    /// `HW_SLOWDOWN`.
    Hw,
    /// `HW_THERMAL_SLOWDOWN`.
    Thermal,
    /// `HW_POWER_BRAKE_SLOWDOWN`.
    PowerBrake,
}

impl Slowdown {
    /// The words.
    pub const WORDS: &'static [&'static str] = &["none", "hw", "thermal", "power-brake"];

    /// The clock-event reason bits.
    pub fn bits(self) -> u64 {
        match self {
            Slowdown::None => 0,
            Slowdown::Hw => CLOCKS_HW_SLOWDOWN,
            Slowdown::Thermal => CLOCKS_HW_THERMAL,
            Slowdown::PowerBrake => CLOCKS_HW_POWER_BRAKE,
        }
    }

    /// The reason of a word.
    pub fn from_word(word: &str) -> Option<Slowdown> {
        Some(match word {
            "none" => Slowdown::None,
            "hw" => Slowdown::Hw,
            "thermal" => Slowdown::Thermal,
            "power-brake" => Slowdown::PowerBrake,
            _ => return None,
        })
    }
}

/// `health:` of a GPU in a profile: faults present when the machine boots.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent faults of the profile format, each yes or no"
)]
pub struct HealthSpec {
    /// The GPU has fallen off the bus: every call on it is GPU_IS_LOST.
    #[serde(default)]
    pub lost: bool,
    /// Field 230; default `none` (drivers older than R565 do not have it).
    #[serde(default)]
    pub recovery_action: Option<Recovery>,
    /// A row remap waits for a reset (Ampere and later), or retired pages
    /// are pending (older GPUs).
    #[serde(default)]
    pub remap_pending: bool,
    /// A row remap failed (Ampere and later).
    #[serde(default)]
    pub remap_failure: bool,
    /// Volatile uncorrected ECC errors.
    #[serde(default)]
    pub ecc_uncorrected: u64,
    /// Links of `nvlinks` that are down.
    #[serde(default)]
    pub nvlinks_down: Vec<u32>,
    /// `nvmlDeviceRegisterEvents` fails for this GPU.
    #[serde(default)]
    pub refuse_events: bool,
    /// Active clock-event reason; default none.
    #[serde(default)]
    pub slowdown: Option<Slowdown>,
    /// PCIe replay counter.
    #[serde(default)]
    pub pcie_replays: u32,
}

/// The fault state of one GPU, and the facts that decide what its health
/// queries support.
#[derive(Clone, Debug, PartialEq, Eq)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent facts and faults of one GPU, each yes or no as NVML reports them"
)]
pub struct GpuHealth {
    /// Minor number (control commands name GPUs by it).
    pub minor: u32,
    /// NVLinks the chip has.
    pub nvlink_count: u32,
    /// Links with a peer in the profile (the only ones that can be up).
    pub links: BTreeSet<u32>,
    /// The driver has the recovery action (R565+).
    pub has_recovery_action: bool,
    /// The GPU remaps rows (Ampere+); older ones retire pages.
    pub row_remapping: bool,
    /// Fallen off the bus.
    pub lost: bool,
    /// Field 230 value.
    pub recovery_action: u32,
    /// Row remap (or page retirement) pending.
    pub remap_pending: bool,
    /// Row remap failed.
    pub remap_failure: bool,
    /// Volatile uncorrected ECC errors.
    pub ecc_uncorrected: u64,
    /// Links of [`GpuHealth::links`] that are down.
    pub links_down: BTreeSet<u32>,
    /// Event registration is refused.
    pub refuse_events: bool,
    /// Clock-event reason bits.
    pub clock_reasons: u64,
    /// PCIe replay counter.
    pub pcie_replays: u32,
    /// Processes with a compute context (`processes` command).
    pub compute_processes: Vec<Process>,
    /// Processes with a graphics context (`graphics-processes` command).
    pub graphics_processes: Vec<Process>,
}

/// The major number of a driver version like `580.95.05`.
pub fn driver_major(version: &str) -> u32 {
    version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

impl GpuHealth {
    /// A healthy GPU.
    pub fn healthy(model: &GpuModel, minor: u32, links: BTreeSet<u32>, driver: &str) -> Self {
        GpuHealth {
            minor,
            nvlink_count: model.nvlink_count,
            links,
            has_recovery_action: driver_major(driver) >= RECOVERY_ACTION_DRIVER,
            row_remapping: model.architecture >= sys::NVML_DEVICE_ARCH_AMPERE,
            lost: false,
            recovery_action: 0,
            remap_pending: false,
            remap_failure: false,
            ecc_uncorrected: 0,
            links_down: BTreeSet::new(),
            refuse_events: false,
            clock_reasons: 0,
            pcie_replays: 0,
            compute_processes: Vec::new(),
            graphics_processes: Vec::new(),
        }
    }

    /// The GPU with the faults of its profile's `health:` block; an error
    /// names the field.
    pub fn with_spec(mut self, spec: &HealthSpec) -> Result<Self, String> {
        if spec.recovery_action.is_some() && !self.has_recovery_action {
            return Err(format!(
                "health.recoveryAction: the driver has no recovery action before R{RECOVERY_ACTION_DRIVER}"
            ));
        }
        if spec.remap_failure && !self.row_remapping {
            return Err(
                "health.remapFailure: the GPU retires pages, it has no row remapping".into(),
            );
        }
        for link in &spec.nvlinks_down {
            if !self.links.contains(link) {
                return Err(format!(
                    "health.nvlinksDown: link {link} is not one of the GPU's nvlinks"
                ));
            }
            if !self.links_down.insert(*link) {
                return Err(format!("health.nvlinksDown: link {link} is listed twice"));
            }
        }
        self.lost = spec.lost;
        self.recovery_action = spec.recovery_action.map_or(0, Recovery::value);
        self.remap_pending = spec.remap_pending;
        self.remap_failure = spec.remap_failure;
        self.ecc_uncorrected = spec.ecc_uncorrected;
        self.refuse_events = spec.refuse_events;
        self.clock_reasons = spec.slowdown.map_or(0, Slowdown::bits);
        self.pcie_replays = spec.pcie_replays;
        Ok(self)
    }

    /// `nvmlDeviceGetSupportedEventTypes`: SBE, DBE, PState, XID and clock
    /// everywhere; DRAM retirement events with row remapping; the poison,
    /// unavailable and recovery-action events from R565.
    pub fn supported_events(&self) -> u64 {
        let mut mask = EVENT_SBE | EVENT_DBE | EVENT_PSTATE | EVENT_XID | EVENT_CLOCK;
        if self.row_remapping {
            mask |= EVENT_DRAM_RETIREMENT | EVENT_DRAM_RETIREMENT_FAILURE;
        }
        if self.has_recovery_action {
            mask |= EVENT_FATAL_POISON | EVENT_GPU_UNAVAILABLE | EVENT_RECOVERY_ACTION;
        }
        mask
    }

    /// Whether a link of the profile is up now.
    pub fn link_up(&self, link: u32) -> bool {
        self.links.contains(&link) && !self.links_down.contains(&link)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware;

    fn a100() -> GpuHealth {
        GpuHealth::healthy(
            &hardware::model("A100-SXM4-80GB").unwrap(),
            3,
            BTreeSet::from([0, 1]),
            "580.95.05",
        )
    }

    #[test]
    fn words_and_values_match_nvml() {
        for (i, word) in Recovery::WORDS.iter().enumerate() {
            assert_eq!(Recovery::from_word(word).unwrap().value(), i as u32);
        }
        assert_eq!(
            Recovery::Drain.value(),
            sys::nvmlDeviceGpuRecoveryAction_s_NVML_GPU_RECOVERY_ACTION_DRAIN_P2P
        );
        assert_eq!(Recovery::from_word("RESET"), None);
        for word in Slowdown::WORDS {
            assert!(Slowdown::from_word(word).is_some(), "{word}");
        }
        assert_eq!(
            Slowdown::Hw.bits(),
            u64::from(sys::nvmlClocksThrottleReasonHwSlowdown)
        );
        assert_eq!(
            Slowdown::Thermal.bits(),
            u64::from(sys::nvmlClocksThrottleReasonHwThermalSlowdown)
        );
        assert_eq!(
            EVENT_RECOVERY_ACTION,
            u64::from(sys::nvmlEventTypeGpuRecoveryAction)
        );
    }

    #[test]
    fn supported_events_follow_the_driver_and_the_chip() {
        let a100 = a100();
        assert_eq!(a100.supported_events(), 0xEC1F);
        let old = GpuHealth::healthy(
            &hardware::model("T4").unwrap(),
            0,
            BTreeSet::new(),
            "535.104.05",
        );
        assert!(!old.has_recovery_action);
        assert!(!old.row_remapping);
        assert_eq!(old.supported_events(), 0x1F);
        assert_eq!(driver_major("565.57.01"), 565);
        assert_eq!(driver_major("garbage"), 0);
    }

    #[test]
    fn a_spec_sets_the_faults_and_bad_ones_name_the_field() {
        let spec = HealthSpec {
            lost: true,
            recovery_action: Some(Recovery::Reboot),
            remap_pending: true,
            remap_failure: true,
            ecc_uncorrected: 4,
            nvlinks_down: vec![1],
            refuse_events: true,
            slowdown: Some(Slowdown::Thermal),
            pcie_replays: 9,
        };
        let h = a100().with_spec(&spec).unwrap();
        assert!(h.lost && h.refuse_events && h.remap_pending && h.remap_failure);
        assert_eq!(h.recovery_action, 2);
        assert_eq!(h.ecc_uncorrected, 4);
        assert!(h.link_up(0));
        assert!(!h.link_up(1));
        assert!(!h.link_up(7));
        assert_eq!(h.clock_reasons, CLOCKS_HW_THERMAL);
        assert_eq!(h.pcie_replays, 9);

        for (spec, expect) in [
            (
                HealthSpec {
                    nvlinks_down: vec![5],
                    ..HealthSpec::default()
                },
                "link 5 is not one of the GPU's nvlinks",
            ),
            (
                HealthSpec {
                    nvlinks_down: vec![0, 0],
                    ..HealthSpec::default()
                },
                "link 0 is listed twice",
            ),
        ] {
            let err = a100().with_spec(&spec).unwrap_err();
            assert!(err.contains(expect), "{err}");
        }
        let t4 = GpuHealth::healthy(
            &hardware::model("T4").unwrap(),
            0,
            BTreeSet::new(),
            "535.104.05",
        );
        let err = t4
            .clone()
            .with_spec(&HealthSpec {
                recovery_action: Some(Recovery::None),
                ..HealthSpec::default()
            })
            .unwrap_err();
        assert!(err.contains("before R565"), "{err}");
        let err = t4
            .with_spec(&HealthSpec {
                remap_failure: true,
                ..HealthSpec::default()
            })
            .unwrap_err();
        assert!(err.contains("no row remapping"), "{err}");
    }
}
