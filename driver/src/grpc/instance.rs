//! Per-instance socket names, for a rolling update kubelet does not notice.
//!
//! Kubelet 1.33 and later keep every registered plugin of a driver and call
//! the one registered last. An instance whose sockets carry a tag of its
//! own (`<driver>-<tag>-reg.sock`, `dra-<tag>.sock`) can therefore register
//! while the instance before it still serves, and kubelet never goes
//! without a plugin. With one shared name, kubelet deregisters the old
//! plugin on one pass of its once-a-second reconciler and registers the new
//! one on the next. Older kubelets drop a driver by name on any
//! deregistration, so the tagged names are for 1.33 and later only.
//!
//! This module makes the tags, names the files, and removes the sockets of
//! instances that died without cleaning up (SIGKILL, a power cut): a live
//! instance holds the lock next to its DRA socket, so a free lock means its
//! owner is gone. Tags are random, never reused, so removing a dead
//! instance's files cannot touch a live instance's.

use std::collections::BTreeSet;
use std::fs::{OpenOptions, TryLockError};
use std::hash::BuildHasher;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::sockets;

/// Length of a tag: 8 lowercase hex digits keep the registration path of
/// a 55-byte driver name under the default directory within the 107 bytes
/// a socket path may have.
pub const TAG_LEN: usize = 8;

/// The name, in the DRA socket's directory, of the symlink to the DRA
/// socket of the instance that serves; a waiting instance passes calls on
/// to it.
pub const SERVING_LINK: &str = "serving.sock";

/// The DRA socket's name without a tag (every instance before per-instance
/// names, and every instance without them).
pub const SHARED_DRA_SOCKET: &str = "dra.sock";

/// A fresh random tag. The standard library's hasher keys come from the
/// operating system's random source, so hashing the process id with a new
/// key gives 32 random bits without another dependency and without a
/// failure path.
pub fn new_tag() -> String {
    let key = std::collections::hash_map::RandomState::new();
    let bits = key.hash_one((std::process::id(), std::time::SystemTime::now()));
    format!("{:08x}", bits as u32)
}

/// Whether `s` is a tag as [`new_tag`] makes them.
pub fn is_tag(s: &str) -> bool {
    s.len() == TAG_LEN
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `dra-<tag>.sock`, or `dra.sock` without a tag.
pub fn dra_socket_name(tag: Option<&str>) -> String {
    match tag {
        Some(tag) => format!("dra-{tag}.sock"),
        None => SHARED_DRA_SOCKET.to_owned(),
    }
}

/// `<driver>-<tag>-reg.sock`, or `<driver>-reg.sock` without a tag.
pub fn registration_socket_name(driver: &str, tag: Option<&str>) -> String {
    match tag {
        Some(tag) => format!("{driver}-{tag}-reg.sock"),
        None => format!("{driver}-reg.sock"),
    }
}

/// The tag in a DRA socket's name or its lock's name
/// (`dra-<tag>.sock[.lock]`).
fn tag_of(file_name: &str) -> Option<&str> {
    let rest = file_name.strip_prefix("dra-")?;
    let tag = rest
        .strip_suffix(".sock")
        .or_else(|| rest.strip_suffix(".sock.lock"))?;
    is_tag(tag).then_some(tag)
}

/// Removes the tagged sockets (and their locks) in `dra_dir` and
/// `registrar_dir` of instances that are gone, leaving `own`'s (when this
/// instance has a tag) and every live instance's alone. A tag whose lock
/// is free is gone; a tagged socket without a lock file is gone when a
/// connection to it is refused. Best
/// effort: what cannot be removed is logged, and the start goes on
/// (kubelet only retries a dead registration socket once a second).
/// Returns the tags removed.
pub async fn clear_dead(
    dra_dir: &Path,
    registrar_dir: &Path,
    driver: &str,
    own: Option<&str>,
) -> Vec<String> {
    let entries = match std::fs::read_dir(dra_dir) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(dir = %dra_dir.display(), error = %e, "cannot look for the sockets of plugin instances that are gone");
            return Vec::new();
        }
    };
    let tags: BTreeSet<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| tag_of(&e.file_name().to_string_lossy()).map(str::to_owned))
        .filter(|t| Some(t.as_str()) != own)
        .collect();
    let mut removed = Vec::new();
    for tag in tags {
        let dra = dra_dir.join(dra_socket_name(Some(&tag)));
        let reg = registrar_dir.join(registration_socket_name(driver, Some(&tag)));
        let lock = sockets::lock_path(&dra);
        let gone = match OpenOptions::new().write(true).open(&lock) {
            // Held while the lock is: nobody can take the tag meanwhile.
            Ok(file) => match file.try_lock() {
                Ok(()) => {
                    sockets::remove_socket(&dra);
                    sockets::remove_socket(&reg);
                    sockets::remove_socket(&lock);
                    true
                }
                Err(TryLockError::WouldBlock) => false,
                Err(TryLockError::Error(e)) => {
                    tracing::warn!(lock = %lock.display(), error = %e, "cannot check whether a plugin instance is alive");
                    false
                }
            },
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // No lock: the connect probe decides, socket by socket.
                let dra_gone = sockets::clear_stale(&dra).await.is_ok();
                let reg_gone = sockets::clear_stale(&reg).await.is_ok();
                dra_gone && reg_gone
            }
            Err(e) => {
                tracing::warn!(lock = %lock.display(), error = %e, "cannot check whether a plugin instance is alive");
                false
            }
        };
        if gone {
            tracing::info!(instance = %tag, dra = %dra.display(), registration = %reg.display(), "removed the sockets of a plugin instance that is gone");
            removed.push(tag);
        }
    }
    removed
}

/// Points the [`SERVING_LINK`] in `dir` at `socket`, atomically (a
/// symlink under a hidden name, renamed over the link).
pub fn point_serving_link(dir: &Path, socket: &Path) -> std::io::Result<()> {
    let link = dir.join(SERVING_LINK);
    let staging = dir.join(format!(".{SERVING_LINK}.new"));
    let _ = std::fs::remove_file(&staging);
    std::os::unix::fs::symlink(socket, &staging)?;
    std::fs::rename(&staging, &link).inspect_err(|_| {
        let _ = std::fs::remove_file(&staging);
    })
}

/// Removes the [`SERVING_LINK`] in `dir` if it points at `socket` (a
/// successor may have pointed it at its own socket already).
pub fn remove_serving_link(dir: &Path, socket: &Path) {
    let link = dir.join(SERVING_LINK);
    if std::fs::read_link(&link).is_ok_and(|target| target == socket) {
        sockets::remove_socket(&link);
    }
}

/// Where a waiting instance passes calls on to, in order: the instance
/// the [`SERVING_LINK`] names, then the shared `dra.sock` (an instance of a
/// version before the link, or one without per-instance names). `own` (the
/// waiting instance's socket) is never a target.
pub fn forward_targets(dir: &Path, own: &Path) -> Vec<PathBuf> {
    [dir.join(SERVING_LINK), dir.join(SHARED_DRA_SOCKET)]
        .into_iter()
        .filter(|p| p != own)
        .collect()
}

#[cfg(test)]
mod tests;
