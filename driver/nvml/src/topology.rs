//! How NVML's answers about one NVLink and the GPU fabric become owned facts:
//! what is at the far end of a link ([`classify_link`]: the remote device
//! type first, the remote bus id as a second signal), NVML's sentinel bus id
//! of links into NVSwitches ([`parse_remote_bus_id`]), and a usable fabric
//! membership ([`fabric_membership`]).
//!
//! Pure functions only, so every rule is unit-tested without a library.

use nvml_wrapper_sys::bindings as sys;

use crate::naming;
use crate::types::{FabricInfo, NvLinkRemote};

/// The remote bus id NVML reports for a link whose far end is no PCI device
/// of the GPU (an NVSwitch): domain 0xFFFFFFFF, bus 0xFF, device 0xFF. Every
/// switch link reports it, so it never names a device.
pub const SWITCH_SENTINEL_BUS_ID: &str = "FFFFFFFF:FF:FF.0";

/// What a remote bus id names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteBusId {
    /// A PCI device, normalised like [`naming::normalize_pci_bus_id`].
    Device(String),
    /// NVML's sentinel: a far end that is not PCI-enumerable (an NVSwitch).
    Sentinel,
}

/// Reads the remote bus id of an NVLink: the sentinel (any spelling, any
/// function number) is [`RemoteBusId::Sentinel`], a well-formed bus id is
/// the device, anything else an error naming the input.
pub fn parse_remote_bus_id(raw: &str) -> Result<RemoteBusId, String> {
    if is_sentinel(raw) {
        return Ok(RemoteBusId::Sentinel);
    }
    naming::normalize_pci_bus_id(raw).map(RemoteBusId::Device)
}

