//! A real container runtime for tests: busybox containers started by podman
//! with CDI device ids, so a test can prove that the CDI specs the driver
//! writes are consumed by a runtime, not just well-formed JSON.
//!
//! ```no_run
//! use gpu_dra_e2e::podman::{CdiSpecFile, Podman};
//!
//! // Skips (with a loud message on stderr) where podman cannot run; fails
//! // instead when GPU_DRA_E2E_REQUIRE_PODMAN=1 (CI sets it once installed).
//! let Some(podman) = Podman::detect_or_skip("my_test").unwrap() else { return };
//! let spec = CdiSpecFile::write(r#"{"cdiVersion":"0.5.0","kind":"example.com/test","devices":[
//!     {"name":"d","containerEdits":{"env":["A=1"]}}]}"#).unwrap();
//! let out = podman.run(&["example.com/test=d"], &["sh", "-c", "echo $A"]).unwrap();
//! assert_eq!(out.into_success().unwrap().stdout, "1\n");
//! drop(spec); // the spec file is removed
//! ```
//!
//! Isolation: every process gets its own podman state in a temp dir (vfs
//! storage root and runroot, libpod tmpdir, network config dir, a
//! `containers.conf` with `[containers] default_ulimits = []` and a
//! `storage.conf`), made on first use and shared by every [`Podman`] of the
//! process, so the image is imported once per test binary (about half a
//! second). Statics are never dropped, so the dir outlives the process; the
//! next setup on the machine removes the dirs of processes that are gone.
//! Containers run with `--runtime <runc> --cgroup-manager=cgroupfs
//! --network=none --rm`, from an image made with `podman import` of a rootfs
//! holding the host's static busybox and its applet links.
//!
//! CDI specs: podman 4.3 (Debian 12) reads them only from `/etc/cdi` and
//! `/var/run/cdi`, so a test writes its spec there through [`CdiSpecFile`],
//! which removes it on drop. Spec files are global to the machine: give
//! every spec a kind or device names unique to the test (a random claim UID
//! does that).
//!
//! Submodules: [`detect`] (what must be installed, and why it is not),
//! [`image`] (the rootfs tarball and its import), [`spec_file`] (the CDI
//! spec guard), `exec` (running a command with a deadline).

pub mod detect;
mod exec;
pub mod image;
pub mod spec_file;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

pub use detect::Tools;
pub use spec_file::CdiSpecFile;

/// The directories podman 4.3 reads CDI specs from, in its order.
pub const CDI_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];
/// Where [`CdiSpecFile::write`] puts specs (transient specs belong here).
pub const CDI_DIR: &str = "/var/run/cdi";
/// When set to `1`, [`Podman::detect_or_skip`] fails instead of skipping.
pub const REQUIRE_ENV: &str = "GPU_DRA_E2E_REQUIRE_PODMAN";
/// Default deadline of one `podman run`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline of setup commands (`podman import`, `tar`, `busybox --list`).
const SETUP_TIMEOUT: Duration = Duration::from_secs(120);

