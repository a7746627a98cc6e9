//! `resource.nvidia.com/v1beta1`: NVIDIA's `GpuConfig`, `MigDeviceConfig` and
//! `VfioDeviceConfig`, with their defaults (`normalize`) and validation rules.
//!
//! Field names, enum values and defaults follow NVIDIA's driver:
//! - a `GpuConfig` without `sharing` means time-slicing with the `Default`
//!   interval; a `TimeSlicing` strategy without `timeSlicingConfig` (or
//!   without `interval`) gets the `Default` interval; an `MPS` strategy
//!   without `mpsConfig` gets an empty one;
//! - a `MigDeviceConfig` without `sharing` means no sharing; it has no
//!   `timeSlicingConfig` field; `TimeSlicing` is accepted and has no effect
//!   (time slices cannot be set on MIG devices), and an `mpsConfig` next to
//!   it is ignored, unchecked, as in NVIDIA's driver;
//! - a `VfioDeviceConfig` without `iommu` means `backendPolicy: LegacyOnly`
//!   and `enableAPIDevice: false`; an `iommu` given must name its
//!   `backendPolicy` (`LegacyOnly` or `PreferIommuFD`; NVIDIA's decoder
//!   leaves a missing one empty and its validation then refuses it), and a
//!   missing `enableAPIDevice` is `false`;
//! - `defaultActiveThreadPercentage` is 0 to 100; pinned memory limits are
//!   handed to MPS in MiB (`<N>M`) and must be at least 1 MiB.
//!
//! Checks NVIDIA makes only at prepare time (a limit below 1 MiB, a
//! `GpuConfig` with an `mpsConfig` next to the `TimeSlicing` strategy or a
//! `timeSlicingConfig` next to `MPS`) are made here, at validation, so the
//! webhook catches them.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{ConfigError, FieldError};
use crate::quantity::Quantity;

/// One MiB, the unit of MPS memory limits.
const MIB: i128 = 1 << 20;

/// A full GPU's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuConfig {
    /// `resource.nvidia.com/v1beta1`.
    pub api_version: String,
    /// `GpuConfig`.
    pub kind: String,
    /// How the GPU is shared between the claim's containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<GpuSharing>,
}

/// A MIG device's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MigDeviceConfig {
    /// `resource.nvidia.com/v1beta1`.
    pub api_version: String,
    /// `MigDeviceConfig`.
    pub kind: String,
    /// How the MIG device is shared between the claim's containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<MigDeviceSharing>,
}

/// A VFIO passthrough GPU's config (`type=vfio` devices).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VfioDeviceConfig {
    /// `resource.nvidia.com/v1beta1`.
    pub api_version: String,
    /// `VfioDeviceConfig`.
    pub kind: String,
    /// Which IOMMU interface the container gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu: Option<IommuConfig>,
}

/// The IOMMU settings of a VFIO passthrough GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IommuConfig {
    /// `LegacyOnly` or `PreferIommuFD`; required when `iommu` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_policy: Option<IommuBackendPolicy>,
    /// Also hand the container the IOMMU API device: `/dev/iommu` with the
    /// iommufd backend, `/dev/vfio/vfio` with the legacy one.
    #[serde(
        default,
        rename = "enableAPIDevice",
        skip_serializing_if = "Option::is_none"
    )]
    pub enable_api_device: Option<bool>,
}

/// How the IOMMU backend of a VFIO GPU is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum IommuBackendPolicy {
    /// The VFIO group (`/dev/vfio/<group>`), whatever the host offers.
    #[default]
    LegacyOnly,
    /// The device's iommufd cdev (`/dev/vfio/devices/vfio<N>`) when the host
    /// has iommufd (`/dev/iommu`), else the VFIO group.
    #[serde(rename = "PreferIommuFD")]
    PreferIommuFd,
}

impl fmt::Display for IommuBackendPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IommuBackendPolicy::LegacyOnly => "LegacyOnly",
            IommuBackendPolicy::PreferIommuFd => "PreferIommuFD",
        })
    }
}

/// Sharing of a full GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuSharing {
    /// `TimeSlicing` or `MPS`.
    pub strategy: SharingStrategy,
    /// Only with `TimeSlicing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing_config: Option<TimeSlicingConfig>,
    /// Only with `MPS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_config: Option<MpsConfig>,
}

