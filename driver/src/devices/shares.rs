//! Consumable shares with NVIDIA's names (`--consumable-shares`, NVIDIA's
//! `ConsumableShares`): the mode, parsed from the flag, and what each mode
//! publishes on a shareable device.
//!
//! Any mode but `disabled` publishes full GPUs and MIG devices with
//! `allowMultipleAllocations: true` and a request policy on their `memory`
//! capacity: steps of 1Mi, from 1Mi (`memory` mode) or 0 (the others) up to
//! the device's memory; a claim that names no memory consumes all of it in
//! `memory` mode and none in `unlimited` and `<N>` modes. `<N>` also
//! publishes a capacity `shares` of N, of which a claim consumes 1 unless it
//! asks for more. The values are NVIDIA's, so claims written for its driver
//! allocate the same way.
//!
//! What is enforced (docs/sharing.md, "Consumable shares"): `memory` mode is
//! this driver's memory-fraction sharing, so a full GPU's claims get MPS
//! per-client limits from the memory they consumed; `unlimited` and `<N>`
//! only count, as in NVIDIA's driver.

use std::fmt;
use std::str::FromStr;

use super::sharing::{MemoryRequestPolicy, shown_cut};

/// One MiB, the step of NVIDIA's memory request policy.
const MIB: u64 = 1 << 20;
/// The most shares `<N>` may publish per device.
pub const MAX_SHARES: u32 = 65_536;

/// The `--consumable-shares` mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConsumableShares {
    /// Devices are allocated whole (the default).
    #[default]
    Disabled,
    /// Claims share a device by memory; enforced with MPS limits on full GPUs.
    Memory,
    /// Claims share a device without a limit on how many (memory
    /// requests still add up to at most the device's memory).
    Unlimited,
    /// Claims share a device, at most this many (each takes one `shares`
    /// unless it asks for more).
    Shares(u32),
}

impl ConsumableShares {
    /// Whether devices are published for several claims at once.
    pub fn enabled(self) -> bool {
        self != Self::Disabled
    }

    /// Whether prepare enforces each claim's memory share with MPS limits.
    pub fn enforces_memory(self) -> bool {
        self == Self::Memory
    }

    /// The `shares` capacity a device publishes, if any.
    pub fn shares(self) -> Option<u32> {
        match self {
            Self::Shares(n) => Some(n),
            _ => None,
        }
    }

    /// The request policy of the `memory` capacity of a device with
    /// `memory_bytes` of memory; `None` when disabled or when the device has
    /// less than 2 MiB (Kubernetes wants `min + step` within the capacity).
    pub fn memory_policy(self, memory_bytes: u64) -> Option<MemoryRequestPolicy> {
        let max_bytes = memory_bytes / MIB * MIB;
        let (min_bytes, default_bytes) = match self {
            Self::Disabled => return None,
            Self::Memory => (MIB, max_bytes),
            Self::Unlimited | Self::Shares(_) => (0, 0),
        };
        let policy = MemoryRequestPolicy {
            default_bytes,
            min_bytes,
            step_bytes: MIB,
            max_bytes,
        };
        (max_bytes >= 2 * MIB && policy.is_valid_for(memory_bytes)).then_some(policy)
    }
}

impl fmt::Display for ConsumableShares {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disabled => f.write_str("disabled"),
            Self::Memory => f.write_str("memory"),
            Self::Unlimited => f.write_str("unlimited"),
            Self::Shares(n) => write!(f, "{n}"),
        }
    }
}

/// Why a `--consumable-shares` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(String);

const EXPECTED: &str =
    "expected disabled, memory, unlimited, or a number of shares from 1 to 65536";

impl FromStr for ConsumableShares {
    type Err = ParseError;

