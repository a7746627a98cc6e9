//! MPS control daemons, started and supervised by the plugin itself (no
//! Deployment, so an MPS prepare waits only for the daemon's readiness).
//!
//! # How MPS works (facts this module relies on)
//! - `nvidia-cuda-mps-control -d` forks a control daemon into the background
//!   and returns. The daemon writes `nvidia-cuda-mps-control.pid` and listens
//!   on the UNIX socket `control` in `CUDA_MPS_PIPE_DIRECTORY` (default
//!   `/tmp/nvidia-mps`), and logs to `CUDA_MPS_LOG_DIRECTORY/control.log`
//!   (default `/var/log/nvidia-mps`). Commands are lines on the stdin of
//!   `nvidia-cuda-mps-control` run with the same pipe directory
//!   (`echo get_server_list | nvidia-cuda-mps-control`).
//! - A CUDA program finds the daemon through *its own*
//!   `CUDA_MPS_PIPE_DIRECTORY`; the daemon starts one `nvidia-cuda-mps-server`
//!   per user id (forked from the daemon: same environment, same mount
//!   namespace) and the clients talk to that server through sockets in the
//!   pipe directory and shared memory in `/dev/shm`. So a container needs
//!   the daemon's pipe directory *and* the daemon's `/dev/shm`.
//! - `CUDA_VISIBLE_DEVICES` of the daemon selects the devices its servers
//!   use, enumerated in that order.
//! - `set_default_active_thread_percentage` and
//!   `set_default_device_pinned_mem_limit <dev> <N>M` apply to servers
//!   started afterwards (a running server keeps its values) and are lost on
//!   `quit`; devices are named by ordinal ([`DaemonConfig::commands`] says why).
//!
//! # What the plugin does
//! Daemon `<id>` lives in `<mps-dir>/<id>/` (`--mps-dir`, default
//! `<state-dir>/mps`): `pipe/`, `log/`, `shm/`
//! and `daemon.json` (its [`DaemonConfig`], to restart it from). [`MpsControl::start`]
//! re-adopts a daemon whose pid file names a live `nvidia-cuda-mps-control`
//! (and re-applies the settings); otherwise it creates the directories,
//! empties the pipe directory (a dead daemon's socket and pid file; the
//! directory itself is kept, running containers bind-mount it), runs `-d`,
//! waits (bounded by [`Timeouts::ready`]) until the pid file names a live
//! daemon, `control` exists and the first setting's round trip succeeds
//! (`get_server_list` when there is none: a setting is safe to repeat, so
//! it doubles as the readiness probe), then sends the other settings, one
//! command per invocation. The daemon listens on a UNIX socket,
//! `<pipe>/control`, whose path cannot exceed [`MAX_SOCKET_PATH`] bytes: in
//! its own namespace it is `/tmp/nvidia-mps/control`, and the plugin's
//! client runs go through the launcher when the plugin-side path is longer
//! (a long `--state-dir`, as under microk8s's kubelet directory); without a
//! namespace of its own a daemon with a longer path is refused
//! ([`MpsError::SocketPathTooLong`]). A daemon that never gets ready is
//! killed and, on a first start, its directories removed once none of its
//! processes is left. So a daemon without a directory has no process, and
//! a first start skips the search for stale ones (a walk over every
//! process's environment). Daemons are not children of the plugin (`-d`
//! runs in a process group of its own and forks the daemon, which makes
//! its own session, into the background), so they outlive a plugin crash;
//! a new [`MpsControl`] on the same state directory finds them from their
//! pid files. A daemon the checkpoint records under another directory (the
//! plugin ran with another `--mps-dir` when it was started) is taken over
//! there ([`MpsControl::adopt_elsewhere`]) until it stops: changing the flag
//! neither orphans a daemon nor starts a second one for a memory-shared GPU.
//! Every daemon also carries [`procs::OWNER_ENV`], the plugin's state
//! directory: when checkpoint entries were lost, recovery finds this
//! plugin's daemons under an earlier `--mps-dir` that no record names by
//! that mark and kills them, or takes over those the text of a lost entry
//! names ([`MpsControl::stop_orphans_elsewhere`]).
//! [`MpsControl::check`] restarts a needed daemon that died; [`MpsControl::stop`]
//! sends `quit`, kills what is left (every process carrying the daemon's
//! [`procs::DAEMON_MARKER_ENV`]) and removes the directories.
//!
//! # `/dev/shm`: what is done, what a deployment needs
//! With [`ShmMode::PrivateMount`] (chosen when the plugin runs as root and
//! its launcher's trial works) the daemon is started through the plugin's
//! own program as launcher ([`launch`]: `gpu-kubelet-plugin mps-launch
//! <shm> <pipe> nvidia-cuda-mps-control -d` unshares its mount namespace,
//! makes it private, bind-mounts `<shm>` on `/dev/shm` and `<pipe>` on
//! `/tmp/nvidia-mps`, which the plugin made, and execs the control
//! program; one program start): the daemon and every server it forks
//! see the daemon's `shm/` as `/dev/shm` and its `pipe/` at
//! `/tmp/nvidia-mps`, which is exactly what [`MpsControl::container_edits`]
//! gives containers (`/dev/shm` and `/tmp/nvidia-mps` bind mounts,
//! `CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps`), so both sides use the same
//! paths, as with NVIDIA's driver. The mounts stay private to the daemon.
//! With [`ShmMode::Inherit`] (fallback, logged as a warning) the daemon
//! shares the plugin's `/dev/shm`, which is *not* the containers' one:
//! enough for the fake driver and unprivileged development, not for real
//! CUDA clients.
//!
//! A deployment needs: the plugin privileged (`CAP_SYS_ADMIN` for `unshare`
//! and `mount`; no shell or util-linux in its image) and a writable `/tmp`;
//! the MPS directory a hostPath at the same path as on the host (or the
//! `HostRoot` mapping), so the runtime mounts the very directories the
//! daemon uses; a reaper for the daemons, whose `-d` parent exits: the
//! chart's `--supervise` ([`crate::supervise`]) is the container's main
//! process and a child subreaper, so daemons outlive a crash of the plugin
//! process, not the container.
//! `shm/` is a plain directory on the MPS directory's filesystem, not a
//! tmpfs of its own (a tmpfs mounted by the plugin would be invisible to
//! the runtime without Bidirectional mount propagation). The Helm chart
//! puts the MPS directory under the host's `/run`, a tmpfs on systemd
//! hosts, which keeps shared memory off the disk; know that `/dev/shm`
//! writes of MPS containers are bounded only by that filesystem. A daemon
//! survives a crash or restart of the plugin *process*; a restart of the
//! plugin *container* kills every process in its cgroup, daemons included:
//! the startup [`MpsControl::check`] restarts them, and clients that were
//! connected to the old server get errors. Unless the daemons are not in
//! that cgroup: with [`MpsControl::with_host`] (`--mps-host-socket`) the
//! `-d` run, and so the daemon, is started by the MPS daemon host
//! ([`host`]) in a pod of its own, and the plugin's container can end (an
//! upgrade) under running MPS clients; everything but that one program start
//! stays here.
//!
//! # What the limits enforce, and what a hostile client can still do
//! - The daemon defaults (active thread percentage, pinned memory limit per
//!   device) are imposed by the MPS server on each client process; NVIDIA
//!   documents `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` in a client as only able
//!   to lower the daemon's value. Not verified on hardware here.
//! - Memory-fraction sharing gives each claim [`client_limit_edits`]:
//!   `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`
//!   in the container environment. They are read by the CUDA driver *inside*
//!   the client, so they bind cooperative programs only: a hostile container
//!   unsets them and gets whatever the daemon defaults allow (the whole GPU
//!   unless the daemon has a default limit). Each limit is also per process,
//!   not per container: N processes get N times the limit.
//! - The pipe directory, with the `control` socket, is in every container of
//!   the daemon, and `nvidia-cuda-mps-control` is mounted from the driver
//!   root (any client can also speak the protocol itself): a container
//!   running as the daemon's user (root, in most images) can `quit` the
//!   daemon (the supervisor restarts it; connected clients fail), change the
//!   defaults for servers started later, or target a running server's
//!   clients. The shared `/dev/shm` and pipe directory let containers of one
//!   daemon read and write each other's shared-memory files.
//! - One client's fatal GPU fault can take down the other clients of the
//!   same server (MPS has limited error containment). Only MIG isolates in
//!   hardware.

