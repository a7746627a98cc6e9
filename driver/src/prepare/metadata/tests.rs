use std::fs;
use std::os::unix::fs::PermissionsExt;

use super::*;

const UID: &str = "0f8e6a1c-3b9d-4e57-a1c2-9d8f7e6b5a43";
const OTHER_UID: &str = "7d3a2b10-55e1-4c1e-9a0f-2b6c8d9e0f11";

fn writer(dir: &Path) -> Writer {
    let mut attributes = HashMap::new();
    let mut gpu = BTreeMap::new();
    gpu.insert(
        "resource.kubernetes.io/pciBusID".to_owned(),
        api::DeviceAttribute {
            string: Some("0000:18:00.0".into()),
            ..Default::default()
        },
    );
    attributes.insert("gpu-0".to_owned(), gpu);
    Writer {
        root: HostRoot::new(dir.join("plugin-side"), "/host/metadata"),
        driver: "gpu.nvidia.com".into(),
        attributes,
    }
}

fn claim(uid: &str) -> ClaimId<'_> {
    ClaimId {
        uid,
        namespace: "ml",
        name: "train",
    }
}

fn requests(names: &[&str]) -> Vec<String> {
    names.iter().map(|&n| n.to_owned()).collect()
}

/// A device of the pool `node` serving `requests`.
fn on_node<'a>(requests: &'a [String], device: &'a str) -> PreparedDevice<'a> {
    PreparedDevice {
        requests,
        pool: "node",
        device,
    }
}

fn files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                out.push(format!("{}/", p.strip_prefix(root).unwrap().display()));
                stack.push(p);
            } else {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn one_file_per_request_mounted_on_its_first_device() {
    let dir = tempfile::tempdir().unwrap();
    let w = writer(dir.path());
    let (a, b, both) = (requests(&["a"]), requests(&["b"]), requests(&["a", "b"]));
    let devices = [
        on_node(&a, "gpu-0"),
        on_node(&both, "gpu-1"),
        on_node(&b, "gpu-2"),
    ];
    let mut facts = ClaimFacts::default();
    facts.requests.insert("b".into(), "b/large".into());
    let mounts = w.write(claim(UID), &facts, &devices).unwrap();
    assert_eq!(mounts.len(), 2);
    assert_eq!(mounts[0].0, 0, "request a: its first device");
    assert_eq!(mounts[1].0, 1, "request b: gpu-1 comes before gpu-2");
    let m = &mounts[1].1;
    assert_eq!(m.host_path, "/host/metadata/ml_train/b/metadata.json");
    assert_eq!(
        m.container_path,
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train/b/gpu.nvidia.com-metadata.json"
    );
    assert_eq!(m.options, ["ro", "bind"]);
    assert_eq!(m.mount_type, None);

    let root = dir.path().join("plugin-side");
    assert_eq!(
        files(&root),
        [
            "ml_train/",
            "ml_train/a/",
            "ml_train/a/metadata.json",
            "ml_train/b/",
            "ml_train/b/metadata.json"
        ]
    );
    let file = root.join("ml_train/b/metadata.json");
    assert_eq!(
        fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o644
    );
    let text = fs::read_to_string(&file).unwrap();
    let docs: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&text)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0]["apiVersion"], "metadata.resource.k8s.io/v1beta1");
    assert_eq!(docs[1]["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
    for doc in &docs {
        assert_eq!(doc["requests"][0]["name"], "b/large", "{doc}");
        let names: Vec<&str> = doc["requests"][0]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["gpu-1", "gpu-2"]);
        assert!(doc.get("podClaimName").is_none());
    }
    let a = fs::read_to_string(root.join("ml_train/a/metadata.json")).unwrap();
    assert!(a.contains(r#""string": "0000:18:00.0""#), "{a}");
}

#[test]
fn removal_takes_only_the_claims_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let w = writer(dir.path());
    let root = dir.path().join("plugin-side");
    let (a, b) = (requests(&["a"]), requests(&["b"]));
    let dev = |r| on_node(r, "gpu-0");
    w.write(claim(UID), &ClaimFacts::default(), &[dev(&a)])
        .unwrap();
    // Another claim of the same name (the first one deleted and made
    // again) with another request.
    w.write(claim(OTHER_UID), &ClaimFacts::default(), &[dev(&b)])
        .unwrap();
    assert_eq!(w.remove("ml", "train", UID).unwrap(), 1);
    assert_eq!(
        files(&root),
        ["ml_train/", "ml_train/b/", "ml_train/b/metadata.json"]
    );
    assert_eq!(w.remove("ml", "train", UID).unwrap(), 0, "idempotent");
    assert_eq!(w.remove_uid(OTHER_UID).unwrap(), 1);
    assert!(files(&root).is_empty(), "{:?}", files(&root));
    // Nothing there at all.
    assert_eq!(w.remove("ml", "train", UID).unwrap(), 0);
    assert_eq!(w.remove_uid(UID).unwrap(), 0);
}

#[test]
fn hostile_names_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let w = writer(dir.path());
    let ok = requests(&["gpu"]);
    for (ns, name, request, pod) in [
        ("..", "train", "gpu", None),
        ("ml", "../../etc", "gpu", None),
        ("ml", "train", "../x", None),
        ("ml", "train", "gpu", Some("../../x")),
        ("ml", "train", "gpu", Some("a/b")),
        ("ml", "t/r", "gpu", None),
        ("ml", &*"x".repeat(300), "gpu", None),
    ] {
        let r = requests(&["gpu", request]);
        let devices = [on_node(&ok, "gpu-0"), on_node(&r, "gpu-1")];
        let facts = ClaimFacts {
            pod_claim_name: pod.map(str::to_owned),
            ..ClaimFacts::default()
        };
        let id = ClaimId {
            uid: UID,
            namespace: ns,
            name,
        };
        let err = w.write(id, &facts, &devices).unwrap_err();
        assert!(
            matches!(err, MetadataError::InvalidName { .. }),
            "{ns:?} {name:?} {request:?} {pod:?}: {err}"
        );
        assert!(err.to_string().starts_with("invalid "), "{err}");
        assert!(
            !dir.path().join("plugin-side").exists(),
            "{ns:?} {name:?}: something was written"
        );
    }
    assert!(files(dir.path()).is_empty(), "{:?}", files(dir.path()));
}

