//! End-to-end test support: the kubelet simulator, the test API server, the
//! pool-completeness check, and harnesses for two real peers (podman for
//! CDI specs, a grpc-go client for the plugin's sockets).

pub mod apiserver;
pub mod grpc_go;
pub mod kubelet;
pub mod podman;
pub mod pool;
