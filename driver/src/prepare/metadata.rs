//! KEP-5304 device metadata: for every claim it prepares, the plugin writes
//! one file per request describing the request's devices (name, pool and
//! the attributes published in the ResourceSlice, `resource.kubernetes.io/pciBusID`
//! among them), and the claim's CDI spec bind-mounts it read-only into the
//! containers that use the request. KubeVirt finds a passthrough GPU's PCI
//! address there; any workload can read which devices it got.
//!
//! - [`paths`]: the host and container paths, from checked names;
//! - [`document`]: the JSON, byte for byte as the Go library writes it.
//!
//! Life of the files: written at prepare before the CDI spec (a temp file
//! renamed over the final name, so a container that already mounted the
//! old one keeps it whole), removed once an unprepare or a rollback is
//! recorded (after the checkpoint write: its fsync would otherwise also
//! wait for the directory changes; a crash in between leaves them to the
//! sweep), and swept at start: a file whose claim (by the UID inside it)
//! has no checkpoint entry goes (a half-prepared claim's too, once
//! recovery dropped its entry), as do temp files of interrupted writes. Like CDI specs they are not fsynced:
//! a power loss ends the boot whose claims the checkpoint discards, and
//! the sweep then removes what is left. A file names its claim's UID, so
//! one claim never removes another's file, even under the same name.
//!
//! The mount goes on the first device of each request in the claim's spec:
//! kubelet gives a container every device of the requests it uses, so a
//! container sees exactly the files of its requests.

pub mod document;
pub mod paths;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::resource::v1 as api;
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::cdi::{HostRoot, Mount};
use crate::devices::DeviceModel;
use document::{ClaimMeta, Content, Device, Request};

/// The annotation kubelet's claim controller puts on a claim made from a
/// template: the claim's name in the pod spec.
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// Mount options of a metadata file (the Go library's).
pub const MOUNT_OPTIONS: [&str; 2] = ["ro", "bind"];

/// Mode of the directories (the Go library's).
const DIR_MODE: u32 = 0o755;

/// Why metadata could not be written or removed.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// A name that would become part of a path breaks the Kubernetes
    /// naming rules.
    #[error("invalid {what} {value:?} for the device metadata file: {reason}")]
    InvalidName {
        /// Which name ("namespace", "claim name", "request name", ...).
        what: &'static str,
        /// The value (cut short when very long).
        value: String,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// The document could not be encoded.
    #[error("device metadata {path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The serde error.
        source: serde_json::Error,
    },
    /// A filesystem operation failed.
    #[error("device metadata: {op} {path}: {source}")]
    Io {
        /// What was done.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> MetadataError {
    let path = path.to_path_buf();
    move |source| MetadataError::Io { op, path, source }
}

/// What the metadata needs of the ResourceClaim beyond the plan: the
/// pod's name for a template claim, and each request as allocated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimFacts {
    /// [`POD_CLAIM_NAME_ANNOTATION`], when set and not empty.
    pub pod_claim_name: Option<String>,
    /// Base request name to the request as allocated
    /// (`<request>/<subrequest>` for a `firstAvailable` choice), for the
    /// results of `driver` on `node`.
    pub requests: BTreeMap<String, String>,
}

impl ClaimFacts {
    /// The facts of `claim` for this driver's results on this node.
    pub fn of(claim: &ResourceClaim, driver: &str, node: &str) -> Self {
        let pod_claim_name = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION))
            .filter(|v| !v.is_empty())
            .cloned();
        let mut requests = BTreeMap::new();
        let results = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref());
        for r in results.into_iter().flatten() {
            if r.driver != driver || r.pool != node {
                continue;
            }
            let base = r.request.split_once('/').map_or(&*r.request, |(b, _)| b);
            requests
                .entry(base.to_owned())
                .or_insert_with(|| r.request.clone());
        }
        Self {
            pod_claim_name,
            requests,
        }
    }
}

/// The claim a write is for.
#[derive(Clone, Copy, Debug)]
pub struct ClaimId<'a> {
    /// UID.
    pub uid: &'a str,
    /// Namespace.
    pub namespace: &'a str,
    /// Name.
    pub name: &'a str,
}

