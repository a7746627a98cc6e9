//! The hardware tables: what each GPU model reports through NVML (name, brand,
//! architecture, memory, PCI ids, NVLink) and, for MIG-capable models, the
//! GPU-instance profiles with their real placements. Profiles name a model by
//! its key and may override single values. Where each number comes from is
//! recorded in `hack/mock-nvml/README.md`.

use nvml_wrapper_sys::bindings as sys;
use serde::{Deserialize, Serialize};

/// One GPU product as NVML reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuModel {
    /// The key profiles use (`model: A100-SXM4-80GB`).
    pub key: &'static str,
    /// `nvmlDeviceGetName`.
    pub name: String,
    /// `nvmlDeviceGetArchitecture` (an `NVML_DEVICE_ARCH_*` value).
    pub architecture: u32,
    /// `nvmlDeviceGetBrand` (an `nvmlBrandType_t` value).
    pub brand: u32,
    /// `nvmlDeviceGetCudaComputeCapability` (major, minor).
    pub compute_capability: (i32, i32),
    /// Total framebuffer memory in MiB, as `nvmlDeviceGetMemoryInfo` reports it.
    pub memory_mib: u64,
    /// `pciDeviceId`: device id in the upper 16 bits, vendor 0x10de below.
    pub pci_device_id: u32,
    /// `pciSubSystemId` (representative board).
    pub pci_subsystem_id: u32,
    /// Streaming multiprocessors of the whole GPU.
    pub multiprocessors: u32,
    /// Number of NVLinks the chip has (0: no NVLink).
    pub nvlink_count: u32,
    /// `nvmlDeviceGetNvLinkVersion` value (an `nvmlNvlinkVersion_t`).
    pub nvlink_version: u32,
    /// The MIG table; `None` for GPUs without MIG.
    pub mig: Option<MigTable>,
}

/// How a MIG-capable GPU is partitioned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MigTable {
    /// Memory slices placements are counted in (8 on A100/H100).
    pub memory_slices: u32,
    /// Compute slices (7 on A100/H100).
    pub compute_slices: u32,
    /// `nvmlDeviceGetMaxMigDeviceCount`.
    pub max_devices: u32,
    /// Whether a MIG mode change only becomes current after a GPU reset
    /// (Ampere) or at once (Hopper and later).
    pub mode_change_needs_reset: bool,
    /// The GPU-instance profiles.
    pub profiles: Vec<GiProfile>,
}

/// One GPU-instance profile, as `nvidia-smi mig -lgip` / `-lgipp` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GiProfile {
    /// Short name, e.g. `1g.10gb` or `1g.10gb+me`.
    pub name: String,
    /// The `NVML_GPU_INSTANCE_PROFILE_*` index used to query it.
    pub nvml_profile: u32,
    /// The profile id (`nvmlGpuInstanceProfileInfo_t.id`, e.g. 19).
    pub id: u32,
    /// Compute slices (`sliceCount`).
    pub compute_slices: u32,
    /// Maximum number of instances of this profile (`instanceCount`).
    pub instance_count: u32,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// Video decoders.
    pub decoders: u32,
    /// Video encoders.
    pub encoders: u32,
    /// JPEG engines.
    pub jpeg_engines: u32,
    /// Optical-flow accelerators.
    pub ofa_engines: u32,
    /// Memory in MiB (`memorySizeMB`).
    pub memory_mib: u64,
    /// Possible placement starts, in memory slices.
    pub placements: Vec<u32>,
    /// Memory slices each placement occupies.
    pub placement_size: u32,
}

/// One compute-instance profile inside a GPU instance (derived, see
/// `compute_instance_profiles`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CiProfile {
    /// Name as nvidia-smi prints it: `1c.3g.40gb`, or the GI name for the
    /// compute instance that spans the whole GPU instance.
    pub name: String,
    /// The `NVML_COMPUTE_INSTANCE_PROFILE_*` value; also the profile id.
    pub id: u32,
    /// Compute slices.
    pub slices: u32,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Maximum number of instances of this profile in the GPU instance.
    pub instance_count: u32,
    /// Possible placement starts, in compute slices of the GPU instance.
    pub placements: Vec<u32>,
    /// Slices each placement occupies.
    pub placement_size: u32,
}

