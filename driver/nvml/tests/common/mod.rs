//! Shared helpers of the integration tests: a private copy of the project's
//! fake `libnvidia-ml.so` (built by cargo as a dev-dependency) configured by a
//! `mock-nvml.env` sidecar, so every test loads its own library instance with
//! its own machine profile and state, independent of the other tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use gpu_nvml::NvmlBackend;

/// The fake library cargo built next to the test binaries.
pub fn built_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("test binary directory");
    // A dev-dependency's cdylib lands in target/<profile>/deps; a
    // `cargo build -p mock-nvml` puts it one level up.
    for candidate in [deps.join("libnvidia_ml.so"), deps.join("../libnvidia_ml.so")] {
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!("the fake libnvidia_ml.so was not built next to {}", deps.display());
}

/// A profile shipped in `hack/mock-nvml/profiles`.
pub fn profile(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/mock-nvml/profiles").join(format!("{name}.yaml"))
}

/// A private copy of the fake library configured for one machine.
pub struct Machine {
    /// Holds the library copy, its sidecar, the state file and any profile
    /// written by the test.
    pub dir: tempfile::TempDir,
    /// The library copy to open.
    pub library: PathBuf,
    /// The state file (MIG devices and modes persist there across inits).
    pub state: PathBuf,
}

impl Machine {
    /// A machine running `profile` (a file path).
    pub fn new(profile: &Path) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let library = dir.path().join("libnvidia-ml.so.1");
        std::fs::copy(built_library(), &library).expect("copy the fake library");
        let state = dir.path().join("state.json");
        let profile = std::fs::canonicalize(profile).expect("profile exists");
        std::fs::write(
            dir.path().join("mock-nvml.env"),
            format!("MOCK_NVML_PROFILE={}\nMOCK_NVML_STATE={}\n", profile.display(), state.display()),
        )
        .expect("write sidecar");
        Self { dir, library, state }
    }

    /// A machine running one of the shipped profiles.
    pub fn shipped(name: &str) -> Self {
        Self::new(&profile(name))
    }

    /// A machine running a profile given as YAML text.
    pub fn from_yaml(yaml: &str) -> Self {
        let file = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(file.path(), yaml).expect("write profile");
        let machine = Self::new(file.path());
        // Keep the profile with the machine.
        let kept = machine.dir.path().join("profile.yaml");
        std::fs::copy(file.path(), &kept).expect("keep profile");
        std::fs::write(
            machine.dir.path().join("mock-nvml.env"),
            format!("MOCK_NVML_PROFILE={}\nMOCK_NVML_STATE={}\n", kept.display(), machine.state.display()),
        )
        .expect("write sidecar");
        machine
    }

    /// Opens the production backend on this machine.
    pub fn open(&self) -> NvmlBackend {
        NvmlBackend::open(Some(&self.library)).unwrap_or_else(|e| panic!("open the fake NVML: {e}"))
    }
}