/// Errors of the podman harness.
#[derive(Debug, thiserror::Error)]
pub enum PodmanError {
    /// Podman cannot run on this machine; every reason is listed.
    #[error("podman cannot run here: {}", reasons.join("; "))]
    Unavailable {
        /// What is missing, each with what to install or change.
        reasons: Vec<String>,
    },
    /// A device id is not a fully qualified CDI id (`vendor/class=name`);
    /// refused so that it is never taken for a host device path.
    #[error("{id:?} is not a qualified CDI device id (vendor/class=name): {reason}")]
    InvalidCdiId {
        /// The id given.
        id: String,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// `run` was called without a command.
    #[error("no command given to run in the container")]
    EmptyCommand,
    /// A file operation of the harness failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A program could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A setup command (tar, busybox, podman import) failed.
    #[error("{what} failed ({status}): {stderr}")]
    SetupFailed {
        /// The command, in words.
        what: String,
        /// Its exit status.
        status: ExitStatus,
        /// Its stderr, trimmed.
        stderr: String,
    },
    /// `busybox --list` printed no applet names.
    #[error("`{} --list` listed no applets", busybox.display())]
    NoApplets {
        /// The busybox binary.
        busybox: PathBuf,
    },
    /// A command ran past its deadline and was killed (and its container removed).
    #[error("{what} did not finish within {timeout:?}; killed")]
    Timeout {
        /// The command, in words.
        what: String,
        /// The deadline.
        timeout: Duration,
    },
    /// A container exited unsuccessfully (from [`Output::into_success`]).
    #[error("container failed ({status}); stderr: {stderr}; stdout: {stdout}")]
    ContainerFailed {
        /// The exit status of `podman run`.
        status: ExitStatus,
        /// Its stdout.
        stdout: String,
        /// Its stderr.
        stderr: String,
    },
}

impl PodmanError {
    fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// What one `podman run` produced.
#[derive(Debug)]
pub struct Output {
    /// The exit status of `podman run` (the container's own status when it
    /// ran; 125-127 when podman or the runtime refused).
    pub status: ExitStatus,
    /// Standard output (lossy UTF-8).
    pub stdout: String,
    /// Standard error (lossy UTF-8): the container's and podman's.
    pub stderr: String,
    /// Wall time of the `podman run` command.
    pub elapsed: Duration,
}

impl Output {
    /// Whether the container exited with status 0.
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// `self` when it succeeded, else [`PodmanError::ContainerFailed`] with
    /// both outputs, for `?` in tests.
    pub fn into_success(self) -> Result<Self, PodmanError> {
        if self.success() {
            Ok(self)
        } else {
            Err(PodmanError::ContainerFailed {
                status: self.status,
                stdout: self.stdout,
                stderr: self.stderr,
            })
        }
    }
}

/// A podman able to run containers here. Cheap to create; the isolated state
/// and the image are set up on first use and shared within the process.
#[derive(Debug)]
pub struct Podman {
    tools: Tools,
    timeout: Duration,
    setup: OnceLock<Arc<image::Setup>>,
}

/// The setup shared by every `Podman` of the process.
static SHARED: Mutex<Option<Arc<image::Setup>>> = Mutex::new(None);
/// Makes container names unique within the process.
static CONTAINERS: AtomicU64 = AtomicU64::new(0);

impl Podman {
    /// Finds what podman needs ([`Tools::find`]); errors with
    /// [`PodmanError::Unavailable`] listing everything missing. Runs no
    /// podman command: a podman that is present but fails makes the first
    /// [`run`](Self::run) fail.
    pub fn detect() -> Result<Self, PodmanError> {
        Ok(Self {
            tools: Tools::find()?,
            timeout: DEFAULT_TIMEOUT,
            setup: OnceLock::new(),
        })
    }

    /// For tests: `Ok(Some(podman))` when podman can run; `Ok(None)` after a
    /// loud skip message on stderr naming `test` and what is missing; the
    /// `Unavailable` error instead of a skip when [`REQUIRE_ENV`] is `1`.
    pub fn detect_or_skip(test: &str) -> Result<Option<Self>, PodmanError> {
        match Self::detect() {
            Ok(podman) => Ok(Some(podman)),
            Err(err) => crate::skip_unless_required(test, REQUIRE_ENV, err),
        }
    }

    /// The same podman with another deadline per `run` (default
    /// [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The programs found.
    pub fn tools(&self) -> &Tools {
        &self.tools
    }

