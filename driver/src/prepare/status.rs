//! `status.devices` of prepared claims: one entry per device of ours with
//! condition `Ready` and data naming the hardware (GPU or MIG UUID, CDI
//! ids), so `kubectl get resourceclaim -o yaml` shows what the pod got.
//!
//! Written with server-side apply on the `status` subresource under a field
//! manager of this driver and node: the list is a map keyed by driver, pool,
//! device and share id, so entries of other drivers are untouched. Unprepare
//! removes exactly ours with a read-modify-write under the resource version
//! (an apply that drops items leaves the removal to the server's field
//! ownership rules, which differ between versions). The claim is read and
//! written back as plain JSON, not as this build's `ResourceClaim` type:
//! fields that type does not know (a newer API server's) are kept, and an
//! allocation, which may not change, is sent back as it was. Best effort:
//! the pod runs without it, so a failure (RBAC, a deleted claim) is
//! logged, not returned to kubelet.
//!
//! The write runs in the background, after kubelet has its answer
//! ([`Writes::publish`]): on a cluster it is an API server round trip with
//! an etcd write behind it, which a prepare (a pod start) need not wait
//! for. The writes and clears of one claim run in order, one after the
//! other ([`Writes::clear`]): a late write never brings cleared entries
//! back, and a clear never removes the entries of a prepare that came
//! after it. A crash before the write lands is covered at the
//! next start: every completed claim whose entries are missing is
//! published again ([`republish_missing`]). Every request gives up after
//! [`REQUEST_TIMEOUT`], so a hung API server delays an unprepare by a
//! bounded time, never forever.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::Inner;
use crate::prepare::checkpoint::{ClaimEntry, ClaimState, ClaimUid, DeviceKind};
use crate::prepare::claim::ClaimRef;

/// Attempts of one background write (transport errors, timeouts and
/// 5xx/429 only).
const ATTEMPTS: u32 = 3;
/// How long one API request may take. The kube client has no read timeout
/// of its own (watches are long), and an unprepare waits for the claim's
/// write and its clear: a hung API server must not hang it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The wait before the second attempt; doubled before the third.
const RETRY_DELAY: Duration = Duration::from_millis(200);

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
                DeviceKind::Vfio {
                    uuid, pci_bus_id, ..
                } => {
                    data.insert("uuid".into(), json!(uuid));
                    data.insert("pciBusID".into(), json!(pci_bus_id));
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

/// Whether a failed write is worth another attempt: the server or the
/// connection failed, not the request.
fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429,
        _ => true,
    }
}

/// `request`, failed with a transport-level error after `limit`.
pub(super) async fn bounded<T>(
    limit: Duration,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    tokio::time::timeout(limit, request)
        .await
        .unwrap_or_else(|_| {
            Err(kube::Error::Service(
                format!(
                    "no answer from the API server within {} ms",
                    limit.as_millis()
                )
                .into(),
            ))
        })
}

