//! Hardware state outlives the process: with a state file, what one process
//! creates (GPU/compute instances, MIG mode, compute mode) is what the next
//! one sees; without one, it lives as long as the library stays loaded. A
//! broken state file fails init with a clear message.
#![allow(unsafe_code)]

mod common;

use std::ffi::OsStr;

use common::{Fake, LastError, assert_success, is_child, nvml_from_env, run_child};
use nvidia_ml::fixture::bundled_profile;
use nvidia_ml::state::StateFile;
use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;

/// Creates a 3g.40gb GPU instance at 0 and a full compute instance on GPU
/// `index` (which has no MIG device yet), returning the MIG device's UUID.
fn create_mig_device(nvml: &nvml_wrapper::Nvml, index: u32) -> String {
    let gpu = nvml.device_by_index(index).unwrap();
    let lib = nvml.lib();
    let placement = sys::nvmlGpuInstancePlacement_t { start: 0, size: 4 };
    let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
    // SAFETY: handles from this library, pointers to live locals.
    unsafe {
        let create = lib
            .nvmlDeviceCreateGpuInstanceWithPlacement
            .as_ref()
            .unwrap();
        assert_eq!(
            create(gpu.handle(), 9, &raw const placement, &raw mut gi),
            0
        );
        let create_ci = lib.nvmlGpuInstanceCreateComputeInstance.as_ref().unwrap();
        assert_eq!(
            create_ci(gi, sys::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, &raw mut ci),
            0
        );
    }
    // the GPU had no MIG device before, so this is the first
    gpu.mig_device_by_index(0).unwrap().uuid().unwrap()
}

fn mig_uuids(nvml: &nvml_wrapper::Nvml, index: u32) -> Vec<String> {
    let gpu = nvml.device_by_index(index).unwrap();
    (0..gpu.mig_device_count().unwrap())
        .map_while(|i| gpu.mig_device_by_index(i).ok())
        .map(|d| d.uuid().unwrap())
        .collect()
}

#[test]
fn a_second_library_instance_sees_what_the_first_created() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let profile = bundled_profile("dgx-a100");

    let first = Fake::with_profile(&profile, Some(&state));
    let nvml = first.nvml();
    let uuid = create_mig_device(&nvml, 3);
    nvml.device_by_index(5)
        .unwrap()
        .set_compute_mode(ComputeMode::ExclusiveProcess)
        .unwrap();

    // the state file says what exists, for tests to look at
    let file = StateFile::read(&state).unwrap().unwrap();
    let gpu3 = &file.gpus[3];
    assert_eq!(gpu3.gpu_instances.len(), 1);
    assert_eq!(gpu3.gpu_instances[0].profile, "3g.40gb");
    assert_eq!(gpu3.gpu_instances[0].compute_instances[0].uuid, uuid);
    assert_eq!(
        file.gpus[5].compute_mode,
        nvidia_ml::profile::ComputeMode::ExclusiveProcess
    );

    // a "restarted plugin": another library instance, same profile and state
    let second = Fake::with_profile(&profile, Some(&state));
    let nvml2 = second.nvml();
    assert_eq!(mig_uuids(&nvml2, 3), std::slice::from_ref(&uuid));
    assert_eq!(
        nvml2.device_by_uuid(uuid.as_str()).unwrap().uuid().unwrap(),
        uuid
    );
    assert_eq!(
        nvml2.device_by_index(5).unwrap().compute_mode().unwrap(),
        ComputeMode::ExclusiveProcess
    );
    // the profile's own MIG devices are still there too
    assert_eq!(mig_uuids(&nvml2, 1).len(), 7);
}

#[test]
fn state_survives_a_process_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let profile = bundled_profile("mixed");
    let env = [
        ("MOCK_NVML_PROFILE", profile.as_os_str()),
        ("MOCK_NVML_STATE", state.as_os_str()),
    ];
    let created = run_child("child_creates_a_mig_device", &env);
    assert_success(&created);
    let stdout = String::from_utf8_lossy(&created.stdout);
    let uuid = stdout
        .lines()
        .find_map(|l| l.split_once("CREATED ").map(|(_, uuid)| uuid.trim()))
        .unwrap_or_else(|| panic!("no CREATED line in {stdout}"))
        .to_owned();
    let mut env2 = env.to_vec();
    env2.push(("EXPECT_MIG_UUID", OsStr::new(&uuid)));
    assert_success(&run_child("child_sees_the_mig_device", &env2));
}

