//! A realistic fake NVIDIA driver root, for tests and the demo.
//!
//! [`FakeDriverRoot::create`] lays out what the plugin expects under
//! `--driver-root`: the user-space libraries as small real files with their
//! soname symlinks (`libcuda.so.<version>` ← `libcuda.so.1` ← `libcuda.so`,
//! `libnvidia-ml`, `libnvidia-ptxjitcompiler`, ...), GSP firmware, and the
//! programs in `usr/bin`:
//!
//! - `nvidia-smi` (a POSIX `sh` script; dash and busybox ash): `-i <GPU> -c
//!   <MODE>`, `compute-policy -i <GPU> --set-timeslice <0-3>`, `-L`; keeps
//!   per-GPU settings ([`FakeDriverRoot::gpu_state`]);
//! - `nvidia-cuda-mps-control`, a compiled program (std-only Rust, built by
//!   `build.rs`; [`Options::shell`] does not apply to it): `-d` starts a
//!   control daemon in the background (its own process group, not its own
//!   session: std has no `setsid` without `unsafe`; it outlives its parent)
//!   that writes `nvidia-cuda-mps-control.pid`, listens on the UNIX socket
//!   `control` in `CUDA_MPS_PIPE_DIRECTORY` (with the real 107-byte path
//!   limit), logs to `CUDA_MPS_LOG_DIRECTORY/control.log` in the real
//!   daemon's format, and answers the commands clients pipe into
//!   `nvidia-cuda-mps-control` (`get_server_list`,
//!   `set_default_active_thread_percentage`,
//!   `set_default_device_pinned_mem_limit`, their getters, `quit`); its
//!   settings are readable with [`FakeDriverRoot::mps_state`];
//! - `nvidia-cuda-mps-server`, `nvidia-debugdump`, `nvidia-persistenced`,
//!   `nvidia-cdi-hook` (scripts): record their call only.
//!
//! Every program records its invocation (arguments and the CUDA/MPS
//! environment) and the MPS daemon every command it processes, in order, in
//! `var/log/fake-driver/calls.log`, parsed back by [`FakeDriverRoot::calls`]
//! and [`FakeDriverRoot::mps_commands`]. Failures and slowness are switched on
//! with [`FakeDriverRoot::set_behaviour`].
//!
//! [`create_dev_root`] and [`create_proc_root`] make stand-in `--dev-root`
//! and `--proc-root` trees; [`sysfs`] a stand-in `--sysfs-root` with a
//! stand-in kernel that rebinds GPUs for VFIO passthrough. Daemons started from a root are found and killed
//! with [`FakeDriverRoot::kill_processes`] or a [`ProcessGuard`].

mod layout;
mod nodes;
mod procs;
mod record;
mod scripts;
pub mod sysfs;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

pub use layout::{BEHAVIOUR_FILE, CALL_LOG, MPS_PID_FILE, MPS_STATE_FILE, RECORDED_ENV};
pub use nodes::{DevRoot, NodeKind, create_dev_root, create_proc_root, create_proc_root_for};
pub use procs::{
    ProcessGuard, cmdline, is_alive, kill, kill_under, parent_id, process_group_id,
    processes_under, session_id, stat_cpu_ticks, terminate,
};
pub use record::{Call, MpsCommand, Record};
pub use scripts::sh_quote;

use scripts::Program;

/// The driver version of a root made with default options.
pub const DEFAULT_DRIVER_VERSION: &str = "580.65.06";
/// `nvidia-smi`'s per-GPU settings, relative to the root.
pub const GPU_STATE: &str = "var/lib/fake-driver/gpu-state";

/// Libraries: `(name, soname suffix)`; each gets `<name>.<version>` and,
/// when it has a soname, `<name>.<suffix>` and `<name>` links.
const LIBRARIES: &[(&str, Option<&str>)] = &[
    ("libcuda.so", Some("1")),
    ("libnvidia-ml.so", Some("1")),
    ("libnvidia-ptxjitcompiler.so", Some("1")),
    ("libnvidia-nvvm.so", Some("4")),
    ("libcudadebugger.so", Some("1")),
    ("libnvidia-gpucomp.so", None),
    ("libnvidia-allocator.so", Some("1")),
    ("libnvidia-cfg.so", Some("1")),
    ("libnvidia-opencl.so", Some("1")),
];
/// GSP firmware files under `lib/firmware/nvidia/<version>/`.
const FIRMWARE: &[&str] = &["gsp_ga10x.bin", "gsp_tu10x.bin"];

