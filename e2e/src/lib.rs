//! End-to-end test support: the kubelet simulator and the test API server.

pub mod apiserver;
pub mod kubelet;
