//! Starting a daemon and keeping it up: the launch (directly, through the
//! private-mount launcher, or through the MPS daemon host), the wait for
//! its readiness, its settings, and the periodic check that restarts a
//! needed daemon that died.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::exec::{self, RunError, backoff, driver_env};
use super::{
    CONTAINER_PIPE_DIR, CONTROL_PROGRAM, DaemonConfig, DaemonDirs, Health, MpsControl, MpsError,
    NO_LAUNCHER, READY_PROBE, START_OUTPUT, ShmMode, checked_id, clear_dir, host, io_err, launch,
    log_tail, procs, read_config, read_pid, socket_path_fits, write_config,
};
use crate::prepare::checkpoint::MpsDaemonRecord;

impl MpsControl {
    pub(super) fn control_program(&self) -> Result<PathBuf, MpsError> {
        let path = self.driver_root.local(Path::new(CONTROL_PROGRAM));
        if path.is_file() {
            Ok(path)
        } else {
            Err(MpsError::ControlMissing { path })
        }
    }

    /// The program that gives a daemon a mount namespace of its own.
    pub(super) fn launcher(&self) -> Result<&Path, MpsError> {
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
    pub(super) fn in_namespace(
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
    pub(super) fn client(&self, program: &Path, dirs: &DaemonDirs) -> Result<Command, MpsError> {
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

    pub(super) fn lock_for(&self, id: &str) -> Arc<Mutex<()>> {
        let mut map = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        map.entry(id.to_owned()).or_default().clone()
    }

    /// Drops the lock entry of `id` when nobody else holds it (so the map
    /// does not grow with every daemon ever stopped).
    pub(super) fn forget_lock(&self, id: &str, mine: &Arc<Mutex<()>>) {
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

    pub(super) fn start_locked(&self, cfg: &DaemonConfig) -> Result<MpsDaemonRecord, MpsError> {
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

    pub(super) fn record(&self, cfg: &DaemonConfig, pid: u32) -> MpsDaemonRecord {
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
    pub(super) fn launch(
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
                };
                host::request_start(socket, &request).map_err(|source| MpsError::Host {
                    id: cfg.id.clone(),
                    source,
                })?
            }
            None => self.run_start(program, dirs, private, &env, &out_path)?,
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
    pub(super) fn run_start(
        &self,
        program: &Path,
        dirs: &DaemonDirs,
        private: bool,
        env: &BTreeMap<String, OsString>,
        out_path: &Path,
    ) -> Result<host::Outcome, MpsError> {
        let private = if private {
            Some((self.launcher()?, dirs.shm.as_path(), dirs.pipe.as_path()))
        } else {
            None
        };
        let mut cmd = exec::daemon_start(program, private, env, out_path)?;
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
    pub(super) fn wait_ready(
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
    pub(super) fn apply(
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
    pub(super) fn send(
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

    /// Restarts every daemon of `ids` that is not running, from its
    /// recorded settings; one result per id, in order.
    pub fn check(&self, ids: &[String]) -> Vec<(String, Result<Health, MpsError>)> {
        ids.iter()
            .map(|id| (id.clone(), self.check_one(id)))
            .collect()
    }

    pub(super) fn check_one(&self, id: &str) -> Result<Health, MpsError> {
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
}
