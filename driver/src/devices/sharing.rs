//! Memory-fraction sharing: which GPUs are shared (`--memory-sharing`), and
//! the request policy of a shared GPU's `memory` capacity.
//!
//! A shared GPU is published as its full-GPU device only, with
//! `allowMultipleAllocations: true`, so several claims can be allocated to
//! it, each consuming part of its memory (`capacity.requests.memory`). The
//! request policy rounds what a claim asks for up to a multiple of 256 MiB
//! (at least 256 MiB, at most the GPU's memory rounded down to 256 MiB); a
//! claim that names no memory consumes 1 GiB. Kubernetes' rules for a
//! `validRange` (`resource.k8s.io/v1` `CapacityRequestPolicyRange`): `min`
//! and `max` at most the capacity, `default` between them, `max` and
//! `default` multiples of `step`, `min + step` at most the capacity; these
//! values meet them for every GPU with at least 1 GiB.

use std::fmt;
use std::str::FromStr;

use gpu_nvml::GpuInfo;

/// One MiB.
const MIB: u64 = 1 << 20;
/// Granularity (and minimum) of a memory share: 256 MiB.
pub const SHARE_STEP_BYTES: u64 = 256 * MIB;
/// What a claim that names no memory consumes: 1 GiB.
pub const SHARE_DEFAULT_BYTES: u64 = 1024 * MIB;
/// The most GPUs `--memory-sharing` may list.
pub const MAX_SELECTORS: usize = 256;

/// Which GPUs are shared by memory fraction.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MemorySharing {
    /// None (the default).
    #[default]
    None,
    /// Every GPU.
    All,
    /// These GPUs (in the order given, no duplicates).
    Gpus(Vec<GpuSelector>),
}

/// A GPU named in `--memory-sharing`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSelector {
    /// By NVML index.
    Index(u32),
    /// By `GPU-...` UUID (compared case-insensitively).
    Uuid(String),
}

impl fmt::Display for GpuSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Index(i) => write!(f, "{i}"),
            Self::Uuid(u) => f.write_str(u),
        }
    }
}

impl GpuSelector {
    /// Whether this selector names `gpu`.
    pub fn matches(&self, gpu: &GpuInfo) -> bool {
        match self {
            Self::Index(i) => gpu.index == *i,
            Self::Uuid(u) => gpu.uuid.eq_ignore_ascii_case(u),
        }
    }
}

impl MemorySharing {
    /// Whether `gpu` is to be shared.
    pub fn selects(&self, gpu: &GpuInfo) -> bool {
        match self {
            Self::None => false,
            Self::All => true,
            Self::Gpus(list) => list.iter().any(|s| s.matches(gpu)),
        }
    }

    /// The selectors that name none of `gpus`.
    pub fn unmatched<'a>(&'a self, gpus: &[&GpuInfo]) -> Vec<&'a GpuSelector> {
        match self {
            Self::None | Self::All => Vec::new(),
            Self::Gpus(list) => list
                .iter()
                .filter(|s| !gpus.iter().any(|g| s.matches(g)))
                .collect(),
        }
    }
}

impl fmt::Display for MemorySharing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::All => f.write_str("all"),
            Self::Gpus(list) => {
                for (i, s) in list.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{s}")?;
                }
                Ok(())
            }
        }
    }
}

/// Why a `--memory-sharing` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(String);

/// How an entry is shown in messages: at most 64 characters, escaped.
fn shown(entry: &str) -> String {
    shown_cut(entry, 64)
}

