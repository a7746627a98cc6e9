//! The demo's example claims: the manifests of `demo/` (this package's
//! folder), compiled into the binary, in the order the demo walks them. Each
//! is a plain ResourceClaim a user could `kubectl apply`; a test keeps this
//! list equal to the directory.

use anyhow::bail;
use serde_json::Value;

use crate::manifest;

/// File name, what it shows, and contents of every demo claim.
pub const FILES: &[(&str, &str, &str)] = &[
    (
        "whole-gpu.yaml",
        "a whole GPU",
        include_str!("../whole-gpu.yaml"),
    ),
    (
        "nvlink-pair.yaml",
        "two NVLink-connected GPUs",
        include_str!("../nvlink-pair.yaml"),
    ),
    (
        "mig-1g10gb.yaml",
        "a dynamic MIG 1g.10gb device",
        include_str!("../mig-1g10gb.yaml"),
    ),
    (
        "mps-gpu.yaml",
        "a GPU shared through MPS, 25% of the SMs and 10Gi per client",
        include_str!("../mps-gpu.yaml"),
    ),
    (
        "memory-share-a.yaml",
        "4Gi of a memory-shared GPU",
        include_str!("../memory-share-a.yaml"),
    ),
    (
        "memory-share-b.yaml",
        "8Gi of the same GPU",
        include_str!("../memory-share-b.yaml"),
    ),
    (
        "invalid-selector.yaml",
        "a selector with a typo",
        include_str!("../invalid-selector.yaml"),
    ),
    (
        "too-much-memory.yaml",
        "a GPU with 256Gi of memory",
        include_str!("../too-much-memory.yaml"),
    ),
];

/// The namespace the demo's claims live in.
pub const NAMESPACE: &str = "default";

/// One example claim.
#[derive(Debug, Clone)]
pub struct DemoClaim {
    /// `demo/<file>`.
    pub file: String,
    /// What it asks for, in a few words.
    pub what: &'static str,
    /// `metadata.name`.
    pub name: String,
    /// The ResourceClaim as JSON, namespace set.
    pub object: Value,
}

/// The embedded claims, parsed.
pub fn load() -> anyhow::Result<Vec<DemoClaim>> {
    FILES
        .iter()
        .map(|(file, what, text)| parse_one(&format!("demo/{file}"), what, text))
        .collect()
}

/// The one ResourceClaim of a manifest, with the demo's namespace.
fn parse_one(file: &str, what: &'static str, text: &str) -> anyhow::Result<DemoClaim> {
    let parsed = manifest::parse(file, text);
    if let Some(e) = parsed.errors.first() {
        bail!("{e}");
    }
    let [doc] = parsed.documents.as_slice() else {
        bail!(
            "{file}: expected one ResourceClaim, found {} documents",
            parsed.documents.len()
        );
    };
    if doc.kind() != "ResourceClaim" || doc.api_version() != "resource.k8s.io/v1" {
        bail!(
            "{}: expected a resource.k8s.io/v1 ResourceClaim, found {} {}",
            doc.position(),
            doc.api_version(),
            doc.kind()
        );
    }
    let name = doc.name().to_owned();
    if name.is_empty() {
        bail!("{}: the ResourceClaim has no metadata.name", doc.position());
    }
    let mut object = doc.value.clone();
    object["metadata"]["namespace"] = Value::from(NAMESPACE);
    Ok(DemoClaim {
        file: file.to_owned(),
        what,
        name,
        object,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `*.yaml`/`*.yml` file names in `dir`, sorted.
    fn yaml_file_names(dir: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn embedded_list_matches_the_directory() {
        let on_disk = yaml_file_names(env!("CARGO_MANIFEST_DIR"));
        let mut embedded: Vec<String> = FILES.iter().map(|(n, _, _)| (*n).to_owned()).collect();
        embedded.sort();
        assert_eq!(embedded, on_disk, "add new demo manifests to claims::FILES");
    }

    #[test]
    fn every_manifest_is_one_claim_named_after_its_file() {
        let claims = load().unwrap();
        assert_eq!(claims.len(), FILES.len());
        for claim in &claims {
            let stem = claim
                .file
                .strip_prefix("demo/")
                .and_then(|f| f.strip_suffix(".yaml"))
                .unwrap();
            assert_eq!(claim.name, stem);
            assert_eq!(claim.object["metadata"]["namespace"], NAMESPACE);
            let decoded: Result<k8s_openapi::api::resource::v1::ResourceClaim, _> =
                serde_json::from_value(claim.object.clone());
            assert!(decoded.is_ok(), "{}: {decoded:?}", claim.file);
        }
    }

    #[test]
    fn malformed_or_wrong_manifests_are_errors_naming_the_file() {
        for (text, needle) in [
            ("kind: [", "x.yaml"),
            ("", "found 0 documents"),
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
                "expected a resource.k8s.io/v1 ResourceClaim",
            ),
            (
                "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {}\n",
                "no metadata.name",
            ),
            (
                "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: a}\n---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: b}\n",
                "found 2 documents",
            ),
        ] {
            let err = format!("{:#}", parse_one("x.yaml", "x", text).unwrap_err());
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }
}