/// One prepared device, as the metadata sees it.
#[derive(Clone, Copy, Debug)]
pub struct PreparedDevice<'a> {
    /// Base names of the requests it serves.
    pub requests: &'a [String],
    /// Its pool.
    pub pool: &'a str,
    /// Its name in the pool.
    pub device: &'a str,
}

/// Writes and removes the metadata files of one plugin.
#[derive(Clone, Debug)]
pub struct Writer {
    root: HostRoot,
    driver: String,
    attributes: HashMap<String, BTreeMap<String, api::DeviceAttribute>>,
}

impl Writer {
    /// A writer under `root` (`<kubelet-plugins-dir>/<driver>/dra-device-metadata`,
    /// as the plugin and the host see it), for `driver`, with the
    /// attributes of the devices of `model` (what the plugin publishes).
    pub fn new(root: HostRoot, driver: &str, model: &DeviceModel) -> Self {
        let attributes = model
            .devices()
            .map(|d| {
                let attrs = d
                    .attributes
                    .attributes
                    .iter()
                    .map(|(name, value)| {
                        ((*name).to_owned(), crate::devices::k8s::attribute(value))
                    })
                    .collect();
                (d.name.clone(), attrs)
            })
            .collect();
        Self {
            root,
            driver: driver.to_owned(),
            attributes,
        }
    }

    /// The directory of the files.
    pub fn root(&self) -> &HostRoot {
        &self.root
    }

    /// Writes one file per request of `devices` and returns, per request,
    /// the index of its first device and the mount for it. Every name is
    /// checked before anything is written; a failed write removes what this
    /// call wrote.
    pub fn write(
        &self,
        claim: ClaimId<'_>,
        facts: &ClaimFacts,
        devices: &[PreparedDevice<'_>],
    ) -> Result<Vec<(usize, Mount)>, MetadataError> {
        // Requests in the order their first device comes.
        let mut order: Vec<&str> = Vec::new();
        for d in devices {
            for r in d.requests {
                if !order.contains(&r.as_str()) {
                    order.push(r);
                }
            }
        }
        let mut planned = Vec::with_capacity(order.len());
        for request in order {
            let rel = paths::host_file(Path::new(""), claim.namespace, claim.name, request)?;
            let container = paths::container_file(
                &self.driver,
                claim.name,
                facts.pod_claim_name.as_deref(),
                request,
            )?;
            let members: Vec<usize> = (0..devices.len())
                .filter(|&i| devices[i].requests.iter().any(|r| r == request))
                .collect();
            let content = Content {
                claim: ClaimMeta {
                    name: claim.name.to_owned(),
                    namespace: claim.namespace.to_owned(),
                    uid: claim.uid.to_owned(),
                    generation: 1,
                },
                pod_claim_name: facts.pod_claim_name.clone(),
                request: Request {
                    name: facts
                        .requests
                        .get(request)
                        .cloned()
                        .unwrap_or_else(|| request.to_owned()),
                    devices: members
                        .iter()
                        .map(|&i| Device {
                            driver: self.driver.clone(),
                            pool: devices[i].pool.to_owned(),
                            name: devices[i].device.to_owned(),
                            attributes: self
                                .attributes
                                .get(devices[i].device)
                                .cloned()
                                .unwrap_or_default(),
                            network_data: None,
                        })
                        .collect(),
                },
            };
            planned.push((members[0], rel, container, content));
        }
        let mut mounts = Vec::with_capacity(planned.len());
        let mut written: Vec<PathBuf> = Vec::new();
        for (first, rel, container, content) in planned {
            let file = self.root.local(&rel);
            let result = document::encode(&content)
                .map_err(|source| MetadataError::Json {
                    path: file.clone(),
                    source,
                })
                .and_then(|bytes| write_file(&file, &bytes));
            if let Err(e) = result {
                for done in &written {
                    let _ = remove_file_and_dirs(&self.root.path, done);
                }
                return Err(e);
            }
            written.push(file);
            mounts.push((
                first,
                Mount {
                    host_path: self.root.host_path(&rel),
                    container_path: container,
                    options: MOUNT_OPTIONS.iter().map(|&o| o.to_owned()).collect(),
                    mount_type: None,
                },
            ));
        }
        Ok(mounts)
    }

    /// Removes the files of claim `uid` named `namespace/name`, leaving
    /// any another claim of that name wrote; returns how many went.
    pub fn remove(&self, namespace: &str, name: &str, uid: &str) -> Result<usize, MetadataError> {
        let dir = self.root.path.join(paths::claim_dir_name(namespace, name)?);
        Self::remove_in(&dir, &|found| found.is_none_or(|u| u == uid))
    }

    /// Removes the files of claim `uid` wherever they are (a claim whose
    /// checkpoint entry, with its name, was lost); returns how many went.
    pub fn remove_uid(&self, uid: &str) -> Result<usize, MetadataError> {
        let mut removed = 0;
        for dir in subdirs(&self.root.path)? {
            removed += Self::remove_in(&dir, &|found| found == Some(uid))?;
        }
        Ok(removed)
    }

    /// The start's sweep: removes every file whose claim `keep` does not
    /// name (or that names none), temp files of interrupted writes, and the
    /// directories left empty. Returns the files removed.
    pub fn sweep(&self, keep: &dyn Fn(&str) -> bool) -> Result<Vec<PathBuf>, MetadataError> {
        let mut removed = Vec::new();
        for dir in subdirs(&self.root.path)? {
            for request in subdirs(&dir)? {
                for entry in fs::read_dir(&request).map_err(io("read dir", &request))? {
                    let entry = entry.map_err(io("read dir", &request))?;
                    let path = entry.path();
                    let name = entry.file_name();
                    let name = name.to_string_lossy();
                    let gone = if name == paths::FILE_NAME {
                        let uid = fs::read(&path)
                            .ok()
                            .and_then(|b| document::recorded_uid(&b));
                        !uid.is_some_and(|u| keep(&u))
                    } else {
                        is_temp(&name)
                    };
                    if gone {
                        remove_if_there(&path)?;
                        removed.push(path);
                    }
                }
                remove_dir_if_empty(&request)?;
            }
            remove_dir_if_empty(&dir)?;
        }
        Ok(removed)
    }

    /// Removes the files in claim directory `dir` whose recorded UID
    /// `matches`, and the directories left empty.
    fn remove_in(
        dir: &Path,
        matches: &dyn Fn(Option<&str>) -> bool,
    ) -> Result<usize, MetadataError> {
        let mut removed = 0;
        for request in subdirs(dir)? {
            let file = request.join(paths::FILE_NAME);
            let bytes = match fs::read(&file) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    remove_dir_if_empty(&request)?;
                    continue;
                }
                Err(e) => return Err(io("read", &file)(e)),
            };
            if matches(document::recorded_uid(&bytes).as_deref()) {
                remove_if_there(&file)?;
                removed += 1;
                remove_dir_if_empty(&request)?;
            }
        }
        remove_dir_if_empty(dir)?;
        Ok(removed)
    }
}

