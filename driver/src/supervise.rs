//! `--supervise`: the plugin runs as a child of a small supervisor process
//! (the container's main process) that restarts it when it dies and reaps
//! every process left to it.
//!
//! Why: the MPS control daemons the plugin starts live in the plugin's
//! container. When the plugin itself is the container's main process, a
//! plugin crash ends the container and the runtime kills everything in it,
//! daemons included, which breaks every CUDA process on the node that talks
//! to them. Under the supervisor a crash ends only the plugin process: the
//! daemons keep serving, and the restarted plugin re-adopts them from its
//! checkpoint. The supervisor is also the reaper the container otherwise
//! lacks (a daemon that exits is re-parented to it, not left a zombie).
//!
//! What it cannot do: a container stop (pod deleted, DaemonSet upgrade, a
//! failed liveness probe) still ends the daemons with it. The MPS daemon
//! host ([`crate::prepare::mps::host`], `--mps-host-socket`) keeps them out
//! of the plugin's container for that, and runs under the same supervisor
//! (`mps-host --supervise`): the daemons are the host's children, so a
//! crash of the host would otherwise end its container and them.
//!
//! Restarts: after a crash (a signal, or an exit status other than 0 and 2)
//! the plugin is started again after a delay that doubles from
//! [`Policy::first_delay`] up to [`Policy::max_delay`]; a run that lasted
//! [`Policy::healthy_after`] resets it. When the crash after
//! [`Policy::max_quick_failures`] such restarts comes sooner than that too,
//! the supervisor exits with the plugin's status, so Kubernetes sees the
//! crash loop. Exit 2 (bad flags) is final, and so is exit 0 (the plugin
//! stopped on a signal) unless [`Policy::restart_clean_exits`]: the MPS
//! daemon host sets it, as its container must outlive a SIGTERM sent to
//! the host process alone (a `pkill` meant for the plugin, which has the
//! same name). SIGTERM and SIGINT to the supervisor are passed on to the
//! program and the supervisor exits with its status.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitOptions, WaitStatus, kill_process, set_child_subreaper};
use signal_hook::consts::{SIGCHLD, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// The flag that asks for supervision (removed from the plugin's own
/// arguments).
pub const FLAG: &str = "--supervise";

/// Why supervision could not go on.
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    /// Installing the signal handlers failed.
    #[error("cannot handle SIGTERM, SIGINT and SIGCHLD: {0}")]
    Signals(#[source] io::Error),
    /// `PR_SET_CHILD_SUBREAPER` failed.
    #[error("cannot become the reaper of orphaned processes: {0}")]
    Subreaper(#[source] io::Error),
    /// The supervised program could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// Waiting for children failed.
    #[error("cannot wait for the supervised process: {0}")]
    Wait(#[source] io::Error),
}

/// When and how often a dead plugin is started again.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Delay before the first restart.
    pub first_delay: Duration,
    /// Longest delay between restarts.
    pub max_delay: Duration,
    /// A run at least this long resets the delay and the failure count.
    pub healthy_after: Duration,
    /// Restarts after crashes in a row, each sooner than `healthy_after`,
    /// before giving up.
    pub max_quick_failures: u32,
    /// Whether an exit with status 0 that the supervisor did not ask for
    /// (by passing on a stop signal) is restarted like a crash.
    pub restart_clean_exits: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            first_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
            healthy_after: Duration::from_secs(60),
            max_quick_failures: 5,
            restart_clean_exits: false,
        }
    }
}

/// How one run of the plugin ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this status.
    Exited(i32),
    /// A signal killed it.
    Killed(i32),
}

impl Ended {
    fn from_status(status: WaitStatus) -> Option<Self> {
        status
            .exit_status()
            .map(Self::Exited)
            .or_else(|| status.terminating_signal().map(Self::Killed))
    }

    /// The status to exit with when passing this on (128 + signal for a
    /// killed plugin, as shells report it).
    pub fn code(self) -> u8 {
        match self {
            Self::Exited(c) => u8::try_from(c).unwrap_or(1),
            Self::Killed(s) => u8::try_from(128 + s).unwrap_or(1),
        }
    }