/// Errors of the fake driver root.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// An option or behaviour value cannot be written into the scripts.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidOption {
        /// Which option.
        what: &'static str,
        /// The value given.
        value: String,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// The call log or a state file is malformed.
    #[error("malformed {path} at byte {offset}: {reason}")]
    BadLog {
        /// The file.
        path: PathBuf,
        /// Byte offset of the bad record.
        offset: usize,
        /// What is wrong.
        reason: String,
    },
    /// A stand-in device node could not be made.
    #[error("device node {path}: {reason}")]
    Node {
        /// The node.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
}

pub(crate) fn io_err(op: &'static str, path: &Path, source: io::Error) -> Error {
    Error::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// How the root is built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Driver version in library names and `nvidia-smi` output.
    pub driver_version: String,
    /// The interpreter line of the scripts: `/bin/sh`, or e.g.
    /// `/usr/bin/busybox sh` to prove they run under busybox. The compiled
    /// `nvidia-cuda-mps-control` ignores it.
    pub shell: String,
    /// GPU UUIDs `nvidia-smi` knows (`-i` with another gives "No devices
    /// were found", exit 6); empty accepts any well-formed id.
    pub gpus: Vec<String>,
    /// Whether `usr/bin/nvidia-cdi-hook` exists (the plugin adds the
    /// ldcache hook to CDI specs when it does).
    pub cdi_hook: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            driver_version: DEFAULT_DRIVER_VERSION.into(),
            shell: "/bin/sh".into(),
            gpus: Vec::new(),
            cdi_hook: true,
        }
    }
}

/// Failures and delays the programs simulate; [`Default`] is a healthy driver.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Behaviour {
    /// `nvidia-smi` prints the message on stderr and exits with the status.
    pub nvidia_smi_failure: Option<(u8, String)>,
    /// `nvidia-cuda-mps-control -d` prints the message and exits 1.
    pub mps_start_failure: Option<String>,
    /// The daemon waits this long before writing its pid file and listening.
    pub mps_start_delay_ms: u32,
    /// The daemon writes its pid file and log but never listens.
    pub mps_never_ready: bool,
    /// How long a client waits for an answer (default 5000).
    pub mps_reply_timeout_ms: Option<u32>,
    /// The daemon waits this long before answering each command.
    pub mps_reply_delay_ms: u32,
    /// The daemon refuses every command with this first word (e.g.
    /// `set_default_device_pinned_mem_limit`), as a real daemon refuses a
    /// setting it does not support.
    pub mps_refused_command: Option<String>,
}

/// `nvidia-smi`'s settings per GPU UUID (the last one set wins).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuState {
    /// `compute-policy --set-timeslice` values.
    pub timeslice: BTreeMap<String, u8>,
    /// Compute modes (`DEFAULT`, `EXCLUSIVE_PROCESS`, `PROHIBITED`).
    pub compute_mode: BTreeMap<String, String>,
}

/// What a fake MPS control daemon holds, from its pipe directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MpsState {
    /// The daemon's pid.
    pub daemon_pid: Option<u32>,
    /// `(st_dev, st_ino)` of the daemon's `/dev/shm`, to check which
    /// directory it really is.
    pub dev_shm: Option<(u64, u64)>,
    /// `CUDA_VISIBLE_DEVICES` the daemon was started with.
    pub visible_devices: String,
    /// The last `set_default_active_thread_percentage` value.
    pub active_thread_percentage: Option<String>,
    /// The last `set_default_device_pinned_mem_limit` value per device.
    pub pinned_mem_limits: BTreeMap<String, String>,
}

/// A fake driver root on disk.
#[derive(Clone, Debug)]
pub struct FakeDriverRoot {
    root: PathBuf,
    options: Options,
}

