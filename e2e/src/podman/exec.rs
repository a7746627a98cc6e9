//! Running a command with a deadline: both outputs captured, the process
//! killed when the deadline passes.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::PodmanError;

/// How often a running command is polled.
const POLL: Duration = Duration::from_millis(5);

/// A command that finished in time.
#[derive(Debug)]
pub(crate) struct Finished {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub elapsed: Duration,
}

/// How a bounded command ended.
#[derive(Debug)]
pub(crate) enum Bounded {
    /// It exited.
    Finished(Finished),
    /// It was killed at the deadline.
    TimedOut,
}

/// Runs `cmd` (stdout and stderr piped; stdin as the caller set it) until it
/// exits or `timeout` passes, then kills it.
pub(crate) fn run_bounded(cmd: &mut Command, timeout: Duration) -> Result<Bounded, PodmanError> {
    let program = std::path::PathBuf::from(cmd.get_program());
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| PodmanError::Spawn {
            program: program.clone(),
            source,
        })?;
    let stdout = reader(child.stdout.take());
    let stderr = reader(child.stderr.take());
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() >= timeout => {
                kill(&mut child);
                // The readers are left behind: a grandchild (conmon) may
                // still hold the pipes open.
                return Ok(Bounded::TimedOut);
            }
            Ok(None) => std::thread::sleep(POLL),
            Err(e) => {
                kill(&mut child);
                return Err(PodmanError::io("wait for", &program, e));
            }
        }
    };
    let elapsed = start.elapsed();
    Ok(Bounded::Finished(Finished {
        status,
        stdout: join(stdout),
        stderr: join(stderr),
        elapsed,
    }))
}

fn reader(pipe: Option<impl Read + Send + 'static>) -> Option<JoinHandle<Vec<u8>>> {
    let mut pipe = pipe?;
    Some(std::thread::spawn(move || {
        let mut out = Vec::new();
        // A read error ends the capture; what was read is kept.
        let _ = pipe.read_to_end(&mut out);
        out
    }))
}

fn join(handle: Option<JoinHandle<Vec<u8>>>) -> Vec<u8> {
    handle.and_then(|h| h.join().ok()).unwrap_or_default()
}

fn kill(child: &mut Child) {
    // Already exited counts as killed.
    let _ = child.kill();
    let _ = child.wait();
}