#[test]
fn a_failed_write_leaves_nothing_of_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let w = writer(dir.path());
    let root = dir.path().join("plugin-side");
    // The second request's directory cannot be made: a file is in the way.
    fs::create_dir_all(root.join("ml_train")).unwrap();
    fs::write(root.join("ml_train/b"), "in the way").unwrap();
    let (a, b) = (requests(&["a"]), requests(&["b"]));
    let devices = [on_node(&a, "gpu-0"), on_node(&b, "gpu-1")];
    let err = w
        .write(claim(UID), &ClaimFacts::default(), &devices)
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("device metadata: create directory"),
        "{err}"
    );
    assert_eq!(files(&root), ["ml_train/", "ml_train/b"]);
}

#[test]
fn the_sweep_keeps_named_claims_and_removes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let w = writer(dir.path());
    let root = dir.path().join("plugin-side");
    let r = requests(&["gpu"]);
    let dev = [on_node(&r, "gpu-0")];
    w.write(claim(UID), &ClaimFacts::default(), &dev).unwrap();
    let other = ClaimId {
        uid: OTHER_UID,
        namespace: "ml",
        name: "other",
    };
    w.write(other, &ClaimFacts::default(), &dev).unwrap();
    // Debris: a temp file of an interrupted write, a damaged file, an
    // empty claim directory, a symlink out of the tree.
    fs::write(root.join("ml_train/gpu/.metadata.json.1-0.tmp"), "x").unwrap();
    fs::create_dir_all(root.join("ml_damaged/gpu")).unwrap();
    fs::write(root.join("ml_damaged/gpu/metadata.json"), "{\"kind\":").unwrap();
    fs::create_dir_all(root.join("ml_empty")).unwrap();
    let outside = dir.path().join("outside");
    fs::create_dir_all(outside.join("gpu")).unwrap();
    fs::write(outside.join("gpu/metadata.json"), "keep me").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("ml_link")).unwrap();

    let removed = w.sweep(&|uid| uid == UID).unwrap();
    let mut removed: Vec<String> = removed
        .iter()
        .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    removed.sort();
    assert_eq!(
        removed,
        [
            "ml_damaged/gpu/metadata.json",
            "ml_other/gpu/metadata.json",
            "ml_train/gpu/.metadata.json.1-0.tmp"
        ]
    );
    assert_eq!(
        files(&root),
        [
            "ml_link",
            "ml_train/",
            "ml_train/gpu/",
            "ml_train/gpu/metadata.json"
        ]
    );
    assert_eq!(
        fs::read_to_string(outside.join("gpu/metadata.json")).unwrap(),
        "keep me"
    );
    // A missing root sweeps nothing.
    let none = writer(&dir.path().join("nowhere"));
    assert!(none.sweep(&|_| false).unwrap().is_empty());
}

#[test]
fn facts_come_from_our_results_and_the_pod_claim_annotation() {
    let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "pod-gpus-x7k2p", "namespace": "ml", "uid": UID,
            "annotations": {"resource.kubernetes.io/pod-claim-name": "gpus"}
        },
        "spec": {},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu/large", "driver": "gpu.nvidia.com", "pool": "node", "device": "gpu-0"},
            {"request": "gpu/large", "driver": "gpu.nvidia.com", "pool": "node", "device": "gpu-1"},
            {"request": "nic", "driver": "net.example.com", "pool": "node", "device": "eth0"},
            {"request": "far", "driver": "gpu.nvidia.com", "pool": "other-node", "device": "gpu-0"},
            {"request": "mig", "driver": "gpu.nvidia.com", "pool": "node", "device": "gpu-2-mig-1g10gb-19-0"}
        ]}}}
    }))
    .unwrap();
    let facts = ClaimFacts::of(&claim, "gpu.nvidia.com", "node");
    assert_eq!(facts.pod_claim_name.as_deref(), Some("gpus"));
    let requests: Vec<(&str, &str)> = facts
        .requests
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(requests, [("gpu", "gpu/large"), ("mig", "mig")]);

    let mut plain = claim.clone();
    plain.metadata.annotations = None;
    assert_eq!(
        ClaimFacts::of(&plain, "gpu.nvidia.com", "node").pod_claim_name,
        None
    );
    let mut empty = claim;
    empty
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(POD_CLAIM_NAME_ANNOTATION.into(), String::new());
    assert_eq!(
        ClaimFacts::of(&empty, "gpu.nvidia.com", "node").pod_claim_name,
        None
    );
}
