use serde_json::json;

use super::super::driver_root::{DriverFile, DriverFileKind};
use super::*;

const UID: &str = "0f8e6a1c-3b9d-4e57-a1c2-9d8f7e6b5a43";

fn node(path: &str, host: &str) -> DeviceNode {
    DeviceNode {
        path: path.into(),
        host_path: Some(host.into()),
        ..DeviceNode::default()
    }
}

fn files(hook: bool) -> DriverFiles {
    let lib = |c: &str, h: &str| DriverFile {
        kind: DriverFileKind::Library,
        container_path: c.into(),
        host_path: h.into(),
    };
    DriverFiles {
        files: vec![
            lib(
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "/drv/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
            ),
            lib(
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                "/drv/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05",
            ),
            DriverFile {
                kind: DriverFileKind::Binary,
                container_path: "/usr/bin/nvidia-smi".into(),
                host_path: "/drv/usr/bin/nvidia-smi".into(),
            },
        ],
        cdi_hook: hook.then(|| "/drv/usr/bin/nvidia-cdi-hook".to_owned()),
        version: Some("580.95.05".into()),
    }
}

fn control() -> ControlNodes {
    ControlNodes {
        nodes: vec![
            node("/dev/nvidiactl", "/dev/nvidiactl"),
            node("/dev/nvidia-uvm", "/dev/nvidia-uvm"),
        ],
    }
}

const OPTS: [&str; 5] = ["ro", "nosuid", "nodev", "rbind", "rprivate"];

#[test]
fn whole_gpu_spec_structure() {
    let mut b = ClaimSpec::new(UID).unwrap();
    b.add_gpu(
        "gpu-0",
        &GpuNodes {
            minor: 0,
            nodes: vec![node("/dev/nvidia0", "/dev/nvidia0")],
        },
    )
    .unwrap();
    let built = b.build(claim_edits(&files(true), &control())).unwrap();
    assert_eq!(
        built.device_ids,
        [(
            "gpu-0".to_owned(),
            format!("k8s.gpu.nvidia.com/claim={UID}-gpu-0")
        )]
    );
    let v = serde_json::to_value(&built.spec).unwrap();
    let lib = "/usr/lib/x86_64-linux-gnu";
    assert_eq!(
        v,
        json!({
            "cdiVersion": "0.5.0",
            "kind": "k8s.gpu.nvidia.com/claim",
            "devices": [{
                "name": format!("{UID}-gpu-0"),
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0"}]
                }
            }],
            "containerEdits": {
                "env": ["NVIDIA_VISIBLE_DEVICES=void"],
                "deviceNodes": [
                    {"path": "/dev/nvidiactl", "hostPath": "/dev/nvidiactl"},
                    {"path": "/dev/nvidia-uvm", "hostPath": "/dev/nvidia-uvm"}
                ],
                "hooks": [
                    {
                        "hookName": "createContainer",
                        "path": "/drv/usr/bin/nvidia-cdi-hook",
                        "args": ["nvidia-cdi-hook", "create-symlinks", "--link",
                                 format!("libcuda.so.1::{lib}/libcuda.so")]
                    },
                    {
                        "hookName": "createContainer",
                        "path": "/drv/usr/bin/nvidia-cdi-hook",
                        "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", lib]
                    }
                ],
                "mounts": [
                    {"hostPath": "/drv/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
                     "containerPath": format!("{lib}/libcuda.so.1"), "options": OPTS},
                    {"hostPath": "/drv/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05",
                     "containerPath": format!("{lib}/libnvidia-ml.so.1"), "options": OPTS},
                    {"hostPath": "/drv/usr/bin/nvidia-smi",
                     "containerPath": "/usr/bin/nvidia-smi", "options": OPTS}
                ]
            }
        })
    );
}

