//! The DeviceClasses shipped in `deviceclasses/`, compiled into the binary so
//! that `lint` and `simulate` can resolve `gpu.nvidia.com` and friends
//! wherever they run. A test keeps this list equal to the directory.

use serde_json::Value;

use crate::manifest;

/// File name and contents of every shipped class.
pub const FILES: &[(&str, &str)] = &[
    (
        "gpu.nvidia.com.yaml",
        include_str!("../../deviceclasses/gpu.nvidia.com.yaml"),
    ),
    (
        "mig.nvidia.com.yaml",
        include_str!("../../deviceclasses/mig.nvidia.com.yaml"),
    ),
    (
        "vfio.gpu.nvidia.com.yaml",
        include_str!("../../deviceclasses/vfio.gpu.nvidia.com.yaml"),
    ),
    (
        "nvlink.gpu.nvidia.com.yaml",
        include_str!("../../deviceclasses/nvlink.gpu.nvidia.com.yaml"),
    ),
    (
        "1g.10gb.mig.nvidia.com.yaml",
        include_str!("../../deviceclasses/1g.10gb.mig.nvidia.com.yaml"),
    ),
    (
        "large-memory.gpu.nvidia.com.yaml",
        include_str!("../../deviceclasses/large-memory.gpu.nvidia.com.yaml"),
    ),
    (
        "hopper-or-newer.gpu.nvidia.com.yaml",
        include_str!("../../deviceclasses/hopper-or-newer.gpu.nvidia.com.yaml"),
    ),
];

/// The shipped DeviceClass objects.
pub fn classes() -> Result<Vec<Value>, manifest::YamlError> {
    let mut classes = Vec::new();
    for (name, text) in FILES {
        let parsed = manifest::parse(&format!("(built-in) deviceclasses/{name}"), text);
        if let Some(e) = parsed.errors.into_iter().next() {
            return Err(e);
        }
        classes.extend(parsed.documents.into_iter().map(|d| d.value));
    }
    Ok(classes)
}

/// The `*.yaml`/`*.yml` file names in `dir`, sorted (for the tests that
/// keep embedded file lists in step with their directories).
#[cfg(test)]
pub(crate) fn yaml_file_names(dir: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_list_matches_the_directory() {
        let on_disk = yaml_file_names(concat!(env!("CARGO_MANIFEST_DIR"), "/../deviceclasses"));
        let mut embedded: Vec<String> = FILES.iter().map(|(n, _)| (*n).to_owned()).collect();
        embedded.sort();
        assert_eq!(embedded, on_disk, "add new class files to shipped::FILES");
    }

    #[test]
    fn every_shipped_file_is_one_class_named_after_the_file() {
        let classes = classes().unwrap();
        assert_eq!(classes.len(), FILES.len());
        for ((file, _), class) in FILES.iter().zip(&classes) {
            assert_eq!(class["kind"], "DeviceClass", "{file}");
            assert_eq!(class["apiVersion"], "resource.k8s.io/v1", "{file}");
            let name = class["metadata"]["name"].as_str().unwrap();
            assert_eq!(format!("{name}.yaml"), *file);
            assert!(
                gpu_dra_api::schema::is_dns_subdomain(name),
                "{name} is not a DNS subdomain"
            );
        }
    }
}
