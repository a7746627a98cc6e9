//! NVIDIA's own demo manifests pass `gpu-dra lint` and the admission
//! webhook unchanged (issue #44: a cluster switching from NVIDIA's driver
//! changes no manifest).
//!
//! The manifests are `demo/specs/` of NVIDIA's Go module
//! `sigs.k8s.io/dra-driver-nvidia-gpu` v0.5.0, the release
//! `nvidia-compat.md` describes, fetched from the Go module proxy at test
//! time ([`gpu_dra_e2e::go_module`], hash pinned) and never copied into the
//! project. Every file there is either checked ([`CHECKED`]: the GPU, MIG,
//! time-slicing, MPS, VFIO, consumable-shares and extended-resource
//! families) or left out with its reason ([`LEFT_OUT`]), and a test checks
//! that each left-out file is what its reason says.
//!
//! - lint: the real `gpu-dra` binary (from the target folder or
//!   `GPU_DRA_BIN`, [`gpu_dra_e2e::bins`]) with its built-in classes, which
//!   are our shipped `deviceclasses/`: no errors, no warnings, and every
//!   DRA object judged as ours.
//! - webhook: the controller's real review code
//!   ([`gpu_dra_controller::webhook::Reviewer`]) on a CREATE AdmissionReview
//!   of each DeviceClass, ResourceClaim and ResourceClaimTemplate, the
//!   cluster's classes being our shipped ones plus the demo's own: allowed,
//!   as ours, with no warnings.
//!
//! Without Go 1.26 or the proxy the tests skip loudly, and fail when
//! `GPU_DRA_E2E_REQUIRE_GO_MODULES=1` (CI sets it once it has reached the
//! proxy); without the `gpu-dra` binary the lint test skips, and fails when
//! `GPU_DRA_E2E_REQUIRE_GPU_DRA_BIN=1`.

#[path = "common/cli.rs"]
#[allow(dead_code)]
mod cli;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use gpu_dra_analysis::validate::{StaticClasses, Validator};
use gpu_dra_controller::webhook::Reviewer;
use gpu_dra_controller::webhook::metrics::Outcome;
use gpu_dra_e2e::go_module::{GoModuleError, NVIDIA_DRIVER};
use serde::Deserialize as _;
use serde_json::{Value, json};

use cli::repo;

/// The files checked, relative to `demo/specs/`.
const CHECKED: &[&str] = &[
    // Full GPUs, MIG devices, time-slicing, MPS and VFIO passthrough, in
    // both API versions NVIDIA ships them in (we accept v1, v1beta2 and
    // v1beta1).
    "quickstart/v1/gpu-test1.yaml",
    "quickstart/v1/gpu-test2.yaml",
    "quickstart/v1/gpu-test3.yaml",
    "quickstart/v1/gpu-test4.yaml",
    "quickstart/v1/gpu-test5.yaml",
    "quickstart/v1/gpu-test6.yaml",
    "quickstart/v1/gpu-test-mps.yaml",
    "quickstart/v1/gpu-test-vfiopci.yaml",
    "quickstart/v1/gpu-test-vfio-config.yaml",
    "quickstart/v1beta1/gpu-test1.yaml",
    "quickstart/v1beta1/gpu-test2.yaml",
    "quickstart/v1beta1/gpu-test3.yaml",
    "quickstart/v1beta1/gpu-test4.yaml",
    "quickstart/v1beta1/gpu-test5.yaml",
    "quickstart/v1beta1/gpu-test6.yaml",
    "quickstart/v1beta1/gpu-test-mps.yaml",
    "quickstart/v1beta1/gpu-test-vfiopci.yaml",
    "quickstart/gpu-test7.yaml",
    "quickstart/gpu-test8.yaml",
    // ConsumableShares: the `shares` and `memory` capacity requests.
    "consumable-shares/integer-sharing.yaml",
    "consumable-shares/memory-sharing.yaml",
    "consumable-shares/unlimited-sharing.yaml",
    // The extended-resource classes (a DeviceClass with
    // `extendedResourceName`, pods asking for `nvidia.com/...`).
    "extended-resources/gpu-full.yaml",
    "extended-resources/mig-1g-12gb.yaml",
    // Workloads of the classic-DRA demos: nothing of DRA in them (lint
    // reads and skips them); their claims are left out below.
    "mig+mps/sharing-demo-job.yaml",
    "mig+mps/sharing-demo-job-1.yaml",
    "selectors/pods.yaml",
];

