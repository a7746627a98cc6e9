//! The GPU fabric facts a profile may give a GPU (`fabric:`), as
//! `nvmlDeviceGetGpuFabricInfo` / `nvmlDeviceGetGpuFabricInfoV` report them:
//! the NVLink fabric's cluster UUID, the clique id, the registration state
//! and its status. Hopper and later only; multi-node NVLink systems (GB200)
//! report a completed registration with a cluster UUID, single-node HGX
//! systems report the state "not supported" (see the profile README).

use nvml_wrapper_sys::bindings as sys;
use serde::{Deserialize, Serialize};

use crate::codes::{self, Code};
use crate::hardware::GpuModel;

/// `fabric:` of a GPU in a profile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FabricSpec {
    /// The fabric's cluster UUID, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub cluster_uuid: String,
    /// The clique id inside the cluster.
    pub clique_id: u32,
    /// Registration state; default `Completed`.
    #[serde(default)]
    pub state: Option<FabricState>,
    /// Registration status, an NVML return code name; default `SUCCESS`.
    #[serde(default)]
    pub status: Option<String>,
}

/// `nvmlGpuFabricState_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FabricState {
    /// NVML_GPU_FABRIC_STATE_NOT_SUPPORTED.
    NotSupported,
    /// NVML_GPU_FABRIC_STATE_NOT_STARTED.
    NotStarted,
    /// NVML_GPU_FABRIC_STATE_IN_PROGRESS.
    InProgress,
    /// NVML_GPU_FABRIC_STATE_COMPLETED.
    Completed,
}

impl FabricState {
    /// The NVML value.
    pub fn value(self) -> u8 {
        let v = match self {
            FabricState::NotSupported => sys::NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
            FabricState::NotStarted => sys::NVML_GPU_FABRIC_STATE_NOT_STARTED,
            FabricState::InProgress => sys::NVML_GPU_FABRIC_STATE_IN_PROGRESS,
            FabricState::Completed => sys::NVML_GPU_FABRIC_STATE_COMPLETED,
        };
        v as u8
    }
}

/// A GPU's validated fabric facts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fabric {
    /// Cluster UUID bytes (all zero when none).
    pub cluster_uuid: [u8; 16],
    /// Clique id.
    pub clique_id: u32,
    /// `nvmlGpuFabricState_t`.
    pub state: u8,
    /// Registration status (an NVML return code).
    pub status: Code,
}

impl Fabric {
    /// What a Hopper-or-later GPU without `fabric:` reports: a single-node
    /// machine, no multi-node fabric.
    pub const NOT_SUPPORTED: Fabric = Fabric {
        cluster_uuid: [0; 16],
        clique_id: 0,
        state: sys::NVML_GPU_FABRIC_STATE_NOT_SUPPORTED as u8,
        status: codes::SUCCESS,
    };

    /// The fabric a GPU of `model` reports: `None` when the model predates
    /// the call (NVML answers NOT_SUPPORTED).
    pub fn of(model: &GpuModel, spec: Option<Fabric>) -> Option<Fabric> {
        has_fabric(model).then(|| spec.unwrap_or(Fabric::NOT_SUPPORTED))
    }
}

/// Whether a model answers the fabric calls at all (Hopper and later).
pub fn has_fabric(model: &GpuModel) -> bool {
    model.architecture >= sys::NVML_DEVICE_ARCH_HOPPER
}

/// Validates `fabric:` of a GPU of `model`.
pub fn validate(spec: &FabricSpec, model: &GpuModel) -> Result<Fabric, String> {
    if !has_fabric(model) {
        return Err(format!(
            "fabric: {} has no GPU fabric info (Hopper and later only)",
            model.key
        ));
    }
    let cluster_uuid = parse_uuid(&spec.cluster_uuid).ok_or_else(|| {
        format!(
            "fabric.clusterUuid {:?} is not a UUID like 01234567-89ab-cdef-0123-456789abcdef",
            spec.cluster_uuid
        )
    })?;
    let status = match &spec.status {
        None => codes::SUCCESS,
        Some(name) if name == "SUCCESS" => codes::SUCCESS,
        Some(name) => codes::from_name(name).ok_or_else(|| {
            format!(
                "fabric.status {name:?} is not an NVML return code (SUCCESS or one of {})",
                codes::failure_names().join(", ")
            )
        })?,
    };
    Ok(Fabric {
        cluster_uuid,
        clique_id: spec.clique_id,
        state: spec.state.unwrap_or(FabricState::Completed).value(),
        status,
    })
}

