//! `gpu-dra lint`, run as a binary: every shipped DeviceClass and example
//! claim lints clean (this is the CI's lint of them), broken manifests fail
//! with exit status 1 and point at file, line and field, and usage or I/O
//! problems exit with 2.

use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;

use common::{Run, data, repo};

fn lint<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    common::gpu_dra("lint", args)
}

fn lint_json<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (i32, Vec<Value>) {
    let (code, entries) = common::gpu_dra_json("lint", args);
    (code, entries.as_array().expect("an array").clone())
}

/// YAML files directly in `dir`.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn shipped_classes_and_examples_lint_clean() {
    let classes = repo().join("deviceclasses");
    let examples = repo().join("docs/examples");
    let run = lint(&[&classes, &examples]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(!run.stdout.contains(": error:"), "{}", run.stdout);

    let (code, entries) = lint_json(&[&classes, &examples]);
    assert_eq!(code, 0);
    // Every file is there, and every DRA object in it was judged as ours
    // (claims reach the shipped classes through the lookup).
    let files: Vec<&str> = entries
        .iter()
        .map(|e| e["file"].as_str().unwrap())
        .collect();
    for file in yaml_files(&classes).iter().chain(&yaml_files(&examples)) {
        let file = file.display().to_string();
        assert!(files.contains(&file.as_str()), "{file} not linted");
    }
    let checked: Vec<&Value> = entries.iter().filter(|e| e["checked"] == true).collect();
    let dra_kinds = ["DeviceClass", "ResourceClaim", "ResourceClaimTemplate"];
    assert_eq!(
        checked.len(),
        entries
            .iter()
            .filter(|e| dra_kinds.contains(&e["kind"].as_str().unwrap()))
            .count()
    );
    assert!(checked.len() >= yaml_files(&classes).len() + 5);
    for e in &checked {
        assert_eq!(e["ours"], true, "{e}");
        assert_eq!(e["errors"], Value::Array(vec![]), "{e}");
    }
}

#[test]
fn each_shipped_file_lints_clean_on_its_own() {
    // No file depends on another being linted with it: claims find the
    // built-in classes.
    for file in yaml_files(&repo().join("deviceclasses"))
        .into_iter()
        .chain(yaml_files(&repo().join("docs/examples")))
    {
        let (code, entries) = lint_json(&[&file]);
        assert_eq!(code, 0, "{}: {entries:?}", file.display());
        assert!(
            entries
                .iter()
                .filter(|e| e["checked"] == true)
                .all(|e| e["ours"] == true),
            "{}: {entries:?}",
            file.display()
        );
    }
}

#[test]
fn a_claim_for_gpu_nvidia_com_lints_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claim.yml");
    std::fs::write(
        &path,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com}\n",
    )
    .unwrap();
    let (code, entries) = lint_json(&[dir.path()]);
    assert_eq!(code, 0, "{entries:?}");
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["ours"], true);
    assert_eq!(entries[0]["name"], "c");
}

#[test]
fn a_misspelt_attribute_is_an_error_at_its_line() {
    let file = data("broken/typo-attribute.yaml");
    let run = lint(&[&file]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let expected = format!(
        "{}:14: error: ResourceClaim/a100 (document 1): spec.devices.requests[0].exactly.selectors[0].cel.expression:",
        file.display()
    );
    assert!(run.stdout.contains(&expected), "{}", run.stdout);
    assert!(run.stdout.contains("prodcutName"), "{}", run.stdout);
    // The fix is offered.
    assert!(run.stdout.contains("productName"), "{}", run.stdout);
    assert!(run.stdout.contains("1 error"), "{}", run.stdout);
}

#[test]
fn the_tutorial_memory_mistake_is_an_error() {
    let file = data("broken/tutorial-memory.yaml");
    let (code, entries) = lint_json(&[&file]);
    assert_eq!(code, 1);
    let errors = entries[0]["errors"].as_array().unwrap();
    assert!(!errors.is_empty(), "{entries:?}");
    assert_eq!(
        errors[0]["path"],
        "spec.spec.devices.requests[0].exactly.selectors[0].cel.expression"
    );
    assert_eq!(errors[0]["line"], 16);
    // It points the author at the capacity.
    let text = format!(
        "{} {}",
        errors[0]["message"],
        errors[0]["hint"].as_str().unwrap_or_default()
    );
    assert!(text.contains("capacity"), "{text}");
}

#[test]
fn an_mps_percentage_over_100_is_an_error() {
    let file = data("broken/bad-mps-percent.yaml");
    let run = lint(&[&file]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains(&format!("{}:", file.display())),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("defaultActiveThreadPercentage"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("150"), "{}", run.stdout);
}

#[test]
fn bad_yaml_is_reported_with_its_line_and_the_rest_still_checked() {
    let file = data("broken/bad-yaml.yaml");
    let (code, entries) = lint_json(&[&file]);
    assert_eq!(code, 1);
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(entries[0]["name"], "fine");
    assert_eq!(entries[0]["checked"], true);
    assert_eq!(entries[1]["document"], 2);
    let line = entries[1]["line"].as_u64().unwrap();
    assert!((15..=16).contains(&line), "{entries:?}");
    assert!(
        entries[1]["errors"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid YAML"),
        "{entries:?}"
    );
    let run = lint(&[&file]);
    assert!(
        run.stdout.contains(&format!(
            "{}:{line}: error: (document 2): invalid YAML",
            file.display()
        )),
        "{}",
        run.stdout
    );
}

#[test]
fn json_output_has_one_entry_per_document() {
    let (code, entries) = lint_json(&[data("broken"), repo().join("docs/examples/gpu.yaml")]);
    assert_eq!(code, 1);
    for e in &entries {
        for key in [
            "file", "document", "line", "kind", "name", "checked", "ours", "errors", "warnings",
        ] {
            assert!(e.get(key).is_some(), "{key} missing in {e}");
        }
        for f in e["errors"]
            .as_array()
            .unwrap()
            .iter()
            .chain(e["warnings"].as_array().unwrap())
        {
            assert!(
                f["path"].is_string() && f["line"].is_u64() && f["message"].is_string(),
                "{f}"
            );
        }
    }
    // The Pod of the example is skipped with a note, not an error.
    let pod = entries.iter().find(|e| e["kind"] == "Pod").unwrap();
    assert_eq!(pod["checked"], false);
    assert!(pod["note"].is_string());
    assert_eq!(pod["errors"], Value::Array(vec![]));
    // Files in a directory are visited in name order, then the next path.
    let files: Vec<&str> = entries
        .iter()
        .map(|e| e["file"].as_str().unwrap())
        .collect();
    let broken: Vec<&str> = files
        .iter()
        .copied()
        .filter(|f| f.contains("broken"))
        .collect();
    let mut sorted = broken.clone();
    sorted.sort_unstable();
    assert_eq!(broken, sorted);
    assert!(files.last().unwrap().ends_with("gpu.yaml"));
}

#[test]
fn classes_from_the_linted_files_are_used_for_claims() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a-class.yaml"),
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: team-a100}\nspec:\n  selectors:\n  - cel: {expression: \"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productName.lowerAscii().contains('a100')\"}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b-claim.yaml"),
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly: {deviceClassName: team-a100}\n",
    )
    .unwrap();
    let (code, entries) = lint_json(&[dir.path()]);
    assert_eq!(code, 0, "{entries:?}");
    assert_eq!(entries.len(), 2);
    assert!(entries.iter().all(|e| e["ours"] == true), "{entries:?}");
    // Alone, the claim's class is unknown, so it is not known to be ours.
    let (_, alone) = lint_json(&[dir.path().join("b-claim.yaml")]);
    assert_eq!(alone[0]["ours"], false, "{alone:?}");
}