/// How a value is shown in messages: at most `max` characters, escaped,
/// `...` after a cut.
pub(super) fn shown_cut(entry: &str, max: usize) -> String {
    let cut: String = entry.chars().take(max).collect();
    if cut.len() < entry.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

/// Whether `s` is a GPU UUID: `GPU-` and 8-4-4-4-12 hex digits.
fn is_gpu_uuid(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("GPU-").or_else(|| s.strip_prefix("gpu-")) else {
        return false;
    };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl FromStr for MemorySharing {
    type Err = ParseError;

    /// `none`, `all`, or a comma-separated list of GPU indexes and `GPU-...`
    /// UUIDs (spaces around entries allowed).
    fn from_str(value: &str) -> Result<Self, ParseError> {
        let fail = |m: String| Err(ParseError(m));
        let trimmed = value.trim();
        if trimmed.is_empty() {
            return fail(
                "empty; expected none, all, or a comma-separated list of GPU indexes or UUIDs"
                    .into(),
            );
        }
        if trimmed.eq_ignore_ascii_case("none") {
            return Ok(Self::None);
        }
        if trimmed.eq_ignore_ascii_case("all") {
            return Ok(Self::All);
        }
        let entries: Vec<&str> = trimmed.split(',').map(str::trim).collect();
        if entries.len() > MAX_SELECTORS {
            return fail(format!(
                "{} entries; at most {MAX_SELECTORS} GPUs can be listed (use all for every GPU)",
                entries.len()
            ));
        }
        let mut list: Vec<GpuSelector> = Vec::with_capacity(entries.len());
        for (n, entry) in entries.iter().enumerate() {
            let position = n + 1;
            let selector = if entry.is_empty() {
                return fail(format!("entry {position} is empty"));
            } else if entry.eq_ignore_ascii_case("none") || entry.eq_ignore_ascii_case("all") {
                return fail(format!(
                    "{entry} cannot be combined with other entries (entry {position})"
                ));
            } else if entry.bytes().all(|b| b.is_ascii_digit()) {
                match entry.parse::<u32>() {
                    Ok(i) => GpuSelector::Index(i),
                    Err(_) => {
                        return fail(format!(
                            "entry {position}: GPU index {} is out of range",
                            shown(entry)
                        ));
                    }
                }
            } else if is_gpu_uuid(entry) {
                GpuSelector::Uuid((*entry).to_owned())
            } else if entry
                .get(..4)
                .is_some_and(|p| p.eq_ignore_ascii_case("MIG-"))
            {
                return fail(format!(
                    "entry {position}: {} is a MIG device; memory sharing applies to whole GPUs \
                     (name the parent GPU)",
                    shown(entry)
                ));
            } else {
                return fail(format!(
                    "entry {position}: {} is neither a GPU index nor a GPU UUID \
                     (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                    shown(entry)
                ));
            };
            if list.iter().any(|s| same(s, &selector)) {
                return fail(format!(
                    "entry {position}: GPU {} is listed twice",
                    shown(entry)
                ));
            }
            list.push(selector);
        }
        Ok(Self::Gpus(list))
    }
}

fn same(a: &GpuSelector, b: &GpuSelector) -> bool {
    match (a, b) {
        (GpuSelector::Index(x), GpuSelector::Index(y)) => x == y,
        (GpuSelector::Uuid(x), GpuSelector::Uuid(y)) => x.eq_ignore_ascii_case(y),
        _ => false,
    }
}

/// How a device shared by several claims is published and prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedDevice {
    /// The request policy of its `memory` capacity.
    pub memory: MemoryRequestPolicy,
    /// Its `shares` capacity (`--consumable-shares=<N>`): each claim
    /// consumes 1 unless it asks for more.
    pub shares: Option<u32>,
    /// Whether prepare enforces each claim's memory with MPS per-client
    /// limits (`--memory-sharing`, `--consumable-shares=memory` on full
    /// GPUs); otherwise the claims are only counted by the scheduler.
    pub enforced: bool,
}

impl SharedDevice {
    /// A share of `--memory-sharing`: its own policy, enforced.
    pub fn memory_fraction(memory: MemoryRequestPolicy) -> Self {
        Self {
            memory,
            shares: None,
            enforced: true,
        }
    }
}

/// The request policy of a shared GPU's `memory` capacity, in bytes: a
/// `validRange` from `min` to `max` in steps of `step`, and the `default`
/// consumed by claims that name no memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryRequestPolicy {
    /// Consumed when a claim does not name memory.
    pub default_bytes: u64,
    /// The smallest share.
    pub min_bytes: u64,
    /// Shares are `min + n * step`.
    pub step_bytes: u64,
    /// The largest share.
    pub max_bytes: u64,
}

