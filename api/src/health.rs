//! The health taints of published devices (issue #43): the taint keys the
//! kubelet plugin's health monitor puts on `spec.devices[].taints` of its
//! ResourceSlices, their values and default effects, and what each means to
//! an admin; plus the immediate action NVIDIA's XID catalog gives each XID.
//!
//! NVIDIA's three keys (`xid`, `gpu-lost`, `unmonitored`) are kept unchanged
//! so that existing tolerations and DeviceTaintRules keep working; the other
//! five are this driver's. The admin CLI (`gpu-dra health`) explains taints
//! with this table. Free of Kubernetes API types, like [`crate::schema`].

/// The domain of every health taint key.
pub const DOMAIN: &str = "gpu.nvidia.com";

/// Who defined a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// NVIDIA's DRA driver uses the same key, value and effect.
    Nvidia,
    /// This driver's own key.
    Ours,
}

/// When a taint goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clears {
    /// When the GPU has recovered and stayed quiet for the quiet period.
    Recovery,
    /// After the informational time-to-live.
    Expiry,
    /// When the condition is no longer seen (the next check).
    Condition,
    /// Never by itself: an admin clears it.
    Admin,
}

/// One health taint key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaintKey {
    /// Short name, as `--health-evict` takes it (`gpu-lost`).
    pub name: &'static str,
    /// Full key (`gpu.nvidia.com/gpu-lost`).
    pub key: &'static str,
    /// Who defined it.
    pub origin: Origin,
    /// Its effect unless `--health-evict` names it (`NoSchedule` or `None`;
    /// `xid` is either).
    pub default_effect: &'static str,
    /// What its value holds (empty when it has none).
    pub value: &'static str,
    /// When it goes away.
    pub clears: Clears,
    /// What it means, for an admin.
    pub meaning: &'static str,
}

/// Every health taint key the plugin publishes.
pub const KEYS: &[TaintKey] = &[
    TaintKey {
        name: "xid",
        key: "gpu.nvidia.com/xid",
        origin: Origin::Nvidia,
        default_effect: "NoSchedule or None",
        value: "the XID number",
        clears: Clears::Recovery,
        meaning: "the GPU reported this XID error; NoSchedule when it needs a reset or reboot, None when it is informational (the GPU stays usable)",
    },
    TaintKey {
        name: "gpu-lost",
        key: "gpu.nvidia.com/gpu-lost",
        origin: Origin::Nvidia,
        default_effect: "NoSchedule",
        value: "",
        clears: Clears::Recovery,
        meaning: "the GPU does not answer NVML (lost, e.g. fallen off the bus, XID 79)",
    },
    TaintKey {
        name: "unmonitored",
        key: "gpu.nvidia.com/unmonitored",
        origin: Origin::Nvidia,
        default_effect: "None",
        value: "",
        clears: Clears::Condition,
        meaning: "the GPU's events are not watched (NVML refused their registration, or waiting for them fails): its XIDs go unseen, polled faults are still checked",
    },
    TaintKey {
        name: "reset-required",
        key: "gpu.nvidia.com/reset-required",
        origin: Origin::Ours,
        default_effect: "NoSchedule",
        value: "the recovery action, e.g. GPU_RESET",
        clears: Clears::Recovery,
        meaning: "the NVIDIA driver asks for a GPU reset (stop every process on it, then nvidia-smi -r)",
    },
    TaintKey {
        name: "reboot-required",
        key: "gpu.nvidia.com/reboot-required",
        origin: Origin::Ours,
        default_effect: "NoSchedule",
        value: "",
        clears: Clears::Recovery,
        meaning: "the NVIDIA driver asks for a node reboot; a new boot clears it",
    },
    TaintKey {
        name: "hardware-failure",
        key: "gpu.nvidia.com/hardware-failure",
        origin: Origin::Ours,
        default_effect: "NoSchedule",
        value: "what failed, e.g. row-remap-failure",
        clears: Clears::Admin,
        meaning: "the GPU's hardware failed: replace it",
    },
    TaintKey {
        name: "remap-pending",
        key: "gpu.nvidia.com/remap-pending",
        origin: Origin::Ours,
        default_effect: "None",
        value: "",
        clears: Clears::Condition,
        meaning: "a memory row remap is pending; running work is unaffected, a GPU reset activates it",
    },
    TaintKey {
        name: "degraded",
        key: "gpu.nvidia.com/degraded",
        origin: Origin::Ours,
        default_effect: "None",
        value: "thermal, pcie, nvlink or xid-rate",
        clears: Clears::Expiry,
        meaning: "the GPU works but is degraded",
    },
];