fn check_word(what: &'static str, value: &str, allowed: fn(char) -> bool) -> Result<(), Error> {
    if value.is_empty() || value.len() > 128 || !value.chars().all(allowed) {
        return Err(Error::InvalidOption {
            what,
            value: value.to_owned(),
            reason: "must be 1 to 128 characters of the allowed set",
        });
    }
    Ok(())
}

fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<(), Error> {
    let tmp = path.with_extension("fake-tmp");
    fs::write(&tmp, data).map_err(|e| io_err("write", &tmp, e))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))
        .map_err(|e| io_err("chmod", &tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| io_err("rename", path, e))
}

fn replace_symlink(target: &str, link: &Path) -> Result<(), Error> {
    match fs::remove_file(link) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("remove", link, e)),
    }
    symlink(target, link).map_err(|e| io_err("symlink", link, e))
}

fn mkdirs(path: &Path) -> Result<(), Error> {
    fs::create_dir_all(path).map_err(|e| io_err("create dir", path, e))
}

impl FakeDriverRoot {
    /// Builds a root with default [`Options`] in `dir` (created if needed).
    pub fn create(dir: &Path) -> Result<Self, Error> {
        Self::create_with(dir, Options::default())
    }

    /// Builds a root in `dir` (created if needed; existing files of the
    /// same names are replaced). `dir` is made absolute.
    pub fn create_with(dir: &Path, options: Options) -> Result<Self, Error> {
        check_word("driver version", &options.driver_version, |c| {
            c.is_ascii_digit() || c == '.'
        })?;
        for gpu in &options.gpus {
            check_word("GPU UUID", gpu, |c| c.is_ascii_alphanumeric() || c == '-')?;
        }
        if !options.shell.starts_with('/')
            || options.shell.len() > 120
            || options.shell.contains(['\n', '\0'])
        {
            return Err(Error::InvalidOption {
                what: "shell",
                value: options.shell.clone(),
                reason: "must be an absolute interpreter line of at most 120 bytes",
            });
        }
        mkdirs(dir)?;
        let root = fs::canonicalize(dir).map_err(|e| io_err("resolve", dir, e))?;
        let me = Self { root, options };
        me.build()?;
        Ok(me)
    }

    fn build(&self) -> Result<(), Error> {
        let version = &self.options.driver_version;
        let lib_dir = self.lib_dir();
        mkdirs(&lib_dir)?;
        for (name, soname) in LIBRARIES {
            let real = format!("{name}.{version}");
            let content = format!("fake NVIDIA driver library {real} (not a real ELF object)\n");
            write_file(&lib_dir.join(&real), content.as_bytes(), 0o644)?;
            if let Some(suffix) = soname {
                let so = format!("{name}.{suffix}");
                replace_symlink(&real, &lib_dir.join(&so))?;
                replace_symlink(&so, &lib_dir.join(name))?;
            }
        }
        let fw = self.root.join("lib/firmware/nvidia").join(version);
        mkdirs(&fw)?;
        for name in FIRMWARE {
            write_file(&fw.join(name), b"fake GSP firmware\n", 0o644)?;
        }

        let bin = self.root.join("usr/bin");
        mkdirs(&bin)?;
        let mut programs = vec![
            ("nvidia-smi", Program::NvidiaSmi),
            (
                "nvidia-cuda-mps-server",
                Program::Stub {
                    exit: 1,
                    message: "nvidia-cuda-mps-server: the fake driver root runs no MPS server",
                },
            ),
            (
                "nvidia-debugdump",
                Program::Stub {
                    exit: 0,
                    message: "",
                },
            ),
            (
                "nvidia-persistenced",
                Program::Stub {
                    exit: 0,
                    message: "",
                },
            ),
        ];
        if self.options.cdi_hook {
            programs.push((
                "nvidia-cdi-hook",
                Program::Stub {
                    exit: 0,
                    message: "",
                },
            ));
        }
        for (tool, program) in programs {
            let text = scripts::render(&self.options.shell, &self.root, tool, version, program);
            write_file(&bin.join(tool), text.as_bytes(), 0o755)?;
        }
        // Written under a temporary name and renamed into place, like every
        // file here: a daemon of an earlier build keeps running its old
        // file (no ETXTBSY).
        write_file(
            &bin.join("nvidia-cuda-mps-control"),
            scripts::MPS_CONTROL,
            0o755,
        )?;

        for dir in [
            "var/log/fake-driver",
            "var/lib/fake-driver",
            "etc/fake-driver",
        ] {
            mkdirs(&self.root.join(dir))?;
        }
        self.set_behaviour(&Behaviour::default())
    }