/// The 16 bytes of `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (any case).
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = text.split('-').collect();
    let shaped = groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_hexdigit()));
    if !shaped {
        return None;
    }
    let hex: Vec<u8> = groups.concat().into_bytes();
    let mut out = [0_u8; 16];
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        let digits = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(digits, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware;

    fn spec(uuid: &str) -> FabricSpec {
        FabricSpec {
            cluster_uuid: uuid.into(),
            clique_id: 7,
            state: None,
            status: None,
        }
    }

    #[test]
    fn uuids_parse_to_their_bytes() {
        let b = parse_uuid("01234567-89AB-cdef-0011-2233445566ff").unwrap();
        assert_eq!(b[0], 0x01);
        assert_eq!(b[4], 0x89);
        assert_eq!(b[5], 0xab);
        assert_eq!(b[15], 0xff);
        for bad in [
            "",
            "0123456789abcdef0011223344556677",
            "01234567-89ab-cdef-0011-2233445566f",
            "01234567-89ab-cdef-0011-2233445566fg",
            "01234567-89ab-cdef-0011-2233445566ff-",
            "+1234567-89ab-cdef-0011-2233445566ff",
            "01234567-89ab-cdef-0011-2233445566é",
        ] {
            assert_eq!(parse_uuid(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn fabric_is_hopper_and_later_with_precise_errors() {
        let h100 = hardware::model("H100-SXM5-80GB").unwrap();
        let a100 = hardware::model("A100-SXM4-80GB").unwrap();
        let ok = validate(&spec("01234567-89ab-cdef-0011-2233445566ff"), &h100).unwrap();
        assert_eq!(ok.clique_id, 7);
        assert_eq!(ok.state, FabricState::Completed.value());
        assert_eq!(ok.status, codes::SUCCESS);
        let err = validate(&spec("01234567-89ab-cdef-0011-2233445566ff"), &a100).unwrap_err();
        assert!(err.contains("A100-SXM4-80GB has no GPU fabric"), "{err}");
        let err = validate(&spec("nope"), &h100).unwrap_err();
        assert!(err.contains("\"nope\" is not a UUID"), "{err}");
        let mut bad_status = spec("01234567-89ab-cdef-0011-2233445566ff");
        bad_status.status = Some("FINE".into());
        let err = validate(&bad_status, &h100).unwrap_err();
        assert!(err.contains("fabric.status \"FINE\""), "{err}");
        assert_eq!(Fabric::of(&a100, None), None);
        assert_eq!(Fabric::of(&h100, None), Some(Fabric::NOT_SUPPORTED));
    }

    #[test]
    fn profiles_refuse_bad_fabric_with_the_gpu_named() {
        let base = std::fs::read_to_string(crate::fixture::bundled_profile("gb200-nvl")).unwrap();
        let loaded = crate::Profile::parse(&base).unwrap();
        assert!(
            loaded
                .gpus
                .iter()
                .all(|g| g.fabric.is_some_and(|f| f.clique_id == 1))
        );
        for (from, to, needle) in [
            ("cliqueId: 1}", "cliqueId: -1}", "cliqueId"),
            ("cliqueId: 1}", "cliqueId: 1, state: Done}", "Done"),
            ("cliqueId: 1}", "cliqueId: 1, extra: 2}", "extra"),
            (
                "clusterUuid: \"09b319a2",
                "clusterUuid: \"zzb319a2",
                "is not a UUID",
            ),
        ] {
            let text = base.replacen(from, to, 1);
            assert_ne!(text, base, "{from}");
            let err = crate::Profile::parse(&text).unwrap_err().to_string();
            assert!(err.contains(needle), "{to}: {err}");
        }
        // Fabric on an Ampere GPU: refused, naming the GPU.
        let a100 = std::fs::read_to_string(crate::fixture::bundled_profile("dgx-a100"))
            .unwrap()
            .replacen(
                "    minor: 4\n",
                "    minor: 4\n    fabric: {clusterUuid: \"09b319a2-e553-400e-b9ab-1ff0bd7d7daf\", cliqueId: 1}\n",
                1,
            );
        let err = crate::Profile::parse(&a100).unwrap_err().to_string();
        assert!(
            err.contains("gpus[4]") && err.contains("has no GPU fabric info"),
            "{err}"
        );
    }
}
