//! Running the real `gpu-kubelet-plugin` binary on short temporary
//! directories (socket paths must stay under 108 bytes).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_gpu-kubelet-plugin");
pub const DRIVER: &str = "gpu.nvidia.com";

/// A short temporary directory under /tmp.
pub fn short_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("p")
        .tempdir_in("/tmp")
        .unwrap()
}

/// The plugin binary with a clean environment and the given arguments,
/// stderr going to `stderr`.
pub fn command(args: &[&str], stderr: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.env_clear()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(stderr).unwrap());
    c
}

/// Runs the plugin to completion (for startup failures), with a deadline.
pub fn run_to_exit(args: &[&str], dir: &Path) -> (ExitStatus, String) {
    let log = dir.join("run.log");
    let mut child = command(args, &log).spawn().unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(20)).expect("plugin did not exit");
    (status, std::fs::read_to_string(&log).unwrap())
}

pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asserts the shape of a startup failure: non-zero exit, no panic, and a
/// last line `error: ...` that contains `needle`.
pub fn assert_one_line_error(status: ExitStatus, stderr: &str, needle: &str) {
    assert!(!status.success(), "exited 0; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: "),
        "last line is not an error: {stderr}"
    );
    assert!(last.contains(needle), "{needle:?} not in {last:?}");
}

/// A running plugin process.
pub struct Plugin {
    pub child: Child,
    pub reg_dir: PathBuf,
    pub plugins_dir: PathBuf,
    pub log: PathBuf,
}

impl Plugin {
    /// Starts the plugin on `<dir>/reg` and `<dir>/plugins` and waits until
    /// it serves; panics with its stderr if it exits instead.
    pub fn start(dir: &Path, extra: &[&str]) -> Self {
        Self::start_named(dir, "run", extra)
    }

    pub fn start_named(dir: &Path, name: &str, extra: &[&str]) -> Self {
        let reg_dir = dir.join("reg");
        let plugins_dir = dir.join("plugins");
        let log = dir.join(format!("{name}.log"));
        let mut args = vec![
            "--node-name",
            "node-a",
            "--kubelet-registrar-dir",
            reg_dir.to_str().unwrap(),
            "--kubelet-plugins-dir",
            plugins_dir.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let child = command(&args, &log).spawn().unwrap();
        let mut p = Self {
            child,
            reg_dir,
            plugins_dir,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        // The socket file alone proves nothing (a stale one may be there).
        while !p.stderr().contains("serving kubelet plugin sockets") {
            if let Some(status) = p.child.try_wait().unwrap() {
                panic!("plugin exited with {status}: {}", p.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "no registration socket: {}",
                p.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    }

    pub fn reg_socket(&self) -> PathBuf {
        self.reg_dir.join(format!("{DRIVER}-reg.sock"))
    }

    pub fn dra_socket(&self) -> PathBuf {
        self.plugins_dir.join(DRIVER).join("dra.sock")
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Polls stderr until it contains `needle`.
    pub async fn wait_log(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.stderr().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "{needle:?} never logged: {}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