#[test]
#[ignore = "child process of state_survives_a_process_restart"]
fn child_creates_a_mig_device() {
    if !is_child() {
        return;
    }
    let nvml = nvml_from_env().unwrap();
    // GPU 0 of `mixed` is an H100 with MIG off: enable it (Hopper: at once)
    nvml.device_by_index(0).unwrap().set_mig_mode(true).unwrap();
    println!("CREATED {}", create_mig_device(&nvml, 0));
}

#[test]
#[ignore = "child process of state_survives_a_process_restart"]
fn child_sees_the_mig_device() {
    if !is_child() {
        return;
    }
    let expected = std::env::var("EXPECT_MIG_UUID").unwrap();
    let nvml = nvml_from_env().unwrap();
    assert_eq!(
        nvml.device_by_index(0).unwrap().mig_mode().unwrap().current,
        1
    );
    assert_eq!(mig_uuids(&nvml, 0), [expected]);
}

#[test]
fn without_a_state_file_state_lives_while_the_library_is_loaded() {
    let fake = Fake::bundled("mixed");
    let keep_loaded = LastError::open(&fake.lib);
    let nvml = fake.nvml();
    nvml.device_by_index(0).unwrap().set_mig_mode(true).unwrap();
    let uuid = create_mig_device(&nvml, 0);
    nvml.shutdown().unwrap();
    let nvml = fake.nvml();
    assert_eq!(mig_uuids(&nvml, 0), [uuid]);
    drop(keep_loaded);
}

#[test]
fn a_corrupt_state_file_fails_init_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    std::fs::write(&state, "{\"version\": 1, \"gpus\": [").unwrap();
    let fake = Fake::with_profile(&bundled_profile("mixed"), Some(&state));
    let last = LastError::open(&fake.lib);
    let err = nvml_wrapper::Nvml::builder()
        .lib_path(fake.lib.as_os_str())
        .init()
        .unwrap_err();
    assert!(matches!(err, NvmlError::Unknown), "{err:?}");
    let message = last.get();
    assert!(message.contains("state file"), "{message}");
    assert!(message.contains(&state.display().to_string()), "{message}");
    assert!(message.contains("not a state file"), "{message}");
}

#[test]
fn a_state_file_that_breaks_the_hardware_rules_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let profile = bundled_profile("mixed");
    // a valid state first, then edited into two overlapping GPU instances
    {
        let fake = Fake::with_profile(&profile, Some(&state));
        let nvml = fake.nvml();
        nvml.device_by_index(0).unwrap().set_mig_mode(true).unwrap();
        create_mig_device(&nvml, 0);
    }
    let mut file = StateFile::read(&state).unwrap().unwrap();
    let mut clone = file.gpus[0].gpu_instances[0].clone();
    clone.id += 1;
    clone.compute_instances.clear();
    file.gpus[0].gpu_instances.push(clone);
    file.write(&state).unwrap();

    let fake = Fake::with_profile(&profile, Some(&state));
    let last = LastError::open(&fake.lib);
    assert!(
        nvml_wrapper::Nvml::builder()
            .lib_path(fake.lib.as_os_str())
            .init()
            .is_err()
    );
    let message = last.get();
    assert!(message.contains("overlaps GPU instance"), "{message}");

    // and a GPU that is not in the profile
    let mut file = StateFile::read(&state).unwrap().unwrap();
    file.gpus[0].gpu_instances.pop();
    file.gpus[1].uuid = "GPU-00000000-0000-0000-0000-000000000000".into();
    file.write(&state).unwrap();
    let fake = Fake::with_profile(&profile, Some(&state));
    let last = LastError::open(&fake.lib);
    assert!(
        nvml_wrapper::Nvml::builder()
            .lib_path(fake.lib.as_os_str())
            .init()
            .is_err()
    );
    assert!(
        last.get()
            .contains("GPU GPU-00000000-0000-0000-0000-000000000000 is not in the profile"),
        "{}",
        last.get()
    );
}
