//! The per-claim CDI spec: claim-level edits shared by every device of the
//! claim (driver files, control nodes, hooks, env) and per-device edits
//! (the device's own nodes), plus the qualified ids handed to the kubelet.
//!
//! Env: only `NVIDIA_VISIBLE_DEVICES=void`, as NVIDIA's driver sets, so that
//! an NVIDIA runtime hook on the node does not inject devices a second time.
//! No `CUDA_VISIBLE_DEVICES`: the container only has the injected nodes, so
//! CUDA sees exactly the claimed devices; and a per-device value would be
//! wrong when a container gets several devices (the last one would win).
//!
//! Hooks, only when there is an `nvidia-cdi-hook` (in the driver root, or
//! named by `--nvidia-cdi-hook-path`; arguments as NVIDIA's toolkit writes
//! them): `create-symlinks --link
//! libcuda.so.1::<dir>/libcuda.so` and `update-ldcache --folder <dir>` per
//! library directory, both at `createContainer`.
//!
//! Without the hook nothing tells the container's loader where the driver's
//! libraries are: it finds them only in the directories glibc searches by
//! default, and those differ between image families (Debian and Ubuntu:
//! `/lib/<triplet>`, `/usr/lib/<triplet>`, `/lib`, `/usr/lib`; the Red Hat
//! family: `/lib64`, `/usr/lib64`). Libraries found under another directory
//! of the driver root (`lib64/` of a GKE-style root lands in `/lib64`, which
//! Ubuntu's loader never searches: seen on a real H100 node, where neither
//! `nvidia-smi` nor CUDA could start) are then also mounted under
//! `/usr/lib/<triplet>` and `/usr/lib64`, whichever does not already hold
//! them, so that images of either family find them ([`loader_paths`]).
//! And `libcuda.so`, which the hook would have linked, is mounted as a copy
//! of `libcuda.so.1` ([`dev_link`]).

use std::collections::HashSet;
use std::path::Path;

use super::driver_root::{DriverFile, DriverFileKind, DriverFiles};
use super::names::{
    claim_device_name, qualified_id, validate_claim_uid, validate_class, validate_vendor,
};
use super::nodes::{ControlNodes, GpuNodes, MigNodes};
use super::spec::{ContainerEdits, Device, DeviceNode, Hook, Mount, Spec, min_version};
use super::{CLAIM_CLASS, CdiError, DEFAULT_VENDOR};

/// Mount options of driver files, as NVIDIA's toolkit uses.
pub const MOUNT_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "rbind", "rprivate"];

/// A spec being built for one claim.
#[derive(Clone, Debug)]
pub struct ClaimSpec {
    vendor: String,
    class: String,
    claim_uid: String,
    devices: Vec<Device>,
    ids: Vec<(String, String)>,
}

/// A finished claim spec and the ids of its devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuiltClaimSpec {
    /// The spec, with the lowest sufficient `cdiVersion`.
    pub spec: Spec,
    /// `(DRA device name, fully qualified CDI id)` per device, in order added.
    pub device_ids: Vec<(String, String)>,
}

impl ClaimSpec {
    /// A spec for `claim_uid` with NVIDIA's kind `k8s.gpu.nvidia.com/claim`.
    pub fn new(claim_uid: &str) -> Result<Self, CdiError> {
        Self::with_kind(DEFAULT_VENDOR, CLAIM_CLASS, claim_uid)
    }

    /// A spec for `claim_uid` of kind `<vendor>/<class>`.
    pub fn with_kind(vendor: &str, class: &str, claim_uid: &str) -> Result<Self, CdiError> {
        validate_vendor(vendor)?;
        validate_class(class)?;
        validate_claim_uid(claim_uid)?;
        Ok(Self {
            vendor: vendor.to_owned(),
            class: class.to_owned(),
            claim_uid: claim_uid.to_owned(),
            devices: Vec::new(),
            ids: Vec::new(),
        })
    }

