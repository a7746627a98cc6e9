//! MIG capability files, kept as the NVIDIA kernel module keeps them, so
//! code that reads them (the plugin's CDI device nodes) runs against the
//! real layout:
//!
//! - `<proc-root>/driver/nvidia/capabilities/gpu<minor>/mig/gi<g>/access`
//!   for every GPU instance and `.../gi<g>/ci<c>/access` for every compute
//!   instance, each `DeviceFileMinor: <N>\nDeviceFileMode: 292\n`;
//! - a stand-in node `<dev-root>/dev/nvidia-caps/nvidia-cap<N>` for each
//!   (an empty read-only file: the real nodes are character devices that
//!   `nvidia-modprobe` creates).
//!
//! The minors follow the kernel's fixed table
//! (`/proc/driver/nvidia-caps/mig-minors`): `config` is 1, `monitor` 2, then
//! per GPU minor 15 GPU instances of 9 minors each (the GPU instance, then
//! its 8 compute instances): `gpu0/gi0/access` is 3, `gpu0/gi0/ci0/access`
//! 4, `gpu0/gi1/access` 12, `gpu1/gi0/access` 138.
//!
//! [`sync_gpu`] makes the files of one GPU match its instances: it creates
//! what is missing and removes what no longer exists (only inside that GPU's
//! directory and its range of minors).

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::profile::Gpu;

/// First minor of the per-GPU table.
const FIRST_GPU_MINOR: u32 = 3;
/// GPU instance ids per GPU in the table.
const GPU_INSTANCES: u32 = 15;
/// Compute instance ids per GPU instance in the table.
const COMPUTE_INSTANCES: u32 = 8;
/// Minors per GPU instance: its own and its compute instances'.
const PER_GPU_INSTANCE: u32 = 1 + COMPUTE_INSTANCES;
/// Minors per GPU.
const PER_GPU: u32 = GPU_INSTANCES * PER_GPU_INSTANCE;
/// `DeviceFileMode` of the capability files: 0444.
pub const DEVICE_FILE_MODE: u32 = 0o444;

/// The capability minor of GPU instance `gi` on the GPU with minor
/// `gpu_minor` (`None` past the kernel's table).
pub fn gi_minor(gpu_minor: u32, gi: u32) -> Option<u32> {
    (gi < GPU_INSTANCES).then(|| FIRST_GPU_MINOR + gpu_minor * PER_GPU + gi * PER_GPU_INSTANCE)
}

/// The capability minor of compute instance `ci` of GPU instance `gi`.
pub fn ci_minor(gpu_minor: u32, gi: u32, ci: u32) -> Option<u32> {
    if ci >= COMPUTE_INSTANCES {
        return None;
    }
    gi_minor(gpu_minor, gi).map(|m| m + 1 + ci)
}

/// The text of a capability `access` file.
pub fn access_text(minor: u32) -> String {
    format!("DeviceFileMinor: {minor}\nDeviceFileMode: {DEVICE_FILE_MODE}\n")
}

/// Where the files are kept; either root may be absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CapRoots {
    /// Stands for `/proc`.
    pub proc_root: Option<PathBuf>,
    /// Stands for `/`.
    pub dev_root: Option<PathBuf>,
}

impl CapRoots {
    /// Whether anything is kept at all.
    pub fn is_empty(&self) -> bool {
        self.proc_root.is_none() && self.dev_root.is_none()
    }

    /// `<proc-root>/driver/nvidia/capabilities/gpu<minor>/mig`.
    pub fn mig_dir(&self, gpu_minor: u32) -> Option<PathBuf> {
        self.proc_root
            .as_ref()
            .map(|root| root.join(format!("driver/nvidia/capabilities/gpu{gpu_minor}/mig")))
    }

    /// `<dev-root>/dev/nvidia-caps`.
    pub fn nodes_dir(&self) -> Option<PathBuf> {
        self.dev_root
            .as_ref()
            .map(|root| root.join("dev/nvidia-caps"))
    }
}

