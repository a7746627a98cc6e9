//! Where a fake driver root keeps what its programs record and read: shared
//! by the library and the compiled MPS control stand-in, which includes this
//! file with `#[path]` (it is compiled alone with plain `rustc`, see
//! `build.rs`, and can depend on no crate). Paths are relative to the root,
//! file names relative to an MPS daemon's pipe directory.

/// The call log, relative to the root.
pub const CALL_LOG: &str = "var/log/fake-driver/calls.log";
/// The behaviour file the programs read, relative to the root.
pub const BEHAVIOUR_FILE: &str = "etc/fake-driver/behaviour.conf";
/// The fake MPS daemon's settings file inside its pipe directory.
pub const MPS_STATE_FILE: &str = "fake-mps-state";
/// The pid file the MPS control daemon writes into its pipe directory.
pub const MPS_PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// The environment variables every call record carries, in order.
pub const RECORDED_ENV: &[&str] = &[
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
];
