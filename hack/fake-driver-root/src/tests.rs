use std::os::unix::fs::PermissionsExt;

use super::*;

#[test]
fn layout_has_versioned_libraries_with_soname_links() {
    let dir = tempfile::tempdir().unwrap();
    let root = FakeDriverRoot::create(dir.path()).unwrap();
    let lib = root.lib_dir();
    let real = lib.join(format!("libcuda.so.{DEFAULT_DRIVER_VERSION}"));
    assert!(fs::symlink_metadata(&real).unwrap().is_file());
    assert_eq!(
        fs::read_link(lib.join("libcuda.so.1")).unwrap(),
        PathBuf::from(format!("libcuda.so.{DEFAULT_DRIVER_VERSION}"))
    );
    assert_eq!(
        fs::read_link(lib.join("libcuda.so")).unwrap(),
        PathBuf::from("libcuda.so.1")
    );
    assert_eq!(
        fs::read_link(lib.join("libnvidia-nvvm.so.4")).unwrap(),
        PathBuf::from(format!("libnvidia-nvvm.so.{DEFAULT_DRIVER_VERSION}"))
    );
    // No soname: only the versioned file.
    assert!(
        lib.join(format!("libnvidia-gpucomp.so.{DEFAULT_DRIVER_VERSION}"))
            .is_file()
    );
    assert!(!lib.join("libnvidia-gpucomp.so").exists());
    assert!(
        root.path()
            .join(format!(
                "lib/firmware/nvidia/{DEFAULT_DRIVER_VERSION}/gsp_ga10x.bin"
            ))
            .is_file()
    );
    for tool in [
        "nvidia-smi",
        "nvidia-cuda-mps-control",
        "nvidia-cuda-mps-server",
        "nvidia-cdi-hook",
    ] {
        let mode = fs::metadata(root.bin(tool)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755, "{tool}");
        let bytes = fs::read(root.bin(tool)).unwrap();
        if tool == "nvidia-cuda-mps-control" {
            // The compiled stand-in, not a script.
            assert!(bytes.starts_with(b"\x7fELF"), "{tool}");
            assert_eq!(bytes, scripts::MPS_CONTROL);
            continue;
        }
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("#!/bin/sh\n"), "{tool}");
        assert!(
            text.contains(&sh_quote(&root.path().to_string_lossy())),
            "{tool}"
        );
    }
    assert_eq!(root.records().unwrap(), vec![]);
    assert_eq!(root.gpu_state().unwrap(), GpuState::default());
}

#[test]
fn rebuilding_an_existing_root_replaces_its_files() {
    let dir = tempfile::tempdir().unwrap();
    FakeDriverRoot::create(dir.path()).unwrap();
    let again = FakeDriverRoot::create_with(
        dir.path(),
        Options {
            cdi_hook: false,
            ..Options::default()
        },
    )
    .unwrap();
    assert!(again.lib_dir().join("libcuda.so.1").exists());
    // The hook of the first build stays: create never deletes foreign files.
    assert!(again.bin("nvidia-cdi-hook").exists());
}

#[test]
fn options_that_cannot_be_scripted_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bad = [
        Options {
            driver_version: "580; rm -rf /".into(),
            ..Options::default()
        },
        Options {
            driver_version: String::new(),
            ..Options::default()
        },
        Options {
            gpus: vec!["GPU-1 GPU-2".into()],
            ..Options::default()
        },
        Options {
            gpus: vec!["GPU-'$(x)'".into()],
            ..Options::default()
        },
        Options {
            shell: "sh".into(),
            ..Options::default()
        },
        Options {
            shell: "/bin/sh\nrm".into(),
            ..Options::default()
        },
    ];
    for options in bad {
        let err = FakeDriverRoot::create_with(&dir.path().join("r"), options.clone()).unwrap_err();
        assert!(
            matches!(err, Error::InvalidOption { .. }),
            "{options:?}: {err}"
        );
    }
    // Nothing was built for the refused options.
    assert!(!dir.path().join("r").exists());
}

