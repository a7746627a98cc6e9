//! The health policy (from the flags) and what one XID or recovery action
//! means under it: the classification of issue #43 and health.md §8.2.
//!
//! An XID is **fatal** (its `gpu.nvidia.com/xid=<n>` taint is `NoSchedule`)
//! or **informational** (`None`), decided in this order:
//! 1. `--xids-fatal` names it: fatal (fatal wins over ignore, as in
//!    NVIDIA's device plugin);
//! 2. NVIDIA's default ignore list (13, 31, 43, 45, 68, 109) or
//!    `--additional-xids-to-ignore` names it: informational;
//! 3. the driver reports a recovery action (R565+): `NONE`,
//!    `RECOVER_IMEX_DOMAIN` and `DRAIN_P2P` are informational for the XID
//!    (`DRAIN_P2P` raises `degraded=p2p` on the GPU by itself), any other
//!    action is fatal;
//! 4. no recovery action known (older drivers, a failed query): the built-in
//!    table of NVIDIA's XID catalog (health.md §6): `RESTART_APP` and
//!    `IGNORE` classes, 45 and the NVLink workflows (74, 144–150) are
//!    informational, everything else is fatal. Unlike NVIDIA's main, a
//!    failed query does not make every XID fatal.
//!
//! Besides its own taint, an XID can imply a condition of the whole GPU
//! ([`Implied`]): 79 always means the GPU is lost, 74 and 144–150 a degraded
//! NVLink; without a recovery action the catalog's reset and reboot classes
//! imply `reset-required` / `reboot-required` (with a recovery action, the
//! action itself raises those).

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpu_dra_api::health as health_keys;
use gpu_nvml::health::RecoveryAction;
use k8s_openapi::jiff::Timestamp;

/// NVIDIA's built-in list of XIDs whose taint has effect `None`
/// ("application errors"; `xidsToSkip` of their DRA driver up to v0.5.0).
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// The most XIDs a list flag may name.
pub const MAX_XIDS: usize = 1024;

/// The short taint key names `--health-evict` accepts: the keys of
/// [`gpu_dra_api::health::KEYS`] whose taints can have effect `NoSchedule`
/// (the others only ever have effect `None` and are rejected with their
/// own message).
pub fn evictable_keys() -> impl Iterator<Item = &'static str> {
    health_keys::KEYS
        .iter()
        .filter(|k| k.default_effect != "None")
        .map(|k| k.name)
}

/// A malformed flag value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// An entry of an XID list is not a decimal number.
    #[error("XID list entry {position} ({entry:?}) is not a decimal number")]
    NotANumber {
        /// 1-based position in the list.
        position: usize,
        /// The entry, cut to 32 characters.
        entry: String,
    },
    /// An entry of an XID list is zero or too big.
    #[error("XID list entry {position} ({entry}) is out of range: XIDs are 1 to {max}")]
    OutOfRange {
        /// 1-based position in the list.
        position: usize,
        /// The entry.
        entry: String,
        /// The largest XID accepted.
        max: u64,
    },
    /// An empty entry between commas.
    #[error("XID list entry {position} is empty (two commas in a row, or a comma at an end)")]
    EmptyEntry {
        /// 1-based position in the list.
        position: usize,
    },
    /// Too many entries.
    #[error("XID list has more than {max} entries")]
    TooMany {
        /// The limit.
        max: usize,
    },
    /// `--health-evict` names a key it does not know.
    #[error("unknown health taint key {key:?}: --health-evict takes {known}")]
    UnknownKey {
        /// The entry, cut to 64 characters.
        key: String,
        /// The accepted names.
        known: String,
    },
    /// `--health-evict` names a key whose taints never block scheduling.
    #[error("health taint key {key:?} only has effect None and cannot evict")]
    InformationalKey {
        /// The key.
        key: String,
    },
    /// `--health-evict` has an empty entry.
    #[error("--health-evict entry {position} is empty")]
    EmptyKey {
        /// 1-based position in the list.
        position: usize,
    },
}