/// Why a file is not checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    /// Prose, shell, or a YAML file that is not a Kubernetes object (a
    /// `nvidia-mig-parted` configuration).
    NotKubernetes,
    /// IMEX channels and ComputeDomains: NVIDIA's second driver
    /// (`compute-domain.nvidia.com`) and its CRD, which we do not provide
    /// (issue #44 does not ask for them).
    ComputeDomain,
    /// Classic DRA (`resource.k8s.io/v1alpha2` with `resourceClassName` and
    /// `GpuClaimParameters`/`MigDeviceClaimParameters` CRDs): removed in
    /// Kubernetes 1.32, served by no Kubernetes we support and refused by
    /// NVIDIA's own v0.5.0 driver too (it installs no such CRD).
    ClassicDra,
    /// `matchAttribute: gpu.nvidia.com/partition2`: the Fabric Manager
    /// partition attributes exist only behind NVIDIA's alpha
    /// `FabricManagerPartitioning` gate, which our chart refuses (not
    /// implemented); lint rightly says no device satisfies the constraint.
    FabricManagerPartitions,
}

/// The files left out, each with why; a path ending in `/` is a folder.
const LEFT_OUT: &[(&str, Why)] = &[
    ("quickstart/README.md", Why::NotKubernetes),
    ("quickstart/mig-parted-config.yaml", Why::NotKubernetes),
    ("quickstart/v1/imex-test1.yaml", Why::ComputeDomain),
    ("quickstart/v1beta1/imex-test1.yaml", Why::ComputeDomain),
    ("imex/", Why::ComputeDomain),
    ("consumable-shares/README.md", Why::NotKubernetes),
    ("mig+mps/README.md", Why::NotKubernetes),
    ("mig+mps/sharing-demo-envs.sh", Why::NotKubernetes),
    (
        "mig+mps/sharing-demo-mig-parted-config.yaml",
        Why::NotKubernetes,
    ),
    ("mig+mps/sharing-demo-claims.yaml", Why::ClassicDra),
    ("mig+mps/sharing-demo-claims-1.yaml", Why::ClassicDra),
    ("mig+mps/sharing-demo-parameters.yaml", Why::ClassicDra),
    ("mig+mps/sharing-demo-parameters-1.yaml", Why::ClassicDra),
    ("selectors/README.md", Why::NotKubernetes),
    ("selectors/claims.yaml", Why::ClassicDra),
    ("selectors/parameters.yaml", Why::ClassicDra),
    (
        "fabric-manager-partitioning/resourceClaimTemplates.yaml",
        Why::FabricManagerPartitions,
    ),
    // A pod of the claims above.
    (
        "fabric-manager-partitioning/pod.yaml",
        Why::FabricManagerPartitions,
    ),
];

/// The kinds of `resource.k8s.io` the webhook and lint judge.
const DRA_KINDS: [&str; 3] = ["DeviceClass", "ResourceClaim", "ResourceClaimTemplate"];

/// `demo/specs/` of NVIDIA's module, downloaded once per process; `None`
/// after a loud skip naming `test`.
fn specs(test: &str) -> Option<PathBuf> {
    static DOWNLOADED: OnceLock<Result<PathBuf, GoModuleError>> = OnceLock::new();
    let downloaded = DOWNLOADED.get_or_init(|| NVIDIA_DRIVER.download());
    let dir = match downloaded {
        Ok(dir) => dir.clone(),
        Err(err @ GoModuleError::Unavailable { .. }) => gpu_dra_e2e::skip_unless_required(
            test,
            gpu_dra_e2e::go_module::REQUIRE_ENV,
            err.clone(),
        )
        .unwrap_or_else(|e| panic!("{e}"))?,
        Err(err) => panic!("{err}"),
    };
    Some(dir.join("demo/specs"))
}

