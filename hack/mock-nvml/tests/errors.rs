//! Bad input and misuse: malformed profiles fail init with a precise message
//! (on stderr and from `mockNvmlLastError`), calls before init are
//! UNINITIALIZED, bad pointers INVALID_ARGUMENT, short buffers
//! INSUFFICIENT_SIZE, and injected failures hit exactly the GPU they name.
#![allow(unsafe_code)]

#[macro_use]
mod common;

use std::ffi::{CStr, c_char, c_int, c_uint};

use common::{Fake, LastError, assert_success, is_child, nvml_from_env, run_child};
use nvidia_ml::fixture::bundled_profile;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;

const SUCCESS: u32 = 0;
const UNINITIALIZED: u32 = 1;
const INVALID_ARGUMENT: u32 = 2;
const INSUFFICIENT_SIZE: u32 = 7;
const ARGUMENT_VERSION_MISMATCH: u32 = 25;

type Count = unsafe extern "C" fn(*mut c_uint) -> u32;
type NoArgs = unsafe extern "C" fn() -> u32;

fn init(fake: &Fake) -> Result<Nvml, NvmlError> {
    Nvml::builder().lib_path(fake.lib.as_os_str()).init()
}

#[test]
fn calls_before_init_are_uninitialized_and_init_is_counted() {
    let fake = Fake::bundled("t4-inference");
    let lib = LastError::open(&fake.lib);
    // SAFETY: the symbols have these signatures (NVML's).
    let (count, init, shutdown) = unsafe {
        (
            *lib.library()
                .get::<Count>(b"nvmlDeviceGetCount_v2\0")
                .unwrap(),
            *lib.library().get::<NoArgs>(b"nvmlInit_v2\0").unwrap(),
            *lib.library().get::<NoArgs>(b"nvmlShutdown\0").unwrap(),
        )
    };
    let mut n: c_uint = 0;
    // SAFETY: `n` is a live local; the functions take no other arguments.
    unsafe {
        assert_eq!(count(&raw mut n), UNINITIALIZED);
        assert_eq!(shutdown(), UNINITIALIZED);
        assert_eq!(init(), SUCCESS);
        assert_eq!(init(), SUCCESS);
        assert_eq!(shutdown(), SUCCESS);
        assert_eq!(count(&raw mut n), SUCCESS, "still one init outstanding");
        assert_eq!(n, 4);
        assert_eq!(shutdown(), SUCCESS);
        assert_eq!(count(&raw mut n), UNINITIALIZED);
        assert_eq!(shutdown(), UNINITIALIZED);
    }
}

const GOOD_GPU: &str = "  - {model: A100-SXM4-80GB, uuid: GPU-11111111-2222-3333-4444-555555555555, pciBusId: \"0000:18:00.0\", minor: 0, numaNode: 0, pcieRoot: pci0000:10";

#[test]
fn malformed_profiles_fail_init_with_a_clear_message() {
    let head = "driverVersion: \"580.95.05\"\ncudaDriverVersion: 13000\ngpus:\n";
    let cases = [
        (
            format!("{head}{GOOD_GPU}, color: red}}\n"),
            "gpus[0]: unknown field `color`",
        ),
        (
            format!("{head}  - {{model: T4}}\n"),
            "gpus[0]: missing field `uuid`",
        ),
        (
            format!(
                "{head}{GOOD_GPU}}}\n{}}}\n",
                GOOD_GPU
                    .replace("minor: 0", "minor: 1")
                    .replace("18:00", "19:00")
            ),
            "gpus[1]: uuid GPU-11111111-2222-3333-4444-555555555555 is used by another GPU",
        ),
        (
            format!("{head}{GOOD_GPU}, nvlinks: [{{link: 0, remote: \"0000:99:00.0\"}}]}}\n"),
            "remote 0000:99:00.0 is neither a GPU of the profile nor an NVSwitch",
        ),
        (
            format!(
                "{head}{GOOD_GPU}, mig: {{current: true, devices: [{{profile: 4g.40gb, placement: 0}}, {{profile: 3g.40gb, placement: 0}}]}}}}\n"
            ),
            "mig.devices[1]: 3g.40gb at placement 0 overlaps GPU instance",
        ),
        (
            format!("{head}{GOOD_GPU}, fail: {{nvmlDeviceGetMemoryInfo: OOPS}}}}\n"),
            "\"OOPS\" is not an NVML error code",
        ),
        ("gpus: [\n".to_owned(), "line"),
        (String::new(), "missing field"),
    ];
    for (yaml, expected) in cases {
        let fake = Fake::with_yaml(&yaml);
        let last = LastError::open(&fake.lib);
        let err = init(&fake).unwrap_err();
        assert!(matches!(err, NvmlError::Unknown), "{err:?} for {yaml}");
        let message = last.get();
        let profile = fake.dir.path().join("profile.yaml");
        let prefix = format!("nvmlInit failed (UNKNOWN): profile {}: ", profile.display());
        assert!(message.starts_with(&prefix), "{message:?}");
        assert!(
            message.contains(expected),
            "{expected:?} not in {message:?}"
        );
    }
}