    /// NVIDIA's values, exactly: `disabled`, `memory`, `unlimited`, or a
    /// decimal number of shares (1 to [`MAX_SHARES`]).
    fn from_str(value: &str) -> Result<Self, ParseError> {
        let fail = |m: String| Err(ParseError(m));
        match value {
            "disabled" => return Ok(Self::Disabled),
            "memory" => return Ok(Self::Memory),
            "unlimited" => return Ok(Self::Unlimited),
            "" => return fail(format!("empty; {EXPECTED}")),
            _ => {}
        }
        let shown = shown_cut(value, 32);
        if value.bytes().all(|b| b.is_ascii_digit()) {
            return match value.trim_start_matches('0').parse::<u32>() {
                Ok(n) if (1..=MAX_SHARES).contains(&n) => Ok(Self::Shares(n)),
                Ok(0) | Err(_) if value.bytes().all(|b| b == b'0') => fail(format!(
                    "{shown}: 0 shares would allow no claim; use disabled to allocate devices whole"
                )),
                _ => fail(format!("{shown}: at most {MAX_SHARES} shares per device")),
            };
        }
        let lower = value.to_ascii_lowercase();
        if ["disabled", "memory", "unlimited"].contains(&lower.trim()) {
            return fail(format!(
                "{shown}: the modes are lowercase, without spaces ({})",
                lower.trim()
            ));
        }
        fail(format!("{shown}: {EXPECTED}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ConsumableShares, String> {
        s.parse::<ConsumableShares>().map_err(|e| e.to_string())
    }

    #[test]
    fn nvidia_values_parse_and_print_back() {
        for (value, want) in [
            ("disabled", ConsumableShares::Disabled),
            ("memory", ConsumableShares::Memory),
            ("unlimited", ConsumableShares::Unlimited),
            ("1", ConsumableShares::Shares(1)),
            ("4", ConsumableShares::Shares(4)),
            ("65536", ConsumableShares::Shares(MAX_SHARES)),
        ] {
            assert_eq!(parse(value), Ok(want), "{value}");
            assert_eq!(want.to_string(), value);
        }
        assert_eq!(parse("007"), Ok(ConsumableShares::Shares(7)));
        assert_eq!(ConsumableShares::default(), ConsumableShares::Disabled);
        assert!(!ConsumableShares::Disabled.enabled());
        assert!(ConsumableShares::Shares(2).enabled());
        assert!(ConsumableShares::Memory.enforces_memory());
        assert!(!ConsumableShares::Unlimited.enforces_memory());
        assert_eq!(ConsumableShares::Shares(3).shares(), Some(3));
        assert_eq!(ConsumableShares::Memory.shares(), None);
    }

    #[test]
    fn hostile_values_get_one_line_errors() {
        for (value, expect) in [
            ("", "empty; expected disabled, memory, unlimited"),
            ("0", "\"0\": 0 shares would allow no claim; use disabled"),
            ("000", "0 shares would allow no claim"),
            ("-1", "\"-1\": expected disabled, memory, unlimited"),
            ("+3", "\"+3\": expected"),
            ("65537", "\"65537\": at most 65536 shares per device"),
            (
                "99999999999999999999999999",
                "at most 65536 shares per device",
            ),
            (
                "Memory",
                "\"Memory\": the modes are lowercase, without spaces (memory)",
            ),
            ("UNLIMITED", "lowercase"),
            (" memory", "lowercase, without spaces (memory)"),
            ("memory\n", "lowercase"),
            ("1.5", "\"1.5\": expected"),
            ("1e3", "expected"),
            ("4 ", "\"4 \": expected"),
            ("true", "expected disabled"),
            ("\u{0}", "\"\\0\": expected"),
            ("١", "expected"),
        ] {
            let err = parse(value).expect_err(value);
            assert!(err.contains(expect), "{value:?}: {err}");
            assert!(!err.contains('\n'), "one line: {err:?}");
        }
        let err = parse(&"x".repeat(100_000)).unwrap_err();
        assert!(err.len() < 200, "cut: {}", err.len());
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn memory_policies_are_nvidias_and_valid() {
        let h100 = 81_559 * MIB;
        let p = ConsumableShares::Memory.memory_policy(h100).unwrap();
        assert_eq!(
            (p.min_bytes, p.step_bytes, p.max_bytes, p.default_bytes),
            (MIB, MIB, h100, h100)
        );
        for mode in [ConsumableShares::Unlimited, ConsumableShares::Shares(4)] {
            let p = mode.memory_policy(h100).unwrap();
            assert_eq!(
                (p.min_bytes, p.step_bytes, p.max_bytes, p.default_bytes),
                (0, MIB, h100, 0),
                "{mode}"
            );
        }
        assert_eq!(ConsumableShares::Disabled.memory_policy(h100), None);
        // Memory that is not a whole number of MiB: max and default round down.
        let odd = 10 * GIB + 12_345;
        let p = ConsumableShares::Memory.memory_policy(odd).unwrap();
        assert_eq!((p.max_bytes, p.default_bytes), (10 * GIB, 10 * GIB));
        for mode in [
            ConsumableShares::Memory,
            ConsumableShares::Unlimited,
            ConsumableShares::Shares(1),
        ] {
            for bytes in [2 * MIB, 4864 * MIB, odd, h100, 1 << 50] {
                let p = mode.memory_policy(bytes).unwrap();
                assert!(p.is_valid_for(bytes), "{mode} {bytes}: {p:?}");
            }
            // Too small to share under Kubernetes' rules.
            assert_eq!(mode.memory_policy(MIB), None, "{mode}");
            assert_eq!(mode.memory_policy(0), None, "{mode}");
        }
    }
}