/// Sharing of a MIG device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MigDeviceSharing {
    /// `MPS` (or `TimeSlicing`, which has no effect on MIG devices).
    pub strategy: SharingStrategy,
    /// Used only with `MPS`; ignored (and not validated) with `TimeSlicing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_config: Option<MpsConfig>,
}

/// The sharing strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SharingStrategy {
    /// CUDA time-slicing.
    TimeSlicing,
    /// CUDA Multi-Process Service.
    #[serde(rename = "MPS")]
    Mps,
}

impl fmt::Display for SharingStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SharingStrategy::TimeSlicing => "TimeSlicing",
            SharingStrategy::Mps => "MPS",
        })
    }
}

/// Time-slicing settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TimeSlicingConfig {
    /// The time slice; `Default` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<TimeSliceInterval>,
}

/// The time slice lengths `nvidia-smi compute-policy --set-timeslice` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum TimeSliceInterval {
    /// The driver's default.
    #[default]
    Default,
    /// Short.
    Short,
    /// Medium.
    Medium,
    /// Long.
    Long,
}

impl TimeSliceInterval {
    /// The value for `nvidia-smi compute-policy --set-timeslice`: 0 to 3.
    pub fn as_int(self) -> u8 {
        match self {
            TimeSliceInterval::Default => 0,
            TimeSliceInterval::Short => 1,
            TimeSliceInterval::Medium => 2,
            TimeSliceInterval::Long => 3,
        }
    }
}

/// MPS control daemon settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MpsConfig {
    /// `set_default_active_thread_percentage`, 0 to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_active_thread_percentage: Option<i64>,
    /// Pinned device memory limit of every device of the daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_pinned_device_memory_limit: Option<Quantity>,
    /// Per-device overrides, keyed by device UUID or by index in the sorted
    /// list of the UUIDs of the config's devices (see
    /// [`MpsConfig::pinned_memory_limits`]).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "unique_keys"
    )]
    pub default_per_device_pinned_memory_limit: Option<BTreeMap<String, Quantity>>,
    /// Runs the control daemon as a multi-user server
    /// (`nvidia-cuda-mps-control -d -M`, NVIDIA v0.5.0): clients of every
    /// Linux user share one MPS server, appearing as root's clients, so the
    /// claim's containers need not run as one user. Needs compute
    /// capability 7.0 (Volta) or later; absent means `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_user: Option<bool>,
}

/// A map that rejects duplicate keys, as Kubernetes' strict decoder does.
fn unique_keys<'de, D>(deserializer: D) -> Result<Option<BTreeMap<String, Quantity>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Visitor;

    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = Option<BTreeMap<String, Quantity>>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map from device UUID or index to a quantity")
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                if out.contains_key(&key) {
                    return Err(serde::de::Error::custom(format!("duplicate key {key:?}")));
                }
                let value = map.next_value::<Quantity>()?;
                out.insert(key, value);
            }
            Ok(Some(out))
        }
    }

    deserializer.deserialize_option(Visitor)
}

impl GpuConfig {
    /// NVIDIA's default GPU config: time-slicing with the default interval.
    pub fn default_config() -> Self {
        let mut config = GpuConfig {
            api_version: super::NVIDIA_API_VERSION.to_owned(),
            kind: super::GPU_CONFIG_KIND.to_owned(),
            sharing: None,
        };
        config.normalize();
        config
    }

    /// Fills in implied defaults.
    pub fn normalize(&mut self) {
        let sharing = self.sharing.get_or_insert(GpuSharing {
            strategy: SharingStrategy::TimeSlicing,
            time_slicing_config: None,
            mps_config: None,
        });
        match sharing.strategy {
            SharingStrategy::TimeSlicing => {
                sharing
                    .time_slicing_config
                    .get_or_insert(TimeSlicingConfig { interval: None })
                    .interval
                    .get_or_insert(TimeSliceInterval::Default);
            }
            SharingStrategy::Mps => {
                sharing.mps_config.get_or_insert_with(MpsConfig::default);
            }
        }
    }

