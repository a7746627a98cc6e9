//! End-to-end test support: the kubelet simulator, the test API server, the
//! pool-completeness check, and harnesses for two real peers (podman for
//! CDI specs, a grpc-go client for the plugin's sockets).

pub mod apiserver;
pub mod grpc_go;
pub mod kubelet;
pub mod podman;
pub mod pool;

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
