//! Discovery of the NVIDIA driver's user-space files under the driver root,
//! for the claim-level mounts and hooks of a CDI spec.
//!
//! Libraries are found by soname prefix (`libcuda.so.*`) in the usual lib
//! directories; every match (the versioned file and its soname links alike)
//! is mounted at its own path in the container, from the real file it
//! resolves to, so `libcuda.so.1` exists in the container even without the
//! ldcache hook. `libcuda` and `libnvidia-ml` are required; the rest, the
//! binaries, the GSP firmware and `nvidia-cdi-hook` are optional.
//!
//! Symlinks are resolved inside the root, as the kernel does for a process
//! whose root it is: absolute targets are relative to the driver root, and
//! `..` at the root stays there, so nothing outside the root is ever named
//! (with a driver root of `/`, exactly what the host itself resolves).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

use super::{CdiError, HostRoot};

/// Library directories searched, relative to the driver root, in order.
pub const LIB_DIRS: &[&str] = &[
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib64",
    "lib",
];
/// Libraries without which CUDA cannot work.
pub const REQUIRED_LIBS: &[&str] = &["libcuda.so", "libnvidia-ml.so"];
/// Libraries mounted when present.
pub const OPTIONAL_LIBS: &[&str] = &[
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libcudadebugger.so",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
    "libnvidia-opencl.so",
];
/// Binary directories searched, relative to the driver root, in order.
pub const BIN_DIRS: &[&str] = &["usr/bin", "usr/sbin", "bin", "sbin"];
/// Binaries mounted when present.
pub const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];
/// Where the CDI hook binary is looked for, relative to the driver root.
pub const CDI_HOOK: &str = "usr/bin/nvidia-cdi-hook";
/// Most symlinks followed resolving one path (as Linux' `MAXSYMLINKS`).
const MAX_SYMLINKS: usize = 40;

/// What a driver file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverFileKind {
    /// A shared library.
    Library,
    /// An executable.
    Binary,
    /// GSP firmware.
    Firmware,
}

/// One file to bind-mount into containers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverFile {
    /// What it is.
    pub kind: DriverFileKind,
    /// Absolute path in the container (the path it was found at).
    pub container_path: String,
    /// Host path of the real file it resolves to.
    pub host_path: String,
}

/// The driver's user-space files found under a driver root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverFiles {
    /// Files to mount, libraries first, in discovery order.
    pub files: Vec<DriverFile>,
    /// Host path of `nvidia-cdi-hook`, when the driver root has one.
    pub cdi_hook: Option<String>,
    /// The driver version read from the versioned `libcuda.so.<version>`.
    pub version: Option<String>,
}

impl DriverFiles {
    /// The container directories holding mounted libraries, in first-seen order.
    pub fn library_dirs(&self) -> Vec<String> {
        let mut dirs: Vec<String> = Vec::new();
        for f in self
            .files
            .iter()
            .filter(|f| f.kind == DriverFileKind::Library)
        {
            if let Some(dir) = Path::new(&f.container_path).parent() {
                let dir = dir.to_string_lossy().into_owned();
                if !dirs.contains(&dir) {
                    dirs.push(dir);
                }
            }
        }
        dirs
    }

    /// The mounted file whose container path has this exact file name.
    pub fn find(&self, file_name: &str) -> Option<&DriverFile> {
        self.files
            .iter()
            .find(|f| Path::new(&f.container_path).file_name() == Some(file_name.as_ref()))
    }
}

/// Resolves `rel` (relative to `root`) with every symlink followed inside
/// `root` (`..` at the root stays at the root); returns the resolved
/// root-relative path. Components that do not exist are kept as they are.
pub fn resolve_in_root(root: &Path, rel: &Path) -> Result<PathBuf, CdiError> {
    let mut pending: Vec<OsString> = Vec::new();
    push_components(&mut pending, rel);
    let mut done = PathBuf::new();
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            // At the root, `..` is the root itself.
            done.pop();
            continue;
        }
        let candidate = done.join(&part);
        let local = root.join(&candidate);
        match fs::symlink_metadata(&local) {
            Ok(meta) if meta.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_SYMLINKS {
                    return Err(CdiError::SymlinkLoop {
                        path: root.join(rel),
                    });
                }
                let target =
                    fs::read_link(&local).map_err(|e| CdiError::io("read link", &local, e))?;
                if target.is_absolute() {
                    done = PathBuf::new();
                }
                push_components(&mut pending, &target);
            }
            Ok(_) => done = candidate,
            Err(e) if e.kind() == ErrorKind::NotFound => done = candidate,
            Err(e) => return Err(CdiError::io("stat", &local, e)),
        }
    }
    Ok(done)
}

/// Pushes the components of `path` so that the first one is popped first;
/// `.` and the root are dropped, `..` is kept for the resolver.
fn push_components(stack: &mut Vec<OsString>, path: &Path) {
    let parts: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    stack.extend(parts.into_iter().rev());
}

