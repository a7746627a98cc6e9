//! The errors of the fake library's Rust side: configuration, profiles, the
//! state file, the sysfs helper and the test fixture. `nvmlInit` turns them
//! into a return code and keeps the message for `mockNvmlLastError`.

use std::path::PathBuf;

/// Everything that can go wrong outside an NVML call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Neither the environment nor a sidecar file names a machine profile.
    #[error(
        "no machine profile configured: set MOCK_NVML_PROFILE to a profile YAML file, \
         or put a mock-nvml.env file next to the library"
    )]
    NotConfigured,
    /// A file could not be read, written or created.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done ("read profile", "write state file", ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The profile is not YAML or does not match the schema.
    #[error("profile {origin}: {message}")]
    ProfileSyntax {
        /// The file (or `<inline>`).
        origin: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// The profile parses but describes an impossible machine.
    #[error("profile {origin}: {message}")]
    ProfileInvalid {
        /// The file (or `<inline>`).
        origin: String,
        /// What is wrong, and where (`gpus[2] (GPU-...): ...`).
        message: String,
    },
    /// The state file is corrupt or does not fit the profile.
    #[error("state file {path}: {message}")]
    State {
        /// The state file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A GPU's MIG capability files cannot be kept (see `caps`).
    #[error("MIG capability files of GPU {gpu}: {message}")]
    Caps {
        /// The GPU's UUID.
        gpu: String,
        /// What is wrong.
        message: String,
    },
    /// The `mock-nvml.env` sidecar is malformed.
    #[error("config {path}: {message}")]
    Config {
        /// The sidecar file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The built fake library could not be found (test fixture).
    #[error(
        "cannot find the built fake NVML library (looked for {searched:?}); \
         build it with `cargo build -p mock-nvml` or depend on mock-nvml"
    )]
    CdylibNotFound {
        /// The paths looked at.
        searched: Vec<PathBuf>,
    },
}

impl Error {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