    /// Every invalid field.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if let Some(sharing) = &self.sharing {
            match sharing.strategy {
                SharingStrategy::TimeSlicing => {
                    if sharing.mps_config.is_some() {
                        errors.push(field(
                            "sharing.mpsConfig",
                            "only allowed with strategy MPS, the strategy is TimeSlicing",
                        ));
                    }
                }
                SharingStrategy::Mps => {
                    if sharing.time_slicing_config.is_some() {
                        errors.push(field(
                            "sharing.timeSlicingConfig",
                            "only allowed with strategy TimeSlicing, the strategy is MPS",
                        ));
                    }
                }
            }
            if let Some(mps) = &sharing.mps_config {
                mps.validate("sharing.mpsConfig", &mut errors);
            }
        }
        errors
    }

    /// The time slice to set, if the config asks for time-slicing.
    pub fn time_slice(&self) -> Option<TimeSliceInterval> {
        let sharing = self.sharing.as_ref()?;
        (sharing.strategy == SharingStrategy::TimeSlicing).then(|| {
            sharing
                .time_slicing_config
                .as_ref()
                .and_then(|c| c.interval)
                .unwrap_or_default()
        })
    }

    /// The MPS settings, if the config asks for MPS.
    pub fn mps(&self) -> Option<&MpsConfig> {
        let sharing = self.sharing.as_ref()?;
        if sharing.strategy == SharingStrategy::Mps {
            sharing.mps_config.as_ref()
        } else {
            None
        }
    }
}

impl MigDeviceConfig {
    /// NVIDIA's default MIG device config: no sharing.
    pub fn default_config() -> Self {
        MigDeviceConfig {
            api_version: super::NVIDIA_API_VERSION.to_owned(),
            kind: super::MIG_DEVICE_CONFIG_KIND.to_owned(),
            sharing: None,
        }
    }

    /// Fills in implied defaults.
    pub fn normalize(&mut self) {
        if let Some(sharing) = &mut self.sharing
            && sharing.strategy == SharingStrategy::Mps
        {
            sharing.mps_config.get_or_insert_with(MpsConfig::default);
        }
    }

    /// Every invalid field. With the `TimeSlicing` strategy an `mpsConfig`
    /// is accepted and ignored, not even checked, as NVIDIA's
    /// `MigDeviceSharing.Validate` does (and its prepare never reads it).
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if let Some(sharing) = &self.sharing
            && sharing.strategy == SharingStrategy::Mps
            && let Some(mps) = &sharing.mps_config
        {
            mps.validate("sharing.mpsConfig", &mut errors);
        }
        errors
    }

    /// The MPS settings, if the config asks for MPS.
    pub fn mps(&self) -> Option<&MpsConfig> {
        let sharing = self.sharing.as_ref()?;
        if sharing.strategy == SharingStrategy::Mps {
            sharing.mps_config.as_ref()
        } else {
            None
        }
    }
}

impl VfioDeviceConfig {
    /// NVIDIA's default VFIO config: the legacy backend, no API device.
    pub fn default_config() -> Self {
        let mut config = VfioDeviceConfig {
            api_version: super::NVIDIA_API_VERSION.to_owned(),
            kind: super::VFIO_DEVICE_CONFIG_KIND.to_owned(),
            iommu: None,
        };
        config.normalize();
        config
    }

    /// Fills in implied defaults: no `iommu` is `LegacyOnly` without the API
    /// device; an `iommu` without `enableAPIDevice` does not enable it. A
    /// missing `backendPolicy` stays missing, for [`Self::validate`] to
    /// refuse, as NVIDIA's driver does.
    pub fn normalize(&mut self) {
        let iommu = self.iommu.get_or_insert(IommuConfig {
            backend_policy: Some(IommuBackendPolicy::LegacyOnly),
            enable_api_device: None,
        });
        iommu.enable_api_device.get_or_insert(false);
    }

    /// Every invalid field.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if let Some(iommu) = &self.iommu
            && iommu.backend_policy.is_none()
        {
            errors.push(field(
                "iommu.backendPolicy",
                "required when iommu is given: LegacyOnly or PreferIommuFD",
            ));
        }
        errors
    }

    /// The backend policy (after [`Self::normalize`]).
    pub fn backend_policy(&self) -> IommuBackendPolicy {
        self.iommu
            .as_ref()
            .and_then(|i| i.backend_policy)
            .unwrap_or_default()
    }

    /// Whether the container gets the IOMMU API device.
    pub fn enable_api_device(&self) -> bool {
        self.iommu
            .as_ref()
            .and_then(|i| i.enable_api_device)
            .unwrap_or(false)
    }
}

