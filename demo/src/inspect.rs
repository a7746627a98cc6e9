//! What a prepared claim gives its containers, read the way a container
//! runtime reads it: the CDI device ids from the kubelet's answer are
//! resolved against the spec files in the CDI directory, and each device's
//! container edits (device nodes, environment, mounts, hooks) are
//! summarised, with the spec-wide edits every container of the claim gets.
//! What the plugin did on the node for the claim (MIG instances created, MPS
//! daemons started, compute mode and time slice changed) comes from its
//! checkpoint entry.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use gpu_dra_sim::kubelet::Device;
use gpu_kubelet_plugin::prepare::checkpoint::{ClaimEntry, DeviceKind};
use serde_json::{Value, json};

/// Largest spec file read (the plugin's are a few KiB).
const MAX_SPEC_BYTES: u64 = 4 << 20;

/// Container edits, summarised.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edits {
    /// Device node paths in the container.
    pub nodes: Vec<String>,
    /// `NAME=value` entries.
    pub env: Vec<String>,
    /// Container paths of the mounts.
    pub mounts: Vec<String>,
    /// Hooks, by what they do (`update-ldcache`, ...).
    pub hooks: Vec<String>,
}

/// Mount targets worth naming among the driver's files.
const NOTABLE_MOUNTS: &[&str] = &[
    "libcuda.so.1",
    "libnvidia-ml.so.1",
    "nvidia-smi",
    "nvidia-cuda-mps-control",
];

impl Edits {
    fn read(edits: &Value, what: &str) -> anyhow::Result<Self> {
        if edits.is_null() {
            return Ok(Self::default());
        }
        if !edits.is_object() {
            bail!("{what}: containerEdits is not an object");
        }
        let strings = |key: &str, field: Option<&str>| -> anyhow::Result<Vec<String>> {
            let Some(items) = edits.get(key).filter(|v| !v.is_null()) else {
                return Ok(Vec::new());
            };
            let items = items
                .as_array()
                .with_context(|| format!("{what}: containerEdits.{key} is not a list"))?;
            items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    let v = match field {
                        Some(f) => &item[f],
                        None => item,
                    };
                    v.as_str().map(str::to_owned).with_context(|| {
                        format!(
                            "{what}: containerEdits.{key}[{i}]{} is not a string",
                            field.map(|f| format!(".{f}")).unwrap_or_default()
                        )
                    })
                })
                .collect()
        };
        let hooks = match edits.get("hooks").filter(|v| !v.is_null()) {
            None => Vec::new(),
            Some(h) => h
                .as_array()
                .with_context(|| format!("{what}: containerEdits.hooks is not a list"))?
                .iter()
                .map(|hook| {
                    hook["args"][1]
                        .as_str()
                        .or_else(|| hook["hookName"].as_str())
                        .unwrap_or("hook")
                        .to_owned()
                })
                .collect(),
        };
        Ok(Self {
            nodes: strings("deviceNodes", Some("path"))?,
            env: strings("env", None)?,
            mounts: strings("mounts", Some("containerPath"))?,
            hooks,
        })
    }

    /// One line: the device nodes, the environment, the mounts (count and
    /// the notable ones), the hooks.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if !self.nodes.is_empty() {
            parts.push(format!("device nodes {}", self.nodes.join(", ")));
        }
        if !self.env.is_empty() {
            parts.push(format!("env {}", self.env.join(", ")));
        }
        if !self.mounts.is_empty() {
            let notable: Vec<&str> = NOTABLE_MOUNTS
                .iter()
                .copied()
                .filter(|n| self.mounts.iter().any(|m| m.ends_with(&format!("/{n}"))))
                .collect();
            let more = if notable.len() < self.mounts.len() {
                ", ..."
            } else {
                ""
            };
            parts.push(format!(
                "{} mounts ({}{more})",
                self.mounts.len(),
                notable.join(", ")
            ));
        }
        if !self.hooks.is_empty() {
            parts.push(format!("hooks {}", self.hooks.join(", ")));
        }
        if parts.is_empty() {
            "nothing".to_owned()
        } else {
            parts.join("; ")
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "deviceNodes": self.nodes,
            "env": self.env,
            "mounts": self.mounts.len(),
            "mountPaths": self.mounts,
            "hooks": self.hooks,
        })
    }
}