#[test]
fn mig_spec_structure_and_no_hooks_without_the_hook_binary() {
    let mut b = ClaimSpec::new("claim-a").unwrap();
    let mig = MigNodes {
        parent_minor: 1,
        gi_cap_minor: 21,
        ci_cap_minor: 22,
        nodes: vec![
            node("/dev/nvidia1", "/dev/nvidia1"),
            node(
                "/dev/nvidia-caps/nvidia-cap21",
                "/dev/nvidia-caps/nvidia-cap21",
            ),
            node(
                "/dev/nvidia-caps/nvidia-cap22",
                "/dev/nvidia-caps/nvidia-cap22",
            ),
        ],
    };
    b.add_mig("gpu-1-mig-1g10gb-19-0", &mig).unwrap();
    b.add_gpu(
        "gpu-2",
        &GpuNodes {
            minor: 2,
            nodes: vec![node("/dev/nvidia2", "/dev/nvidia2")],
        },
    )
    .unwrap();
    let built = b.build(claim_edits(&files(false), &control())).unwrap();
    let ids: Vec<&str> = built.device_ids.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "k8s.gpu.nvidia.com/claim=claim-a-gpu-1-mig-1g10gb-19-0",
            "k8s.gpu.nvidia.com/claim=claim-a-gpu-2"
        ]
    );
    let v = serde_json::to_value(&built.spec).unwrap();
    assert_eq!(v["cdiVersion"], "0.5.0", "hostPath needs 0.5.0");
    assert_eq!(
        v["devices"][0]["containerEdits"]["deviceNodes"],
        json!([
            {"path": "/dev/nvidia1", "hostPath": "/dev/nvidia1"},
            {"path": "/dev/nvidia-caps/nvidia-cap21", "hostPath": "/dev/nvidia-caps/nvidia-cap21"},
            {"path": "/dev/nvidia-caps/nvidia-cap22", "hostPath": "/dev/nvidia-caps/nvidia-cap22"}
        ])
    );
    assert_eq!(v["devices"][1]["name"], "claim-a-gpu-2");
    assert!(v["containerEdits"].get("hooks").is_none(), "{v}");
    // Without the hook, each library also where the other image family's
    // loader looks: here (a Debian-layout root) /usr/lib64.
    let paths: Vec<&str> = v["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["containerPath"].as_str().unwrap())
        .collect();
    // And the unversioned libcuda.so, which the hook would have linked.
    let mut want = vec![
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1".to_owned(),
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1".to_owned(),
        "/usr/bin/nvidia-smi".to_owned(),
        "/usr/lib/x86_64-linux-gnu/libcuda.so".to_owned(),
    ];
    let extra: Vec<String> = [&want[0], &want[1], &want[3]]
        .into_iter()
        .flat_map(|lib| loader_paths(lib, std::env::consts::ARCH))
        .collect();
    want.extend(extra);
    assert_eq!(paths, want);
    if std::env::consts::ARCH == "x86_64" {
        assert_eq!(
            &paths[4..],
            [
                "/usr/lib64/libcuda.so.1",
                "/usr/lib64/libnvidia-ml.so.1",
                "/usr/lib64/libcuda.so"
            ]
        );
    }
    let mounts = &v["containerEdits"]["mounts"];
    for i in [3, 4] {
        assert_eq!(
            mounts[i]["hostPath"], "/drv/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
            "{i}"
        );
        assert_eq!(mounts[i]["options"], json!(OPTS));
    }
}

#[test]
fn without_the_hook_libcuda_so_is_mounted_unless_there_is_no_libcuda_so_1() {
    let host = "/drv/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05";
    let link = dev_link(&files(false)).unwrap();
    assert_eq!(
        (link.container_path.as_str(), link.host_path.as_str()),
        ("/usr/lib/x86_64-linux-gnu/libcuda.so", host)
    );
    // With the hook, create-symlinks makes the link: no mount of it.
    let mounted = |files: &DriverFiles| -> Vec<String> {
        claim_edits(files, &control())
            .mounts
            .into_iter()
            .map(|m| m.container_path)
            .collect()
    };
    let paths = mounted(&files(true));
    assert!(
        !paths.iter().any(|p| p.ends_with("/libcuda.so")),
        "{paths:?}"
    );
    // A root without libcuda.so.1 (discovery refuses one, but the edits
    // must not invent a path): nothing.
    let mut no_soname = files(false);
    no_soname.files.remove(0);
    assert_eq!(dev_link(&no_soname), None);
    let paths = mounted(&no_soname);
    assert!(!paths.iter().any(|p| p.contains("libcuda")), "{paths:?}");
}