impl MpsConfig {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        if let Some(p) = self.default_active_thread_percentage
            && !(0..=100).contains(&p)
        {
            errors.push(field(
                &format!("{path}.defaultActiveThreadPercentage"),
                &format!("must be between 0 and 100, got {p}"),
            ));
        }
        if let Some(q) = &self.default_pinned_device_memory_limit
            && let Err(message) = mps_memory_limit(q)
        {
            errors.push(field(
                &format!("{path}.defaultPinnedDeviceMemoryLimit"),
                &message,
            ));
        }
        for (key, q) in self.default_per_device_pinned_memory_limit.iter().flatten() {
            let key_path = format!("{path}.defaultPerDevicePinnedMemoryLimit[{key:?}]");
            if !is_device_key(key) {
                errors.push(field(
                    &key_path,
                    "the key must be a device index (0, 1, ...) or a GPU/MIG UUID (GPU-..., MIG-...)",
                ));
            }
            if let Err(message) = mps_memory_limit(q) {
                errors.push(field(&key_path, &message));
            }
        }
    }

    /// The pinned device memory limit of each of the config's devices, as MPS
    /// wants them (`<N>M`), keyed by device UUID: the default for every
    /// device, then the per-device overrides, whose keys are UUIDs among
    /// `uuids` or indexes.
    ///
    /// An index counts in the devices' UUIDs sorted (byte-wise, duplicates
    /// dropped), whatever the order of `uuids`: NVIDIA's driver resolves it
    /// against `AllocatableDevices.UUIDs()`, which sorts, so `"0"` is the
    /// smallest UUID, not the first device allocated.
    pub fn pinned_memory_limits(
        &self,
        uuids: &[&str],
    ) -> Result<BTreeMap<String, String>, ConfigError> {
        let mut sorted = uuids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let uuids = sorted.as_slice();
        let mut limits = BTreeMap::new();
        if let Some(q) = &self.default_pinned_device_memory_limit {
            let limit = mps_memory_limit(q).map_err(|message| {
                ConfigError::Invalid(vec![field("defaultPinnedDeviceMemoryLimit", &message)])
            })?;
            for uuid in uuids {
                limits.insert((*uuid).to_owned(), limit.clone());
            }
        }
        for (key, q) in self.default_per_device_pinned_memory_limit.iter().flatten() {
            let uuid = if uuids.contains(&key.as_str()) {
                key.clone()
            } else {
                key.parse::<usize>()
                    .ok()
                    .filter(|_| key.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|i| uuids.get(i))
                    .map(|u| (*u).to_owned())
                    .ok_or_else(|| ConfigError::UnknownDevice {
                        key: key.clone(),
                        count: uuids.len(),
                    })?
            };
            let limit = mps_memory_limit(q).map_err(|message| {
                ConfigError::Invalid(vec![field(
                    &format!("defaultPerDevicePinnedMemoryLimit[{key:?}]"),
                    &message,
                )])
            })?;
            limits.insert(uuid, limit);
        }
        Ok(limits)
    }
}

/// The largest pinned memory limit sent to MPS, in MiB (16 TiB, far more
/// than any GPU has). A larger one, which NVIDIA's driver accepts, limits
/// nothing either: it is sent as this.
pub const MAX_PINNED_LIMIT_MIB: u64 = 16 * 1024 * 1024;

/// A pinned memory limit as MPS takes it: whole MiB, `<N>M`. The quantity is
/// rounded up to whole bytes, then down to whole MiB, as NVIDIA's driver
/// does; it must be at least 1 MiB and less than 8 EiB (an `int64` of
/// bytes), and is sent as at most [`MAX_PINNED_LIMIT_MIB`].
pub fn mps_memory_limit(q: &Quantity) -> Result<String, String> {
    let bytes = q.ceil_units();
    if bytes < MIB {
        return Err(format!("must be at least 1Mi, got {q}"));
    }
    if bytes > i128::from(i64::MAX) {
        return Err(format!("must be less than 8Ei, got {q}"));
    }
    let mib = u64::try_from(bytes / MIB).unwrap_or(u64::MAX);
    Ok(format!("{}M", mib.min(MAX_PINNED_LIMIT_MIB)))
}

/// A device index (decimal digits) or a GPU/MIG UUID.
fn is_device_key(key: &str) -> bool {
    if !key.is_empty() && key.len() <= 20 && key.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    let rest = key
        .strip_prefix("GPU-")
        .or_else(|| key.strip_prefix("MIG-"));
    rest.is_some_and(|r| {
        !r.is_empty()
            && r.len() <= 128
            && r.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'/')
    })
}

fn field(path: &str, message: &str) -> FieldError {
    FieldError {
        path: path.to_owned(),
        message: message.to_owned(),
    }
}
