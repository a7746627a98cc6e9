//! A fake NVIDIA Management Library. Built as a cdylib it is a drop-in
//! `libnvidia-ml.so` that exports the NVML functions the driver uses (with
//! the real versioned symbol names and return codes) and simulates the
//! machine described by a YAML profile (`MOCK_NVML_PROFILE`): GPUs, PCI tree,
//! NVLinks, MIG with the real placement rules, injected failures. As an
//! rlib it offers the profile model, the sysfs helper and test fixtures.
//! See `hack/mock-nvml/README.md`.

pub mod caps;
pub mod codes;
pub mod command;
pub mod config;
pub mod control;
pub mod error;
pub mod exports;
pub mod fabric;
pub mod faults;
pub mod fixture;
pub mod hardware;
pub mod health;
pub mod ids;
pub mod machine;
pub mod mig;
pub mod pci;
pub mod processes;
pub mod profile;
pub mod state;
pub mod sysfs;
pub mod topology;

mod ffi;
mod runtime;

pub use error::Error;
pub use profile::Profile;
