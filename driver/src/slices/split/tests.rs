use std::collections::{BTreeMap, HashSet};

use super::*;
use crate::devices::fixtures::*;
use crate::devices::{BuildOptions, Taint, TaintEffect};
use crate::slices::SliceRules;

fn build(inv: &crate::discovery::Inventory, dynamic_mig: bool, rules: SliceRules) -> DeviceModel {
    DeviceModel::build(
        inv,
        &BuildOptions {
            dynamic_mig,
            group_limits: rules.group_limits(),
            ..BuildOptions::default()
        },
    )
}

/// Checks every limit of `rules` on `slices`, and that they hold exactly the
/// model's devices (in order) and counter sets.
fn check(model: &DeviceModel, slices: &[SliceContent], rules: SliceRules) {
    let l = rules.limits();
    assert!(!slices.is_empty());
    let mut sets = HashSet::new();
    for (i, s) in slices.iter().enumerate() {
        if l.counters_in_own_slices {
            assert!(
                s.devices.is_empty() || s.counter_sets.is_empty(),
                "slice {i} mixes"
            );
        }
        assert!(
            s.counter_sets.len() <= l.max_counter_sets_per_slice,
            "slice {i}"
        );
        assert!(
            s.shared_counters() <= l.max_shared_counters_per_slice,
            "slice {i}"
        );
        for set in &s.counter_sets {
            assert!(set.counters.len() <= l.max_counters_per_set);
            assert!(sets.insert(set.name.clone()), "set {} twice", set.name);
        }
        let mut max = l.max_devices;
        if s.devices.iter().any(|d| d.consumes.is_some()) {
            max = max.min(l.max_devices_with_counters);
        }
        if s.devices.iter().any(|d| !d.taints.is_empty()) {
            max = max.min(l.max_devices_with_taints);
        }
        assert!(
            s.devices.len() <= max,
            "slice {i}: {} > {max}",
            s.devices.len()
        );
        if let Some(cap) = l.max_consumptions_per_slice {
            assert!(s.consumptions() <= cap, "slice {i}");
        }
        for d in &s.devices {
            assert!(d.taints.len() <= l.max_taints_per_device);
            if let Some(c) = &d.consumes {
                assert!(c.counters.len() <= l.max_counters_per_device);
                if !l.counters_in_own_slices {
                    assert!(
                        s.counter_sets.iter().any(|set| set.name == c.counter_set),
                        "{} consumes {} from another slice",
                        d.name,
                        c.counter_set
                    );
                }
            }
        }
    }
    let published: Vec<&str> = slices
        .iter()
        .flat_map(|s| &s.devices)
        .map(|d| d.name.as_str())
        .collect();
    let expected: Vec<&str> = model.devices().map(|d| d.name.as_str()).collect();
    assert_eq!(published, expected);
    let expected_sets: HashSet<String> = model
        .groups
        .iter()
        .filter_map(|g| g.counter_set.as_ref().map(|s| s.name.clone()))
        .collect();
    assert_eq!(sets, expected_sets);
}

#[test]
fn static_node_fits_one_slice() {
    for rules in [SliceRules::V1_34, SliceRules::V1_35] {
        let model = build(&dgx_h100(false), false, rules);
        let slices = split(&model, &rules.limits());
        check(&model, &slices, rules);
        assert_eq!(slices.len(), 1);
        assert_eq!(slices[0].devices.len(), 8);
    }
}

#[test]
fn many_plain_devices_fill_slices_of_128() {
    let mut inv = dgx_h100(false);
    inv.gpus = (0..200)
        .map(|i| {
            let mut g = inv.gpus[0].clone();
            g.info.minor = i;
            g.info.index = i;
            g.info.uuid = format!("GPU-{i}");
            g.info.pci_bus_id = format!("0000:{:02x}:{:02x}.0", i / 32, i % 32);
            g
        })
        .collect();
    for rules in [SliceRules::V1_34, SliceRules::V1_35] {
        let model = build(&inv, false, rules);
        let slices = split(&model, &rules.limits());
        check(&model, &slices, rules);
        let sizes: Vec<usize> = slices.iter().map(|s| s.devices.len()).collect();
        assert_eq!(sizes, [128, 72]);
    }
}

#[test]
fn dynamic_mig_under_135_rules_separates_counters() {
    let rules = SliceRules::V1_35;
    let model = build(&dgx_h100(false), true, rules);
    assert!(model.notes.is_empty(), "{:?}", model.notes);
    let slices = split(&model, &rules.limits());
    check(&model, &slices, rules);
    // 8 counter sets of 15 counters in one slice, then 208 devices by 64.
    let shape: Vec<(usize, usize)> = slices
        .iter()
        .map(|s| (s.counter_sets.len(), s.devices.len()))
        .collect();
    assert_eq!(shape, [(8, 0), (0, 64), (0, 64), (0, 64), (0, 16)]);
}

