//! Fake NVML library.
