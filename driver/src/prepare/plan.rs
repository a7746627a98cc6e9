//! From a fetched ResourceClaim to a [`ClaimPlan`]: which of its allocated
//! devices are this plugin's to prepare, what hardware each one is, and
//! which opaque config applies to it. Pure: no I/O, so every rule a user
//! can trip over is unit-tested with a precise message.
//!
//! Rules (kubernetes-dra.md 4.3 and 8):
//! - the claim's UID must be the one kubelet named (a claim deleted and
//!   re-created under the same name is another claim);
//! - it must be allocated; results of other drivers, or of our driver for
//!   another node's pool, are skipped; a claim with no result for us is an
//!   error (kubelet only sends claims that involve this driver);
//! - every device named must be one this plugin publishes;
//! - configs: class configs, then claim configs, later wins, only ours,
//!   strictly decoded ([`gpu_dra_api::config::resolve_entry`]); a config that does
//!   not decode fails the claim even if it applies to another request; a
//!   config `source` other than `FromClass` or `FromClaim` fails the claim
//!   (of any driver, as NVIDIA's `GetOpaqueDeviceConfigs` does);
//! - one device allocated to several requests of the claim (or the same
//!   share) is prepared once and answered with all its request names. It
//!   gets admin access only if every one of those results has it, and the
//!   config that applies to each of those requests: requests without one
//!   take the others', two different configs are an error naming both
//!   requests (Kubernetes' allocator never does this; it is hostile input).

use std::collections::{BTreeMap, HashMap};

use gpu_dra_api::config::{self, AllocationConfig, DeviceConfig, OpaqueConfig};
use gpu_dra_api::quantity::Quantity;
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::prepare::checkpoint::ClaimUid;
use crate::prepare::mig::MigRequest;

/// The hardware behind one published device, as the preparer needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A whole GPU.
    Gpu(GpuTarget),
    /// A MIG device: a static one that exists, or a dynamic placement to create.
    Mig(MigTarget),
    /// A whole GPU for VFIO passthrough (`gpu-vfio-<index>`).
    Vfio(VfioTarget),
}

/// A whole GPU handed to a container through VFIO.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VfioTarget {
    /// NVML index.
    pub index: u32,
    /// Device minor.
    pub minor: u32,
    /// GPU UUID.
    pub uuid: String,
    /// PCI bus id (`0000:18:00.0`), its name in sysfs.
    pub pci_bus_id: String,
}

/// A whole GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuTarget {
    /// NVML index.
    pub index: u32,
    /// Device minor (`/dev/nvidia<minor>`).
    pub minor: u32,
    /// GPU UUID.
    pub uuid: String,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// Published for memory-fraction sharing (several claims at once), each
    /// claim's memory enforced with MPS limits (`--memory-sharing`,
    /// `--consumable-shares=memory`).
    pub memory_shared: bool,
    /// Published for consumable shares that are only counted
    /// (`--consumable-shares=unlimited` or `<N>`): several claims at once,
    /// each prepared as if it had the GPU alone, except that MPS configs
    /// join the GPU's one shared daemon.
    pub counted_share: bool,
    /// Dynamic MIG is on for this GPU (its MIG mode may need switching off).
    pub dynamic_mig: bool,
    /// CUDA compute capability (major, minor).
    pub compute_capability: (u32, u32),
}

/// A MIG device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigTarget {
    /// Where it is (or is to be created): parent GPU, profile, placement.
    pub request: MigRequest,
    /// Created at prepare (dynamic MIG) rather than found at discovery.
    pub dynamic: bool,
}

impl Target {
    /// Minor of the physical GPU, the unit of locking.
    pub fn gpu_minor(&self) -> u32 {
        match self {
            Target::Gpu(g) => g.minor,
            Target::Mig(m) => m.request.parent_minor,
            Target::Vfio(v) => v.minor,
        }
    }

    /// The config kind that applies to this device.
    pub fn config_kind(&self) -> config::DeviceKind {
        match self {
            Target::Gpu(_) => config::DeviceKind::Gpu,
            Target::Mig(_) => config::DeviceKind::Mig,
            Target::Vfio(_) => config::DeviceKind::Vfio,
        }
    }
}

/// Looks up the published devices of this node by name.
pub trait Catalog {
    /// The hardware behind device `name`, if this plugin publishes it.
    fn target(&self, name: &str) -> Option<Target>;
}

impl<S: std::hash::BuildHasher> Catalog for HashMap<String, Target, S> {
    fn target(&self, name: &str) -> Option<Target> {
        self.get(name).cloned()
    }
}

/// What the plugin must prepare for one claim.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimPlan {
    /// Claim UID.
    pub uid: ClaimUid,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Our devices, in allocation order.
    pub devices: Vec<PlannedDevice>,
    /// What the device metadata files need of the claim.
    pub metadata: super::metadata::ClaimFacts,
}

