//! CDI (Container Device Interface) specs for prepared claims.
//!
//! For every prepared claim the plugin writes one transient spec file,
//! `<cdi-root>/<vendor>-<class>_<claimUID>.json`, and hands the kubelet the
//! fully qualified device ids `<vendor>/<class>=<claimUID>-<device>`. The
//! container runtime then injects what the spec lists: the GPU's device nodes,
//! the NVIDIA control nodes, the driver's user-space libraries and binaries
//! from the driver root, and the ldcache hook, so a container runs CUDA
//! without the NVIDIA container runtime.
//!
//! Submodules, one job each:
//! - [`spec`]: the CDI spec types (serde, JSON) and the lowest sufficient
//!   `cdiVersion` for the fields used ([`spec::min_version`]);
//! - [`names`]: kind, device-name and claim-UID validation, qualified ids;
//! - [`files`]: transient spec files: naming, atomic write, removal, listing;
//! - [`driver_root`]: discovery of the NVIDIA user-space files under the
//!   driver root (symlinks resolved inside the root, `..` at the root
//!   staying there);
//! - [`nodes`]: device nodes under the dev root, MIG capability minors
//!   from `<proc-root>/driver/nvidia/capabilities` and the `nvidia-caps`
//!   major from `<proc-root>/devices`;
//! - [`claim`]: the per-claim spec builder.
//!
//! Paths: every root has a side the plugin reads ([`HostRoot::path`]) and a
//! side the host sees ([`HostRoot::host`], which goes into the spec). They
//! differ when the plugin runs in a container with the host's driver root
//! mounted elsewhere; by default they are the same.

pub mod claim;
pub mod driver_root;
pub mod files;
pub mod names;
pub mod nodes;
pub mod spec;

use std::path::{Path, PathBuf};

pub use claim::{BuiltClaimSpec, ClaimSpec, claim_edits};
pub use driver_root::{DriverFile, DriverFileKind, DriverFiles};
pub use files::SpecDir;
pub use nodes::{ControlNodes, GpuNodes, MigNodes, NodeLocator};
pub use spec::{ContainerEdits, Device, DeviceNode, Hook, Mount, Spec, min_version};

/// The CDI vendor NVIDIA's driver uses: `k8s.` + the driver name.
pub const DEFAULT_VENDOR: &str = "k8s.gpu.nvidia.com";
/// The CDI class of per-claim specs (NVIDIA's driver uses `claim`).
pub const CLAIM_CLASS: &str = "claim";

/// Errors of CDI spec generation and spec files.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// A name (vendor, class, device name, claim UID) breaks the CDI or
    /// Kubernetes naming rules.
    #[error("invalid CDI {what} {value:?}: {reason}")]
    InvalidName {
        /// Which kind of name it is ("vendor", "class", "device name", ...).
        what: &'static str,
        /// The offending value (truncated when very long).
        value: String,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// A claim spec was built without any device (CDI needs at least one).
    #[error("CDI spec for claim {claim_uid} has no devices")]
    NoDevices {
        /// The claim the spec is for.
        claim_uid: String,
    },
    /// The same device was added twice to one claim spec.
    #[error("device {device:?} added twice to the CDI spec of claim {claim_uid}")]
    DuplicateDevice {
        /// The claim the spec is for.
        claim_uid: String,
        /// The repeated device name.
        device: String,
    },
    /// A library the driver cannot work without was not found in the driver root.
    #[error("required driver library {pattern} not found under {root} (searched {searched})")]
    RequiredLibraryMissing {
        /// The soname pattern, e.g. `libcuda.so.*`.
        pattern: String,
        /// The driver root searched (plugin side).
        root: PathBuf,
        /// The library directories searched, comma separated.
        searched: String,
    },
    /// Symlink resolution went in circles or too deep.
    #[error("too many levels of symlinks resolving {path}")]
    SymlinkLoop {
        /// The path being resolved (plugin side).
        path: PathBuf,
    },
    /// A device node that must exist is missing under the dev root.
    #[error("device node {path} not found")]
    DeviceNodeMissing {
        /// The missing node (plugin side).
        path: PathBuf,
    },
    /// A MIG capability file is missing or malformed.
    #[error("MIG capability file {path}: {reason}")]
    BadCapability {
        /// The `access` file read.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// A spec could not be serialised or parsed.
    #[error("CDI spec {path}: {source}")]
    Json {
        /// The spec file concerned.
        path: PathBuf,
        /// The serde error.
        source: serde_json::Error,
    },
    /// The CDI root cannot be written (read-only, full, no permission):
    /// every claim would fail, so the plugin refuses to start.
    #[error(
        "CDI root {root} is not writable ({source}); the plugin writes a CDI spec there for every claim it prepares: mount it read-write"
    )]
    NotWritable {
        /// The CDI root.
        root: PathBuf,
        /// The OS error of the probe write.
        source: std::io::Error,
    },
    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done ("write", "rename", "read dir", ...).
        op: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl CdiError {
    pub(crate) fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A directory tree as the plugin reads it and as the host sees it.
///
/// Files are found under [`path`](Self::path); the spec names them under
/// [`host`](Self::host) with the same relative path. Example: the plugin runs
/// in a container with the host's `/run/nvidia/driver` mounted at
/// `/driver-root`: `path = /driver-root`, `host = /run/nvidia/driver`, and
/// `/driver-root/usr/bin/nvidia-smi` becomes `/run/nvidia/driver/usr/bin/nvidia-smi`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRoot {
    /// Where the plugin reads the tree.
    pub path: PathBuf,
    /// Where the same tree is on the host (what container runtimes see).
    pub host: PathBuf,
}

impl HostRoot {
    /// A root read at the same path the host sees it at.
    pub fn same(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        Self {
            host: path.clone(),
            path,
        }
    }

    /// A root read at `path` and seen by the host at `host`.
    pub fn new(path: impl Into<PathBuf>, host: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            host: host.into(),
        }
    }

    /// The subtree `rel` (without leading `/`), on both sides.
    #[must_use]
    pub fn join(&self, rel: impl AsRef<Path>) -> Self {
        Self {
            path: self.path.join(rel.as_ref()),
            host: self.host.join(rel.as_ref()),
        }
    }

    /// The plugin-side path of a root-relative path (`rel` without leading `/`).
    pub fn local(&self, rel: &Path) -> PathBuf {
        self.path.join(rel)
    }

    /// The host-side path of a root-relative path, as a string for the spec.
    pub fn host_path(&self, rel: &Path) -> String {
        self.host.join(rel).to_string_lossy().into_owned()
    }
}
