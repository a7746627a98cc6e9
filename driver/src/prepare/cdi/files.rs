//! Transient per-claim spec files in a CDI root (`/var/run/cdi`): naming,
//! atomic write, idempotent removal, and listing for the startup sweep.
//!
//! Name: `<vendor>-<class>_<claimUID>.json`, as CDI's transient spec names.
//! A write goes to a hidden temp file in the same directory whose name ends
//! in `.tmp` (runtimes only load `.json`/`.yaml`, so they never see it), is
//! made mode 0644 and renamed over the final name: readers see the old spec
//! or the new one, never a partial one.
//!
//! No fsync: a spec only has to outlive the plugin process (a killed
//! process loses nothing the kernel already has), not the machine. What a
//! power loss or kernel crash could leave half-written belongs to the
//! previous boot, whose prepared claims the checkpoint discards (boot id);
//! the startup sweep then deletes every spec no claim references, whatever
//! its content. With the CDI root on a disk (`/etc/cdi`) an fsync would be
//! a second durable write in every prepare, for nothing.

use std::fs::{self, OpenOptions, Permissions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::names::{validate_claim_uid, validate_class, validate_vendor};
use super::spec::Spec;
use super::{CLAIM_CLASS, CdiError, DEFAULT_VENDOR};

/// Distinguishes temp files of concurrent writes within this process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The per-claim spec files of one vendor/class in one CDI root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecDir {
    root: PathBuf,
    vendor: String,
    class: String,
}

impl SpecDir {
    /// Spec files of `vendor`/`class` in `root`; the names are validated.
    pub fn new(root: impl Into<PathBuf>, vendor: &str, class: &str) -> Result<Self, CdiError> {
        validate_vendor(vendor)?;
        validate_class(class)?;
        Ok(Self {
            root: root.into(),
            vendor: vendor.to_owned(),
            class: class.to_owned(),
        })
    }

    /// NVIDIA's naming: vendor `k8s.gpu.nvidia.com`, class `claim`.
    pub fn nvidia(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            vendor: DEFAULT_VENDOR.to_owned(),
            class: CLAIM_CLASS.to_owned(),
        }
    }

    /// The CDI root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The vendor.
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// The class.
    pub fn class(&self) -> &str {
        &self.class
    }

    /// The spec kind, `<vendor>/<class>`.
    pub fn kind(&self) -> String {
        format!("{}/{}", self.vendor, self.class)
    }

    fn prefix(&self) -> String {
        format!("{}-{}_", self.vendor, self.class)
    }

    /// The file name of a claim's spec.
    pub fn file_name(&self, claim_uid: &str) -> Result<String, CdiError> {
        validate_claim_uid(claim_uid)?;
        Ok(format!("{}{claim_uid}.json", self.prefix()))
    }

    /// The path of a claim's spec.
    pub fn path(&self, claim_uid: &str) -> Result<PathBuf, CdiError> {
        Ok(self.root.join(self.file_name(claim_uid)?))
    }

    /// Writes a claim's spec atomically (mode 0644) and returns its path.
    /// The CDI root must exist.
    pub fn write(&self, claim_uid: &str, spec: &Spec) -> Result<PathBuf, CdiError> {
        let name = self.file_name(claim_uid)?;
        let path = self.root.join(&name);
        let mut bytes = serde_json::to_vec_pretty(spec).map_err(|source| CdiError::Json {
            path: path.clone(),
            source,
        })?;
        bytes.push(b'\n');
        write_replacing(&path, &bytes).map_err(|(op, at, e)| CdiError::io(op, &at, e))?;
        Ok(path)
    }

    /// Checks that the CDI root takes files: creates and removes a hidden
    /// probe file named like a temp file (so the startup sweep removes one
    /// a crash left). A missing root passes (it is created or reported on
    /// the first write). For the start: a read-only root would fail every
    /// claim.
    pub fn check_writable(&self) -> Result<(), CdiError> {
        if !self.root.is_dir() {
            return Ok(());
        }
        let probe = self.root.join(format!(
            ".{}probe-{}.tmp",
            self.prefix(),
            std::process::id()
        ));
        let created = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&probe);
        match created {
            Ok(_) => {
                let _ = fs::remove_file(&probe);
                Ok(())
            }
            Err(source) => Err(CdiError::NotWritable {
                root: self.root.clone(),
                source,
            }),
        }
    }

    /// Removes a claim's spec; `Ok(false)` when there was none.
    pub fn remove(&self, claim_uid: &str) -> Result<bool, CdiError> {
        let path = self.path(claim_uid)?;
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            // A read-only file system refuses the unlink before it looks
            // for the file: a spec that is not there is removed all the same
            // (a prepare that failed to write it rolls back cleanly).
            Err(_)
                if fs::symlink_metadata(&path).is_err_and(|e| e.kind() == ErrorKind::NotFound) =>
            {
                Ok(false)
            }
            Err(e) => Err(CdiError::io("remove", &path, e)),
        }
    }

    /// The claim UIDs that have a spec file of this vendor/class, sorted.
    /// A missing CDI root has none. Files whose UID part is not a valid
    /// claim UID are not ours and are skipped.
    pub fn list(&self) -> Result<Vec<String>, CdiError> {
        let prefix = self.prefix();
        let mut uids: Vec<String> = self
            .entries()?
            .into_iter()
            .filter_map(|name| {
                let uid = name.strip_prefix(&prefix)?.strip_suffix(".json")?;
                validate_claim_uid(uid).ok()?;
                Some(uid.to_owned())
            })
            .collect();
        uids.sort();
        Ok(uids)
    }

    /// Removes temp files left by interrupted writes of this vendor/class;
    /// returns how many were removed.
    pub fn remove_temp_files(&self) -> Result<usize, CdiError> {
        let prefix = format!(".{}", self.prefix());
        let mut removed = 0;
        for name in self.entries()? {
            if name.starts_with(&prefix) && Path::new(&name).extension() == Some("tmp".as_ref()) {
                let path = self.root.join(&name);
                match fs::remove_file(&path) {
                    Ok(()) => removed += 1,
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(CdiError::io("remove", &path, e)),
                }
            }
        }
        Ok(removed)
    }

    fn entries(&self) -> Result<Vec<String>, CdiError> {
        let dir = match fs::read_dir(&self.root) {
            Ok(dir) => dir,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(CdiError::io("read dir", &self.root, e)),
        };
        let mut names = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|e| CdiError::io("read dir", &self.root, e))?;
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }
}

