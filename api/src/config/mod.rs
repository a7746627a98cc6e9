//! Opaque device configuration: decoding, defaults, validation and
//! resolution of the `opaque.parameters` that DeviceClasses and
//! ResourceClaims carry for this driver.
//!
//! Supported today is NVIDIA's API, drop-in compatible:
//! `resource.nvidia.com/v1beta1` `GpuConfig`, `MigDeviceConfig` and
//! `VfioDeviceConfig` (see [`v1beta1`]). Decoding is strict, as NVIDIA's `StrictDecoder` is: unknown
//! fields, duplicate fields and wrong types are errors, each reported with
//! the path of the offending field. The same code serves the kubelet plugin
//! (at prepare time) and the admission webhook, so a config the webhook
//! accepts cannot fail to decode at prepare.
//!
//! Dispatch goes by `(apiVersion, kind)` through [`decode`]; a later API of
//! our own (say `resource.gpu-dra.io/v1alpha1`) is one more arm there and one
//! more [`DeviceConfig`] variant.
//!
//! This module is plain data: no Kubernetes types, so it needs no
//! k8s-openapi version feature. The plugin converts
//! `DeviceAllocationConfiguration`s into [`AllocationConfig`]s.

mod resolve;
pub mod v1beta1;

#[cfg(test)]
mod tests;

use std::fmt;

pub use resolve::{AllocationConfig, ConfigSource, OpaqueConfig, resolve_entry};
pub use v1beta1::{
    GpuConfig, GpuSharing, IommuBackendPolicy, IommuConfig, MAX_PINNED_LIMIT_MIB, MigDeviceConfig,
    MigDeviceSharing, MpsConfig, SharingStrategy, TimeSliceInterval, TimeSlicingConfig,
    VfioDeviceConfig, mps_memory_limit,
};

/// The only API group/version decoded today.
pub const NVIDIA_API_VERSION: &str = "resource.nvidia.com/v1beta1";
/// Kind of a full-GPU config.
pub const GPU_CONFIG_KIND: &str = "GpuConfig";
/// Kind of a MIG device config.
pub const MIG_DEVICE_CONFIG_KIND: &str = "MigDeviceConfig";
/// Kind of a VFIO passthrough GPU config.
pub const VFIO_DEVICE_CONFIG_KIND: &str = "VfioDeviceConfig";
/// The kinds of [`NVIDIA_API_VERSION`] this driver decodes, for messages.
pub const SUPPORTED_KINDS: &str = "GpuConfig, MigDeviceConfig, VfioDeviceConfig";
/// Kubernetes' limit on opaque parameters (a RawExtension of at most 10 KiB).
pub const MAX_PARAMETERS_BYTES: usize = 10 * 1024;
/// The deepest JSON nesting decoded (the API itself nests four levels).
pub const MAX_PARAMETERS_DEPTH: usize = 32;

/// A decoded opaque config of this driver.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum DeviceConfig {
    /// `resource.nvidia.com/v1beta1` `GpuConfig`.
    Gpu(GpuConfig),
    /// `resource.nvidia.com/v1beta1` `MigDeviceConfig`.
    Mig(MigDeviceConfig),
    /// `resource.nvidia.com/v1beta1` `VfioDeviceConfig`.
    Vfio(VfioDeviceConfig),
}

/// The kind of device a config is applied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// A full GPU.
    Gpu,
    /// A MIG device (static or dynamically created).
    Mig,
    /// A full GPU handed to the container through VFIO (`type=vfio`).
    Vfio,
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Gpu => "GPU",
            DeviceKind::Mig => "MIG device",
            DeviceKind::Vfio => "VFIO passthrough GPU",
        })
    }
}

