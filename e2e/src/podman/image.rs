//! The isolated podman state of one process and its busybox image: a temp
//! dir holding the vfs storage, runroot, libpod tmpdir, network config dir,
//! `containers.conf` and `storage.conf`; a rootfs with the static busybox
//! and one symlink per applet in `/bin`, packed with `tar` and loaded with
//! `podman import` as [`IMAGE`].

use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::exec::{Bounded, run_bounded};
use super::{PodmanError, SETUP_TIMEOUT, Tools};

/// The image containers run from.
pub const IMAGE: &str = "localhost/gpu-dra-e2e/busybox:latest";
/// `containers.conf`: no default ulimits (podman's default nofile limit can
/// exceed the CI machine's hard limit, which runc then refuses).
pub const CONTAINERS_CONF: &str = "[containers]\ndefault_ulimits = []\n";
/// Name prefix of setup dirs in the temp dir: `<prefix><pid>-<random>`.
pub const SETUP_PREFIX: &str = "gpu-dra-podman-";
/// Deadline of the `podman rm` after a timed-out run.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(30);

/// One process's podman state; the temp dir goes when this is dropped.
#[derive(Debug)]
pub struct Setup {
    dir: tempfile::TempDir,
    tools: Tools,
}

impl Setup {
    /// Creates the state dir and config files and imports the image.
    pub(crate) fn create(tools: &Tools) -> Result<Self, PodmanError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{SETUP_PREFIX}{}-", std::process::id()))
            .tempdir()
            .map_err(|e| PodmanError::io("create temp dir in", &std::env::temp_dir(), e))?;
        let setup = Self {
            dir,
            tools: tools.clone(),
        };
        let root = setup.dir();
        write(&root.join("containers.conf"), CONTAINERS_CONF)?;
        write(&root.join("storage.conf"), &storage_conf(root))?;
        let rootfs = root.join("rootfs");
        build_rootfs(&tools.busybox, &rootfs)?;
        let tarball = root.join("rootfs.tar");
        let mut tar = Command::new(&tools.tar);
        tar.args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tarball)
            .arg(".")
            .stdin(Stdio::null());
        checked(&mut tar, "tar of the busybox rootfs")?;
        let mut import = setup.command();
        import
            .args(["import", "--quiet"])
            .arg(&tarball)
            .arg(IMAGE)
            .stdin(Stdio::null());
        checked(&mut import, "podman import of the busybox rootfs")?;
        // The image holds its own copy; the sources are not needed anymore.
        let _ = fs::remove_dir_all(&rootfs);
        let _ = fs::remove_file(&tarball);
        tracing::debug!(dir = %root.display(), "podman setup ready");
        Ok(setup)
    }

    /// The state dir.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The programs this setup runs.
    pub fn tools(&self) -> &Tools {
        &self.tools
    }

    /// `podman` with the isolation flags and config environment.
    pub(crate) fn command(&self) -> Command {
        let root = self.dir();
        let mut cmd = Command::new(&self.tools.podman);
        cmd.env("CONTAINERS_CONF", root.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", root.join("storage.conf"))
            .arg("--root")
            .arg(root.join("storage"))
            .arg("--runroot")
            .arg(root.join("run"))
            .arg("--tmpdir")
            .arg(root.join("tmp"))
            .arg("--network-config-dir")
            .arg(root.join("net"))
            .arg("--volumepath")
            .arg(root.join("volumes"))
            .args(["--storage-driver=vfs", "--cgroup-manager=cgroupfs"])
            .args(["--events-backend=none", "--runtime"])
            .arg(&self.tools.runc)
            .arg("--conmon")
            .arg(&self.tools.conmon);
        cmd
    }

    /// Best effort: removes a container left by a killed `podman run`.
    pub(crate) fn force_remove(&self, name: &str) {
        let mut rm = self.command();
        rm.args(["rm", "--force", "--time", "0", name])
            .stdin(Stdio::null());
        match run_bounded(&mut rm, REMOVE_TIMEOUT) {
            Ok(Bounded::Finished(done)) if done.status.success() => {}
            other => tracing::warn!(container = name, result = ?other, "cannot remove container"),
        }
    }
}

