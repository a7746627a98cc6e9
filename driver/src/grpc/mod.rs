//! The kubelet-facing gRPC services, served over Unix sockets:
//!
//! - the plugin registration service on `<registrar-dir>/<driver>-reg.sock`
//!   (`registration`), which kubelet's plugin watcher calls first;
//! - `DRAPlugin` v1 and v1beta1 ([`dra`]) and `DRAResourceHealth` v1alpha1
//!   and v1 ([`health`]) on `<plugins-dir>/<driver>/dra.sock`.
//!
//! [`Server::start`] binds both sockets (with the hygiene kubelet expects:
//! stale sockets replaced, live ones never hijacked, 0750 directories and
//! 0600 sockets) and returns a [`ServerHandle`] whose
//! [`shutdown`](ServerHandle::shutdown) deregisters first, then drains.
//! Real claim preparation plugs in through [`ClaimPreparer`](crate::prepare::claim::ClaimPreparer), device
//! health through the [`health::HealthSender`] watch channel. In a rolling
//! update with per-instance socket names ([`instance`]), [`Server::bind`]
//! registers a new instance while the old one still serves, and passes
//! kubelet's calls on to it until the new one takes over. Sockets removed
//! under the running server (kubelet's directories wiped) are bound again
//! (`rebind`), and every service has explicit message size limits
//! ([`limits`]).

mod authority;
pub mod dra;
mod handover;
pub mod health;
pub mod instance;
pub mod limits;
pub mod metrics;
mod rebind;
mod registration;
mod server;

pub use crate::sockets::Error;
pub use registration::RegistrationStatus;
pub use server::{Bound, Config, Server, ServerHandle, Services, validate_driver_name};

/// The `supported_versions` the plugin advertises, in order of preference:
/// kubelet picks the first entry it knows, so `v1.DRAPlugin` comes first.
pub const SUPPORTED_VERSIONS: [&str; 4] = [
    dra_proto::versions::DRA_V1,
    dra_proto::versions::DRA_V1BETA1,
    dra_proto::versions::HEALTH_V1ALPHA1,
    dra_proto::versions::HEALTH_V1,
];