/// One invalid field, named by its JSON path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The JSON path, e.g. `sharing.mpsConfig.defaultActiveThreadPercentage`.
    pub path: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Why an opaque config was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The parameters exceed Kubernetes' 10 KiB limit.
    #[error("opaque parameters are {size} bytes, more than the {max} bytes Kubernetes allows")]
    TooLarge {
        /// Size of the parameters as JSON.
        size: usize,
        /// The limit, [`MAX_PARAMETERS_BYTES`].
        max: usize,
    },
    /// The parameters are not well-formed JSON (or nest too deeply).
    #[error("opaque parameters are not valid JSON: {0}")]
    Malformed(String),
    /// The parameters are JSON but not an object.
    #[error("opaque parameters must be a JSON object with apiVersion and kind, got {0}")]
    NotAnObject(&'static str),
    /// `apiVersion` or `kind` is missing or not a string.
    #[error("opaque parameters: {field} is required and must be a string")]
    MissingTypeField {
        /// `apiVersion` or `kind`.
        field: &'static str,
    },
    /// The `apiVersion` is not one this driver decodes.
    #[error("unsupported apiVersion {api_version:?}: this driver decodes {supported}")]
    UnsupportedApiVersion {
        /// The apiVersion found.
        api_version: String,
        /// What is supported.
        supported: &'static str,
    },
    /// The `kind` is not one of the API version's kinds this driver decodes.
    #[error("unsupported kind {kind:?} in {api_version}: supported kinds are {supported}")]
    UnsupportedKind {
        /// The apiVersion found.
        api_version: String,
        /// The kind found.
        kind: String,
        /// What is supported.
        supported: &'static str,
    },
    /// Strict decoding failed: unknown or duplicate field, wrong type, bad
    /// enum value, bad quantity.
    #[error("{}", if .path.is_empty() { .message.clone() } else { format!("{}: {}", .path, .message) })]
    Decode {
        /// JSON path of the field, empty for the top level.
        path: String,
        /// The decoder's message.
        message: String,
    },
    /// Decoded, but some fields hold invalid values.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<FieldError>),
    /// A config entry of the allocation has no `opaque` member (a future
    /// Kubernetes extension this driver does not know).
    #[error("config[{index}] is not an opaque config: only opaque parameters are supported")]
    NotOpaque {
        /// Index in `status.allocation.devices.config`.
        index: usize,
    },
    /// An allocation config's `source` is neither `FromClass` nor `FromClaim`.
    #[error("invalid config source {0:?}: expected FromClass or FromClaim")]
    InvalidSource(String),
    /// A config entry failed to decode or validate.
    #[error("config[{index}] ({source_kind}): {error}")]
    InConfig {
        /// Index in `status.allocation.devices.config`.
        index: usize,
        /// Where the config came from.
        source_kind: ConfigSource,
        /// What went wrong.
        error: Box<ConfigError>,
    },
    /// A config of the wrong kind names a request of another device type,
    /// e.g. a `GpuConfig` for a MIG request.
    #[error("{config_kind} cannot be applied to {device} of request {request:?}")]
    WrongDeviceKind {
        /// `GpuConfig`, `MigDeviceConfig` or `VfioDeviceConfig`.
        config_kind: &'static str,
        /// The device the request was allocated.
        device: DeviceKind,
        /// The request (`main` or `main/sub`).
        request: String,
    },
    /// A `defaultPerDevicePinnedMemoryLimit` key names no device of the
    /// config.
    #[error(
        "defaultPerDevicePinnedMemoryLimit: {key:?} matches none of the {count} devices the config applies to (use one of their UUIDs or an index below {count})"
    )]
    UnknownDevice {
        /// The key.
        key: String,
        /// How many devices the config applies to.
        count: usize,
    },
}

impl DeviceConfig {
    /// The `kind` of the config.
    pub fn kind(&self) -> &'static str {
        match self {
            DeviceConfig::Gpu(_) => GPU_CONFIG_KIND,
            DeviceConfig::Mig(_) => MIG_DEVICE_CONFIG_KIND,
            DeviceConfig::Vfio(_) => VFIO_DEVICE_CONFIG_KIND,
        }
    }

    /// The device kind the config applies to.
    pub fn device_kind(&self) -> DeviceKind {
        match self {
            DeviceConfig::Gpu(_) => DeviceKind::Gpu,
            DeviceConfig::Mig(_) => DeviceKind::Mig,
            DeviceConfig::Vfio(_) => DeviceKind::Vfio,
        }
    }

    /// The config applied when none is given, already normalized: a GPU gets
    /// time-slicing with the default interval, a MIG device nothing, a VFIO
    /// GPU the legacy IOMMU backend without the API device.
    pub fn default_for(kind: DeviceKind) -> Self {
        match kind {
            DeviceKind::Gpu => DeviceConfig::Gpu(GpuConfig::default_config()),
            DeviceKind::Mig => DeviceConfig::Mig(MigDeviceConfig::default_config()),
            DeviceKind::Vfio => DeviceConfig::Vfio(VfioDeviceConfig::default_config()),
        }
    }

    /// Fills in the defaults implied by the other settings (as NVIDIA's
    /// `Normalize()` does).
    pub fn normalize(&mut self) {
        match self {
            DeviceConfig::Gpu(c) => c.normalize(),
            DeviceConfig::Mig(c) => c.normalize(),
            DeviceConfig::Vfio(c) => c.normalize(),
        }
    }

    /// Checks the values; every invalid field is reported.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let errors = match self {
            DeviceConfig::Gpu(c) => c.validate(),
            DeviceConfig::Mig(c) => c.validate(),
            DeviceConfig::Vfio(c) => c.validate(),
        };
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(errors))
        }
    }
}

