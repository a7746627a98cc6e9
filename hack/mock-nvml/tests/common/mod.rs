//! Shared by the integration tests: each test installs a private copy of the
//! built library (with its own machine) in a temporary directory and loads
//! it through nvml-wrapper, so tests run in parallel without sharing NVML's
//! global state.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use nvml_wrapper::Nvml;
use nvidia_ml::fixture;
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

    /// Initialises NVML through nvml-wrapper, as the driver does.
    pub fn nvml(&self) -> Nvml {
        Nvml::builder()
            .lib_path(self.lib.as_os_str())
            .init()
            .unwrap_or_else(|e| panic!("init of {}: {e}", self.lib.display()))
    }
}
