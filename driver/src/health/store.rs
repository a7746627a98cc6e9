//! The health checkpoint: the tracker's active conditions ([`Saved`], per
//! GPU UUID and boot id) in one small JSON file in the plugin's state
//! directory, so a restart of the plugin does not forget a fault NVML will
//! not report again.
//!
//! Written whole and atomically (a temporary file in the same directory,
//! fsync, rename, fsync of the directory). Read with a size cap and checked
//! before use: a damaged, truncated, oversized or hostile file (or one of
//! another format version) is reported as a precise [`Error`], kept aside as
//! `<name>.damaged` for inspection, and the plugin starts without saved
//! faults; it is never a crash.
//!
//! An admin clears a `hardware-failure` (sticky by design) by writing the
//! GPU's UUID (or `all`) into `<state-dir>/health-clear` on the node
//! ([`take_clear_request`]); the monitor takes the file at its next tick.
//!
//! Separate from the claim checkpoint (`prepare::checkpoint`): losing this
//! file costs only memory of past faults, never a prepared claim.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::prepare::capped::{self, Capped};

use super::tracker::{ClearRequest, Key, MAX_CONDITIONS_PER_GPU, MAX_MESSAGE, Saved};

/// The file format version this build writes and reads.
pub const VERSION: u32 = 1;
/// The largest file read.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Most GPUs in a file.
pub const MAX_GPUS: usize = 1024;
/// Longest boot id, UUID or taint value accepted.
const MAX_ID: usize = 128;

/// A checkpoint that cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing failed.
    #[error("health checkpoint {path}: {op}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error("health checkpoint {path} is larger than {max} bytes; ignored")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The cap.
        max: u64,
    },
    /// The file is not valid JSON of the expected shape.
    #[error("health checkpoint {path} is damaged ({reason}); ignored")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the position where serde gives one.
        reason: String,
    },
    /// The file is of another format version.
    #[error(
        "health checkpoint {path} has format version {found}, this build reads {VERSION}; ignored"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: u64,
    },
}

/// The file's envelope.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File1 {
    version: u32,
    saved: Saved,
}

/// Only the version, read first so a newer format is named as such.
#[derive(Deserialize)]
struct VersionOnly {
    version: serde_json::Value,
}

/// The checkpoint file.
#[derive(Debug)]
pub struct HealthStore {
    path: PathBuf,
    load_error: Option<Error>,
}

impl HealthStore {
    /// Opens the checkpoint at `path` and reads what it saved: `None` when
    /// there is no file yet, or when it is damaged (then
    /// [`HealthStore::load_error`] says why and the file is moved aside to
    /// `<path>.damaged`).
    ///
    /// # Errors
    /// [`Error::Io`] when the file exists but cannot be read at all (for
    /// example a directory in its place, or no permission).
    pub fn open(path: impl Into<PathBuf>) -> Result<(Self, Option<Saved>), Error> {
        let path = path.into();
        let bytes = match read_capped(&path) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => {
                return Ok((
                    Self {
                        path,
                        load_error: None,
                    },
                    None,
                ));
            }
            Err(e @ Error::TooLarge { .. }) => return Ok(Self::damaged(path, e)),
            Err(e) => return Err(e),
        };
        match decode(&path, &bytes) {
            Ok(saved) => Ok((
                Self {
                    path,
                    load_error: None,
                },
                Some(saved),
            )),
            Err(e) => Ok(Self::damaged(path, e)),
        }
    }

    fn damaged(path: PathBuf, error: Error) -> (Self, Option<Saved>) {
        tracing::warn!(error = %error, "health checkpoint not used; starting without saved faults");
        let aside = aside_path(&path);
        if let Err(e) = fs::rename(&path, &aside) {
            tracing::warn!(path = %path.display(), error = %e, "could not move the damaged health checkpoint aside");
        }
        (
            Self {
                path,
                load_error: Some(error),
            },
            None,
        )
    }

    /// Why the file found at open was not used, if it was damaged.
    pub fn load_error(&self) -> Option<&Error> {
        self.load_error.as_ref()
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `saved` atomically.
    ///
    /// # Errors
    /// [`Error::Io`] when any step fails (the old file is then intact).
    pub fn save(&self, saved: &Saved) -> Result<(), Error> {
        let io = |op: &'static str| {
            let path = self.path.clone();
            move |source| Error::Io { path, op, source }
        };
        let body = serde_json::to_vec(&File1 {
            version: VERSION,
            saved: saved.clone(),
        })
        .map_err(|e| Error::Io {
            path: self.path.clone(),
            op: "encode",
            source: io::Error::other(e),
        })?;
        let tmp = tmp_path(&self.path);
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io("create temporary file"))?;
        let written = file
            .write_all(&body)
            .and_then(|()| file.sync_all())
            .map_err(io("write temporary file"));
        drop(file);
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        if let Err(e) = fs::rename(&tmp, &self.path).map_err(io("rename into place")) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        let dir = self
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io("sync directory"))
    }
}

/// The file name of an admin's request to clear hardware failures, in the
/// plugin's state directory (next to the checkpoint).
pub const CLEAR_FILE: &str = "health-clear";
/// The largest clear request read.
pub const MAX_CLEAR_BYTES: u64 = 64 << 10;