    /// Whether the program is started again after this end (not asked
    /// for by the supervisor) under `policy`.
    fn restartable(self, policy: &Policy) -> bool {
        match self {
            Self::Exited(2) => false,
            Self::Exited(0) => policy.restart_clean_exits,
            _ => true,
        }
    }
}

/// The plugin's arguments: `args` without [`FLAG`].
pub fn child_args<I>(args: I) -> Vec<OsString>
where
    I: IntoIterator<Item = OsString>,
{
    args.into_iter().filter(|a| a != OsStr::new(FLAG)).collect()
}

/// Restart bookkeeping: the delay before the next start and the count of
/// quick failures.
#[derive(Debug)]
struct Backoff {
    delay: Duration,
    quick_failures: u32,
}

impl Backoff {
    fn new(policy: &Policy) -> Self {
        Self {
            delay: policy.first_delay,
            quick_failures: 0,
        }
    }

    /// Records a crash after a run of `ran`; the delay before the next
    /// start, or `None` when it is time to give up.
    fn crashed(&mut self, policy: &Policy, ran: Duration) -> Option<Duration> {
        if ran >= policy.healthy_after {
            self.delay = policy.first_delay;
            self.quick_failures = 0;
        }
        self.quick_failures += 1;
        if self.quick_failures > policy.max_quick_failures {
            return None;
        }
        let delay = self.delay;
        self.delay = (self.delay * 2).min(policy.max_delay);
        Some(delay)
    }
}

/// Runs `program` with `args` and keeps it running under `policy`; returns
/// the exit status to end with. `what` names the program in the log (the
/// plugin, the MPS daemon host).
pub fn run(
    what: &str,
    program: &Path,
    args: &[OsString],
    policy: &Policy,
) -> Result<u8, SuperviseError> {
    // Handlers first: a signal that comes while the plugin starts is queued,
    // not lost to the default action.
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGCHLD]).map_err(SuperviseError::Signals)?;
    set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| SuperviseError::Subreaper(io::Error::from(e)))?;
    let mut backoff = Backoff::new(policy);
    loop {
        let started = Instant::now();
        let child =
            Command::new(program)
                .args(args)
                .spawn()
                .map_err(|source| SuperviseError::Spawn {
                    program: program.display().to_string(),
                    source,
                })?;
        let pid = child.id();
        // The child is reaped below with waitpid(-1), not through `child`.
        drop(child);
        tracing::info!(pid, "{what} started under the supervisor");
        let (ended, stop) = wait_for(pid, &mut signals)?;
        if let Some(signal) = stop {
            tracing::info!(
                pid,
                signal,
                ?ended,
                "{what} stopped on a signal; supervisor exits"
            );
            return Ok(ended.code());
        }
        if !ended.restartable(policy) {
            tracing::info!(pid, ?ended, "{what} exited; supervisor exits");
            return Ok(ended.code());
        }
        let ran = started.elapsed();
        let Some(delay) = backoff.crashed(policy, ran) else {
            tracing::error!(
                pid,
                ?ended,
                crashes = backoff.quick_failures,
                "{what} keeps crashing soon after start; supervisor gives up"
            );
            return Ok(ended.code());
        };
        tracing::error!(
            pid,
            ?ended,
            ran_ms = ran.as_millis(),
            restart_in_ms = delay.as_millis(),
            "{what} died; starting it again (MPS daemons keep running)"
        );
        if let Some(signal) = pause(delay, &mut signals)? {
            tracing::info!(
                signal,
                "signal while waiting to restart the {what}; supervisor exits"
            );
            return Ok(0);
        }
    }
}

