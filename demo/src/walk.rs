//! One example claim through the whole system, as in a cluster: the
//! webhook judges it, the API server stores it, the scheduler's allocator
//! places it and writes `status.allocation` through the API, the kubelet
//! asks the plugin to prepare it over the DRA socket, and the container
//! runtime resolves the CDI ids it got. Then, for all of them at once, the
//! kubelet's unprepare and the deletion of the claims.

use anyhow::{Context as _, bail};
use gpu_dra_sim::kubelet::{Claim, Plugin as KubeletPlugin};
use gpu_kubelet_plugin::prepare::Preparer;
use gpu_kubelet_plugin::prepare::checkpoint::ClaimUid;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::admission::Webhook;
use super::claims::{DemoClaim, NAMESPACE};
use super::inspect::{CdiRegistry, Prepared};
use super::scheduler::{self, Placement};

/// What the walk needs of the running system.
pub struct Cluster<'a> {
    /// A client of the API server stand-in.
    pub client: kube::Client,
    /// The simulated kubelet's connection to the plugin.
    pub kubelet: &'a KubeletPlugin,
    /// The plugin's preparer (its checkpoint).
    pub preparer: &'a Preparer,
    /// The admission webhook.
    pub webhook: &'a Webhook,
    /// The node the claims are placed on.
    pub node: &'a str,
    /// The CDI directory the runtime reads.
    pub cdi: &'a std::path::Path,
}

/// How a claim's walk ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Allocated and prepared: what its containers get.
    Prepared(Prepared),
    /// Denied by the webhook, never stored.
    Rejected {
        /// HTTP code of the denial.
        code: Option<u64>,
        /// The webhook's `status.message`.
        message: String,
    },
    /// Stored, but the allocator finds no devices for it: it stays pending.
    Unsatisfiable {
        /// The allocator's one-line explanation.
        explanation: String,
    },
    /// Allocated, but the plugin's prepare failed (a bug: the demo fails).
    PrepareFailed {
        /// The devices allocated.
        allocated: Vec<String>,
        /// The plugin's error.
        error: String,
    },
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Prepared(_) => "prepared",
            Outcome::Rejected { .. } => "rejected",
            Outcome::Unsatisfiable { .. } => "unsatisfiable",
            Outcome::PrepareFailed { .. } => "prepare failed",
        }
    }
}

/// One claim's walk.
#[derive(Debug, Clone)]
pub struct Walked {
    pub name: String,
    pub file: String,
    pub what: &'static str,
    /// Set once the API server stored it.
    pub uid: Option<String>,
    /// The webhook's warnings.
    pub warnings: Vec<String>,
    /// The allocation results, as written to the claim's status.
    pub allocation: Vec<Value>,
    /// For an unsatisfiable claim: the allocator's funnel per request.
    pub funnels: Vec<String>,
    /// `status.devices` entries the plugin published after prepare.
    pub status_devices: usize,
    pub outcome: Outcome,
}

impl Walked {
    /// Whether the kubelet must unprepare it (it was handed to the plugin).
    fn handed_to_plugin(&self) -> bool {
        matches!(
            self.outcome,
            Outcome::Prepared(_) | Outcome::PrepareFailed { .. }
        )
    }

    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "name": self.name,
            "namespace": NAMESPACE,
            "file": self.file,
            "what": self.what,
            "outcome": self.outcome.label(),
            "uid": self.uid,
            "admission": {"allowed": !matches!(self.outcome, Outcome::Rejected { .. }),
                          "warnings": self.warnings},
        });
        if !self.allocation.is_empty() {
            v["allocation"] = json!(self.allocation);
        }
        match &self.outcome {
            Outcome::Prepared(p) => {
                v["prepared"] = p.to_json();
                v["statusDevices"] = json!(self.status_devices);
            }
            Outcome::Rejected { code, message } => {
                v["admission"]["code"] = json!(code);
                v["admission"]["message"] = json!(message);
            }
            Outcome::Unsatisfiable { explanation } => {
                v["explanation"] = json!({"summary": explanation, "requests": self.funnels});
            }
            Outcome::PrepareFailed { error, .. } => v["error"] = json!(error),
        }
        v
    }
}