/// Whether `name` is a temp file of [`write_file`].
fn is_temp(name: &str) -> bool {
    name.starts_with('.') && Path::new(name).extension() == Some("tmp".as_ref())
}

/// Writes `bytes` to `file` through a temp file in its directory (made
/// first, with its parents), mode 0644.
fn write_file(file: &Path, bytes: &[u8]) -> Result<(), MetadataError> {
    let dir = file.parent().unwrap_or(Path::new("/"));
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(io("create directory", dir))?;
    super::cdi::files::write_replacing(file, bytes)
        .map_err(|(op, path, source)| MetadataError::Io { op, path, source })
}

/// Removes `file` and its request and claim directories when left empty,
/// never `root` itself.
fn remove_file_and_dirs(root: &Path, file: &Path) -> Result<(), MetadataError> {
    remove_if_there(file)?;
    let mut dir = file.parent();
    while let Some(d) = dir {
        if d == root || !d.starts_with(root) {
            break;
        }
        remove_dir_if_empty(d)?;
        dir = d.parent();
    }
    Ok(())
}

fn remove_if_there(path: &Path) -> Result<(), MetadataError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("remove", path)(e)),
    }
}

fn remove_dir_if_empty(dir: &Path) -> Result<(), MetadataError> {
    match fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::DirectoryNotEmpty) => Ok(()),
        Err(e) => Err(io("remove directory", dir)(e)),
    }
}

/// The real directories in `dir` (never a symlink's target); none when
/// `dir` is missing.
fn subdirs(dir: &Path) -> Result<Vec<PathBuf>, MetadataError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("read dir", dir)(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io("read dir", dir))?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests;
