//! What a control daemon is started with, validated, and the control
//! commands that apply it.
//!
//! Every value that ends up in a command line sent to the daemon (one
//! command per stdin line, words separated by spaces) is checked against a
//! strict character set first, so no id, UUID or limit can add a word or a
//! line: a UUID like `GPU-1\nquit` is refused, never sent.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::MpsError;

/// Longest daemon id (it is a directory name).
pub const MAX_ID_LEN: usize = 128;
/// Longest device UUID after the `GPU-`/`MIG-` prefix.
const MAX_UUID_BODY: usize = 64;
/// Largest pinned device memory limit accepted, in MiB (16 TiB: far above
/// any GPU); the configs' larger limits are sent as this.
pub use gpu_dra_api::config::MAX_PINNED_LIMIT_MIB;
/// Most devices one daemon serves.
pub const MAX_DEVICES: usize = 64;

/// One MPS control daemon: its id and what it is started with.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DaemonConfig {
    /// The daemon's id: a safe directory name ([`validate_id`]).
    pub id: String,
    /// The GPUs or MIG devices it serves (`CUDA_VISIBLE_DEVICES`, in this
    /// order): `GPU-...` or `MIG-...` UUIDs.
    pub gpu_uuids: Vec<String>,
    /// `set_default_active_thread_percentage`, 0 to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_thread_percentage: Option<u8>,
    /// `set_default_device_pinned_mem_limit` per device UUID (one of
    /// `gpu_uuids`): `<N>M` or `<N>G`, at least 1 MiB.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pinned_memory_limits: BTreeMap<String, String>,
    /// Started as a multi-user server (`-d -M`; `mpsConfig.multiUser`):
    /// clients of every Linux user share one MPS server.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub multi_user: bool,
}

/// Checks that `id` can be a directory name: 1 to [`MAX_ID_LEN`] ASCII
/// letters, digits, `-`, `_` or `.`, starting with a letter or digit (so
/// never `.`, `..` or hidden).
pub fn validate_id(id: &str) -> Result<(), &'static str> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err("must be 1 to 128 characters");
    }
    if !id.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("must start with a letter or digit");
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err("may only hold ASCII letters, digits, '-', '_' and '.'");
    }
    Ok(())
}

/// Checks a device UUID: `GPU-` or `MIG-` then 1 to 64 hex digits and dashes.
pub fn validate_uuid(uuid: &str) -> Result<(), &'static str> {
    let body = uuid
        .strip_prefix("GPU-")
        .or_else(|| uuid.strip_prefix("MIG-"))
        .ok_or("must start with GPU- or MIG-")?;
    if body.is_empty() || body.len() > MAX_UUID_BODY {
        return Err("must have 1 to 64 characters after the prefix");
    }
    if !body.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Err("may only hold hex digits and '-' after the prefix");
    }
    Ok(())
}

/// Parses a pinned memory limit (`<N>M` or `<N>G`) into MiB, within
/// 1 ..= [`MAX_PINNED_LIMIT_MIB`].
pub fn parse_limit_mib(value: &str) -> Result<u64, String> {
    let (digits, factor) = if let Some(d) = value.strip_suffix('M') {
        (d, 1)
    } else if let Some(d) = value.strip_suffix('G') {
        (d, 1024)
    } else {
        return Err("must be <N>M or <N>G".into());
    };
    if digits.is_empty() || digits.len() > 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("must be <N>M or <N>G with N a decimal number".into());
    }
    let mib = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .filter(|mib| *mib <= MAX_PINNED_LIMIT_MIB)
        .ok_or_else(|| format!("must be at most {MAX_PINNED_LIMIT_MIB}M (16 TiB)"))?;
    if mib == 0 {
        return Err("must be at least 1M".into());
    }
    Ok(mib)
}

/// Checks an active thread percentage (0 to 100).
pub fn validate_percentage(p: u8) -> Result<(), String> {
    if p > 100 {
        return Err(format!("active thread percentage {p} is above 100"));
    }
    Ok(())
}

impl DaemonConfig {
    fn invalid(&self, reason: String) -> MpsError {
        MpsError::InvalidConfig {
            id: self.id.clone(),
            reason,
        }
    }

    /// Checks every field; the error names the field and the rule.
    pub fn validate(&self) -> Result<(), MpsError> {
        validate_id(&self.id).map_err(|reason| MpsError::InvalidId {
            id: self.id.clone(),
            reason,
        })?;
        if self.gpu_uuids.is_empty() {
            return Err(self.invalid("no GPU UUIDs".into()));
        }
        if self.gpu_uuids.len() > MAX_DEVICES {
            return Err(self.invalid(format!(
                "{} devices, at most {MAX_DEVICES} per daemon",
                self.gpu_uuids.len()
            )));
        }
        for (i, uuid) in self.gpu_uuids.iter().enumerate() {
            validate_uuid(uuid).map_err(|r| self.invalid(format!("GPU UUID {uuid:?}: {r}")))?;
            if self.gpu_uuids[..i].contains(uuid) {
                return Err(self.invalid(format!("GPU UUID {uuid} listed twice")));
            }
        }
        if let Some(p) = self.active_thread_percentage {
            validate_percentage(p).map_err(|r| self.invalid(r))?;
        }
        for (uuid, limit) in &self.pinned_memory_limits {
            if !self.gpu_uuids.contains(uuid) {
                return Err(self.invalid(format!(
                    "pinned memory limit for {uuid:?}, which is not one of the daemon's devices"
                )));
            }
            parse_limit_mib(limit).map_err(|r| {
                self.invalid(format!("pinned memory limit {limit:?} of {uuid}: {r}"))
            })?;
        }
        Ok(())
    }

    /// `CUDA_VISIBLE_DEVICES` for the daemon: the UUIDs, comma separated.
    pub fn visible_devices(&self) -> String {
        self.gpu_uuids.join(",")
    }

    /// The control commands that apply the settings, in order: the active
    /// thread percentage, then one pinned memory limit per device.
    ///
    /// Devices are named by their ordinal among the daemon's
    /// `CUDA_VISIBLE_DEVICES` (the order of `gpu_uuids`), which is how CUDA
    /// enumerates them inside the daemon. NVIDIA's device plugin switched
    /// from UUIDs to ordinals because `nvidia-cuda-mps-control` did not apply
    /// limits given by UUID (NVIDIA/k8s-device-plugin#572).
    pub fn commands(&self) -> Result<Vec<String>, MpsError> {
        self.validate()?;
        let mut out = Vec::with_capacity(1 + self.pinned_memory_limits.len());
        if let Some(p) = self.active_thread_percentage {
            out.push(format!("set_default_active_thread_percentage {p}"));
        }
        for (ordinal, uuid) in self.gpu_uuids.iter().enumerate() {
            if let Some(limit) = self.pinned_memory_limits.get(uuid) {
                let mib = parse_limit_mib(limit).map_err(|r| self.invalid(r))?;
                out.push(format!(
                    "set_default_device_pinned_mem_limit {ordinal} {mib}M"
                ));
            }
        }
        Ok(out)
    }
}