    /// The root directory (absolute).
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// The options it was built with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The library directory (`usr/lib/<arch>-linux-gnu`).
    pub fn lib_dir(&self) -> PathBuf {
        self.root
            .join(format!("usr/lib/{}-linux-gnu", std::env::consts::ARCH))
    }

    /// The path of a program in `usr/bin`.
    pub fn bin(&self, tool: &str) -> PathBuf {
        self.root.join("usr/bin").join(tool)
    }

    /// Switches failures and delays on or off for every later invocation
    /// (a running MPS daemon applies `mps_refused_command` from its next
    /// command on).
    pub fn set_behaviour(&self, b: &Behaviour) -> Result<(), Error> {
        let (smi_code, smi_message) = match &b.nvidia_smi_failure {
            Some((0, _)) => {
                return Err(Error::InvalidOption {
                    what: "nvidia-smi failure status",
                    value: "0".into(),
                    reason: "a failure needs a non-zero status",
                });
            }
            Some((code, message)) => (*code, message.as_str()),
            None => (0, ""),
        };
        let text = format!(
            "# written by the fake-driver-root crate\n\
             FAKE_GPUS={}\n\
             FAKE_SMI_FAIL_CODE={smi_code}\n\
             FAKE_SMI_FAIL_MESSAGE={}\n\
             FAKE_MPS_START_FAIL={}\n\
             FAKE_MPS_START_DELAY_MS={}\n\
             FAKE_MPS_NEVER_READY={}\n\
             FAKE_MPS_REPLY_TIMEOUT_MS={}\n\
             FAKE_MPS_REPLY_DELAY_MS={}\n\
             FAKE_MPS_REFUSE={}\n",
            sh_quote(&self.options.gpus.join(" ")),
            sh_quote(smi_message),
            sh_quote(b.mps_start_failure.as_deref().unwrap_or("")),
            b.mps_start_delay_ms,
            u8::from(b.mps_never_ready),
            b.mps_reply_timeout_ms.unwrap_or(5000),
            b.mps_reply_delay_ms,
            sh_quote(b.mps_refused_command.as_deref().unwrap_or("")),
        );
        write_file(&self.root.join(BEHAVIOUR_FILE), text.as_bytes(), 0o644)
    }

