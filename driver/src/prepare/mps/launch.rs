//! The MPS daemon launcher: the plugin's own program, started as
//! `<program> mps-launch <shm-dir> <pipe-dir> <control-program> -d`, gives
//! itself a private mount namespace, bind-mounts the daemon's `shm/` on
//! `/dev/shm` and its `pipe/` on `/tmp/nvidia-mps`, and execs the control
//! program, which (and every server it forks) then sees exactly the paths
//! containers get. Without `-d` it runs a client of that daemon the same
//! way: the plugin does so when the daemon's socket path on its side
//! (`<mps-dir>/<id>/pipe/control`) is too long for a UNIX socket,
//! since `/tmp/nvidia-mps/control` never is.
//!
//! One program start instead of four (`unshare`, `sh`, two `mount`s), and
//! no util-linux or shell needed in the plugin's image. It is done with a
//! new process rather than in the plugin between fork and exec because
//! that needs a `pre_exec` closure (`unsafe`), and the plugin's process
//! must keep the host's mounts. The launcher runs before anything else in
//! `main` (no runtime, no other thread), so unsharing its mount namespace
//! affects nothing but itself and what it execs.
//!
//! `<program> mps-launch --probe` does the same steps with `/dev/shm` bound
//! on itself and exits 0: the trial that decides [`super::ShmMode`].
//!
//! Every failure is one `error: <step>: <reason>` line on stderr and exit
//! status 1 (the plugin shows it in the start error); nothing is left
//! behind, since the mounts die with the namespace.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};

use super::CONTAINER_PIPE_DIR;

/// The first argument that selects the launcher in a program that has one.
pub const LAUNCH_ARG: &str = "mps-launch";
/// The second argument of the trial run.
pub const PROBE_ARG: &str = "--probe";
/// The launcher of a program that runs [`run_if_asked`] first: itself (the
/// kernel's link to the running program, valid even after its file was
/// replaced on disk by an upgrade).
pub const SELF_EXE: &str = "/proc/self/exe";

/// What the launcher was asked to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launch {
    /// The trial: private namespace, `/dev/shm` bound on itself, exit 0.
    Probe,
    /// Mount `shm` on `/dev/shm` and `pipe` on `/tmp/nvidia-mps`, then run
    /// `program` with `args`.
    Daemon {
        /// The daemon's shm directory.
        shm: PathBuf,
        /// The daemon's pipe directory.
        pipe: PathBuf,
        /// The control program.
        program: PathBuf,
        /// Its arguments (`-d`; none for a client).
        args: Vec<OsString>,
    },
}

impl Launch {
    /// The arguments after the launcher's program name, `mps-launch` first.
    pub fn args(&self) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec![LAUNCH_ARG.into()];
        match self {
            Self::Probe => argv.push(PROBE_ARG.into()),
            Self::Daemon {
                shm,
                pipe,
                program,
                args,
            } => {
                argv.extend([shm, pipe, program].map(|p| p.as_os_str().to_owned()));
                argv.extend(args.iter().cloned());
            }
        }
        argv
    }

    /// A command that runs this launch through `launcher`, with the mount
    /// point [`CONTAINER_PIPE_DIR`] made first (the launcher's namespace
    /// starts as a copy of the caller's, same `/tmp`).
    pub fn command(&self, launcher: &Path) -> std::io::Result<Command> {
        std::fs::create_dir_all(CONTAINER_PIPE_DIR)?;
        let mut cmd = Command::new(launcher);
        cmd.args(self.args());
        Ok(cmd)
    }

    /// Parses the arguments after `mps-launch`.
    pub fn parse(args: &[OsString]) -> Result<Self, String> {
        match args {
            [] => Err(format!(
                "{LAUNCH_ARG}: expected {PROBE_ARG} or <shm-dir> <pipe-dir> <program> [args...]"
            )),
            [probe] if probe == PROBE_ARG => Ok(Self::Probe),
            [probe, extra, ..] if probe == PROBE_ARG => Err(format!(
                "{LAUNCH_ARG} {PROBE_ARG}: unexpected argument \"{}\"",
                extra.display()
            )),
            [shm, pipe, program, rest @ ..] => {
                for (what, path) in [
                    ("shm directory", shm),
                    ("pipe directory", pipe),
                    ("program", program),
                ] {
                    if !Path::new(path).is_absolute() {
                        return Err(format!(
                            "{LAUNCH_ARG}: the {what} must be an absolute path, got \"{}\"",
                            path.display()
                        ));
                    }
                }
                Ok(Self::Daemon {
                    shm: shm.into(),
                    pipe: pipe.into(),
                    program: program.into(),
                    args: rest.to_vec(),
                })
            }
            _ => Err(format!(
                "{LAUNCH_ARG}: expected <shm-dir> <pipe-dir> <program> [args...], got {} argument(s)",
                args.len()
            )),
        }
    }
}