/// Applies `body` to the claim's status (up to [`ATTEMPTS`] times, each
/// request bounded by `limit`).
async fn apply(
    client: &kube::Client,
    manager: &str,
    claim: &ClaimRef,
    body: Value,
    limit: Duration,
) {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &claim.namespace);
    let params = PatchParams::apply(manager).force();
    let mut delay = RETRY_DELAY;
    for attempt in 1..=ATTEMPTS {
        let patch = Patch::Apply(&body);
        let request = api.patch_status(&claim.name, &params, &patch);
        match bounded(limit, request).await {
            Ok(_) => {
                tracing::debug!(claim = %claim.uid, "claim status written");
                return;
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {
                tracing::debug!(claim = %claim.uid, "claim gone; no status to write");
                return;
            }
            Err(e) if attempt < ATTEMPTS && transient(&e) => {
                tracing::debug!(claim = %claim.uid, attempt, error = %e, "claim status write failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(e) => {
                tracing::warn!(
                    claim = %claim.uid,
                    namespace = %claim.namespace,
                    name = %claim.name,
                    attempt,
                    error = %e,
                    "cannot write the claim's status.devices (the pod is not affected)"
                );
                return;
            }
        }
    }
}

/// A running write: its generation (to tell it from a later one) and task.
type Running = HashMap<ClaimUid, (u64, tokio::task::JoinHandle<()>)>;

/// Background status writes still running, by claim.
#[derive(Default)]
pub(crate) struct Writes {
    running: Arc<Mutex<Running>>,
    generation: AtomicU64,
}

impl Writes {
    /// Publishes the devices of a prepared claim in the background, after
    /// any earlier write of the same claim, if the claim is still
    /// prepared. Unprepare removes the checkpoint entry, then
    /// [`clear`](Self::clear)s: the checks of both take the same lock, so
    /// a write either comes before the clear or never starts.
    pub(crate) fn publish(&self, inner: &Inner, claim: &ClaimRef, entry: &ClaimEntry) {
        let body = body(&inner.opts.driver_name, claim, Some(entry), &now());
        let (client, manager, claim) = (inner.client.clone(), manager(inner), claim.clone());
        let uid = ClaimUid(claim.uid.clone());
        let prepared = || {
            inner
                .store
                .get(&uid)
                .is_some_and(|e| e.state == ClaimState::PrepareCompleted)
        };
        let write = async move {
            // The answer to kubelet is queued behind this task on the
            // runtime: let it go out first.
            tokio::task::yield_now().await;
            apply(&client, &manager, &claim, body, REQUEST_TIMEOUT).await;
        };
        if !self.spawn_if(uid.clone(), prepared, write) {
            tracing::debug!(claim = %uid, "claim unprepared meanwhile; status not written");
        }
    }

    /// Runs `write` in a task of its own once the earlier write of `uid`
    /// (if any) is done, when `wanted` (asked under the lock) says so.
    fn spawn_if(
        &self,
        uid: ClaimUid,
        wanted: impl FnOnce() -> bool,
        write: impl Future<Output = ()> + Send + 'static,
    ) -> bool {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let running = Arc::clone(&self.running);
        // The map stays locked until the new write is in it, so the write
        // cannot remove itself before it was added.
        let mut map = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if !wanted() {
            return false;
        }
        let earlier = map.remove(&uid).map(|(_, handle)| handle);
        let key = uid.clone();
        let handle = tokio::spawn(async move {
            if let Some(earlier) = earlier {
                let _ = earlier.await;
            }
            write.await;
            let mut map = running.lock().unwrap_or_else(PoisonError::into_inner);
            if map.get(&key).is_some_and(|(g, _)| *g == generation) {
                map.remove(&key);
            }
        });
        map.insert(uid, (generation, handle));
        true
    }

    /// Removes our entries from the `status.devices` of an unprepared
    /// claim in the background, after the claim's earlier writes; a later
    /// prepare's write of the same claim comes after it (the writes of a
    /// claim run one after the other). Skipped when the claim was prepared
    /// again meanwhile: that prepare's write comes after this point.
    ///
    /// The unprepare does not wait for it: nothing kubelet relies on
    /// depends on it (kubelet reads the answer, not the status), and the
    /// read and write back took two API round trips of every unprepare's
    /// answer. A plugin stopped before the write leaves the entries to the
    /// API server, which drops `status.devices` entries of deallocated
    /// devices itself when the claim is deallocated.
    pub(crate) fn clear(&self, inner: &Inner, claim: &ClaimRef) {
        let uid = ClaimUid(claim.uid.clone());
        let (client, driver, node) = (
            inner.client.clone(),
            inner.opts.driver_name.clone(),
            inner.opts.node_name.clone(),
        );
        let claim = claim.clone();
        let unprepared = || inner.store.get(&uid).is_none();
        let clear = async move {
            // The answer to kubelet is queued behind this task on the
            // runtime: let it go out first.
            tokio::task::yield_now().await;
            clear(&client, &driver, &node, &claim).await;
        };
        if !self.spawn_if(uid.clone(), unprepared, clear) {
            tracing::debug!(claim = %uid, "claim prepared again meanwhile; status not cleared");
        }
    }

    /// Waits until no status write of `uid` runs.
    #[cfg(test)]
    async fn settle(&self, uid: &ClaimUid) {
        let handle = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
        if let Some((_, handle)) = handle {
            let _ = handle.await;
        }
    }

    /// Claims with a write still running.
    #[cfg(test)]
    fn running(&self) -> usize {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// Publishes, one claim after the other, the devices of completed claims
/// whose `status.devices` lacks some of ours (a crash came between the
/// answer to kubelet and the write). Claims that are gone or were
/// replaced (another UID) are skipped.
/// Holds the preparer only while publishing, not across API calls.
pub(crate) async fn republish_missing(inner: std::sync::Weak<Inner>) {
    let Some((client, driver, node, completed)) = inner.upgrade().map(|inner| {
        (
            inner.client.clone(),
            inner.opts.driver_name.clone(),
            inner.opts.node_name.clone(),
            completed_entries(&inner),
        )
    }) else {
        return;
    };
    let mut published = 0_usize;
    for (uid, entry) in completed {
        let claim = ClaimRef {
            namespace: entry.namespace.clone(),
            name: entry.name.clone(),
            uid: uid.0.clone(),
        };
        if lacks_ours(&client, &driver, &node, &claim, entry.devices.len()).await {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            inner.status_writes.publish(&inner, &claim, &entry);
            published += 1;
        }
    }
    if published > 0 {
        tracing::info!(
            claims = published,
            "status.devices of prepared claims written again"
        );
    }
}

/// Publishes the devices of a claim answered again from its completed
/// entry only if its `status.devices` lacks some of ours (a read instead
/// of a write, and the `Ready` condition keeps the time it became true).
pub(crate) async fn publish_if_missing(inner: Arc<Inner>, claim: ClaimRef, entry: ClaimEntry) {
    let (driver, node) = (&inner.opts.driver_name, &inner.opts.node_name);
    if lacks_ours(&inner.client, driver, node, &claim, entry.devices.len()).await {
        inner.status_writes.publish(&inner, &claim, &entry);
    }
}

/// Whether the claim (with this UID) has fewer than `expected` entries of
/// `driver` and `node` in its `status.devices`; false when it is gone,
/// replaced, or cannot be read (logged).
async fn lacks_ours(
    client: &kube::Client,
    driver: &str,
    node: &str,
    claim: &ClaimRef,
    expected: usize,
) -> bool {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &claim.namespace);
    let object = match bounded(REQUEST_TIMEOUT, api.get_opt(&claim.name)).await {
        Ok(Some(o)) if o.metadata.uid.as_deref() == Some(claim.uid.as_str()) => o,
        Ok(_) => return false,
        Err(e) => {
            tracing::warn!(claim = %claim.uid, error = %e, "cannot read a prepared claim to check its status.devices");
            return false;
        }
    };
    let ours = object
        .status
        .and_then(|s| s.devices)
        .unwrap_or_default()
        .iter()
        .filter(|d| d.driver == driver && d.pool == node)
        .count();
    ours < expected
}

fn completed_entries(inner: &Inner) -> Vec<(ClaimUid, ClaimEntry)> {
    inner
        .store
        .snapshot()
        .claims
        .into_iter()
        .filter(|(_, e)| e.state == ClaimState::PrepareCompleted)
        .collect()
}

/// The API resource of claims, for reading and writing them as plain JSON.
fn claims_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "resource.k8s.io",
        "v1",
        "ResourceClaim",
    ))
}

