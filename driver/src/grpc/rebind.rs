//! Noticing that the plugin's sockets were taken away under it, and binding
//! them again.
//!
//! Node cleanup scripts and kubelet reinstalls remove kubelet's directories
//! (`plugins_registry`, `plugins/<driver>`) while the plugin runs. The
//! listening sockets then still accept nothing anyone can reach, and
//! kubelet, which learns of plugins only from the files in its registrar
//! directory, never calls the plugin again. A [`Watcher`] looks at both
//! socket paths every few seconds: a socket file that is gone, or is
//! another file than the one this instance bound (a different device and
//! inode), is bound again: the directories recreated (0750), a fresh
//! socket bound (mode 0600, renamed into place) and handed to the running
//! server, whose accept loop switches to it ([`incoming`]). A new DRA
//! socket always comes with a new registration socket, since kubelet finds
//! the DRA socket through the registration. Calls in flight and the
//! prepared claims are not touched: only the listeners change.
//!
//! It never takes a socket from a live server: a file there that answers
//! connections belongs to someone else (refused with a warning, looked at
//! again on the next pass), and when the DRA socket's lock file went with
//! its directory, the lock is taken again first, so a second instance that
//! started meanwhile keeps the sockets.
//!
//! Polling, not inotify: inotify cannot watch a directory that does not
//! exist yet, and would need a watch on every ancestor to see the
//! directory come back; one `lstat` per socket every few seconds costs
//! nothing.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::Stream;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

use super::authority::AuthorityFix;
use super::{Error, instance};
use crate::sockets::{self, SocketLock};

/// How often the socket paths are looked at, by default.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// Which file a path names: its device and inode; `None` when there is
/// nothing there (or it cannot be looked at).
pub fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// A listener a running server accepts on, which [`Watcher`] can replace.
pub(crate) struct Listening {
    path: PathBuf,
    id: Option<(u64, u64)>,
    listener: watch::Sender<Arc<UnixListener>>,
}

impl Listening {
    /// `listener`, bound at `path`, and the receiver [`incoming`] accepts
    /// from.
    pub(crate) fn new(
        path: PathBuf,
        listener: UnixListener,
    ) -> (Self, watch::Receiver<Arc<UnixListener>>) {
        let id = identity(&path);
        let (tx, rx) = watch::channel(Arc::new(listener));
        (
            Self {
                path,
                id,
                listener: tx,
            },
            rx,
        )
    }

    /// Whether the file at the path is still the socket bound.
    fn in_place(&self) -> bool {
        self.id.is_some() && identity(&self.path) == self.id
    }

    /// Binds the path again in `dir` and hands the listener to the server.
    /// This server's own socket, still in place, is replaced; anyone
    /// else's only when it is stale.
    async fn rebind(&mut self, dir: &Path) -> Result<(), Error> {
        sockets::ensure_dir(dir)?;
        if self.in_place() {
            sockets::remove_socket(&self.path);
        } else {
            sockets::clear_stale(&self.path).await?;
        }
        let listener = sockets::bind(&self.path)?;
        self.id = identity(&self.path);
        self.listener.send_replace(Arc::new(listener));
        Ok(())
    }
}

/// Accepted connections, each behind the `:authority` fix, from whichever
/// listener `listeners` holds now.
pub(crate) fn incoming(
    listeners: watch::Receiver<Arc<UnixListener>>,
) -> impl Stream<Item = Result<AuthorityFix<UnixStream>, std::io::Error>> {
    futures::stream::unfold(listeners, |mut listeners| async move {
        loop {
            let listener = listeners.borrow_and_update().clone();
            tokio::select! {
                conn = listener.accept() => {
                    let conn = conn.map(|(stream, _)| AuthorityFix::new(stream));
                    return Some((conn, listeners));
                }
                changed = listeners.changed() => {
                    if changed.is_err() {
                        // No watcher any more: this listener for good.
                        let conn = listener.accept().await;
                        let conn = conn.map(|(stream, _)| AuthorityFix::new(stream));
                        return Some((conn, listeners));
                    }
                }
            }
        }
    })
}

/// Looks after both sockets of a running server (see the module docs).
pub(crate) struct Watcher {
    pub(crate) registration: Listening,
    pub(crate) dra: Listening,
    pub(crate) registrar_dir: PathBuf,
    pub(crate) dra_dir: PathBuf,
    /// The DRA socket's lock file as this instance holds it.
    pub(crate) lock_id: Option<(u64, u64)>,
    /// Whether the lock is removed when dropped (per-instance names).
    pub(crate) instance: bool,
    /// Set once this instance serves: then the serving link (per-instance
    /// names) names it again after the DRA directory is recreated.
    pub(crate) serving: Arc<AtomicBool>,
    pub(crate) interval: Duration,
}