#[test]
fn a_missing_profile_file_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.yaml");
    let fake = Fake::with_profile(&missing, None);
    let last = LastError::open(&fake.lib);
    assert!(matches!(init(&fake), Err(NvmlError::Unknown)));
    assert!(
        last.get()
            .contains(&format!("cannot read profile {}", missing.display())),
        "{}",
        last.get()
    );
}

#[test]
fn errors_reach_stderr_and_no_profile_means_no_driver() {
    let output = run_child("child_without_profile", &[]);
    assert_success(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("mock-nvml: nvmlInit failed (DRIVER_NOT_LOADED)"),
        "{stderr}"
    );
    assert!(stderr.contains("set MOCK_NVML_PROFILE"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("bad.yaml");
    std::fs::write(
        &profile,
        "driverVersion: \"580.95.05\"\ncudaDriverVersion: 13000\ngpus: []\nextra: 1\n",
    )
    .unwrap();
    let output = run_child(
        "child_with_bad_profile",
        &[("MOCK_NVML_PROFILE", profile.as_os_str())],
    );
    assert_success(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("mock-nvml: nvmlInit failed (UNKNOWN): profile"),
        "{stderr}"
    );
    assert!(stderr.contains("unknown field `extra`"), "{stderr}");
}

#[test]
#[ignore = "child process of errors_reach_stderr_and_no_profile_means_no_driver"]
fn child_without_profile() {
    if !is_child() {
        return;
    }
    assert!(matches!(nvml_from_env(), Err(NvmlError::DriverNotLoaded)));
}

#[test]
#[ignore = "child process of errors_reach_stderr_and_no_profile_means_no_driver"]
fn child_with_bad_profile() {
    if !is_child() {
        return;
    }
    assert!(matches!(nvml_from_env(), Err(NvmlError::Unknown)));
}

fn text(buffer: &[c_char]) -> String {
    // SAFETY: the library NUL-terminated the buffer (asserted by callers
    // through the return code).
    unsafe { CStr::from_ptr(buffer.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn bad_pointers_handles_and_buffers_are_rejected() {
    let fake = Fake::bundled("dgx-a100");
    let nvml = fake.nvml();
    let gpu = nvml.device_by_index(0).unwrap();
    // SAFETY: only passed back to the library.
    let h = unsafe { gpu.handle() };
    let bogus = std::ptr::without_provenance_mut::<sys::nvmlDevice_st>(0x1234);

    assert_eq!(
        call!(nvml, nvmlDeviceGetCount_v2(std::ptr::null_mut())),
        INVALID_ARGUMENT
    );
    let mut name = [0 as c_char; 96];
    assert_eq!(
        call!(nvml, nvmlDeviceGetName(h, name.as_mut_ptr(), 4)),
        INSUFFICIENT_SIZE
    );
    // exactly the length plus NUL fits
    let product = "NVIDIA A100-SXM4-80GB";
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetName(h, name.as_mut_ptr(), product.len() as c_uint)
        ),
        INSUFFICIENT_SIZE
    );
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetName(h, name.as_mut_ptr(), product.len() as c_uint + 1)
        ),
        SUCCESS
    );
    assert_eq!(text(&name), product);
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetName(std::ptr::null_mut(), name.as_mut_ptr(), 96)
        ),
        INVALID_ARGUMENT
    );
    assert_eq!(
        call!(nvml, nvmlDeviceGetName(bogus, name.as_mut_ptr(), 96)),
        INVALID_ARGUMENT
    );
    assert_eq!(
        call!(nvml, nvmlDeviceGetUUID(h, std::ptr::null_mut(), 96)),
        INVALID_ARGUMENT
    );
    let mut version = [0 as c_char; 80];
    assert_eq!(
        call!(nvml, nvmlSystemGetDriverVersion(version.as_mut_ptr(), 5)),
        INSUFFICIENT_SIZE
    );
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetHandleByUUID(std::ptr::null(), std::ptr::null_mut())
        ),
        INVALID_ARGUMENT
    );
    let mut minor: c_int = 0;
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetCudaComputeCapability(h, std::ptr::null_mut(), &raw mut minor)
        ),
        INVALID_ARGUMENT
    );
    assert_eq!(
        call!(nvml, nvmlDeviceSetComputeMode(h, 9)),
        INVALID_ARGUMENT
    );
    let mut status: sys::nvmlGpuP2PStatus_t = 0;
    assert_eq!(
        call!(nvml, nvmlDeviceGetP2PStatus(h, h, 9, &raw mut status)),
        INVALID_ARGUMENT
    );
    let mut cap: c_uint = 0;
    assert_eq!(
        call!(nvml, nvmlDeviceGetNvLinkCapability(h, 0, 99, &raw mut cap)),
        INVALID_ARGUMENT
    );
    let mut memory = sys::nvmlMemory_v2_t {
        version: 1,
        total: 0,
        reserved: 0,
        free: 0,
        used: 0,
    };
    assert_eq!(
        call!(nvml, nvmlDeviceGetMemoryInfo_v2(h, &raw mut memory)),
        ARGUMENT_VERSION_MISMATCH
    );
    let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceCreateGpuInstanceWithPlacement(h, 19, std::ptr::null(), &raw mut gi)
        ),
        INVALID_ARGUMENT
    );
    // a rejected create left nothing behind
    let mut remaining: c_uint = 0;
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetGpuInstanceRemainingCapacity(h, 19, &raw mut remaining)
        ),
        SUCCESS
    );
    assert_eq!(remaining, 0, "GPU 0 is full (4g + 3g)");
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceCreateGpuInstance(h, 19, std::ptr::null_mut())
        ),
        INVALID_ARGUMENT
    );
    let mut current: c_uint = 0;
    assert_eq!(
        call!(nvml, nvmlDeviceSetMigMode(h, 1, std::ptr::null_mut())),
        INVALID_ARGUMENT
    );
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetMigMode(h, &raw mut current, std::ptr::null_mut())
        ),
        INVALID_ARGUMENT
    );
    assert_eq!(
        call!(nvml, nvmlGpuInstanceDestroy(std::ptr::null_mut())),
        INVALID_ARGUMENT
    );
    assert_eq!(
        call!(nvml, nvmlComputeInstanceDestroy(bogus.cast())),
        INVALID_ARGUMENT
    );
    let not_supported = call!(nvml, nvmlErrorString(3));
    // SAFETY: nvmlErrorString returns a static NUL-terminated string.
    let not_supported = unsafe { CStr::from_ptr(not_supported) };
    assert_eq!(not_supported.to_str().unwrap(), "Not Supported");
    // handles of a GPU used as a GPU-instance handle are rejected too
    assert_eq!(
        call!(nvml, nvmlGpuInstanceDestroy(h.cast())),
        INVALID_ARGUMENT
    );
}

