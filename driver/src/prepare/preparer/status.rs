//! `status.devices` of prepared claims: one entry per device of ours with
//! condition `Ready` and data naming the hardware (GPU or MIG UUID, CDI
//! ids), so `kubectl get resourceclaim -o yaml` shows what the pod got.
//!
//! Written with server-side apply on the `status` subresource under a field
//! manager of this driver and node: the list is a map keyed by driver, pool,
//! device and share id, so entries of other drivers are untouched. Unprepare
//! removes exactly ours with a read-modify-write under the resource version
//! (an apply that drops items leaves the removal to the server's field
//! ownership rules, which differ between versions). Best effort: the
//! pod runs without it, so a failure (RBAC, a deleted claim) is logged, not
//! returned to kubelet.

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use super::Inner;
use crate::grpc::dra::ClaimRef;
use crate::prepare::checkpoint::{ClaimEntry, DeviceKind};

/// The field manager: driver and node, so plugins of several nodes sharing
/// a claim do not take each other's entries.
fn manager(inner: &Inner) -> String {
    let mut m = format!("{}/{}", inner.opts.driver_name, inner.opts.node_name);
    m.truncate(128);
    m
}

/// The apply body for `entry`.
pub(crate) fn body(driver: &str, claim: &ClaimRef, entry: Option<&ClaimEntry>, now: &str) -> Value {
    let devices: Vec<Value> = entry
        .map(|e| e.devices.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|d| {
            let mut data = serde_json::Map::new();
            match &d.kind {
                DeviceKind::Gpu { uuid, .. } => {
                    data.insert("uuid".into(), json!(uuid));
                }
                DeviceKind::Mig {
                    parent_uuid,
                    mig_uuid,
                    ..
                } => {
                    data.insert("parentUUID".into(), json!(parent_uuid));
                    if let Some(u) = mig_uuid {
                        data.insert("uuid".into(), json!(u));
                    }
                }
            }
            data.insert("cdiDeviceIDs".into(), json!(d.cdi_device_ids));
            if let Some(m) = &d.sharing.mps_daemon {
                data.insert("mpsDaemon".into(), json!(m.id));
            }
            let mut device = json!({
                "driver": driver,
                "pool": d.pool,
                "device": d.device,
                "conditions": [{
                    "type": "Ready",
                    "status": "True",
                    "reason": "Prepared",
                    "message": "prepared by the kubelet plugin",
                    "lastTransitionTime": now,
                }],
                "data": Value::Object(data),
            });
            if let Some(share) = &d.share_id {
                device["shareID"] = json!(share);
            }
            device
        })
        .collect();
    let status = json!({"devices": devices});
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
        "status": status,
    })
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

async fn apply(inner: &Inner, claim: &ClaimRef, body: Value, what: &str) {
    let api: Api<ResourceClaim> = Api::namespaced(inner.client.clone(), &claim.namespace);
    let params = PatchParams::apply(&manager(inner)).force();
    match api
        .patch_status(&claim.name, &params, &Patch::Apply(body))
        .await
    {
        Ok(_) => tracing::debug!(claim = %claim.uid, what, "claim status written"),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            tracing::debug!(claim = %claim.uid, what, "claim gone; no status to write");
        }
        Err(e) => tracing::warn!(
            claim = %claim.uid,
            namespace = %claim.namespace,
            name = %claim.name,
            what,
            error = %e,
            "cannot write the claim's status.devices (the pod is not affected)"
        ),
    }
}

/// Publishes the devices of a prepared claim.
pub(crate) async fn publish(inner: &Inner, claim: &ClaimRef, entry: &ClaimEntry) {
    let body = body(&inner.opts.driver_name, claim, Some(entry), &now());
    apply(inner, claim, body, "prepared").await;
}

/// Removes our entries of an unprepared claim: read, drop the entries of
/// this driver and node, write back under the read `resourceVersion`
/// (retried on conflicts). Entries of other drivers are kept as they are.
pub(crate) async fn clear(inner: &Inner, claim: &ClaimRef) {
    let api: Api<ResourceClaim> = Api::namespaced(inner.client.clone(), &claim.namespace);
    for _ in 0..3 {
        let mut object = match api.get_opt(&claim.name).await {
            Ok(Some(o)) if o.metadata.uid.as_deref() == Some(claim.uid.as_str()) => o,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(claim = %claim.uid, error = %e, "cannot read the claim to clear its status.devices");
                return;
            }
        };
        let Some(devices) = object.status.as_mut().and_then(|s| s.devices.as_mut()) else {
            return;
        };
        let before = devices.len();
        devices.retain(|d| !(d.driver == inner.opts.driver_name && d.pool == inner.opts.node_name));
        if devices.len() == before {
            return;
        }
        match api
            .replace_status(&claim.name, &kube::api::PostParams::default(), &object)
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return,
            Err(e) => {
                tracing::warn!(claim = %claim.uid, error = %e, "cannot clear the claim's status.devices (the pod is not affected)");
                return;
            }
        }
    }
    tracing::warn!(claim = %claim.uid, "status.devices not cleared: the claim kept changing");
}