/// One allocated device (or device share) of ours.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedDevice {
    /// Base names of the requests it serves (`main` for `main/sub`).
    pub requests: Vec<String>,
    /// Pool (this node's name).
    pub pool: String,
    /// Device name in the pool.
    pub device: String,
    /// Share id (consumable capacity).
    pub share_id: Option<String>,
    /// Admin access: the device is handed over without exclusivity checks
    /// and without changing its configuration.
    pub admin: bool,
    /// The hardware.
    pub target: Target,
    /// The opaque config that applies; `None`: nothing configured, so the
    /// hardware is left as it is.
    pub config: Option<DeviceConfig>,
    /// Where `config` came from: its index in the allocation's `config`
    /// list. MPS devices of one entry share a daemon, as in NVIDIA's driver.
    pub config_entry: Option<usize>,
    /// Bytes of `memory` the allocation consumed (memory-fraction sharing).
    pub consumed_memory: Option<u64>,
}

impl ClaimPlan {
    /// Minors of the GPUs the claim touches, sorted and distinct: the locks
    /// to take, in this order.
    pub fn gpu_minors(&self) -> Vec<u32> {
        let mut minors: Vec<u32> = self.devices.iter().map(|d| d.target.gpu_minor()).collect();
        minors.sort_unstable();
        minors.dedup();
        minors
    }
}

/// Why a claim cannot be planned; the text goes to the user (kubelet event).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The claim in the API has another UID.
    #[error(
        "ResourceClaim {namespace}/{name} has UID {found}, not {expected}: the claim was deleted and re-created; the pod must be re-created to use the new claim"
    )]
    UidMismatch {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// UID kubelet named.
        expected: String,
        /// UID found.
        found: String,
    },
    /// The claim has no allocation.
    #[error("ResourceClaim {namespace}/{name} is not allocated (status.allocation is empty)")]
    NotAllocated {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// No allocation result is for this driver on this node.
    #[error(
        "ResourceClaim {namespace}/{name} has no device of driver {driver} on node {node}: it was allocated elsewhere ({elsewhere})"
    )]
    NothingForUs {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Our driver name.
        driver: String,
        /// Our node (pool) name.
        node: String,
        /// Where its results are (`driver/pool`, comma separated).
        elsewhere: String,
    },
    /// A device named in the allocation is not one of ours.
    #[error(
        "ResourceClaim {namespace}/{name}: device {device:?} of request {request:?} is not published by this plugin on node {node} (stale allocation, or the GPU disappeared); re-create the claim"
    )]
    UnknownDevice {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Request name.
        request: String,
        /// Device name.
        device: String,
        /// Node.
        node: String,
    },
    /// An opaque config is broken or does not fit.
    #[error("ResourceClaim {namespace}/{name}: request {request:?}: {error}")]
    Config {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Request the config was resolved for.
        request: String,
        /// The config error.
        error: String,
    },
    /// An allocation config has a `source` that is neither `FromClass` nor
    /// `FromClaim`.
    #[error("ResourceClaim {namespace}/{name}: status.allocation.devices.config[{index}]: {error}")]
    ConfigSource {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Index of the config entry.
        index: usize,
        /// The config error ([`config::ConfigError::InvalidSource`]).
        error: String,
    },
    /// One device is allocated to two requests of the claim whose configs
    /// differ; it can be configured only one way.
    #[error(
        "ResourceClaim {namespace}/{name}: device {device:?} is allocated to both request {:?} and request {:?}, but their configs differ ({} vs {}); give both requests the same config",
        conflict.first_request, conflict.second_request, conflict.first_config, conflict.second_config
    )]
    ConflictingConfigs {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Device name.
        device: String,
        /// The two requests and their configs.
        conflict: Box<ConfigConflict>,
    },
    /// A consumed capacity cannot be read.
    #[error("ResourceClaim {namespace}/{name}: request {request:?}: {reason}")]
    Capacity {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Request name.
        request: String,
        /// What is wrong.
        reason: String,
    },
}

/// The two requests of [`PlanError::ConflictingConfigs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigConflict {
    /// The request whose config was taken first.
    pub first_request: String,
    /// Its config, as JSON.
    pub first_config: String,
    /// The request whose config differs.
    pub second_request: String,
    /// Its config, as JSON.
    pub second_config: String,
}

