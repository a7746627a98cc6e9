//! [`Registrar`]: kubelet's plugin watcher and its reconciler. Looks at a
//! registrar directory once per pass ([`KubeletSim::with_reconcile_period`];
//! kubelet's reconciler runs once a second); a new socket is registered
//! (and retried every second while registration fails, as kubelet's
//! reconciler does), a deleted socket deregisters its plugin. Kubelet runs
//! one operation per socket path at a time, so a socket replaced under the
//! same name is deregistered on one pass and registered on the next, as
//! here. Plain files and names starting with `.` are ignored. Several
//! plugins of one driver may be registered at once (a rolling update); the
//! driver's plugin is then the one registered last, as kubelet picks it.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::plugin::Plugin;
use super::{Error, KubeletSim, REGISTER_RETRY};

/// What the watcher did.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RegistrarEvent {
    /// A plugin was registered.
    Registered(Plugin),
    /// A registration attempt failed; retried after a second either way.
    Rejected {
        /// The registration socket.
        socket: PathBuf,
        /// Why.
        reason: String,
        /// Whether the simulator refused the plugin and told it so
        /// (`NotifyRegistrationStatus` false). `false`: the attempt failed
        /// on the way, most often a `GetInfo` with no answer in time or a
        /// refused connection, which a retry may cure.
        told: bool,
    },
    /// A registration socket disappeared: its plugin is deregistered.
    Deregistered {
        /// The driver name.
        name: String,
        /// The registration socket.
        socket: PathBuf,
    },
}

/// A running plugin watcher. Dropping it stops the watcher.
#[derive(Debug)]
pub struct Registrar {
    events: mpsc::UnboundedReceiver<RegistrarEvent>,
    plugins: Arc<Mutex<Registered>>,
    task: JoinHandle<()>,
}

/// The registered plugins by registration socket, each with the number of
/// its registration (later registrations have higher numbers).
type Registered = BTreeMap<PathBuf, (u64, Plugin)>;

/// One socket the watcher has seen.
struct Seen {
    /// Its identity, to notice a socket replaced under the same name.
    id: Identity,
    /// When to try again after a failed registration (`None`: registered).
    retry_at: Option<Instant>,
}

impl KubeletSim {
    /// Watches `dir` and registers every plugin socket that appears.
    pub fn watch_registrar(&self, dir: impl Into<PathBuf>) -> Registrar {
        Registrar::start(self.clone(), dir.into())
    }
}

impl Registrar {
    pub(crate) fn start(sim: KubeletSim, dir: PathBuf) -> Self {
        let (tx, events) = mpsc::unbounded_channel();
        let plugins = Arc::new(Mutex::new(BTreeMap::new()));
        let task = tokio::spawn(watch(sim, dir, tx, Arc::clone(&plugins)));
        Self {
            events,
            plugins,
            task,
        }
    }

    /// The next event, or [`Error::Wait`] after `timeout`.
    pub async fn next_event(&mut self, timeout: Duration) -> Result<RegistrarEvent, Error> {
        match tokio::time::timeout(timeout, self.events.recv()).await {
            Ok(Some(e)) => Ok(e),
            Ok(None) => Err(Error::Unsupported("the registrar watcher stopped".into())),
            Err(_) => Err(Error::Wait(timeout, "a registrar event".into())),
        }
    }

