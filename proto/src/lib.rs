//! The kubelet-facing gRPC protocols a DRA driver speaks, generated from the
//! `.proto` files in `proto/`, which are wire-exact copies of the published
//! kubelet contract (package names and field numbers).
//!
//! - [`dra::v1`] and [`dra::v1beta1`]: the `DRAPlugin` service
//!   (NodePrepareResources / NodeUnprepareResources).
//! - [`registration`]: the plugin registration service kubelet calls first.
//! - [`health::v1alpha1`] and [`health::v1`]: the `DRAResourceHealth` stream.

#![allow(clippy::pedantic, missing_docs)]

/// The `DRAPlugin` service in both versions kubelet speaks.
pub mod dra {
    /// `k8s.io.kubelet.pkg.apis.dra.v1` (Kubernetes 1.34+).
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1` (Kubernetes 1.32+).
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }
}

/// `pluginregistration`: kubelet's plugin watcher protocol.
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// `DRAResourceHealth`: the per-device health stream kubelet opens.
pub mod health {
    /// Package `v1alpha1` (Kubernetes 1.34+).
    pub mod v1alpha1 {
        tonic::include_proto!("v1alpha1");
    }
    /// Package `v1` (Kubernetes 1.37+).
    pub mod v1 {
        tonic::include_proto!("v1");
    }
}

/// The registration `type` of a DRA plugin.
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";

/// Service names as advertised in `PluginInfo.supported_versions`.
pub mod versions {
    /// `DRAPlugin` in package `...dra.v1`.
    pub const DRA_V1: &str = "v1.DRAPlugin";
    /// `DRAPlugin` in package `...dra.v1beta1`.
    pub const DRA_V1BETA1: &str = "v1beta1.DRAPlugin";
    /// `DRAResourceHealth` in package `v1alpha1`.
    pub const HEALTH_V1ALPHA1: &str = "v1alpha1.DRAResourceHealth";
    /// `DRAResourceHealth` in package `v1`.
    pub const HEALTH_V1: &str = "v1.DRAResourceHealth";
}
