//! Where a claim's device metadata lives: the host file the plugin writes
//! and the path the container sees it at, from names the plugin checks
//! first so that no name it is given can reach outside its directory.
//!
//! Layout (KEP-5304 as `k8s.io/dynamic-resource-allocation` v0.37 writes it):
//! - host: `<kubelet-plugins-dir>/<driver>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json`;
//! - container, a claim named in the pod: `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json`;
//! - container, a claim made from a template:
//!   `.../resourceclaimtemplates/<podClaimName>/<request>/<driver>-metadata.json`.
//!
//! Names are checked as the API server checks them (a namespace, a request
//! and a pod claim name are DNS labels, a claim name a DNS subdomain), so
//! `..`, `/`, NUL and upper case never reach a path. `<namespace>_<claim>`
//! can be longer than a file name may be (63 + 1 + 253 bytes): such a
//! directory is named by the first part of the claim name and a hash of the
//! whole (`~` marks it; no Kubernetes name holds one). Only the host side
//! changes; the container path, which workloads rely on, is always exact.

use std::path::{Path, PathBuf};

use super::MetadataError;
use crate::devices::fnv1a;

/// The directory under the plugin's data directory that holds the files.
pub const SUBDIR: &str = "dra-device-metadata";
/// The name of each request's file on the host.
pub const FILE_NAME: &str = "metadata.json";
/// Where containers find the files.
pub const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// The container subdirectory of claims named in the pod spec.
pub const CLAIMS_SUBDIR: &str = "resourceclaims";
/// The container subdirectory of claims made from a template.
pub const TEMPLATES_SUBDIR: &str = "resourceclaimtemplates";
/// Appended to the driver name: the file name in the container.
pub const FILE_SUFFIX: &str = "-metadata.json";

/// Longest DNS label.
const MAX_LABEL: usize = 63;
/// Longest DNS subdomain.
const MAX_SUBDOMAIN: usize = 253;
/// Longest file name on Linux file systems (`NAME_MAX`).
const NAME_MAX: usize = 255;

fn invalid(what: &'static str, value: &str, reason: &'static str) -> MetadataError {
    let mut shown: String = value.chars().take(80).collect();
    if value.chars().count() > 80 {
        shown.push('…');
    }
    MetadataError::InvalidName {
        what,
        value: shown,
        reason,
    }
}

fn check_label(what: &'static str, value: &str, max: usize) -> Result<(), MetadataError> {
    if value.is_empty() {
        return Err(invalid(what, value, "must not be empty"));
    }
    if value.len() > max {
        return Err(invalid(what, value, "is too long"));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(invalid(
            what,
            value,
            "may hold only lowercase letters, digits and '-'",
        ));
    }
    if value.starts_with('-') || value.ends_with('-') {
        return Err(invalid(
            what,
            value,
            "must start and end with a letter or digit",
        ));
    }
    Ok(())
}

/// Checks a DNS label (namespace, request name, pod claim name).
pub fn validate_label(what: &'static str, value: &str) -> Result<(), MetadataError> {
    check_label(what, value, MAX_LABEL)
}

/// Checks a DNS subdomain (claim name): dot-separated labels.
pub fn validate_subdomain(what: &'static str, value: &str) -> Result<(), MetadataError> {
    if value.len() > MAX_SUBDOMAIN {
        return Err(invalid(what, value, "is too long"));
    }
    if value.is_empty() {
        return Err(invalid(what, value, "must not be empty"));
    }
    for label in value.split('.') {
        check_label(what, label, MAX_SUBDOMAIN).map_err(|_| {
            invalid(
                what,
                value,
                "must be dot-separated lowercase letters, digits and '-', each part starting and ending with a letter or digit",
            )
        })?;
    }
    Ok(())
}

/// The host directory name of a claim: `<namespace>_<claim>`, or, when that
/// is longer than a file name may be, the claim name cut short and a hash
/// of both (module docs).
pub fn claim_dir_name(namespace: &str, name: &str) -> Result<String, MetadataError> {
    validate_label("namespace", namespace)?;
    validate_subdomain("claim name", name)?;
    let full = format!("{namespace}_{name}");
    if full.len() <= NAME_MAX {
        return Ok(full);
    }
    let hash = format!("~{:016x}", fnv1a(full.as_bytes()));
    // ASCII only (checked above): any byte index is a char boundary.
    Ok(format!("{}{hash}", &full[..NAME_MAX - hash.len()]))
}

/// The host file of one request of a claim, under `root` (the
/// `dra-device-metadata` directory).
pub fn host_file(
    root: &Path,
    namespace: &str,
    name: &str,
    request: &str,
) -> Result<PathBuf, MetadataError> {
    let dir = claim_dir_name(namespace, name)?;
    validate_label("request name", request)?;
    Ok(root.join(dir).join(request).join(FILE_NAME))
}