/// Every file under `dir`, relative to `base`, with `/` separators.
fn files(base: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(base, &path, out);
        } else {
            let rel = path.strip_prefix(base).unwrap();
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The documents of a YAML file as JSON (empty documents dropped).
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    yaml_serde::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

/// Whether `object` is one the webhook and lint judge.
fn is_dra(object: &Value) -> bool {
    object["apiVersion"]
        .as_str()
        .is_some_and(|v| v.starts_with("resource.k8s.io/"))
        && object["kind"]
            .as_str()
            .is_some_and(|k| DRA_KINDS.contains(&k))
}

/// Which of [`LEFT_OUT`] covers `file`.
fn left_out(file: &str) -> Vec<Why> {
    LEFT_OUT
        .iter()
        .filter(|(path, _)| {
            if path.ends_with('/') {
                file.starts_with(path)
            } else {
                file == *path
            }
        })
        .map(|(_, why)| *why)
        .collect()
}

#[test]
fn every_demo_file_is_checked_or_left_out_with_a_reason() {
    let Some(specs) = specs("every_demo_file_is_checked_or_left_out_with_a_reason") else {
        return;
    };
    let mut all = Vec::new();
    files(&specs, &specs, &mut all);
    all.sort();
    for file in &all {
        let checked = CHECKED.contains(&file.as_str());
        let reasons = left_out(file);
        assert!(
            usize::from(checked) + reasons.len() == 1,
            "{file}: checked {checked}, left out for {reasons:?}: add it to exactly one list"
        );
    }
    for listed in CHECKED
        .iter()
        .copied()
        .chain(LEFT_OUT.iter().map(|(p, _)| *p))
    {
        assert!(
            all.iter()
                .any(|f| f == listed || (listed.ends_with('/') && f.starts_with(listed))),
            "{listed} is listed but not in NVIDIA's demo/specs"
        );
    }
}

#[test]
fn left_out_files_are_what_their_reason_says() {
    let Some(specs) = specs("left_out_files_are_what_their_reason_says") else {
        return;
    };
    let mut all = Vec::new();
    files(&specs, &specs, &mut all);
    for file in &all {
        let Some(&why) = left_out(file).first() else {
            continue;
        };
        let path = specs.join(file);
        let yaml = path.extension().is_some_and(|e| e == "yaml");
        match why {
            Why::NotKubernetes => {
                if yaml {
                    let docs = documents(&path);
                    assert!(
                        docs.iter().all(|d| d.get("kind").is_none()),
                        "{file} holds Kubernetes objects"
                    );
                }
            }
            Why::ComputeDomain => {
                // Or the IMEX folder's baseline: an MPIJob (a Kubeflow CRD)
                // with no ComputeDomain, and nothing of DRA.
                let text = std::fs::read_to_string(&path).unwrap().to_lowercase();
                assert!(
                    text.contains("computedomain")
                        || text.contains("imex")
                        || (yaml && !documents(&path).iter().any(is_dra)),
                    "{file} is not about ComputeDomains or IMEX"
                );
            }
            Why::ClassicDra => {
                let docs = documents(&path);
                assert!(!docs.is_empty(), "{file}");
                for doc in docs {
                    let api = doc["apiVersion"].as_str().unwrap_or_default();
                    assert!(
                        api == "resource.k8s.io/v1alpha2"
                            || api.starts_with("gpu.resource.nvidia.com/"),
                        "{file}: {api} is not classic DRA"
                    );
                }
            }
            Why::FabricManagerPartitions => {
                let text = std::fs::read_to_string(&path).unwrap();
                assert!(
                    text.contains("fm-partition"),
                    "{file} is not about Fabric Manager partitions"
                );
                let claims: Vec<Value> = documents(&path).into_iter().filter(is_dra).collect();
                if !claims.is_empty() {
                    // Refused for the partition attribute, and for nothing else.
                    let verdicts = review_all(&specs, &claims);
                    for (object, response) in claims.iter().zip(verdicts) {
                        assert_eq!(response["allowed"], false, "{file}: {object}");
                        let message = response["status"]["message"].as_str().unwrap();
                        assert!(message.contains("partition"), "{file}: {message}");
                        assert!(message.contains("(1 error)"), "{file}: {message}");
                    }
                }
            }
        }
    }
}

#[test]
fn nvidia_demo_manifests_lint_clean() {
    let test = "nvidia_demo_manifests_lint_clean";
    let Some(specs) = specs(test) else { return };
    if !cli::have_gpu_dra(test) {
        return;
    }
    let bin = gpu_dra_e2e::bins::gpu_dra().expect("the gpu-dra binary");
    let paths: Vec<PathBuf> = CHECKED.iter().map(|f| specs.join(f)).collect();
    let out = Command::new(&bin)
        .args(["lint", "--output", "json"])
        .args(&paths)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let entries: Vec<Value> = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}\n{stderr}"));

    let mut ours = 0;
    let mut warnings = Vec::new();
    for entry in &entries {
        let file = entry["file"].as_str().unwrap();
        for w in entry["warnings"].as_array().unwrap() {
            warnings.push(format!("{file}: {w}"));
        }
    }
    for w in &warnings {
        eprintln!("lint warning: {w}");
    }
    for entry in &entries {
        assert_eq!(entry["errors"], json!([]), "{entry:#}");
        if DRA_KINDS.contains(&entry["kind"].as_str().unwrap_or_default()) {
            assert_eq!(entry["checked"], true, "{entry:#}");
            assert_eq!(entry["ours"], true, "{entry:#}");
            ours += 1;
        }
    }
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(warnings.is_empty(), "{warnings:#?}");
    // Every file was read, and every DRA object in it reached lint.
    for path in &paths {
        let shown = path.display().to_string();
        let in_report = entries
            .iter()
            .filter(|e| e["file"] == shown.as_str())
            .count();
        let dra = documents(path).iter().filter(|d| is_dra(d)).count();
        let all = documents(path).len();
        assert_eq!(in_report, all, "{shown}: {entries:#?}");
        assert!(
            entries
                .iter()
                .filter(|e| e["file"] == shown.as_str() && e["ours"] == true)
                .count()
                == dra,
            "{shown}"
        );
    }
    // 19 claims and templates in quickstart, 3 in consumable-shares, one
    // class in extended-resources.
    assert_eq!(ours, 23, "{entries:#?}");
}

