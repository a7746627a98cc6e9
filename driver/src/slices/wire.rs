//! The publisher's API calls (and the plugin's one read of its Node's
//! kubelet version), decoding only what they read.
//!
//! The API server answers with whole objects: a ResourceSlice of a
//! dynamic-MIG GPU pool is about 100 kB of JSON, and as much again of
//! `managedFields`; a Node carries its status (images, conditions). Through
//! `kube::Api` each answer becomes a full typed object (`managedFields` as
//! `serde_json::Value` trees), only to be dropped. Here the same requests,
//! made with the same kube client, decode just the fields the publisher uses:
//! - a Node: its UID, or its kubelet version;
//! - a listed slice: name, `resourceVersion`, owners and spec;
//! - an applied slice: its `resourceVersion`;
//! - a deleted slice: nothing;
//! - a watched slice: name and `resourceVersion` ([`SliceMeta`], enough for
//!   the watcher to resume).
//!
//! A listed slice is reduced to its [`Observed`] summary as soon as it is
//! decoded, so listing the pool never holds more than one decoded slice, and
//! every answer body is read into one buffer (the client's own
//! `request_text` copies it twice).
//!
//! Errors are the kube client's, exactly as `kube::Api` reports them (an
//! `Error::Api` with the server's status for 4xx/5xx answers).

use std::borrow::Cow;
use std::pin::pin;

use futures::AsyncReadExt as _;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, GetParams, ListParams, Patch, PatchParams};
use kube::core::Request;
use serde::de::{DeserializeOwned, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::pool::Observed;

/// The metadata fields the publisher reads.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    owner_references: Option<Vec<OwnerReference>>,
}

impl From<Meta> for ObjectMeta {
    fn from(m: Meta) -> Self {
        Self {
            name: m.name,
            uid: m.uid,
            resource_version: m.resource_version,
            owner_references: m.owner_references,
            ..Self::default()
        }
    }
}

/// An object of which only the metadata is read.
#[derive(Debug, Deserialize)]
struct MetaOnly {
    #[serde(default)]
    metadata: Meta,
}

/// A listed slice: metadata as [`Meta`] and the whole spec.
#[derive(Debug, Deserialize)]
struct ListedSlice {
    #[serde(default)]
    metadata: Meta,
    spec: ResourceSliceSpec,
}

/// A list of slices, each reduced to [`Observed`] as it is decoded.
#[derive(Debug, Deserialize)]
struct ObservedList {
    #[serde(default)]
    items: Option<ObservedItems>,
}

#[derive(Debug)]
struct ObservedItems(Vec<Observed>);

impl<'de> Deserialize<'de> for ObservedItems {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Items;
        impl<'de> Visitor<'de> for Items {
            type Value = ObservedItems;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of ResourceSlices")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ObservedItems, A::Error> {
                let mut out = Vec::new();
                while let Some(item) = seq.next_element::<ListedSlice>()? {
                    let slice = ResourceSlice {
                        metadata: item.metadata.into(),
                        spec: item.spec,
                    };
                    // Unnamed objects cannot be ours (or written at all).
                    out.extend(Observed::of(&slice));
                }
                Ok(ObservedItems(out))
            }
        }
        d.deserialize_seq(Items)
    }
}

/// Sends `request` and decodes the answer from one buffer.
async fn read_json<T: DeserializeOwned>(
    client: &kube::Client,
    request: http::Request<Vec<u8>>,
) -> kube::Result<T> {
    let mut body = pin!(client.request_stream(request).await?);
    let mut bytes = Vec::new();
    body.read_to_end(&mut bytes)
        .await
        .map_err(kube::Error::ReadEvents)?;
    serde_json::from_slice(&bytes).map_err(kube::Error::SerdeError)
}

fn path<K: kube::Resource<DynamicType = ()>>() -> String {
    K::url_path(&(), None)
}

fn build(
    r: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
) -> kube::Result<http::Request<Vec<u8>>> {
    r.map_err(kube::Error::BuildRequest)
}

/// The UID of Node `name` (`None` when it has none).
pub(super) async fn node_uid(client: &kube::Client, name: &str) -> kube::Result<Option<String>> {
    let request = build(Request::new(path::<Node>()).get(name, &GetParams::default()))?;
    let node: MetaOnly = read_json(client, request).await?;
    Ok(node.metadata.uid)
}

/// `status.nodeInfo.kubeletVersion` of Node `name` (empty when unset).
pub(crate) async fn node_kubelet_version(
    client: &kube::Client,
    name: &str,
) -> kube::Result<String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct NodeVersion {
        #[serde(default)]
        status: NodeStatus,
    }
    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct NodeStatus {
        #[serde(default)]
        node_info: NodeInfo,
    }
    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct NodeInfo {
        #[serde(default)]
        kubelet_version: String,
    }
    let request = build(Request::new(path::<Node>()).get(name, &GetParams::default()))?;
    let node: NodeVersion = read_json(client, request).await?;
    Ok(node.status.node_info.kubelet_version)
}

/// The slices matching `selector`, as [`Observed`] summaries.
pub(super) async fn list_slices(
    client: &kube::Client,
    selector: &str,
) -> kube::Result<Vec<Observed>> {
    let request =
        build(Request::new(path::<ResourceSlice>()).list(&ListParams::default().fields(selector)))?;
    let list: ObservedList = read_json(client, request).await?;
    Ok(list.items.map(|i| i.0).unwrap_or_default())
}

