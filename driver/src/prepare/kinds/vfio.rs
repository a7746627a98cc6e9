//! A whole GPU handed to a VM through VFIO (`gpu-vfio-<index>`): refused
//! while any other claim holds the GPU or NVML sees processes on it (a
//! device-plugin pod, a host process, another runtime's container: the
//! unbind would kill their work or hang), else rebound from `nvidia` to
//! `vfio-pci` in sysfs ([`crate::vfio`]), with its VFIO nodes in the
//! claim's CDI spec as the claim's `VfioDeviceConfig` asks; undone by
//! binding it back to `nvidia`.
//!
//! The driver found on the GPU is journalled (`PrepareStarted`) before the
//! first sysfs write, so a crash at any step of the rebind leaves an entry
//! whose undo, at the restart, binds the GPU back to `nvidia` (each step
//! of a rebind is skipped when already done, so undo works from any point).
//! At start a GPU of this node found on `vfio-pci` that no entry names,
//! nor the text of a lost entry, is bound back to `nvidia` too.

use std::path::Path;

use gpu_dra_api::config::{DeviceConfig, IommuBackendPolicy, VfioDeviceConfig};
use gpu_nvml::GpuProcess;

use super::{Kind, Recovery, Setup, Undo};
use crate::prepare::cdi::spec::DeviceNode;
use crate::prepare::checkpoint::{DeviceKind, PreparedDeviceRecord};
use crate::prepare::error::PrepareError;
use crate::prepare::journal::{failpoint, journal};
use crate::prepare::plan::{Target, VfioTarget};
use crate::vfio::{self, NVIDIA_DRIVER, VFIO_DRIVER, VfioError};

/// The VFIO kind.
pub(crate) struct Vfio;

impl Kind for Vfio {
    fn setup(&self, claim: &mut Setup<'_>, i: usize) -> Result<(), PrepareError> {
        let d = claim.device(i);
        let Target::Vfio(v) = &d.target else {
            return Ok(());
        };
        let unsupported = |reason: String| PrepareError::Unsupported {
            device: d.device.clone(),
            reason,
        };
        if d.admin {
            return Err(unsupported(
                "admin access to a VFIO passthrough GPU is not supported: nothing can watch a GPU a VM owns".to_owned(),
            ));
        }
        refuse_if_in_use(claim, v, &d.device)?;
        let config = match &d.config {
            Some(DeviceConfig::Vfio(c)) => c.clone(),
            _ => VfioDeviceConfig::default_config(),
        };
        let inner = claim.inner;
        let root = &inner.opts.sysfs_root;
        let bus = &v.pci_bus_id;
        let sysfs = |error: VfioError| unsupported(error.to_string());
        let found = vfio::current_driver(root, bus).map_err(sysfs)?;
        if let Some(other) = found
            .as_deref()
            .filter(|f| *f != NVIDIA_DRIVER && *f != VFIO_DRIVER)
        {
            return Err(unsupported(format!(
                "GPU {bus} is bound to driver {other:?}, expected {NVIDIA_DRIVER} or {VFIO_DRIVER}; bind it to {NVIDIA_DRIVER} first"
            )));
        }
        // Only a GPU on nvidia can have processes (and only then does NVML
        // see it): one already on vfio-pci is a retried prepare.
        if found.as_deref() == Some(NVIDIA_DRIVER) {
            refuse_if_processes(inner.backend.processes(v.index), v, &d.device)?;
        }
        if let DeviceKind::Vfio {
            previous_driver, ..
        } = &mut claim.entry.devices[i].kind
        {
            *previous_driver = Some(found.unwrap_or_else(|| "none".to_owned()));
        }
        journal(inner, &claim.plan.uid, claim.entry, "record a VFIO rebind")?;
        failpoint("vfio-after-journal");
        tracing::info!(claim = %claim.plan.uid, device = %d.device, pci_bus_id = %bus, "binding the GPU to vfio-pci");
        vfio::bind(root, bus, VFIO_DRIVER, false, &|step| {
            failpoint(&format!("vfio-after-{step}"));
        })
        .map_err(sysfs)?;
        let group = vfio::iommu_group(root, bus).map_err(sysfs)?;
        if let DeviceKind::Vfio { iommu_group, .. } = &mut claim.entry.devices[i].kind {
            *iommu_group = Some(group.clone());
        }
        let first = !claim.plan.devices[..i]
            .iter()
            .any(|p| matches!(p.target, Target::Vfio(_)));
        let nodes = nodes(claim, v, &config, &group, first).map_err(PrepareError::from)?;
        claim.spec.add_vfio(&claim.names[i], &nodes)?;
        Ok(())
    }

    fn undo(&self, cx: &mut Undo<'_>, record: &PreparedDeviceRecord) {
        let DeviceKind::Vfio {
            pci_bus_id,
            previous_driver: Some(_),
            ..
        } = &record.kind
        else {
            return;
        };
        if let Err(e) = bind_back(&cx.inner.opts.sysfs_root, pci_bus_id) {
            cx.errors.push(format!(
                "bind {} ({pci_bus_id}) back to {NVIDIA_DRIVER}: {e}",
                record.device
            ));
        }
    }

