//! Helpers for tests (of this crate and others) that load the fake library
//! through nvml-wrapper: find the built `libnvidia_ml.so`, and install a
//! private copy of it next to a `mock-nvml.env` that names the profile (and
//! state file). Each copy is a separate library instance with its own global
//! state, so tests using different machines can run in parallel in one
//! process without touching environment variables.

use std::path::{Path, PathBuf};

use crate::config::{self, Config};
use crate::error::Error;

/// File name of the built library.
pub const CDYLIB_NAME: &str = "libnvidia_ml.so";
/// File name of an installed copy (the real library's soname).
pub const INSTALLED_NAME: &str = "libnvidia-ml.so.1";

/// The path of a profile shipped in `hack/mock-nvml/profiles`, e.g.
/// `bundled_profile("dgx-a100")`.
pub fn bundled_profile(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("profiles")
        .join(format!("{name}.yaml"))
}

/// The names of the shipped profiles.
pub const BUNDLED_PROFILES: &[&str] = &[
    "dgx-h100",
    "dgx-a100",
    "pcie-a100-bridged",
    "t4-inference",
    "mixed",
    "gb200-nvl",
];

/// Finds the built library from the running test executable: cargo puts
/// test binaries in `target/<profile>/deps/` and builds the cdylib of a
/// (dev-)dependency as `target/<profile>/deps/libnvidia_ml.so`
/// (`cargo build -p mock-nvml` also puts it in `target/<profile>/`). The most
/// recently built candidate wins.
pub fn cdylib_path() -> Result<PathBuf, Error> {
    let exe = std::env::current_exe().map_err(|e| Error::io("locate", "the test executable", e))?;
    let mut searched = Vec::new();
    let mut dirs = Vec::new();
    if let Some(dir) = exe.parent() {
        dirs.push(dir.to_path_buf());
        if dir.file_name().is_some_and(|n| n == "deps") {
            if let Some(up) = dir.parent() {
                dirs.push(up.to_path_buf());
            }
        } else {
            dirs.push(dir.join("deps"));
        }
    }
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for dir in dirs {
        let candidate = dir.join(CDYLIB_NAME);
        if let Ok(modified) = std::fs::metadata(&candidate).and_then(|m| m.modified())
            && best.as_ref().is_none_or(|(t, _)| modified > *t)
        {
            best = Some((modified, candidate.clone()));
        }
        searched.push(candidate);
    }
    best.map(|(_, p)| p)
        .ok_or(Error::CdylibNotFound { searched })
}

/// What an installed copy keeps besides its profile: the state file, and
/// the directories standing for `/proc` (MIG capability files) and `/`
/// (stand-in capability nodes under `dev/nvidia-caps/`). All optional.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstallOptions {
    /// `MOCK_NVML_STATE`.
    pub state: Option<PathBuf>,
    /// `MOCK_NVML_PROC_ROOT`.
    pub proc_root: Option<PathBuf>,
    /// `MOCK_NVML_DEV_ROOT`.
    pub dev_root: Option<PathBuf>,
    /// `MOCK_NVML_CONTROL`.
    pub control: Option<PathBuf>,
}

/// Installs a private copy of the library in `dir` (as
/// `libnvidia-ml.so.1`) with a `mock-nvml.env` naming `profile` and, if
/// given, `state`. Returns the path to pass to
/// `Nvml::builder().lib_path(..)`.
pub fn install(dir: &Path, profile: &Path, state: Option<&Path>) -> Result<PathBuf, Error> {
    install_with(
        dir,
        profile,
        &InstallOptions {
            state: state.map(Path::to_path_buf),
            ..InstallOptions::default()
        },
    )
}

/// Like [`install`], with every option of the sidecar.
pub fn install_with(
    dir: &Path,
    profile: &Path,
    options: &InstallOptions,
) -> Result<PathBuf, Error> {
    let source = cdylib_path()?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    let target = dir.join(INSTALLED_NAME);
    // Copy then rename, so a copy that is already loaded is never
    // overwritten in place.
    let tmp = dir.join(format!(".{INSTALLED_NAME}.tmp"));
    std::fs::copy(&source, &tmp).map_err(|e| Error::io("copy the library to", &tmp, e))?;
    std::fs::rename(&tmp, &target).map_err(|e| Error::io("install the library as", &target, e))?;
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let config = Config {
        profile: absolute(profile),
        state: options.state.as_deref().map(absolute),
        proc_root: options.proc_root.as_deref().map(absolute),
        dev_root: options.dev_root.as_deref().map(absolute),
        control: options.control.as_deref().map(absolute),
    };
    let sidecar = dir.join(config::SIDECAR);
    std::fs::write(&sidecar, config::sidecar_text(&config))
        .map_err(|e| Error::io("write", &sidecar, e))?;
    Ok(target)
}

/// Like [`install`], for a profile given as YAML text (written to
/// `dir/profile.yaml`).
pub fn install_yaml(dir: &Path, yaml: &str, state: Option<&Path>) -> Result<PathBuf, Error> {
    install_yaml_with(
        dir,
        yaml,
        &InstallOptions {
            state: state.map(Path::to_path_buf),
            ..InstallOptions::default()
        },
    )
}

/// Like [`install_with`], for a profile given as YAML text (written to
/// `dir/profile.yaml`).
pub fn install_yaml_with(
    dir: &Path,
    yaml: &str,
    options: &InstallOptions,
) -> Result<PathBuf, Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    let profile = dir.join("profile.yaml");
    std::fs::write(&profile, yaml).map_err(|e| Error::io("write", &profile, e))?;
    install_with(dir, &profile, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_profiles_exist() {
        for name in BUNDLED_PROFILES {
            assert!(bundled_profile(name).is_file(), "{name}");
        }
    }
}