/// The XIDs `--xids-fatal` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XidSet {
    /// `all`: every XID is fatal.
    All,
    /// These (empty: none, the default).
    Some(BTreeSet<u64>),
}

impl Default for XidSet {
    fn default() -> Self {
        Self::Some(BTreeSet::new())
    }
}

impl XidSet {
    /// Whether `xid` is in the set.
    pub fn contains(&self, xid: u64) -> bool {
        match self {
            Self::All => true,
            Self::Some(set) => set.contains(&xid),
        }
    }
}

/// How the monitor judges and reports what it sees (from the flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// `--additional-xids-to-ignore`: added to [`DEFAULT_IGNORED_XIDS`].
    pub ignored_xids: BTreeSet<u64>,
    /// `--xids-fatal`: always fatal; wins over the ignore lists.
    pub fatal_xids: XidSet,
    /// `--health-evict`: short key names (`gpu-lost`, `xid`, ...) whose
    /// `NoSchedule` taints become `NoExecute`. Never applies to `None` taints.
    pub evict: BTreeSet<String>,
    /// A GPU that needed a reset, reboot or was lost counts as recovered
    /// after this long without anything new (and its checks passing).
    pub quiet: Duration,
    /// Informational `xid` and `degraded` conditions expire this long after
    /// they were last seen.
    pub info_ttl: Duration,
    /// This many informational XIDs within [`Policy::escalate_window`] on one
    /// device raise `degraded=xid-rate`; 0 turns escalation off.
    pub escalate_after: u32,
    /// The window of [`Policy::escalate_after`].
    pub escalate_window: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            ignored_xids: BTreeSet::new(),
            fatal_xids: XidSet::default(),
            evict: BTreeSet::new(),
            quiet: Duration::from_secs(60),
            info_ttl: Duration::from_secs(3600),
            escalate_after: 5,
            escalate_window: Duration::from_secs(600),
        }
    }
}

impl Policy {
    /// Whether `xid` is on NVIDIA's default list or the admin's ignore list.
    pub fn ignores(&self, xid: u64) -> bool {
        DEFAULT_IGNORED_XIDS.contains(&xid) || self.ignored_xids.contains(&xid)
    }

    /// Whether NoSchedule taints of `short_key` become NoExecute.
    pub fn evicts(&self, short_key: &str) -> bool {
        self.evict.contains(short_key)
    }
}

/// A GPU-wide condition an XID implies besides its own taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Implied {
    /// `reset-required` with this recovery action name (`GPU_RESET`).
    Reset(String),
    /// `reboot-required`.
    Reboot,
    /// `gpu-lost`.
    Lost,
    /// `degraded=nvlink`.
    Nvlink,
}

/// The verdict on one XID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidVerdict {
    /// `NoSchedule` (true) or `None` taint.
    pub fatal: bool,
    /// Why, for the message (`ignored`, `recovery action NONE`, `catalog`).
    pub why: &'static str,
    /// What it implies for the whole GPU.
    pub implied: Option<Implied>,
}

/// The catalog class of an XID (health.md §6), for drivers without a
/// recovery action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatalogClass {
    /// `RESTART_APP`: the application failed, the GPU is fine.
    RestartApp,
    /// `IGNORE`: informational.
    Ignore,
    /// 45 (`WORKFLOW_XID_45`): secondary.
    Secondary,
    /// `RESET_GPU` and `WORKFLOW_XID_48`.
    ResetGpu,
    /// 79 `RESTART_BM`: fallen off the bus.
    Lost,
    /// 151 `RESTART_VM`.
    Reboot,
    /// 74 and 144–150: NVLink workflows.
    Nvlink,
    /// Anything else (54, 78, 159, 162–172, unknown numbers).
    Other,
}

