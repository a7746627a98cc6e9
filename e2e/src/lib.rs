//! End-to-end test support against real peers: harnesses for podman (CDI
//! specs consumed by a real container runtime) and a grpc-go client (the
//! plugin's sockets as kubelet's gRPC library sees them), the `gpu-dra`
//! binary for the tests that run it ([`bins`]), public Go modules fetched
//! from the Go module proxy ([`go_module`]: NVIDIA's demo manifests), and
//! the loud skip of a test whose peer is missing. The simulated peers (API
//! server stand-in, kubelet simulator) are `gpu-dra-sim`; the real
//! cluster's tests are `tests/real_cluster/`, the benchmark runner
//! `src/bin/bench.rs`.

pub mod bins;
pub mod go_module;
pub mod grpc_go;
pub mod podman;

/// For a test whose real peer (podman, grpc-go) is missing here, as `err`
/// says: `Ok(None)` after a loud skip message on stderr naming `test`, or
/// the error when the environment variable `require_env` is `1` (CI sets it
/// once it has installed the peer).
pub fn skip_unless_required<T, E: std::fmt::Display>(
    test: &str,
    require_env: &str,
    err: E,
) -> Result<Option<T>, E> {
    if std::env::var(require_env).is_ok_and(|v| v == "1") {
        return Err(err);
    }
    eprintln!(
        "\n!!!!!!!! SKIPPED {test}: {err}\n!!!!!!!! (set {require_env}=1 to make this a failure)\n"
    );
    Ok(None)
}
