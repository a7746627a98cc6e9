//! The CDI spec types, written as JSON, and the lowest `cdiVersion` that
//! supports the fields a spec uses.
//!
//! Only the fields this driver writes are modelled (no `intelRdt`, no
//! `netDevices`); empty lists and unset options are left out of the JSON so
//! that a spec never claims a feature it does not use.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A CDI spec file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// The CDI spec version, e.g. `0.5.0`; see [`min_version`].
    pub cdi_version: String,
    /// `<vendor>/<class>`.
    pub kind: String,
    /// Spec annotations (needs 0.6.0).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The devices; CDI requires at least one.
    pub devices: Vec<Device>,
    /// Edits applied whenever any device of this spec is requested.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One device of a spec.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    /// The device name (the part after `=` in a qualified id).
    pub name: String,
    /// Device annotations (needs 0.6.0).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The edits for this device (always written, as CDI requires the key).
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// Changes a runtime makes to a container's OCI spec.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    /// `KEY=VALUE` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes to create and allow in the device cgroup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// OCI hooks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Bind mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Extra group ids for the container process (needs 0.7.0).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        rename = "additionalGids"
    )]
    pub additional_gids: Vec<u32>,
}

impl ContainerEdits {
    /// Whether nothing would be edited.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
            && self.additional_gids.is_empty()
    }
}

/// A device node. Unset type/major/minor are filled in by the runtime, which
/// stats `hostPath` (or `path` when `hostPath` is unset).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    /// The path in the container.
    pub path: String,
    /// The path on the host (needs 0.5.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// OCI device type: `c`, `b` or `p`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    pub node_type: Option<String>,
    /// Major number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// File mode of the node in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Cgroup permissions, a subset of `rwm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// Owner uid in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Owner gid in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// A bind mount.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    /// The source on the host.
    pub host_path: String,
    /// The target in the container.
    pub container_path: String,
    /// Mount options, e.g. `ro`, `nosuid`, `nodev`, `bind`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Mount type (needs 0.4.0).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    pub mount_type: Option<String>,
}

/// An OCI hook.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    /// The OCI lifecycle stage, e.g. `createContainer`.
    pub hook_name: String,
    /// Absolute host path of the executable.
    pub path: String,
    /// argv, including argv\[0\].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment of the hook.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Timeout in seconds (> 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// The lowest CDI spec version that supports every field `spec` uses, so
/// that runtimes vendoring older CDI libraries still load the file:
/// 0.3.0 base; 0.4.0 mount `type`; 0.5.0 `deviceNodes[].hostPath` or a device
/// name starting with a non-letter; 0.6.0 annotations or a dot in the class;
/// 0.7.0 `additionalGids`. (0.8.0 and 1.0.0 changed no fields; `intelRdt`
/// and `netDevices` are not modelled.)
pub fn min_version(spec: &Spec) -> &'static str {
    let all_edits = || {
        spec.devices
            .iter()
            .map(|d| &d.container_edits)
            .chain(std::iter::once(&spec.container_edits))
    };
    if all_edits().any(|e| !e.additional_gids.is_empty()) {
        return "0.7.0";
    }
    let class_has_dot = spec
        .kind
        .split_once('/')
        .is_some_and(|(_, class)| class.contains('.'));
    if !spec.annotations.is_empty()
        || spec.devices.iter().any(|d| !d.annotations.is_empty())
        || class_has_dot
    {
        return "0.6.0";
    }
    let name_starts_non_letter = spec.devices.iter().any(|d| {
        d.name
            .chars()
            .next()
            .is_some_and(|c| !c.is_ascii_alphabetic())
    });
    if name_starts_non_letter
        || all_edits().any(|e| e.device_nodes.iter().any(|n| n.host_path.is_some()))
    {
        return "0.5.0";
    }
    if all_edits().any(|e| e.mounts.iter().any(|m| m.mount_type.is_some())) {
        return "0.4.0";
    }
    "0.3.0"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Spec {
        Spec {
            cdi_version: String::new(),
            kind: "k8s.gpu.nvidia.com/claim".into(),
            devices: vec![Device {
                name: "gpu".into(),
                ..Device::default()
            }],
            ..Spec::default()
        }
    }

    #[test]
    fn min_version_follows_the_fields_used() {
        let mut s = base();
        assert_eq!(min_version(&s), "0.3.0");

        s.container_edits.mounts.push(Mount {
            host_path: "/a".into(),
            container_path: "/a".into(),
            options: vec!["ro".into()],
            mount_type: None,
        });
        assert_eq!(min_version(&s), "0.3.0", "options alone need nothing");
        s.container_edits.mounts[0].mount_type = Some("bind".into());
        assert_eq!(min_version(&s), "0.4.0");

        s.devices[0].container_edits.device_nodes.push(DeviceNode {
            path: "/dev/nvidia0".into(),
            ..DeviceNode::default()
        });
        assert_eq!(min_version(&s), "0.4.0", "a node without hostPath");
        s.devices[0].container_edits.device_nodes[0].host_path = Some("/x/dev/nvidia0".into());
        assert_eq!(min_version(&s), "0.5.0");

        s.devices[0].annotations.insert("a".into(), "b".into());
        assert_eq!(min_version(&s), "0.6.0");

        s.container_edits.additional_gids.push(44);
        assert_eq!(min_version(&s), "0.7.0");
    }

    #[test]
    fn min_version_digit_names_dotted_classes_and_spec_annotations() {
        let mut s = base();
        s.devices[0].name = "0f3c-gpu-0".into();
        assert_eq!(min_version(&s), "0.5.0");

        let mut s = base();
        s.kind = "example.com/gpu.claim".into();
        assert_eq!(min_version(&s), "0.6.0");

        let mut s = base();
        s.annotations.insert("k".into(), "v".into());
        assert_eq!(min_version(&s), "0.6.0");

        let mut s = base();
        s.devices[0].container_edits.additional_gids.push(1);
        assert_eq!(min_version(&s), "0.7.0", "device-level gids count too");
    }

    #[test]
    fn empty_fields_are_left_out_and_json_round_trips() {
        let mut s = base();
        s.cdi_version = "0.3.0".into();
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "cdiVersion": "0.3.0",
                "kind": "k8s.gpu.nvidia.com/claim",
                "devices": [{"name": "gpu", "containerEdits": {}}]
            })
        );
        s.container_edits.device_nodes.push(DeviceNode {
            path: "/dev/nvidiactl".into(),
            host_path: Some("/dev/nvidiactl".into()),
            node_type: Some("c".into()),
            ..DeviceNode::default()
        });
        let text = serde_json::to_string(&s).unwrap();
        assert!(text.contains(r#""hostPath":"/dev/nvidiactl""#), "{text}");
        assert!(text.contains(r#""type":"c""#), "{text}");
        assert_eq!(serde_json::from_str::<Spec>(&text).unwrap(), s);
    }

    #[test]
    fn unknown_fields_are_rejected_when_reading() {
        let err = serde_json::from_str::<Spec>(
            r#"{"cdiVersion":"0.5.0","kind":"a.b/c","devices":[],"bogus":1}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }
}
