//! `gpu-dra lint` on NVIDIA's VFIO passthrough manifests: the shipped
//! `vfio.gpu.nvidia.com` class and a `VfioDeviceConfig` claim lint clean;
//! bad `VfioDeviceConfig` values fail with exit status 1 at their file,
//! line and field.

use serde_json::Value;

// Not every helper of the shared module is used here.
#[allow(dead_code)]
mod common;

use common::repo;

fn claim(iommu: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: vm
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: vfio.gpu.nvidia.com
    config:
    - requests: [gpu]
      opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: VfioDeviceConfig
          iommu:
{iommu}
"
    )
}

fn lint_text(text: &str) -> (common::Run, Vec<Value>, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vm.yaml");
    std::fs::write(&file, text).unwrap();
    let run = common::gpu_dra("lint", &[&file]);
    let (_, json) = common::gpu_dra_json("lint", &[&file]);
    let entries = json.as_array().unwrap().clone();
    // Keep the directory until both runs are done.
    let kept = dir.keep();
    (run, entries, kept.join("vm.yaml"))
}

#[test]
fn nvidias_vfio_class_and_claims_lint_clean() {
    let class = repo().join("deviceclasses/vfio.gpu.nvidia.com.yaml");
    let example = repo().join("docs/examples/vfio-passthrough.yaml");
    let run = common::gpu_dra("lint", &[&class, &example]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.starts_with("ok: 2 objects checked"),
        "{}",
        run.stdout
    );
    for iommu in [
        "            backendPolicy: LegacyOnly",
        "            backendPolicy: PreferIommuFD\n            enableAPIDevice: true",
    ] {
        let (run, _, file) = lint_text(&claim(iommu));
        assert_eq!(run.code, 0, "{iommu}: {}{}", run.stdout, run.stderr);
        let _ = std::fs::remove_dir_all(file.parent().unwrap());
    }
}

#[test]
fn bad_vfio_configs_fail_at_their_line_and_field() {
    for (iommu, line, field, message) in [
        (
            "            backendPolicy: RequireIommuFD",
            19,
            "spec.devices.config[0].opaque.parameters.iommu.backendPolicy",
            "unknown variant `RequireIommuFD`, expected `LegacyOnly` or `PreferIommuFD`",
        ),
        (
            // A missing field is reported at its parent's line.
            "            enableAPIDevice: true",
            18,
            "spec.devices.config[0].opaque.parameters.iommu.backendPolicy",
            "required when iommu is given: LegacyOnly or PreferIommuFD",
        ),
        (
            "            backendPolicy: LegacyOnly\n            enableAPIDevice: sometimes",
            20,
            "spec.devices.config[0].opaque.parameters.iommu.enableAPIDevice",
            "expected a boolean",
        ),
    ] {
        let (run, entries, file) = lint_text(&claim(iommu));
        assert_eq!(run.code, 1, "{iommu}: {}{}", run.stdout, run.stderr);
        let errors = entries[0]["errors"].as_array().unwrap();
        assert_eq!(errors.len(), 1, "{iommu}: {errors:?}");
        assert_eq!(errors[0]["path"], field, "{iommu}");
        assert!(
            errors[0]["message"].as_str().unwrap().contains(message),
            "{iommu}: {errors:?}"
        );
        let at = format!(
            "{}:{line}: error: ResourceClaim/vm (document 1): {field}",
            file.display()
        );
        assert!(run.stdout.contains(&at), "{iommu}: {}", run.stdout);
        let _ = std::fs::remove_dir_all(file.parent().unwrap());
    }
}