#[test]
fn loader_paths_cover_both_image_families() {
    let x86 = "x86_64";
    let cases: [(&str, &str, &[&str]); 9] = [
        // GKE-style root (`lib64/`): Ubuntu's loader never searches /lib64.
        (
            "/lib64/libcuda.so.1",
            x86,
            &["/usr/lib/x86_64-linux-gnu/libcuda.so.1"],
        ),
        (
            "/usr/lib64/libcuda.so.1",
            x86,
            &["/usr/lib/x86_64-linux-gnu/libcuda.so.1"],
        ),
        // Debian-layout roots: Red Hat-family loaders search /usr/lib64.
        (
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            x86,
            &["/usr/lib64/libcuda.so.1"],
        ),
        (
            "/lib/x86_64-linux-gnu/libcuda.so.1",
            x86,
            &["/usr/lib64/libcuda.so.1"],
        ),
        ("/usr/lib/libcuda.so.1", x86, &["/usr/lib64/libcuda.so.1"]),
        // Neither: both.
        (
            "/usr/local/nvidia/lib64/libcuda.so.1",
            x86,
            &[
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "/usr/lib64/libcuda.so.1",
            ],
        ),
        (
            "/usr/lib64/libcuda.so.1",
            "aarch64",
            &["/usr/lib/aarch64-linux-gnu/libcuda.so.1"],
        ),
        // No Debian triplet known for the arch: only the Red Hat directory.
        (
            "/lib/x86_64-linux-gnu/libcuda.so.1",
            "riscv64",
            &["/usr/lib64/libcuda.so.1"],
        ),
        ("/", x86, &[]),
    ];
    for (path, arch, want) in cases {
        assert_eq!(loader_paths(path, arch), want, "{path} on {arch}");
    }
}

#[test]
fn builder_refuses_bad_input() {
    for uid in ["", "a/b", "..", &"u".repeat(65)] {
        assert!(
            matches!(ClaimSpec::new(uid), Err(CdiError::InvalidName { .. })),
            "{uid}"
        );
    }
    assert!(ClaimSpec::with_kind("k8s.gpu.nvidia.com", "cl/aim", "u").is_err());
    let gpu = GpuNodes {
        minor: 0,
        nodes: vec![node("/dev/nvidia0", "/dev/nvidia0")],
    };
    let mut b = ClaimSpec::new("u").unwrap();
    assert!(b.add_gpu("../gpu", &gpu).is_err());
    b.add_gpu("gpu-0", &gpu).unwrap();
    let err = b.add_gpu("gpu-0", &gpu).unwrap_err();
    assert!(matches!(err, CdiError::DuplicateDevice { .. }), "{err}");

    let empty = ClaimSpec::new("u").unwrap();
    let err = empty.build(ContainerEdits::default()).unwrap_err();
    assert_eq!(err.to_string(), "CDI spec for claim u has no devices");
}

#[test]
fn built_spec_writes_and_reads_back() {
    let tmp = tempfile::tempdir().unwrap();
    let mut b = ClaimSpec::new(UID).unwrap();
    b.add_gpu(
        "gpu-0",
        &GpuNodes {
            minor: 0,
            nodes: vec![node("/dev/nvidia0", "/dev/nvidia0")],
        },
    )
    .unwrap();
    let built = b.build(claim_edits(&files(true), &control())).unwrap();
    let dir = super::super::files::SpecDir::nvidia(tmp.path());
    let path = dir.write(UID, &built.spec).unwrap();
    let back: Spec = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(back, built.spec);
    assert_eq!(dir.list().unwrap(), [UID]);
}
