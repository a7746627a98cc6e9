//! The host itself: serves start requests on its socket, runs each `-d`
//! and waits for it, reaps the daemons re-parented to it, and answers the
//! starts it runs before it stops.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitOptions, WaitStatus, kill_process, set_child_subreaper};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::signal::unix::{SignalKind, signal};

use super::HostError;
use super::protocol::{MAX_MESSAGE, Outcome, Reply, StartRequest, pid_namespace};
use crate::prepare::mps::{exec, procs};
use crate::sockets;

/// Most input read away after a reply (see `handle`).
const DRAIN_LIMIT: u64 = 16 * MAX_MESSAGE;
/// How long the host waits for a request once connected.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a `-d` killed at its timeout may take to end before the host
/// answers without it (a process in uninterruptible sleep, in a hung
/// driver call, ends only when that call returns); it is reaped whenever
/// it ends.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long a stopping host goes on with the starts it is running, so
/// that their replies reach the plugin.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The host's children whose end a request waits for, and how they ended;
/// every other child (a daemon, re-parented to the host) is reaped and
/// forgotten.
#[derive(Default)]
struct Children {
    ended: Mutex<HashMap<i32, Option<WaitStatus>>>,
    changed: Condvar,
}

impl Children {
    /// Reaps every exited child.
    fn reap(&self) {
        let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some((pid, status))) => {
                    let raw = pid.as_raw_nonzero().get();
                    if let Some(slot) = ended.get_mut(&raw) {
                        *slot = Some(status);
                    } else {
                        tracing::info!(pid = raw, "reaped an exited MPS daemon process");
                    }
                }
                Ok(None) | Err(Errno::CHILD) => break,
                Err(Errno::INTR) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "waitpid failed");
                    break;
                }
            }
        }
        self.changed.notify_all();
    }

    /// Starts `cmd` and registers it before the reaper can see it end.
    fn spawn(&self, cmd: &mut Command) -> io::Result<i32> {
        // Held across the start: the reaper cannot take the child's status
        // before it is registered, nor the status std's own wait reads when
        // the exec fails.
        let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        let child = exec::spawn(cmd)?;
        let pid = i32::try_from(child.id()).map_err(io::Error::other)?;
        // Reaped by `reap`, not through `child`.
        drop(child);
        ended.insert(pid, None);
        Ok(pid)
    }

    /// Waits until child `pid` ends, killing it at `deadline`; `None` when
    /// it had to be killed. A killed child that has not ended after
    /// [`KILL_GRACE`] is left to the reaper.
    fn wait(&self, pid: i32, deadline: Instant) -> Option<WaitStatus> {
        let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        let mut killed = false;
        loop {
            if killed && Instant::now() >= deadline + KILL_GRACE {
                ended.remove(&pid);
                tracing::warn!(
                    pid,
                    "a killed MPS daemon start has not ended; answering without it"
                );
                return None;
            }
            let status = match ended.get(&pid) {
                Some(Some(status)) => Some(*status),
                // Registered and not reaped: the pid is still this child.
                // Reaped here too, so the wait does not hang on the reaper.
                _ => Pid::from_raw(pid)
                    .and_then(|p| rustix::process::waitpid(Some(p), WaitOptions::NOHANG).ok())
                    .flatten()
                    .map(|(_, status)| status),
            };
            if let Some(status) = status {
                ended.remove(&pid);
                return (!killed).then_some(status);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() && !killed {
                if let Some(p) = Pid::from_raw(pid) {
                    let _ = kill_process(p, Signal::KILL);
                }
                killed = true;
            }
            // Woken by the reaper at once; the nap bounds a missed wake-up.
            let nap = if killed {
                Duration::from_millis(20)
            } else {
                left.min(Duration::from_millis(100))
            };
            ended = self
                .changed
                .wait_timeout(ended, nap)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// Runs one checked request; `launcher` is the host's own program.
fn run_start(request: &StartRequest, launcher: &Path, children: &Children) -> Outcome {
    let failed = |error: String| Outcome::Failed { error };
    let private = request
        .private_mount
        .as_ref()
        .map(|m| (launcher, m.shm.as_path(), m.pipe.as_path()));
    let mut cmd = match exec::daemon_start(
        &request.program,
        private,
        &request.env,
        &request.output,
        request.multi_user,
    ) {
        Ok(cmd) => cmd,
        Err(e) => return failed(e.to_string()),
    };
    let pid = match children.spawn(&mut cmd) {
        Ok(pid) => pid,
        Err(e) => return failed(format!("cannot run {}: {e}", request.program.display())),
    };
    match children.wait(pid, Instant::now() + request.timeout()) {
        Some(status) => Outcome::Exited {
            code: status.exit_status(),
            signal: status.terminating_signal(),
        },
        None => Outcome::TimedOut,
    }
}

/// Reads one request line (bounded in size and time) and checks it.
async fn read_request(stream: &mut UnixStream, driver_root: &Path) -> Result<StartRequest, String> {
    let mut buf = Vec::new();
    let read = tokio::time::timeout(READ_TIMEOUT, async {
        let mut limited = stream.take(MAX_MESSAGE + 1);
        let mut chunk = [0u8; 4096];
        loop {
            let n = limited.read(&mut chunk).await?;
            buf.extend_from_slice(&chunk[..n]);
            // Only the new bytes can hold the first newline.
            if n == 0 || chunk[..n].contains(&b'\n') {
                return Ok::<_, io::Error>(());
            }
        }
    })
    .await;
    match read {
        Err(_) => return Err(format!("no request within {} s", READ_TIMEOUT.as_secs())),
        Ok(Err(e)) => return Err(format!("reading the request: {e}")),
        Ok(Ok(())) if buf.len() as u64 > MAX_MESSAGE => {
            return Err(format!("request longer than {MAX_MESSAGE} bytes"));
        }
        Ok(Ok(())) => {}
    }
    let line = buf.split(|b| *b == b'\n').next().unwrap_or_default();
    let request: StartRequest =
        serde_json::from_slice(line).map_err(|e| format!("malformed request: {e}"))?;
    request.check(driver_root)?;
    Ok(request)
}

/// Answers one connection: its request run, or why not.
async fn handle(mut stream: UnixStream, host: Arc<Shared>) {
    let outcome = match read_request(&mut stream, &host.driver_root).await {
        Err(error) => Outcome::Failed { error },
        Ok(request) => {
            let started = Instant::now();
            let shared = host.clone();
            let ran = tokio::task::spawn_blocking(move || {
                let outcome = run_start(&request, &shared.launcher, &shared.children);
                (request, outcome)
            })
            .await;
            match ran {
                Ok((request, outcome)) => {
                    let daemon = request.env.get(procs::DAEMON_MARKER_ENV);
                    tracing::info!(
                        program = %request.program.display(),
                        daemon = daemon.map_or("", String::as_str),
                        %outcome,
                        elapsed_us = crate::micros(started),
                        "ran an MPS daemon start"
                    );
                    outcome
                }
                Err(e) => Outcome::Failed {
                    error: format!("the start task failed: {e}"),
                },
            }
        }
    };
    if let Outcome::Failed { error } = &outcome {
        tracing::warn!(%error, "MPS daemon start refused or failed");
    }
    let reply = Reply {
        pid_namespace: host.namespace.clone(),
        outcome,
    };
    if let Ok(mut line) = serde_json::to_vec(&reply) {
        line.push(b'\n');
        // The plugin gone meanwhile is its own business.
        let _ = stream.write_all(&line).await;
        let _ = stream.shutdown().await;
    }
    // A socket closed with input left unread resets the connection, and
    // the client would read that instead of the reply (a request refused
    // as too long): read the rest away first, bounded in size and time.
    let _ = tokio::time::timeout(READ_TIMEOUT, async {
        let mut sink = [0u8; 4096];
        let mut left = DRAIN_LIMIT;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n as u64),
            }
        }
    })
    .await;
}