/// Removes the entries of `driver` and `node` from a claim's
/// `status.devices`: read, drop them, write back under the read
/// `resourceVersion` (retried on conflicts). Everything else, other
/// drivers' entries and fields this build does not know, is written back
/// as it was read.
async fn clear(client: &kube::Client, driver: &str, node: &str, claim: &ClaimRef) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &claim.namespace, &claims_resource());
    for _ in 0..3 {
        let mut object = match bounded(REQUEST_TIMEOUT, api.get_opt(&claim.name)).await {
            Ok(Some(o)) if o.metadata.uid.as_deref() == Some(claim.uid.as_str()) => o,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(claim = %claim.uid, error = %e, "cannot read the claim to clear its status.devices");
                return;
            }
        };
        let Some(devices) = object
            .data
            .pointer_mut("/status/devices")
            .and_then(Value::as_array_mut)
        else {
            return;
        };
        let before = devices.len();
        devices.retain(|d| !(d["driver"] == driver && d["pool"] == node));
        if devices.len() == before {
            return;
        }
        let params = PostParams::default();
        let request = api.replace_status(&claim.name, &params, &object);
        match bounded(REQUEST_TIMEOUT, request).await {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::Mutex;

    use tokio::sync::oneshot;

    use super::*;

    fn uid(s: &str) -> ClaimUid {
        ClaimUid(s.to_owned())
    }

    #[tokio::test]
    async fn writes_of_one_claim_land_in_order_and_settle_waits_for_the_last() {
        let writes = Writes::default();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (release, held) = oneshot::channel::<()>();
        let first = Arc::clone(&log);
        assert!(writes.spawn_if(uid("a"), || true, async move {
            let _ = held.await;
            first.lock().unwrap().push("a1");
        }));
        let second = Arc::clone(&log);
        assert!(writes.spawn_if(uid("a"), || true, async move {
            second.lock().unwrap().push("a2");
        }));
        let other = Arc::clone(&log);
        assert!(writes.spawn_if(uid("b"), || true, async move {
            other.lock().unwrap().push("b1");
        }));
        // Another claim's write does not wait for claim a's.
        writes.settle(&uid("b")).await;
        assert_eq!(*log.lock().unwrap(), ["b1"]);
        assert_eq!(writes.running(), 1, "claim a's writes are still running");

        let settled = tokio::spawn({
            let log = Arc::clone(&log);
            let writes = Arc::new(writes);
            async move {
                writes.settle(&uid("a")).await;
                let seen = log.lock().unwrap().clone();
                (seen, writes.running())
            }
        });
        tokio::task::yield_now().await;
        assert!(
            !settled.is_finished(),
            "settle returned before the write landed"
        );
        release.send(()).unwrap();
        let (seen, running) = settled.await.unwrap();
        assert_eq!(seen, ["b1", "a1", "a2"]);
        assert_eq!(running, 0);
    }

    /// A clear (started without waiting, as unprepare does) runs after the
    /// claim's earlier write, and a write started after it lands after it,
    /// however long the earlier one takes.
    #[tokio::test]
    async fn a_clear_comes_after_the_earlier_write_and_before_a_later_one() {
        let writes = Writes::default();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (release, held) = oneshot::channel::<()>();
        let early = Arc::clone(&log);
        assert!(writes.spawn_if(uid("a"), || true, async move {
            let _ = held.await;
            early.lock().unwrap().push("publish");
        }));
        let cleared = Arc::clone(&log);
        assert!(writes.spawn_if(uid("a"), || true, async move {
            cleared.lock().unwrap().push("clear");
        }));
        let late = Arc::clone(&log);
        assert!(writes.spawn_if(uid("a"), || true, async move {
            late.lock().unwrap().push("publish again");
        }));
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(
            log.lock().unwrap().is_empty(),
            "a write ran before the earlier one ended"
        );
        release.send(()).unwrap();
        writes.settle(&uid("a")).await;
        assert_eq!(*log.lock().unwrap(), ["publish", "clear", "publish again"]);
        // Not wanted: nothing runs.
        assert!(!writes.spawn_if(uid("a"), || false, async { unreachable!() }));
    }

    #[tokio::test]
    async fn a_finished_write_leaves_nothing_behind_and_settle_of_unknown_is_immediate() {
        let writes = Writes::default();
        let (done, finished) = oneshot::channel::<()>();
        assert!(writes.spawn_if(uid("a"), || true, async move {
            let _ = done.send(());
        }));
        finished.await.unwrap();
        // The task removes itself right after its write.
        for _ in 0..100 {
            if writes.running() == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(writes.running(), 0);
        writes.settle(&uid("a")).await;
        writes.settle(&uid("never")).await;
    }

    #[tokio::test]
    async fn an_unwanted_write_never_runs() {
        let writes = Writes::default();
        let ran = Arc::new(Mutex::new(false));
        let flag = Arc::clone(&ran);
        let started = writes.spawn_if(uid("a"), || false, async move {
            *flag.lock().unwrap() = true;
        });
        assert!(!started);
        assert_eq!(writes.running(), 0);
        writes.settle(&uid("a")).await;
        tokio::task::yield_now().await;
        assert!(!*ran.lock().unwrap());
    }

    /// An API server that accepts connections and never answers: each
    /// attempt gives up after its limit, and all attempts are made.
    #[tokio::test]
    async fn a_hung_api_server_costs_a_bounded_wait_and_every_attempt() {
        let (client, accepted, server) = crate::test_support::hung_api_server().await;
        let claim = ClaimRef {
            namespace: "default".into(),
            name: "c".into(),
            uid: "u".into(),
        };
        let body = body("gpu.nvidia.com", &claim, None, &now());
        // Each attempt's limit leaves a loaded machine time to connect.
        let write = apply(&client, "m", &claim, body, Duration::from_millis(500));
        tokio::time::timeout(Duration::from_secs(20), write)
            .await
            .expect("the write gave up on its own");
        // One connection per attempt: a timed-out request's connection is
        // not reused. (The last one may still wait in the listen backlog
        // for this runtime's accept task.)
        for _ in 0..200 {
            if accepted.load(Ordering::SeqCst) >= ATTEMPTS as usize {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), ATTEMPTS as usize);
        server.abort();
    }

    #[tokio::test]
    async fn bounded_names_the_limit() {
        let never = std::future::pending::<Result<(), kube::Error>>();
        let error = bounded(Duration::from_millis(10), never).await.unwrap_err();
        assert!(error.to_string().contains("within 10 ms"), "{error}");
        assert!(transient(&error));
    }

    #[test]
    fn only_server_and_transport_failures_are_retried() {
        let api = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("x", "y")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(transient(&api(500)));
        assert!(transient(&api(503)));
        assert!(transient(&api(429)));
        assert!(!transient(&api(403)));
        assert!(!transient(&api(422)));
        assert!(!transient(&api(409)));
    }
}
