//! VFIO passthrough devices (`--passthrough`): every GPU published whole is
//! also published as `gpu-vfio-<index>` (`type=vfio`), with NVIDIA's
//! attributes and capacity. The full GPU and its VFIO sibling consume the
//! same counters, so the scheduler hands out one or the other, never both:
//! under dynamic MIG the sibling consumes what the full GPU does (every
//! counter of the GPU's set); otherwise the GPU gets a counter set of its
//! own, `gpu-<minor>-counter-set` with one counter, `memory`, which each
//! of the two consumes whole.

use std::collections::BTreeMap;

use gpu_dra_api::schema::{self, DeviceAttributes, DeviceKind, counters, names};

use super::{CounterConsumption, CounterSet, Device, DeviceRef, GpuFacts, GpuGroup, Note};
use crate::vfio::Passthrough;

/// Adds the VFIO sibling of `group`'s full GPU, or a note why there is none.
pub(super) fn add(
    group: &mut GpuGroup,
    facts: &GpuFacts<'_>,
    passthrough: &Passthrough,
    notes: &mut Vec<Note>,
) {
    let info = &facts.gpu.info;
    let unavailable = |reason: &str| Note::PassthroughUnavailable {
        gpu: info.uuid.clone(),
        reason: reason.to_owned(),
    };
    let Some(full) = group.devices.iter().position(|d| d.kind == DeviceKind::Gpu) else {
        notes.push(unavailable(
            "the GPU is not published whole (MIG mode is on)",
        ));
        return;
    };
    if group.devices[full].memory_sharing.is_some() {
        notes.push(unavailable(
            "the GPU is shared (memory fraction or consumable shares)",
        ));
        return;
    }
    let Some(ids) = passthrough.pci_ids.get(&info.pci_bus_id) else {
        notes.push(unavailable("its PCI ids could not be read from sysfs"));
        return;
    };
    let consumes = match (&group.counter_set, &group.devices[full].consumes) {
        (Some(_), Some(all)) => all.clone(),
        (Some(_), None) => {
            notes.push(unavailable(
                "the GPU's counter set is not consumed by its full GPU",
            ));
            return;
        }
        (None, _) => {
            let name = counters::counter_set(info.minor);
            group.counter_set = Some(CounterSet {
                name: name.clone(),
                counters: BTreeMap::from([(counters::MEMORY.to_owned(), info.memory_bytes)]),
            });
            let all = CounterConsumption {
                counter_set: name,
                counters: BTreeMap::from([(counters::MEMORY.to_owned(), info.memory_bytes)]),
            };
            group.devices[full].consumes = Some(all.clone());
            all
        }
    };
    match device(facts, ids, passthrough.iommu_fd, consumes) {
        Ok(d) => group.devices.push(d),
        Err(e) => notes.push(unavailable(&format!("invalid attributes: {e}"))),
    }
}

fn device(
    facts: &GpuFacts<'_>,
    ids: &crate::vfio::PciIds,
    iommu_fd: bool,
    consumes: CounterConsumption,
) -> Result<Device, schema::SchemaError> {
    let info = &facts.gpu.info;
    let mut a = DeviceAttributes::new(DeviceKind::Vfio);
    a.set_string(names::UUID, info.uuid.clone())?;
    a.set_string(names::PRODUCT_NAME, facts.product_name.clone())?;
    a.set_string(names::DEVICE_ID, ids.device.clone())?;
    a.set_string(names::VENDOR_ID, ids.vendor.clone())?;
    a.set_bool(names::IOMMU_FD_ENABLED, iommu_fd)?;
    a.set_string(names::PCI_BUS_ID, info.pci_bus_id.clone())?;
    if let Some(root) = &facts.pcie_root {
        a.set_string(names::PCIE_ROOT, root.clone())?;
    }
    if let Some(numa) = facts.gpu.numa_node {
        a.set_int(names::NUMA_NODE, numa)?;
    }
    a.set_capacity(names::ADDRESSABLE_MEMORY, info.memory_bytes)?;
    Ok(Device {
        name: name(info.index),
        kind: DeviceKind::Vfio,
        location: DeviceRef::Vfio {
            minor: info.minor,
            index: info.index,
        },
        attributes: a.finish()?,
        consumes: Some(consumes),
        taints: Vec::new(),
        memory_sharing: None,
    })
}

/// The name of the VFIO device of the GPU with NVML index `index`, as
/// NVIDIA names it.
pub fn name(index: u32) -> String {
    format!("gpu-vfio-{index}")
}

#[cfg(test)]
mod tests;