/// Removes the setup dirs (in the temp dir) of processes that no longer
/// run; best effort, failures are logged.
pub fn remove_stale_setups() {
    let tmp = std::env::temp_dir();
    let Ok(entries) = fs::read_dir(&tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = stale_setup_pid(&name.to_string_lossy()) else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let path = entry.path();
        match fs::remove_dir_all(&path) {
            Ok(()) => tracing::debug!(dir = %path.display(), "removed a stale podman setup"),
            Err(e) => {
                tracing::warn!(dir = %path.display(), error = %e, "cannot remove a stale podman setup");
            }
        }
    }
}

/// The pid in a setup dir name `<SETUP_PREFIX><pid>-<random>`.
pub fn stale_setup_pid(name: &str) -> Option<u32> {
    let (pid, random) = name.strip_prefix(SETUP_PREFIX)?.split_once('-')?;
    if random.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// `storage.conf` pointing at the state dir, so the host's storage
/// settings (overlay options, mount programs) never apply.
pub fn storage_conf(root: &Path) -> String {
    let mut conf = String::from("[storage]\ndriver = \"vfs\"\n");
    let _ = writeln!(
        conf,
        "graphroot = {}",
        toml_string(&root.join("storage").to_string_lossy())
    );
    let _ = writeln!(
        conf,
        "runroot = {}",
        toml_string(&root.join("run").to_string_lossy())
    );
    conf
}

/// `s` as a TOML basic string: quoted, `"` and `\` escaped, control
/// characters as `\uXXXX`.
pub fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Makes `rootfs` a minimal busybox root: `/bin/busybox` and a symlink per
/// applet in `/bin`, the usual empty mount points, root in passwd/group.
pub fn build_rootfs(busybox: &Path, rootfs: &Path) -> Result<(), PodmanError> {
    for dir in [
        "bin", "dev", "etc", "proc", "root", "sys", "tmp", "usr", "var",
    ] {
        let path = rootfs.join(dir);
        fs::create_dir_all(&path).map_err(|e| PodmanError::io("create", &path, e))?;
    }
    let tmp = rootfs.join("tmp");
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o1777))
        .map_err(|e| PodmanError::io("chmod", &tmp, e))?;
    let target = rootfs.join("bin/busybox");
    fs::copy(busybox, &target)
        .map_err(|e| PodmanError::io("copy into the image rootfs", busybox, e))?;
    fs::set_permissions(&target, fs::Permissions::from_mode(0o755))
        .map_err(|e| PodmanError::io("chmod", &target, e))?;
    write(
        &rootfs.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\n",
    )?;
    write(&rootfs.join("etc/group"), "root:x:0:\n")?;

    let mut list = Command::new(busybox);
    list.arg("--list").stdin(Stdio::null());
    let applets = checked(&mut list, "busybox --list")?;
    let applets = String::from_utf8_lossy(&applets);
    let mut count = 0;
    for applet in applets.lines().map(str::trim) {
        if applet.is_empty() || applet == "busybox" || applet.contains('/') || applet == ".." {
            continue;
        }
        let link = rootfs.join("bin").join(applet);
        symlink("busybox", &link).map_err(|e| PodmanError::io("symlink", &link, e))?;
        count += 1;
    }
    if count == 0 {
        return Err(PodmanError::NoApplets {
            busybox: busybox.to_path_buf(),
        });
    }
    Ok(())
}

fn write(path: &PathBuf, contents: &str) -> Result<(), PodmanError> {
    fs::write(path, contents).map_err(|e| PodmanError::io("write", path, e))
}

/// Runs a setup command; its stdout when it succeeds.
fn checked(cmd: &mut Command, what: &str) -> Result<Vec<u8>, PodmanError> {
    match run_bounded(cmd, SETUP_TIMEOUT)? {
        Bounded::Finished(done) if done.status.success() => Ok(done.stdout),
        Bounded::Finished(done) => Err(PodmanError::SetupFailed {
            what: what.to_owned(),
            status: done.status,
            stderr: String::from_utf8_lossy(&done.stderr).trim().to_owned(),
        }),
        Bounded::TimedOut => Err(PodmanError::Timeout {
            what: what.to_owned(),
            timeout: SETUP_TIMEOUT,
        }),
    }
}