/// One capability of a GPU: a GPU instance or one of its compute instances.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Cap {
    gi: u32,
    ci: Option<u32>,
    minor: u32,
}

/// The capabilities the instances of `gpu` have.
fn wanted(gpu: &Gpu) -> Result<Vec<Cap>, String> {
    let mut caps = Vec::new();
    for gi in &gpu.mig.gpu_instances {
        let minor = gi_minor(gpu.minor, gi.id)
            .ok_or_else(|| format!("GPU instance id {} is past the capability table", gi.id))?;
        caps.push(Cap {
            gi: gi.id,
            ci: None,
            minor,
        });
        for ci in &gi.compute_instances {
            let minor = ci_minor(gpu.minor, gi.id, ci.id).ok_or_else(|| {
                format!(
                    "compute instance id {} of GPU instance {} is past the capability table",
                    ci.id, gi.id
                )
            })?;
            caps.push(Cap {
                gi: gi.id,
                ci: Some(ci.id),
                minor,
            });
        }
    }
    Ok(caps)
}

/// Makes the capability files and nodes of `gpu` match its instances.
pub fn sync_gpu(roots: &CapRoots, gpu: &Gpu) -> Result<(), Error> {
    if roots.is_empty() {
        return Ok(());
    }
    let caps = caps_of(gpu)?;
    if let Some(dir) = roots.mig_dir(gpu.minor) {
        sync_proc(&dir, &caps)?;
    }
    if let Some(dir) = roots.nodes_dir() {
        sync_nodes(&dir, gpu.minor, &caps)?;
    }
    Ok(())
}

/// Brings the files of a GPU from `before` to `after` by their difference
/// alone: what a change of a few instances costs a few file operations, not
/// a listing and rewrite of the GPU's whole tree (the fake answers every MIG
/// create and destroy with this, and a benchmark of the driver should not
/// measure the fake). The files must match `before`, as [`sync_gpu`] leaves
/// them; the result is the same as `sync_gpu(after)`.
pub fn sync_change(roots: &CapRoots, before: &Gpu, after: &Gpu) -> Result<(), Error> {
    if roots.is_empty() {
        return Ok(());
    }
    let old: BTreeSet<Cap> = caps_of(before)?.into_iter().collect();
    let new: BTreeSet<Cap> = caps_of(after)?.into_iter().collect();
    let mig_dir = roots.mig_dir(after.minor);
    let nodes_dir = roots.nodes_dir();
    for cap in old.difference(&new) {
        if let Some(dir) = &mig_dir {
            remove_dir(&cap_dir(dir, cap))?;
        }
        if let Some(dir) = &nodes_dir {
            remove_file(&node_path(dir, cap.minor))?;
        }
    }
    for cap in new.difference(&old) {
        if let Some(dir) = &mig_dir {
            write_access(&cap_dir(dir, cap), cap.minor)?;
        }
        if let Some(dir) = &nodes_dir {
            std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
            create_node(&node_path(dir, cap.minor))?;
        }
    }
    if new.is_empty()
        && let Some(dir) = &mig_dir
    {
        remove_empty_mig_dir(dir)?;
    }
    Ok(())
}

/// The capabilities of `gpu`'s instances, or why they do not fit the table.
fn caps_of(gpu: &Gpu) -> Result<Vec<Cap>, Error> {
    wanted(gpu).map_err(|message| Error::Caps {
        gpu: gpu.uuid.clone(),
        message,
    })
}

/// `<nodes-dir>/nvidia-cap<minor>`.
fn node_path(nodes_dir: &Path, minor: u32) -> PathBuf {
    nodes_dir.join(format!("nvidia-cap{minor}"))
}

/// A stand-in node: an empty file with the device file mode.
fn create_node(path: &Path) -> Result<(), Error> {
    std::fs::write(path, b"").map_err(|e| Error::io("create", path, e))?;
    set_mode(path)
}