impl Watcher {
    /// Checks the sockets every interval, for good (the server aborts the
    /// task when it stops).
    pub(crate) async fn run(mut self) {
        // Locks taken again after the directory went; held from then on.
        let mut relocked = None;
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            match self.check().await {
                Ok(Some(lock)) => relocked = Some(lock),
                Ok(None) => {}
                Err(Error::Locked { path }) => {
                    tracing::warn!(lock = %path.display(), "the DRA socket was removed and another plugin instance holds its lock now; leaving the sockets to it");
                    drop(relocked);
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?self.interval, "cannot bind the kubelet plugin sockets again");
                }
            }
        }
    }

    /// One pass: rebinds what is gone. Returns a lock taken again.
    async fn check(&mut self) -> Result<Option<SocketLock>, Error> {
        let dra_ok = self.dra.in_place();
        if dra_ok && self.registration.in_place() {
            return Ok(None);
        }
        let mut lock = None;
        if !dra_ok {
            tracing::warn!(socket = %self.dra.path.display(), "the DRA socket is gone or replaced; binding it again");
            sockets::ensure_dir(&self.dra_dir)?;
            let lock_path = sockets::lock_path(&self.dra.path);
            if identity(&lock_path) != self.lock_id {
                let mut taken = SocketLock::acquire(&self.dra.path)?;
                if self.instance {
                    taken = taken.removed_on_drop();
                }
                self.lock_id = identity(taken.path());
                lock = Some(taken);
            }
            self.dra.rebind(&self.dra_dir).await?;
            if self.serving.load(Ordering::Acquire)
                && let Err(e) = instance::point_serving_link(&self.dra_dir, &self.dra.path)
            {
                tracing::warn!(dir = %self.dra_dir.display(), error = %e, "cannot point the serving link at this instance again");
            }
        }
        // Kubelet finds a new DRA socket through a new registration.
        if !dra_ok || !self.registration.in_place() {
            tracing::warn!(socket = %self.registration.path.display(), "the registration socket is gone or replaced; binding it again so that kubelet registers the plugin anew");
            self.registration.rebind(&self.registrar_dir).await?;
            tracing::info!(
                registration = %self.registration.path.display(),
                dra = %self.dra.path.display(),
                "kubelet plugin sockets bound again"
            );
        }
        Ok(lock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watcher(dir: &Path) -> (Watcher, [watch::Receiver<Arc<UnixListener>>; 2]) {
        let reg_dir = dir.join("reg");
        let dra_dir = dir.join("plugins/d");
        sockets::ensure_dir(&reg_dir).unwrap();
        sockets::ensure_dir(&dra_dir).unwrap();
        let reg_path = reg_dir.join("d-reg.sock");
        let dra_path = dra_dir.join("dra.sock");
        let lock = SocketLock::acquire(&dra_path).unwrap();
        let (registration, reg_rx) =
            Listening::new(reg_path.clone(), sockets::bind(&reg_path).unwrap());
        let (dra, dra_rx) = Listening::new(dra_path.clone(), sockets::bind(&dra_path).unwrap());
        let w = Watcher {
            registration,
            dra,
            registrar_dir: reg_dir,
            dra_dir,
            lock_id: identity(lock.path()),
            instance: false,
            serving: Arc::new(AtomicBool::new(true)),
            interval: Duration::from_millis(10),
        };
        std::mem::forget(lock);
        (w, [reg_rx, dra_rx])
    }

    #[tokio::test]
    async fn sockets_in_place_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, [reg_rx, dra_rx]) = watcher(dir.path());
        assert!(w.check().await.unwrap().is_none());
        assert!(!reg_rx.has_changed().unwrap());
        assert!(!dra_rx.has_changed().unwrap());
    }

    #[tokio::test]
    async fn removed_directories_are_recreated_and_both_sockets_bound_again() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, [reg_rx, dra_rx]) = watcher(dir.path());
        std::fs::remove_dir_all(dir.path().join("plugins")).unwrap();
        let lock = w.check().await.unwrap();
        assert!(lock.is_some(), "the lock went with the directory");
        assert!(reg_rx.has_changed().unwrap());
        assert!(dra_rx.has_changed().unwrap());
        for p in [&w.dra.path, &w.registration.path] {
            UnixStream::connect(p).await.unwrap();
        }
        assert!(w.check().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_removed_registration_socket_alone_is_bound_again() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, [reg_rx, dra_rx]) = watcher(dir.path());
        std::fs::remove_dir_all(dir.path().join("reg")).unwrap();
        assert!(w.check().await.unwrap().is_none());
        assert!(reg_rx.has_changed().unwrap());
        assert!(!dra_rx.has_changed().unwrap());
        UnixStream::connect(&w.registration.path).await.unwrap();
    }

    #[tokio::test]
    async fn a_live_socket_of_someone_else_is_never_taken() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, [reg_rx, _dra_rx]) = watcher(dir.path());
        let path = w.registration.path.clone();
        std::fs::remove_file(&path).unwrap();
        let _other = UnixListener::bind(&path).unwrap();
        let other_id = identity(&path);
        match w.check().await {
            Err(Error::SocketInUse { path: p }) => assert_eq!(p, path),
            other => panic!("{other:?}"),
        }
        assert_eq!(identity(&path), other_id);
        assert!(!reg_rx.has_changed().unwrap());
    }

    #[tokio::test]
    async fn incoming_switches_to_the_new_listener() {
        use futures::StreamExt;
        let dir = tempfile::tempdir().unwrap();
        let (mut w, [reg_rx, _dra_rx]) = watcher(dir.path());
        let mut conns = Box::pin(incoming(reg_rx));
        std::fs::remove_dir_all(dir.path().join("reg")).unwrap();
        w.check().await.unwrap();
        let _client = UnixStream::connect(&w.registration.path).await.unwrap();
        let accepted = tokio::time::timeout(Duration::from_secs(5), conns.next()).await;
        assert!(matches!(accepted, Ok(Some(Ok(_)))));
    }
}