pub mod config;
pub(crate) mod exec;
pub mod host;
pub mod launch;
pub mod procs;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs;
use std::io::{self, ErrorKind};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

pub use config::{
    DaemonConfig, MAX_PINNED_LIMIT_MIB, parse_limit_mib, validate_id, validate_percentage,
    validate_uuid,
};

use super::capped::{Capped, read_capped};
use super::cdi::{ContainerEdits, HostRoot, Mount};
use super::checkpoint::MpsDaemonRecord;
use exec::{RunError, backoff, driver_env};

/// Where containers (and, with [`ShmMode::PrivateMount`], the daemon) see
/// the pipe directory: MPS's default, as NVIDIA's driver uses it.
pub const CONTAINER_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// The control program, relative to the driver root.
pub const CONTROL_PROGRAM: &str = "usr/bin/nvidia-cuda-mps-control";
/// The daemon's pid file in its pipe directory.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// The daemon's socket in its pipe directory.
pub const CONTROL_SOCKET: &str = "control";
/// The longest path a UNIX socket can be bound or connected at: `sun_path`
/// holds 108 bytes, the terminating NUL included. The real control daemon's
/// socket is `<pipe>/control`.
pub const MAX_SOCKET_PATH: usize = 107;
/// The daemon's settings file in its directory.
pub const CONFIG_FILE: &str = "daemon.json";
/// Where `-d`'s own output goes, in the log directory.
pub const START_OUTPUT: &str = "plugin-start.out";
/// Largest `daemon.json` read.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;
/// Why a private `/dev/shm` cannot be had without a launcher.
const NO_LAUNCHER: &str = "no launcher for a private mount namespace (only the gpu-kubelet-plugin and gpu-dra programs have one)";
/// The command that tells whether a daemon answers (it changes nothing).
const READY_PROBE: &str = "get_server_list";

/// Errors of MPS daemon management.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    /// The daemon id cannot be a directory name.
    #[error("invalid MPS daemon id {id:?}: {reason}")]
    InvalidId {
        /// The id given.
        id: String,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// A setting is out of range or malformed; nothing was started.
    #[error("invalid MPS settings for daemon {id}: {reason}")]
    InvalidConfig {
        /// The daemon.
        id: String,
        /// What is wrong.
        reason: String,
    },
    /// `nvidia-cuda-mps-control` is not in the driver root.
    #[error(
        "MPS control program {path} not found: check --driver-root (it must hold usr/bin/nvidia-cuda-mps-control)"
    )]
    ControlMissing {
        /// Where it was looked for (plugin side).
        path: PathBuf,
    },
    /// [`ShmMode::PrivateMount`] was required but cannot work here.
    #[error("cannot give MPS daemons their own /dev/shm: {reason}")]
    PrivateShmUnavailable {
        /// Why (not root, no launcher...).
        reason: String,
    },
    /// The daemon's socket path would be too long for a UNIX socket
    /// ([`ShmMode::Inherit`] only: a private mount namespace puts it at
    /// `/tmp/nvidia-mps/control`); nothing was created.
    #[error(
        "MPS daemon {id}: its control socket {path} would be {len} bytes long, over the {MAX_SOCKET_PATH} a UNIX socket path may have; shorten --state-dir, or run the plugin as root so daemons get {CONTAINER_PIPE_DIR} in a mount namespace of their own"
    )]
    SocketPathTooLong {
        /// The daemon.
        id: String,
        /// The socket's path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// A program could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// `nvidia-cuda-mps-control -d` failed or hung.
    #[error("starting MPS control daemon {id} failed: {output}")]
    StartFailed {
        /// The daemon.
        id: String,
        /// What `-d` printed (or why it was killed), and the control log.
        output: String,
    },
    /// The MPS daemon host could not be asked (`--mps-host-socket`).
    #[error("starting MPS control daemon {id}: {source}")]
    Host {
        /// The daemon.
        id: String,
        /// What failed.
        source: host::HostError,
    },
    /// The daemon exited before it was ready.
    #[error("MPS control daemon {id} (pid {pid}) exited during startup; control.log: {log}")]
    DaemonExited {
        /// The daemon.
        id: String,
        /// Its pid.
        pid: u32,
        /// The end of its control log.
        log: String,
    },
    /// The daemon did not answer in time; it was killed and a first
    /// start's directories removed.
    #[error(
        "MPS control daemon {id} not ready after {waited_ms} ms (killed; directories of a first start removed); control.log: {log}"
    )]
    NotReady {
        /// The daemon.
        id: String,
        /// How long readiness was awaited.
        waited_ms: u128,
        /// The end of its control log.
        log: String,
    },
    /// A control command was refused.
    #[error("MPS control command {command:?} for daemon {id} failed: {output}")]
    Command {
        /// The daemon.
        id: String,
        /// The command line sent.
        command: String,
        /// What the client printed.
        output: String,
    },
    /// A control command got no answer in time (the client was killed).
    #[error("MPS control command {command:?} for daemon {id} got no answer within {timeout_ms} ms")]
    CommandTimeout {
        /// The daemon.
        id: String,
        /// The command line sent.
        command: String,
        /// The timeout.
        timeout_ms: u128,
    },
    /// A daemon with this id runs for other devices.
    #[error(
        "MPS daemon {id} already runs for {running}, cannot serve {wanted} (CUDA_VISIBLE_DEVICES is fixed at start): stop it first"
    )]
    Conflict {
        /// The daemon.
        id: String,
        /// Its devices.
        running: String,
        /// The devices asked for.
        wanted: String,
    },
    /// A dead daemon cannot be restarted: its settings file is gone.
    #[error("MPS daemon {id} is not running and has no {path} to restart from")]
    NoRecord {
        /// The daemon.
        id: String,
        /// The missing settings file.
        path: PathBuf,
    },
    /// A settings file cannot be read back.
    #[error("MPS daemon settings {path}: {reason}")]
    BadRecord {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A daemon recorded under an earlier `--mps-dir` runs in a directory
    /// this plugin cannot see.
    #[error(
        "MPS daemon {id} runs (pids {pids:?}) in {dir}, under the MPS directory of an earlier plugin run (another --mps-dir), which this plugin cannot see: mount that directory into the plugin at the same path, or unprepare the claims that use the daemon first"
    )]
    Unreachable {
        /// The daemon.
        id: String,
        /// Its directory.
        dir: PathBuf,
        /// Its processes, found by their marker.
        pids: Vec<u32>,
    },
    /// Processes of a daemon survived SIGKILL.
    #[error("MPS daemon {id}: processes {pids:?} are still alive after SIGKILL")]
    StopFailed {
        /// The daemon.
        id: String,
        /// The survivors.
        pids: Vec<u32>,
    },
    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