    /// The claim UID.
    pub fn claim_uid(&self) -> &str {
        &self.claim_uid
    }

    /// Adds a whole GPU under its DRA device name.
    pub fn add_gpu(&mut self, device: &str, gpu: &GpuNodes) -> Result<&mut Self, CdiError> {
        self.add(device, &gpu.nodes)
    }

    /// Adds a VFIO passthrough GPU under its DRA device name, with its
    /// VFIO nodes.
    pub fn add_vfio(&mut self, device: &str, nodes: &[DeviceNode]) -> Result<&mut Self, CdiError> {
        self.add(device, nodes)
    }

    /// Adds a MIG device under its DRA device name.
    pub fn add_mig(&mut self, device: &str, mig: &MigNodes) -> Result<&mut Self, CdiError> {
        self.add(device, &mig.nodes)
    }

    fn add(&mut self, device: &str, nodes: &[DeviceNode]) -> Result<&mut Self, CdiError> {
        let name = claim_device_name(&self.claim_uid, device)?;
        if self.devices.iter().any(|d| d.name == name) {
            return Err(CdiError::DuplicateDevice {
                claim_uid: self.claim_uid.clone(),
                device: device.to_owned(),
            });
        }
        let id = qualified_id(&self.vendor, &self.class, &name)?;
        self.devices.push(Device {
            name,
            container_edits: ContainerEdits {
                device_nodes: nodes.to_vec(),
                ..ContainerEdits::default()
            },
            ..Device::default()
        });
        self.ids.push((device.to_owned(), id));
        Ok(self)
    }

    /// Adds `edits` (sharing env, MPS mounts...) to the device added under
    /// DRA device name `device`.
    pub fn add_edits(
        &mut self,
        device: &str,
        edits: ContainerEdits,
    ) -> Result<&mut Self, CdiError> {
        let name = claim_device_name(&self.claim_uid, device)?;
        let Some(target) = self.devices.iter_mut().find(|d| d.name == name) else {
            return Err(CdiError::InvalidName {
                what: "device name",
                value: device.to_owned(),
                reason: "no device of this name was added to the claim spec",
            });
        };
        let e = &mut target.container_edits;
        e.env.extend(edits.env);
        e.device_nodes.extend(edits.device_nodes);
        e.hooks.extend(edits.hooks);
        e.mounts.extend(edits.mounts);
        e.additional_gids.extend(edits.additional_gids);
        Ok(self)
    }

    /// Finishes the spec with `common` as its claim-level edits (see
    /// [`claim_edits`]). Fails when no device was added.
    pub fn build(self, common: ContainerEdits) -> Result<BuiltClaimSpec, CdiError> {
        if self.devices.is_empty() {
            return Err(CdiError::NoDevices {
                claim_uid: self.claim_uid,
            });
        }
        let mut spec = Spec {
            cdi_version: String::new(),
            kind: format!("{}/{}", self.vendor, self.class),
            devices: self.devices,
            container_edits: common,
            ..Spec::default()
        };
        spec.cdi_version = min_version(&spec).to_owned();
        Ok(BuiltClaimSpec {
            spec,
            device_ids: self.ids,
        })
    }
}

