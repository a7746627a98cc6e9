use std::collections::BTreeMap;

use gpu_dra_api::schema::{AttributeValue, DeviceKind};

use crate::devices::fixtures::{dgx_h100, dynamic, pcie_a100_bridged, s};
use crate::devices::{BuildOptions, DeviceModel, DeviceRef, Note};
use crate::vfio::{Passthrough, PciIds};

fn passthrough(inventory: &crate::discovery::Inventory, iommu_fd: bool) -> Passthrough {
    Passthrough {
        iommu_fd,
        pci_ids: inventory
            .gpus
            .iter()
            .map(|g| {
                (
                    g.info.pci_bus_id.clone(),
                    PciIds {
                        vendor: "0x10de".into(),
                        device: "0x20f1".into(),
                    },
                )
            })
            .collect(),
    }
}

#[test]
fn every_whole_gpu_gets_a_vfio_sibling_that_shares_its_counter() {
    let inventory = pcie_a100_bridged();
    let options = BuildOptions {
        passthrough: Some(passthrough(&inventory, true)),
        ..BuildOptions::default()
    };
    let model = DeviceModel::build(&inventory, &options);
    assert!(
        model
            .notes
            .iter()
            .all(|n| !matches!(n, Note::PassthroughUnavailable { .. }))
    );
    for (group, gpu) in model.groups.iter().zip(&inventory.gpus) {
        let names: Vec<&str> = group.devices.iter().map(|d| d.name.as_str()).collect();
        let vfio_name = format!("gpu-vfio-{}", gpu.info.index);
        assert_eq!(
            names,
            [format!("gpu-{}", gpu.info.minor).as_str(), &vfio_name]
        );
        let set = group.counter_set.as_ref().expect("a counter set");
        assert_eq!(set.name, format!("gpu-{}-counter-set", gpu.info.minor));
        assert_eq!(
            set.counters,
            BTreeMap::from([("memory".to_owned(), gpu.info.memory_bytes)])
        );
        for d in &group.devices {
            let c = d.consumes.as_ref().expect("both consume");
            assert_eq!(c.counter_set, set.name);
            assert_eq!(c.counters, set.counters, "{} consumes all of it", d.name);
        }
        let v = &group.devices[1];
        assert_eq!(v.kind, DeviceKind::Vfio);
        assert_eq!(
            v.location,
            DeviceRef::Vfio {
                minor: gpu.info.minor,
                index: gpu.info.index
            }
        );
        let a = &v.attributes.attributes;
        assert_eq!(a["type"], s("vfio"));
        assert_eq!(a["uuid"], s(&gpu.info.uuid));
        assert_eq!(a["productName"], s("NVIDIA A100-PCIE-40GB"));
        assert_eq!(a["deviceID"], s("0x20f1"));
        assert_eq!(a["vendorID"], s("0x10de"));
        assert_eq!(a["iommuFDEnabled"], AttributeValue::Bool(true));
        assert_eq!(
            a["resource.kubernetes.io/pciBusID"],
            s(&gpu.info.pci_bus_id)
        );
        assert!(a.contains_key("resource.kubernetes.io/pcieRoot"));
        assert!(a.contains_key("resource.kubernetes.io/numaNode"));
        assert!(!a.contains_key("index") && !a.contains_key("brand"));
        assert_eq!(
            v.attributes.capacity,
            BTreeMap::from([("addressableMemory", gpu.info.memory_bytes)])
        );
    }
}

#[test]
fn without_passthrough_nothing_changes() {
    let inventory = pcie_a100_bridged();
    let model = DeviceModel::build(&inventory, &BuildOptions::default());
    assert!(model.groups.iter().all(|g| g.counter_set.is_none()));
    assert!(
        model
            .devices()
            .all(|d| d.kind == DeviceKind::Gpu && d.consumes.is_none())
    );
}

#[test]
fn under_dynamic_mig_the_sibling_consumes_what_the_full_gpu_does() {
    let inventory = dgx_h100(false);
    let options = BuildOptions {
        passthrough: Some(passthrough(&inventory, false)),
        ..dynamic()
    };
    let model = DeviceModel::build(&inventory, &options);
    for group in &model.groups {
        let full = group
            .devices
            .iter()
            .find(|d| d.kind == DeviceKind::Gpu)
            .unwrap();
        let vfio = group
            .devices
            .iter()
            .find(|d| d.kind == DeviceKind::Vfio)
            .unwrap();
        assert_eq!(vfio.consumes, full.consumes);
        assert!(vfio.consumes.as_ref().unwrap().counters.len() > 1);
        assert_eq!(
            vfio.attributes.attributes["iommuFDEnabled"],
            AttributeValue::Bool(false)
        );
    }
}

#[test]
fn gpus_that_cannot_be_handed_over_are_left_out_with_a_note() {
    // MIG mode on (static): no full GPU, so no sibling.
    let inventory = dgx_h100(true);
    let mut facts = passthrough(&inventory, false);
    // And one GPU whose ids could not be read.
    let missing = inventory.gpus[0].info.pci_bus_id.clone();
    facts.pci_ids.remove(&missing);
    let model = DeviceModel::build(
        &inventory,
        &BuildOptions {
            passthrough: Some(facts),
            ..BuildOptions::default()
        },
    );
    assert!(model.devices().all(|d| d.kind != DeviceKind::Vfio));
    let notes: Vec<String> = model
        .notes
        .iter()
        .filter(|n| matches!(n, Note::PassthroughUnavailable { .. }))
        .map(ToString::to_string)
        .collect();
    assert_eq!(notes.len(), 8, "{notes:?}");
    assert!(
        notes[0].ends_with(
            "not offered for VFIO passthrough: the GPU is not published whole (MIG mode is on)"
        ),
        "{notes:?}"
    );
    let inventory = pcie_a100_bridged();
    let mut facts = passthrough(&inventory, false);
    facts.pci_ids.remove(&inventory.gpus[0].info.pci_bus_id);
    let model = DeviceModel::build(
        &inventory,
        &BuildOptions {
            passthrough: Some(facts),
            ..BuildOptions::default()
        },
    );
    assert!(model.device("gpu-vfio-0").is_none() && model.device("gpu-vfio-1").is_some());
    assert!(
        model.groups[0].counter_set.is_none(),
        "no sibling, no counter"
    );
    assert!(
        model.notes.iter().any(|n| n.to_string().ends_with(
            "not offered for VFIO passthrough: its PCI ids could not be read from sysfs"
        ))
    );
}