/// Runs the launcher when this process was started as one (first argument
/// `mps-launch`): `Some(status)` on failure or after the probe; on success
/// a daemon launch never returns (the control program replaces this
/// process). `None`: an ordinary start, go on with `main`.
///
/// Call it first in `main`, before any thread is started.
pub fn run_if_asked() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(OsStr::new(LAUNCH_ARG)) {
        return None;
    }
    let rest: Vec<OsString> = args.collect();
    let err = match Launch::parse(&rest) {
        Ok(launch) => match run(&launch) {
            Ok(()) => return Some(ExitCode::SUCCESS),
            Err(e) => e,
        },
        Err(e) => e,
    };
    eprintln!("error: {err}");
    Some(ExitCode::FAILURE)
}

/// Does what `launch` says; returns only after the probe or on failure.
fn run(launch: &Launch) -> Result<(), String> {
    unshare(CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("unshare the mount namespace: {}", e.desc()))?;
    // As `unshare --propagation private`: nothing mounted here shows up in
    // the host's namespace (or the plugin's), nor the other way round.
    make_private("/")?;
    match launch {
        Launch::Probe => bind(Path::new("/dev/shm"), Path::new("/dev/shm")),
        Launch::Daemon {
            shm,
            pipe,
            program,
            args,
        } => {
            bind(shm, Path::new("/dev/shm"))?;
            bind(pipe, Path::new(CONTAINER_PIPE_DIR))?;
            let err = Command::new(program).args(args).exec();
            Err(format!("run {}: {err}", program.display()))
        }
    }
}

/// Makes `target` and every mount under it private to this namespace.
fn make_private(target: &str) -> Result<(), String> {
    let flags = MsFlags::MS_REC | MsFlags::MS_PRIVATE;
    mount(None::<&str>, target, None::<&str>, flags, None::<&str>)
        .map_err(|e| format!("make {target} a private mount: {}", e.desc()))
}

fn bind(source: &Path, target: &Path) -> Result<(), String> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| {
        format!(
            "bind mount {} on {}: {}",
            source.display(),
            target.display(),
            e.desc()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn arguments_round_trip() {
        let daemon = Launch::Daemon {
            shm: "/state/mps/c1/shm".into(),
            pipe: "/state/mps/c1/pipe".into(),
            program: "/driver/usr/bin/nvidia-cuda-mps-control".into(),
            args: os(&["-d"]),
        };
        for launch in [Launch::Probe, daemon] {
            let argv = launch.args();
            assert_eq!(argv[0], LAUNCH_ARG);
            assert_eq!(Launch::parse(&argv[1..]), Ok(launch));
        }
        assert_eq!(
            Launch::parse(&os(&["/s", "/p", "/bin/prog"])),
            Ok(Launch::Daemon {
                shm: "/s".into(),
                pipe: "/p".into(),
                program: "/bin/prog".into(),
                args: vec![],
            })
        );
    }

    #[test]
    fn malformed_arguments_are_refused_with_the_reason() {
        for (args, expected) in [
            (&[][..], "expected --probe or <shm-dir>"),
            (&["--probe", "x"][..], "unexpected argument \"x\""),
            (&["/s", "/p"][..], "got 2 argument(s)"),
            (&["/s"][..], "got 1 argument(s)"),
            (
                &["shm", "/p", "/bin/prog", "-d"][..],
                "the shm directory must be an absolute path, got \"shm\"",
            ),
            (
                &["/s", "../p", "/bin/prog"][..],
                "the pipe directory must be an absolute path",
            ),
            (
                &["/s", "/p", "nvidia-cuda-mps-control", "-d"][..],
                "the program must be an absolute path",
            ),
        ] {
            let err = Launch::parse(&os(args)).unwrap_err();
            assert!(err.contains(expected), "{args:?}: {err}");
            assert!(err.starts_with(LAUNCH_ARG), "{err}");
        }
    }
}