/// The CDI devices of a spec directory, as a runtime indexes them.
#[derive(Debug, Default)]
pub struct CdiRegistry {
    /// Qualified id (`vendor/class=name`) -> (device edits, spec file).
    devices: HashMap<String, (Edits, PathBuf)>,
    /// Spec file -> its spec-wide edits.
    specs: HashMap<PathBuf, Edits>,
}

impl CdiRegistry {
    /// Reads every `*.json` and `*.yaml` spec in `dir` (JSON only is
    /// parsed: the plugin writes JSON; a YAML spec is an error).
    pub fn scan(dir: &Path) -> anyhow::Result<Self> {
        let mut registry = Self::default();
        let entries = std::fs::read_dir(dir)
            .with_context(|| format!("read the CDI directory {}", dir.display()))?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json" || e == "yaml"))
            .collect();
        paths.sort();
        for path in paths {
            registry.add(&path)?;
        }
        Ok(registry)
    }

    fn add(&mut self, path: &Path) -> anyhow::Result<()> {
        let what = path.display().to_string();
        let size = std::fs::metadata(path)
            .with_context(|| format!("stat {what}"))?
            .len();
        if size > MAX_SPEC_BYTES {
            bail!("{what}: {size} bytes, more than a CDI spec of the plugin can be");
        }
        let text = std::fs::read_to_string(path).with_context(|| format!("read {what}"))?;
        let spec: Value =
            serde_json::from_str(&text).with_context(|| format!("{what}: not a JSON CDI spec"))?;
        let kind = spec["kind"]
            .as_str()
            .filter(|k| k.contains('/'))
            .with_context(|| format!("{what}: no `vendor/class` kind"))?;
        let devices = spec["devices"]
            .as_array()
            .with_context(|| format!("{what}: no devices list"))?;
        for (i, device) in devices.iter().enumerate() {
            let name = device["name"]
                .as_str()
                .with_context(|| format!("{what}: devices[{i}] has no name"))?;
            let edits = Edits::read(&device["containerEdits"], &format!("{what}: device {name}"))?;
            let id = format!("{kind}={name}");
            if self
                .devices
                .insert(id.clone(), (edits, path.to_path_buf()))
                .is_some()
            {
                bail!("{what}: CDI device {id} is defined twice");
            }
        }
        let common = Edits::read(&spec["containerEdits"], &what)?;
        self.specs.insert(path.to_path_buf(), common);
        Ok(())
    }

    /// The spec files read.
    #[cfg(test)]
    pub fn spec_files(&self) -> usize {
        self.specs.len()
    }
}

/// One prepared device of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    /// The device name in the pool.
    pub device: String,
    /// The claim's requests it serves.
    pub requests: Vec<String>,
    /// The share id, for a device shared by capacity.
    pub share: Option<String>,
    /// CDI device ids the kubelet passes to the runtime.
    pub cdi_ids: Vec<String>,
    /// Device nodes of those CDI devices.
    pub nodes: Vec<String>,
    /// Their environment.
    pub env: Vec<String>,
    /// Their mounts' container paths.
    pub mounts: Vec<String>,
}

/// A prepared claim as its containers will see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// Per device.
    pub devices: Vec<PreparedDevice>,
    /// What every container of the claim gets (the spec-wide edits).
    pub claim_edits: Edits,
    /// What the plugin set up on the node, one phrase each.
    pub hardware: Vec<String>,
}

