//! The NVML boundary: see the crate README.
