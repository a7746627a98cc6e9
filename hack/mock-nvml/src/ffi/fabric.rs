//! The GPU's NVLink fabric: `nvmlDeviceGetGpuFabricInfo` and its versioned
//! form `nvmlDeviceGetGpuFabricInfoV` (v2 and v3 structs). Pre-Hopper GPUs
//! answer NOT_SUPPORTED; the facts come from the profile (`fabric.rs`).

use nvml_wrapper_sys::bindings as sys;

use super::{export, full_gpu, struct_version, struct_version_of, write};
use crate::codes::{self, Code};
use crate::fabric::Fabric;
use crate::machine::Machine;
use crate::runtime;

/// The fabric facts of the GPU behind `handle`.
fn fabric_of<T>(m: &Machine, handle: *mut T, name: &str) -> Result<Fabric, Code> {
    m.gpus[full_gpu(m, handle, name)?]
        .fabric
        .ok_or(codes::NOT_SUPPORTED)
}

export! {
    /// Fabric facts in the unversioned struct.
    fn nvmlDeviceGetGpuFabricInfo(device: sys::nvmlDevice_t, info: *mut sys::nvmlGpuFabricInfo_t) {
        if info.is_null() {
            return Err(codes::INVALID_ARGUMENT);
        }
        let f = runtime::with_machine(|m| fabric_of(m, device, NAME))?;
        let out = sys::nvmlGpuFabricInfo_t {
            clusterUuid: f.cluster_uuid,
            status: f.status,
            cliqueId: f.clique_id,
            state: f.state,
        };
        // SAFETY: output pointer per the contract.
        unsafe { write(info, out) }
    }
}

export! {
    /// Fabric facts in a versioned struct (v2 or v3; other versions are
    /// ARGUMENT_VERSION_MISMATCH). The health fields say "not supported".
    fn nvmlDeviceGetGpuFabricInfoV(device: sys::nvmlDevice_t, info: *mut sys::nvmlGpuFabricInfoV_t) {
        // SAFETY: the struct starts with its version word (null is refused).
        let version = unsafe { struct_version(info) }?;
        let f = runtime::with_machine(|m| fabric_of(m, device, NAME))?;
        if version == struct_version_of::<sys::nvmlGpuFabricInfo_v3_t>(3) {
            let out = sys::nvmlGpuFabricInfo_v3_t {
                version,
                clusterUuid: f.cluster_uuid,
                status: f.status,
                cliqueId: f.clique_id,
                state: f.state,
                healthMask: 0,
                healthSummary: sys::NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED as u8,
            };
            // SAFETY: the caller declared a v3 struct.
            unsafe { write(info, out) }
        } else if version == struct_version_of::<sys::nvmlGpuFabricInfo_v2_t>(2) {
            let out = sys::nvmlGpuFabricInfo_v2_t {
                version,
                clusterUuid: f.cluster_uuid,
                status: f.status,
                cliqueId: f.clique_id,
                state: f.state,
                healthMask: 0,
            };
            // SAFETY: the caller declared a v2 struct, so the pointer is
            // valid for one.
            unsafe { write(info.cast::<sys::nvmlGpuFabricInfo_v2_t>(), out) }
        } else {
            Err(codes::ARGUMENT_VERSION_MISMATCH)
        }
    }
}