/// Reaps every exited child; returns how the plugin `pid` ended when it is
/// among them.
fn reap(pid: Option<u32>) -> Result<Option<Ended>, SuperviseError> {
    let mut ours = None;
    loop {
        match rustix::process::wait(WaitOptions::NOHANG) {
            Ok(Some((p, status))) => {
                if Some(p.as_raw_nonzero().get().cast_unsigned()) == pid {
                    ours = Ended::from_status(status);
                } else {
                    tracing::debug!(pid = p.as_raw_nonzero().get(), "reaped an orphaned process");
                }
            }
            Ok(None) | Err(Errno::CHILD) => return Ok(ours),
            Err(Errno::INTR) => {}
            Err(e) => return Err(SuperviseError::Wait(e.into())),
        }
    }
}

/// Waits until the plugin `pid` ends, passing SIGTERM and SIGINT on to it
/// and reaping orphans meanwhile; returns how it ended and the stop signal
/// it was sent, if any.
fn wait_for(pid: u32, signals: &mut Signals) -> Result<(Ended, Option<i32>), SuperviseError> {
    let mut stop = None;
    loop {
        if let Some(ended) = reap(Some(pid))? {
            return Ok((ended, stop));
        }
        for signal in signals.wait() {
            if signal == SIGTERM || signal == SIGINT {
                stop = Some(signal);
                let sig = if signal == SIGTERM {
                    Signal::TERM
                } else {
                    Signal::INT
                };
                if let Some(p) = Pid::from_raw(pid.cast_signed()) {
                    // Gone already: its SIGCHLD is queued and reaped above.
                    let _ = kill_process(p, sig);
                }
            }
        }
    }
}

/// Sleeps `delay`, reaping orphans; returns early with a stop signal.
fn pause(delay: Duration, signals: &mut Signals) -> Result<Option<i32>, SuperviseError> {
    let until = Instant::now() + delay;
    loop {
        reap(None)?;
        for signal in signals.pending() {
            if signal == SIGTERM || signal == SIGINT {
                return Ok(Some(signal));
            }
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        thread::sleep(left.min(Duration::from_millis(50)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_is_not_passed_on_and_everything_else_is() {
        let args = ["--node-name=n", FLAG, "--dynamic-mig", "--supervise=x"].map(OsString::from);
        assert_eq!(
            child_args(args),
            ["--node-name=n", "--dynamic-mig", "--supervise=x"].map(OsString::from)
        );
    }

    #[test]
    fn delays_double_to_the_cap_reset_after_a_healthy_run_and_give_up() {
        let policy = Policy {
            first_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(3),
            healthy_after: Duration::from_secs(60),
            max_quick_failures: 4,
            restart_clean_exits: false,
        };
        let quick = Duration::from_secs(1);
        let mut b = Backoff::new(&policy);
        let delays: Vec<_> = (0..4).map(|_| b.crashed(&policy, quick)).collect();
        assert_eq!(delays, [1, 2, 3, 3].map(|s| Some(Duration::from_secs(s))));
        assert_eq!(b.crashed(&policy, quick), None);
        // A long run starts the count again.
        let mut b = Backoff::new(&policy);
        for _ in 0..4 {
            b.crashed(&policy, quick);
        }
        assert_eq!(
            b.crashed(&policy, Duration::from_secs(61)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(b.crashed(&policy, quick), Some(Duration::from_secs(2)));
    }

    #[test]
    fn ends_map_to_exit_statuses_and_restarts() {
        assert_eq!(Ended::Exited(0).code(), 0);
        assert_eq!(Ended::Exited(3).code(), 3);
        assert_eq!(Ended::Killed(9).code(), 137);
        let plugin = Policy::default();
        let host = Policy {
            restart_clean_exits: true,
            ..Policy::default()
        };
        for policy in [&plugin, &host] {
            assert!(!Ended::Exited(2).restartable(policy));
            assert!(Ended::Exited(1).restartable(policy));
            assert!(Ended::Killed(9).restartable(policy));
            assert!(Ended::Killed(15).restartable(policy));
        }
        assert!(!Ended::Exited(0).restartable(&plugin));
        assert!(Ended::Exited(0).restartable(&host));
    }
}
