//! Shared by the integration tests that run the `gpu-dra` binary: where the
//! repository and test data are, and one run of a subcommand.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A file under `cli/tests/data`.
pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// How one run of the binary ended.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// `gpu-dra <subcommand> <args>`.
pub fn gpu_dra<S: AsRef<OsStr>>(subcommand: &str, args: &[S]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .arg(subcommand)
        .args(args)
        .output()
        .expect("run gpu-dra");
    Run {
        code: out.status.code().expect("exit status"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// `gpu-dra <subcommand> --output json <args>`: the exit status and the
/// parsed report (a panic naming both streams when stdout is not JSON).
pub fn gpu_dra_json<S: AsRef<OsStr>>(subcommand: &str, args: &[S]) -> (i32, Value) {
    let mut all: Vec<OsString> = vec!["--output".into(), "json".into()];
    all.extend(args.iter().map(|a| a.as_ref().to_owned()));
    let run = gpu_dra(subcommand, &all);
    let report = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", run.stdout, run.stderr));
    (run.code, report)
}