    /// Waits until a plugin named `name` is registered. A rejection the
    /// plugin was told of is returned as an error at once; after any other
    /// failed attempt (most often a busy plugin missing GetInfo's 1 s
    /// deadline) it waits on for the watcher's retry, as kubelet retries,
    /// until `timeout`, whose error then names the last failure.
    pub async fn wait_registered(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<Plugin, Error> {
        let deadline = Instant::now() + timeout;
        let mut last_failure = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_event(left).await {
                Ok(RegistrarEvent::Registered(p)) if p.name == name => return Ok(p),
                Ok(RegistrarEvent::Rejected {
                    socket,
                    reason,
                    told: true,
                }) => {
                    return Err(Error::Rejected { socket, reason });
                }
                Ok(RegistrarEvent::Rejected {
                    socket,
                    reason,
                    told: false,
                }) => {
                    tracing::debug!(socket = %socket.display(), %reason, "GetInfo failed; retried");
                    last_failure = format!(" (last try at {}: {reason})", socket.display());
                }
                Ok(_) => {}
                Err(Error::Wait(..)) => {
                    return Err(Error::Wait(
                        timeout,
                        format!("plugin {name} to register{last_failure}"),
                    ));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits until the plugin named `name` is deregistered.
    pub async fn wait_deregistered(&mut self, name: &str, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_event(left).await {
                Ok(RegistrarEvent::Deregistered { name: n, .. }) if n == name => return Ok(()),
                Ok(_) => {}
                Err(Error::Wait(..)) => {
                    return Err(Error::Wait(timeout, format!("plugin {name} to deregister")));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The plugin of driver `name` kubelet would call: of those registered,
    /// the one registered last.
    pub fn plugin(&self, name: &str) -> Option<Plugin> {
        self.newest(name).map(|(_, p)| p)
    }

    /// [`plugin`](Self::plugin) with the number of its registration: the
    /// registrar counts registrations from 1, so a higher number is a
    /// later registration (of the same socket too).
    pub fn newest(&self, name: &str) -> Option<(u64, Plugin)> {
        let plugins = self.plugins.lock().expect("registrar state poisoned");
        plugins
            .values()
            .filter(|(_, p)| p.name == name)
            .max_by_key(|(n, _)| *n)
            .cloned()
    }
}

impl Drop for Registrar {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What tells one socket file from another at the same path: its inode
/// and its change time. The inode alone does not: a socket removed and
/// bound again at once (a plugin restarted, or handing over to its
/// successor) often gets the freed inode number back, and kubelet, which
/// watches the directory with inotify, sees the removal and the new socket
/// as two events all the same. The change time tells them apart where it
/// is finer than the time between the two binds: with Linux 6.13's
/// multigrain timestamps (ext4, tmpfs, xfs, btrfs) once this watcher has
/// looked at the file; on older kernels, when a clock tick lies between.
type Identity = (u64, i64, i64);

/// The sockets in `dir` with their identities.
fn list_sockets(dir: &Path) -> Result<BTreeMap<PathBuf, Identity>, Error> {
    let io = |source| Error::Io {
        path: dir.to_owned(),
        source,
    };
    let mut found = BTreeMap::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        // A directory that does not exist yet simply has no plugins.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(io(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io)?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        if meta.file_type().is_socket() {
            found.insert(entry.path(), (meta.ino(), meta.ctime(), meta.ctime_nsec()));
        }
    }
    Ok(found)
}

async fn watch(
    sim: KubeletSim,
    dir: PathBuf,
    tx: mpsc::UnboundedSender<RegistrarEvent>,
    plugins: Arc<Mutex<Registered>>,
) {
    let mut seen: BTreeMap<PathBuf, Seen> = BTreeMap::new();
    let mut registrations: u64 = 0;
    let mut ticker = tokio::time::interval(sim.reconcile_period);
    loop {
        ticker.tick().await;
        let sockets = match list_sockets(&dir) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the registrar directory");
                continue;
            }
        };
        // Deregister what disappeared (or was replaced).
        let gone: Vec<PathBuf> = seen
            .iter()
            .filter(|(p, s)| sockets.get(*p) != Some(&s.id))
            .map(|(p, _)| p.clone())
            .collect();
        for path in &gone {
            seen.remove(path);
            let removed = plugins
                .lock()
                .expect("registrar state poisoned")
                .remove(path);
            if let Some((_, p)) = removed {
                let _ = tx.send(RegistrarEvent::Deregistered {
                    name: p.name,
                    socket: path.clone(),
                });
            }
        }
        // Register what is new or due for a retry.
        let now = Instant::now();
        for (path, id) in sockets {
            // A path deregistered on this pass waits for the next one.
            let due = match seen.get(&path) {
                None => !gone.contains(&path),
                Some(s) => s.retry_at.is_some_and(|t| t <= now),
            };
            if !due {
                continue;
            }
            let event = match register(&sim, &path, &plugins).await {
                Ok(p) => {
                    registrations += 1;
                    plugins
                        .lock()
                        .expect("registrar state poisoned")
                        .insert(path.clone(), (registrations, p.clone()));
                    seen.insert(path, Seen { id, retry_at: None });
                    RegistrarEvent::Registered(p)
                }
                Err(e) => {
                    let (reason, told) = match e {
                        Error::Rejected { reason, .. } => (reason, true),
                        other => (other.to_string(), false),
                    };
                    seen.insert(
                        path.clone(),
                        Seen {
                            id,
                            retry_at: Some(Instant::now() + REGISTER_RETRY),
                        },
                    );
                    RegistrarEvent::Rejected {
                        socket: path,
                        reason,
                        told,
                    }
                }
            };
            if tx.send(event).is_err() {
                return;
            }
        }
    }
}

/// Registers one socket, refusing an endpoint another registered plugin
/// already uses (kubelet does not register the same endpoint twice).
async fn register(
    sim: &KubeletSim,
    path: &Path,
    plugins: &Mutex<Registered>,
) -> Result<Plugin, Error> {
    sim.register_checked(path, |endpoint| {
        let plugins = plugins.lock().expect("registrar state poisoned");
        match plugins
            .values()
            .map(|(_, p)| p)
            .find(|p| p.endpoint == endpoint && p.registration_socket != path)
        {
            Some(p) => Err(format!(
                "endpoint {} is already registered by {}",
                endpoint.display(),
                p.registration_socket.display()
            )),
            None => Ok(()),
        }
    })
    .await
}
