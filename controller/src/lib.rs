//! The cluster-wide half of the GPU DRA driver: the validating admission
//! webhook ([`webhook`]), the DeviceClass cache it consults ([`classes`]),
//! the claim lifecycle and slice GC ([`lifecycle`]), and the pieces the
//! `gpu-dra-controller` binary wires together ([`flags`], [`client`],
//! [`metrics`]).

pub mod classes;
pub mod client;
pub mod error;
pub mod flags;
pub mod lifecycle;
pub mod metrics;
pub mod webhook;

pub use error::Error;
