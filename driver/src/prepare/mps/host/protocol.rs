//! The host's messages, one JSON line each way per connection: the
//! plugin's [`StartRequest`] and the host's [`Reply`], and the checks a
//! request passes before anything runs.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::MAX_TIMEOUT;
use crate::prepare::mps::{CONTROL_PROGRAM, procs};

/// Largest request or reply read.
pub(super) const MAX_MESSAGE: u64 = 64 * 1024;
/// The variables a request may set: those the plugin sets on a daemon.
const ALLOWED_ENV: [&str; 7] = [
    "PATH",
    "LD_LIBRARY_PATH",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_VISIBLE_DEVICES",
    procs::DAEMON_MARKER_ENV,
    procs::OWNER_ENV,
];

/// A daemon's private mounts: its `shm/` on `/dev/shm` and its `pipe/` on
/// [`crate::prepare::mps::CONTAINER_PIPE_DIR`], set up by the host's own launcher.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrivateMount {
    /// The daemon's shm directory.
    pub shm: PathBuf,
    /// The daemon's pipe directory.
    pub pipe: PathBuf,
}

/// What the plugin asks the host to run: `<program> -d`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StartRequest {
    /// The control program (`<driver-root>/usr/bin/nvidia-cuda-mps-control`,
    /// the same path in both pods).
    pub program: PathBuf,
    /// Through the launcher, in a mount namespace of the daemon's own;
    /// absent: the host's `/dev/shm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_mount: Option<PrivateMount>,
    /// The whole environment (nothing of the host's own is passed on).
    pub env: BTreeMap<String, String>,
    /// Where `-d`'s stdout and stderr go (created or truncated).
    pub output: PathBuf,
    /// How long `-d` may run before it is killed, in milliseconds.
    pub timeout_ms: u64,
    /// Start a multi-user server (`-d -M`, `mpsConfig.multiUser`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub multi_user: bool,
}

/// How a started `-d` ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub enum Outcome {
    /// It ran and ended.
    Exited {
        /// Its exit code, if it exited.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<i32>,
        /// The signal that ended it, if one did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
    },
    /// It ran past the timeout and was killed.
    TimedOut,
    /// The request was refused or the program could not be started.
    Failed {
        /// Why.
        error: String,
    },
}

impl Outcome {
    /// Whether `-d` exited with status 0.
    pub fn success(&self) -> bool {
        matches!(
            self,
            Self::Exited {
                code: Some(0),
                signal: None
            }
        )
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exited {
                code: Some(code), ..
            } => write!(f, "exit status: {code}"),
            Self::Exited {
                signal: Some(signal),
                ..
            } => write!(f, "killed by signal {signal}"),
            Self::Exited { .. } => f.write_str("ended"),
            Self::TimedOut => f.write_str("did not return in time and was killed"),
            Self::Failed { error } => write!(f, "refused: {error}"),
        }
    }
}

/// The host's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Reply {
    /// The host's PID namespace (`/proc/self/ns/pid`'s link, `pid:[N]`).
    pub pid_namespace: String,
    /// How `-d` ended.
    pub outcome: Outcome,
}

fn absolute_without_nul(what: &str, path: &Path) -> Result<(), String> {
    if !path.is_absolute() {
        return Err(format!("{what} {} is not an absolute path", path.display()));
    }
    if path.as_os_str().as_bytes().contains(&0) {
        return Err(format!("{what} {} contains a NUL byte", path.display()));
    }
    Ok(())
}

impl StartRequest {
    /// Checks the request before anything runs; `driver_root` is where
    /// the host sees the driver, whose control program alone it runs.
    pub fn check(&self, driver_root: &Path) -> Result<(), String> {
        absolute_without_nul("program", &self.program)?;
        let control = driver_root.join(CONTROL_PROGRAM);
        if self.program != control {
            return Err(format!(
                "program {} is not {}, the driver root's MPS control program",
                self.program.display(),
                control.display()
            ));
        }
        if let Some(m) = &self.private_mount {
            absolute_without_nul("shm directory", &m.shm)?;
            absolute_without_nul("pipe directory", &m.pipe)?;
        }
        absolute_without_nul("output file", &self.output)?;
        for (key, value) in &self.env {
            if !ALLOWED_ENV.contains(&key.as_str()) {
                return Err(format!(
                    "environment variable {key:?} is not one a daemon gets (allowed: {})",
                    ALLOWED_ENV.join(", ")
                ));
            }
            if value.contains('\0') {
                return Err(format!("environment variable {key} contains a NUL byte"));
            }
        }
        let max = u64::try_from(MAX_TIMEOUT.as_millis()).unwrap_or(u64::MAX);
        if self.timeout_ms == 0 || self.timeout_ms > max {
            return Err(format!(
                "timeoutMs {} is outside 1..={max}",
                self.timeout_ms
            ));
        }
        Ok(())
    }

    /// How long `-d` may run.
    pub(super) fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

/// This process's PID namespace, as `/proc/self/ns/pid` names it (read
/// once: a process never changes it).
pub fn pid_namespace() -> io::Result<String> {
    static NAMESPACE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if let Some(ns) = NAMESPACE.get() {
        return Ok(ns.clone());
    }
    let ns = fs::read_link("/proc/self/ns/pid")?
        .to_string_lossy()
        .into_owned();
    Ok(NAMESPACE.get_or_init(|| ns).clone())
}