/// What every connection of a serving host uses.
struct Shared {
    /// The host's own program, the daemons' launcher.
    launcher: PathBuf,
    /// Where the host sees the driver.
    driver_root: PathBuf,
    /// The host's PID namespace, for the replies.
    namespace: String,
    children: Children,
}

/// Serves start requests on `socket` until SIGTERM or SIGINT, running the
/// control program of `driver_root` only, through `launcher` (the host's
/// own program) for a private mount. Daemons keep running when the host
/// exits.
pub async fn serve(socket: &Path, launcher: &Path, driver_root: &Path) -> Result<(), HostError> {
    let namespace = pid_namespace().map_err(HostError::Namespace)?;
    set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| HostError::Subreaper(e.into()))?;
    let mut term = signal(SignalKind::terminate()).map_err(HostError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(HostError::Signals)?;
    let mut child = signal(SignalKind::child()).map_err(HostError::Signals)?;
    sockets::check_path_len(socket)?;
    if let Some(dir) = socket.parent() {
        sockets::ensure_dir(dir)?;
    }
    sockets::clear_stale(socket).await?;
    let listener = sockets::bind(socket)?;
    tracing::info!(
        socket = %socket.display(),
        driver_root = %driver_root.display(),
        pid_namespace = %namespace,
        "MPS daemon host serving"
    );
    let host = Arc::new(Shared {
        launcher: launcher.to_owned(),
        driver_root: driver_root.to_owned(),
        namespace,
        children: Children::default(),
    });
    let mut in_flight = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    in_flight.spawn(handle(stream, host.clone()));
                }
                // Never a reason to exit: the host's end is its daemons' end
                // (out of descriptors, say, passes).
                Err(e) => {
                    tracing::warn!(socket = %socket.display(), error = %e, "accept failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = child.recv() => {
                let host = host.clone();
                // The lock may be held across a program start: off the runtime thread.
                let _ = tokio::task::spawn_blocking(move || host.children.reap()).await;
            }
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    // No new requests; those being run are answered first, so the plugin
    // learns whether its daemon started (bounded: the pod's grace period
    // is not for this alone).
    sockets::remove_socket(socket);
    drop(listener);
    if !in_flight.is_empty() {
        tracing::info!(
            requests = in_flight.len(),
            "MPS daemon host stopping; answering the requests it is running first"
        );
        let answered = tokio::time::timeout(STOP_GRACE, async {
            while in_flight.join_next().await.is_some() {}
        })
        .await;
        if answered.is_err() {
            tracing::warn!(
                requests = in_flight.len(),
                grace_s = STOP_GRACE.as_secs(),
                "MPS daemon host stopping without answering every request"
            );
        }
    }
    tracing::info!("MPS daemon host stopped; the daemons it started keep running");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_that_cannot_be_reaped_after_its_kill_is_answered_without_it() {
        // A zombie that is not this process's child: its parent (a `sleep`
        // that never waits) holds it, so the kill does nothing and waitpid
        // never returns it, as with a start stuck in a driver call.
        let mut parent = Command::new("sh")
            .args(["-c", "sleep 0 & echo $!; exec sleep 30"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        io::BufRead::read_line(
            &mut io::BufReader::new(parent.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let zombie: i32 = line.trim().parse().unwrap();
        let children = Children::default();
        children.ended.lock().unwrap().insert(zombie, None);

        let begun = Instant::now();
        assert!(children.wait(zombie, Instant::now()).is_none());
        let waited = begun.elapsed();
        assert!(
            waited >= KILL_GRACE && waited < KILL_GRACE + Duration::from_secs(3),
            "{waited:?}"
        );
        assert!(children.ended.lock().unwrap().is_empty());
        let _ = parent.kill();
        let _ = parent.wait();
    }
}
