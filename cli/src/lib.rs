//! What the `gpu-dra` CLI reads manifests with, shared with the demo
//! (`gpu-dra-demo`): YAML manifests parsed with the file position of every
//! field ([`manifest`]), the DeviceClasses shipped in `deviceclasses/`,
//! compiled in ([`shipped`]), and the health view of published slices
//! ([`taints`], what `gpu-dra health` prints).

pub mod manifest;
pub mod shipped;
pub mod taints;
