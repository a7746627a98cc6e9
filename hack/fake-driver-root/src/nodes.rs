//! Stand-in dev and proc roots: the NVIDIA device nodes under `<dir>/dev`
//! and the `driver/nvidia` tree of procfs.
//!
//! When running as root the nodes are real character devices with
//! `/dev/null`'s major and minor (made with the `mknod` program), so a
//! container runtime that checks node types accepts them and a container
//! opening one gets `/dev/null`'s harmless behaviour; otherwise, or where
//! `mknod` is refused (no `CAP_MKNOD`), they are empty regular files.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Error, io_err};

/// What the stand-in nodes of a dev root are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// Character devices with `/dev/null`'s numbers.
    CharDevice {
        /// Major number.
        major: u32,
        /// Minor number.
        minor: u32,
    },
    /// Empty regular files, with the reason char devices were not made.
    RegularFile {
        /// Why (not root, `mknod` refused...).
        reason: String,
    },
}

/// A stand-in dev root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevRoot {
    /// The root (`--dev-root`): nodes are under `<path>/dev`.
    pub path: PathBuf,
    /// What the nodes are.
    pub kind: NodeKind,
    /// Every node created, absolute paths.
    pub nodes: Vec<PathBuf>,
}

pub(crate) fn dev_null_numbers() -> Result<(u32, u32), Error> {
    let meta = fs::metadata("/dev/null").map_err(|e| io_err("stat", Path::new("/dev/null"), e))?;
    if !meta.file_type().is_char_device() {
        return Err(Error::Node {
            path: "/dev/null".into(),
            reason: "is not a character device".into(),
        });
    }
    let rdev = meta.rdev();
    // glibc's gnu_dev_major / gnu_dev_minor encoding.
    let major = (((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0x0000_0fff)) as u32;
    let minor = (((rdev >> 12) & 0xffff_ff00) | (rdev & 0x0000_00ff)) as u32;
    Ok((major, minor))
}

pub(crate) fn mknod(path: &Path, major: u32, minor: u32) -> Result<(), String> {
    let out = Command::new("mknod")
        .arg("-m")
        .arg("666")
        .arg(path)
        .arg("c")
        .arg(major.to_string())
        .arg(minor.to_string())
        .output()
        .map_err(|e| format!("cannot run mknod: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "mknod {} failed ({}): {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Creates `<dir>/dev/nvidia<N>` for each minor, `nvidiactl`, `nvidia-uvm`,
/// `nvidia-uvm-tools` and the `nvidia-caps/` directory. Existing nodes are
/// replaced.
pub fn create_dev_root(dir: &Path, gpu_minors: &[u32]) -> Result<DevRoot, Error> {
    let dev = dir.join("dev");
    let caps = dev.join("nvidia-caps");
    fs::create_dir_all(&caps).map_err(|e| io_err("create dir", &caps, e))?;
    let mut names: Vec<String> = gpu_minors.iter().map(|m| format!("nvidia{m}")).collect();
    names.extend(["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"].map(String::from));
    names.sort();
    names.dedup();

    let mut kind = if rustix::process::geteuid().is_root() {
        let (major, minor) = dev_null_numbers()?;
        NodeKind::CharDevice { major, minor }
    } else {
        NodeKind::RegularFile {
            reason: "not running as root".into(),
        }
    };
    let mut nodes = Vec::with_capacity(names.len());
    for name in &names {
        let path = dev.join(name);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove", &path, e)),
        }
        if let NodeKind::CharDevice { major, minor } = kind
            && let Err(reason) = mknod(&path, major, minor)
        {
            // The first refusal decides for all nodes: no mixed roots.
            if !nodes.is_empty() {
                return Err(Error::Node { path, reason });
            }
            kind = NodeKind::RegularFile { reason };
        }
        if matches!(kind, NodeKind::RegularFile { .. }) {
            fs::write(&path, b"").map_err(|e| io_err("create", &path, e))?;
        }
        nodes.push(path);
    }
    Ok(DevRoot {
        path: dir.to_path_buf(),
        kind,
        nodes,
    })
}

/// Creates `<dir>/driver/nvidia/` as the kernel module shows it: `version`,
/// and `capabilities/` with the node-wide MIG `config` and `monitor`
/// capability files (`gpu<N>/mig/...` appear as MIG devices are created).
/// Returns `dir` (what `--proc-root` takes).
pub fn create_proc_root(dir: &Path) -> Result<PathBuf, Error> {
    create_proc_root_for(dir, crate::DEFAULT_DRIVER_VERSION)
}

/// [`create_proc_root`] for a given driver version.
pub fn create_proc_root_for(dir: &Path, driver_version: &str) -> Result<PathBuf, Error> {
    let nvidia = dir.join("driver/nvidia");
    let mig = nvidia.join("capabilities/mig");
    fs::create_dir_all(&mig).map_err(|e| io_err("create dir", &mig, e))?;
    let files = [
        (
            nvidia.join("version"),
            format!(
                "NVRM version: NVIDIA UNIX Open Kernel Module for {}  {driver_version}  (fake)\n\
                 GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
                std::env::consts::ARCH
            ),
        ),
        (
            mig.join("config"),
            "DeviceFileMinor: 1\nDeviceFileMode: 256\n".to_owned(),
        ),
        (
            mig.join("monitor"),
            "DeviceFileMinor: 2\nDeviceFileMode: 292\n".to_owned(),
        ),
    ];
    for (path, text) in files {
        fs::write(&path, text).map_err(|e| io_err("write", &path, e))?;
    }
    Ok(dir.to_path_buf())
}
