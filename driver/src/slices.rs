//! Building ResourceSlices from the device model and publishing them.
//!
//! - [`split`]: cuts the node's devices and counter sets into slice contents
//!   that respect the API limits of the target Kubernetes version
//!   ([`SliceRules`]).
//! - [`pool`]: turns slice contents into `ResourceSlice` objects (one pool per
//!   node, pool name = node name, owned by the Node) and decides, from what the
//!   API server holds, which writes bring the pool to the desired state, with
//!   consistent generations and no write when nothing changed, remembering
//!   only digests of what it published ([`Digest`]).
//! - [`publisher`]: the reconcile loop against the API server: watches its own
//!   slices, repairs deletion and drift, backs off on errors.
//!
//! Policy on exit: by default the slices stay when the plugin stops (a
//! restart or rolling update republishes the identical pool without a gap;
//! kubelet deletes a node's slices 30 s after the last plugin of a driver
//! disconnects). With `--delete-slices-on-exit` the plugin deletes its slices
//! when it stops (SIGTERM included), which suits uninstalling.

mod backoff;
mod digest;
pub mod pool;
pub mod publisher;
pub mod split;
pub(crate) mod wire;

use std::fmt;

pub use backoff::{Backoff, ErrorLog};
pub use digest::Digest;
pub use publisher::{PublishError, PublishStatus, Publisher, PublisherOptions};

use crate::devices::{ConsumableShares, GroupLimits, MemorySharing};

/// Flags of ResourceSlice publication.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[group(id = "slice_flags")]
pub struct Flags {
    /// Publish every MIG profile x placement of MIG-capable GPUs as a
    /// partitionable device, created on demand at prepare time (needs the
    /// DRAPartitionableDevices feature gate). Off by default: it changes the
    /// devices users see.
    #[arg(
        long,
        env = "DYNAMIC_MIG",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new(),
    )]
    pub dynamic_mig: bool,

    /// GPUs shared by memory fraction: `none`, `all`, or a comma-separated
    /// list of GPU indexes and `GPU-...` UUIDs. A shared GPU is published as
    /// its full GPU only, with `allowMultipleAllocations` and a request
    /// policy on its `memory` capacity (default 1Gi, steps of 256Mi), so
    /// several claims can each take part of it (needs the
    /// DRAConsumableCapacity feature gate).
    #[arg(long, env = "MEMORY_SHARING", default_value = "none", value_parser = parse_memory_sharing)]
    pub memory_sharing: MemorySharing,

    /// NVIDIA's consumable shares, for the whole node: `disabled`,
    /// `memory`, `unlimited`, or a number of shares N. Any mode but
    /// `disabled` publishes full GPUs and static MIG devices with
    /// `allowMultipleAllocations` and a request policy on `memory` (steps
    /// of 1Mi; a claim that names no memory takes all of it in `memory`
    /// mode, none otherwise); N adds a capacity `shares` of N (1 per claim
    /// by default). `memory` mode is enforced with MPS limits on full GPUs
    /// (it is `--memory-sharing=all` with NVIDIA's request policy); the
    /// others only count. Not with `--memory-sharing` (needs the
    /// DRAConsumableCapacity feature gate; docs/sharing.md).
    #[arg(long, env = "CONSUMABLE_SHARES", default_value = "disabled", value_parser = parse_consumable_shares, conflicts_with = "memory_sharing")]
    pub consumable_shares: ConsumableShares,

    /// API limits to split slices by: `1.35` (counter sets in slices of their
    /// own, at most 64 devices per slice with counters or taints), `1.34`
    /// (counter sets next to the devices that consume them), or `auto` to
    /// pick by the API server's version.
    #[arg(long, env = "SLICE_RULES", default_value = "auto")]
    pub slice_rules: RulesFlag,

    /// Delete this node's ResourceSlices of the driver when the plugin stops
    /// (SIGTERM included). Off by default, so restarts keep the pool.
    #[arg(
        long,
        env = "DELETE_SLICES_ON_EXIT",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new(),
    )]
    pub delete_slices_on_exit: bool,

    /// Not a flag: with the plugin's `--passthrough`, the VFIO facts read at
    /// start (`crate::vfio::Passthrough`), so the pool has the VFIO devices.
    #[arg(skip)]
    pub passthrough: Option<crate::vfio::Passthrough>,
}

impl Default for Flags {
    fn default() -> Self {
        Self {
            dynamic_mig: false,
            memory_sharing: MemorySharing::None,
            consumable_shares: ConsumableShares::Disabled,
            slice_rules: RulesFlag::Auto,
            delete_slices_on_exit: false,
            passthrough: None,
        }
    }
}

/// Parses `--memory-sharing` (see [`MemorySharing`]'s `FromStr`).
fn parse_memory_sharing(value: &str) -> Result<MemorySharing, String> {
    value
        .parse()
        .map_err(|e: crate::devices::sharing::ParseError| e.to_string())
}