#[test]
fn dynamic_mig_under_134_rules_keeps_gpus_whole() {
    let rules = SliceRules::V1_34;
    let model = build(&dgx_h100(false), true, rules);
    assert!(model.notes.is_empty(), "{:?}", model.notes);
    let slices = split(&model, &rules.limits());
    check(&model, &slices, rules);
    // Two GPUs (2 x 15 shared counters <= 32) per slice.
    let shape: Vec<(usize, usize)> = slices
        .iter()
        .map(|s| (s.counter_sets.len(), s.devices.len()))
        .collect();
    assert_eq!(shape, [(2, 52), (2, 52), (2, 52), (2, 52)]);
}

#[test]
fn mixed_groups_under_134_rules() {
    let rules = SliceRules::V1_34;
    let mut inv = dgx_h100(false);
    // Two non-MIG GPUs between the MIG-capable ones.
    inv.gpus[1].info.mig = None;
    inv.gpus[2].info.mig = None;
    let model = build(&inv, true, rules);
    let slices = split(&model, &rules.limits());
    check(&model, &slices, rules);
    assert_eq!(
        slices.iter().map(|s| s.devices.len()).sum::<usize>(),
        6 * 26 + 2
    );
}

#[test]
fn three_hundred_placements_spread_over_many_slices() {
    let rules = SliceRules::V1_35;
    let mut inv = dgx_h100(false);
    inv.gpus.truncate(1);
    let info = inv.gpus[0].info.mig.as_mut().unwrap();
    info.profiles = (0..12)
        .map(|i| {
            profile(
                100 + i,
                &format!("1g.{i}gb"),
                1,
                25,
                1,
                (1, 0, 0, 0, 0),
                512,
                &(0..25).collect::<Vec<_>>(),
            )
        })
        .collect();
    let model = build(&inv, true, rules);
    assert!(model.notes.is_empty(), "{:?}", model.notes);
    let slices = split(&model, &rules.limits());
    check(&model, &slices, rules);
    let shape: Vec<usize> = slices.iter().map(|s| s.devices.len()).collect();
    assert_eq!(shape, [0, 64, 64, 64, 64, 45]);

    // Under 1.34 rules the GPU cannot be published with dynamic MIG at all.
    let model = build(&inv, true, SliceRules::V1_34);
    assert_eq!(model.devices().count(), 1);
    check(
        &model,
        &split(&model, &SliceRules::V1_34.limits()),
        SliceRules::V1_34,
    );
}

#[test]
fn taints_lower_the_device_limit_and_are_capped() {
    let rules = SliceRules::V1_34;
    let mut inv = dgx_h100(false);
    let base = inv.gpus[0].clone();
    inv.gpus = (0..100)
        .map(|i| {
            let mut g = base.clone();
            g.info.minor = i;
            g.info.uuid = format!("GPU-{i}");
            g.info.pci_bus_id = format!("0000:{i:02x}:00.0");
            g
        })
        .collect();
    let mut model = build(&inv, false, rules);
    let taint = |i: u32| Taint {
        key: format!("gpu.nvidia.com/xid{i}"),
        value: None,
        effect: TaintEffect::NoSchedule,
    };
    model.set_taints(&BTreeMap::from([(
        "gpu-5".to_owned(),
        (0..10).map(taint).collect(),
    )]));
    let slices = split(&model, &rules.limits());
    check(&model, &slices, rules);
    let sizes: Vec<usize> = slices.iter().map(|s| s.devices.len()).collect();
    assert_eq!(sizes, [64, 36]);
    let tainted = slices[0]
        .devices
        .iter()
        .find(|d| d.name == "gpu-5")
        .unwrap();
    assert_eq!(tainted.taints.len(), 4);
    assert_eq!(tainted.taints[0].key, "gpu.nvidia.com/xid0");
}

#[test]
fn no_gpus_make_one_empty_slice() {
    let model = build(&inventory(vec![]), true, SliceRules::V1_35);
    let slices = split(&model, &SliceRules::V1_35.limits());
    assert_eq!(slices, [SliceContent::default()]);
}

#[test]
fn splitting_is_deterministic() {
    let rules = SliceRules::V1_35;
    let a = split(&build(&dgx_h100(false), true, rules), &rules.limits());
    let b = split(&build(&dgx_h100(false), true, rules), &rules.limits());
    assert_eq!(a, b);
}