#[test]
fn another_driver_name_leaves_our_classes_alone() {
    let (code, entries) = lint_json(&[
        "--driver".as_ref(),
        "gpu.example.com".as_ref(),
        repo().join("deviceclasses/gpu.nvidia.com.yaml").as_os_str(),
    ]);
    assert_eq!(code, 0);
    assert_eq!(entries[0]["ours"], false);
    assert!(
        entries[0]["note"]
            .as_str()
            .unwrap()
            .contains("gpu.example.com")
    );
}

#[test]
fn usage_and_io_problems_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let run = lint(&[dir.path().join("missing.yaml")]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("missing.yaml"), "{}", run.stderr);

    let run = lint(&[dir.path()]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("no *.yaml"), "{}", run.stderr);

    let binary = dir.path().join("x.yaml");
    std::fs::write(&binary, [0xffu8, 0xfe, 0x00]).unwrap();
    let run = lint(&[&binary]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("not UTF-8"), "{}", run.stderr);

    let run = lint::<&str>(&[]);
    assert_eq!(run.code, 2);
    let run = lint(&["--output", "xml", "x.yaml"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("xml"), "{}", run.stderr);
}

#[test]
fn warnings_alone_exit_0() {
    // A MIG device never has an NVLink domain: the selector never matches.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("never.yaml");
    std::fs::write(
        &path,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: w}\nspec:\n  devices:\n    requests:\n    - name: mig\n      exactly:\n        deviceClassName: mig.nvidia.com\n        selectors:\n        - cel:\n            expression: \"has(device.attributes['gpu.nvidia.com'].nvlinkDomain)\"\n",
    )
    .unwrap();
    let run = lint(&[&path]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains(&format!(
            "{}:12: warning: ResourceClaim/w (document 1): spec.devices.requests[0].exactly.selectors[0].cel.expression:",
            path.display()
        )),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("0 errors, 1 warning"), "{}", run.stdout);
    let (code, entries) = lint_json(&[&path]);
    assert_eq!(code, 0);
    assert_eq!(entries[0]["warnings"][0]["line"], 12);
    assert_eq!(entries[0]["errors"], Value::Array(vec![]));
}

/// NVIDIA's `mpsConfig.multiUser` (v0.5.0): a boolean, accepted; any other
/// type is an error at its line with the field's path.
#[test]
fn mps_multi_user_is_a_boolean() {
    let example = repo().join("docs/examples/consumable-shares.yaml");
    let text = std::fs::read_to_string(&example).unwrap();
    assert!(text.contains("multiUser: true"));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("multi-user.yaml");
    std::fs::write(&bad, text.replace("multiUser: true", "multiUser: \"yes\"")).unwrap();
    let run = lint(&[&bad]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let line = text
        .lines()
        .position(|l| l.contains("multiUser: true"))
        .unwrap()
        + 1;
    assert!(
        run.stdout.contains(&format!(
            "multi-user.yaml:{line}: error: ResourceClaim/mps-multi-user (document 5): \
             spec.devices.config[0].opaque.parameters.sharing.mpsConfig.multiUser: \
             invalid type: string \"yes\", expected a boolean"
        )),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("1 error"), "{}", run.stdout);
}
