//! What a successful simulation returns: per node, the devices allocated to
//! each request, shaped like `status.allocation.devices.results`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, DeviceToleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use super::device::Scope;
use super::state::NodeSearch;
use gpu_dra_api::quantity::Quantity;

/// One allocated device, like a `DeviceRequestAllocationResult`.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatedDevice {
    /// The request, `main/sub` for a `firstAvailable` sub-request.
    pub request: String,
    /// The driver.
    pub driver: String,
    /// The pool.
    pub pool: String,
    /// The device.
    pub device: String,
    /// Allocated for admin access.
    pub admin_access: bool,
    /// Set for multi-allocatable devices: identifies this share. Generated
    /// deterministically from the claim, the result's position and the
    /// device, in UUID form.
    pub share_id: Option<String>,
    /// Capacity this share consumes (multi-allocatable devices), by the
    /// capacity's published name.
    pub consumed_capacity: BTreeMap<String, Quantity>,
    /// The request's tolerations.
    pub tolerations: Vec<DeviceToleration>,
    /// Whether the device is local to the node (so the allocation is bound
    /// to it).
    pub node_local: bool,
}

impl AllocatedDevice {
    /// As the Kubernetes type.
    pub fn to_k8s(&self) -> DeviceRequestAllocationResult {
        DeviceRequestAllocationResult {
            request: self.request.clone(),
            driver: self.driver.clone(),
            pool: self.pool.clone(),
            device: self.device.clone(),
            admin_access: self.admin_access.then_some(true),
            share_id: self.share_id.clone(),
            consumed_capacity: (!self.consumed_capacity.is_empty()).then(|| {
                self.consumed_capacity
                    .iter()
                    .map(|(k, v)| (k.clone(), K8sQuantity(v.canonical())))
                    .collect()
            }),
            tolerations: (!self.tolerations.is_empty()).then(|| self.tolerations.clone()),
            ..Default::default()
        }
    }
}

/// The allocation of a claim on one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeAllocation {
    /// The node; `None` when only cluster-wide devices were simulated.
    pub node: Option<String>,
    /// The devices, in request order.
    pub results: Vec<AllocatedDevice>,
}

impl NodeAllocation {
    /// As a claim's `status.allocation`: the results, and a node selector
    /// naming the node when a device is local to it. (Class and claim
    /// configs are not copied; a device available through a `nodeSelector`
    /// adds no term, see the module's simplification.)
    pub fn allocation_result(&self) -> AllocationResult {
        let node_selector = self
            .node
            .as_ref()
            .filter(|_| self.results.iter().any(|r| r.node_local))
            .map(|node| NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".to_owned(),
                        operator: "In".to_owned(),
                        values: Some(vec![node.clone()]),
                    }]),
                    ..Default::default()
                }],
            });
        AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(self.results.iter().map(AllocatedDevice::to_k8s).collect()),
                config: None,
            }),
            node_selector,
            ..Default::default()
        }
    }
}

/// A share ID: a version-4-shaped UUID derived from `parts`.
fn share_id(claim_key: &str, index: usize, device: &str) -> String {
    let half = |salt: u8| {
        let mut h = DefaultHasher::new();
        (claim_key, index, device, salt).hash(&mut h);
        h.finish()
    };
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&half(1).to_be_bytes());
    bytes[8..].copy_from_slice(&half(2).to_be_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = bytes.iter().fold(String::with_capacity(32), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    });
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The allocation found by a successful search.
pub(crate) fn node_allocation(search: &NodeSearch<'_, '_>) -> NodeAllocation {
    let results = search
        .picks
        .iter()
        .enumerate()
        .map(|(index, pick)| {
            let dev = search.devs[pick.dev];
            let pool = search.pools[dev.pool].pool;
            let variant = &search.plan.variants[pick.variant];
            let multi = dev.device.multi();
            let mut consumed_capacity = BTreeMap::new();
            if let (Some(consumed), Ok(details)) = (&pick.capacity, search.details(pick.dev)) {
                for (cap, amount) in details.capacities.iter().zip(consumed) {
                    let zero = cap
                        .quantity
                        .checked_sub(&cap.quantity)
                        .unwrap_or(Quantity::from_nanos(0));
                    let value = zero
                        .checked_add(&Quantity::from_nanos(*amount))
                        .unwrap_or(Quantity::from_nanos(*amount));
                    consumed_capacity.insert(cap.published.to_owned(), value);
                }
            }
            AllocatedDevice {
                request: variant.name.clone(),
                driver: pool.driver.to_owned(),
                pool: pool.name.to_owned(),
                device: dev.device.name().to_owned(),
                admin_access: variant.admin,
                share_id: multi
                    .then(|| share_id(&search.plan.claim_key, index, &search.device_id(pick.dev))),
                consumed_capacity,
                tolerations: variant.tolerations.clone(),
                node_local: matches!(search.scope(pick.dev), Scope::Node(_)),
            }
        })
        .collect();
    NodeAllocation {
        node: search.node.map(str::to_owned),
        results,
    }
}