/// The class of `xid` in NVIDIA's XID catalog, from the catalog's
/// immediate action ([`gpu_dra_api::health::xid_action`], the one copy of
/// the table the plugin and `gpu-dra health` share).
pub fn catalog_class(xid: u64) -> CatalogClass {
    match gpu_dra_api::health::xid_action(xid) {
        Some("RESTART_APP") => CatalogClass::RestartApp,
        Some("IGNORE") => CatalogClass::Ignore,
        Some("WORKFLOW_XID_45") => CatalogClass::Secondary,
        Some("RESET_GPU" | "WORKFLOW_XID_48") => CatalogClass::ResetGpu,
        Some("RESTART_BM") => CatalogClass::Lost,
        Some("RESTART_VM") => CatalogClass::Reboot,
        Some("WORKFLOW_NVLINK_ERR" | "WORKFLOW_NVLINK5_ERR") => CatalogClass::Nvlink,
        _ => CatalogClass::Other,
    }
}

/// What a recovery action means for the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionClass {
    /// Nothing to do (`NONE`, `RECOVER_IMEX_DOMAIN`).
    Fine,
    /// `DRAIN_P2P`: peer-to-peer traffic must drain; the GPU still runs
    /// other work: `degraded=p2p` (`None`).
    DrainP2p,
    /// `reset-required=<name>`.
    Reset(String),
    /// `reboot-required`.
    Reboot,
}

/// The name of a recovery action as a taint value: NVML's name, plus the
/// newer numbers nvml-wrapper does not know (5 `RECOVER_IMEX_DOMAIN`, 6
/// `BUS_RESET`, 7 `SYSTEM_REBOOT`), `UNKNOWN_<n>` beyond.
pub fn action_name(action: RecoveryAction) -> String {
    match action {
        RecoveryAction::Other(5) => "RECOVER_IMEX_DOMAIN".to_owned(),
        RecoveryAction::Other(6) => "BUS_RESET".to_owned(),
        RecoveryAction::Other(7) => "SYSTEM_REBOOT".to_owned(),
        other => other.name(),
    }
}

/// What `action` asks of the GPU. Unknown actions count as a reset, as
/// NVIDIA's driver counts them fatal.
pub fn action_class(action: RecoveryAction) -> ActionClass {
    match action {
        RecoveryAction::None | RecoveryAction::Other(5) => ActionClass::Fine,
        RecoveryAction::DrainP2p => ActionClass::DrainP2p,
        RecoveryAction::NodeReboot | RecoveryAction::Other(7) => ActionClass::Reboot,
        RecoveryAction::GpuReset | RecoveryAction::DrainAndReset | RecoveryAction::Other(_) => {
            ActionClass::Reset(action_name(action))
        }
    }
}

/// Classifies `xid` under `policy`, given the GPU's recovery action at the
/// time (`None` when the driver has none or the query failed).
pub fn classify_xid(policy: &Policy, xid: u64, action: Option<RecoveryAction>) -> XidVerdict {
    let class = catalog_class(xid);
    // Facts of the XID itself, whatever the action says.
    let always = match class {
        CatalogClass::Lost => Some(Implied::Lost),
        CatalogClass::Nvlink => Some(Implied::Nvlink),
        _ => None,
    };
    if policy.fatal_xids.contains(xid) {
        let implied = always.or_else(|| match (action, class) {
            (None, CatalogClass::ResetGpu) => Some(Implied::Reset("GPU_RESET".to_owned())),
            (None, CatalogClass::Reboot) => Some(Implied::Reboot),
            _ => None,
        });
        return XidVerdict {
            fatal: true,
            why: "--xids-fatal",
            implied,
        };
    }
    if policy.ignores(xid) {
        return XidVerdict {
            fatal: false,
            why: "ignored",
            implied: always,
        };
    }
    if let Some(action) = action {
        let fatal = matches!(
            action_class(action),
            ActionClass::Reset(_) | ActionClass::Reboot
        );
        return XidVerdict {
            fatal: fatal || class == CatalogClass::Lost,
            why: "recovery action",
            implied: always,
        };
    }
    let (fatal, implied) = match class {
        CatalogClass::RestartApp | CatalogClass::Ignore | CatalogClass::Secondary => (false, None),
        CatalogClass::Nvlink => (false, always),
        CatalogClass::ResetGpu => (true, Some(Implied::Reset("GPU_RESET".to_owned()))),
        CatalogClass::Lost => (true, always),
        CatalogClass::Reboot => (true, Some(Implied::Reboot)),
        CatalogClass::Other => (true, None),
    };
    XidVerdict {
        fatal,
        why: "XID catalog",
        implied,
    }
}