/// Takes an admin's request to clear `hardware-failure` conditions: reads
/// `path` (one GPU UUID per line, or `all`; blank lines and `#` comments
/// ignored) and removes the file, malformed or not, so a bad request is
/// reported once. `None` when there is no file.
///
/// # Errors
/// [`Error::Io`] when the file cannot be read or removed;
/// [`Error::TooLarge`] or [`Error::Damaged`] (naming the line) for a
/// request that is not a list of UUIDs.
pub fn take_clear_request(path: &Path) -> Result<Option<ClearRequest>, Error> {
    // Whatever is read, the request goes, so it is taken once (a directory
    // or an unreadable file is removed where it can be, so it does not fail
    // on every poll).
    let bytes = match capped::read_capped(path, MAX_CLEAR_BYTES) {
        Ok(Capped::Missing) => return Ok(None),
        Ok(Capped::Bytes(bytes)) => {
            remove(path)?;
            bytes
        }
        Ok(Capped::TooLarge(_)) => {
            remove(path)?;
            return Err(Error::TooLarge {
                path: path.to_owned(),
                max: MAX_CLEAR_BYTES,
            });
        }
        Err(source) => {
            let _ = fs::remove_file(path);
            return Err(Error::Io {
                path: path.to_owned(),
                op: "read",
                source,
            });
        }
    };
    parse_clear_request(&bytes)
        .map(Some)
        .map_err(|reason| Error::Damaged {
            path: path.to_owned(),
            reason,
        })
}

fn remove(path: &Path) -> Result<(), Error> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Io {
            path: path.to_owned(),
            op: "remove",
            source,
        }),
    }
}

/// Parses a clear request (see [`take_clear_request`]).
fn parse_clear_request(bytes: &[u8]) -> Result<ClearRequest, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let mut gpus = BTreeSet::new();
    let mut all = false;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line == "all" {
            all = true;
        } else if line.starts_with("GPU-")
            && line.len() <= MAX_ID
            && line.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            gpus.insert(line.to_owned());
        } else {
            return Err(format!(
                "line {}: {:?} is neither a GPU UUID (GPU-...) nor `all`",
                i + 1,
                cut(line)
            ));
        }
    }
    if all {
        Ok(ClearRequest::All)
    } else if gpus.is_empty() {
        Err("names no GPU (write GPU UUIDs, one a line, or `all`)".to_owned())
    } else {
        Ok(ClearRequest::Gpus(gpus))
    }
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

fn aside_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".damaged");
    path.with_file_name(name)
}

/// The file's bytes, `None` when there is none, through the plugin's one
/// capped reader (a file over the cap is not read, a FIFO or directory in
/// its place is refused without blocking).
fn read_capped(path: &Path) -> Result<Option<Vec<u8>>, Error> {
    match capped::read_capped(path, MAX_FILE_BYTES) {
        Ok(Capped::Missing) => Ok(None),
        Ok(Capped::Bytes(bytes)) => Ok(Some(bytes)),
        Ok(Capped::TooLarge(_)) => Err(Error::TooLarge {
            path: path.to_owned(),
            max: MAX_FILE_BYTES,
        }),
        Err(source) => Err(Error::Io {
            path: path.to_owned(),
            op: "read",
            source,
        }),
    }
}

/// Parses and checks a file body.
fn decode(path: &Path, bytes: &[u8]) -> Result<Saved, Error> {
    let damaged = |reason: String| Error::Damaged {
        path: path.to_owned(),
        reason,
    };
    // serde_json stops at 128 levels of nesting with an error, so a deeply
    // nested file is a parse error, not a stack overflow.
    let version: VersionOnly = serde_json::from_slice(bytes).map_err(|e| damaged(e.to_string()))?;
    match version.version.as_u64() {
        Some(v) if v == u64::from(VERSION) => {}
        Some(found) => {
            return Err(Error::Version {
                path: path.to_owned(),
                found,
            });
        }
        None => {
            return Err(damaged(format!(
                "version is {}, not a number",
                version.version
            )));
        }
    }
    let file: File1 = serde_json::from_slice(bytes).map_err(|e| damaged(e.to_string()))?;
    check(&file.saved).map_err(damaged)?;
    Ok(file.saved)
}

/// The limits a saved state must meet.
fn check(saved: &Saved) -> Result<(), String> {
    if saved.boot_id.len() > MAX_ID {
        return Err(format!("boot id longer than {MAX_ID} bytes"));
    }
    if saved.gpus.len() > MAX_GPUS {
        return Err(format!("more than {MAX_GPUS} GPUs"));
    }
    for (uuid, gpu) in &saved.gpus {
        if uuid.is_empty() || uuid.len() > MAX_ID || !uuid.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!("GPU UUID {:?} is not a UUID", cut(uuid)));
        }
        if gpu.conditions.len() > MAX_CONDITIONS_PER_GPU {
            return Err(format!(
                "GPU {uuid}: more than {MAX_CONDITIONS_PER_GPU} conditions"
            ));
        }
        for c in &gpu.conditions {
            if c.message.len() > MAX_MESSAGE {
                return Err(format!(
                    "GPU {uuid}: a message longer than {MAX_MESSAGE} bytes"
                ));
            }
            if c.message.chars().any(char::is_control) {
                return Err(format!("GPU {uuid}: a message with control characters"));
            }
            if c.since > c.last {
                return Err(format!("GPU {uuid}: a condition last seen before it began"));
            }
            match (c.key, &c.value) {
                (Key::ResetRequired | Key::HardwareFailure, Some(v)) if is_label_value(v) => {}
                (Key::ResetRequired | Key::HardwareFailure, v) => {
                    return Err(format!(
                        "GPU {uuid}: {} needs a label value, found {:?}",
                        c.key.short(),
                        v.as_deref().map(cut)
                    ));
                }
                (_, None) => {}
                (_, Some(_)) => {
                    return Err(format!("GPU {uuid}: {} takes no value", c.key.short()));
                }
            }
        }
    }
    Ok(())
}

fn cut(s: &str) -> String {
    s.chars().take(64).collect()
}

/// A Kubernetes label value: at most 63 characters, alphanumerics with
/// `-`, `_`, `.` inside, non-empty here.
pub fn is_label_value(v: &str) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests;
