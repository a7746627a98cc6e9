//! Where `nvmlInit` finds its machine: a `mock-nvml.env` file next to the
//! loaded library (so tests can run isolated copies of the library side by
//! side) or else the environment variables `MOCK_NVML_PROFILE`,
//! `MOCK_NVML_STATE`, `MOCK_NVML_PROC_ROOT`, `MOCK_NVML_DEV_ROOT` and
//! `MOCK_NVML_CONTROL`.

use std::path::{Path, PathBuf};

use crate::error::Error;

/// Environment variable naming the profile YAML file.
pub const PROFILE_ENV: &str = "MOCK_NVML_PROFILE";
/// Environment variable naming the state file (optional).
pub const STATE_ENV: &str = "MOCK_NVML_STATE";
/// Environment variable naming the directory that stands for `/proc`: MIG
/// capability files are kept under `<it>/driver/nvidia/capabilities/`
/// (optional).
pub const PROC_ROOT_ENV: &str = "MOCK_NVML_PROC_ROOT";
/// Environment variable naming the directory that stands for `/`: stand-in
/// capability nodes are kept in `<it>/dev/nvidia-caps/` (optional).
pub const DEV_ROOT_ENV: &str = "MOCK_NVML_DEV_ROOT";
/// Environment variable naming the control file or FIFO whose commands
/// change GPU health while the library runs (optional; see `control.rs`).
pub const CONTROL_ENV: &str = "MOCK_NVML_CONTROL";
/// Name of the sidecar file looked for next to the library.
pub const SIDECAR: &str = "mock-nvml.env";

/// The configuration of one `nvmlInit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The profile file.
    pub profile: PathBuf,
    /// The state file, if any.
    pub state: Option<PathBuf>,
    /// Where MIG capability files are kept, like the kernel's `/proc`
    /// (none: not kept).
    pub proc_root: Option<PathBuf>,
    /// Where stand-in capability nodes are kept, like `/` (none: not kept).
    pub dev_root: Option<PathBuf>,
    /// The control file or FIFO (none: no commands).
    pub control: Option<PathBuf>,
}

/// Resolves the configuration: the sidecar in `library_dir` wins over the
/// environment.
pub fn resolve(library_dir: Option<&Path>) -> Result<Config, Error> {
    if let Some(dir) = library_dir {
        let sidecar = dir.join(SIDECAR);
        match std::fs::read_to_string(&sidecar) {
            Ok(text) => return parse_sidecar(&text, &sidecar),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("read config", &sidecar, e)),
        }
    }
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    Ok(Config {
        profile: var(PROFILE_ENV).ok_or(Error::NotConfigured)?,
        state: var(STATE_ENV),
        proc_root: var(PROC_ROOT_ENV),
        dev_root: var(DEV_ROOT_ENV),
        control: var(CONTROL_ENV),
    })
}

/// Parses `KEY=VALUE` lines (`#` comments, blank lines allowed); relative
/// paths are relative to the sidecar's directory.
pub fn parse_sidecar(text: &str, path: &Path) -> Result<Config, Error> {
    let fail = |message: String| Error::Config {
        path: path.to_owned(),
        message,
    };
    let base = path.parent().unwrap_or(Path::new("."));
    let mut profile = None;
    let mut state = None;
    let mut proc_root = None;
    let mut dev_root = None;
    let mut control = None;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| fail(format!("line {}: expected KEY=VALUE", n + 1)))?;
        let (key, value) = (key.trim(), value.trim());
        if value.is_empty() {
            return Err(fail(format!("line {}: {key} has no value", n + 1)));
        }
        let slot = match key {
            PROFILE_ENV => &mut profile,
            STATE_ENV => &mut state,
            PROC_ROOT_ENV => &mut proc_root,
            DEV_ROOT_ENV => &mut dev_root,
            CONTROL_ENV => &mut control,
            _ => {
                return Err(fail(format!(
                    "line {}: unknown key {key:?} (expected {PROFILE_ENV}, {STATE_ENV}, \
                     {PROC_ROOT_ENV}, {DEV_ROOT_ENV} or {CONTROL_ENV})",
                    n + 1
                )));
            }
        };
        if slot.replace(base.join(value)).is_some() {
            return Err(fail(format!("line {}: {key} is set twice", n + 1)));
        }
    }
    Ok(Config {
        profile: profile.ok_or_else(|| fail(format!("{PROFILE_ENV} is not set")))?,
        state,
        proc_root,
        dev_root,
        control,
    })
}