/// The existing directories among `dirs`, resolved, without duplicates.
fn resolved_dirs(root: &Path, dirs: &[&str]) -> Result<Vec<PathBuf>, CdiError> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for dir in dirs {
        let resolved = resolve_in_root(root, Path::new(dir))?;
        if root.join(&resolved).is_dir() && seen.insert(resolved.clone()) {
            out.push(resolved);
        }
    }
    Ok(out)
}

/// Sorted file names in a directory of the root.
fn names_in(root: &Path, dir: &Path) -> Result<Vec<String>, CdiError> {
    let local = root.join(dir);
    let mut names = Vec::new();
    for entry in fs::read_dir(&local).map_err(|e| CdiError::io("read dir", &local, e))? {
        let entry = entry.map_err(|e| CdiError::io("read dir", &local, e))?;
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// `rel` resolved to a regular file inside the root, or `None` when it
/// resolves to nothing or to something else.
fn regular_file(root: &Path, rel: &Path) -> Result<Option<PathBuf>, CdiError> {
    let real = resolve_in_root(root, rel)?;
    match fs::metadata(root.join(&real)) {
        Ok(meta) if meta.is_file() => Ok(Some(real)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CdiError::io("stat", &root.join(&real), e)),
    }
}

fn container_path(rel: &Path) -> String {
    Path::new("/").join(rel).to_string_lossy().into_owned()
}

/// Finds the driver's user-space files under `root`.
pub fn discover(root: &HostRoot) -> Result<DriverFiles, CdiError> {
    let base = root.path.as_path();
    let mut out = DriverFiles::default();
    let lib_dirs = resolved_dirs(base, LIB_DIRS)?;
    let mut listings = Vec::with_capacity(lib_dirs.len());
    for dir in &lib_dirs {
        listings.push((dir, names_in(base, dir)?));
    }

    let required = REQUIRED_LIBS.iter().map(|l| (l, true));
    let optional = OPTIONAL_LIBS.iter().map(|l| (l, false));
    for (lib, is_required) in required.chain(optional) {
        let prefix = format!("{lib}.");
        let mut found = false;
        for (dir, names) in &listings {
            for name in names
                .iter()
                .filter(|n| n.len() > prefix.len() && n.starts_with(&prefix))
            {
                let rel = dir.join(name);
                let Some(real) = regular_file(base, &rel)? else {
                    tracing::debug!(path = %rel.display(), "skipping dangling driver library link");
                    continue;
                };
                if *lib == "libcuda.so" && out.version.is_none() {
                    out.version = real
                        .file_name()
                        .and_then(|n| n.to_str())
                        .and_then(|n| n.strip_prefix(&prefix))
                        .filter(|v| v.contains('.'))
                        .map(str::to_owned);
                }
                out.files.push(DriverFile {
                    kind: DriverFileKind::Library,
                    container_path: container_path(&rel),
                    host_path: root.host_path(&real),
                });
                found = true;
            }
        }
        if is_required && !found {
            return Err(CdiError::RequiredLibraryMissing {
                pattern: format!("{lib}.*"),
                root: root.path.clone(),
                searched: LIB_DIRS.join(", "),
            });
        }
    }

    let bin_dirs = resolved_dirs(base, BIN_DIRS)?;
    for bin in BINARIES {
        for dir in &bin_dirs {
            let rel = dir.join(bin);
            if let Some(real) = regular_file(base, &rel)? {
                out.files.push(DriverFile {
                    kind: DriverFileKind::Binary,
                    container_path: container_path(&rel),
                    host_path: root.host_path(&real),
                });
                break;
            }
        }
    }

    if let Some(version) = out.version.clone() {
        let fw = resolve_in_root(base, &Path::new("lib/firmware/nvidia").join(&version))?;
        if base.join(&fw).is_dir() {
            for name in names_in(base, &fw)? {
                if !(name.starts_with("gsp")
                    && Path::new(&name).extension() == Some("bin".as_ref()))
                {
                    continue;
                }
                let rel = fw.join(&name);
                if let Some(real) = regular_file(base, &rel)? {
                    out.files.push(DriverFile {
                        kind: DriverFileKind::Firmware,
                        container_path: container_path(&rel),
                        host_path: root.host_path(&real),
                    });
                }
            }
        }
    }

    if let Some(real) = regular_file(base, Path::new(CDI_HOOK))? {
        out.cdi_hook = Some(root.host_path(&real));
    }
    tracing::debug!(
        root = %root.path.display(),
        files = out.files.len(),
        version = out.version.as_deref().unwrap_or("unknown"),
        hook = out.cdi_hook.is_some(),
        "discovered driver files"
    );
    Ok(out)
}

#[cfg(test)]
mod tests;