impl Prepared {
    /// Resolves the kubelet's answer for a claim against the CDI specs.
    pub fn resolve(
        answer: &[Device],
        registry: &CdiRegistry,
        entry: Option<&ClaimEntry>,
    ) -> anyhow::Result<Self> {
        let mut devices = Vec::new();
        let mut spec_files: Vec<&PathBuf> = Vec::new();
        for d in answer {
            let mut prepared = PreparedDevice {
                device: d.device_name.clone(),
                requests: d.request_names.clone(),
                share: d.share_id.clone(),
                cdi_ids: d.cdi_device_ids.clone(),
                nodes: Vec::new(),
                env: Vec::new(),
                mounts: Vec::new(),
            };
            for id in &d.cdi_device_ids {
                let (edits, file) = registry.devices.get(id).with_context(|| {
                    format!(
                        "CDI device {id} of {} is in no spec file of the CDI directory",
                        d.device_name
                    )
                })?;
                prepared.nodes.extend(edits.nodes.iter().cloned());
                prepared.env.extend(edits.env.iter().cloned());
                prepared.mounts.extend(edits.mounts.iter().cloned());
                if !spec_files.contains(&file) {
                    spec_files.push(file);
                }
            }
            devices.push(prepared);
        }
        let mut claim_edits = Edits::default();
        for file in spec_files {
            if let Some(common) = registry.specs.get(file) {
                for (into, from) in [
                    (&mut claim_edits.nodes, &common.nodes),
                    (&mut claim_edits.env, &common.env),
                    (&mut claim_edits.mounts, &common.mounts),
                    (&mut claim_edits.hooks, &common.hooks),
                ] {
                    for item in from {
                        if !into.contains(item) {
                            into.push(item.clone());
                        }
                    }
                }
            }
        }
        Ok(Self {
            devices,
            claim_edits,
            hardware: entry.map(hardware).unwrap_or_default(),
        })
    }

    /// The devices' names.
    pub fn device_names(&self) -> Vec<String> {
        self.devices.iter().map(|d| d.device.clone()).collect()
    }

    pub fn to_json(&self) -> Value {
        json!({
            "devices": self.devices.iter().map(|d| json!({
                "device": d.device,
                "requests": d.requests,
                "shareID": d.share,
                "cdiDeviceIds": d.cdi_ids,
                "deviceNodes": d.nodes,
                "env": d.env,
                "mounts": d.mounts.len(),
                "mountPaths": d.mounts,
            })).collect::<Vec<_>>(),
            "claimEdits": self.claim_edits.to_json(),
            "onTheNode": self.hardware,
        })
    }
}

/// What the checkpoint entry says was set up, one phrase per thing.
fn hardware(entry: &ClaimEntry) -> Vec<String> {
    let mut out = Vec::new();
    for d in &entry.devices {
        if let DeviceKind::Mig {
            parent_minor,
            gpu_instance_id,
            mig_uuid,
            created: true,
            ..
        } = &d.kind
        {
            out.push(format!(
                "MIG device {} created (GPU instance {} on /dev/nvidia{parent_minor})",
                mig_uuid.as_deref().unwrap_or("?"),
                gpu_instance_id.map_or_else(|| "?".to_owned(), |g| g.to_string()),
            ));
        }
        let sharing = &d.sharing;
        if let Some(mps) = &sharing.mps_daemon {
            let line = format!(
                "MPS control daemon {}{}{}",
                mps.id,
                mps.pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
                daemon_settings(&mps.pipe_dir)
            );
            if !out.contains(&line) {
                out.push(line);
            }
        }
        if let Some(change) = &sharing.compute_mode {
            out.push(format!(
                "compute mode of {} set to {} (was {})",
                d.device, change.set, change.previous
            ));
        }
        if let Some(interval) = &sharing.time_slice_interval {
            out.push(format!("time slice of {} set to {interval}", d.device));
        }
    }
    out
}