/// The text of a sidecar for `config`.
pub fn sidecar_text(config: &Config) -> String {
    let mut text = format!(
        "# Written by nvidia_ml::fixture: configures this copy of the fake NVML library.\n\
         {PROFILE_ENV}={}\n",
        config.profile.display()
    );
    for (key, value) in [
        (STATE_ENV, &config.state),
        (PROC_ROOT_ENV, &config.proc_root),
        (DEV_ROOT_ENV, &config.dev_root),
        (CONTROL_ENV, &config.control),
    ] {
        if let Some(path) = value {
            text.push_str(key);
            text.push('=');
            text.push_str(&path.display().to_string());
            text.push('\n');
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecar_paths_are_relative_to_its_directory() {
        let cfg = parse_sidecar(
            "# comment\n\nMOCK_NVML_PROFILE = p.yaml\nMOCK_NVML_STATE=/abs/state.json\n",
            Path::new("/lib/dir/mock-nvml.env"),
        )
        .unwrap();
        assert_eq!(cfg.profile, Path::new("/lib/dir/p.yaml"));
        assert_eq!(cfg.state.as_deref(), Some(Path::new("/abs/state.json")));
        assert_eq!(cfg.proc_root, None);
        let cfg = parse_sidecar(
            "MOCK_NVML_PROFILE=p.yaml\nMOCK_NVML_PROC_ROOT=proc\nMOCK_NVML_DEV_ROOT=/dev-root\n",
            Path::new("/lib/dir/mock-nvml.env"),
        )
        .unwrap();
        assert_eq!(cfg.proc_root.as_deref(), Some(Path::new("/lib/dir/proc")));
        assert_eq!(cfg.dev_root.as_deref(), Some(Path::new("/dev-root")));
    }

    #[test]
    fn sidecar_text_round_trips() {
        let cfg = Config {
            profile: "/a/b.yaml".into(),
            state: Some("/a/s.json".into()),
            proc_root: None,
            dev_root: None,
            control: None,
        };
        let parsed = parse_sidecar(&sidecar_text(&cfg), Path::new("/x/mock-nvml.env")).unwrap();
        assert_eq!(parsed, cfg);
        let cfg = Config {
            proc_root: Some("/r/proc".into()),
            dev_root: Some("/r".into()),
            control: Some("/r/control".into()),
            ..cfg
        };
        let parsed = parse_sidecar(&sidecar_text(&cfg), Path::new("/x/mock-nvml.env")).unwrap();
        assert_eq!(parsed, cfg);
    }

    #[test]
    fn malformed_sidecars_are_rejected_with_the_line() {
        let path = Path::new("/lib/mock-nvml.env");
        for (text, expect) in [
            ("MOCK_NVML_PROFILE", "line 1: expected KEY=VALUE"),
            (
                "MOCK_NVML_PROFILE=",
                "line 1: MOCK_NVML_PROFILE has no value",
            ),
            ("X=1", "unknown key \"X\""),
            (
                "MOCK_NVML_PROFILE=a\nMOCK_NVML_PROFILE=b",
                "line 2: MOCK_NVML_PROFILE is set twice",
            ),
            ("MOCK_NVML_STATE=s", "MOCK_NVML_PROFILE is not set"),
            (
                "MOCK_NVML_PROFILE=a\nMOCK_NVML_DEV_ROOT=d\nMOCK_NVML_DEV_ROOT=e",
                "line 3: MOCK_NVML_DEV_ROOT is set twice",
            ),
            (
                "MOCK_NVML_PROC_ROOT=",
                "line 1: MOCK_NVML_PROC_ROOT has no value",
            ),
            ("", "MOCK_NVML_PROFILE is not set"),
        ] {
            let err = parse_sidecar(text, path).unwrap_err().to_string();
            assert!(err.contains(expect), "{text:?}: {err}");
            assert!(err.contains("/lib/mock-nvml.env"), "{err}");
        }
    }

    #[test]
    fn sidecar_in_the_library_directory_wins() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SIDECAR), "MOCK_NVML_PROFILE=here.yaml\n").unwrap();
        let cfg = resolve(Some(dir.path())).unwrap();
        assert_eq!(cfg.profile, dir.path().join("here.yaml"));
        assert_eq!(cfg.state, None);
    }
}
