//! Socket hygiene for the kubelet-facing Unix sockets: path length checks,
//! directory creation (0750), a per-socket instance lock, stale-socket
//! removal that never hijacks a live server, and binding with mode 0600
//! under a hidden name, renamed into place once the socket listens.

mod error;

pub use error::Error;

use std::fs::{DirBuilder, File, OpenOptions, TryLockError};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};

/// The longest socket path that fits into `sockaddr_un.sun_path` (108 bytes
/// on Linux, including the terminating NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// Mode of the directories this module creates.
pub const DIR_MODE: u32 = 0o750;

/// Mode of the sockets this module binds.
pub const SOCKET_MODE: u32 = 0o600;

/// How long a connect probe may take before the socket counts as live (a
/// server that listens but does not accept still owns its socket).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Refuses socket paths that do not fit into `sun_path`.
pub fn check_path_len(path: &Path) -> Result<(), Error> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(Error::SocketPathTooLong {
            path: path.to_owned(),
            len,
            max: MAX_SOCKET_PATH,
        });
    }
    Ok(())
}

/// Makes `path` absolute against the current directory, without touching
/// the file system (kubelet needs an absolute endpoint).
pub fn absolute(path: &Path) -> Result<PathBuf, Error> {
    std::path::absolute(path).map_err(|source| Error::Absolute {
        path: path.to_owned(),
        source,
    })
}

/// Creates `dir` and its missing ancestors with mode 0750 (whatever the
/// umask); directories that already exist keep their mode.
pub fn ensure_dir(dir: &Path) -> Result<(), Error> {
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(p) = cur {
        match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => return Err(Error::NotADirectory { path: p.to_owned() }),
            // A file further up shows as NotADirectory here; the walk finds it.
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                missing.push(p);
            }
            Err(source) => {
                return Err(Error::CreateDir {
                    path: p.to_owned(),
                    source,
                });
            }
        }
        cur = p.parent();
    }
    for p in missing.into_iter().rev() {
        let created = DirBuilder::new().mode(DIR_MODE).create(p);
        match created {
            Ok(()) => {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(DIR_MODE)).map_err(
                    |source| Error::CreateDir {
                        path: p.to_owned(),
                        source,
                    },
                )?;
            }
            // Someone else created it meanwhile: fine if it is a directory.
            Err(e) if e.kind() == ErrorKind::AlreadyExists && p.is_dir() => {}
            Err(source) => {
                return Err(Error::CreateDir {
                    path: p.to_owned(),
                    source,
                });
            }
        }
    }
    Ok(())
}

/// `<socket>.lock`: where [`SocketLock`] locks `socket`.
pub fn lock_path(socket: &Path) -> PathBuf {
    let mut name = socket.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// An exclusive lock on `<socket>.lock`, held for the life of a server so
/// that two instances can never race between probing and binding. The lock
/// of a shared socket name is left in place on exit: deleting a lock file
/// another instance may be opening is itself racy. That of a per-instance
/// name ([`crate::grpc::instance`]) is removed, since nobody else ever locks it
/// to serve.
#[derive(Debug)]
pub struct SocketLock {
    _file: File,
    path: PathBuf,
    remove_on_drop: bool,
}

impl SocketLock {
    /// Takes the lock next to `socket`, or fails at once if another process
    /// holds it.
    pub fn acquire(socket: &Path) -> Result<Self, Error> {
        let path = lock_path(socket);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| Error::Lock {
                path: path.clone(),
                source,
            })?;
        match file.try_lock() {
            Ok(()) => Ok(Self {
                _file: file,
                path,
                remove_on_drop: false,
            }),
            Err(TryLockError::WouldBlock) => Err(Error::Locked { path }),
            Err(TryLockError::Error(source)) => Err(Error::Lock { path, source }),
        }
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the lock file when the lock is dropped (while still held).
    pub fn removed_on_drop(mut self) -> Self {
        self.remove_on_drop = true;
        self
    }
}

impl Drop for SocketLock {
    fn drop(&mut self) {
        if self.remove_on_drop {
            remove_socket(&self.path);
        }
    }
}

/// Makes `path` free for binding: nothing there is fine; a stale socket
/// (connect refused) is removed; a live socket or anything that is not a
/// socket is refused.
pub async fn clear_stale(path: &Path) -> Result<(), Error> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(Error::Probe {
                path: path.to_owned(),
                source,
            });
        }
    };
    if !meta.file_type().is_socket() {
        return Err(Error::NotASocket {
            path: path.to_owned(),
        });
    }
    match tokio::time::timeout(PROBE_TIMEOUT, UnixStream::connect(path)).await {
        Ok(Ok(_)) | Err(_) => Err(Error::SocketInUse {
            path: path.to_owned(),
        }),
        Ok(Err(e)) if e.kind() == ErrorKind::ConnectionRefused => {
            tracing::info!(socket = %path.display(), "removing stale socket");
            match std::fs::remove_file(path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
                Err(source) => Err(Error::RemoveStale {
                    path: path.to_owned(),
                    source,
                }),
            }
        }
        Ok(Err(e)) if e.kind() == ErrorKind::NotFound => Ok(()),
        Ok(Err(source)) => Err(Error::Probe {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Binds a listener on `path` (which [`clear_stale`] has cleared), with mode
/// 0600, so that the socket appears at `path` only once it listens and has
/// its mode: it is bound under the hidden name `staging_path` (kubelet's
/// plugin watcher ignores names starting with `.`), chmodded, then renamed
/// into place. Bound straight at `path`, a watcher that lists the
/// directory between the kernel's `bind` and `listen` would connect to a
/// socket that refuses it (kubelet then waits for its next retry; the
/// demo's registrar saw exactly that under load), and for a moment the
/// socket would have the umask's mode. A staging name too long for a
/// socket (only when `path`'s own name is shorter than the suffix) falls
/// back to binding at `path`. On any failure nothing is left behind.
pub fn bind(path: &Path) -> Result<UnixListener, Error> {
    let staging = staging_path(path).filter(|s| check_path_len(s).is_ok());
    let at = staging.as_deref().unwrap_or(path);
    if let Some(staging) = &staging {
        // A crashed run's leftover: never a live socket, since a live
        // server's socket has been renamed to `path` already.
        remove_socket(staging);
    }
    let listener = UnixListener::bind(at).map_err(|source| Error::Bind {
        path: at.to_owned(),
        source,
    })?;
    let placed = std::fs::set_permissions(at, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(|source| Error::Chmod {
            path: at.to_owned(),
            source,
        })
        .and_then(|()| match &staging {
            Some(staging) => std::fs::rename(staging, path).map_err(|source| Error::Place {
                staging: staging.clone(),
                path: path.to_owned(),
                source,
            }),
            None => Ok(()),
        });
    if let Err(e) = placed {
        drop(listener);
        remove_socket(at);
        return Err(e);
    }
    Ok(listener)
}

/// The hidden name [`bind`] binds `path` under first: `.<name>.new` next
/// to it. `None` for a path without a file name.
fn staging_path(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let mut staged = std::ffi::OsString::from(".");
    staged.push(name);
    staged.push(".new");
    Some(path.with_file_name(staged))
}

/// Removes a socket file this process bound; a missing file is fine, any
/// other failure is logged (there is nobody to return it to at shutdown).
pub fn remove_socket(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(socket = %path.display(), error = %e, "cannot remove socket"),
    }
}

#[cfg(test)]
mod tests;