/// The path a container reads one request's file at.
pub fn container_file(
    driver: &str,
    name: &str,
    pod_claim_name: Option<&str>,
    request: &str,
) -> Result<String, MetadataError> {
    validate_label("request name", request)?;
    let (subdir, key) = match pod_claim_name {
        Some(pod) if !pod.is_empty() => {
            validate_label("pod claim name", pod)?;
            (TEMPLATES_SUBDIR, pod)
        }
        _ => {
            validate_subdomain("claim name", name)?;
            (CLAIMS_SUBDIR, name)
        }
    };
    Ok(format!(
        "{CONTAINER_DIR}/{subdir}/{key}/{request}/{driver}{FILE_SUFFIX}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(r: Result<impl std::fmt::Debug, MetadataError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn host_and_container_paths_follow_the_kep_layout() {
        let root = Path::new("/var/lib/kubelet/plugins/gpu.nvidia.com/dra-device-metadata");
        assert_eq!(
            host_file(root, "ml", "train-gpus", "gpu").unwrap(),
            root.join("ml_train-gpus/gpu/metadata.json")
        );
        assert_eq!(
            container_file("gpu.nvidia.com", "train-gpus", None, "gpu").unwrap(),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train-gpus/gpu/gpu.nvidia.com-metadata.json"
        );
        assert_eq!(
            container_file("gpu.nvidia.com", "pod-gpus-x7k2p", Some("gpus"), "gpu").unwrap(),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/gpu/gpu.nvidia.com-metadata.json"
        );
        // An empty annotation is no template (as the library reads it).
        assert!(
            container_file("gpu.nvidia.com", "c", Some(""), "gpu")
                .unwrap()
                .contains("/resourceclaims/c/")
        );
    }

    #[test]
    fn hostile_names_never_become_paths() {
        let root = Path::new("/m");
        for (ns, name, request, what) in [
            ("..", "c", "r", "namespace"),
            ("ml", "..", "r", "claim name"),
            ("ml", "c", "..", "request name"),
            ("ml", "a/../../etc", "r", "claim name"),
            ("ml", "c", "r/../../x", "request name"),
            ("m/l", "c", "r", "namespace"),
            ("ml", "/etc", "r", "claim name"),
            ("ml", "c", ".", "request name"),
            ("ml", "c\0d", "r", "claim name"),
            ("ml", "C", "r", "claim name"),
            ("ml", "c", "", "request name"),
            ("", "c", "r", "namespace"),
            ("ml", "", "r", "claim name"),
            ("ml", "a..b", "r", "claim name"),
            ("ml", ".a", "r", "claim name"),
            ("ml", "a_b", "r", "claim name"),
            ("ml", "c", "-r", "request name"),
            ("ml", "c", "ü", "request name"),
        ] {
            let msg = reason(host_file(root, ns, name, request));
            assert!(msg.contains(what), "{ns:?} {name:?} {request:?}: {msg}");
        }
        for pod in ["..", "a/b", "A", "-x", &"p".repeat(64)] {
            let msg = reason(container_file("d", "c", Some(pod), "r"));
            assert!(msg.contains("pod claim name"), "{pod:?}: {msg}");
        }
        let msg = reason(host_file(root, &"n".repeat(64), "c", "r"));
        assert!(
            msg.contains("namespace") && msg.contains("too long"),
            "{msg}"
        );
        let msg = reason(host_file(root, "ml", &"c".repeat(254), "r"));
        assert!(msg.contains("too long") && msg.len() < 200, "{msg}");
        let msg = reason(host_file(root, "ml", "c", &"r".repeat(64)));
        assert!(
            msg.contains("request name") && msg.contains("too long"),
            "{msg}"
        );
    }

    #[test]
    fn the_longest_names_stay_one_directory_below_the_root() {
        let root = Path::new("/m");
        let ns = "n".repeat(63);
        let name = format!("{}.{}", "a".repeat(126), "b".repeat(126));
        let request = "r".repeat(63);
        let file = host_file(root, &ns, &name, &request).unwrap();
        let dir = claim_dir_name(&ns, &name).unwrap();
        assert_eq!(dir.len(), NAME_MAX);
        assert!(dir.contains('~'));
        assert_eq!(file, root.join(&dir).join(&request).join(FILE_NAME));
        assert_eq!(file.components().count(), 5);
        // Stable, and different for names differing only past the cut.
        assert_eq!(claim_dir_name(&ns, &name).unwrap(), dir);
        let other = format!("{}.{}", "a".repeat(126), "c".repeat(126));
        assert_ne!(claim_dir_name(&ns, &other).unwrap(), dir);
        // Exactly at the limit: the plain name.
        let fits = "c".repeat(NAME_MAX - 3);
        assert_eq!(claim_dir_name("ml", &fits).unwrap(), format!("ml_{fits}"));
        // The container path keeps the whole name.
        assert!(
            container_file("gpu.nvidia.com", &name, None, &request)
                .unwrap()
                .contains(&name)
        );
    }
}