/// The entry of a full taint key (`gpu.nvidia.com/gpu-lost`), if it is one
/// of the health keys.
#[must_use]
pub fn lookup(key: &str) -> Option<&'static TaintKey> {
    KEYS.iter().find(|k| k.key == key)
}

/// What `value` adds to the meaning of a `degraded` taint.
fn degraded_value(value: &str) -> Option<&'static str> {
    Some(match value {
        "thermal" => "thermal or hardware slowdown: it runs below its clocks",
        "pcie" => "PCIe replays above 8 a minute (DCGM's limit): a bad link or riser",
        "nvlink" => "an NVLink is down: peer bandwidth and the NVLink domain changed",
        "xid-rate" => "informational XIDs repeat: something keeps going wrong",
        _ => return None,
    })
}

/// A sentence for a health taint `key` with `value` (empty when it has
/// none) and `effect` (as published: `None`, `NoSchedule`, `NoExecute`), for
/// an admin: what it means and when it clears. `None` for keys that are not
/// health keys.
#[must_use]
pub fn explain(key: &str, value: &str, effect: &str) -> Option<String> {
    let entry = lookup(key)?;
    // An informational XID expires like the other informational taints.
    let clears = if entry.name == "xid" && effect == "None" {
        Clears::Expiry
    } else {
        entry.clears
    };
    let clears = match clears {
        Clears::Recovery => "clears once the GPU recovers and stays quiet",
        Clears::Expiry => "expires unless it happens again",
        Clears::Condition => "clears when the condition is gone",
        Clears::Admin => "stays until an admin clears it",
    };
    let what = match entry.name {
        "xid" => {
            let verdict = if effect == "None" {
                "informational, the GPU stays usable"
            } else {
                "fatal (a reset or reboot is needed, or --xids-fatal names it)"
            };
            match value.parse::<u64>() {
                Ok(xid) => match xid_action(xid) {
                    Some(action) => {
                        format!("XID {xid} (NVIDIA's catalog: {action}): {verdict}")
                    }
                    None => format!("XID {xid}: {verdict}"),
                },
                Err(_) => format!("an XID error, {verdict} (the value is not an XID number)"),
            }
        }
        "degraded" => match degraded_value(value) {
            Some(why) => format!("{}: {why}", entry.meaning),
            None if value.is_empty() => entry.meaning.to_owned(),
            None => format!("{} ({value})", entry.meaning),
        },
        "reset-required" if !value.is_empty() => {
            format!("{} (recovery action {value})", entry.meaning)
        }
        "hardware-failure" if !value.is_empty() => {
            format!("the GPU's hardware failed ({value}): replace it")
        }
        _ => entry.meaning.to_owned(),
    };
    Some(format!("{what}; {clears}"))
}

