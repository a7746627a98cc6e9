//! Records `events.k8s.io/v1` Events on claims, at most one per claim,
//! reason and note: before creating one it looks for an Event this
//! controller already recorded on the claim with the same reason and note
//! (so a restart or a new leader does not repeat what the last one said).

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, Resource as _};

use super::Error;
use super::simulate::{EVENT_NOTE_MAX_BYTES, truncate};

/// The Event's `action`: what the controller did about the claim.
pub const ACTION: &str = "SimulateAllocation";
/// Reason of the Event on a claim no node can satisfy.
pub const REASON_UNALLOCATABLE: &str = "Unallocatable";
/// Reason of the Event on a claim whose simulation met an error the
/// scheduler would meet too.
pub const REASON_ALLOCATION_ERROR: &str = "AllocationError";

/// Longest `reportingInstance` the API accepts.
const INSTANCE_MAX: usize = 128;

/// Who reports the Events.
#[derive(Clone)]
pub struct EventRecorder {
    client: Client,
    controller: String,
    instance: String,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("controller", &self.controller)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// A recorder reporting as `controller` (a qualified name, e.g.
    /// `gpu.nvidia.com/controller`) from `instance` (this replica; cut to
    /// 128 bytes).
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        EventRecorder {
            client,
            controller: controller.to_owned(),
            instance: truncate_plain(instance, INSTANCE_MAX),
        }
    }

    /// Records a Warning Event on `claim` unless this controller already
    /// recorded one with the same reason and note. Returns whether it
    /// created one.
    pub async fn warn_once(
        &self,
        claim: &ResourceClaim,
        reason: &'static str,
        note: &str,
    ) -> Result<bool, Error> {
        let note = truncate(note, EVENT_NOTE_MAX_BYTES);
        let namespace = claim.metadata.namespace.as_deref().unwrap_or("default");
        let name = claim.metadata.name.as_deref().unwrap_or("");
        let events: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        if self.already_recorded(&events, claim, reason, &note).await? {
            return Ok(false);
        }
        let event = self.event(claim, reason, note);
        events
            .create(&PostParams::default(), &event)
            .await
            .map_err(|e| {
                Error::kube(format!("recording an event on claim {namespace}/{name}"), e)
            })?;
        Ok(true)
    }

    async fn already_recorded(
        &self,
        events: &Api<Event>,
        claim: &ResourceClaim,
        reason: &str,
        note: &str,
    ) -> Result<bool, Error> {
        let Some(uid) = claim.metadata.uid.as_deref() else {
            return Ok(false);
        };
        let params = ListParams::default().fields(&format!("regarding.uid={uid}"));
        match events.list(&params).await {
            Ok(list) => Ok(list.items.iter().any(|e| {
                e.reporting_controller.as_deref() == Some(self.controller.as_str())
                    && e.reason.as_deref() == Some(reason)
                    && e.note.as_deref() == Some(note)
            })),
            // A server that does not know the field label: record anyway.
            Err(kube::Error::Api(status)) if status.code == 400 => {
                tracing::debug!(message = %status.message, "cannot look up earlier events");
                Ok(false)
            }
            Err(e) => Err(Error::kube(
                format!(
                    "listing events of claim {}/{}",
                    claim.metadata.namespace.as_deref().unwrap_or(""),
                    claim.metadata.name.as_deref().unwrap_or("")
                ),
                e,
            )),
        }
    }

    fn event(&self, claim: &ResourceClaim, reason: &str, note: String) -> Event {
        let now = Timestamp::now();
        let regarding: ObjectReference = claim.object_ref(&());
        Event {
            metadata: ObjectMeta {
                name: Some(event_name(
                    claim.metadata.name.as_deref().unwrap_or("claim"),
                    now.as_nanosecond(),
                )),
                namespace: claim.metadata.namespace.clone(),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some("Warning".to_owned()),
            reason: Some(reason.to_owned()),
            action: Some(ACTION.to_owned()),
            note: Some(note),
            regarding: Some(regarding),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        }
    }
}

/// `<claim>.<nanoseconds in hex>`, a DNS subdomain of at most 253 bytes
/// (claim names are subdomains; a long one is cut and cleaned).
pub(crate) fn event_name(claim: &str, nanos: i128) -> String {
    let suffix = format!("{:x}", nanos.max(0));
    let keep = 253 - 1 - suffix.len();
    let mut base = truncate_plain(claim, keep);
    while base.ends_with(['-', '.']) {
        base.pop();
    }
    if base.is_empty() {
        base.push_str("claim");
    }
    format!("{base}.{suffix}")
}

/// `text` cut to at most `max` bytes on a character boundary.
fn truncate_plain(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_are_subdomains_within_limits() {
        assert_eq!(event_name("claim-1", 255), "claim-1.ff");
        let long = format!("{}-{}", "a".repeat(230), "b".repeat(22));
        let name = event_name(&long, i128::from(u64::MAX));
        assert!(name.len() <= 253, "{}", name.len());
        assert!(name.ends_with(".ffffffffffffffff"));
        let dashed = format!("{}-zzz", "a".repeat(250));
        assert_eq!(event_name(&dashed, 1), format!("{}.1", "a".repeat(250)));
        assert_eq!(event_name("", 1), "claim.1");
        assert_eq!(event_name("x", -5), "x.0");
    }

    #[test]
    fn instances_are_cut_to_the_api_limit() {
        assert_eq!(truncate_plain("ééé", 3), "é");
        assert_eq!(truncate_plain("abc", 10), "abc");
    }
}