/// Strictly decodes opaque parameters given as JSON text (the raw bytes of
/// a RawExtension), dispatching on `apiVersion` and `kind`. Duplicate
/// fields are detected only here, not in [`decode`], whose input has already
/// lost them.
pub fn decode_bytes(raw: &[u8]) -> Result<DeviceConfig, ConfigError> {
    if raw.len() > MAX_PARAMETERS_BYTES {
        return Err(ConfigError::TooLarge {
            size: raw.len(),
            max: MAX_PARAMETERS_BYTES,
        });
    }
    let value: serde_json::Value =
        serde_json::from_slice(raw).map_err(|e| ConfigError::Malformed(e.to_string()))?;
    check_depth(&value)?;
    let kind = type_of(&value)?;
    let mut de = serde_json::Deserializer::from_slice(raw);
    match kind {
        Kind::Gpu => typed(&mut de).map(DeviceConfig::Gpu),
        Kind::Mig => typed(&mut de).map(DeviceConfig::Mig),
        Kind::Vfio => typed(&mut de).map(DeviceConfig::Vfio),
    }
}

/// Strictly decodes opaque parameters already parsed as JSON, dispatching on
/// `apiVersion` and `kind`.
pub fn decode(parameters: &serde_json::Value) -> Result<DeviceConfig, ConfigError> {
    check_depth(parameters)?;
    let size = serde_json::to_vec(parameters)
        .map_err(|e| ConfigError::Malformed(e.to_string()))?
        .len();
    if size > MAX_PARAMETERS_BYTES {
        return Err(ConfigError::TooLarge {
            size,
            max: MAX_PARAMETERS_BYTES,
        });
    }
    match type_of(parameters)? {
        Kind::Gpu => typed(parameters).map(DeviceConfig::Gpu),
        Kind::Mig => typed(parameters).map(DeviceConfig::Mig),
        Kind::Vfio => typed(parameters).map(DeviceConfig::Vfio),
    }
}

/// [`decode`], then [`DeviceConfig::normalize`] and
/// [`DeviceConfig::validate`]: what the plugin applies and the webhook checks.
pub fn decode_validated(parameters: &serde_json::Value) -> Result<DeviceConfig, ConfigError> {
    let mut config = decode(parameters)?;
    config.normalize();
    config.validate()?;
    Ok(config)
}

/// [`decode_bytes`], then [`DeviceConfig::normalize`] and
/// [`DeviceConfig::validate`].
pub fn decode_bytes_validated(raw: &[u8]) -> Result<DeviceConfig, ConfigError> {
    let mut config = decode_bytes(raw)?;
    config.normalize();
    config.validate()?;
    Ok(config)
}

enum Kind {
    Gpu,
    Mig,
    Vfio,
}

fn type_of(value: &serde_json::Value) -> Result<Kind, ConfigError> {
    use serde_json::Value;
    let object = match value {
        Value::Object(o) => o,
        Value::Null => return Err(ConfigError::NotAnObject("null")),
        Value::Bool(_) => return Err(ConfigError::NotAnObject("a boolean")),
        Value::Number(_) => return Err(ConfigError::NotAnObject("a number")),
        Value::String(_) => return Err(ConfigError::NotAnObject("a string")),
        Value::Array(_) => return Err(ConfigError::NotAnObject("an array")),
    };
    let field = |name: &'static str| {
        object
            .get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or(ConfigError::MissingTypeField { field: name })
    };
    let api_version = field("apiVersion")?;
    let kind = field("kind")?;
    if api_version != NVIDIA_API_VERSION {
        return Err(ConfigError::UnsupportedApiVersion {
            api_version: api_version.to_owned(),
            supported: NVIDIA_API_VERSION,
        });
    }
    match kind {
        GPU_CONFIG_KIND => Ok(Kind::Gpu),
        MIG_DEVICE_CONFIG_KIND => Ok(Kind::Mig),
        VFIO_DEVICE_CONFIG_KIND => Ok(Kind::Vfio),
        _ => Err(ConfigError::UnsupportedKind {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            supported: SUPPORTED_KINDS,
        }),
    }
}

/// Rejects nesting deeper than [`MAX_PARAMETERS_DEPTH`], without recursion.
fn check_depth(value: &serde_json::Value) -> Result<(), ConfigError> {
    let mut stack = vec![(value, 1usize)];
    while let Some((v, depth)) = stack.pop() {
        if depth > MAX_PARAMETERS_DEPTH {
            return Err(ConfigError::Malformed(format!(
                "nesting deeper than {MAX_PARAMETERS_DEPTH} levels"
            )));
        }
        match v {
            serde_json::Value::Array(a) => stack.extend(a.iter().map(|v| (v, depth + 1))),
            serde_json::Value::Object(o) => stack.extend(o.values().map(|v| (v, depth + 1))),
            _ => {}
        }
    }
    Ok(())
}

fn typed<'de, T, D>(de: D) -> Result<T, ConfigError>
where
    T: serde::Deserialize<'de>,
    D: serde::Deserializer<'de, Error = serde_json::Error>,
{
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        ConfigError::Decode {
            path: if path == "." { String::new() } else { path },
            message: e.into_inner().to_string(),
        }
    })
}