/// The immediate action NVIDIA's XID catalog (Ampere and newer) gives an
/// XID, as the catalog spells it; `None` for XIDs it has none for.
#[must_use]
pub fn xid_action(xid: u64) -> Option<&'static str> {
    Some(match xid {
        8
        | 11
        | 13
        | 25
        | 31
        | 32
        | 39..=41
        | 60
        | 68..=72
        | 75..=77
        | 80
        | 82..=86
        | 88
        | 89
        | 94
        | 96..=105
        | 126..=135
        | 139 => "RESTART_APP",
        14
        | 37
        | 38
        | 43
        | 44
        | 63
        | 66
        | 67
        | 92
        | 93
        | 106..=108
        | 121
        | 137
        | 141
        | 157
        | 160
        | 161 => "IGNORE",
        45 => "WORKFLOW_XID_45",
        46 | 62 | 64 | 95 | 109 | 110 | 119 | 120 | 136 | 140 | 143 | 155 | 156 | 158 => {
            "RESET_GPU"
        }
        48 => "WORKFLOW_XID_48",
        79 => "RESTART_BM",
        151 => "RESTART_VM",
        74 => "WORKFLOW_NVLINK_ERR",
        144..=150 => "WORKFLOW_NVLINK5_ERR",
        54 => "CHECK_MECHANICALS",
        78 => "UPDATE_SWFW",
        159 => "CHECK_UVM",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_and_in_the_domain() {
        for (i, k) in KEYS.iter().enumerate() {
            assert_eq!(k.key, format!("{DOMAIN}/{}", k.name));
            assert!(KEYS[..i].iter().all(|o| o.name != k.name), "{}", k.name);
            assert!(k.key.len() <= 253 && k.name.len() <= 63);
        }
        assert_eq!(
            KEYS.iter()
                .filter(|k| k.origin == Origin::Nvidia)
                .map(|k| k.name)
                .collect::<Vec<_>>(),
            ["xid", "gpu-lost", "unmonitored"]
        );
    }

    #[test]
    fn explanations_use_the_value() {
        let lost = explain("gpu.nvidia.com/xid", "79", "NoSchedule").unwrap();
        assert_eq!(
            lost,
            "XID 79 (NVIDIA's catalog: RESTART_BM): fatal (a reset or reboot is needed, or --xids-fatal names it); clears once the GPU recovers and stays quiet"
        );
        let app = explain("gpu.nvidia.com/xid", "13", "None").unwrap();
        assert_eq!(
            app,
            "XID 13 (NVIDIA's catalog: RESTART_APP): informational, the GPU stays usable; expires unless it happens again"
        );
        let unknown = explain("gpu.nvidia.com/xid", "999", "None").unwrap();
        assert!(unknown.starts_with("XID 999: informational"), "{unknown}");
        let garbage = explain("gpu.nvidia.com/xid", "x1", "NoSchedule").unwrap();
        assert!(garbage.contains("not an XID number"), "{garbage}");
        let reset = explain("gpu.nvidia.com/reset-required", "GPU_RESET", "NoSchedule").unwrap();
        assert!(reset.contains("recovery action GPU_RESET"), "{reset}");
        let hw = explain(
            "gpu.nvidia.com/hardware-failure",
            "row-remap-failure",
            "NoSchedule",
        )
        .unwrap();
        assert_eq!(
            hw,
            "the GPU's hardware failed (row-remap-failure): replace it; stays until an admin clears it"
        );
        let thermal = explain("gpu.nvidia.com/degraded", "thermal", "None").unwrap();
        assert!(thermal.contains("slowdown"), "{thermal}");
        let odd = explain("gpu.nvidia.com/degraded", "cosmic-rays", "None").unwrap();
        assert!(odd.contains("(cosmic-rays)"), "{odd}");
        assert_eq!(explain("gpu.nvidia.com/other", "", "None"), None);
        assert_eq!(explain("example.com/xid", "79", "None"), None);
    }

    #[test]
    fn the_catalog_actions_of_the_well_known_xids() {
        for (xid, action) in [
            (13, Some("RESTART_APP")),
            (31, Some("RESTART_APP")),
            (43, Some("IGNORE")),
            (45, Some("WORKFLOW_XID_45")),
            (48, Some("WORKFLOW_XID_48")),
            (63, Some("IGNORE")),
            (64, Some("RESET_GPU")),
            (74, Some("WORKFLOW_NVLINK_ERR")),
            (79, Some("RESTART_BM")),
            (94, Some("RESTART_APP")),
            (109, Some("RESET_GPU")),
            (119, Some("RESET_GPU")),
            (147, Some("WORKFLOW_NVLINK5_ERR")),
            (1, None),
            (u64::MAX, None),
        ] {
            assert_eq!(xid_action(xid), action, "XID {xid}");
        }
    }
}