/// Plans `claim` for driver `driver` on node `node`; `expected_uid` is the
/// UID kubelet sent.
pub fn plan(
    claim: &ResourceClaim,
    expected_uid: &str,
    driver: &str,
    node: &str,
    catalog: &dyn Catalog,
) -> Result<ClaimPlan, PlanError> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let found = claim.metadata.uid.clone().unwrap_or_default();
    if found != expected_uid {
        return Err(PlanError::UidMismatch {
            namespace,
            name,
            expected: expected_uid.to_owned(),
            found,
        });
    }
    let Some(allocation) = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
    else {
        return Err(PlanError::NotAllocated { namespace, name });
    };
    let configs = allocation
        .config
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| {
            let source =
                c.source
                    .parse()
                    .map_err(|e: config::ConfigError| PlanError::ConfigSource {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        index: i,
                        error: e.to_string(),
                    })?;
            Ok(AllocationConfig {
                source,
                requests: c.requests.clone().unwrap_or_default(),
                opaque: c.opaque.as_ref().map(|o| OpaqueConfig {
                    driver: o.driver.clone(),
                    parameters: o.parameters.0.clone(),
                }),
            })
        })
        .collect::<Result<Vec<AllocationConfig>, PlanError>>()?;

    let mut devices: Vec<PlannedDevice> = Vec::new();
    // Per device: its place in `devices`, and the request its config came
    // from (for conflict messages).
    let mut index: BTreeMap<(String, String, Option<String>), (usize, String)> = BTreeMap::new();
    let mut elsewhere = Vec::new();
    for result in allocation.results.iter().flatten() {
        if result.driver != driver || result.pool != node {
            elsewhere.push(format!("{}/{}", result.driver, result.pool));
            continue;
        }
        let base = result
            .request
            .split_once('/')
            .map_or(result.request.as_str(), |(main, _)| main)
            .to_owned();
        let key = (
            result.pool.clone(),
            result.device.clone(),
            result.share_id.clone(),
        );
        let admin = result.admin_access.unwrap_or(false);
        // An admin-access result (monitoring) changes nothing on the
        // device: its config is checked, not applied.
        let resolve = |kind: config::DeviceKind| {
            config::resolve_entry(&configs, &result.request, driver, kind)
                .map(|found| found.filter(|_| !admin))
                .map_err(|e| PlanError::Config {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    request: result.request.clone(),
                    error: e.to_string(),
                })
        };
        if let Some((i, config_from)) = index.get_mut(&key) {
            let merged = &mut devices[*i];
            let config = resolve(merged.target.config_kind())?;
            match (&merged.config, config) {
                (_, None) => {}
                (None, Some((entry, c))) => {
                    merged.config = Some(c);
                    merged.config_entry = Some(entry);
                    config_from.clone_from(&result.request);
                }
                (Some(mine), Some((_, theirs))) if *mine == theirs => {}
                (Some(mine), Some((_, theirs))) => {
                    return Err(PlanError::ConflictingConfigs {
                        namespace,
                        name,
                        device: result.device.clone(),
                        conflict: Box::new(ConfigConflict {
                            first_request: config_from.clone(),
                            first_config: config_json(mine),
                            second_request: result.request.clone(),
                            second_config: config_json(&theirs),
                        }),
                    });
                }
            }
            merged.admin &= admin;
            if !merged.requests.contains(&base) {
                merged.requests.push(base);
            }
            continue;
        }
        let target = catalog
            .target(&result.device)
            .ok_or_else(|| PlanError::UnknownDevice {
                namespace: namespace.clone(),
                name: name.clone(),
                request: result.request.clone(),
                device: result.device.clone(),
                node: node.to_owned(),
            })?;
        let (config_entry, config) = resolve(target.config_kind())?.unzip();
        let consumed_memory = match result
            .consumed_capacity
            .as_ref()
            .and_then(|c| c.get("memory"))
        {
            None => None,
            Some(q) => Some(bytes(&q.0).map_err(|reason| PlanError::Capacity {
                namespace: namespace.clone(),
                name: name.clone(),
                request: result.request.clone(),
                reason,
            })?),
        };
        index.insert(key, (devices.len(), result.request.clone()));
        devices.push(PlannedDevice {
            requests: vec![base],
            pool: result.pool.clone(),
            device: result.device.clone(),
            share_id: result.share_id.clone(),
            admin,
            target,
            config,
            config_entry,
            consumed_memory,
        });
    }
    if devices.is_empty() {
        elsewhere.sort();
        elsewhere.dedup();
        return Err(PlanError::NothingForUs {
            namespace,
            name,
            driver: driver.to_owned(),
            node: node.to_owned(),
            elsewhere: if elsewhere.is_empty() {
                "no results at all".to_owned()
            } else {
                elsewhere.join(", ")
            },
        });
    }
    Ok(ClaimPlan {
        uid: ClaimUid(found),
        metadata: super::metadata::ClaimFacts::of(claim, driver, node),
        namespace,
        name,
        devices,
    })
}

/// A config as compact JSON, for error messages.
fn config_json(config: &DeviceConfig) -> String {
    serde_json::to_string(config)
        .unwrap_or_else(|e| format!("<{} not printable: {e}>", config.kind()))
}

/// A `memory` quantity in whole bytes (rounded up).
fn bytes(q: &str) -> Result<u64, String> {
    let parsed: Quantity = q
        .parse()
        .map_err(|e| format!("consumed memory {q:?} is not a quantity: {e}"))?;
    u64::try_from(parsed.ceil_units())
        .map_err(|_| format!("consumed memory {q:?} is negative or too large"))
}

#[cfg(test)]
mod tests;
