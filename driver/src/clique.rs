//! NVIDIA's optional node label `nvidia.com/gpu.clique`
//! (`--gpu-clique-label`, off by default; Helm `gpuCliqueLabelEnabled`): the
//! NVLink fabric clique of the node's GPUs, `<clusterUUID>.<cliqueId>` with
//! a decimal clique id (GPU Feature Discovery's format), from NVML's GPU fabric
//! info. Multi-node NVLink systems (GB200) have one; single-node machines
//! have none, and the label is then removed, so it never outlives the
//! fabric it named. GPUs that disagree get no label (a warning says so).
//!
//! The plugin writes the label once at start, with a JSON merge patch of
//! the Node's labels (RBAC: `patch` on nodes, which the chart grants only
//! with the label on), retrying a failed write with backoff.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use crate::discovery::Inventory;
use crate::health::store::is_label_value;
use crate::slices::Backoff;

/// The label's key.
pub const LABEL: &str = "nvidia.com/gpu.clique";

/// How many times a failed write is tried again before giving up.
const RETRIES: u32 = 8;

/// What the label should be on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CliqueLabel {
    /// Set to this value.
    Set(String),
    /// Removed: no GPU is in a fabric clique.
    Absent,
    /// Removed: the GPUs are in different cliques (listed).
    Conflict(Vec<String>),
    /// Removed: the clique is no valid label value (shown).
    Invalid(String),
}

impl CliqueLabel {
    /// The label of the node with `inventory`'s GPUs.
    pub fn of(inventory: &Inventory) -> Self {
        let cliques: BTreeSet<String> = inventory
            .gpus
            .iter()
            .filter_map(|g| g.info.fabric.as_ref())
            .map(gpu_nvml::FabricInfo::clique)
            .collect();
        let mut cliques: Vec<String> = cliques.into_iter().collect();
        match cliques.len() {
            0 => CliqueLabel::Absent,
            1 => {
                let value = cliques.remove(0);
                if is_label_value(&value) {
                    CliqueLabel::Set(value)
                } else {
                    // Not reachable from NVML's bytes; kept out all the same.
                    CliqueLabel::Invalid(value)
                }
            }
            _ => CliqueLabel::Conflict(cliques),
        }
    }

    /// The value to write: `None` removes the label.
    pub fn value(&self) -> Option<&str> {
        match self {
            CliqueLabel::Set(v) => Some(v),
            CliqueLabel::Absent | CliqueLabel::Conflict(_) | CliqueLabel::Invalid(_) => None,
        }
    }
}

/// The merge patch that sets (or, with `None`, removes) the label.
pub fn patch_body(value: Option<&str>) -> serde_json::Value {
    serde_json::json!({ "metadata": { "labels": { LABEL: value } } })
}

/// Writes the label of `node` from `inventory`, trying again with backoff
/// (1 s doubling to 60 s, [`RETRIES`] times) when the write fails. Returns
/// whether it was written.
pub async fn label_node(client: kube::Client, node: String, inventory: &Inventory) -> bool {
    let label = CliqueLabel::of(inventory);
    match &label {
        CliqueLabel::Conflict(cliques) => {
            tracing::warn!(node = %node, cliques = ?cliques, "the node's GPUs are in different NVLink cliques: no {LABEL} label");
        }
        CliqueLabel::Invalid(value) => {
            tracing::warn!(node = %node, value = %value.escape_debug(), "the NVLink clique is no valid label value: no {LABEL} label");
        }
        CliqueLabel::Set(_) | CliqueLabel::Absent => {}
    }
    let nodes: Api<Node> = Api::all(client);
    let patch = Patch::Merge(patch_body(label.value()));
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
    for attempt in 0..=RETRIES {
        match nodes.patch(&node, &PatchParams::default(), &patch).await {
            Ok(_) => {
                tracing::info!(node = %node, label = LABEL, value = label.value().unwrap_or("(removed)"), "node clique label written");
                return true;
            }
            Err(e) => {
                tracing::warn!(node = %node, label = LABEL, attempt, error = %e, "cannot write the node clique label");
            }
        }
        if attempt < RETRIES {
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::fixtures::{HOPPER, gpu, system};
    use gpu_nvml::FabricInfo;

    fn inventory(fabrics: &[Option<(&str, u32)>]) -> Inventory {
        Inventory {
            system: system(),
            gpus: fabrics
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let mut g = gpu(i as u32, HOPPER, None, &[]);
                    g.info.fabric = f.map(|(uuid, clique_id)| FabricInfo {
                        cluster_uuid: uuid.into(),
                        clique_id,
                    });
                    g
                })
                .collect(),
        }
    }

    const CLUSTER: &str = "09b319a2-e553-400e-b9ab-1ff0bd7d7daf";

    #[test]
    fn one_clique_is_the_label_in_gfd_format() {
        let inv = inventory(&[Some((CLUSTER, 32766)), Some((CLUSTER, 32766))]);
        assert_eq!(
            CliqueLabel::of(&inv),
            CliqueLabel::Set(format!("{CLUSTER}.32766"))
        );
        assert_eq!(
            patch_body(CliqueLabel::of(&inv).value()),
            serde_json::json!({"metadata": {"labels": {"nvidia.com/gpu.clique": format!("{CLUSTER}.32766")}}})
        );
    }

    #[test]
    fn no_clique_or_disagreeing_gpus_remove_the_label() {
        assert_eq!(
            CliqueLabel::of(&inventory(&[None, None])),
            CliqueLabel::Absent
        );
        assert_eq!(CliqueLabel::of(&inventory(&[])), CliqueLabel::Absent);
        // GPUs outside the fabric do not hide the others' clique.
        assert_eq!(
            CliqueLabel::of(&inventory(&[None, Some((CLUSTER, 1))])),
            CliqueLabel::Set(format!("{CLUSTER}.1"))
        );
        let two = CliqueLabel::of(&inventory(&[Some((CLUSTER, 1)), Some((CLUSTER, 2))]));
        assert_eq!(
            two,
            CliqueLabel::Conflict(vec![format!("{CLUSTER}.1"), format!("{CLUSTER}.2")])
        );
        assert_eq!(two.value(), None);
        assert_eq!(
            patch_body(None),
            serde_json::json!({"metadata": {"labels": {"nvidia.com/gpu.clique": null}}})
        );
    }

    #[test]
    fn hostile_fabric_values_never_become_a_label() {
        for bad in ["", "a b", "x/y", "-lead", "é", &"a".repeat(62)] {
            let inv = inventory(&[Some((bad, 1))]);
            assert_eq!(
                CliqueLabel::of(&inv),
                CliqueLabel::Invalid(format!("{bad}.1")),
                "{bad:?}"
            );
        }
        assert!(is_label_value(&format!("{}.1", "a".repeat(61))));
        assert!(is_label_value(&format!("{CLUSTER}.{}", u32::MAX)));
    }
}