/// The largest XID a list accepts (NVML reports XIDs as 32-bit numbers).
const MAX_XID: u64 = u32::MAX as u64;

/// Parses NVIDIA's comma list of XIDs (`--additional-xids-to-ignore`,
/// `ADDITIONAL_XIDS_TO_IGNORE`): decimal numbers, blanks around entries
/// allowed, an empty text is the empty list. Unlike NVIDIA's driver, which
/// drops malformed entries silently, any malformed entry is an error that
/// names it.
///
/// # Errors
/// [`Error::NotANumber`], [`Error::OutOfRange`], [`Error::EmptyEntry`],
/// [`Error::TooMany`].
pub fn parse_xid_list(text: &str) -> Result<BTreeSet<u64>, Error> {
    let mut out = BTreeSet::new();
    if text.trim().is_empty() {
        return Ok(out);
    }
    for (i, entry) in text.split(',').enumerate() {
        let position = i + 1;
        if position > MAX_XIDS {
            return Err(Error::TooMany { max: MAX_XIDS });
        }
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(Error::EmptyEntry { position });
        }
        if !entry.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Error::NotANumber {
                position,
                entry: cut(entry, 32),
            });
        }
        let xid = entry
            .parse::<u64>()
            .ok()
            .filter(|x| (1..=MAX_XID).contains(x));
        let Some(xid) = xid else {
            return Err(Error::OutOfRange {
                position,
                entry: cut(entry, 32),
                max: MAX_XID,
            });
        };
        out.insert(xid);
    }
    Ok(out)
}

/// Parses `--xids-fatal`: `all` (any case), or an XID list as
/// [`parse_xid_list`] (empty: none).
///
/// # Errors
/// As [`parse_xid_list`].
pub fn parse_xid_set(text: &str) -> Result<XidSet, Error> {
    if text.trim().eq_ignore_ascii_case("all") {
        return Ok(XidSet::All);
    }
    parse_xid_list(text).map(XidSet::Some)
}

/// Parses `--health-evict`: a comma list of short taint key names from
/// [`evictable_keys`]; the full `gpu.nvidia.com/<name>` spelling is
/// accepted too. Empty text: none.
///
/// # Errors
/// [`Error::UnknownKey`], [`Error::InformationalKey`], [`Error::EmptyKey`],
/// [`Error::TooMany`].
pub fn parse_evict(text: &str) -> Result<BTreeSet<String>, Error> {
    let mut out = BTreeSet::new();
    if text.trim().is_empty() {
        return Ok(out);
    }
    for (i, entry) in text.split(',').enumerate() {
        let position = i + 1;
        if position > health_keys::KEYS.len() + 16 {
            return Err(Error::TooMany {
                max: health_keys::KEYS.len() + 16,
            });
        }
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(Error::EmptyKey { position });
        }
        let short = entry
            .strip_prefix(health_keys::DOMAIN)
            .and_then(|rest| rest.strip_prefix('/'))
            .unwrap_or(entry);
        match health_keys::KEYS.iter().find(|k| k.name == short) {
            Some(k) if k.default_effect != "None" => {
                out.insert(short.to_owned());
            }
            Some(_) => {
                return Err(Error::InformationalKey {
                    key: short.to_owned(),
                });
            }
            None => {
                return Err(Error::UnknownKey {
                    key: cut(entry, 64),
                    known: evictable_keys().collect::<Vec<_>>().join(", "),
                });
            }
        }
    }
    Ok(out)
}

/// `text` cut to `max` characters.
fn cut(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// `t` as RFC 3339 in UTC to the second (`2026-11-29T12:03:05Z`); times
/// before 1970 show as the epoch. Through jiff, which k8s-openapi already
/// brings for the API's own times.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    i64::try_from(secs)
        .ok()
        .and_then(|s| Timestamp::from_second(s).ok())
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .to_string()
}

#[cfg(test)]
mod tests;
