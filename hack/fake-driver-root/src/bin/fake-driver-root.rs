//! `fake-driver-root`: lays out a fake NVIDIA driver root and proc root on a
//! machine without GPUs, for the real test cluster (`hack/cluster/up
//! --with-driver`), which mounts them into the plugin's pod as a GPU node's
//! driver installation.
//!
//! ```text
//! fake-driver-root --driver-root DIR --proc-root DIR [--driver-version V] [--shell PATH]
//! ```
//!
//! The device nodes are made by the caller (as char devices in the host's
//! `/dev`, where the container runtime looks for the hosts paths of CDI specs).

use std::path::PathBuf;
use std::process::ExitCode;

use fake_driver_root::{FakeDriverRoot, Options, create_proc_root_for};

const USAGE: &str = "usage: fake-driver-root --driver-root DIR --proc-root DIR \
                     [--driver-version V] [--shell PATH]";

/// The parsed command line.
#[derive(Debug, PartialEq, Eq)]
struct Args {
    driver_root: PathBuf,
    proc_root: PathBuf,
    options: Options,
}

fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut driver_root = None;
    let mut proc_root = None;
    let mut options = Options::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_owned(), Some(v.to_owned())),
            None => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--driver-root" => driver_root = Some(PathBuf::from(value()?)),
            "--proc-root" => proc_root = Some(PathBuf::from(value()?)),
            "--driver-version" => options.driver_version = value()?,
            "--shell" => options.shell = value()?,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let absolute = |what: &str, p: Option<PathBuf>| match p {
        Some(p) if p.is_absolute() => Ok(p),
        Some(p) => Err(format!(
            "{what} must be an absolute path, not {}",
            p.display()
        )),
        None => Err(format!("{what} is required\n{USAGE}")),
    };
    Ok(Args {
        driver_root: absolute("--driver-root", driver_root)?,
        proc_root: absolute("--proc-root", proc_root)?,
        options,
    })
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("fake-driver-root: {e}");
            return ExitCode::from(2);
        }
    };
    let version = args.options.driver_version.clone();
    if let Err(e) = FakeDriverRoot::create_with(&args.driver_root, args.options) {
        eprintln!("fake-driver-root: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = create_proc_root_for(&args.proc_root, &version) {
        eprintln!("fake-driver-root: {e}");
        return ExitCode::FAILURE;
    }
    println!(
        "driver root {} (driver {version}), proc root {}",
        args.driver_root.display(),
        args.proc_root.display()
    );
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Args, String> {
        parse(list.iter().map(ToString::to_string))
    }

    #[test]
    fn flags_with_and_without_equals() {
        let a = args(&[
            "--driver-root=/d",
            "--proc-root",
            "/p",
            "--driver-version",
            "580.1",
        ])
        .unwrap();
        assert_eq!(a.driver_root, PathBuf::from("/d"));
        assert_eq!(a.proc_root, PathBuf::from("/p"));
        assert_eq!(a.options.driver_version, "580.1");
        assert_eq!(a.options.shell, "/bin/sh");
    }

    #[test]
    fn bad_command_lines_are_refused_with_the_reason() {
        let err = |l: &[&str]| args(l).unwrap_err();
        assert!(err(&["--proc-root=/p"]).contains("--driver-root is required"));
        assert!(err(&["--driver-root=rel", "--proc-root=/p"]).contains("absolute path, not rel"));
        assert!(err(&["--driver-root"]).contains("--driver-root needs a value"));
        assert!(err(&["--bogus"]).contains("unknown argument \"--bogus\""));
    }
}