impl GiProfile {
    /// The compute-instance profiles this GPU instance offers.
    pub fn compute_instance_profiles(&self) -> Vec<CiProfile> {
        compute_instance_profiles(self)
    }
}

/// The `NVML_COMPUTE_INSTANCE_PROFILE_*` value for a compute-instance size.
pub fn ci_profile_enum(slices: u32) -> Option<u32> {
    Some(match slices {
        1 => sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => sys::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => sys::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => sys::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        6 => sys::NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
        7 => sys::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        8 => sys::NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
        _ => return None,
    })
}

/// Compute-instance profiles of a GPU instance, following `nvidia-smi mig
/// -lcip` on A100/H100: a 2g GI offers 1c and 2g, a 3g GI 1c, 2c and 3g, a 4g
/// GI 1c, 2c and 4g, a 7g GI 1c, 2c, 3c, 4c and 7g; each as many times as it
/// fits in the GI's compute slices (1c.3g 3, 2c.3g 1, 2c.4g 2). Placements
/// mirror the GI placements (the CI spanning a 3g or 4g GI is placed at
/// `0:4`, as nvidia-smi `-lci` shows). Partial CIs get `GI SMs x slices / GI
/// slices` SMs, which is exact on A100 (14 per slice) and an approximation on
/// H100.
fn compute_instance_profiles(gi: &GiProfile) -> Vec<CiProfile> {
    let c = gi.compute_slices;
    // (slices, placement starts, placement size)
    let layout: Vec<(u32, Vec<u32>, u32)> = match c {
        1 => vec![(1, vec![0], 1)],
        2 => vec![(1, vec![0, 1], 1), (2, vec![0], 2)],
        3 => vec![(1, vec![0, 1, 2], 1), (2, vec![0, 2], 2), (3, vec![0], 4)],
        4 => vec![
            (1, vec![0, 1, 2, 3], 1),
            (2, vec![0, 2], 2),
            (4, vec![0], 4),
        ],
        7 => vec![
            (1, (0..7).collect(), 1),
            (2, vec![0, 2, 4], 2),
            (3, vec![0, 4], 4),
            (4, vec![0], 4),
            (7, vec![0], 8),
        ],
        // Custom tables: one CI spanning the whole GI.
        _ => vec![(c, vec![0], c)],
    };
    layout
        .into_iter()
        .filter_map(|(slices, placements, placement_size)| {
            let id = ci_profile_enum(slices)?;
            let full = slices == c;
            Some(CiProfile {
                name: if full {
                    gi.name.clone()
                } else {
                    format!("{slices}c.{}", gi.name)
                },
                id,
                slices,
                multiprocessors: if full {
                    gi.multiprocessors
                } else {
                    gi.multiprocessors * slices / c.max(1)
                },
                instance_count: (c / slices).min(placements.len() as u32),
                placements,
                placement_size,
            })
        })
        .collect()
}

/// Builds a GI profile row; arguments in `nvidia-smi mig -lgip` order.
#[allow(clippy::too_many_arguments)]
fn gi(
    name: &str,
    nvml_profile: u32,
    id: u32,
    compute_slices: u32,
    instance_count: u32,
    memory_mib: u64,
    multiprocessors: u32,
    (decoders, encoders, copy_engines, jpeg_engines, ofa_engines): (u32, u32, u32, u32, u32),
    placements: &[u32],
    placement_size: u32,
) -> GiProfile {
    GiProfile {
        name: name.to_owned(),
        nvml_profile,
        id,
        compute_slices,
        instance_count,
        multiprocessors,
        copy_engines,
        decoders,
        encoders,
        jpeg_engines,
        ofa_engines,
        memory_mib,
        placements: placements.to_vec(),
        placement_size,
    }
}

const P1: u32 = sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE;
const P1_ME: u32 = sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1;
const P1_2X: u32 = sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2;
const P2: u32 = sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE;
const P3: u32 = sys::NVML_GPU_INSTANCE_PROFILE_3_SLICE;
const P4: u32 = sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE;
const P7: u32 = sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE;

const ONE_SLICE: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const TWO_SLICES_4: &[u32] = &[0, 2, 4, 6];
const TWO_SLICES_3: &[u32] = &[0, 2, 4];
const HALVES: &[u32] = &[0, 4];
const WHOLE: &[u32] = &[0];