    fn sweep(&self, cx: &mut Recovery<'_>) {
        let root = &cx.inner.opts.sysfs_root;
        let named = |bus: &str| {
            cx.remaining.claims.values().any(|e| {
                e.devices.iter().any(
                    |r| matches!(&r.kind, DeviceKind::Vfio { pci_bus_id, .. } if pci_bus_id == bus),
                )
            })
        };
        for target in cx.inner.catalog.values() {
            let Target::Vfio(v) = target else {
                continue;
            };
            let bus = v.pci_bus_id.as_str();
            if vfio::current_driver(root, bus).ok().flatten().as_deref() != Some(VFIO_DRIVER)
                || named(bus)
            {
                continue;
            }
            // A lost entry's VM may still run on it: leave it.
            if cx
                .lost
                .values()
                .any(|l| l.holds_nearly(bus) || l.holds_nearly(&v.uuid))
            {
                tracing::warn!(
                    pci_bus_id = bus,
                    "GPU left on vfio-pci: a lost checkpoint entry names it"
                );
                continue;
            }
            match bind_back(root, bus) {
                Ok(()) => {
                    tracing::warn!(
                        pci_bus_id = bus,
                        "GPU found on vfio-pci that no claim holds: bound back to nvidia"
                    );
                    cx.report.vfio_rebound.push(bus.to_owned());
                }
                Err(e) => cx.report.errors.push(format!(
                    "VFIO sweep: bind {bus} back to {NVIDIA_DRIVER}: {e}"
                )),
            }
        }
    }
}

/// Binds the GPU back to `nvidia` and clears its override.
fn bind_back(root: &Path, bus: &str) -> Result<(), VfioError> {
    vfio::bind(root, bus, NVIDIA_DRIVER, true, &|step| {
        failpoint(&format!("vfio-undo-after-{step}"));
    })
}

/// Refuses the GPU while another claim holds any device on it (admin
/// access included: a monitoring container has the GPU's nodes open).
fn refuse_if_in_use(claim: &Setup<'_>, v: &VfioTarget, device: &str) -> Result<(), PrepareError> {
    for (uid, entry) in claim.others {
        if let Some(r) = entry.devices.iter().find(|r| r.gpu_minor() == v.minor) {
            return Err(PrepareError::Unsupported {
                device: device.to_owned(),
                reason: format!(
                    "GPU {} is in use by claim {}/{} ({uid}) as {}: a GPU is bound to vfio-pci only when no container uses it; unprepare that claim first",
                    v.pci_bus_id, entry.namespace, entry.name, r.device
                ),
            });
        }
    }
    Ok(())
}

/// PIDs named in a refusal; the rest are counted.
const PIDS_SHOWN: usize = 8;

/// Refuses the GPU while NVML sees processes on it (`processes`, the
/// backend's answer for `v.index`). NVML without the query goes on (a debug
/// line): the claims check above is all there is. A lost GPU goes on with a
/// warning: it has no live processes, and the admin may be handing it to a
/// VM to recover it. Any other error refuses: the GPU cannot be shown idle.
fn refuse_if_processes(
    processes: gpu_nvml::Result<Vec<GpuProcess>>,
    v: &VfioTarget,
    device: &str,
) -> Result<(), PrepareError> {
    let bus = &v.pci_bus_id;
    let refuse = |reason: String| PrepareError::Unsupported {
        device: device.to_owned(),
        reason,
    };
    let processes = match processes {
        Ok(p) => p,
        Err(e @ gpu_nvml::Error::NotSupported { .. }) => {
            tracing::debug!(device, pci_bus_id = %bus, gpu = v.index, error = %e, "NVML cannot list the GPU's processes; only claims are checked");
            return Ok(());
        }
        Err(e @ gpu_nvml::Error::GpuLost { .. }) => {
            tracing::warn!(device, pci_bus_id = %bus, gpu = v.index, error = %e, "the GPU is lost: no process can use it, binding it to vfio-pci");
            return Ok(());
        }
        Err(e) => {
            return Err(refuse(format!(
                "cannot tell whether processes use GPU {bus}: {e}; a GPU is bound to vfio-pci only when no container uses it"
            )));
        }
    };
    if processes.is_empty() {
        return Ok(());
    }
    let n = processes.len();
    let pids: Vec<String> = processes
        .iter()
        .take(PIDS_SHOWN)
        .map(|p| p.pid.to_string())
        .collect();
    let shown = if n > PIDS_SHOWN {
        format!("{} and {} more", pids.join(", "), n - PIDS_SHOWN)
    } else {
        pids.join(", ")
    };
    tracing::info!(device, pci_bus_id = %bus, processes = n, pids = %shown, "refusing VFIO: NVML sees processes on the GPU");
    let (noun, pid, them) = if n == 1 {
        ("process", "PID", "it")
    } else {
        ("processes", "PIDs", "them")
    };
    Err(refuse(format!(
        "GPU {bus} is in use by {n} {noun} that NVML sees ({pid} {shown}): a GPU is bound to vfio-pci only when no container uses it; stop {them} first"
    )))
}