/// The webhook's answers (`response` of each AdmissionReview) to a CREATE of
/// each of `objects`, the cluster's DeviceClasses being our shipped ones
/// and every DeviceClass of the checked demo files.
fn review_all(specs: &Path, objects: &[Value]) -> Vec<Value> {
    let mut classes = Vec::new();
    for entry in std::fs::read_dir(repo().join("deviceclasses")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            classes.extend(documents(&path));
        }
    }
    assert!(classes.len() >= 3, "{classes:?}");
    for file in CHECKED {
        classes.extend(
            documents(&specs.join(file))
                .into_iter()
                .filter(|d| d["kind"] == "DeviceClass"),
        );
    }
    let reviewer = Reviewer::new(
        Validator::new("gpu.nvidia.com"),
        Arc::new(StaticClasses::new(classes)),
    );
    objects
        .iter()
        .enumerate()
        .map(|(i, object)| {
            let verdict = reviewer
                .review_json(&serde_json::to_vec(&admission_review(i, object)).unwrap())
                .unwrap_or_else(|e| panic!("rejected ({e}): {object}"));
            let response = serde_json::to_value(verdict.review).unwrap()["response"].clone();
            if response["allowed"] == true {
                // Judged as ours, not waved through as another driver's.
                assert!(
                    matches!(verdict.outcome, Outcome::allowed | Outcome::warned),
                    "{:?}: {object}",
                    verdict.outcome
                );
            }
            response
        })
        .collect()
}

/// A CREATE AdmissionReview of `object`, as the API server sends it.
fn admission_review(i: usize, object: &Value) -> Value {
    let api_version = object["apiVersion"].as_str().unwrap();
    let version = api_version.rsplit('/').next().unwrap();
    let kind = object["kind"].as_str().unwrap();
    let resource = match kind {
        "DeviceClass" => "deviceclasses",
        "ResourceClaim" => "resourceclaims",
        _ => "resourceclaimtemplates",
    };
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    let mut request = json!({
        "uid": format!("{i:08x}-0000-4000-8000-000000000000"),
        "kind": {"group": "resource.k8s.io", "version": version, "kind": kind},
        "resource": {"group": "resource.k8s.io", "version": version, "resource": resource},
        "requestKind": {"group": "resource.k8s.io", "version": version, "kind": kind},
        "requestResource": {"group": "resource.k8s.io", "version": version, "resource": resource},
        "name": object["metadata"]["name"],
        "operation": "CREATE",
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
        "object": object,
        "oldObject": null,
        "dryRun": false,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
    });
    if kind != "DeviceClass" {
        request["namespace"] = json!(namespace);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

#[test]
fn nvidia_demo_objects_pass_the_webhook() {
    let Some(specs) = specs("nvidia_demo_objects_pass_the_webhook") else {
        return;
    };
    let mut objects = Vec::new();
    let mut names = Vec::new();
    for file in CHECKED {
        for doc in documents(&specs.join(file)) {
            if is_dra(&doc) {
                names.push(format!(
                    "{file}: {}/{}",
                    doc["kind"].as_str().unwrap_or_default(),
                    doc["metadata"]["name"].as_str().unwrap_or_default()
                ));
                objects.push(doc);
            }
        }
    }
    let responses = review_all(&specs, &objects);
    let mut warnings = Vec::new();
    for (name, response) in names.iter().zip(&responses) {
        if let Some(list) = response["warnings"].as_array() {
            for w in list {
                eprintln!("webhook warning: {name}: {w}");
                warnings.push(format!("{name}: {w}"));
            }
        }
    }
    for (name, response) in names.iter().zip(&responses) {
        assert_eq!(response["allowed"], true, "{name}: {response:#}");
    }
    assert!(warnings.is_empty(), "{warnings:#?}");
    // The same objects lint counts.
    assert_eq!(objects.len(), 23, "{names:#?}");
}