/// Parses `--consumable-shares` (see [`ConsumableShares`]'s `FromStr`).
fn parse_consumable_shares(value: &str) -> Result<ConsumableShares, String> {
    value
        .parse()
        .map_err(|e: crate::devices::shares::ParseError| e.to_string())
}

/// The `--slice-rules` choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RulesFlag {
    /// Pick by the API server's version (1.35 rules when it cannot be told).
    Auto,
    /// Kubernetes 1.34 rules.
    #[value(name = "1.34")]
    V1_34,
    /// Kubernetes 1.35 and later rules.
    #[value(name = "1.35")]
    V1_35,
}

impl RulesFlag {
    /// The fixed rules, or `None` for `auto`.
    pub fn fixed(self) -> Option<SliceRules> {
        match self {
            Self::Auto => None,
            Self::V1_34 => Some(SliceRules::V1_34),
            Self::V1_35 => Some(SliceRules::V1_35),
        }
    }
}

/// The ResourceSlice validation rules of a Kubernetes version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceRules {
    /// 1.34: counter sets live in the slice of the devices that consume them.
    V1_34,
    /// 1.35 and later: a slice holds devices or counter sets, never both.
    V1_35,
}

impl fmt::Display for SliceRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V1_34 => "1.34",
            Self::V1_35 => "1.35",
        })
    }
}

/// Limits of one ResourceSlice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Devices in a slice.
    pub max_devices: usize,
    /// Devices in a slice where a device consumes counters.
    pub max_devices_with_counters: usize,
    /// Devices in a slice where a device has taints (64 under both rules: the
    /// 1.35 limit, and harmless under 1.34).
    pub max_devices_with_taints: usize,
    /// Counter sets go in slices without devices (1.35).
    pub counters_in_own_slices: bool,
    /// Counter sets in a slice.
    pub max_counter_sets_per_slice: usize,
    /// Counters in one counter set.
    pub max_counters_per_set: usize,
    /// Counters over all counter sets of a slice.
    pub max_shared_counters_per_slice: usize,
    /// Counters one device consumes.
    pub max_counters_per_device: usize,
    /// Counter consumptions over all devices of a slice.
    pub max_consumptions_per_slice: Option<usize>,
    /// Taints of one device.
    pub max_taints_per_device: usize,
    /// Whether taints with effect `None` are valid (1.35 and later); under
    /// 1.34 rules they are dropped before publishing.
    pub taint_effect_none: bool,
}

impl SliceRules {
    /// The limits of these rules (kubernetes-dra.md section 4.1).
    pub fn limits(self) -> Limits {
        match self {
            Self::V1_34 => Limits {
                max_devices: 128,
                max_devices_with_counters: 128,
                max_devices_with_taints: 64,
                counters_in_own_slices: false,
                max_counter_sets_per_slice: 32,
                max_counters_per_set: 32,
                max_shared_counters_per_slice: 32,
                max_counters_per_device: 32,
                max_consumptions_per_slice: Some(1024),
                max_taints_per_device: 4,
                taint_effect_none: false,
            },
            Self::V1_35 => Limits {
                max_devices: 128,
                max_devices_with_counters: 64,
                max_devices_with_taints: 64,
                counters_in_own_slices: true,
                max_counter_sets_per_slice: 8,
                max_counters_per_set: 32,
                max_shared_counters_per_slice: 8 * 32,
                max_counters_per_device: 32,
                max_consumptions_per_slice: None,
                max_taints_per_device: 16,
                taint_effect_none: true,
            },
        }
    }

    /// What one GPU's devices and counter set must fit in under these rules.
    pub fn group_limits(self) -> GroupLimits {
        let l = self.limits();
        if l.counters_in_own_slices {
            GroupLimits {
                max_counters_per_set: l.max_counters_per_set,
                max_counters_per_device: l.max_counters_per_device,
                max_devices_per_group: None,
                max_consumptions_per_group: None,
            }
        } else {
            GroupLimits {
                max_counters_per_set: l.max_counters_per_set.min(l.max_shared_counters_per_slice),
                max_counters_per_device: l.max_counters_per_device,
                max_devices_per_group: Some(l.max_devices_with_counters),
                max_consumptions_per_group: l.max_consumptions_per_slice,
            }
        }
    }