/// Writes `bytes` to `file` through `.<name>.<pid>-<n>.tmp` beside it,
/// mode 0644 whatever the umask, renamed over the final name: a reader sees
/// the old file or the new one, whole. A failure removes the temp file and
/// names the step and the path it failed on.
pub(crate) fn write_replacing(
    file: &Path,
    bytes: &[u8],
) -> Result<(), (&'static str, PathBuf, std::io::Error)> {
    let dir = file.parent().unwrap_or(Path::new("/"));
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let temp = dir.join(format!(".{name}.{}-{n}.tmp", std::process::id()));
    let result = write_then_rename(&temp, file, bytes);
    if result.is_err() {
        // Best effort: the temp file is ours and useless now.
        let _ = fs::remove_file(&temp);
    }
    result
}

fn write_then_rename(
    temp: &Path,
    path: &Path,
    bytes: &[u8],
) -> Result<(), (&'static str, PathBuf, std::io::Error)> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(temp)
        .map_err(at("create", temp))?;
    file.write_all(bytes).map_err(at("write", temp))?;
    // The umask may have narrowed the mode at creation.
    file.set_permissions(Permissions::from_mode(0o644))
        .map_err(at("chmod", temp))?;
    drop(file);
    fs::rename(temp, path).map_err(at("rename", path))
}