impl From<exec::SetupError> for MpsError {
    fn from(e: exec::SetupError) -> Self {
        Self::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        }
    }
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> MpsError {
    let path = path.to_path_buf();
    move |source| MpsError::Io { op, path, source }
}

/// How a daemon gets its `/dev/shm` (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShmMode {
    /// Own mount namespace: `shm/` on `/dev/shm`, `pipe/` on `/tmp/nvidia-mps`.
    PrivateMount,
    /// The plugin's `/dev/shm` and the plugin-side pipe path (tests,
    /// unprivileged development; real CUDA clients in containers fail).
    Inherit,
}

impl ShmMode {
    /// [`ShmMode::PrivateMount`] when it works here (root, a `launcher`,
    /// and its trial bind mount in a private namespace succeeds), else
    /// [`ShmMode::Inherit`] with the reason. The launcher is a program
    /// that runs [`launch::run_if_asked`] first in `main` (the plugin's and
    /// `gpu-dra`'s).
    pub fn detect(launcher: Option<&Path>) -> (Self, Option<String>) {
        match private_mount_probe(launcher) {
            Ok(()) => (Self::PrivateMount, None),
            Err(reason) => (Self::Inherit, Some(reason)),
        }
    }
}

fn private_mount_probe(launcher: Option<&Path>) -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("the plugin does not run as root".into());
    }
    let launcher = launcher.ok_or(NO_LAUNCHER)?;
    if !Path::new("/dev/shm").is_dir() {
        return Err("/dev/shm is not a directory".into());
    }
    let mut cmd = Command::new(launcher);
    cmd.args(launch::Launch::Probe.args());
    driver_env(&mut cmd, Path::new("/"));
    match exec::run(&mut cmd, None, Duration::from_secs(5)) {
        Ok(ran) if ran.status.success() => Ok(()),
        Ok(ran) => Err(format!(
            "a trial bind mount in a private mount namespace failed: {}",
            ran.output()
        )),
        Err(e) => Err(format!("{} {e}", launcher.display())),
    }
}

/// Bounds on waiting for daemons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// From `-d` to a daemon answering commands.
    pub ready: Duration,
    /// One control command (also `-d` itself, which returns at once).
    pub command: Duration,
    /// From `quit` to the daemon's exit, before SIGKILL.
    pub stop: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            ready: Duration::from_secs(5),
            command: Duration::from_secs(5),
            stop: Duration::from_secs(5),
        }
    }
}

/// What [`MpsControl::check`] found for one daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// It runs.
    Running {
        /// Its pid.
        pid: u32,
    },
    /// It was dead and has been restarted with its recorded settings.
    Restarted(MpsDaemonRecord),
}

