//! End-to-end test support: the kubelet simulator, the test API server and
//! the pool-completeness check.

pub mod apiserver;
pub mod kubelet;
pub mod podman;
pub mod pool;
