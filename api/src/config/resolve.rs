//! Which opaque config applies to an allocated request:
//! `status.allocation.devices.config` as plain data, and the precedence
//! rules of NVIDIA's driver.
//!
//! Rules:
//! - class configs come first, claim configs after, each in their order; the
//!   last config that applies wins (so a claim config beats a class config);
//! - configs of other drivers are skipped, every config of ours is decoded
//!   and validated (a broken one fails the claim even if it applies to
//!   another request, as in NVIDIA's driver);
//! - a config with `requests` applies to those requests; a `main/sub`
//!   allocation result (prioritized list) matches `main` or `main/sub`. A
//!   config naming the request itself with the wrong kind (`GpuConfig` for
//!   a MIG device) is an error; one naming only `main` applies to the
//!   alternatives of its own kind and is skipped for the others (the
//!   alternatives of one request may be MIG devices and whole GPUs, and a
//!   config for each kind may name `main`; NVIDIA's driver matches exact
//!   names only, so it ignores such a config altogether);
//! - a config without `requests` applies to every request whose device kind
//!   matches its own, and is skipped for the others.

use std::fmt;
use std::str::FromStr;

use super::{ConfigError, DeviceConfig, DeviceKind, decode_validated};

/// Where an allocation config came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConfigSource {
    /// From the request's DeviceClass (`FromClass`).
    FromClass,
    /// From the ResourceClaim itself (`FromClaim`).
    FromClaim,
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigSource::FromClass => "FromClass",
            ConfigSource::FromClaim => "FromClaim",
        })
    }
}

impl FromStr for ConfigSource {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "FromClass" => Ok(ConfigSource::FromClass),
            "FromClaim" => Ok(ConfigSource::FromClaim),
            _ => Err(ConfigError::InvalidSource(s.to_owned())),
        }
    }
}

/// The `opaque` member of an allocation config.
#[derive(Debug, Clone, PartialEq)]
pub struct OpaqueConfig {
    /// The driver the parameters are for.
    pub driver: String,
    /// The parameters (a RawExtension).
    pub parameters: serde_json::Value,
}

/// One entry of `status.allocation.devices.config`.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocationConfig {
    /// `FromClass` or `FromClaim`.
    pub source: ConfigSource,
    /// The requests it applies to; empty means all.
    pub requests: Vec<String>,
    /// `None` for a config type other than opaque (none exists yet).
    pub opaque: Option<OpaqueConfig>,
}

/// The config of `driver` that applies to `request` (`main` or `main/sub`),
/// whose device is a `device_kind`, with its index in `configs`; `None` if
/// none applies (then [`DeviceConfig::default_for`] does). The returned
/// config is normalized and validated. The index matters: devices whose
/// configs came from one entry are one group in NVIDIA's driver (one MPS
/// daemon, index-keyed limits counted within the group), even where two
/// entries have the same content.
pub fn resolve_entry(
    configs: &[AllocationConfig],
    request: &str,
    driver: &str,
    device_kind: DeviceKind,
) -> Result<Option<(usize, DeviceConfig)>, ConfigError> {
    let ordered = configs
        .iter()
        .enumerate()
        .filter(|(_, c)| c.source == ConfigSource::FromClass)
        .chain(
            configs
                .iter()
                .enumerate()
                .filter(|(_, c)| c.source == ConfigSource::FromClaim),
        );
    let mut ours = Vec::new();
    for (index, config) in ordered {
        let opaque = config
            .opaque
            .as_ref()
            .ok_or(ConfigError::NotOpaque { index })?;
        if opaque.driver != driver {
            continue;
        }
        let decoded =
            decode_validated(&opaque.parameters).map_err(|error| ConfigError::InConfig {
                index,
                source_kind: config.source,
                error: Box::new(error),
            })?;
        ours.push((index, &config.requests, decoded));
    }
    let main = request.split_once('/').map(|(main, _)| main);
    for (index, requests, config) in ours.into_iter().rev() {
        if requests.iter().any(|r| r == request) {
            if config.device_kind() != device_kind {
                return Err(ConfigError::WrongDeviceKind {
                    config_kind: config.kind(),
                    device: device_kind,
                    request: request.to_owned(),
                });
            }
            return Ok(Some((index, config)));
        }
        // For every request, or for a main request of a prioritized list:
        // only where the kind fits.
        let names_main = main.is_some_and(|m| requests.iter().any(|r| r == m));
        if (requests.is_empty() || names_main) && config.device_kind() == device_kind {
            return Ok(Some((index, config)));
        }
    }
    Ok(None)
}