/// The directories and files of one daemon, plugin side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonDirs {
    /// `<mps-dir>/<id>`.
    pub root: PathBuf,
    /// `CUDA_MPS_PIPE_DIRECTORY` (plugin side).
    pub pipe: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`.
    pub log: PathBuf,
    /// The daemon's `/dev/shm`.
    pub shm: PathBuf,
    /// `daemon.json`.
    pub config: PathBuf,
}

impl DaemonDirs {
    /// The directories of daemon `id` (a checked id) in MPS directory
    /// `dir`.
    fn under(dir: &HostRoot, id: &str) -> Self {
        let root = dir.local(Path::new(id));
        Self {
            pipe: root.join("pipe"),
            log: root.join("log"),
            shm: root.join("shm"),
            config: root.join(CONFIG_FILE),
            root,
        }
    }

    fn pid_file(&self) -> PathBuf {
        self.pipe.join(PID_FILE)
    }

    /// The daemon's pid, when its pid file names a live daemon of this
    /// directory ([`procs::live_daemon_pid`]).
    fn live_pid(&self) -> Option<u32> {
        procs::live_daemon_pid(&self.pid_file(), &self.root)
    }

    fn control(&self) -> PathBuf {
        self.pipe.join(CONTROL_SOCKET)
    }
}

/// Starts, finds, supervises and stops MPS control daemons.
#[derive(Debug)]
pub struct MpsControl {
    driver_root: HostRoot,
    /// `--mps-dir`: one directory per daemon.
    dir: HostRoot,
    timeouts: Timeouts,
    /// Detected at the first daemon start (one process start: kept off
    /// the plugin's start path), unless forced.
    shm_mode: std::sync::OnceLock<ShmMode>,
    /// The program that starts a daemon in its own mount namespace.
    launcher: Option<PathBuf>,
    locks: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Daemons that live under another MPS directory than `dir`, by id:
    /// started by an earlier plugin run with another `--mps-dir` and taken
    /// over from the checkpoint ([`MpsControl::adopt_elsewhere`]); each
    /// entry goes when its daemon is stopped.
    elsewhere: Mutex<HashMap<String, PathBuf>>,
    /// Set on every daemon as [`procs::OWNER_ENV`]: the plugin's state
    /// directory, so its daemons are found by process even where no record
    /// or directory names them ([`MpsControl::stop_orphans_elsewhere`]).
    owner: Option<PathBuf>,
    /// `--mps-host-socket`: daemons are started by the MPS daemon host
    /// listening there ([`host`]), in its container, not the plugin's.
    host: Option<PathBuf>,
}

impl MpsControl {
    /// Daemons run `<driver_root>/usr/bin/nvidia-cuda-mps-control` and live
    /// in `<dir>/<id>/{pipe,log,shm}`. The [`ShmMode`] is detected
    /// when first needed (a warning is logged when it falls back to
    /// [`ShmMode::Inherit`]).
    pub fn new(driver_root: HostRoot, dir: HostRoot) -> Self {
        Self {
            driver_root,
            dir,
            timeouts: Timeouts::default(),
            shm_mode: std::sync::OnceLock::new(),
            launcher: None,
            locks: Mutex::new(HashMap::new()),
            elsewhere: Mutex::new(HashMap::new()),
            owner: None,
            host: None,
        }
    }

    /// Marks every daemon started from now on as this `owner`'s (the
    /// plugin's state directory, which one plugin at a time holds).
    pub fn with_owner(mut self, owner: impl Into<PathBuf>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Has daemons started by the MPS daemon host at `socket` ([`host`]):
    /// they then live in the host's container and outlive the plugin's.
    pub fn with_host(mut self, socket: impl Into<PathBuf>) -> Self {
        self.host = Some(socket.into());
        self
    }

    /// Uses these timeouts.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// Starts daemons in a private mount namespace through `launcher`, a
    /// program that runs [`launch::run_if_asked`] first in its `main`
    /// (`/proc/self/exe` in the plugin). Without one, daemons get
    /// [`ShmMode::Inherit`].
    pub fn with_launcher(mut self, launcher: impl Into<PathBuf>) -> Self {
        self.launcher = Some(launcher.into());
        self
    }

    /// Forces a [`ShmMode`]; [`ShmMode::PrivateMount`] where it cannot work
    /// makes every start fail with [`MpsError::PrivateShmUnavailable`].
    pub fn with_shm_mode(mut self, mode: ShmMode) -> Self {
        self.shm_mode = std::sync::OnceLock::from(mode);
        self
    }

    /// The [`ShmMode`] daemons are started with (detected on first use).
    pub fn shm_mode(&self) -> ShmMode {
        *self.shm_mode.get_or_init(|| {
            let (mode, why) = ShmMode::detect(self.launcher.as_deref());
            if let Some(reason) = why {
                tracing::warn!(
                    %reason,
                    "MPS daemons will share the plugin's /dev/shm: containers of MPS claims cannot reach their servers' shared memory on real GPUs"
                );
            }
            mode
        })
    }

    /// The directories of daemon `id`.
    pub fn dirs(&self, id: &str) -> Result<DaemonDirs, MpsError> {
        checked_id(id)?;
        Ok(DaemonDirs::under(&self.root_of(id), id))
    }

    /// The host path of `<mps-dir>/<id>/<leaf>`, as CDI specs and records
    /// name it.
    fn host_path(&self, id: &str, leaf: &str) -> String {
        self.root_of(id).host_path(&Path::new(id).join(leaf))
    }

    /// The MPS directory daemon `id` lives in: `--mps-dir`, or the one it
    /// was recorded under by an earlier plugin run (seen at its host path).
    /// Borrowed (no copy) in the common case, on every prepare's path.
    fn root_of(&self, id: &str) -> Cow<'_, HostRoot> {
        match self.elsewhere().get(id) {
            Some(dir) => Cow::Owned(HostRoot::same(dir.clone())),
            None => Cow::Borrowed(&self.dir),
        }
    }

    /// The daemons taken over under another directory (a poisoned lock
    /// still holds a consistent map: each use is one map operation).
    fn elsewhere(&self) -> std::sync::MutexGuard<'_, HashMap<String, PathBuf>> {
        self.elsewhere
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn is_elsewhere(&self, id: &str) -> bool {
        self.elsewhere().contains_key(id)
    }

    fn forget_elsewhere(&self, id: &str) {
        self.elsewhere().remove(id);
    }

    /// The MPS directory (host path) a checkpoint's daemon record names, when
    /// it is not `--mps-dir`: the plugin ran with another `--mps-dir` when
    /// the daemon was started. `None`: the current directory, or a record
    /// from before the directories were recorded. The record comes from a
    /// file: its three directories must be `<dir>/<id>/{pipe,log,shm}` of
    /// one absolute, normalized `dir` (log and shm may be missing).
    pub fn recorded_elsewhere(
        &self,
        record: &MpsDaemonRecord,
    ) -> Result<Option<PathBuf>, MpsError> {
        checked_id(&record.id)?;
        if record.pipe_dir.as_os_str().is_empty() {
            return Ok(None);
        }
        let bad = |reason: String| MpsError::BadRecord {
            path: record.pipe_dir.clone(),
            reason: format!(
                "the checkpoint's record of MPS daemon {}: {reason}",
                record.id
            ),
        };
        let normal = |p: &Path| {
            p.is_absolute()
                && p.components()
                    .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        };
        let dir = record
            .pipe_dir
            .parent()
            .and_then(Path::parent)
            .filter(|d| normal(d))
            .ok_or_else(|| bad("the pipe directory is not <absolute dir>/<id>/pipe".into()))?;
        for (leaf, recorded) in [
            ("pipe", &record.pipe_dir),
            ("log", &record.log_dir),
            ("shm", &record.shm_dir),
        ] {
            let expected = dir.join(&record.id).join(leaf);
            if !(recorded.as_os_str().is_empty() && leaf != "pipe") && *recorded != expected {
                return Err(bad(format!(
                    "the {leaf} directory {} is not {}",
                    recorded.display(),
                    expected.display()
                )));
            }
        }
        // Spelled as components (`/a/./b/` is `/a/b`), as the marker is.
        let dir: PathBuf = dir.components().collect();
        Ok((dir != self.dir.host).then_some(dir))
    }

    /// Takes over daemon `id` under `dir` (from
    /// [`MpsControl::recorded_elsewhere`]), seen at that path: `start` (the
    /// claims of a memory-shared GPU join it), `check`, `stop`, its records
    /// and container edits use that directory until the daemon is stopped;
    /// daemons started later go under `--mps-dir`. Where this plugin cannot
    /// see `dir` (not mounted in its container), a start or check finds
    /// whether any process of the daemon is left by its marker, and `stop`
    /// kills them by it.
    pub fn adopt_elsewhere(&self, id: &str, dir: PathBuf) {
        self.elsewhere().insert(id.to_owned(), dir);
    }

    /// The directories to start or check daemon `id` in. A daemon taken
    /// over under a directory this plugin cannot see is forgotten when none
    /// of its processes is left, so it starts afresh under `--mps-dir`;
    /// while one runs, that is [`MpsError::Unreachable`] (a second daemon
    /// for its devices would fight it).
    fn usable_dirs(&self, id: &str) -> Result<DaemonDirs, MpsError> {
        checked_id(id)?;
        // The map first, looked at once: a daemon under --mps-dir (every
        // start on a prepare's path) needs no look at the file system here.
        let Some(dir) = self.elsewhere().get(id).cloned() else {
            return Ok(DaemonDirs::under(&self.dir, id));
        };
        let dirs = DaemonDirs::under(&HostRoot::same(dir), id);
        if dirs.root.exists() {
            return Ok(dirs);
        }
        let pids = procs::daemon_processes(&dirs.root);
        if !pids.is_empty() {
            return Err(MpsError::Unreachable {
                id: id.to_owned(),
                dir: dirs.root,
                pids,
            });
        }
        tracing::warn!(
            daemon = %id,
            dir = %dirs.root.display(),
            "MPS daemon of an earlier --mps-dir, in a directory this plugin cannot see, is gone; it starts afresh under --mps-dir"
        );
        self.forget_elsewhere(id);
        Ok(DaemonDirs::under(&self.dir, id))
    }

    fn control_program(&self) -> Result<PathBuf, MpsError> {
        let path = self.driver_root.local(Path::new(CONTROL_PROGRAM));
        if path.is_file() {
            Ok(path)
        } else {
            Err(MpsError::ControlMissing { path })
        }
    }

    /// The program that gives a daemon a mount namespace of its own.
    fn launcher(&self) -> Result<&Path, MpsError> {
        self.launcher
            .as_deref()
            .ok_or_else(|| MpsError::PrivateShmUnavailable {
                reason: NO_LAUNCHER.into(),
            })
    }

    /// A command that runs `program args...` through the launcher, in a
    /// mount namespace of its own where the daemon's `shm/` is `/dev/shm`
    /// and its `pipe/` is [`CONTAINER_PIPE_DIR`] (made here if missing:
    /// the new namespace starts as a copy of the plugin's, same `/tmp`).
    fn in_namespace(
        &self,
        dirs: &DaemonDirs,
        program: &Path,
        args: &[&str],
    ) -> Result<Command, MpsError> {
        let launcher = self.launcher()?;
        launch::Launch::Daemon {
            shm: dirs.shm.clone(),
            pipe: dirs.pipe.clone(),
            program: program.to_path_buf(),
            args: args.iter().map(Into::into).collect(),
        }
        .command(launcher)
        .map_err(io_err("create mount point", Path::new(CONTAINER_PIPE_DIR)))
    }

    /// A client run of the control program for the daemon of `dirs`:
    /// directly, with the plugin-side pipe directory, when its socket path
    /// fits a UNIX socket; otherwise (a long state directory; only a
    /// daemon in its own namespace can have one, see [`MpsError::SocketPathTooLong`])
    /// through the launcher, which puts the pipe directory at
    /// [`CONTAINER_PIPE_DIR`], where the daemon itself and containers see it.
    fn client(&self, program: &Path, dirs: &DaemonDirs) -> Result<Command, MpsError> {
        let (mut cmd, pipe_env) =
            if socket_path_fits(&dirs.control()) || self.shm_mode() != ShmMode::PrivateMount {
                (Command::new(program), dirs.pipe.as_path())
            } else {
                (
                    self.in_namespace(dirs, program, &[])?,
                    Path::new(CONTAINER_PIPE_DIR),
                )
            };
        // First: it clears the environment.
        driver_env(&mut cmd, &self.driver_root.path);
        cmd.env("CUDA_MPS_PIPE_DIRECTORY", pipe_env)
            .env("CUDA_MPS_LOG_DIRECTORY", &dirs.log);
        Ok(cmd)
    }

    fn lock_for(&self, id: &str) -> Arc<Mutex<()>> {
        let mut map = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        map.entry(id.to_owned()).or_default().clone()
    }

    /// Drops the lock entry of `id` when nobody else holds it (so the map
    /// does not grow with every daemon ever stopped).
    fn forget_lock(&self, id: &str, mine: &Arc<Mutex<()>>) {
        let mut map = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        if Arc::strong_count(mine) <= 2 {
            map.remove(id);
        }
    }

    /// Starts daemon `cfg.id`, or re-adopts it when it already runs (its
    /// devices must match) and re-applies the settings.
    pub fn start(&self, cfg: &DaemonConfig) -> Result<MpsDaemonRecord, MpsError> {
        cfg.validate()?;
        let lock = self.lock_for(&cfg.id);
        let _held = lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.start_locked(cfg)
    }

    fn start_locked(&self, cfg: &DaemonConfig) -> Result<MpsDaemonRecord, MpsError> {
        let dirs = self.usable_dirs(&cfg.id)?;
        let program = self.control_program()?;
        if let Some(pid) = dirs.live_pid() {
            // Rewritten only when it changes: a memory-shared GPU's daemon
            // is re-adopted by every claim that joins it, and a file made
            // and renamed on disk each time is an inode allocation and a
            // journal entry for nothing.
            let unchanged = match read_config(&dirs) {
                Ok(Some(running)) if running.gpu_uuids != cfg.gpu_uuids => {
                    return Err(MpsError::Conflict {
                        id: cfg.id.clone(),
                        running: running.visible_devices(),
                        wanted: cfg.visible_devices(),
                    });
                }
                Ok(running) => running.as_ref() == Some(cfg),
                Err(e) => {
                    tracing::warn!(
                        daemon = %cfg.id,
                        pid,
                        error = %e,
                        "settings file of a running MPS daemon unreadable; re-adopting it and rewriting the file"
                    );
                    false
                }
            };
            if !unchanged {
                write_config(&dirs, cfg)?;
            }
            self.apply(&program, &dirs, &cfg.id, &cfg.commands()?)?;
            tracing::info!(daemon = %cfg.id, pid, "re-adopted running MPS control daemon");
            return Ok(self.record(cfg, pid));
        }
        // Refused before anything is made: such a daemon could never bind
        // its socket (in its own namespace it is at /tmp/nvidia-mps).
        let socket = dirs.control();
        if !socket_path_fits(&socket) && self.shm_mode() == ShmMode::Inherit {
            return Err(MpsError::SocketPathTooLong {
                id: cfg.id.clone(),
                len: socket.as_os_str().len(),
                path: socket,
            });
        }
        let first_start = !dirs.root.exists();
        let started = Instant::now();
        match self.launch(&program, &dirs, cfg, first_start) {
            Ok(pid) => {
                tracing::info!(
                    daemon = %cfg.id,
                    pid,
                    devices = %cfg.visible_devices(),
                    shm = ?self.shm_mode(),
                    elapsed_us = crate::micros(started),
                    "started MPS control daemon"
                );
                Ok(self.record(cfg, pid))
            }
            Err(e) => {
                // The directories go only once no process of the daemon is
                // left: a missing directory means none runs (see `launch`).
                match Self::kill_all(&cfg.id, &dirs) {
                    Err(cleanup) => {
                        tracing::error!(daemon = %cfg.id, error = %cleanup, "cleanup after a failed MPS start; its directories are kept");
                    }
                    Ok(()) => {
                        if first_start && let Err(rm) = fs::remove_dir_all(&dirs.root) {
                            tracing::error!(daemon = %cfg.id, path = %dirs.root.display(), error = %rm, "cannot remove the directories of a failed MPS start");
                        }
                    }
                }
                Err(e)
            }
        }
    }

    fn record(&self, cfg: &DaemonConfig, pid: u32) -> MpsDaemonRecord {
        let host = |leaf: &str| PathBuf::from(self.host_path(&cfg.id, leaf));
        MpsDaemonRecord {
            id: cfg.id.clone(),
            pipe_dir: host("pipe"),
            pid: Some(pid),
            log_dir: host("log"),
            shm_dir: host("shm"),
            gpu_uuids: cfg.gpu_uuids.clone(),
        }
    }

    /// Creates the directories, runs `-d`, waits for readiness, applies the
    /// settings.
    ///
    /// `first_start`: the daemon's directory did not exist, so no process
    /// of it can be left (its directories are removed only after
    /// [`Self::kill_all`] found none), and the walk over every process's
    /// environment in `/proc` (thousands of reads on a busy node) is
    /// skipped.
    fn launch(
        &self,
        program: &Path,
        dirs: &DaemonDirs,
        cfg: &DaemonConfig,
        first_start: bool,
    ) -> Result<u32, MpsError> {
        for (dir, mode) in [
            (&dirs.root, 0o755),
            (&dirs.pipe, 0o755),
            (&dirs.log, 0o755),
            (&dirs.shm, 0o1777),
        ] {
            fs::create_dir_all(dir).map_err(io_err("create dir", dir))?;
            fs::set_permissions(dir, fs::Permissions::from_mode(mode))
                .map_err(io_err("chmod", dir))?;
        }
        // Stale processes of this daemon directory (a start that crashed
        // half-way) and a dead daemon's socket and pid file go first.
        if !first_start {
            Self::kill_all(&cfg.id, dirs)?;
        }
        clear_dir(&dirs.pipe)?;
        write_config(dirs, cfg)?;

        let out_path = dirs.log.join(START_OUTPUT);
        // The launch, and the pipe directory the daemon sees.
        let private = match self.shm_mode() {
            ShmMode::PrivateMount => {
                // The daemon's /dev/shm is mounted over: what it needs
                // afterwards (its program, log and pipe directories) must
                // not be under /dev/shm.
                for (what, path) in [
                    ("MPS directory", &dirs.root),
                    ("driver root", &self.driver_root.path),
                ] {
                    if path.starts_with("/dev/shm") {
                        return Err(MpsError::PrivateShmUnavailable {
                            reason: format!(
                                "the {what} {} is under /dev/shm, which an MPS daemon gets replaced by its own shm directory; move it (--mps-dir, --container-driver-root)",
                                path.display()
                            ),
                        });
                    }
                }
                true
            }
            ShmMode::Inherit => false,
        };
        let pipe_env = if private {
            Path::new(CONTAINER_PIPE_DIR)
        } else {
            dirs.pipe.as_path()
        };
        // The daemon's whole environment; paths as they are (the markers
        // are compared byte for byte).
        let mut env: BTreeMap<String, OsString> = exec::driver_env_vars(&self.driver_root.path)
            .into_iter()
            .map(|(k, v)| (k, v.into()))
            .collect();
        if let Some(owner) = &self.owner {
            env.insert(procs::OWNER_ENV.into(), owner.into());
        }
        for (key, value) in [
            ("CUDA_MPS_PIPE_DIRECTORY", pipe_env),
            ("CUDA_MPS_LOG_DIRECTORY", dirs.log.as_path()),
            (procs::DAEMON_MARKER_ENV, dirs.root.as_path()),
        ] {
            env.insert(key.into(), value.into());
        }
        env.insert("CUDA_VISIBLE_DEVICES".into(), cfg.visible_devices().into());
        let outcome = match &self.host {
            Some(socket) => {
                // JSON carries text: a path that is not UTF-8 cannot be sent.
                let env = env
                    .into_iter()
                    .map(|(k, v)| v.into_string().map(|v| (k, v)))
                    .collect::<Result<BTreeMap<_, _>, _>>()
                    .map_err(|v| MpsError::InvalidConfig {
                        id: cfg.id.clone(),
                        reason: format!(
                            "{} is not UTF-8, which the MPS daemon host's requests need",
                            v.display()
                        ),
                    })?;
                let request = host::StartRequest {
                    program: program.to_path_buf(),
                    private_mount: private.then(|| host::PrivateMount {
                        shm: dirs.shm.clone(),
                        pipe: dirs.pipe.clone(),
                    }),
                    env,
                    output: out_path.clone(),
                    timeout_ms: u64::try_from(
                        self.timeouts
                            .command
                            .min(host::MAX_TIMEOUT)
                            .as_millis()
                            .max(1),
                    )
                    .unwrap_or(1),
                    multi_user: cfg.multi_user,
                };
                host::request_start(socket, &request).map_err(|source| MpsError::Host {
                    id: cfg.id.clone(),
                    source,
                })?
            }
            None => self.run_start(program, dirs, private, &env, &out_path, cfg.multi_user)?,
        };
        match outcome {
            ok @ host::Outcome::Exited { .. } if ok.success() => {}
            host::Outcome::TimedOut => {
                return Err(MpsError::StartFailed {
                    id: cfg.id.clone(),
                    output: format!(
                        "`-d` did not return within {} ms and was killed",
                        self.timeouts.command.as_millis()
                    ),
                });
            }
            host::Outcome::Failed { error } => {
                return Err(MpsError::StartFailed {
                    id: cfg.id.clone(),
                    output: format!("the MPS daemon host refused or could not run it: {error}"),
                });
            }
            ended @ host::Outcome::Exited { .. } => {
                let printed = fs::read_to_string(&out_path).unwrap_or_default();
                return Err(MpsError::StartFailed {
                    id: cfg.id.clone(),
                    output: format!("{ended}: {}", exec::combine(&printed, "")),
                });
            }
        }
        // The first setting is the readiness probe (one client run less per
        // start); a daemon without settings is probed with `get_server_list`.
        let commands = cfg.commands()?;
        let (probe, rest) = match commands.split_first() {
            Some((first, rest)) => (first.as_str(), rest),
            None => (READY_PROBE, &[][..]),
        };
        let pid = self.wait_ready(program, dirs, cfg, probe)?;
        self.apply(program, dirs, &cfg.id, rest)?;
        Ok(pid)
    }

    /// Runs `-d` in the plugin's own container (no `--mps-host-socket`),
    /// with `env` as its whole environment and its output in `out_path`.
    fn run_start(
        &self,
        program: &Path,
        dirs: &DaemonDirs,
        private: bool,
        env: &BTreeMap<String, OsString>,
        out_path: &Path,
        multi_user: bool,
    ) -> Result<host::Outcome, MpsError> {
        let private = if private {
            Some((self.launcher()?, dirs.shm.as_path(), dirs.pipe.as_path()))
        } else {
            None
        };
        let mut cmd = exec::daemon_start(program, private, env, out_path, multi_user)?;
        let mut child = exec::spawn(&mut cmd).map_err(|source| MpsError::Spawn {
            program: program.to_path_buf(),
            source,
        })?;
        let deadline = Instant::now() + self.timeouts.command;
        let waited = exec::wait_until(&mut child, deadline).map_err(io_err("wait for", program))?;
        if let Some(status) = waited {
            Ok(host::Outcome::Exited {
                code: status.code(),
                signal: status.signal(),
            })
        } else {
            let _ = child.kill();
            let _ = child.wait();
            Ok(host::Outcome::TimedOut)
        }
    }

    /// Waits until the pid file names a live daemon, `control` exists and
    /// `probe` (a command safe to repeat) succeeds. A probe that fails while
    /// the daemon answers [`READY_PROBE`] was refused, not early: its error
    /// is returned at once instead of waiting out [`Timeouts::ready`].
    fn wait_ready(
        &self,
        program: &Path,
        dirs: &DaemonDirs,
        cfg: &DaemonConfig,
        probe: &str,
    ) -> Result<u32, MpsError> {
        let begun = Instant::now();
        let deadline = begun + self.timeouts.ready;
        let mut attempt = 0;
        loop {
            if let Some(pid) = dirs.live_pid() {
                if fs::symlink_metadata(dirs.control()).is_ok() {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match self.send(program, dirs, &cfg.id, probe, left) {
                        Ok(_) => {
                            tracing::debug!(daemon = %cfg.id, command = %probe, "MPS daemon ready");
                            return Ok(pid);
                        }
                        Err(refused @ MpsError::Command { .. })
                            if probe != READY_PROBE
                                && self.send(program, dirs, &cfg.id, READY_PROBE, left).is_ok() =>
                        {
                            return Err(refused);
                        }
                        Err(_) => {}
                    }
                }
            } else if let Some(pid) = read_pid(&dirs.pid_file())
                && !procs::is_alive(pid)
            {
                return Err(MpsError::DaemonExited {
                    id: cfg.id.clone(),
                    pid,
                    log: log_tail(dirs),
                });
            }
            if Instant::now() >= deadline {
                return Err(MpsError::NotReady {
                    id: cfg.id.clone(),
                    waited_ms: begun.elapsed().as_millis(),
                    log: log_tail(dirs),
                });
            }
            thread::sleep(backoff(attempt));
            attempt += 1;
        }
    }

    /// Sends `commands` (settings) to daemon `id`, one per client invocation.
    fn apply(
        &self,
        program: &Path,
        dirs: &DaemonDirs,
        id: &str,
        commands: &[String],
    ) -> Result<(), MpsError> {
        for command in commands {
            self.send(program, dirs, id, command, self.timeouts.command)?;
            tracing::debug!(daemon = %id, %command, "MPS setting applied");
        }
        Ok(())
    }

    /// Runs one control command; `command` is a validated single line.
    fn send(
        &self,
        program: &Path,
        dirs: &DaemonDirs,
        id: &str,
        command: &str,
        timeout: Duration,
    ) -> Result<String, MpsError> {
        debug_assert!(!command.contains('\n'));
        let mut cmd = self.client(program, dirs)?;
        let line = format!("{command}\n");
        match exec::run(&mut cmd, Some(line.as_bytes()), timeout) {
            Ok(ran) if ran.status.success() => Ok(ran.stdout),
            Ok(ran) => Err(MpsError::Command {
                id: id.to_owned(),
                command: command.to_owned(),
                output: format!("{}: {}", ran.status, ran.output()),
            }),
            Err(RunError::TimedOut) => Err(MpsError::CommandTimeout {
                id: id.to_owned(),
                command: command.to_owned(),
                timeout_ms: timeout.as_millis(),
            }),
            Err(RunError::Spawn(source)) => Err(MpsError::Spawn {
                program: program.to_path_buf(),
                source,
            }),
            Err(RunError::Wait(source)) => Err(MpsError::Io {
                op: "wait for",
                path: program.to_path_buf(),
                source,
            }),
        }
    }

    /// Whether daemon `id` runs (its pid file names a live control daemon).
    pub fn is_running(&self, id: &str) -> bool {
        self.pid(id).is_some()
    }

    /// The pid of daemon `id`, when it runs.
    pub fn pid(&self, id: &str) -> Option<u32> {
        let dirs = self.dirs(id).ok()?;
        dirs.live_pid()
    }

    /// The settings daemon `id` was last started with, from its directory.
    pub fn config(&self, id: &str) -> Result<Option<DaemonConfig>, MpsError> {
        read_config(&self.dirs(id)?)
    }

    /// Kills every process of daemon `id` (by its marker: the pid file's
    /// daemon counts only when it carries it too) and waits until they are
    /// gone.
    fn kill_all(id: &str, dirs: &DaemonDirs) -> Result<(), MpsError> {
        let pids = procs::daemon_processes(&dirs.root);
        kill_and_wait(pids).map_err(|pids| MpsError::StopFailed {
            id: id.to_owned(),
            pids,
        })
    }

    /// Stops daemon `id`: `quit`, SIGKILL after [`Timeouts::stop`] (and for
    /// any MPS server left), then removes its directories. An unknown id is
    /// a success.
    pub fn stop(&self, id: &str) -> Result<(), MpsError> {
        // Before a lock entry is made for it.
        checked_id(id)?;
        let lock = self.lock_for(id);
        let held = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let result = self.dirs(id).and_then(|dirs| self.stop_locked(id, &dirs));
        if result.is_ok() {
            self.forget_elsewhere(id);
        }
        drop(held);
        self.forget_lock(id, &lock);
        result
    }

    fn stop_locked(&self, id: &str, dirs: &DaemonDirs) -> Result<(), MpsError> {
        if !dirs.root.exists() {
            if self.is_elsewhere(id) {
                // Under an earlier --mps-dir this plugin cannot see: no
                // pid file or socket to reach, but its processes carry
                // the marker.
                Self::kill_all(id, dirs)?;
                tracing::warn!(
                    daemon = %id,
                    dir = %dirs.root.display(),
                    "stopped MPS daemon of an earlier --mps-dir by its marker; its directory, which this plugin cannot see, is left on the host"
                );
            }
            return Ok(());
        }
        if let Some(pid) = dirs.live_pid() {
            let quit = self
                .control_program()
                .and_then(|p| self.send(&p, dirs, id, "quit", self.timeouts.command));
            if let Err(e) = &quit {
                tracing::warn!(daemon = %id, pid, error = %e, "MPS quit failed; killing the daemon");
            }
            let deadline = Instant::now() + self.timeouts.stop;
            let mut attempt = 0;
            while quit.is_ok() && procs::is_alive(pid) && Instant::now() < deadline {
                thread::sleep(backoff(attempt));
                attempt += 1;
            }
            if procs::is_alive(pid) {
                tracing::warn!(daemon = %id, pid, "MPS control daemon did not exit after quit; killing it");
            }
        }
        Self::kill_all(id, dirs)?;
        fs::remove_dir_all(&dirs.root).map_err(io_err("remove", &dirs.root))?;
        tracing::info!(daemon = %id, "stopped MPS control daemon");
        Ok(())
    }

    /// Kills this owner's daemons ([`Self::with_owner`]) that run under
    /// another MPS directory than `--mps-dir` and were not taken over from a
    /// record ([`Self::adopt_elsewhere`]): daemons of an earlier `--mps-dir`
    /// whose checkpoint entry was lost. Found by a walk over every process's
    /// environment, so only run when entries were lost; daemons under
    /// `--mps-dir` are [`Self::list`]ed instead. Returns `<id> in
    /// <directory>` of each daemon stopped, and the failures.
    ///
    /// A daemon whose id `keep` names (the text of a lost entry names it:
    /// its claim's pods may use it) is taken over where it runs instead,
    /// as from a record, so that its claim's unprepare can stop it; or left
    /// alone when `--mps-dir` has a daemon of that id too.
    ///
    /// Only the processes found are killed (the daemon and its servers, which
    /// carry both marks), with SIGKILL, and their directories are left:
    /// a process's environment is anyone's to write, so its marker is not
    /// trusted with a `quit` to a socket, a pid file or a directory removal.
    /// A forged mark only gets its own process killed.
    pub fn stop_orphans_elsewhere(
        &self,
        keep: &dyn Fn(&str) -> bool,
    ) -> (Vec<String>, Vec<String>) {
        let (mut stopped, mut errors) = (Vec::new(), Vec::new());
        let Some(owner) = &self.owner else {
            return (stopped, errors);
        };
        for (root, pids) in procs::owned_daemons(owner) {
            let (Some(dir), Some(id)) = (root.parent(), root.file_name()) else {
                continue;
            };
            if dir == self.dir.path {
                continue;
            }
            let Some(id) = id.to_str().filter(|id| validate_id(id).is_ok()) else {
                errors.push(format!(
                    "processes {pids:?} carry this plugin's mark and MPS daemon directory {}, whose name is not a daemon id; left running",
                    root.display()
                ));
                continue;
            };
            let known = self.elsewhere().get(id).cloned();
            if known.as_deref() == Some(dir) {
                continue;
            }
            if keep(id) {
                if known.is_some() || DaemonDirs::under(&self.dir, id).root.exists() {
                    tracing::warn!(daemon = %id, dir = %root.display(), "MPS daemon named by a lost checkpoint entry runs under an earlier --mps-dir, and a daemon of that id is known already: left running, not taken over");
                } else {
                    tracing::warn!(daemon = %id, dir = %root.display(), "MPS daemon named by a lost checkpoint entry: taken over where it runs, for its claim's pods");
                    self.adopt_elsewhere(id, dir.to_path_buf());
                }
                continue;
            }
            match kill_and_wait(pids) {
                Ok(()) => {
                    tracing::warn!(
                        daemon = %id,
                        dir = %root.display(),
                        "killed MPS daemon of an earlier --mps-dir whose checkpoint entry was lost; its directory is left"
                    );
                    stopped.push(format!("{id} in {}", dir.display()));
                }
                Err(left) => errors.push(format!(
                    "MPS daemon {id} of an earlier --mps-dir {}: processes {left:?} still alive after SIGKILL",
                    dir.display()
                )),
            }
        }
        (stopped, errors)
    }

    /// Ids of the daemons that have a directory (running or not), sorted;
    /// entries that are not valid ids are skipped.
    pub fn list(&self) -> Result<Vec<String>, MpsError> {
        let root = &self.dir.path;
        let entries = match fs::read_dir(root) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("read dir", root)(e)),
        };
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_err("read dir", root))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if validate_id(&name).is_ok() && entry.file_type().is_ok_and(|t| t.is_dir()) {
                ids.push(name);
            } else {
                tracing::debug!(entry = %name, "ignoring a foreign entry of the MPS directory");
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// Restarts every daemon of `ids` that is not running, from its
    /// recorded settings; one result per id, in order.
    pub fn check(&self, ids: &[String]) -> Vec<(String, Result<Health, MpsError>)> {
        ids.iter()
            .map(|id| (id.clone(), self.check_one(id)))
            .collect()
    }

    fn check_one(&self, id: &str) -> Result<Health, MpsError> {
        checked_id(id)?;
        let lock = self.lock_for(id);
        let _held = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let dirs = match self.usable_dirs(id) {
            Err(MpsError::Unreachable { pids, .. }) => {
                // It runs, where nothing can restart it anyway.
                let pid = pids.into_iter().min().unwrap_or_default();
                return Ok(Health::Running { pid });
            }
            other => other?,
        };
        if let Some(pid) = dirs.live_pid() {
            return Ok(Health::Running { pid });
        }
        let cfg = read_config(&dirs)?.ok_or_else(|| MpsError::NoRecord {
            id: id.to_owned(),
            path: dirs.config.clone(),
        })?;
        if cfg.id != id {
            return Err(MpsError::BadRecord {
                path: dirs.config.clone(),
                reason: format!("records daemon {:?}, not {id:?}", cfg.id),
            });
        }
        tracing::warn!(daemon = %id, "MPS control daemon is gone; restarting it");
        Ok(Health::Restarted(self.start_locked(&cfg)?))
    }

    /// What a container of a claim served by daemon `id` needs:
    /// `CUDA_MPS_PIPE_DIRECTORY`, the pipe directory at
    /// [`CONTAINER_PIPE_DIR`] and the daemon's shm directory at `/dev/shm`
    /// (host paths).
    ///
    /// `id` is one [`MpsControl::start`] accepted; any other (a path, an
    /// empty string) gets *no* edits and an error log, never a mount outside
    /// the MPS directory. [`MpsControl::checked_container_edits`] returns
    /// the error instead.
    pub fn container_edits(&self, id: &str) -> ContainerEdits {
        self.checked_container_edits(id).unwrap_or_else(|e| {
            tracing::error!(daemon = %id, error = %e, "no MPS container edits for an invalid daemon id");
            ContainerEdits::default()
        })
    }

    /// [`MpsControl::container_edits`], with an invalid id as an error.
    pub fn checked_container_edits(&self, id: &str) -> Result<ContainerEdits, MpsError> {
        checked_id(id)?;
        let mount = |leaf: &str, container: &str| Mount {
            host_path: self.host_path(id, leaf),
            container_path: container.to_owned(),
            options: ["rw", "nosuid", "nodev", "bind"].map(String::from).to_vec(),
            mount_type: None,
        };
        Ok(ContainerEdits {
            env: vec![format!("CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}")],
            mounts: vec![mount("pipe", CONTAINER_PIPE_DIR), mount("shm", "/dev/shm")],
            ..ContainerEdits::default()
        })
    }
}