/// A100-SXM4-80GB (`nvidia-smi mig -lgip`, driver 550.54.14).
fn a100_80gb() -> MigTable {
    MigTable {
        memory_slices: 8,
        compute_slices: 7,
        max_devices: 7,
        mode_change_needs_reset: true,
        profiles: vec![
            // name, enum, id, slices, instances, MiB, SMs, (dec, enc, ce, jpeg, ofa)
            gi(
                "1g.10gb",
                P1,
                19,
                1,
                7,
                9728,
                14,
                (0, 0, 1, 0, 0),
                ONE_SLICE,
                1,
            ),
            gi(
                "1g.10gb+me",
                P1_ME,
                20,
                1,
                1,
                9728,
                14,
                (1, 0, 1, 1, 1),
                ONE_SLICE,
                1,
            ),
            gi(
                "1g.20gb",
                P1_2X,
                15,
                1,
                4,
                19968,
                14,
                (1, 0, 1, 0, 0),
                TWO_SLICES_4,
                2,
            ),
            gi(
                "2g.20gb",
                P2,
                14,
                2,
                3,
                19968,
                28,
                (1, 0, 2, 0, 0),
                TWO_SLICES_3,
                2,
            ),
            gi(
                "3g.40gb",
                P3,
                9,
                3,
                2,
                40192,
                42,
                (2, 0, 3, 0, 0),
                HALVES,
                4,
            ),
            gi("4g.40gb", P4, 5, 4, 1, 40192, 56, (2, 0, 4, 0, 0), WHOLE, 4),
            gi("7g.80gb", P7, 0, 7, 1, 80640, 98, (5, 0, 7, 1, 1), WHOLE, 8),
        ],
    }
}

/// A100-PCIE-40GB (`nvidia-smi mig -lgip`, driver 510.47.03; 1g.10gb, added
/// by later drivers, mirrors the 80GB card's 1g.20gb).
fn a100_40gb() -> MigTable {
    MigTable {
        memory_slices: 8,
        compute_slices: 7,
        max_devices: 7,
        mode_change_needs_reset: true,
        profiles: vec![
            gi(
                "1g.5gb",
                P1,
                19,
                1,
                7,
                4864,
                14,
                (0, 0, 1, 0, 0),
                ONE_SLICE,
                1,
            ),
            gi(
                "1g.5gb+me",
                P1_ME,
                20,
                1,
                1,
                4864,
                14,
                (1, 0, 1, 1, 1),
                ONE_SLICE,
                1,
            ),
            gi(
                "1g.10gb",
                P1_2X,
                15,
                1,
                4,
                9984,
                14,
                (1, 0, 1, 0, 0),
                TWO_SLICES_4,
                2,
            ),
            gi(
                "2g.10gb",
                P2,
                14,
                2,
                3,
                9984,
                28,
                (1, 0, 2, 0, 0),
                TWO_SLICES_3,
                2,
            ),
            gi(
                "3g.20gb",
                P3,
                9,
                3,
                2,
                20096,
                42,
                (2, 0, 3, 0, 0),
                HALVES,
                4,
            ),
            gi("4g.20gb", P4, 5, 4, 1, 20096, 56, (2, 0, 4, 0, 0), WHOLE, 4),
            gi("7g.40gb", P7, 0, 7, 1, 40448, 98, (5, 0, 7, 1, 1), WHOLE, 8),
        ],
    }
}