#[test]
fn behaviour_is_quoted_into_the_conf_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = FakeDriverRoot::create(dir.path()).unwrap();
    root.set_behaviour(&Behaviour {
        nvidia_smi_failure: Some((3, "it's $(broken)".into())),
        mps_start_delay_ms: 20,
        ..Behaviour::default()
    })
    .unwrap();
    let conf = fs::read_to_string(root.path().join(BEHAVIOUR_FILE)).unwrap();
    assert!(
        conf.contains(r"FAKE_SMI_FAIL_MESSAGE='it'\''s $(broken)'"),
        "{conf}"
    );
    assert!(conf.contains("FAKE_SMI_FAIL_CODE=3\n"));
    assert!(conf.contains("FAKE_MPS_START_DELAY_MS=20\n"));
    let err = root
        .set_behaviour(&Behaviour {
            nvidia_smi_failure: Some((0, "x".into())),
            ..Behaviour::default()
        })
        .unwrap_err();
    assert!(err.to_string().contains("non-zero"), "{err}");
}

#[test]
fn gpu_state_parses_last_value_and_rejects_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let root = FakeDriverRoot::create(dir.path()).unwrap();
    let path = root.path().join(GPU_STATE);
    fs::write(
        &path,
        "timeslice GPU-a 1\ncompute_mode GPU-a EXCLUSIVE_PROCESS\ntimeslice GPU-a 3\n",
    )
    .unwrap();
    let state = root.gpu_state().unwrap();
    assert_eq!(state.timeslice["GPU-a"], 3);
    assert_eq!(state.compute_mode["GPU-a"], "EXCLUSIVE_PROCESS");

    fs::write(&path, "timeslice GPU-a 1\ntimeslice GPU-a x\n").unwrap();
    let err = root.gpu_state().unwrap_err();
    assert!(matches!(&err, Error::BadLog { offset: 18, .. }), "{err}");
    fs::write(&path, "rm -rf /\n").unwrap();
    assert!(
        root.gpu_state()
            .unwrap_err()
            .to_string()
            .contains("unknown line")
    );
}

#[test]
fn mps_state_parses_and_rejects_garbage() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(FakeDriverRoot::mps_state(dir.path()).unwrap(), None);
    let path = dir.path().join(MPS_STATE_FILE);
    fs::write(
        &path,
        "daemon_pid - 42\ndev_shm - 5:77\nvisible_devices - \n\
         active_thread_percentage - 50\npinned_mem_limit GPU-a 1024M\n\
         pinned_mem_limit GPU-a 2G\n",
    )
    .unwrap();
    let state = FakeDriverRoot::mps_state(dir.path()).unwrap().unwrap();
    assert_eq!(state.daemon_pid, Some(42));
    assert_eq!(state.dev_shm, Some((5, 77)));
    assert_eq!(state.visible_devices, "");
    assert_eq!(state.active_thread_percentage.as_deref(), Some("50"));
    assert_eq!(state.pinned_mem_limits["GPU-a"], "2G");

    fs::write(&path, "daemon_pid - x\n").unwrap();
    assert!(
        FakeDriverRoot::mps_state(dir.path())
            .unwrap_err()
            .to_string()
            .contains("bad pid")
    );
    fs::write(&path, "what\n").unwrap();
    assert!(
        FakeDriverRoot::mps_state(dir.path())
            .unwrap_err()
            .to_string()
            .contains("short line")
    );
}

#[test]
fn proc_root_has_the_capability_skeleton() {
    let dir = tempfile::tempdir().unwrap();
    let proc_root = create_proc_root(dir.path()).unwrap();
    let caps = proc_root.join("driver/nvidia/capabilities");
    assert!(caps.is_dir());
    assert_eq!(
        fs::read_to_string(caps.join("mig/monitor")).unwrap(),
        "DeviceFileMinor: 2\nDeviceFileMode: 292\n"
    );
    assert!(
        fs::read_to_string(proc_root.join("driver/nvidia/version"))
            .unwrap()
            .contains(DEFAULT_DRIVER_VERSION)
    );
}