/// Per-client limits for memory-fraction sharing:
/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<N>M` and
/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<p>`.
///
/// A memory-shared GPU has a daemon of its own serving only that GPU, so
/// the client sees it as device 0 (the documented `<ordinal>=<limit>` form;
/// the UUID never enters the environment). Out-of-range values are clamped
/// (limit to 1 ..= [`MAX_PINNED_LIMIT_MIB`], percentage to 1 ..= 100) with a
/// warning; [`checked_client_limit_edits`] refuses them instead.
/// Cooperative clients only: see the module docs.
pub fn client_limit_edits(
    uuid: &str,
    pinned_limit_mib: u64,
    active_thread_percentage: u8,
) -> ContainerEdits {
    let mib = pinned_limit_mib.clamp(1, MAX_PINNED_LIMIT_MIB);
    let pct = active_thread_percentage.clamp(1, 100);
    if mib != pinned_limit_mib || pct != active_thread_percentage {
        tracing::warn!(
            gpu = %uuid,
            pinned_limit_mib,
            active_thread_percentage,
            clamped_mib = mib,
            clamped_percentage = pct,
            "MPS client limits out of range were clamped"
        );
    }
    limit_env(mib, pct)
}

fn limit_env(mib: u64, pct: u8) -> ContainerEdits {
    ContainerEdits {
        env: vec![
            format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={mib}M"),
            format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={pct}"),
        ],
        ..ContainerEdits::default()
    }
}