    /// Runs `command` in a new busybox container (`podman run --rm
    /// --network=none --pull=never`) with `--device=<id>` per CDI id, and
    /// returns its output whatever the exit status. Errors: an id that is not
    /// a qualified CDI id, an empty command, a failed setup, or the deadline
    /// passing (the container is then removed).
    pub fn run<S: AsRef<str>>(
        &self,
        cdi_ids: &[S],
        command: &[&str],
    ) -> Result<Output, PodmanError> {
        for id in cdi_ids {
            validate_cdi_id(id.as_ref())?;
        }
        if command.is_empty() {
            return Err(PodmanError::EmptyCommand);
        }
        let setup = self.setup()?;
        let name = format!(
            "gpu-dra-e2e-{}-{}",
            std::process::id(),
            CONTAINERS.fetch_add(1, Ordering::Relaxed)
        );
        let mut cmd = setup.command();
        cmd.args([
            "run",
            "--rm",
            "--pull=never",
            "--network=none",
            "--name",
            &name,
        ]);
        for id in cdi_ids {
            cmd.arg(format!("--device={}", id.as_ref()));
        }
        cmd.arg(image::IMAGE).args(command);
        cmd.stdin(Stdio::null());
        match exec::run_bounded(&mut cmd, self.timeout)? {
            exec::Bounded::Finished(done) => {
                tracing::debug!(container = %name, status = %done.status, elapsed = ?done.elapsed, "podman run finished");
                Ok(Output {
                    status: done.status,
                    stdout: String::from_utf8_lossy(&done.stdout).into_owned(),
                    stderr: String::from_utf8_lossy(&done.stderr).into_owned(),
                    elapsed: done.elapsed,
                })
            }
            exec::Bounded::TimedOut => {
                setup.force_remove(&name);
                Err(PodmanError::Timeout {
                    what: format!("podman run {name}"),
                    timeout: self.timeout,
                })
            }
        }
    }

    /// A `podman` command with this setup's isolation flags and environment,
    /// for what [`run`](Self::run) does not cover (the image is
    /// [`image::IMAGE`]). Sets the setup up first.
    pub fn command(&self) -> Result<Command, PodmanError> {
        Ok(self.setup()?.command())
    }

    fn setup(&self) -> Result<&Arc<image::Setup>, PodmanError> {
        if let Some(setup) = self.setup.get() {
            return Ok(setup);
        }
        let setup = {
            let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
            match shared.as_ref() {
                Some(setup) if setup.tools() == &self.tools => Arc::clone(setup),
                _ => {
                    image::remove_stale_setups();
                    let setup = Arc::new(image::Setup::create(&self.tools)?);
                    *shared = Some(Arc::clone(&setup));
                    setup
                }
            }
        };
        Ok(self.setup.get_or_init(|| setup))
    }

    /// The temp dir holding this podman's isolated state (after setup).
    pub fn state_dir(&self) -> Result<&Path, PodmanError> {
        Ok(self.setup()?.dir())
    }
}

/// Checks that `id` is a fully qualified CDI id `vendor/class=name` under
/// CDI's naming rules, so podman never takes it for a host device path.
/// Vendor and class: a letter first, a letter or digit last, letters,
/// digits, `-`, `_` and `.` between, at least 2 characters (podman 4.3's CDI
/// parser panics on a 1-character class). Name: a letter or digit first and
/// last, letters, digits, `-`, `_`, `.` and `:` between.
pub fn validate_cdi_id(id: &str) -> Result<(), PodmanError> {
    let bad = |reason| PodmanError::InvalidCdiId {
        id: id.to_owned(),
        reason,
    };
    let (kind, name) = id.split_once('=').ok_or_else(|| bad("no '='"))?;
    let (vendor, class) = kind
        .split_once('/')
        .ok_or_else(|| bad("no '/' in the kind"))?;
    for (part, rules) in [
        (
            vendor,
            [
                "vendor must have at least 2 characters",
                "vendor must start with a letter",
                "vendor must end with a letter or digit",
                "vendor may only hold letters, digits, '.', '-' and '_'",
            ],
        ),
        (
            class,
            [
                "class must have at least 2 characters",
                "class must start with a letter",
                "class must end with a letter or digit",
                "class may only hold letters, digits, '.', '-' and '_'",
            ],
        ),
    ] {
        let [short, start, end, chars] = rules;
        if part.chars().count() < 2 {
            return Err(bad(short));
        }
        if !part.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return Err(bad(start));
        }
        if !part.ends_with(|c: char| c.is_ascii_alphanumeric()) {
            return Err(bad(end));
        }
        if !part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            return Err(bad(chars));
        }
    }
    if name.is_empty() {
        return Err(bad("empty device name"));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err(bad("device name must start and end with a letter or digit"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'))
    {
        return Err(bad(
            "device name may only hold letters, digits, '.', '-', '_' and ':'",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
