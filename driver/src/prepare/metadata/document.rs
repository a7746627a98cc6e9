//! The KEP-5304 metadata document (`kind: DeviceMetadata`) and its file
//! encoding: the same object once per API version, newest first, as a
//! stream of pretty-printed JSON objects each ending in a newline. Readers
//! (the Go `devicemetadata` package, KubeVirt) take the first version they
//! know. `v1beta1` is the version `k8s.io/dynamic-resource-allocation`
//! v0.37 requires a driver to write; `v1alpha1` follows it for readers
//! built against Kubernetes 1.36. Field names and order are the library's.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1 as api;
use serde::{Deserialize, Serialize};

/// The API group of the document.
pub const GROUP: &str = "metadata.resource.k8s.io";
/// The versions written, newest first.
pub const VERSIONS: [&str; 2] = ["v1beta1", "v1alpha1"];
/// The kind.
pub const KIND: &str = "DeviceMetadata";

/// One request's metadata file, in one API version.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceMetadata {
    /// `DeviceMetadata`.
    pub kind: String,
    /// `metadata.resource.k8s.io/<version>`.
    pub api_version: String,
    /// The claim.
    pub metadata: ClaimMeta,
    /// The claim's name in the pod spec, for a claim made from a template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_claim_name: Option<String>,
    /// The request (one per file), with its devices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<Request>,
}

/// The claim the file describes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimMeta {
    /// Claim name.
    #[serde(default)]
    pub name: String,
    /// Claim namespace.
    #[serde(default)]
    pub namespace: String,
    /// Claim UID.
    #[serde(default)]
    pub uid: String,
    /// Bumped on every rewrite of the file; 1 when written at prepare.
    #[serde(default)]
    pub generation: i64,
}

/// One request of the claim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The request as allocated (`<request>/<subrequest>` for a
    /// `firstAvailable` choice).
    pub name: String,
    /// Its devices from this driver.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<Device>,
}

/// One device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// The driver (`gpu.nvidia.com`).
    pub driver: String,
    /// The pool (the node's name).
    pub pool: String,
    /// The device name in the pool.
    pub name: String,
    /// The device's attributes as published in its ResourceSlice, in the
    /// resource API's encoding (`{"string": ...}`, `{"int": ...}`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, api::DeviceAttribute>,
    /// Network data (none for GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data: Option<api::NetworkDeviceData>,
}

/// A document without version: what [`encode`] writes once per version.
#[derive(Clone, Debug, PartialEq)]
pub struct Content {
    /// The claim.
    pub claim: ClaimMeta,
    /// See [`DeviceMetadata::pod_claim_name`].
    pub pod_claim_name: Option<String>,
    /// The request.
    pub request: Request,
}

/// The file's bytes: the document in every version of [`VERSIONS`], newest
/// first, each pretty-printed and followed by a newline.
pub fn encode(content: &Content) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::new();
    for version in VERSIONS {
        let doc = DeviceMetadata {
            kind: KIND.to_owned(),
            api_version: format!("{GROUP}/{version}"),
            metadata: content.claim.clone(),
            pod_claim_name: content.pod_claim_name.clone(),
            requests: vec![content.request.clone()],
        };
        serde_json::to_writer_pretty(&mut out, &doc)?;
        out.push(b'\n');
    }
    Ok(out)
}

/// The claim UID a file records: that of its first document. `None` when
/// the file does not start with a document of ours.
pub fn recorded_uid(bytes: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Head {
        kind: String,
        metadata: ClaimMeta,
    }
    let mut stream = serde_json::Deserializer::from_slice(bytes).into_iter::<Head>();
    let head = stream.next()?.ok()?;
    (head.kind == KIND && !head.metadata.uid.is_empty()).then_some(head.metadata.uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content() -> Content {
        let mut attributes = BTreeMap::new();
        attributes.insert(
            "resource.kubernetes.io/pciBusID".to_owned(),
            api::DeviceAttribute {
                string: Some("0000:18:00.0".into()),
                ..Default::default()
            },
        );
        attributes.insert(
            "index".to_owned(),
            api::DeviceAttribute {
                int: Some(0),
                ..Default::default()
            },
        );
        attributes.insert(
            "driverVersion".to_owned(),
            api::DeviceAttribute {
                version: Some("550.54.15".into()),
                ..Default::default()
            },
        );
        attributes.insert(
            "x".to_owned(),
            api::DeviceAttribute {
                bool: Some(true),
                ..Default::default()
            },
        );
        Content {
            claim: ClaimMeta {
                name: "train".into(),
                namespace: "ml".into(),
                uid: "0f8e6a1c-3b9d-4e57-a1c2-9d8f7e6b5a43".into(),
                generation: 1,
            },
            pod_claim_name: None,
            request: Request {
                name: "gpu".into(),
                devices: vec![Device {
                    driver: "gpu.nvidia.com".into(),
                    pool: "node-a".into(),
                    name: "gpu-0".into(),
                    attributes,
                    network_data: None,
                }],
            },
        }
    }

    /// Byte for byte what `k8s.io/dynamic-resource-allocation` v0.37.2's
    /// encoders write for the same object with versions v1beta1, v1alpha1
    /// (generated once with the Go library; `testdata/go-v0.37.2.json`).
    #[test]
    fn the_stream_is_byte_for_byte_the_go_librarys() {
        let ours = encode(&content()).unwrap();
        let go = include_str!("testdata/go-v0.37.2.json");
        assert_eq!(String::from_utf8(ours).unwrap(), go);
    }

    #[test]
    fn a_template_claim_records_its_pod_claim_name_after_the_claim() {
        let mut c = content();
        c.pod_claim_name = Some("gpus".into());
        let text = String::from_utf8(encode(&c).unwrap()).unwrap();
        let go = include_str!("testdata/go-v0.37.2-template.json");
        assert_eq!(text, go);
    }

    #[test]
    fn the_uid_is_read_back_and_foreign_files_have_none() {
        let bytes = encode(&content()).unwrap();
        assert_eq!(
            recorded_uid(&bytes).as_deref(),
            Some("0f8e6a1c-3b9d-4e57-a1c2-9d8f7e6b5a43")
        );
        for foreign in [
            &b""[..],
            b"not json",
            b"{\"kind\":\"Other\",\"metadata\":{\"uid\":\"u\"}}",
            b"{\"kind\":\"DeviceMetadata\",\"metadata\":{}}",
            b"[1,2]",
            &bytes[..bytes.len() / 3],
        ] {
            // A cut-off first document has no UID either.
            if foreign.len() > 100 {
                assert!(recorded_uid(foreign).is_none());
                continue;
            }
            assert!(recorded_uid(foreign).is_none(), "{foreign:?}");
        }
    }
}
