//! The fake driver programs: POSIX `sh` scripts (they run under dash and
//! busybox ash alike) assembled from a generated header, a common part
//! (recording, behaviour file) and one body per program; and the compiled
//! `nvidia-cuda-mps-control` stand-in ([`MPS_CONTROL`], built by `build.rs`
//! from `src/bin/fake-mps-control.rs`), which needs a real UNIX socket and
//! must cost little per daemon start.
//!
//! The header pins the driver root's absolute path into each script, so a
//! program records into its root however it was invoked (absolute path, a
//! `PATH` lookup, through `unshare`...); the compiled program finds its root
//! from its own file (`/proc/self/exe`).

use std::fmt::Write;
use std::path::Path;

/// What every program shares: behaviour defaults, recording, helpers.
const COMMON: &str = include_str!("scripts/common.sh");
/// `nvidia-smi`: compute mode, compute policy (time-slice), `-L`.
const NVIDIA_SMI: &str = include_str!("scripts/nvidia-smi.sh");
/// Programs that only record their call.
const STUB: &str = include_str!("scripts/stub.sh");
/// `nvidia-cuda-mps-control` (daemon and client), a compiled program for
/// this machine; it ignores `Options::shell`.
pub(crate) const MPS_CONTROL: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fake-mps-control"));

/// The body of one fake program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Program {
    /// `nvidia-smi`.
    NvidiaSmi,
    /// A program that records its call, prints `message` on stderr when not
    /// empty, and exits with `exit`.
    Stub {
        /// Exit status.
        exit: u8,
        /// Message printed on stderr.
        message: &'static str,
    },
}

/// Quotes `s` as one word for `sh` (single quotes, `'` spelled `'\''`).
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The full text of the fake `tool` for the driver root `root`.
pub(crate) fn render(
    shell: &str,
    root: &Path,
    tool: &str,
    driver_version: &str,
    program: Program,
) -> String {
    let mut out = String::with_capacity(8 * 1024);
    out.push_str("#!");
    out.push_str(shell);
    out.push('\n');
    out.push_str(
        "# A stand-in written by the fake-driver-root crate for tests; not NVIDIA's program.\n",
    );
    // Writing into a String cannot fail.
    let _ = write!(
        out,
        "FAKE_ROOT={}\nFAKE_TOOL={}\nFAKE_DRIVER_VERSION={}\n",
        sh_quote(&root.to_string_lossy()),
        sh_quote(tool),
        sh_quote(driver_version)
    );
    if let Program::Stub { exit, message } = program {
        let _ = write!(
            out,
            "FAKE_STUB_EXIT={exit}\nFAKE_STUB_MESSAGE={}\n",
            sh_quote(message)
        );
    }
    out.push_str(COMMON);
    out.push_str(match program {
        Program::NvidiaSmi => NVIDIA_SMI,
        Program::Stub { .. } => STUB,
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_single_quotes_and_specials() {
        assert_eq!(sh_quote("plain"), "'plain'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote("$(rm -rf /)\n`x`"), "'$(rm -rf /)\n`x`'");
    }

    #[test]
    fn header_pins_root_tool_and_version() {
        let text = render(
            "/bin/sh",
            Path::new("/tmp/r o'ot"),
            "nvidia-smi",
            "580.65.06",
            Program::NvidiaSmi,
        );
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("#!/bin/sh"));
        assert!(text.contains(r"FAKE_ROOT='/tmp/r o'\''ot'"));
        assert!(text.contains("FAKE_TOOL='nvidia-smi'"));
        assert!(text.contains("FAKE_DRIVER_VERSION='580.65.06'"));
        assert!(text.contains("compute-policy"));
        assert!(!text.contains("FAKE_STUB_EXIT"));
    }

    #[test]
    fn stubs_carry_their_exit_status() {
        let text = render(
            "/usr/bin/busybox sh",
            Path::new("/r"),
            "nvidia-cuda-mps-server",
            "1",
            Program::Stub {
                exit: 1,
                message: "not run by the fake",
            },
        );
        assert!(text.starts_with("#!/usr/bin/busybox sh\n"));
        assert!(text.contains("FAKE_STUB_EXIT=1\n"));
        assert!(text.contains("FAKE_STUB_MESSAGE='not run by the fake'\n"));
    }
}