/// Server-side applies `slice` (named, with its type meta); returns the
/// `resourceVersion` the server answered with.
pub(super) async fn apply_slice(
    client: &kube::Client,
    slice: &ResourceSlice,
    params: &PatchParams,
) -> kube::Result<Option<String>> {
    let name = slice.metadata.name.as_deref().unwrap_or_default();
    let request =
        build(Request::new(path::<ResourceSlice>()).patch(name, params, &Patch::Apply(slice)))?;
    let applied: MetaOnly = read_json(client, request).await?;
    Ok(applied.metadata.resource_version)
}

/// Deletes slice `name`; of the answer only the metadata is decoded.
pub(super) async fn delete_slice(client: &kube::Client, name: &str) -> kube::Result<()> {
    let request =
        build(Request::new(path::<ResourceSlice>()).delete(name, &DeleteParams::default()))?;
    read_json::<MetaOnly>(client, request).await.map(drop)
}

/// A ResourceSlice as the publisher's watch sees it: name and
/// `resourceVersion` only.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "MetaOnly")]
pub(super) struct SliceMeta {
    metadata: ObjectMeta,
}

impl From<MetaOnly> for SliceMeta {
    fn from(o: MetaOnly) -> Self {
        Self {
            metadata: ObjectMeta {
                name: o.metadata.name,
                resource_version: o.metadata.resource_version,
                ..ObjectMeta::default()
            },
        }
    }
}

impl kube::Resource for SliceMeta {
    type DynamicType = ();
    type Scope = k8s_openapi::ClusterResourceScope;

    fn kind((): &()) -> Cow<'_, str> {
        <ResourceSlice as k8s_openapi::Resource>::KIND.into()
    }
    fn group((): &()) -> Cow<'_, str> {
        <ResourceSlice as k8s_openapi::Resource>::GROUP.into()
    }
    fn version((): &()) -> Cow<'_, str> {
        <ResourceSlice as k8s_openapi::Resource>::VERSION.into()
    }
    fn plural((): &()) -> Cow<'_, str> {
        <ResourceSlice as k8s_openapi::Resource>::URL_PATH_SEGMENT.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watch_type_addresses_resource_slices() {
        use kube::Resource as _;
        assert_eq!(path::<SliceMeta>(), path::<ResourceSlice>());
        assert_eq!(SliceMeta::api_version(&()), "resource.k8s.io/v1");
        assert_eq!(SliceMeta::kind(&()), "ResourceSlice");
    }

    #[test]
    fn answers_decode_only_what_is_read() {
        let text = r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice",
            "metadata":{"name":"n-0","uid":"u","resourceVersion":"42",
              "managedFields":[{"manager":"x","fieldsV1":{"f:spec":{}}}],
              "ownerReferences":[{"apiVersion":"v1","kind":"Node","name":"n","uid":"nu"}]},
            "spec":{"driver":"gpu.nvidia.com","nodeName":"n",
              "pool":{"name":"n","generation":3,"resourceSliceCount":1}}}"#;
        let meta: SliceMeta = serde_json::from_str(text).unwrap();
        assert_eq!(meta.metadata.name.as_deref(), Some("n-0"));
        assert_eq!(meta.metadata.resource_version.as_deref(), Some("42"));
        assert!(meta.metadata.managed_fields.is_none());

        let list: ObservedList = serde_json::from_str(&format!(
            r#"{{"kind":"ResourceSliceList","items":[{text},{text}]}}"#
        ))
        .unwrap();
        let items = list.items.unwrap().0;
        assert_eq!(items.len(), 2);
        assert_eq!(
            (
                items[0].name.as_str(),
                items[0].generation,
                items[0].resource_version.as_deref()
            ),
            ("n-0", 3, Some("42"))
        );
        assert_eq!(
            (items[0].pool.as_str(), items[0].driver.as_str()),
            ("n", "gpu.nvidia.com")
        );
        let meta: ObjectMeta = serde_json::from_str::<ListedSlice>(text)
            .unwrap()
            .metadata
            .into();
        assert_eq!(meta.owner_references.unwrap()[0].uid, "nu");
        assert_eq!(meta.uid.as_deref(), Some("u"));
        assert!(meta.managed_fields.is_none());

        // An empty list may leave out `items` or make it null; an unnamed
        // slice is left out; a slice without a spec is an error, not a
        // silently empty slice.
        for empty in [r#"{"kind":"List"}"#, r#"{"items":null}"#, r#"{"items":[]}"#] {
            let list: ObservedList = serde_json::from_str(empty).unwrap();
            assert!(list.items.is_none_or(|i| i.0.is_empty()), "{empty}");
        }
        let unnamed = text.replace(r#""name":"n-0","#, "");
        let list: ObservedList =
            serde_json::from_str(&format!(r#"{{"items":[{unnamed}]}}"#)).unwrap();
        assert!(list.items.unwrap().0.is_empty());
        assert!(serde_json::from_str::<ListedSlice>(r#"{"metadata":{}}"#).is_err());
        assert!(serde_json::from_str::<ObservedList>(r#"{"items":[{"metadata":{}}]}"#).is_err());
        assert!(serde_json::from_str::<ObservedList>(r#"{"items":{}}"#).is_err());
    }
}