/// Whether `raw` is `ffffffff:ff:ff.<f>` in any case.
fn is_sentinel(raw: &str) -> bool {
    let mut parts = raw.split(':');
    let (Some(domain), Some(bus), Some(dev_fn), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Some((device, function)) = dev_fn.split_once('.') else {
        return false;
    };
    domain.eq_ignore_ascii_case("ffffffff")
        && bus.eq_ignore_ascii_case("ff")
        && device.eq_ignore_ascii_case("ff")
        && function.len() == 1
        && function.bytes().all(|b| b.is_ascii_digit())
}

/// The far end of one active link, from NVML's remote device type (`None`
/// when the call failed or the driver lacks it) and remote bus id (`Err`
/// with NVML's reason when unreadable): the kind and, for a peer that is a
/// PCI device, its normalised bus id.
///
/// The device type decides; the bus id is the second signal where the type
/// is unknown: the sentinel means a switch, a real bus id a possible peer
/// GPU (the device model joins it only to a GPU of the node with that bus
/// id). A sentinel is never returned as a bus id.
pub fn classify_link(
    device_type: Option<u32>,
    bus_id: Result<&str, String>,
) -> (NvLinkRemote, Option<String>, Option<String>) {
    let (bus, problem) = match bus_id.map(parse_remote_bus_id) {
        Ok(Ok(bus)) => (Some(bus), None),
        Ok(Err(e)) | Err(e) => (None, Some(e)),
    };
    let device = match &bus {
        Some(RemoteBusId::Device(b)) => Some(b.clone()),
        _ => None,
    };
    let sentinel = matches!(bus, Some(RemoteBusId::Sentinel));
    let kind = match device_type {
        Some(sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH) => {
            return (NvLinkRemote::Switch, None, problem);
        }
        Some(sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU) if !sentinel => {
            NvLinkRemote::Gpu
        }
        Some(sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_IBMNPU) => {
            NvLinkRemote::IbmNpu
        }
        // A GPU that reports the sentinel contradicts itself: trust neither.
        Some(sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU) => {
            return (
                NvLinkRemote::Unknown,
                None,
                Some(format!(
                    "remote device type GPU with the switch sentinel bus id {SWITCH_SENTINEL_BUS_ID}"
                )),
            );
        }
        _ if sentinel => NvLinkRemote::Switch,
        _ => NvLinkRemote::Unknown,
    };
    (kind, device, problem)
}

/// The fabric membership a GPU's fabric info gives: `Some` only for a
/// completed registration (`NVML_GPU_FABRIC_STATE_COMPLETED`) with status
/// SUCCESS and a cluster UUID that is not all zeros. The UUID is spelled
/// lower case `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn fabric_membership(
    cluster_uuid: [u8; 16],
    clique_id: u32,
    state: u32,
    status: u32,
) -> Option<FabricInfo> {
    if state != sys::NVML_GPU_FABRIC_STATE_COMPLETED
        || status != sys::nvmlReturn_enum_NVML_SUCCESS
        || cluster_uuid == [0; 16]
    {
        return None;
    }
    Some(FabricInfo {
        cluster_uuid: uuid_text(cluster_uuid),
        clique_id,
    })
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lower case.
fn uuid_text(bytes: [u8; 16]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(36);
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: u32 = sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU;
    const NPU: u32 = sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_IBMNPU;
    const SWITCH: u32 = sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH;
    const UNKNOWN: u32 = sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN;

    #[test]
    fn the_sentinel_parses_as_no_device() {
        for s in ["FFFFFFFF:FF:FF.0", "ffffffff:ff:ff.0", "FFFFFFFF:FF:FF.1"] {
            assert_eq!(parse_remote_bus_id(s), Ok(RemoteBusId::Sentinel), "{s}");
        }
        assert_eq!(
            parse_remote_bus_id("00000000:1B:00.0"),
            Ok(RemoteBusId::Device("0000:1b:00.0".into()))
        );
        // Wide domains that are not the sentinel stay devices (VMD).
        assert_eq!(
            parse_remote_bus_id("FFFFFFFF:FF:1F.0"),
            Ok(RemoteBusId::Device("ffffffff:ff:1f.0".into()))
        );
    }

    #[test]
    fn hostile_bus_ids_are_errors_naming_the_input() {
        for bad in [
            "",
            "FFFFFFFF:FF:FF",
            "FFFFFFFF:FF:FF.0:0",
            "FFFFFFFFF:FF:FF.0",
            "FFFFFFFF:FF:FF.x",
            "FFFFFFFF:FF:FF.10",
            "ffffffff:ff:ff.0\0",
            "../../ffffffff:ff:ff.0",
            "0000:18:20.0",
            "\u{feff}0000:18:00.0",
        ] {
            let err = parse_remote_bus_id(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn the_device_type_decides_and_the_bus_id_is_the_second_signal() {
        let peer = Ok("00000000:1B:00.0");
        let sentinel = Ok(SWITCH_SENTINEL_BUS_ID);
        assert_eq!(
            classify_link(Some(GPU), peer.clone()),
            (NvLinkRemote::Gpu, Some("0000:1b:00.0".into()), None)
        );
        assert_eq!(
            classify_link(Some(SWITCH), sentinel.clone()),
            (NvLinkRemote::Switch, None, None)
        );
        // A switch never carries a bus id, even a real-looking one.
        assert_eq!(
            classify_link(Some(SWITCH), peer.clone()),
            (NvLinkRemote::Switch, None, None)
        );
        // Type unknown or unreadable: the sentinel means a switch.
        for t in [None, Some(UNKNOWN), Some(77)] {
            assert_eq!(
                classify_link(t, sentinel.clone()),
                (NvLinkRemote::Switch, None, None)
            );
            assert_eq!(
                classify_link(t, peer.clone()),
                (NvLinkRemote::Unknown, Some("0000:1b:00.0".into()), None)
            );
        }
        assert_eq!(
            classify_link(Some(NPU), peer.clone()),
            (NvLinkRemote::IbmNpu, Some("0000:1b:00.0".into()), None)
        );
        // A GPU claiming the sentinel: neither is trusted.
        let (kind, bus, problem) = classify_link(Some(GPU), sentinel);
        assert_eq!((kind, bus), (NvLinkRemote::Unknown, None));
        assert!(problem.unwrap().contains("sentinel"));
        // An unreadable or malformed bus id leaves the type alone.
        let (kind, bus, problem) = classify_link(Some(GPU), Err("GPU is lost".into()));
        assert_eq!((kind, bus), (NvLinkRemote::Gpu, None));
        assert_eq!(problem.as_deref(), Some("GPU is lost"));
        let (kind, bus, problem) = classify_link(Some(SWITCH), Ok("garbage"));
        assert_eq!((kind, bus), (NvLinkRemote::Switch, None));
        assert!(problem.unwrap().contains("\"garbage\""));
        let (kind, bus, _) = classify_link(None, Ok("garbage"));
        assert_eq!((kind, bus), (NvLinkRemote::Unknown, None));
    }

    #[test]
    fn only_completed_registrations_with_a_cluster_are_memberships() {
        let uuid = [
            0x09, 0xb3, 0x19, 0xa2, 0xe5, 0x53, 0x40, 0x0e, 0xb9, 0xab, 0x1f, 0xf0, 0xbd, 0x7d,
            0x7d, 0xaf,
        ];
        let done = sys::NVML_GPU_FABRIC_STATE_COMPLETED;
        assert_eq!(
            fabric_membership(uuid, 32766, done, 0),
            Some(FabricInfo {
                cluster_uuid: "09b319a2-e553-400e-b9ab-1ff0bd7d7daf".into(),
                clique_id: 32766,
            })
        );
        assert_eq!(fabric_membership([0; 16], 1, done, 0), None);
        assert_eq!(
            fabric_membership(uuid, 1, sys::NVML_GPU_FABRIC_STATE_IN_PROGRESS, 0),
            None
        );
        assert_eq!(
            fabric_membership(uuid, 1, sys::NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, 0),
            None
        );
        assert_eq!(fabric_membership(uuid, 1, done, 999), None);
    }
}