/// Names the step and the path of an I/O error.
fn at(
    op: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> (&'static str, PathBuf, std::io::Error) {
    let path = path.to_path_buf();
    move |e| (op, path, e)
}

#[cfg(test)]
mod tests {
    use super::super::spec::Device;
    use super::*;

    const UID: &str = "0f8e6a1c-3b9d-4e57-a1c2-9d8f7e6b5a43";

    fn spec(name: &str) -> Spec {
        Spec {
            cdi_version: "0.3.0".into(),
            kind: "k8s.gpu.nvidia.com/claim".into(),
            devices: vec![Device {
                name: name.into(),
                ..Device::default()
            }],
            ..Spec::default()
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_writable_root_passes_the_probe_and_keeps_no_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SpecDir::nvidia(tmp.path());
        dir.check_writable().unwrap();
        assert!(names(tmp.path()).is_empty());
        SpecDir::nvidia(tmp.path().join("missing"))
            .check_writable()
            .unwrap();
    }

    #[test]
    fn an_unwritable_root_fails_the_probe_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        // The probe's path taken by a directory: the probe fails whoever
        // runs the test (root ignores mode bits; a read-only mount is in
        // tests/node_faults.rs).
        let root = tmp.path().join("root");
        fs::create_dir(&root).unwrap();
        let dir = SpecDir::nvidia(&root);
        let probe = root.join(format!(".{}probe-{}.tmp", dir.prefix(), std::process::id()));
        fs::create_dir(&probe).unwrap();
        match dir.check_writable() {
            Err(e @ CdiError::NotWritable { .. }) => {
                let text = e.to_string();
                assert!(text.contains(root.to_str().unwrap()), "{text}");
                assert!(text.contains("read-write"), "{text}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn write_is_atomic_0644_and_leaves_no_temp_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SpecDir::nvidia(tmp.path());
        let path = dir.write(UID, &spec("a")).unwrap();
        assert_eq!(
            path,
            tmp.path()
                .join(format!("k8s.gpu.nvidia.com-claim_{UID}.json"))
        );
        assert_eq!(
            names(tmp.path()),
            [format!("k8s.gpu.nvidia.com-claim_{UID}.json")]
        );
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        let back: Spec = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(back, spec("a"));

        // Overwrite replaces the content.
        dir.write(UID, &spec("b")).unwrap();
        let back: Spec = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(back.devices[0].name, "b");
        assert_eq!(names(tmp.path()).len(), 1);
    }

    #[test]
    fn failed_write_leaves_neither_temp_nor_partial_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SpecDir::nvidia(tmp.path());
        // A non-empty directory where the spec should go: the rename fails.
        let target = dir.path(UID).unwrap();
        fs::create_dir(&target).unwrap();
        fs::write(target.join("keep"), b"x").unwrap();
        let err = dir.write(UID, &spec("a")).unwrap_err();
        assert!(err.to_string().starts_with("rename "), "{err}");
        assert_eq!(
            names(tmp.path()),
            [format!("k8s.gpu.nvidia.com-claim_{UID}.json")]
        );
        assert!(target.is_dir());

        // A missing CDI root fails at creation and creates nothing.
        let dir = SpecDir::nvidia(tmp.path().join("missing"));
        let err = dir.write(UID, &spec("a")).unwrap_err();
        assert!(err.to_string().starts_with("create "), "{err}");
        assert!(!tmp.path().join("missing").exists());
    }

    #[test]
    fn hostile_uids_never_touch_the_filesystem() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SpecDir::nvidia(tmp.path());
        for uid in ["../escape", "a/b", "..", "", &"x".repeat(300)] {
            let err = dir.write(uid, &spec("a")).unwrap_err();
            assert!(matches!(err, CdiError::InvalidName { .. }), "{uid}: {err}");
            assert!(dir.remove(uid).is_err());
        }
        assert!(names(tmp.path()).is_empty());
        assert!(!tmp.path().parent().unwrap().join("escape").exists());
    }

    #[test]
    fn remove_is_idempotent_and_list_finds_only_our_specs() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SpecDir::nvidia(tmp.path());
        assert!(dir.list().unwrap().is_empty());
        dir.write("bbb", &spec("a")).unwrap();
        dir.write("aaa", &spec("a")).unwrap();
        for other in [
            "k8s.gpu.nvidia.com-device_base.json",
            "nvidia.com-gpu.yaml",
            "k8s.gpu.nvidia.com-claim_ccc.yaml",
            "k8s.gpu.nvidia.com-claim_bad_uid.json",
            ".k8s.gpu.nvidia.com-claim_ddd.json.1-0.tmp",
        ] {
            fs::write(tmp.path().join(other), b"{}").unwrap();
        }
        assert_eq!(dir.list().unwrap(), ["aaa", "bbb"]);

        assert_eq!(dir.remove_temp_files().unwrap(), 1);
        assert!(
            !tmp.path()
                .join(".k8s.gpu.nvidia.com-claim_ddd.json.1-0.tmp")
                .exists()
        );

        assert!(dir.remove("aaa").unwrap());
        assert!(!dir.remove("aaa").unwrap());
        assert_eq!(dir.list().unwrap(), ["bbb"]);
        assert!(
            tmp.path()
                .join("k8s.gpu.nvidia.com-device_base.json")
                .exists()
        );

        let missing = SpecDir::nvidia(tmp.path().join("nope"));
        assert!(missing.list().unwrap().is_empty());
        assert!(!missing.remove("aaa").unwrap());
    }

    #[test]
    fn custom_vendor_and_class_are_validated() {
        let d = SpecDir::new("/x", "k8s.example.com", "claim").unwrap();
        assert_eq!(d.kind(), "k8s.example.com/claim");
        assert_eq!(d.file_name("u1").unwrap(), "k8s.example.com-claim_u1.json");
        assert!(SpecDir::new("/x", "k8s/x", "claim").is_err());
        assert!(SpecDir::new("/x", "k8s.x", "").is_err());
    }
}