    /// Every record of the call log, in order.
    pub fn records(&self) -> Result<Vec<Record>, Error> {
        let path = self.root.join(CALL_LOG);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io_err("read", &path, e)),
        };
        record::parse(&bytes).map_err(|(offset, reason)| Error::BadLog {
            path,
            offset,
            reason,
        })
    }

    /// Every program invocation, in order.
    pub fn calls(&self) -> Result<Vec<Call>, Error> {
        Ok(self
            .records()?
            .into_iter()
            .filter_map(|r| match r {
                Record::Call(c) => Some(c),
                Record::MpsCommand(_) => None,
            })
            .collect())
    }

    /// The invocations of one program.
    pub fn calls_of(&self, tool: &str) -> Result<Vec<Call>, Error> {
        Ok(self
            .calls()?
            .into_iter()
            .filter(|c| c.tool == tool)
            .collect())
    }

    /// The invocations of `nvidia-smi`.
    pub fn nvidia_smi_calls(&self) -> Result<Vec<Call>, Error> {
        self.calls_of("nvidia-smi")
    }

    /// The invocations of `nvidia-cuda-mps-control` (daemon starts and clients).
    pub fn mps_control_calls(&self) -> Result<Vec<Call>, Error> {
        self.calls_of("nvidia-cuda-mps-control")
    }

    /// The commands MPS control daemons of this root processed, in order.
    pub fn mps_commands(&self) -> Result<Vec<MpsCommand>, Error> {
        Ok(self
            .records()?
            .into_iter()
            .filter_map(|r| match r {
                Record::MpsCommand(c) => Some(c),
                Record::Call(_) => None,
            })
            .collect())
    }

    /// Empties the call log.
    pub fn clear_log(&self) -> Result<(), Error> {
        let path = self.root.join(CALL_LOG);
        fs::write(&path, b"").map_err(|e| io_err("truncate", &path, e))
    }

    /// `nvidia-smi`'s settings per GPU.
    pub fn gpu_state(&self) -> Result<GpuState, Error> {
        let path = self.root.join(GPU_STATE);
        let mut state = GpuState::default();
        let Some(text) = read_optional(&path)? else {
            return Ok(state);
        };
        for (offset, line) in line_offsets(&text) {
            let bad = |reason: &str| Error::BadLog {
                path: path.clone(),
                offset,
                reason: format!("{reason}: {line:?}"),
            };
            let mut words = line.split(' ');
            match (words.next(), words.next(), words.next(), words.next()) {
                (Some("timeslice"), Some(uuid), Some(v), None) => {
                    let v = v.parse().map_err(|_| bad("bad timeslice"))?;
                    state.timeslice.insert(uuid.to_owned(), v);
                }
                (Some("compute_mode"), Some(uuid), Some(mode), None) => {
                    state.compute_mode.insert(uuid.to_owned(), mode.to_owned());
                }
                _ => return Err(bad("unknown line")),
            }
        }
        Ok(state)
    }

    /// The settings of the fake MPS daemon of `pipe_dir`; `None` when no
    /// daemon has run there (or the last one quit).
    pub fn mps_state(pipe_dir: &Path) -> Result<Option<MpsState>, Error> {
        let path = pipe_dir.join(MPS_STATE_FILE);
        let Some(text) = read_optional(&path)? else {
            return Ok(None);
        };
        let mut state = MpsState::default();
        for (offset, line) in line_offsets(&text) {
            let bad = |reason: &str| Error::BadLog {
                path: path.clone(),
                offset,
                reason: format!("{reason}: {line:?}"),
            };
            let mut words = line.splitn(3, ' ');
            let (Some(key), Some(dev)) = (words.next(), words.next()) else {
                return Err(bad("short line"));
            };
            let value = words.next().unwrap_or("");
            match key {
                "daemon_pid" => {
                    state.daemon_pid = Some(value.parse().map_err(|_| bad("bad pid"))?);
                }
                "dev_shm" => {
                    state.dev_shm = value
                        .split_once(':')
                        .and_then(|(d, i)| Some((d.parse().ok()?, i.parse().ok()?)));
                }
                "visible_devices" => value.clone_into(&mut state.visible_devices),
                "active_thread_percentage" => {
                    state.active_thread_percentage = Some(value.to_owned());
                }
                "pinned_mem_limit" => {
                    state
                        .pinned_mem_limits
                        .insert(dev.to_owned(), value.to_owned());
                }
                _ => return Err(bad("unknown key")),
            }
        }
        Ok(Some(state))
    }

    /// Live processes started from this root (daemons, clients).
    pub fn processes(&self) -> Vec<u32> {
        processes_under(&self.root)
    }

    /// Kills every process started from this root; returns how many.
    pub fn kill_processes(&self) -> usize {
        kill_under(&self.root)
    }

    /// A guard that kills this root's processes when dropped.
    pub fn guard(&self) -> ProcessGuard {
        ProcessGuard::new(self.root.clone())
    }
}

fn read_optional(path: &Path) -> Result<Option<String>, Error> {
    match fs::read(path) {
        Ok(b) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("read", path, e)),
    }
}

/// Non-empty lines with their byte offsets.
fn line_offsets(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut offset = 0;
    text.split_inclusive('\n').filter_map(move |raw| {
        let at = offset;
        offset += raw.len();
        let line = raw.trim_end_matches('\n');
        (!line.is_empty()).then_some((at, line))
    })
}

#[cfg(test)]
mod tests;
