//! Shared by the integration tests: each test installs a private copy of the
//! built library (with its own machine) in a temporary directory and loads
//! it through nvml-wrapper, so tests run in parallel without sharing NVML's
//! global state.
#![allow(dead_code, unsafe_code)]

use std::path::{Path, PathBuf};

use nvidia_ml::fixture;
use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus};
use tempfile::TempDir;

/// A private library copy; the directory lives as long as the value.
pub struct Fake {
    pub dir: TempDir,
    pub lib: PathBuf,
}

impl Fake {
    /// A copy configured with a bundled profile.
    pub fn bundled(name: &str) -> Fake {
        Fake::with_profile(&fixture::bundled_profile(name), None)
    }

    /// A copy configured with a profile file and optional state file.
    pub fn with_profile(profile: &Path, state: Option<&Path>) -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let lib = fixture::install(dir.path(), profile, state).unwrap();
        Fake { dir, lib }
    }

    /// A copy configured with a profile given as YAML.
    pub fn with_yaml(yaml: &str) -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let lib = fixture::install_yaml(dir.path(), yaml, None).unwrap();
        Fake { dir, lib }
    }

    /// A copy configured with a bundled profile that follows a control
    /// file holding `commands` before init; returns the file's path too.
    pub fn with_control(name: &str, commands: &str) -> (Fake, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("control");
        std::fs::write(&control, commands).unwrap();
        let lib = fixture::install_with(
            &dir.path().join("lib"),
            &fixture::bundled_profile(name),
            &fixture::InstallOptions {
                control: Some(control.clone()),
                ..Default::default()
            },
        )
        .unwrap();
        (Fake { dir, lib }, control)
    }

    /// Initialises NVML through nvml-wrapper, as the driver does.
    pub fn nvml(&self) -> Nvml {
        Nvml::builder()
            .lib_path(self.lib.as_os_str())
            .init()
            .unwrap_or_else(|e| panic!("init of {}: {e}", self.lib.display()))
    }
}

/// The raw handle of GPU `index`.
pub fn gpu(nvml: &Nvml, index: u32) -> nvml_wrapper_sys::bindings::nvmlDevice_t {
    // SAFETY: only the opaque handle value is taken.
    unsafe { nvml.device_by_index(index).unwrap().handle() }
}

/// Runs one `#[ignore]`d test of the current test binary in a child
/// process, with a clean NVML environment plus `envs`. The child sees
/// `MOCK_NVML_CHILD=1`.
pub fn run_child(test: &str, envs: &[(&str, &std::ffi::OsStr)]) -> std::process::Output {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env_remove("MOCK_NVML_PROFILE")
        .env_remove("MOCK_NVML_STATE")
        .env_remove("MOCK_NVML_PROC_ROOT")
        .env_remove("MOCK_NVML_DEV_ROOT")
        .env_remove("MOCK_NVML_CONTROL")
        .env("MOCK_NVML_CHILD", "1")
        .envs(envs.iter().copied())
        .output()
        .unwrap()
}

/// Whether this process is a child started by [`run_child`]; child tests
/// return at once otherwise (they are meaningless on their own).
pub fn is_child() -> bool {
    std::env::var_os("MOCK_NVML_CHILD").is_some()
}

/// nvml-wrapper on the shared build of the library, configured by the
/// environment (for child processes).
pub fn nvml_from_env() -> Result<Nvml, nvml_wrapper::error::NvmlError> {
    let lib = fixture::cdylib_path().unwrap();
    Nvml::builder().lib_path(lib.as_os_str()).init()
}

/// Asserts a child process succeeded, showing its output otherwise.
#[track_caller]
pub fn assert_success(output: &std::process::Output) {
    assert!(
        output.status.success(),
        "child failed: {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The library's `mockNvmlLastError`, through a handle that keeps the
/// library loaded (and its state alive) for as long as it lives.
pub struct LastError(libloading::Library);

impl LastError {
    pub fn open(lib: &Path) -> LastError {
        // SAFETY: loading the fake library runs no initialisers with
        // preconditions.
        LastError(unsafe { libloading::Library::new(lib) }.unwrap())
    }

    pub fn get(&self) -> String {
        // SAFETY: the symbol has this signature (see the library's ffi
        // module) and returns a NUL-terminated string valid for the process.
        unsafe {
            let f: libloading::Symbol<'_, unsafe extern "C" fn() -> *const std::ffi::c_char> =
                self.0.get(b"mockNvmlLastError\0").unwrap();
            std::ffi::CStr::from_ptr(f()).to_string_lossy().into_owned()
        }
    }

    pub fn library(&self) -> &libloading::Library {
        &self.0
    }
}

/// `nvmlDeviceGetNvLinkRemoteDeviceType` of `d`'s `link`, called directly
/// (nvml-wrapper has no call for it); the output starts as 77, a value no
/// link type has, so a call that writes nothing is seen.
pub fn remote_device_type(nvml: &Nvml, d: &Device<'_>, link: u32) -> u32 {
    let sym = nvml
        .lib()
        .nvmlDeviceGetNvLinkRemoteDeviceType
        .as_ref()
        .unwrap();
    let mut kind = 77;
    // SAFETY: a device handle from this `nvml` and a valid output pointer.
    let rc = unsafe { sym(d.handle(), link, &raw mut kind) };
    assert_eq!(rc, 0);
    kind
}

/// The NVLink P2P status of `a` towards `b`.
pub fn nvlink_p2p(a: &Device<'_>, b: &Device<'_>) -> P2pStatus {
    a.p2p_status(b, P2pCapabilitiesIndex::NvLink).unwrap()
}

/// Calls an NVML function of `nvml`'s library by name, raw, so that a test
/// can pass exactly what it means to: handles of this library, deliberately
/// bogus values (which the library rejects without dereferencing them),
/// pointers to live locals of the right types, or null.
#[allow(unused_macros)]
macro_rules! call {
    ($nvml:expr, $f:ident($($arg:expr),* $(,)?)) => {{
        let f = $nvml.lib().$f.as_ref().expect(stringify!($f));
        // SAFETY: the caller's arguments are of the kinds listed above,
        // which the library's C contract accepts or refuses without
        // touching memory it does not own.
        unsafe { f($($arg),*) }
    }};
}