/// The outcome of removing `path`, where the error kinds in `fine` count
/// as done (already gone, say).
fn removed(result: std::io::Result<()>, path: &Path, fine: &[ErrorKind]) -> Result<(), Error> {
    match result {
        Err(e) if !fine.contains(&e.kind()) => Err(Error::io("remove", path, e)),
        _ => Ok(()),
    }
}

/// Removes a file; one already gone is fine.
fn remove_file(path: &Path) -> Result<(), Error> {
    removed(std::fs::remove_file(path), path, &[ErrorKind::NotFound])
}

/// A GPU without instances keeps no empty `mig` directory behind.
fn remove_empty_mig_dir(mig_dir: &Path) -> Result<(), Error> {
    removed(
        std::fs::remove_dir(mig_dir),
        mig_dir,
        &[ErrorKind::NotFound, ErrorKind::DirectoryNotEmpty],
    )
}

/// The directory of a capability under the GPU's `mig` directory.
fn cap_dir(mig_dir: &Path, cap: &Cap) -> PathBuf {
    let gi = mig_dir.join(format!("gi{}", cap.gi));
    match cap.ci {
        None => gi,
        Some(ci) => gi.join(format!("ci{ci}")),
    }
}

/// The number in a directory entry named `<prefix><number>`.
fn numbered(name: &std::ffi::OsStr, prefix: &str) -> Option<u32> {
    let digits = name.to_str()?.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Entries of `dir` named `<prefix><number>`, with their numbers; none when
/// the directory does not exist.
fn entries(dir: &Path, prefix: &str) -> Result<Vec<(u32, PathBuf)>, Error> {
    let list = match std::fs::read_dir(dir) {
        Ok(list) => list,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list", dir, e)),
    };
    let mut out = Vec::new();
    for entry in list {
        let entry = entry.map_err(|e| Error::io("list", dir, e))?;
        if let Some(n) = numbered(&entry.file_name(), prefix) {
            out.push((n, entry.path()));
        }
    }
    Ok(out)
}

/// Removes a directory tree; one already gone is fine.
fn remove_dir(path: &Path) -> Result<(), Error> {
    removed(std::fs::remove_dir_all(path), path, &[ErrorKind::NotFound])
}

/// Writes an `access` file unless it already holds `minor` (write to a
/// temporary file and rename, so a reader never sees half a file).
fn write_access(dir: &Path, minor: u32) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    let path = dir.join("access");
    let text = access_text(minor);
    if std::fs::read_to_string(&path).is_ok_and(|t| t == text) {
        return Ok(());
    }
    let tmp = dir.join(".access.tmp");
    std::fs::write(&tmp, &text).map_err(|e| Error::io("write", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io("write", &path, e))
}

fn sync_proc(mig_dir: &Path, caps: &[Cap]) -> Result<(), Error> {
    let gis: BTreeSet<u32> = caps.iter().map(|c| c.gi).collect();
    for (gi, path) in entries(mig_dir, "gi")? {
        if !gis.contains(&gi) {
            remove_dir(&path)?;
        }
    }
    for cap in caps {
        let gi_dir = mig_dir.join(format!("gi{}", cap.gi));
        match cap.ci {
            None => {
                write_access(&gi_dir, cap.minor)?;
                let cis: BTreeSet<u32> = caps
                    .iter()
                    .filter(|c| c.gi == cap.gi)
                    .filter_map(|c| c.ci)
                    .collect();
                for (ci, path) in entries(&gi_dir, "ci")? {
                    if !cis.contains(&ci) {
                        remove_dir(&path)?;
                    }
                }
            }
            Some(ci) => write_access(&gi_dir.join(format!("ci{ci}")), cap.minor)?,
        }
    }
    if caps.is_empty() {
        remove_empty_mig_dir(mig_dir)?;
    }
    Ok(())
}

fn sync_nodes(nodes_dir: &Path, gpu_minor: u32, caps: &[Cap]) -> Result<(), Error> {
    let first = FIRST_GPU_MINOR + gpu_minor * PER_GPU;
    let range = first..first + PER_GPU;
    let minors: BTreeSet<u32> = caps.iter().map(|c| c.minor).collect();
    for (minor, path) in entries(nodes_dir, "nvidia-cap")? {
        if range.contains(&minor) && !minors.contains(&minor) {
            remove_file(&path)?;
        }
    }
    if minors.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(nodes_dir).map_err(|e| Error::io("create", nodes_dir, e))?;
    for minor in minors {
        let path = node_path(nodes_dir, minor);
        if !path.exists() {
            create_node(&path)?;
        }
    }
    Ok(())
}

fn set_mode(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(DEVICE_FILE_MODE))
        .map_err(|e| Error::io("set the mode of", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;

    #[test]
    fn minors_follow_the_kernel_table() {
        assert_eq!(gi_minor(0, 0), Some(3));
        assert_eq!(ci_minor(0, 0, 0), Some(4));
        assert_eq!(ci_minor(0, 0, 7), Some(11));
        assert_eq!(gi_minor(0, 1), Some(12));
        assert_eq!(ci_minor(0, 14, 7), Some(137));
        assert_eq!(gi_minor(1, 0), Some(138));
        assert_eq!(gi_minor(0, 15), None);
        assert_eq!(ci_minor(0, 0, 8), None);
        assert_eq!(
            access_text(21),
            "DeviceFileMinor: 21\nDeviceFileMode: 292\n"
        );
    }

    fn a100() -> Profile {
        let path = format!("{}/profiles/dgx-a100.yaml", env!("CARGO_MANIFEST_DIR"));
        Profile::load(Path::new(&path)).unwrap()
    }

    fn files(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    out.push(e.path().strip_prefix(root).unwrap().display().to_string());
                }
            }
        }
        out.sort();
        out
    }

    /// Every step of a create/destroy sequence: the changed files equal a
    /// full sync of the new state, in a tree that started the same.
    #[test]
    fn sync_change_leaves_what_a_full_sync_leaves() {
        let changed = tempfile::tempdir().unwrap();
        let full = tempfile::tempdir().unwrap();
        let roots_of = |d: &Path| CapRoots {
            proc_root: Some(d.join("proc")),
            dev_root: Some(d.join("root")),
        };
        let (rc, rf) = (roots_of(changed.path()), roots_of(full.path()));
        let profile = a100();
        let mut gpu = profile.gpus[0].clone();
        sync_gpu(&rc, &gpu).unwrap();
        sync_gpu(&rf, &gpu).unwrap();
        let steps: [fn(&mut Gpu); 4] = [
            |g| g.mig.destroy_compute_instance(2, 0).unwrap(),
            |g| g.mig.destroy_gpu_instance(2).unwrap(),
            |g| g.mig.destroy_compute_instance(1, 0).unwrap(),
            |g| g.mig.destroy_gpu_instance(1).unwrap(),
        ];
        for (i, step) in steps.iter().enumerate() {
            let before = gpu.clone();
            step(&mut gpu);
            sync_change(&rc, &before, &gpu).unwrap();
            sync_gpu(&rf, &gpu).unwrap();
            assert_eq!(files(changed.path()), files(full.path()), "step {i}");
        }
        // And back: instances made again from nothing.
        let empty = gpu.clone();
        let original = profile.gpus[0].clone();
        sync_change(&rc, &empty, &original).unwrap();
        sync_gpu(&rf, &original).unwrap();
        assert_eq!(files(changed.path()), files(full.path()));
        assert!(!files(changed.path()).is_empty());
        let text = std::fs::read_to_string(
            changed
                .path()
                .join("proc/driver/nvidia/capabilities/gpu0/mig/gi2/ci0/access"),
        )
        .unwrap();
        assert_eq!(text, access_text(ci_minor(0, 2, 0).unwrap()));
    }

    #[test]
    fn sync_creates_and_removes_exactly_the_gpus_files() {
        let dir = tempfile::tempdir().unwrap();
        let roots = CapRoots {
            proc_root: Some(dir.path().join("proc")),
            dev_root: Some(dir.path().join("root")),
        };
        let profile = a100();
        // GPU 0: 4g.40gb@0 (GI 1) + 3g.40gb@4 (GI 2), one CI each.
        let mut gpu = profile.gpus[0].clone();
        sync_gpu(&roots, &gpu).unwrap();
        // Another GPU's node and an unrelated file are left alone.
        std::fs::write(dir.path().join("root/dev/nvidia-caps/nvidia-cap138"), "").unwrap();
        std::fs::write(dir.path().join("root/dev/nvidia-caps/nvidia-cap1"), "").unwrap();
        let gi = |g: u32| gi_minor(0, g).unwrap();
        let ci = |g: u32, c: u32| ci_minor(0, g, c).unwrap();
        let mut expect = vec![
            "proc/driver/nvidia/capabilities/gpu0/mig/gi1/access".to_owned(),
            "proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0/access".to_owned(),
            "proc/driver/nvidia/capabilities/gpu0/mig/gi2/access".to_owned(),
            "proc/driver/nvidia/capabilities/gpu0/mig/gi2/ci0/access".to_owned(),
        ];
        for m in [gi(1), ci(1, 0), gi(2), ci(2, 0), 1, 138] {
            expect.push(format!("root/dev/nvidia-caps/nvidia-cap{m}"));
        }
        expect.sort();
        assert_eq!(files(dir.path()), expect);
        let text = std::fs::read_to_string(
            dir.path()
                .join("proc/driver/nvidia/capabilities/gpu0/mig/gi2/ci0/access"),
        )
        .unwrap();
        assert_eq!(text, access_text(ci(2, 0)));

        // GI 2 goes away: its files and node go with it.
        gpu.mig.destroy_compute_instance(2, 0).unwrap();
        gpu.mig.destroy_gpu_instance(2).unwrap();
        sync_gpu(&roots, &gpu).unwrap();
        let left = files(dir.path());
        assert!(!left.iter().any(|f| f.contains("gi2")), "{left:?}");
        assert!(
            !left.contains(&format!("root/dev/nvidia-caps/nvidia-cap{}", gi(2))),
            "{left:?}"
        );
        assert!(left.contains(&"root/dev/nvidia-caps/nvidia-cap138".to_owned()));
        assert!(left.contains(&"root/dev/nvidia-caps/nvidia-cap1".to_owned()));

        // Everything gone: no mig directory left behind.
        gpu.mig.destroy_compute_instance(1, 0).unwrap();
        gpu.mig.destroy_gpu_instance(1).unwrap();
        sync_gpu(&roots, &gpu).unwrap();
        assert!(
            !dir.path()
                .join("proc/driver/nvidia/capabilities/gpu0/mig")
                .exists()
        );
        assert_eq!(
            files(&dir.path().join("root")),
            [
                "dev/nvidia-caps/nvidia-cap1",
                "dev/nvidia-caps/nvidia-cap138"
            ]
        );
    }

    #[test]
    fn no_roots_means_no_files_and_a_blocked_root_is_an_error() {
        let profile = a100();
        sync_gpu(&CapRoots::default(), &profile.gpus[0]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        // proc root is a file: nothing can be created below it.
        let blocked = dir.path().join("file");
        std::fs::write(&blocked, "").unwrap();
        let err = sync_gpu(
            &CapRoots {
                proc_root: Some(blocked),
                dev_root: None,
            },
            &profile.gpus[0],
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("cannot list ") && text.contains("gpu0/mig"),
            "{text}"
        );
    }
}