/// Walks one claim.
pub async fn walk(cluster: &Cluster<'_>, claim: &DemoClaim) -> anyhow::Result<Walked> {
    let mut walked = Walked {
        name: claim.name.clone(),
        file: claim.file.clone(),
        what: claim.what,
        uid: None,
        warnings: Vec::new(),
        allocation: Vec::new(),
        funnels: Vec::new(),
        status_devices: 0,
        outcome: Outcome::Unsatisfiable {
            explanation: String::new(),
        },
    };

    // Admission.
    let admission = cluster.webhook.review_create(&claim.object)?;
    walked.warnings = admission.warnings;
    if !admission.allowed {
        walked.outcome = Outcome::Rejected {
            code: admission.code,
            message: admission
                .message
                .unwrap_or_else(|| "denied without a message".to_owned()),
        };
        return Ok(walked);
    }

    // Stored by the API server.
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let object: ResourceClaim = serde_json::from_value(claim.object.clone())
        .with_context(|| format!("{}: not a ResourceClaim", claim.file))?;
    let created = claims
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("create ResourceClaim {}", claim.name))?;
    let uid = created
        .metadata
        .uid
        .clone()
        .context("the API server gave the claim no UID")?;
    walked.uid = Some(uid.clone());

    // The scheduler: everything it needs, read through the API.
    let (slices, classes, allocated) = cluster_state(&cluster.client, &uid).await?;
    let placement = scheduler::place(&slices, &classes, &allocated, &created, cluster.node)?;
    let (allocation, devices) = match placement {
        Placement::Unsatisfiable(explanation) => {
            walked.funnels = scheduler::funnels(&explanation);
            walked.outcome = Outcome::Unsatisfiable {
                explanation: explanation.summary,
            };
            return Ok(walked);
        }
        Placement::Allocated {
            allocation,
            devices,
        } => (allocation, devices),
    };
    walked.allocation = devices
        .results
        .iter()
        .map(|r| {
            json!({
                "request": r.request,
                "device": r.device,
                "pool": r.pool,
                "shareID": r.share_id,
                "consumedCapacity": r.consumed_capacity.iter()
                    .map(|(k, v)| (k.clone(), Value::from(v.canonical())))
                    .collect::<serde_json::Map<_, _>>(),
            })
        })
        .collect();
    let status = json!({"status": {"allocation": allocation}});
    claims
        .patch_status(&claim.name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("write the allocation of ResourceClaim {}", claim.name))?;

    // The kubelet prepares it for a pod.
    let reference = Claim::new(NAMESPACE, &claim.name, &uid);
    let mut answers = cluster
        .kubelet
        .prepare(std::slice::from_ref(&reference))
        .await
        .context("NodePrepareResources")?;
    let answer = answers
        .remove(&uid)
        .context("the plugin's answer does not name the claim")?;
    if let Some(error) = answer.error {
        walked.outcome = Outcome::PrepareFailed {
            allocated: devices.results.iter().map(|r| r.device.clone()).collect(),
            error,
        };
        return Ok(walked);
    }

    // The runtime resolves the CDI ids; the checkpoint says what was set up.
    let registry = CdiRegistry::scan(cluster.cdi)?;
    let entry = cluster
        .preparer
        .checkpoint()
        .claims
        .get(&ClaimUid(uid.clone()))
        .cloned();
    let prepared = Prepared::resolve(&answer.devices, &registry, entry.as_ref())
        .with_context(|| format!("resolve the CDI devices of {}", claim.name))?;
    walked.status_devices = status_devices(&claims, &claim.name, answer.devices.len()).await?;
    walked.outcome = Outcome::Prepared(prepared);
    Ok(walked)
}

/// How many `status.devices` entries claim `name` has, once it has
/// `expected`: the plugin writes them in the background after its answer.
/// Gives up after 15 s (room for a loaded machine) with what is there.
async fn status_devices(
    claims: &Api<ResourceClaim>,
    name: &str,
    expected: usize,
) -> anyhow::Result<usize> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let stored = claims.get(name).await?;
        let n = stored.status.and_then(|s| s.devices).map_or(0, |d| d.len());
        if n >= expected || std::time::Instant::now() >= deadline {
            return Ok(n);
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// ResourceSlices, DeviceClasses, and the allocated claims other than
/// `except`, as the scheduler's informers would have them.
pub async fn cluster_state(
    client: &kube::Client,
    except: &str,
) -> anyhow::Result<(Vec<ResourceSlice>, Vec<DeviceClass>, Vec<ResourceClaim>)> {
    let params = ListParams::default();
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&params)
        .await
        .context("list ResourceSlices")?
        .items;
    let classes = Api::<DeviceClass>::all(client.clone())
        .list(&params)
        .await
        .context("list DeviceClasses")?
        .items;
    let allocated = Api::<ResourceClaim>::all(client.clone())
        .list(&params)
        .await
        .context("list ResourceClaims")?
        .items
        .into_iter()
        .filter(|c| c.metadata.uid.as_deref() != Some(except))
        .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
        .collect();
    Ok((slices, classes, allocated))
}

/// The kubelet unprepares every claim it handed to the plugin, in one
/// call; returns how many.
pub async fn unprepare_all(cluster: &Cluster<'_>, walked: &[Walked]) -> anyhow::Result<usize> {
    let references: Vec<Claim> = walked
        .iter()
        .filter(|w| w.handed_to_plugin())
        .filter_map(|w| {
            w.uid
                .as_ref()
                .map(|uid| Claim::new(NAMESPACE, &w.name, uid))
        })
        .collect();
    if references.is_empty() {
        return Ok(0);
    }
    let answers = cluster
        .kubelet
        .unprepare(&references)
        .await
        .context("NodeUnprepareResources")?;
    for claim in &references {
        match answers.get(&claim.uid) {
            Some(a) if a.error.is_none() => {}
            Some(a) => bail!(
                "unprepare of {} failed: {}",
                claim.name,
                a.error.as_deref().unwrap_or_default()
            ),
            None => bail!("the plugin's unprepare answer does not name {}", claim.name),
        }
    }
    Ok(references.len())
}

/// Deletes the stored claims (their pods are gone); returns how many are
/// left in the API server afterwards.
pub async fn delete_all(cluster: &Cluster<'_>, walked: &[Walked]) -> anyhow::Result<usize> {
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    for w in walked.iter().filter(|w| w.uid.is_some()) {
        claims
            .delete(&w.name, &DeleteParams::default())
            .await
            .with_context(|| format!("delete ResourceClaim {}", w.name))?;
    }
    let left = claims.list(&ListParams::default()).await?.items.len();
    Ok(left)
}