/// The VFIO nodes of one device: its group (`/dev/vfio/<group>`), or with
/// `PreferIommuFD` on a node with iommufd its cdev
/// (`/dev/vfio/devices/vfio<N>`); the claim's first VFIO device also gets
/// `/dev/vfio/vfio` (libvirt looks for it) and, with `enableAPIDevice` and
/// iommufd, `/dev/iommu`.
fn nodes(
    claim: &Setup<'_>,
    v: &VfioTarget,
    config: &VfioDeviceConfig,
    group: &str,
    first: bool,
) -> Result<Vec<DeviceNode>, crate::prepare::cdi::CdiError> {
    let locator = &claim.inner.nodes;
    let iommufd = config.backend_policy() == IommuBackendPolicy::PreferIommuFd
        && locator.node("/dev/iommu")?.is_some();
    let cdev = if iommufd {
        vfio::iommufd_cdev(&claim.inner.opts.sysfs_root, &v.pci_bus_id)
            .ok()
            .flatten()
    } else {
        None
    };
    let mut out = Vec::new();
    match &cdev {
        Some(cdev) => out.push(locator.required(&format!("/dev/vfio/devices/{cdev}"))?),
        None => out.push(locator.required(&format!("/dev/vfio/{group}"))?),
    }
    if first {
        out.push(locator.required("/dev/vfio/vfio")?);
        if config.enable_api_device() && cdev.is_some() {
            out.push(locator.required("/dev/iommu")?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> VfioTarget {
        VfioTarget {
            index: 2,
            minor: 2,
            uuid: "GPU-x".to_owned(),
            pci_bus_id: "0000:18:00.0".to_owned(),
        }
    }

    fn process(pid: u32) -> GpuProcess {
        GpuProcess {
            pid,
            used_memory_bytes: None,
            compute: true,
            graphics: false,
        }
    }

    fn reason(answer: gpu_nvml::Result<Vec<GpuProcess>>) -> Option<String> {
        match refuse_if_processes(answer, &target(), "gpu-vfio-2") {
            Ok(()) => None,
            Err(PrepareError::Unsupported { device, reason }) => {
                assert_eq!(device, "gpu-vfio-2");
                Some(reason)
            }
            Err(other) => panic!("not Unsupported: {other}"),
        }
    }

    #[test]
    fn processes_refuse_the_gpu_by_their_pids() {
        assert_eq!(reason(Ok(Vec::new())), None);
        assert_eq!(
            reason(Ok(vec![process(4242), process(4243)])).unwrap(),
            "GPU 0000:18:00.0 is in use by 2 processes that NVML sees (PIDs 4242, 4243): \
             a GPU is bound to vfio-pci only when no container uses it; stop them first"
        );
        assert_eq!(
            reason(Ok(vec![process(7)])).unwrap(),
            "GPU 0000:18:00.0 is in use by 1 process that NVML sees (PID 7): \
             a GPU is bound to vfio-pci only when no container uses it; stop it first"
        );
        let eight: Vec<GpuProcess> = (1..=8).map(process).collect();
        let r = reason(Ok(eight)).unwrap();
        assert!(
            r.contains("8 processes that NVML sees (PIDs 1, 2, 3, 4, 5, 6, 7, 8):"),
            "{r}"
        );
        let many: Vec<GpuProcess> = (1..=11).map(process).collect();
        let r = reason(Ok(many)).unwrap();
        assert!(
            r.contains("11 processes that NVML sees (PIDs 1, 2, 3, 4, 5, 6, 7, 8 and 3 more):"),
            "{r}"
        );
    }

    #[test]
    fn nvml_errors_go_on_only_when_unsupported_or_lost() {
        assert_eq!(
            reason(Err(gpu_nvml::Error::NotSupported {
                call: "processes",
                gpu: Some(2)
            })),
            None
        );
        assert_eq!(
            reason(Err(gpu_nvml::Error::GpuLost {
                call: "nvmlDeviceGetComputeRunningProcesses_v3",
                gpu: 2
            })),
            None
        );
        let r = reason(Err(gpu_nvml::Error::Call {
            call: "nvmlDeviceGetComputeRunningProcesses_v3",
            gpu: Some(2),
            reason: "Insufficient Permissions".to_owned(),
        }))
        .unwrap();
        assert_eq!(
            r,
            "cannot tell whether processes use GPU 0000:18:00.0: NVML \
             nvmlDeviceGetComputeRunningProcesses_v3 failed on GPU 2: Insufficient Permissions; \
             a GPU is bound to vfio-pci only when no container uses it"
        );
    }
}
