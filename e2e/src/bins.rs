//! The `gpu-dra` binary, for the tests of this package that run it: cargo
//! hands a test only its own package's binaries (`CARGO_BIN_EXE_*`), so
//! these take it from `GPU_DRA_BIN`, else from the target folder, where
//! `cargo test --workspace` and `cargo build -p gpu-dra --bin gpu-dra` put
//! it. The tests do not build it.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The environment variable naming the `gpu-dra` binary to test.
pub const BIN_ENV: &str = "GPU_DRA_BIN";

/// The repository root.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e has a parent")
        .to_path_buf()
}

/// The newest modification time of the files under `dir`.
fn newest(dir: &Path) -> Option<SystemTime> {
    let mut best = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let time = if path.is_dir() {
            newest(&path)
        } else {
            entry.metadata().ok().and_then(|m| m.modified().ok())
        };
        best = best.max(time);
    }
    best
}

/// The `gpu-dra` binary: `GPU_DRA_BIN`, else `<target>/debug/gpu-dra`
/// (with a warning on stderr when it is older than the sources of `cli/`,
/// `api/` or `analysis/`, the crates it is built from). `Err` says how to get one.
pub fn gpu_dra() -> Result<PathBuf, String> {
    if let Ok(path) = std::env::var(BIN_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{BIN_ENV}={} is not a file", path.display()))
        };
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map_or_else(|_| repo_root().join("target"), PathBuf::from);
    let path = target.join("debug").join("gpu-dra");
    let Ok(meta) = std::fs::metadata(&path) else {
        return Err(format!(
            "no gpu-dra binary at {} (and {BIN_ENV} is unset): build it first with \
             `cargo build -p gpu-dra --bin gpu-dra`, or point {BIN_ENV} at one",
            path.display()
        ));
    };
    let built = meta.modified().ok();
    let sources = ["cli/src", "api/src", "analysis/src"]
        .iter()
        .filter_map(|d| newest(&repo_root().join(d)))
        .max();
    if built < sources {
        eprintln!(
            "WARNING: {} is older than the sources of cli/, api/ or analysis/: it may not be the code under \
             test (cargo build -p gpu-dra --bin gpu-dra)",
            path.display()
        );
    }
    Ok(path)
}
