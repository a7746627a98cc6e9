//! What the `gpu-dra` CLI reads manifests with, shared with the demo
//! (`gpu-dra-demo`): YAML manifests parsed with the file position of every
//! field ([`manifest`]), and the DeviceClasses shipped in `deviceclasses/`,
//! compiled in ([`shipped`]).

pub mod manifest;
pub mod shipped;