/// H100 80GB HBM3 (SXM5) (`nvidia-smi mig -lgip` / `-lgipp`).
fn h100_80gb() -> MigTable {
    MigTable {
        memory_slices: 8,
        compute_slices: 7,
        max_devices: 7,
        mode_change_needs_reset: false,
        profiles: vec![
            gi(
                "1g.10gb",
                P1,
                19,
                1,
                7,
                9984,
                16,
                (1, 0, 1, 1, 0),
                ONE_SLICE,
                1,
            ),
            gi(
                "1g.10gb+me",
                P1_ME,
                20,
                1,
                1,
                9984,
                16,
                (1, 0, 1, 1, 1),
                ONE_SLICE,
                1,
            ),
            gi(
                "1g.20gb",
                P1_2X,
                15,
                1,
                4,
                20096,
                26,
                (1, 0, 1, 1, 0),
                TWO_SLICES_4,
                2,
            ),
            gi(
                "2g.20gb",
                P2,
                14,
                2,
                3,
                20096,
                32,
                (2, 0, 2, 2, 0),
                TWO_SLICES_3,
                2,
            ),
            gi(
                "3g.40gb",
                P3,
                9,
                3,
                2,
                40448,
                60,
                (3, 0, 3, 3, 0),
                HALVES,
                4,
            ),
            gi("4g.40gb", P4, 5, 4, 1, 40448, 64, (4, 0, 4, 4, 0), WHOLE, 4),
            gi(
                "7g.80gb",
                P7,
                0,
                7,
                1,
                81152,
                132,
                (7, 0, 8, 7, 1),
                WHOLE,
                8,
            ),
        ],
    }
}

/// The model keys profiles may use.
pub const MODEL_KEYS: &[&str] = &[
    "H100-SXM5-80GB",
    "A100-SXM4-80GB",
    "A100-PCIE-40GB",
    "T4",
    "P4",
    "L4",
    "GB200",
];

/// Looks a model up by its profile key.
pub fn model(key: &str) -> Option<GpuModel> {
    let vendor = 0x10de;
    Some(match key {
        "H100-SXM5-80GB" => GpuModel {
            key: "H100-SXM5-80GB",
            name: "NVIDIA H100 80GB HBM3".into(),
            architecture: sys::NVML_DEVICE_ARCH_HOPPER,
            brand: sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA,
            compute_capability: (9, 0),
            memory_mib: 81559,
            pci_device_id: (0x2330 << 16) | vendor,
            pci_subsystem_id: (0x16c1 << 16) | vendor,
            multiprocessors: 132,
            nvlink_count: 18,
            nvlink_version: sys::nvmlNvlinkVersion_enum_NVML_NVLINK_VERSION_4_0,
            mig: Some(h100_80gb()),
        },
        "A100-SXM4-80GB" => GpuModel {
            key: "A100-SXM4-80GB",
            name: "NVIDIA A100-SXM4-80GB".into(),
            architecture: sys::NVML_DEVICE_ARCH_AMPERE,
            brand: sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA,
            compute_capability: (8, 0),
            memory_mib: 81920,
            pci_device_id: (0x20b2 << 16) | vendor,
            pci_subsystem_id: (0x1463 << 16) | vendor,
            multiprocessors: 108,
            nvlink_count: 12,
            nvlink_version: sys::nvmlNvlinkVersion_enum_NVML_NVLINK_VERSION_3_0,
            mig: Some(a100_80gb()),
        },
        "A100-PCIE-40GB" => GpuModel {
            key: "A100-PCIE-40GB",
            name: "NVIDIA A100-PCIE-40GB".into(),
            architecture: sys::NVML_DEVICE_ARCH_AMPERE,
            brand: sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA,
            compute_capability: (8, 0),
            memory_mib: 40960,
            pci_device_id: (0x20f1 << 16) | vendor,
            pci_subsystem_id: (0x145f << 16) | vendor,
            multiprocessors: 108,
            nvlink_count: 12,
            nvlink_version: sys::nvmlNvlinkVersion_enum_NVML_NVLINK_VERSION_3_0,
            mig: Some(a100_40gb()),
        },
        "T4" => GpuModel {
            key: "T4",
            name: "Tesla T4".into(),
            architecture: sys::NVML_DEVICE_ARCH_TURING,
            brand: sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA,
            compute_capability: (7, 5),
            memory_mib: 15360,
            pci_device_id: (0x1eb8 << 16) | vendor,
            pci_subsystem_id: (0x12a2 << 16) | vendor,
            multiprocessors: 40,
            nvlink_count: 0,
            nvlink_version: 0,
            mig: None,
        },
        // Pascal: below MPS multi-user servers' compute capability 7.0.
        "P4" => GpuModel {
            key: "P4",
            name: "Tesla P4".into(),
            architecture: sys::NVML_DEVICE_ARCH_PASCAL,
            brand: sys::nvmlBrandType_enum_NVML_BRAND_TESLA,
            compute_capability: (6, 1),
            memory_mib: 7611,
            pci_device_id: (0x1bb3 << 16) | vendor,
            pci_subsystem_id: (0x11d8 << 16) | vendor,
            multiprocessors: 20,
            nvlink_count: 0,
            nvlink_version: 0,
            mig: None,
        },
        "L4" => GpuModel {
            key: "L4",
            name: "NVIDIA L4".into(),
            architecture: sys::NVML_DEVICE_ARCH_ADA,
            brand: sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA,
            compute_capability: (8, 9),
            memory_mib: 23034,
            pci_device_id: (0x27b8 << 16) | vendor,
            pci_subsystem_id: (0x16ca << 16) | vendor,
            multiprocessors: 58,
            nvlink_count: 0,
            nvlink_version: 0,
            mig: None,
        },
        "GB200" => GpuModel {
            key: "GB200",
            name: "NVIDIA GB200".into(),
            architecture: sys::NVML_DEVICE_ARCH_BLACKWELL,
            brand: sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA,
            compute_capability: (10, 0),
            memory_mib: 189_471,
            pci_device_id: (0x2941 << 16) | vendor,
            pci_subsystem_id: (0x2046 << 16) | vendor,
            multiprocessors: 148,
            nvlink_count: 18,
            nvlink_version: sys::nvmlNvlinkVersion_enum_NVML_NVLINK_VERSION_5_0,
            // Blackwell has MIG; its table is not modelled yet.
            mig: None,
        },
        _ => return None,
    })
}

