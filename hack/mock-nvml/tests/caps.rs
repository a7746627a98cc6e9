//! MIG capability files through the real NVML entry points: with a proc
//! root and a dev root configured (sidecar or environment), the library
//! keeps `driver/nvidia/capabilities/gpu<m>/mig/gi<g>[/ci<c>]/access` and
//! the stand-in nodes `dev/nvidia-caps/nvidia-cap<N>` in line with the GPU
//! and compute instances, as the kernel does: there at init for the
//! profile's instances, created and removed with each instance.
#![allow(unsafe_code)]

#[macro_use]
mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::{LastError, assert_success, is_child, nvml_from_env, run_child};
use nvidia_ml::caps::{access_text, ci_minor, gi_minor};
use nvidia_ml::fixture::{self, InstallOptions};
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings as sys;

/// A library copy with both roots under one temporary directory.
struct Machine {
    dir: tempfile::TempDir,
    lib: PathBuf,
}

impl Machine {
    fn new(profile: &str) -> Machine {
        let dir = tempfile::tempdir().unwrap();
        let lib = fixture::install_with(
            &dir.path().join("lib"),
            &fixture::bundled_profile(profile),
            &InstallOptions {
                state: None,
                proc_root: Some(dir.path().join("proc")),
                dev_root: Some(dir.path().join("root")),
                control: None,
            },
        )
        .unwrap();
        Machine { dir, lib }
    }

    fn nvml(&self) -> Nvml {
        Nvml::builder()
            .lib_path(self.lib.as_os_str())
            .init()
            .unwrap()
    }

    /// The `gi<g>` / `gi<g>/ci<c>` entries that have an access file on GPU
    /// `minor`, checked to hold the right minor and to have their node.
    fn caps(&self, minor: u32) -> BTreeSet<String> {
        caps_under(self.dir.path(), minor)
    }
}

fn caps_under(root: &Path, minor: u32) -> BTreeSet<String> {
    let mig = root.join(format!("proc/driver/nvidia/capabilities/gpu{minor}/mig"));
    let mut out = BTreeSet::new();
    let Ok(gis) = std::fs::read_dir(&mig) else {
        return out;
    };
    for gi in gis {
        let gi = gi.unwrap();
        let name = gi.file_name().into_string().unwrap();
        let g: u32 = name.strip_prefix("gi").unwrap().parse().unwrap();
        check_access(root, &gi.path(), gi_minor(minor, g).unwrap());
        out.insert(name.clone());
        for ci in std::fs::read_dir(gi.path()).unwrap() {
            let ci = ci.unwrap();
            let ci_name = ci.file_name().into_string().unwrap();
            if ci_name == "access" {
                continue;
            }
            let c: u32 = ci_name.strip_prefix("ci").unwrap().parse().unwrap();
            check_access(root, &ci.path(), ci_minor(minor, g, c).unwrap());
            out.insert(format!("{name}/{ci_name}"));
        }
    }
    out
}

/// The access file in `dir` names `minor`, and its node exists.
fn check_access(root: &Path, dir: &Path, minor: u32) {
    let text = std::fs::read_to_string(dir.join("access")).unwrap();
    assert_eq!(text, access_text(minor), "{}", dir.display());
    let node = root.join(format!("root/dev/nvidia-caps/nvidia-cap{minor}"));
    assert!(node.is_file(), "{} missing", node.display());
}