/// [`client_limit_edits`] that refuses a malformed UUID and out-of-range
/// values instead of clamping them.
pub fn checked_client_limit_edits(
    uuid: &str,
    pinned_limit_mib: u64,
    active_thread_percentage: u8,
) -> Result<ContainerEdits, MpsError> {
    let invalid = |reason: String| MpsError::InvalidConfig {
        id: format!("client of {uuid}"),
        reason,
    };
    validate_uuid(uuid).map_err(|r| invalid(format!("GPU UUID {uuid:?}: {r}")))?;
    if pinned_limit_mib == 0 || pinned_limit_mib > MAX_PINNED_LIMIT_MIB {
        return Err(invalid(format!(
            "pinned memory limit {pinned_limit_mib} MiB is outside 1..={MAX_PINNED_LIMIT_MIB}"
        )));
    }
    validate_percentage(active_thread_percentage).map_err(invalid)?;
    if active_thread_percentage == 0 {
        return Err(invalid(
            "an active thread percentage of 0 leaves no threads".into(),
        ));
    }
    Ok(limit_env(pinned_limit_mib, active_thread_percentage))
}

/// SIGKILLs `pids` and waits up to 2 s for them to go; the ones left.
fn kill_and_wait(mut pids: Vec<u32>) -> Result<(), Vec<u32>> {
    for pid in &pids {
        procs::kill(*pid);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut attempt = 0;
    loop {
        pids.retain(|p| procs::is_alive(*p));
        if pids.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(pids);
        }
        thread::sleep(backoff(attempt));
        attempt += 1;
    }
}