/// Brand names a profile may use to override the brand.
pub fn brand_from_name(name: &str) -> Option<u32> {
    Some(match name {
        "Unknown" => sys::nvmlBrandType_enum_NVML_BRAND_UNKNOWN,
        "Quadro" => sys::nvmlBrandType_enum_NVML_BRAND_QUADRO,
        "Tesla" => sys::nvmlBrandType_enum_NVML_BRAND_TESLA,
        "NVS" => sys::nvmlBrandType_enum_NVML_BRAND_NVS,
        "GRID" => sys::nvmlBrandType_enum_NVML_BRAND_GRID,
        "GeForce" => sys::nvmlBrandType_enum_NVML_BRAND_GEFORCE,
        "Titan" => sys::nvmlBrandType_enum_NVML_BRAND_TITAN,
        "NvidiaRTX" => sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA_RTX,
        "Nvidia" => sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile<'t>(table: &'t MigTable, name: &str) -> &'t GiProfile {
        table.profiles.iter().find(|p| p.name == name).unwrap()
    }

    #[test]
    fn every_key_resolves_to_its_own_model() {
        for key in MODEL_KEYS {
            assert_eq!(model(key).unwrap().key, *key);
        }
        assert!(model("H200").is_none());
    }

    /// The H100 model against what a real H100 80GB HBM3's NVML reported
    /// (`observed/h100-80gb-hbm3.json`, read by `hack/real-gpu`): identity,
    /// memory, and every GPU-instance profile with its placements; the
    /// profile indexes NVML refused are the ones the model lacks.
    #[test]
    fn h100_model_matches_a_real_h100() {
        let seen: serde_json::Value =
            serde_json::from_str(include_str!("../observed/h100-80gb-hbm3.json")).unwrap();
        let m = model("H100-SXM5-80GB").unwrap();
        assert_eq!(seen["name"], m.name.as_str());
        assert_eq!(seen["brand"], m.brand);
        assert_eq!(seen["architecture"], m.architecture);
        let (major, minor) = m.compute_capability;
        assert_eq!(
            seen["cudaComputeCapability"],
            serde_json::json!([major, minor])
        );
        assert_eq!(seen["memoryTotalBytes"], m.memory_mib << 20);
        assert_eq!(seen["pciDeviceId"], m.pci_device_id);
        let subsystems = seen["pciSubSystemIdsSeen"].as_array().unwrap();
        assert!(subsystems.contains(&m.pci_subsystem_id.into()));
        let table = m.mig.unwrap();
        let observed = seen["gpuInstanceProfiles"].as_array().unwrap();
        assert_eq!(observed.len(), table.profiles.len());
        for o in observed {
            let p = table
                .profiles
                .iter()
                .find(|p| o["profile"] == p.nvml_profile)
                .unwrap_or_else(|| panic!("no profile at index {}", o["profile"]));
            let placements: Vec<[u32; 2]> = p
                .placements
                .iter()
                .map(|&s| [s, p.placement_size])
                .collect();
            assert_eq!(
                serde_json::json!({
                    "profile": p.nvml_profile, "id": p.id, "name": format!("MIG {}", p.name),
                    "sliceCount": p.compute_slices, "instanceCount": p.instance_count,
                    "multiprocessorCount": p.multiprocessors, "copyEngineCount": p.copy_engines,
                    "decoderCount": p.decoders, "encoderCount": p.encoders,
                    "jpegCount": p.jpeg_engines, "ofaCount": p.ofa_engines,
                    "memorySizeMB": p.memory_mib, "placements": placements,
                }),
                *o,
                "{}",
                p.name
            );
        }
        for index in seen["unsupportedProfileIndexes"].as_array().unwrap() {
            assert!(
                !table.profiles.iter().any(|p| *index == p.nvml_profile),
                "the model has profile index {index}, which NVML refused"
            );
        }
    }

    #[test]
    fn a100_80gb_matches_nvidia_smi_lgip() {
        let t = model("A100-SXM4-80GB").unwrap().mig.unwrap();
        let ids: Vec<(&str, u32, u32)> = t
            .profiles
            .iter()
            .map(|p| (p.name.as_str(), p.id, p.instance_count))
            .collect();
        assert_eq!(
            ids,
            [
                ("1g.10gb", 19, 7),
                ("1g.10gb+me", 20, 1),
                ("1g.20gb", 15, 4),
                ("2g.20gb", 14, 3),
                ("3g.40gb", 9, 2),
                ("4g.40gb", 5, 1),
                ("7g.80gb", 0, 1)
            ]
        );
        assert_eq!(profile(&t, "1g.20gb").placements, [0, 2, 4, 6]);
        assert_eq!(profile(&t, "3g.40gb").placement_size, 4);
        assert_eq!(profile(&t, "7g.80gb").placement_size, 8);
    }

    #[test]
    fn placements_stay_inside_the_memory_slices() {
        for key in MODEL_KEYS {
            let Some(t) = model(key).unwrap().mig else {
                continue;
            };
            for p in &t.profiles {
                assert!(
                    p.instance_count as usize <= p.placements.len(),
                    "{key} {}",
                    p.name
                );
                for s in &p.placements {
                    assert!(s + p.placement_size <= t.memory_slices, "{key} {}", p.name);
                    assert_eq!(
                        s % p.placement_size.min(4),
                        0,
                        "{key} {} misaligned",
                        p.name
                    );
                }
            }
        }
    }

    #[test]
    fn compute_instance_profiles_follow_lcip() {
        let t = model("A100-SXM4-80GB").unwrap().mig.unwrap();
        let names = |gi: &str| -> Vec<String> {
            profile(&t, gi)
                .compute_instance_profiles()
                .into_iter()
                .map(|c| c.name)
                .collect()
        };
        assert_eq!(names("3g.40gb"), ["1c.3g.40gb", "2c.3g.40gb", "3g.40gb"]);
        assert_eq!(names("4g.40gb"), ["1c.4g.40gb", "2c.4g.40gb", "4g.40gb"]);
        assert_eq!(names("1g.10gb"), ["1g.10gb"]);
        let ci = profile(&t, "3g.40gb").compute_instance_profiles();
        assert_eq!((ci[0].id, ci[0].multiprocessors), (0, 14));
        assert_eq!(
            (ci[2].id, ci[2].multiprocessors, ci[2].placement_size),
            (2, 42, 4)
        );
        let counts: Vec<u32> = ci.iter().map(|c| c.instance_count).collect();
        assert_eq!(
            counts,
            [3, 1, 1],
            "1c.3g 3/3, 2c.3g 1/1, 3g 1/1 as -lcip shows"
        );
        let seven = profile(&t, "7g.80gb").compute_instance_profiles();
        assert_eq!(
            seven.last().unwrap().id,
            sys::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE
        );
    }

    #[test]
    fn non_mig_models_have_no_table() {
        assert!(model("T4").unwrap().mig.is_none());
        assert!(model("L4").unwrap().mig.is_none());
        assert_eq!(model("L4").unwrap().compute_capability, (8, 9));
    }
}