/// The claim-level edits: `NVIDIA_VISIBLE_DEVICES=void`, the control nodes,
/// the driver files as read-only bind mounts and, with an `nvidia-cdi-hook`,
/// the symlink and ldcache hooks; without one, `libcuda.so` ([`dev_link`])
/// and the libraries' loader copies ([`loader_paths`]).
pub fn claim_edits(files: &DriverFiles, control: &ControlNodes) -> ContainerEdits {
    let mount = |host_path: &str, container_path: String| Mount {
        host_path: host_path.to_owned(),
        container_path,
        options: MOUNT_OPTIONS.iter().map(|&o| o.to_owned()).collect(),
        mount_type: None,
    };
    let mut mounts: Vec<Mount> = files
        .files
        .iter()
        .map(|f| mount(&f.host_path, f.container_path.clone()))
        .collect();
    if files.cdi_hook.is_none() {
        // The first library of a name wins, as in the loader's search.
        let mut taken: HashSet<String> = mounts.iter().map(|m| m.container_path.clone()).collect();
        let dev_link = dev_link(files);
        if let Some(link) = &dev_link
            && taken.insert(link.container_path.clone())
        {
            mounts.push(mount(&link.host_path, link.container_path.clone()));
        }
        for f in files
            .files
            .iter()
            .filter(|f| f.kind == DriverFileKind::Library)
            .chain(&dev_link)
        {
            for path in loader_paths(&f.container_path, std::env::consts::ARCH) {
                if taken.insert(path.clone()) {
                    mounts.push(mount(&f.host_path, path));
                }
            }
        }
    }
    let mut hooks = Vec::new();
    if let Some(hook) = &files.cdi_hook {
        if let Some(link) = dev_link(files) {
            hooks.push(Hook {
                hook_name: "createContainer".into(),
                path: hook.clone(),
                args: vec![
                    "nvidia-cdi-hook".into(),
                    "create-symlinks".into(),
                    "--link".into(),
                    format!("libcuda.so.1::{}", link.container_path),
                ],
                ..Hook::default()
            });
        }
        let mut args = vec!["nvidia-cdi-hook".to_owned(), "update-ldcache".to_owned()];
        for dir in files.library_dirs() {
            args.push("--folder".into());
            args.push(dir);
        }
        hooks.push(Hook {
            hook_name: "createContainer".into(),
            path: hook.clone(),
            args,
            ..Hook::default()
        });
    }
    ContainerEdits {
        env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
        device_nodes: control.nodes.clone(),
        hooks,
        mounts,
        additional_gids: Vec::new(),
    }
}

/// The unversioned `libcuda.so` next to `libcuda.so.1` (what `-lcuda`
/// links against, and what some programs `dlopen`), from the file
/// `libcuda.so.1` resolves to. The hook's `create-symlinks` makes it a link;
/// without the hook it is mounted (CDI has no edit that makes a symlink).
pub fn dev_link(files: &DriverFiles) -> Option<DriverFile> {
    let cuda = files.find("libcuda.so.1")?;
    Some(DriverFile {
        kind: DriverFileKind::Library,
        container_path: cuda.container_path.strip_suffix(".1")?.to_owned(),
        host_path: cuda.host_path.clone(),
    })
}

/// Where a library mounted at `container_path` must also be mounted for
/// the default search path of both glibc families to hold it, on a node of
/// `arch` (`std::env::consts::ARCH`): `/usr/lib/<triplet>/<name>` unless its
/// directory is a Debian-family default, `/usr/lib64/<name>` unless it is a
/// Red Hat-family one. Used only without the ldcache hook (module docs).
pub fn loader_paths(container_path: &str, arch: &str) -> Vec<String> {
    let path = Path::new(container_path);
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Vec::new();
    };
    let name = name.to_string_lossy();
    let triplet = match arch {
        "x86_64" => Some("x86_64-linux-gnu"),
        "aarch64" => Some("aarch64-linux-gnu"),
        _ => None,
    };
    let mut out = Vec::new();
    if let Some(triplet) = triplet {
        let debian = [
            format!("/lib/{triplet}"),
            format!("/usr/lib/{triplet}"),
            "/lib".to_owned(),
            "/usr/lib".to_owned(),
        ];
        if !debian.iter().any(|d| dir == Path::new(d)) {
            out.push(format!("/usr/lib/{triplet}/{name}"));
        }
    }
    if dir != Path::new("/lib64") && dir != Path::new("/usr/lib64") {
        out.push(format!("/usr/lib64/{name}"));
    }
    out
}

#[cfg(test)]
mod tests;
