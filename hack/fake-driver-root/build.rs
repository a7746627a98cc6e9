//! Compiles the MPS control stand-in (`src/bin/fake-mps-control.rs`) into
//! `OUT_DIR`, for the library to embed with `include_bytes!`.
//!
//! Why a build script: the fake root must contain the compiled program
//! wherever the library is used (the driver's tests, the demo, the
//! benchmarks), and cargo does not build a dependency's binaries. The
//! program uses std only, so plain `rustc` builds it. (Cargo also builds it
//! as this package's own binary target, which runs its unit tests and lints
//! it; the embedded copy is this one.)

use std::env;
use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "src/bin/fake-mps-control.rs";
/// The file name in `OUT_DIR`; the library includes it.
const OUTPUT: &str = "fake-mps-control";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-changed=src/layout.rs");
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let mut cmd = Command::new(&rustc);
    cmd.arg(manifest.join(SOURCE))
        .args(["--edition", "2024", "--crate-type", "bin", "--crate-name"])
        .arg(OUTPUT.replace('-', "_"))
        .args([
            "-C",
            "opt-level=2",
            "-C",
            "strip=symbols",
            "-C",
            "debuginfo=0",
        ])
        .arg("-o")
        .arg(out_dir.join(OUTPUT));
    let target = env::var("TARGET").unwrap_or_default();
    if !target.is_empty() && env::var("HOST").ok().as_deref() != Some(target.as_str()) {
        cmd.args(["--target", &target]);
    }
    let output = match cmd.output() {
        Ok(o) => o,
        Err(e) => panic!("cannot run {}: {e}", rustc.display()),
    };
    assert!(
        output.status.success(),
        "{} failed to compile {SOURCE} ({}):\n{}",
        rustc.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}