#[test]
fn injected_failures_hit_exactly_the_named_gpu() {
    let yaml = std::fs::read_to_string(bundled_profile("t4-inference"))
        .unwrap()
        .replacen(
            "    minor: 1\n",
            "    minor: 1\n    fail: {nvmlDeviceGetMemoryInfo: UNKNOWN}\n",
            1,
        )
        .replacen(
            "    minor: 2\n",
            "    minor: 2\n    fail: {nvmlDeviceGetHandleByIndex: GPU_IS_LOST}\n",
            1,
        );
    let fake = Fake::with_yaml(&yaml);
    let nvml = fake.nvml();
    assert_eq!(nvml.device_count().unwrap(), 4);
    assert!(nvml.device_by_index(0).unwrap().memory_info().is_ok());
    let one = nvml.device_by_index(1).unwrap();
    assert!(matches!(one.memory_info(), Err(NvmlError::Unknown)));
    assert_eq!(
        one.name().unwrap(),
        "Tesla T4",
        "only the named function fails"
    );
    assert!(matches!(nvml.device_by_index(2), Err(NvmlError::GpuLost)));
    assert!(nvml.device_by_index(3).is_ok());

    let injected_init = format!(
        "{}fail: {{nvmlInit: DRIVER_NOT_LOADED}}\n",
        std::fs::read_to_string(bundled_profile("t4-inference")).unwrap()
    );
    let fake = Fake::with_yaml(&injected_init);
    let last = LastError::open(&fake.lib);
    assert!(matches!(init(&fake), Err(NvmlError::DriverNotLoaded)));
    assert!(
        last.get().contains("failure injected by the profile"),
        "{}",
        last.get()
    );
}