/// `, default active threads 25%, pinned memory 0=10240M`: what the
/// running daemon holds, as it answers (read from the fake daemon's state
/// in its pipe directory); empty when it cannot be read.
fn daemon_settings(pipe_dir: &Path) -> String {
    let Ok(Some(state)) = fake_driver_root::FakeDriverRoot::mps_state(pipe_dir) else {
        return String::new();
    };
    let mut parts = Vec::new();
    if let Some(p) = &state.active_thread_percentage {
        parts.push(format!("default active threads {p}%"));
    }
    if !state.pinned_mem_limits.is_empty() {
        let limits: Vec<String> = state
            .pinned_mem_limits
            .iter()
            .map(|(dev, limit)| format!("{dev}={limit}"))
            .collect();
        parts.push(format!("pinned memory {}", limits.join(" ")));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(", {}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, spec: &Value) {
        std::fs::write(dir.join(name), serde_json::to_vec(spec).unwrap()).unwrap();
    }

    fn spec() -> Value {
        json!({
            "cdiVersion": "0.7.0", "kind": "k8s.gpu.nvidia.com/claim",
            "devices": [{"name": "u1-gpu-0", "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidia0"}],
                "env": ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"],
                "mounts": [{"hostPath": "/s/pipe", "containerPath": "/tmp/nvidia-mps"}]}}],
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidiactl"}],
                "env": ["NVIDIA_VISIBLE_DEVICES=void"],
                "mounts": [
                    {"hostPath": "/d/lib/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1"},
                    {"hostPath": "/d/bin/nvidia-smi", "containerPath": "/usr/bin/nvidia-smi"},
                    {"hostPath": "/d/lib/libx.so", "containerPath": "/usr/lib/libx.so"}],
                "hooks": [{"hookName": "createContainer", "path": "/d/bin/nvidia-cdi-hook",
                           "args": ["nvidia-cdi-hook", "update-ldcache"]}]}
        })
    }

    fn answer(ids: &[&str]) -> Vec<Device> {
        vec![Device {
            request_names: vec!["gpu".into()],
            pool_name: "n".into(),
            device_name: "gpu-0".into(),
            cdi_device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
            share_id: None,
        }]
    }

    #[test]
    fn ids_resolve_to_device_and_claim_wide_edits() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "k8s.gpu.nvidia.com-claim_u1.json", &spec());
        let registry = CdiRegistry::scan(dir.path()).unwrap();
        assert_eq!(registry.spec_files(), 1);
        let p = Prepared::resolve(
            &answer(&["k8s.gpu.nvidia.com/claim=u1-gpu-0"]),
            &registry,
            None,
        )
        .unwrap();
        assert_eq!(p.devices[0].nodes, ["/dev/nvidia0"]);
        assert_eq!(p.devices[0].mounts, ["/tmp/nvidia-mps"]);
        assert_eq!(p.claim_edits.nodes, ["/dev/nvidiactl"]);
        assert_eq!(p.claim_edits.hooks, ["update-ldcache"]);
        assert_eq!(
            p.claim_edits.summary(),
            "device nodes /dev/nvidiactl; env NVIDIA_VISIBLE_DEVICES=void; \
             3 mounts (libcuda.so.1, nvidia-smi, ...); hooks update-ldcache"
        );
        assert_eq!(p.to_json()["devices"][0]["mounts"], 1);
    }

    #[test]
    fn an_id_in_no_spec_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.json", &spec());
        let registry = CdiRegistry::scan(dir.path()).unwrap();
        let err = Prepared::resolve(
            &answer(&["k8s.gpu.nvidia.com/claim=u2-gpu-0"]),
            &registry,
            None,
        )
        .unwrap_err();
        assert!(err.to_string().contains("u2-gpu-0"), "{err}");
    }

    #[test]
    fn malformed_specs_are_errors_naming_the_file_and_field() {
        for (body, needle) in [
            ("{not json".to_owned(), "not a JSON CDI spec"),
            (json!({"kind": "novendor"}).to_string(), "kind"),
            (json!({"kind": "a/b"}).to_string(), "no devices list"),
            (json!({"kind": "a/b", "devices": [{}]}).to_string(), "devices[0] has no name"),
            (
                json!({"kind": "a/b", "devices": [{"name": "x", "containerEdits": {"env": [1]}}]})
                    .to_string(),
                "containerEdits.env[0] is not a string",
            ),
            (
                json!({"kind": "a/b", "devices": [{"name": "x", "containerEdits": {"mounts": {}}}]})
                    .to_string(),
                "containerEdits.mounts is not a list",
            ),
            (
                json!({"kind": "a/b", "devices": [{"name": "x"}, {"name": "x"}]}).to_string(),
                "defined twice",
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("bad.json"), &body).unwrap();
            let err = format!("{:#}", CdiRegistry::scan(dir.path()).unwrap_err());
            assert!(err.contains("bad.json"), "{body}: {err}");
            assert!(err.contains(needle), "{body}: {err}");
        }
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = CdiRegistry::scan(&dir.path().join("nope")).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }
}