    /// The rules of an API server reporting `major`.`minor` (`/version`; the
    /// minor may carry a suffix such as `35+`). `None` when unreadable.
    pub fn for_server_version(major: &str, minor: &str) -> Option<Self> {
        let digits = |s: &str| -> Option<u32> {
            let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
            s[..end].parse().ok()
        };
        let (major, minor) = (digits(major)?, digits(minor)?);
        Some(if (major, minor) >= (1, 35) {
            Self::V1_35
        } else {
            Self::V1_34
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        flags: Flags,
    }

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        Cli::try_parse_from(std::iter::once("plugin").chain(args.iter().copied())).map(|c| c.flags)
    }

    #[test]
    fn flag_defaults_and_values() {
        assert_eq!(parse(&[]).unwrap(), Flags::default());
        let f = parse(&[
            "--dynamic-mig",
            "--slice-rules",
            "1.34",
            "--delete-slices-on-exit",
        ])
        .unwrap();
        assert!(f.dynamic_mig && f.delete_slices_on_exit);
        assert_eq!(f.slice_rules.fixed(), Some(SliceRules::V1_34));
        let f = parse(&["--dynamic-mig=false", "--slice-rules=1.35"]).unwrap();
        assert!(!f.dynamic_mig);
        assert_eq!(f.slice_rules.fixed(), Some(SliceRules::V1_35));
        assert_eq!(
            parse(&["--slice-rules=auto"]).unwrap().slice_rules.fixed(),
            None
        );
    }

    #[test]
    fn bad_flag_values_are_refused() {
        for args in [
            &["--slice-rules", "1.33"][..],
            &["--slice-rules", ""],
            &["--dynamic-mig=maybe"],
            &["--delete-slices-on-exit=2"],
        ] {
            let err = parse(args).unwrap_err();
            assert!(
                matches!(
                    err.kind(),
                    clap::error::ErrorKind::InvalidValue | clap::error::ErrorKind::ValueValidation
                ),
                "{args:?}: {err}"
            );
            assert!(err.to_string().contains("value"), "{err}");
        }
    }

    #[test]
    fn memory_sharing_flag() {
        assert_eq!(parse(&[]).unwrap().memory_sharing, MemorySharing::None);
        assert_eq!(
            parse(&["--memory-sharing", "all"]).unwrap().memory_sharing,
            MemorySharing::All
        );
        let f = parse(&[
            "--memory-sharing=0,GPU-6513270e-269e-4d37-b2a7-4de452e6b438",
            "--dynamic-mig",
        ])
        .unwrap();
        assert_eq!(
            f.memory_sharing.to_string(),
            "0,GPU-6513270e-269e-4d37-b2a7-4de452e6b438"
        );
        assert!(f.dynamic_mig);
        for (value, expect) in [
            ("0,,1", "entry 2 is empty"),
            ("gpu0", "\"gpu0\" is neither a GPU index nor a GPU UUID"),
            ("", "empty"),
        ] {
            let err = parse(&["--memory-sharing", value]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{err}");
            let text = err.to_string();
            assert!(
                text.contains("--memory-sharing") && text.contains(expect),
                "{value:?}: {text}"
            );
        }
    }

    #[test]
    fn consumable_shares_flag() {
        assert_eq!(
            parse(&[]).unwrap().consumable_shares,
            ConsumableShares::Disabled
        );
        for (value, want) in [
            ("disabled", ConsumableShares::Disabled),
            ("memory", ConsumableShares::Memory),
            ("unlimited", ConsumableShares::Unlimited),
            ("8", ConsumableShares::Shares(8)),
        ] {
            let f = parse(&[&format!("--consumable-shares={value}")]).unwrap();
            assert_eq!(f.consumable_shares, want);
        }
        for (args, expect) in [
            (
                &["--consumable-shares=0"][..],
                "0 shares would allow no claim",
            ),
            (&["--consumable-shares=-1"], "\"-1\": expected disabled"),
            (&["--consumable-shares", "-1"], "unexpected argument '-1'"),
            (&["--consumable-shares=4294967296"], "at most 65536 shares"),
            (&["--consumable-shares=Memory"], "the modes are lowercase"),
            (&["--consumable-shares="], "empty; expected disabled"),
            (&["--consumable-shares=all"], "\"all\": expected disabled"),
            (
                &["--consumable-shares=memory", "--memory-sharing=all"],
                "cannot be used with",
            ),
        ] {
            let err = parse(args).unwrap_err();
            let line = gpu_dra_cmdline::one_line_error(&err);
            assert!(!line.contains('\n'), "{line}");
            assert!(line.contains(expect), "{args:?}: {line}");
        }
    }

    #[test]
    fn rules_by_server_version() {
        assert_eq!(
            SliceRules::for_server_version("1", "34"),
            Some(SliceRules::V1_34)
        );
        assert_eq!(
            SliceRules::for_server_version("1", "35"),
            Some(SliceRules::V1_35)
        );
        assert_eq!(
            SliceRules::for_server_version("1", "37+"),
            Some(SliceRules::V1_35)
        );
        assert_eq!(
            SliceRules::for_server_version("2", "0"),
            Some(SliceRules::V1_35)
        );
        assert_eq!(SliceRules::for_server_version("1", ""), None);
        assert_eq!(SliceRules::for_server_version("x", "35"), None);
    }

    #[test]
    fn group_limits_follow_the_rules() {
        let g = SliceRules::V1_34.group_limits();
        assert_eq!(g.max_devices_per_group, Some(128));
        assert_eq!(g.max_consumptions_per_group, Some(1024));
        let g = SliceRules::V1_35.group_limits();
        assert_eq!(g.max_devices_per_group, None);
        assert_eq!(g.max_counters_per_set, 32);
    }
}