impl MemoryRequestPolicy {
    /// The policy of a GPU with `memory_bytes` of memory; `Err` with the
    /// reason when the GPU is too small to share (under 1 GiB).
    pub fn for_memory(memory_bytes: u64) -> Result<Self, String> {
        let max_bytes = memory_bytes / SHARE_STEP_BYTES * SHARE_STEP_BYTES;
        if max_bytes < SHARE_DEFAULT_BYTES {
            return Err(format!(
                "{} MiB of memory is less than the {} MiB a share takes by default",
                memory_bytes / MIB,
                SHARE_DEFAULT_BYTES / MIB
            ));
        }
        Ok(Self {
            default_bytes: SHARE_DEFAULT_BYTES,
            min_bytes: SHARE_STEP_BYTES,
            step_bytes: SHARE_STEP_BYTES,
            max_bytes,
        })
    }

    /// Whether the policy meets Kubernetes' `validRange` rules for a
    /// capacity of `capacity_bytes`.
    pub fn is_valid_for(&self, capacity_bytes: u64) -> bool {
        let on_step =
            |v: u64| v >= self.min_bytes && (v - self.min_bytes).is_multiple_of(self.step_bytes);
        self.step_bytes > 0
            && self.min_bytes <= self.max_bytes
            && self.max_bytes <= capacity_bytes
            && self.min_bytes + self.step_bytes <= capacity_bytes
            && (self.min_bytes..=self.max_bytes).contains(&self.default_bytes)
            && self.max_bytes.is_multiple_of(self.step_bytes)
            && self.default_bytes.is_multiple_of(self.step_bytes)
            && on_step(self.max_bytes)
            && on_step(self.default_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<MemorySharing, String> {
        s.parse::<MemorySharing>().map_err(|e| e.to_string())
    }

    const UUID: &str = "GPU-6513270e-269e-4d37-b2a7-4de452e6b438";

    #[test]
    fn values_parse_and_print_back() {
        assert_eq!(parse("none"), Ok(MemorySharing::None));
        assert_eq!(parse(" NONE "), Ok(MemorySharing::None));
        assert_eq!(parse("all"), Ok(MemorySharing::All));
        assert_eq!(parse("All"), Ok(MemorySharing::All));
        let list = parse(&format!("0, 3 ,{UUID},12")).unwrap();
        assert_eq!(
            list,
            MemorySharing::Gpus(vec![
                GpuSelector::Index(0),
                GpuSelector::Index(3),
                GpuSelector::Uuid(UUID.into()),
                GpuSelector::Index(12),
            ])
        );
        assert_eq!(list.to_string(), format!("0,3,{UUID},12"));
        assert_eq!(parse(&list.to_string()), Ok(list));
        assert_eq!(parse("7").unwrap().to_string(), "7");
        assert_eq!(MemorySharing::default().to_string(), "none");
    }

    #[test]
    fn garbage_is_refused_precisely() {
        for (value, expect) in [
            ("", "empty; expected none, all, or a comma-separated list"),
            ("  ", "empty"),
            ("0,,1", "entry 2 is empty"),
            ("0,", "entry 2 is empty"),
            (
                "all,0",
                "all cannot be combined with other entries (entry 1)",
            ),
            (
                "0,none",
                "none cannot be combined with other entries (entry 2)",
            ),
            (
                "4294967296",
                "entry 1: GPU index \"4294967296\" is out of range",
            ),
            (
                "-1",
                "entry 1: \"-1\" is neither a GPU index nor a GPU UUID",
            ),
            ("+1", "neither a GPU index nor a GPU UUID"),
            ("1.5", "neither a GPU index nor a GPU UUID"),
            ("gpu0", "entry 1: \"gpu0\" is neither"),
            (
                "GPU-6513270e-269e-4d37-b2a7",
                "is neither a GPU index nor a GPU UUID",
            ),
            ("GPU-6513270e-269e-4d37-b2a7-4de452e6b43g", "is neither"),
            (
                "MIG-6513270e-269e-4d37-b2a7-4de452e6b438",
                "is a MIG device; memory sharing applies to whole GPUs",
            ),
            ("1,2,1", "entry 3: GPU \"1\" is listed twice"),
            (&format!("{UUID},{}", UUID.to_uppercase()), "entry 2: GPU"),
            ("0\n1", "is neither"),
            ("\u{0}", "\"\\0\" is neither"),
        ] {
            let err = parse(value).expect_err(value);
            assert!(err.contains(expect), "{value:?}: {err}");
            assert!(!err.contains('\n'), "one line: {err:?}");
        }
        // Long garbage is cut in the message.
        let err = parse(&"x".repeat(10_000)).unwrap_err();
        assert!(err.len() < 200, "{}", err.len());
        // Too many entries.
        let many: Vec<String> = (0..300).map(|i| i.to_string()).collect();
        let err = parse(&many.join(",")).unwrap_err();
        assert!(err.contains("300 entries; at most 256"), "{err}");
    }

    fn gpu(index: u32, uuid: &str) -> GpuInfo {
        let mut g =
            crate::devices::fixtures::gpu(index, crate::devices::fixtures::HOPPER, None, &[]).info;
        g.uuid = uuid.into();
        g
    }

    #[test]
    fn selection_by_index_and_uuid() {
        let a = gpu(0, UUID);
        let b = gpu(1, "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd");
        let sharing = parse(&format!("{},5", UUID.to_uppercase())).unwrap();
        assert!(sharing.selects(&a) && !sharing.selects(&b));
        assert_eq!(
            sharing
                .unmatched(&[&a, &b])
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["5"]
        );
        let sharing = parse("1").unwrap();
        assert!(!sharing.selects(&a) && sharing.selects(&b));
        assert!(MemorySharing::All.selects(&a));
        assert!(!MemorySharing::None.selects(&b));
        assert!(MemorySharing::All.unmatched(&[]).is_empty());
    }

    #[test]
    fn policies_meet_the_api_rules() {
        for mib in [1024, 1025, 15_360, 23_034, 40_960, 81_559, 143_771, 1 << 30] {
            let bytes = mib * MIB;
            let p = MemoryRequestPolicy::for_memory(bytes).unwrap();
            assert!(p.is_valid_for(bytes), "{mib} MiB: {p:?}");
            assert!(p.max_bytes <= bytes && bytes - p.max_bytes < SHARE_STEP_BYTES);
            assert_eq!(
                (p.default_bytes, p.min_bytes, p.step_bytes),
                (1 << 30, 256 * MIB, 256 * MIB)
            );
        }
        // H100: 81559 MiB rounds down to 81408 MiB.
        assert_eq!(
            MemoryRequestPolicy::for_memory(81_559 * MIB)
                .unwrap()
                .max_bytes,
            81_408 * MIB
        );
        for mib in [0, 255, 1023] {
            let err = MemoryRequestPolicy::for_memory(mib * MIB).unwrap_err();
            assert!(err.contains("less than the 1024 MiB"), "{err}");
        }
        // The checker itself catches each broken rule.
        let good = MemoryRequestPolicy::for_memory(4096 * MIB).unwrap();
        for bad in [
            MemoryRequestPolicy {
                max_bytes: 4097 * MIB,
                ..good
            },
            MemoryRequestPolicy {
                max_bytes: 4352 * MIB,
                ..good
            },
            MemoryRequestPolicy {
                default_bytes: 100 * MIB,
                ..good
            },
            MemoryRequestPolicy {
                default_bytes: 1000 * MIB,
                ..good
            },
            MemoryRequestPolicy {
                min_bytes: 8192 * MIB,
                ..good
            },
            MemoryRequestPolicy {
                step_bytes: 0,
                ..good
            },
        ] {
            assert!(!bad.is_valid_for(4096 * MIB), "{bad:?}");
        }
    }
}
