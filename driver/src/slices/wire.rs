//! The publisher's API calls, decoding only what it reads.
//!
//! The API server answers with whole objects: a ResourceSlice of a
//! dynamic-MIG GPU pool is about 100 kB of JSON, and as much again of
//! `managedFields`; a Node carries its status (images, conditions). Through
//! `kube::Api` each answer becomes a full typed object (`managedFields` as
//! `serde_json::Value` trees), only to be dropped. Here the same requests,
//! made with the same kube client, decode just the fields the publisher uses:
//! - a Node: its UID;
//! - a listed slice: name, `resourceVersion`, owners and spec;
//! - an applied slice: its `resourceVersion`;
//! - a deleted slice: nothing;
//! - a watched slice: name and `resourceVersion` ([`SliceMeta`], enough for
//!   the watcher to resume).
//!
//! Errors are the kube client's, exactly as `kube::Api` reports them (an
//! `Error::Api` with the server's status for 4xx/5xx answers).

use std::borrow::Cow;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, GetParams, ListParams, Patch, PatchParams};
use kube::core::Request;
use serde::Deserialize;

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

#[derive(Debug, Deserialize)]
struct List<T> {
    #[serde(default = "Vec::new")]
    items: Vec<T>,
}

fn path<K: kube::Resource<DynamicType = ()>>() -> String {
    K::url_path(&(), None)
}

fn build(r: Result<http::Request<Vec<u8>>, kube::core::request::Error>) -> kube::Result<http::Request<Vec<u8>>> {
    r.map_err(kube::Error::BuildRequest)
}

/// The UID of Node `name` (`None` when it has none).
pub(super) async fn node_uid(client: &kube::Client, name: &str) -> kube::Result<Option<String>> {
    let request = build(Request::new(path::<Node>()).get(name, &GetParams::default()))?;
    let node: MetaOnly = client.request(request).await?;
    Ok(node.metadata.uid)
}

/// The slices matching `selector`, with [`Meta`]'s metadata only.
pub(super) async fn list_slices(
    client: &kube::Client,
    selector: &str,
) -> kube::Result<Vec<ResourceSlice>> {
    let request = build(
        Request::new(path::<ResourceSlice>()).list(&ListParams::default().fields(selector)),
    )?;
    let list: List<ListedSlice> = client.request(request).await?;
    Ok(list
        .items
        .into_iter()
        .map(|s| ResourceSlice {
            metadata: s.metadata.into(),
            spec: s.spec,
        })
        .collect())
}

/// Server-side applies `slice` (named, with its type meta); returns the
/// `resourceVersion` the server answered with.
pub(super) async fn apply_slice(
    client: &kube::Client,
    slice: &ResourceSlice,
    params: &PatchParams,
) -> kube::Result<Option<String>> {
    let name = slice.metadata.name.as_deref().unwrap_or_default();
    let request = build(Request::new(path::<ResourceSlice>()).patch(
        name,
        params,
        &Patch::Apply(slice),
    ))?;
    let applied: MetaOnly = client.request(request).await?;
    Ok(applied.metadata.resource_version)
}

/// Deletes slice `name`; the answer's body is not decoded.
pub(super) async fn delete_slice(client: &kube::Client, name: &str) -> kube::Result<()> {
    let request =
        build(Request::new(path::<ResourceSlice>()).delete(name, &DeleteParams::default()))?;
    client.request_text(request).await.map(drop)
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

        let list: List<ListedSlice> =
            serde_json::from_str(&format!(r#"{{"kind":"ResourceSliceList","items":[{text}]}}"#))
                .unwrap();
        let slice = &list.items[0];
        assert_eq!(slice.spec.pool.generation, 3);
        let meta: ObjectMeta = serde_json::from_str::<ListedSlice>(text)
            .unwrap()
            .metadata
            .into();
        assert_eq!(meta.owner_references.unwrap()[0].uid, "nu");
        assert_eq!(meta.uid.as_deref(), Some("u"));
        assert!(meta.managed_fields.is_none());

        // An empty list may leave out `items`; a slice without a spec is an
        // error, not a silently empty slice.
        let empty: List<ListedSlice> = serde_json::from_str(r#"{"kind":"List"}"#).unwrap();
        assert!(empty.items.is_empty());
        assert!(serde_json::from_str::<ListedSlice>(r#"{"metadata":{}}"#).is_err());
    }
}