/// [`validate_id`], as an [`MpsError::InvalidId`].
fn checked_id(id: &str) -> Result<(), MpsError> {
    validate_id(id).map_err(|reason| MpsError::InvalidId {
        id: id.to_owned(),
        reason,
    })
}

/// Whether a UNIX socket can be bound or connected at `path`.
fn socket_path_fits(path: &Path) -> bool {
    path.as_os_str().len() <= MAX_SOCKET_PATH
}

fn read_pid(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The last lines of the daemon's control log and of `-d`'s output.
fn log_tail(dirs: &DaemonDirs) -> String {
    let mut parts = Vec::new();
    for name in ["control.log", START_OUTPUT] {
        if let Ok(text) = fs::read_to_string(dirs.log.join(name)) {
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(8)..].join(" | ");
            if !tail.is_empty() {
                parts.push(exec::truncate(&tail, 1500));
            }
        }
    }
    if parts.is_empty() {
        "(empty)".into()
    } else {
        parts.join(" || ")
    }
}

/// Removes everything inside `dir`, keeping `dir` itself.
fn clear_dir(dir: &Path) -> Result<(), MpsError> {
    for entry in fs::read_dir(dir).map_err(io_err("read dir", dir))? {
        let entry = entry.map_err(io_err("read dir", dir))?;
        let path = entry.path();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let removed = if is_dir {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        match removed {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove", &path)(e)),
        }
    }
    Ok(())
}

fn write_config(dirs: &DaemonDirs, cfg: &DaemonConfig) -> Result<(), MpsError> {
    let json = serde_json::to_vec_pretty(cfg).map_err(|e| MpsError::BadRecord {
        path: dirs.config.clone(),
        reason: e.to_string(),
    })?;
    let tmp = dirs.config.with_extension("json.tmp");
    fs::write(&tmp, json).map_err(io_err("write", &tmp))?;
    fs::rename(&tmp, &dirs.config).map_err(io_err("rename", &dirs.config))
}

fn read_config(dirs: &DaemonDirs) -> Result<Option<DaemonConfig>, MpsError> {
    let path = &dirs.config;
    let bytes = match read_capped(path, MAX_CONFIG_BYTES).map_err(io_err("read", path))? {
        Capped::Missing => return Ok(None),
        Capped::TooLarge(_) => {
            return Err(MpsError::BadRecord {
                path: path.clone(),
                reason: format!("larger than {MAX_CONFIG_BYTES} bytes"),
            });
        }
        Capped::Bytes(bytes) => bytes,
    };
    let cfg: DaemonConfig = serde_json::from_slice(&bytes).map_err(|e| MpsError::BadRecord {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    cfg.validate().map_err(|e| MpsError::BadRecord {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    Ok(Some(cfg))
}

#[cfg(test)]
mod daemon_tests;
#[cfg(test)]
mod tests;