/// Every stand-in node under the dev root.
fn nodes(root: &Path) -> BTreeSet<u32> {
    let Ok(list) = std::fs::read_dir(root.join("root/dev/nvidia-caps")) else {
        return BTreeSet::new();
    };
    list.map(|e| {
        let name = e.unwrap().file_name().into_string().unwrap();
        name.strip_prefix("nvidia-cap").unwrap().parse().unwrap()
    })
    .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn the_profiles_instances_have_their_files_at_init() {
    let m = Machine::new("dgx-a100");
    let _nvml = m.nvml();
    // GPU 0: 4g.40gb@0 (GI 1) + 3g.40gb@4 (GI 2).
    assert_eq!(m.caps(0), set(&["gi1", "gi1/ci0", "gi2", "gi2/ci0"]));
    // GPU 1: seven 1g.10gb, GI ids 7-13.
    assert_eq!(m.caps(1).len(), 14);
    // GPU 2: 2g.20gb@0 (GI 3), 1g.20gb@2 without CI (GI 4), 3g.40gb@4 split
    // into two compute instances (GI 2).
    assert_eq!(
        m.caps(2),
        set(&["gi2", "gi2/ci0", "gi2/ci1", "gi3", "gi3/ci0", "gi4"])
    );
    assert!(m.caps(3).is_empty());
    assert_eq!(nodes(m.dir.path()).len(), 4 + 14 + 6);
}

#[test]
fn files_come_and_go_with_the_instances() {
    let m = Machine::new("dgx-a100");
    let nvml = m.nvml();
    let gpu = nvml.device_by_index(3).unwrap();
    // SAFETY: the handle goes back to the library it came from.
    let handle = unsafe { gpu.handle() };
    let before = nodes(m.dir.path());

    let placement = sys::nvmlGpuInstancePlacement_t { start: 4, size: 4 };
    let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceCreateGpuInstanceWithPlacement(handle, 9, &raw const placement, &raw mut gi)
        ),
        0
    );
    // 3g.40gb at 4 is the upper half: GI 2.
    assert_eq!(m.caps(3), set(&["gi2"]));
    let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
    assert_eq!(
        call!(
            nvml,
            nvmlGpuInstanceCreateComputeInstance(
                gi,
                sys::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
                &raw mut ci
            )
        ),
        0
    );
    assert_eq!(m.caps(3), set(&["gi2", "gi2/ci0"]));
    let added: Vec<u32> = nodes(m.dir.path()).difference(&before).copied().collect();
    assert_eq!(added, [gi_minor(3, 2).unwrap(), ci_minor(3, 2, 0).unwrap()]);

    assert_eq!(call!(nvml, nvmlComputeInstanceDestroy(ci)), 0);
    assert_eq!(m.caps(3), set(&["gi2"]));
    assert_eq!(call!(nvml, nvmlGpuInstanceDestroy(gi)), 0);
    assert!(m.caps(3).is_empty());
    assert_eq!(nodes(m.dir.path()), before, "nodes removed again");
    // The other GPUs' files were not touched.
    assert_eq!(m.caps(0), set(&["gi1", "gi1/ci0", "gi2", "gi2/ci0"]));
}

#[test]
fn a_failed_create_leaves_no_files() {
    let m = Machine::new("dgx-a100");
    let nvml = m.nvml();
    let gpu = nvml.device_by_index(0).unwrap();
    // SAFETY: the handle goes back to the library it came from.
    let handle = unsafe { gpu.handle() };
    let before = nodes(m.dir.path());
    // GPU 0 is full: 3g.40gb at 4 overlaps its GI 2.
    let placement = sys::nvmlGpuInstancePlacement_t { start: 4, size: 4 };
    let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    assert_ne!(
        call!(
            nvml,
            nvmlDeviceCreateGpuInstanceWithPlacement(handle, 9, &raw const placement, &raw mut gi)
        ),
        0
    );
    assert_eq!(m.caps(0), set(&["gi1", "gi1/ci0", "gi2", "gi2/ci0"]));
    assert_eq!(nodes(m.dir.path()), before);
}

#[test]
fn an_unusable_root_fails_init_with_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, "").unwrap();
    let lib = fixture::install_with(
        &dir.path().join("lib"),
        &fixture::bundled_profile("dgx-a100"),
        &InstallOptions {
            proc_root: Some(file.clone()),
            ..InstallOptions::default()
        },
    )
    .unwrap();
    let last = LastError::open(&lib);
    let err = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .unwrap_err();
    assert!(
        matches!(err, nvml_wrapper::error::NvmlError::Unknown),
        "{err:?}"
    );
    let message = last.get();
    assert!(
        message.contains(&file.display().to_string()) && message.contains("gpu0/mig"),
        "{message}"
    );
}

#[test]
fn roots_can_come_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let profile = fixture::bundled_profile("mixed");
    let proc_root = dir.path().join("proc");
    let dev_root = dir.path().join("root");
    let output = run_child(
        "child_creates_an_instance",
        &[
            ("MOCK_NVML_PROFILE", profile.as_os_str()),
            ("MOCK_NVML_PROC_ROOT", proc_root.as_os_str()),
            ("MOCK_NVML_DEV_ROOT", dev_root.as_os_str()),
        ],
    );
    assert_success(&output);
    // mixed: GPU 1 (minor 1) has a 3g.40gb at 0 (GI 1) from the profile;
    // the child added a 1g.10gb at 6 (GI 13) with its compute instance.
    assert_eq!(
        caps_under(dir.path(), 1),
        set(&["gi1", "gi1/ci0", "gi13", "gi13/ci0"])
    );
}

#[test]
#[ignore = "child process of roots_can_come_from_the_environment"]
fn child_creates_an_instance() {
    if !is_child() {
        return;
    }
    let nvml = nvml_from_env().unwrap();
    let gpu = nvml.device_by_index(1).unwrap();
    // SAFETY: the handle goes back to the library it came from.
    let handle = unsafe { gpu.handle() };
    let placement = sys::nvmlGpuInstancePlacement_t { start: 6, size: 1 };
    let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceCreateGpuInstanceWithPlacement(handle, 19, &raw const placement, &raw mut gi)
        ),
        0
    );
    let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
    assert_eq!(
        call!(
            nvml,
            nvmlGpuInstanceCreateComputeInstance(
                gi,
                sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
                &raw mut ci
            )
        ),
        0
    );
}
