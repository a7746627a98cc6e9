use super::fixtures::*;
use super::*;
use gpu_dra_api::schema::{AttributeValue, Presence, SCHEMA, Section, ValueType};
use gpu_nvml::{ComputeSlices, MigDevice, MigPlacement};

#[test]
fn static_full_gpus_carry_every_attribute() {
    let inv = inventory(vec![
        gpu(0, HOPPER, None, &[]),
        gpu(1, HOPPER, Some(mig_info(false, vec![])), &[]),
    ]);
    let model = DeviceModel::build(&inv, &BuildOptions::default());
    assert!(model.notes.is_empty(), "{:?}", model.notes);
    let names: Vec<&str> = model.devices().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-0", "gpu-1"]);
    let d = model.device("gpu-1").unwrap();
    assert_eq!(attr(d, "type"), Some(&s("gpu")));
    assert_eq!(
        attr(d, "uuid"),
        Some(&s("GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"))
    );
    assert_eq!(attr(d, "index"), Some(&AttributeValue::Int(1)));
    assert_eq!(
        attr(d, "driverVersion"),
        Some(&AttributeValue::Version("580.95.5".into()))
    );
    assert_eq!(
        attr(d, "cudaDriverVersion"),
        Some(&AttributeValue::Version("13.0.0".into()))
    );
    assert_eq!(
        attr(d, "cudaComputeCapability"),
        Some(&AttributeValue::Version("9.0.0".into()))
    );
    assert_eq!(
        attr(d, "resource.kubernetes.io/pciBusID"),
        Some(&s("0000:02:00.0"))
    );
    assert_eq!(
        attr(d, "resource.kubernetes.io/pcieRoot"),
        Some(&s("pci0000:10"))
    );
    assert_eq!(
        attr(d, "resource.kubernetes.io/numaNode"),
        Some(&AttributeValue::Int(0))
    );
    assert_eq!(attr(d, "nvlinkCount"), Some(&AttributeValue::Int(0)));
    assert!(attr(d, "addressingMode").is_none());
    assert_eq!(d.attributes.capacity["memory"], 81_559 << 20);
    assert!(d.consumes.is_none());
    assert!(model.groups.iter().all(|g| g.counter_set.is_none()));
}

#[test]
fn static_mig_publishes_existing_devices_and_no_full_gpu() {
    let devices = vec![
        MigDevice {
            uuid: "MIG-11111111-2222-3333-4444-555555555555".into(),
            profile_id: 9,
            gpu_instance_id: 1,
            compute_instance_id: 0,
            placement: MigPlacement { start: 4, size: 4 },
            memory_bytes: 40_000 << 20,
            compute_slices: None,
        },
        MigDevice {
            uuid: "MIG-66666666-2222-3333-4444-555555555555".into(),
            profile_id: 20,
            gpu_instance_id: 2,
            compute_instance_id: 0,
            placement: MigPlacement { start: 0, size: 1 },
            memory_bytes: 9_000 << 20,
            compute_slices: None,
        },
    ];
    let inv = inventory(vec![gpu(3, HOPPER, Some(mig_info(true, devices)), &[])]);
    let model = DeviceModel::build(&inv, &BuildOptions::default());
    assert!(model.notes.is_empty(), "{:?}", model.notes);
    let names: Vec<&str> = model.devices().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-3-mig-3g40gb-9-4", "gpu-3-mig-1g10gb-me-20-0"]);
    let d = model.device("gpu-3-mig-3g40gb-9-4").unwrap();
    assert_eq!(d.kind, DeviceKind::MigStatic);
    assert_eq!(attr(d, "type"), Some(&s("mig")));
    assert_eq!(
        attr(d, "uuid"),
        Some(&s("MIG-11111111-2222-3333-4444-555555555555"))
    );
    assert_eq!(
        attr(d, "parentUUID"),
        Some(&s("GPU-00000003-aaaa-bbbb-cccc-dddddddddddd"))
    );
    assert_eq!(attr(d, "profile"), Some(&s("3g.40gb")));
    assert_eq!(attr(d, "productName"), Some(&s("NVIDIA H100 80GB HBM3")));
    assert!(attr(d, "nvlinkDomain").is_none());
    let cap = &d.attributes.capacity;
    assert_eq!(
        (
            cap["multiprocessors"],
            cap["copyEngines"],
            cap["decoders"],
            cap["jpegEngines"],
            cap["memory"]
        ),
        (60, 3, 3, 3, 40_000 << 20)
    );
    assert_eq!(
        d.location,
        DeviceRef::Mig {
            parent_minor: 3,
            profile_id: 9,
            placement_start: 4
        }
    );
}

#[test]
fn static_mig_skips_unknown_profiles_and_duplicate_placements() {
    // Each its own GPU instance (ids as NVML would hand them out).
    let dev = |uuid: &str, profile_id, start: u32, gpu_instance_id| MigDevice {
        uuid: uuid.into(),
        profile_id,
        gpu_instance_id,
        compute_instance_id: 0,
        placement: MigPlacement { start, size: 1 },
        memory_bytes: 1 << 30,
        compute_slices: None,
    };
    let devices = vec![
        dev("MIG-a", 19, 0, 7),
        dev("MIG-b", 19, 0, 8),
        dev("MIG-c", 77, 1, 9),
        dev(&"M".repeat(65), 19, 2, 10),
    ];
    let inv = inventory(vec![gpu(0, HOPPER, Some(mig_info(true, devices)), &[])]);
    let model = DeviceModel::build(&inv, &BuildOptions::default());
    let names: Vec<&str> = model.devices().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-0-mig-1g10gb-19-0"]);
    assert_eq!(model.notes.len(), 3, "{:?}", model.notes);
    let text: Vec<String> = model.notes.iter().map(ToString::to_string).collect();
    assert!(text[0].contains("same placement"), "{}", text[0]);
    assert!(
        text[1].contains("unknown GPU instance profile id 77"),
        "{}",
        text[1]
    );
    assert!(text[2].contains("UUID"), "{}", text[2]);
}

/// A MIG device of GPU instance `gi` (3g.40gb at 4) with compute instance
/// `ci` taking `ci_slices` of the instance's 3 compute slices.
fn split_part(gi: u32, ci: u32, ci_slices: Option<u32>) -> MigDevice {
    MigDevice {
        uuid: format!("MIG-0000000{gi}-000{ci}-3333-4444-555555555555"),
        profile_id: 9,
        gpu_instance_id: gi,
        compute_instance_id: ci,
        placement: MigPlacement { start: 4, size: 4 },
        memory_bytes: 40_448 << 20,
        compute_slices: ci_slices.map(|c| ComputeSlices {
            gpu_instance: 3,
            compute_instance: c,
        }),
    }
}

#[test]
fn a_gpu_instance_split_into_compute_instances_is_not_published() {
    let whole = MigDevice {
        uuid: "MIG-whole".into(),
        profile_id: 14,
        gpu_instance_id: 3,
        compute_instance_id: 0,
        placement: MigPlacement { start: 0, size: 2 },
        memory_bytes: 20_096 << 20,
        compute_slices: Some(ComputeSlices {
            gpu_instance: 2,
            compute_instance: 2,
        }),
    };
    // With and without NVML telling the slices: two compute instances in
    // one GPU instance are never one device.
    for ci_slices in [(Some(1), Some(2)), (None, None)] {
        let devices = vec![
            whole.clone(),
            split_part(2, 0, ci_slices.0),
            split_part(2, 1, ci_slices.1),
        ];
        let inv = inventory(vec![gpu(2, HOPPER, Some(mig_info(true, devices)), &[])]);
        let model = DeviceModel::build(&inv, &BuildOptions::default());
        let names: Vec<&str> = model.devices().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["gpu-2-mig-2g20gb-14-0"], "{ci_slices:?}");
        // One note for the GPU instance, not one per compute instance.
        assert_eq!(
            model.notes,
            [Note::MigInstanceSplit {
                gpu: "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd".into(),
                minor: 2,
                gpu_instance: 2,
                compute_instances: 2,
                slices: ci_slices.0.map(|c| (c, 3)),
            }]
        );
        let text = model.notes[0].to_string();
        assert!(
            text.starts_with("GPU instance 2 on gpu-2 (GPU-00000002-")
                && text.contains("is split into 2 compute instances")
                && text.contains("recreating it with one compute instance"),
            "{text}"
        );
    }
}

#[test]
fn a_gpu_instance_whose_only_compute_instance_is_partial_is_not_published() {
    let inv = inventory(vec![gpu(
        1,
        HOPPER,
        Some(mig_info(true, vec![split_part(2, 0, Some(2))])),
        &[],
    )]);
    let model = DeviceModel::build(&inv, &BuildOptions::default());
    assert_eq!(model.devices().count(), 0);
    let [note] = &model.notes[..] else {
        panic!("{:?}", model.notes)
    };
    let text = note.to_string();
    assert!(
        text.contains("GPU instance 2 on gpu-1")
            && text.contains("taking 2 of its 3 compute slices")
            && text.contains("not published"),
        "{text}"
    );
    // A compute instance that takes all of it is the MIG device.
    let inv = inventory(vec![gpu(
        1,
        HOPPER,
        Some(mig_info(true, vec![split_part(2, 0, Some(3))])),
        &[],
    )]);
    let model = DeviceModel::build(&inv, &BuildOptions::default());
    assert!(model.notes.is_empty(), "{:?}", model.notes);
    let d = model.device("gpu-1-mig-3g40gb-9-4").unwrap();
    assert_eq!(
        attr(d, "uuid"),
        Some(&s("MIG-00000002-0000-3333-4444-555555555555"))
    );
}

#[test]
fn dynamic_mig_on_hopper_publishes_full_gpu_and_every_placement() {
    let inv = inventory(vec![gpu(0, HOPPER, Some(mig_info(false, vec![])), &[])]);
    let model = DeviceModel::build(&inv, &dynamic());
    assert!(model.notes.is_empty(), "{:?}", model.notes);
    let group = &model.groups[0];
    assert_eq!(group.devices.len(), 1 + 25);
    assert_eq!(group.devices[0].name, "gpu-0");
    let set = group.counter_set.as_ref().unwrap();
    assert_eq!(set.name, "gpu-0-counter-set");
    assert_eq!(set.counters.len(), 7 + 8);
    for i in 0..8 {
        assert_eq!(set.counters[&format!("memory-slice-{i}")], 1);
    }
    // Totals: max over profiles of amount x instances.
    assert_eq!(set.counters["multiprocessors"], 132);
    assert_eq!(set.counters["copy-engines"], 8);
    assert_eq!(set.counters["ofa-engines"], 1);
    assert_eq!(set.counters["encoders"], 0);
    assert_eq!(set.counters["memory"], 81_559 << 20);

    // The full GPU consumes every non-zero counter.
    let full = &group.devices[0].consumes.as_ref().unwrap().counters;
    let nonzero: BTreeMap<_, _> = set
        .counters
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    assert_eq!(full, &nonzero);

    let d = model.device("gpu-0-mig-1g20gb-15-6").unwrap();
    assert_eq!(d.kind, DeviceKind::MigDynamic);
    assert!(attr(d, "uuid").is_none());
    assert_eq!(attr(d, "profile"), Some(&s("1g.20gb")));
    let c = &d.consumes.as_ref().unwrap();
    assert_eq!(c.counter_set, "gpu-0-counter-set");
    assert_eq!(c.counters["memory-slice-6"], 1);
    assert_eq!(c.counters["memory-slice-7"], 1);
    assert_eq!(c.counters.len(), 5 + 2, "{:?}", c.counters);
    assert!(model.device("gpu-0-mig-1g10gb-me-20-6").is_some());
    assert!(model.device("gpu-0-mig-7g80gb-0-0").is_some());
}

/// Counters only allow two placements together when NVML would: no shared
/// memory slice, and at most one `+me` instance.
#[test]
fn dynamic_counters_exclude_exactly_the_conflicting_pairs() {
    let inv = inventory(vec![gpu(0, HOPPER, Some(mig_info(false, vec![])), &[])]);
    let model = DeviceModel::build(&inv, &dynamic());
    let group = &model.groups[0];
    let set = &group.counter_set.as_ref().unwrap().counters;
    let fits = |a: &Device, b: &Device| {
        let (ca, cb) = (
            &a.consumes.as_ref().unwrap().counters,
            &b.consumes.as_ref().unwrap().counters,
        );
        set.iter()
            .all(|(k, total)| ca.get(k).unwrap_or(&0) + cb.get(k).unwrap_or(&0) <= *total)
    };
    let span = |d: &Device| -> (u32, u32, bool) {
        let DeviceRef::Mig {
            profile_id,
            placement_start,
            ..
        } = d.location
        else {
            panic!("not a MIG device")
        };
        let p = h100_profiles()
            .into_iter()
            .find(|p| p.id == profile_id)
            .unwrap();
        let size = p.placements[0].size;
        (
            placement_start,
            placement_start + size,
            p.name.ends_with("+me"),
        )
    };
    let migs: Vec<&Device> = group
        .devices
        .iter()
        .filter(|d| d.kind == DeviceKind::MigDynamic)
        .collect();
    let mut checked = 0;
    for (i, a) in migs.iter().enumerate() {
        // The full GPU excludes every placement.
        assert!(!fits(&group.devices[0], a), "{}", a.name);
        for b in &migs[i + 1..] {
            let ((s1, e1, me1), (s2, e2, me2)) = (span(a), span(b));
            let nvml_allows = (e1 <= s2 || e2 <= s1) && !(me1 && me2);
            assert_eq!(fits(a, b), nvml_allows, "{} + {}", a.name, b.name);
            checked += 1;
        }
    }
    assert_eq!(checked, 25 * 24 / 2);
}

#[test]
fn dynamic_mig_on_ampere_keeps_the_current_mode() {
    let on = inventory(vec![gpu(0, AMPERE, Some(mig_info(true, vec![])), &[])]);
    let model = DeviceModel::build(&on, &dynamic());
    assert!(model.notes.is_empty(), "{:?}", model.notes);
    assert_eq!(model.groups[0].devices.len(), 25);
    assert!(model.device("gpu-0").is_none());
    assert!(model.groups[0].counter_set.is_some());

    let off = inventory(vec![gpu(0, AMPERE, Some(mig_info(false, vec![])), &[])]);
    let model = DeviceModel::build(&off, &dynamic());
    let names: Vec<&str> = model.devices().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-0"]);
    assert!(model.groups[0].counter_set.is_none());
    assert!(
        matches!(&model.notes[..], [Note::DynamicMigUnavailable { reason, .. }] if reason.contains("reset"))
    );
}

#[test]
fn dynamic_mig_ignores_existing_devices_and_non_mig_gpus() {
    let existing = vec![MigDevice {
        uuid: "MIG-x".into(),
        profile_id: 19,
        gpu_instance_id: 1,
        compute_instance_id: 0,
        placement: MigPlacement { start: 0, size: 1 },
        memory_bytes: 1,
        compute_slices: None,
    }];
    let inv = inventory(vec![
        gpu(0, HOPPER, Some(mig_info(true, existing)), &[]),
        gpu(1, ("Turing", (7, 5)), None, &[]),
    ]);
    let model = DeviceModel::build(&inv, &dynamic());
    assert_eq!(model.groups[0].devices.len(), 26);
    assert!(
        model.groups[0]
            .devices
            .iter()
            .all(|d| d.kind != DeviceKind::MigStatic)
    );
    assert_eq!(model.groups[1].devices.len(), 1);
    assert!(model.groups[1].counter_set.is_none());
}

#[test]
fn dynamic_mig_falls_back_when_rules_forbid_it() {
    // 30 memory slices: a counter set of 37 counters exceeds 32.
    let mut info = mig_info(false, vec![]);
    info.profiles = vec![profile(
        19,
        "1g.1gb",
        1,
        30,
        1,
        (1, 0, 0, 0, 0),
        1024,
        &(0..30).collect::<Vec<_>>(),
    )];
    let inv = inventory(vec![gpu(0, HOPPER, Some(info), &[])]);
    let model = DeviceModel::build(&inv, &dynamic());
    assert_eq!(
        model.devices().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        ["gpu-0"]
    );
    assert!(
        matches!(&model.notes[..], [Note::DynamicMigUnavailable { reason, .. }] if reason.contains("37 counters"))
    );

    // 1.34 rules: all devices of a GPU must share a slice with its counters.
    let inv = inventory(vec![gpu(0, HOPPER, Some(mig_info(false, vec![])), &[])]);
    let mut options = dynamic();
    options.group_limits.max_devices_per_group = Some(20);
    let model = DeviceModel::build(&inv, &options);
    assert_eq!(model.devices().count(), 1);
    assert!(
        model.notes[0].to_string().contains("26 devices"),
        "{}",
        model.notes[0]
    );
    options.group_limits.max_devices_per_group = None;
    options.group_limits.max_consumptions_per_group = Some(100);
    let model = DeviceModel::build(&inv, &options);
    assert_eq!(model.devices().count(), 1);
    assert!(
        model.notes[0].to_string().contains("counter consumptions"),
        "{}",
        model.notes[0]
    );

    // No placement at all.
    let mut info = mig_info(false, vec![]);
    for p in &mut info.profiles {
        p.placements.clear();
    }
    let model = DeviceModel::build(
        &inventory(vec![gpu(0, HOPPER, Some(info), &[])]),
        &dynamic(),
    );
    assert_eq!(model.devices().count(), 1);
    assert!(model.notes[0].to_string().contains("no MIG placement"));
}

#[test]
fn three_hundred_placements_are_published_under_135_rules() {
    let mut info = mig_info(false, vec![]);
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
    let inv = inventory(vec![gpu(0, HOPPER, Some(info), &[])]);
    let model = DeviceModel::build(&inv, &dynamic());
    assert!(model.notes.is_empty(), "{:?}", model.notes);
    assert_eq!(model.devices().count(), 1 + 300);
}

#[test]
fn bad_identity_skips_the_gpu() {
    let mut long_uuid = gpu(0, HOPPER, None, &[]);
    long_uuid.info.uuid = "GPU-".repeat(20);
    let mut dup_uuid = gpu(2, HOPPER, None, &[]);
    dup_uuid.info.uuid = gpu(1, HOPPER, None, &[]).info.uuid;
    let mut dup_minor = gpu(3, HOPPER, None, &[]);
    dup_minor.info.minor = 1;
    let mut empty_bus = gpu(4, HOPPER, None, &[]);
    empty_bus.info.pci_bus_id = String::new();
    let inv = inventory(vec![
        long_uuid,
        gpu(1, HOPPER, None, &[]),
        dup_uuid,
        dup_minor,
        empty_bus,
    ]);
    let model = DeviceModel::build(&inv, &BuildOptions::default());
    assert_eq!(
        model.devices().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        ["gpu-1"]
    );
    let text: Vec<String> = model.notes.iter().map(ToString::to_string).collect();
    assert_eq!(text.len(), 4, "{text:?}");
    assert!(
        text[0].starts_with("GPU index 0 not published"),
        "{}",
        text[0]
    );
    assert!(text[1].contains("same UUID"));
    assert!(text[2].contains("same minor number 1"));
    assert!(text[3].contains("PCI bus id"));
}

#[test]
fn long_descriptions_are_cut_and_unknown_topology_omitted() {
    let mut g = gpu(0, HOPPER, None, &[]);
    g.info.product_name = format!("NVIDIA {} Édition", "X".repeat(60));
    g.info.addressing_mode = Some("HMM".into());
    g.pcie_root = None;
    g.numa_node = None;
    let model = DeviceModel::build(&inventory(vec![g.clone()]), &BuildOptions::default());
    let d = model.device("gpu-0").unwrap();
    let Some(AttributeValue::String(name)) = attr(d, "productName") else {
        panic!("productName missing")
    };
    assert!(name.len() <= 64 && g.info.product_name.starts_with(name.as_str()));
    assert_eq!(attr(d, "addressingMode"), Some(&s("HMM")));
    assert!(attr(d, "resource.kubernetes.io/pcieRoot").is_none());
    assert!(attr(d, "resource.kubernetes.io/numaNode").is_none());
    assert!(model.notes.contains(&Note::PcieRootUnknown {
        gpu: g.info.uuid.clone()
    }));
    assert!(model.notes.contains(&Note::NumaNodeUnknown {
        gpu: g.info.uuid.clone()
    }));
    assert!(model.notes.iter().any(|n| matches!(
        n,
        Note::Truncated {
            attribute: "productName",
            ..
        }
    )));
}

#[test]
fn unusable_driver_version_omits_the_attribute() {
    let mut inv = inventory(vec![gpu(0, HOPPER, None, &[])]);
    inv.system.driver_version = "580.95.05.1-custom".into();
    let model = DeviceModel::build(&inv, &BuildOptions::default());
    let d = model.device("gpu-0").unwrap();
    assert!(attr(d, "driverVersion").is_none());
    assert!(attr(d, "cudaDriverVersion").is_some());
    assert_eq!(
        model.notes,
        [Note::DriverVersion {
            version: "580.95.05.1-custom".into()
        }]
    );
}

#[test]
fn zero_gpus_make_an_empty_model() {
    let model = DeviceModel::build(&inventory(vec![]), &dynamic());
    assert!(model.groups.is_empty() && model.notes.is_empty());
}

#[test]
fn pcie_bridged_pairs_get_shared_domains() {
    let inv = inventory(vec![
        gpu(0, AMPERE, None, &["0000:02:00.0"; 12]),
        gpu(1, AMPERE, None, &["0000:01:00.0"; 12]),
        gpu(2, AMPERE, None, &["0000:04:00.0"; 12]),
        gpu(3, AMPERE, None, &["0000:03:00.0"; 12]),
        gpu(4, AMPERE, None, &[]),
    ]);
    let model = DeviceModel::build(&inv, &BuildOptions::default());
    let domain = |n: &str| {
        attr(model.device(n).unwrap(), "nvlinkDomain")
            .cloned()
            .unwrap()
    };
    assert_eq!(domain("gpu-0"), domain("gpu-1"));
    assert_eq!(domain("gpu-2"), domain("gpu-3"));
    assert_ne!(domain("gpu-1"), domain("gpu-2"));
    assert_ne!(domain("gpu-4"), domain("gpu-3"));
    assert_eq!(
        attr(model.device("gpu-0").unwrap(), "nvlinkCount"),
        Some(&AttributeValue::Int(12))
    );
    assert_eq!(
        attr(model.device("gpu-4").unwrap(), "nvlinkCount"),
        Some(&AttributeValue::Int(0))
    );
    // Stable: the same inventory gives the same ids.
    assert_eq!(model, DeviceModel::build(&inv, &BuildOptions::default()));
}

/// Every published attribute is in the schema with its type, and every schema
/// entry of a kind is published when the inputs have everything.
#[test]
fn published_attributes_match_the_schema_exactly() {
    let mut full = gpu(0, HOPPER, None, &["0000:f0:00.0"]);
    full.info.addressing_mode = Some("ATS".into());
    let existing = vec![MigDevice {
        uuid: "MIG-1".into(),
        profile_id: 19,
        gpu_instance_id: 1,
        compute_instance_id: 0,
        placement: MigPlacement { start: 0, size: 1 },
        memory_bytes: 1 << 30,
        compute_slices: None,
    }];
    let mut static_mig = gpu(1, HOPPER, Some(mig_info(true, existing)), &[]);
    static_mig.info.addressing_mode = Some("ATS".into());
    let mut dyn_gpu = gpu(0, HOPPER, Some(mig_info(false, vec![])), &[]);
    dyn_gpu.info.addressing_mode = Some("ATS".into());

    let mut seen = std::collections::HashSet::new();
    for (inv, opts) in [
        // `shares` only with `--consumable-shares=<N>` (not under dynamic
        // MIG, whose placements are never shared).
        (inventory(vec![full, static_mig]), shares("2", false)),
        (inventory(vec![dyn_gpu]), dynamic()),
    ] {
        let model = DeviceModel::build(&inv, &opts);
        assert!(model.notes.is_empty(), "{:?}", model.notes);
        for d in model.devices() {
            seen.insert(d.kind);
            for (name, value) in &d.attributes.attributes {
                let e = gpu_dra_api::schema::lookup(Section::Attribute, name).unwrap();
                assert_eq!(e.value_type, value.value_type(), "{name}");
                assert!(e.carried_by(d.kind), "{name} on {}", d.kind);
            }
            for name in d.attributes.capacity.keys() {
                let e = gpu_dra_api::schema::lookup(Section::Capacity, name).unwrap();
                assert_eq!(e.value_type, ValueType::Quantity);
                assert!(e.carried_by(d.kind), "{name} on {}", d.kind);
            }
            for e in SCHEMA
                .iter()
                .filter(|e| e.carried_by(d.kind))
                .filter(|e| e.name != "shares" || opts.consumable_shares.shares().is_some())
            {
                let present = match e.section {
                    Section::Attribute => d.attributes.attributes.contains_key(e.name),
                    Section::Capacity => d.attributes.capacity.contains_key(e.name),
                };
                assert!(
                    present,
                    "{} missing on {} ({:?})",
                    e.name, d.name, e.presence
                );
            }
            assert_eq!(attr(d, "type"), Some(&s(d.kind.type_value())));
        }
    }
    assert_eq!(seen.len(), 3);
    // Conditional entries exist, so CEL validation must know which need has().
    assert!(
        SCHEMA
            .iter()
            .any(|e| matches!(e.presence, Presence::When(_)))
    );
}

#[test]
fn device_names_parse_back() {
    let inv = inventory(vec![gpu(7, HOPPER, Some(mig_info(false, vec![])), &[])]);
    let model = DeviceModel::build(&inv, &dynamic());
    for d in model.devices() {
        assert!(gpu_dra_api::schema::is_dns_label(&d.name), "{}", d.name);
        assert_eq!(DeviceRef::parse(&d.name), Some(d.location), "{}", d.name);
    }
    for bad in [
        "",
        "gpu-",
        "gpu-01",
        "gpu-x",
        "gpu-1-mig--19-0",
        "gpu-1-mig-1g10gb-19",
        "gpu-1-mig-1g10gb-19-0x",
        "cpu-1",
        "gpu-99999999999",
        "gpu-1-mig-1g10gb-019-0",
    ] {
        assert_eq!(DeviceRef::parse(bad), None, "{bad}");
    }
    assert_eq!(
        DeviceRef::parse("gpu-1-mig-1g10gb-me-20-6"),
        Some(DeviceRef::Mig {
            parent_minor: 1,
            profile_id: 20,
            placement_start: 6
        })
    );
}

#[test]
fn profile_labels_follow_nvidia() {
    assert_eq!(mig::profile_label("1g.10gb"), "1g10gb");
    assert_eq!(mig::profile_label("1g.10gb+me"), "1g10gb-me");
    assert_eq!(mig::profile_label("1g.10gb+gfx"), "1g10gb-gfx");
    assert_eq!(mig::profile_label("+.+"), "");
    assert_eq!(mig::device_name(0, "+", 1, 0), None);
    assert_eq!(mig::device_name(0, &"a".repeat(60), 1, 0), None);
}

#[test]
fn taints_are_set_by_device_name() {
    let inv = inventory(vec![gpu(0, HOPPER, None, &[]), gpu(1, HOPPER, None, &[])]);
    let mut model = DeviceModel::build(&inv, &BuildOptions::default());
    let taint = Taint {
        key: "gpu.nvidia.com/xid".into(),
        value: Some("79".into()),
        effect: TaintEffect::NoSchedule,
    };
    model.set_taints(&BTreeMap::from([("gpu-1".to_owned(), vec![taint.clone()])]));
    assert!(model.device("gpu-0").unwrap().taints.is_empty());
    assert_eq!(model.device("gpu-1").unwrap().taints, [taint]);
    let api = k8s::device(model.device("gpu-1").unwrap());
    assert_eq!(api.taints.unwrap()[0].effect, "NoSchedule");
}

#[test]
fn conversion_to_the_api() {
    let inv = inventory(vec![gpu(0, HOPPER, Some(mig_info(false, vec![])), &[])]);
    let model = DeviceModel::build(&inv, &dynamic());
    let full = k8s::device(&model.groups[0].devices[0]);
    assert_eq!(full.name, "gpu-0");
    let attrs = full.attributes.as_ref().unwrap();
    assert_eq!(attrs["type"].string.as_deref(), Some("gpu"));
    assert_eq!(attrs["driverVersion"].version.as_deref(), Some("580.95.5"));
    assert_eq!(attrs["index"].int, Some(0));
    assert_eq!(
        full.capacity.as_ref().unwrap()["memory"].value.0,
        (81_559u64 << 20).to_string()
    );
    let consumes = full.consumes_counters.as_ref().unwrap();
    assert_eq!(consumes.len(), 1);
    assert_eq!(consumes[0].counter_set, "gpu-0-counter-set");
    assert_eq!(consumes[0].counters["memory-slice-7"].value.0, "1");
    assert!(full.taints.is_none());
    let set = k8s::counter_set(model.groups[0].counter_set.as_ref().unwrap());
    assert_eq!(set.counters["multiprocessors"].value.0, "132");
}

fn sharing(value: &str, dynamic_mig: bool) -> BuildOptions {
    BuildOptions {
        dynamic_mig,
        memory_sharing: value.parse().unwrap(),
        ..BuildOptions::default()
    }
}

#[test]
fn shared_gpus_are_published_whole_and_multi_allocatable() {
    let inv = dgx_h100(false);
    // GPU 1 by index, GPU 5 by UUID (any case); dynamic MIG for the rest.
    let options = sharing("1, gpu-00000005-AAAA-bbbb-cccc-dddddddddddd", true);
    let model = DeviceModel::build(&inv, &options);
    assert!(model.notes.is_empty(), "{:?}", model.notes);
    for group in &model.groups {
        let shared = matches!(group.minor, 1 | 5);
        if shared {
            // The full GPU only: no placements, no counter set.
            assert_eq!(group.devices.len(), 1, "gpu-{}", group.minor);
            assert!(group.counter_set.is_none());
            let d = &group.devices[0];
            assert_eq!(d.name, format!("gpu-{}", group.minor));
            assert!(d.consumes.is_none());
            let policy = d.memory_sharing.expect("shared").memory;
            assert_eq!(
                policy,
                MemoryRequestPolicy {
                    default_bytes: 1 << 30,
                    min_bytes: 256 << 20,
                    step_bytes: 256 << 20,
                    max_bytes: 81_408 << 20,
                }
            );
        } else {
            assert_eq!(group.devices.len(), 26, "gpu-{}", group.minor);
            assert!(group.devices.iter().all(|d| d.memory_sharing.is_none()));
        }
    }
}

#[test]
fn sharing_all_without_dynamic_mig() {
    let model = DeviceModel::build(&pcie_a100_bridged(), &sharing("all", false));
    assert!(model.notes.is_empty(), "{:?}", model.notes);
    assert_eq!(model.devices().count(), 4);
    for d in model.devices() {
        let p = d.memory_sharing.unwrap().memory;
        // 40960 MiB is a multiple of 256 MiB: all of it can be asked for.
        assert_eq!(p.max_bytes, 40_960 << 20);
        assert!(p.is_valid_for(d.attributes.capacity["memory"]));
    }
    // The default publishes nothing shared.
    let model = DeviceModel::build(&pcie_a100_bridged(), &BuildOptions::default());
    assert!(model.devices().all(|d| d.memory_sharing.is_none()));
}

#[test]
fn gpus_that_cannot_be_used_whole_are_not_shared() {
    let mig_device = MigDevice {
        uuid: "MIG-11111111-2222-3333-4444-555555555555".into(),
        profile_id: 9,
        gpu_instance_id: 2,
        compute_instance_id: 0,
        placement: MigPlacement { start: 4, size: 4 },
        memory_bytes: 40_000 << 20,
        compute_slices: None,
    };
    let mut tiny = gpu(3, HOPPER, None, &[]);
    tiny.info.memory_bytes = 1000 << 20;
    let inv = inventory(vec![
        // Static mode, MIG on: published as its MIG device.
        gpu(
            0,
            HOPPER,
            Some(mig_info(true, vec![mig_device.clone()])),
            &[],
        ),
        // Ampere, MIG on: even dynamic MIG cannot turn it off.
        gpu(1, AMPERE, Some(mig_info(true, vec![])), &[]),
        // Hopper with MIG on, dynamic MIG: can be used whole, so shared.
        gpu(2, HOPPER, Some(mig_info(true, vec![mig_device])), &[]),
        tiny,
    ]);
    let model = DeviceModel::build(&inv, &sharing("all", false));
    let reasons: Vec<String> = model.notes.iter().map(ToString::to_string).collect();
    assert_eq!(reasons.len(), 4, "{reasons:?}");
    assert!(reasons[0].contains("GPU GPU-00000000-aaaa-bbbb-cccc-dddddddddddd: published without memory sharing: MIG mode is on (with --dynamic-mig"), "{reasons:?}");
    assert!(
        reasons[3].contains("1000 MiB of memory is less than the 1024 MiB"),
        "{reasons:?}"
    );
    assert_eq!(model.device("gpu-3").unwrap().memory_sharing, None);
    assert!(model.device("gpu-0-mig-3g40gb-9-4").is_some());

    let model = DeviceModel::build(&inv, &sharing("0,1,2", true));
    let reasons: Vec<String> = model.notes.iter().map(ToString::to_string).collect();
    assert!(
        reasons.iter().any(|r| r.contains("GPU-00000001")
            && r.contains("MIG mode is on and this GPU needs a reset to turn it off")),
        "{reasons:?}"
    );
    // gpu-0 and gpu-2 (Hopper, dynamic MIG) are shared, whole, alone.
    for minor in [0, 2] {
        let group = model.groups.iter().find(|g| g.minor == minor).unwrap();
        assert_eq!(group.devices.len(), 1);
        assert!(group.devices[0].memory_sharing.is_some());
    }
    // gpu-1 keeps its placements, unshared.
    let group = model.groups.iter().find(|g| g.minor == 1).unwrap();
    assert!(group.devices.len() > 1);
    assert!(group.devices.iter().all(|d| d.memory_sharing.is_none()));
}

#[test]
fn selectors_naming_no_gpu_are_noted() {
    let inv = inventory(vec![gpu(0, HOPPER, None, &[]), gpu(1, HOPPER, None, &[])]);
    let model = DeviceModel::build(
        &inv,
        &sharing("1,7,GPU-99999999-aaaa-bbbb-cccc-dddddddddddd", false),
    );
    let notes: Vec<String> = model.notes.iter().map(ToString::to_string).collect();
    assert_eq!(
        notes,
        [
            "--memory-sharing names GPU 7, which this node does not publish",
            "--memory-sharing names GPU GPU-99999999-aaaa-bbbb-cccc-dddddddddddd, which this node does not publish",
        ]
    );
    assert!(model.device("gpu-1").unwrap().memory_sharing.is_some());
    assert!(model.device("gpu-0").unwrap().memory_sharing.is_none());
}

#[test]
fn shared_gpus_in_the_api() {
    let inv = inventory(vec![gpu(0, HOPPER, None, &[]), gpu(1, HOPPER, None, &[])]);
    let model = DeviceModel::build(&inv, &sharing("0", false));
    let shared = k8s::device(model.device("gpu-0").unwrap());
    assert_eq!(shared.allow_multiple_allocations, Some(true));
    let memory = &shared.capacity.as_ref().unwrap()["memory"];
    let policy = memory.request_policy.as_ref().unwrap();
    let q = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        k8s::quantity_nanos(&q.0).unwrap() / 1_000_000_000
    };
    assert_eq!(q(policy.default.as_ref().unwrap()), 1 << 30);
    let range = policy.valid_range.as_ref().unwrap();
    assert_eq!(q(&range.min), 256 << 20);
    assert_eq!(q(range.step.as_ref().unwrap()), 256 << 20);
    assert_eq!(q(range.max.as_ref().unwrap()), 81_408 << 20);
    assert!(policy.valid_values.is_none());
    assert_eq!(q(&memory.value), 81_559 << 20);
    // Other capacities carry no policy (the full GPU has only memory).
    assert_eq!(shared.capacity.as_ref().unwrap().len(), 1);
    let plain = k8s::device(model.device("gpu-1").unwrap());
    assert_eq!(plain.allow_multiple_allocations, None);
    assert!(
        plain.capacity.as_ref().unwrap()["memory"]
            .request_policy
            .is_none()
    );
}

fn shares(mode: &str, dynamic_mig: bool) -> BuildOptions {
    BuildOptions {
        dynamic_mig,
        consumable_shares: mode.parse().unwrap(),
        ..BuildOptions::default()
    }
}

/// NVIDIA's consumable shares: every full GPU and static MIG device is
/// multi-allocatable with NVIDIA's memory policy; `<N>` adds `shares`.
#[test]
fn consumable_shares_publish_nvidias_policies_on_gpus_and_mig_devices() {
    let mig_device = MigDevice {
        uuid: "MIG-11111111-2222-3333-4444-555555555555".into(),
        profile_id: 9,
        gpu_instance_id: 2,
        compute_instance_id: 0,
        placement: MigPlacement { start: 4, size: 4 },
        memory_bytes: 40_320 << 20,
        compute_slices: None,
    };
    let inv = inventory(vec![
        gpu(0, HOPPER, None, &[]),
        gpu(1, HOPPER, Some(mig_info(true, vec![mig_device])), &[]),
    ]);
    let value = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        k8s::quantity_nanos(&q.0).unwrap() / 1_000_000_000
    };
    for (mode, min, default, shares) in [
        ("memory", 1 << 20, None, None),
        ("unlimited", 0, Some(0), None),
        ("3", 0, Some(0), Some(3u32)),
    ] {
        let model = DeviceModel::build(&inv, &shares_options(mode));
        assert!(model.notes.is_empty(), "{mode}: {:?}", model.notes);
        let names: Vec<&str> = model.devices().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["gpu-0", "gpu-1-mig-3g40gb-9-4"], "{mode}");
        for d in model.devices() {
            let shared = d.memory_sharing.expect("shared");
            assert_eq!(shared.shares, shares, "{mode}");
            // Enforced (MPS limits) only in memory mode, only on full GPUs.
            assert_eq!(
                shared.enforced,
                mode == "memory" && d.kind == DeviceKind::Gpu,
                "{mode} {}",
                d.name
            );
            let api = k8s::device(d);
            assert_eq!(api.allow_multiple_allocations, Some(true));
            let capacity = api.capacity.as_ref().unwrap();
            let memory = &capacity["memory"];
            let policy = memory.request_policy.as_ref().unwrap();
            let range = policy.valid_range.as_ref().unwrap();
            assert_eq!(value(&range.min), min, "{mode}");
            assert_eq!(value(range.step.as_ref().unwrap()), 1 << 20, "{mode}");
            assert_eq!(
                value(range.max.as_ref().unwrap()),
                value(&memory.value),
                "{mode}"
            );
            assert_eq!(
                value(policy.default.as_ref().unwrap()),
                default.unwrap_or_else(|| value(&memory.value)),
                "{mode}"
            );
            match shares {
                Some(n) => {
                    let s = &capacity["shares"];
                    assert_eq!(value(&s.value), i128::from(n));
                    let p = s.request_policy.as_ref().unwrap();
                    assert_eq!(value(p.default.as_ref().unwrap()), 1);
                    let r = p.valid_range.as_ref().unwrap();
                    assert_eq!((value(&r.min), value(r.step.as_ref().unwrap())), (1, 1));
                    assert_eq!(value(r.max.as_ref().unwrap()), i128::from(n));
                }
                None => assert!(!capacity.contains_key("shares")),
            }
            // Every other capacity (a MIG device's SMs, engines) is taken
            // by none of the shares.
            for (name, c) in capacity {
                if name != "memory" && name != "shares" {
                    let p = c.request_policy.as_ref().unwrap();
                    assert_eq!(value(p.default.as_ref().unwrap()), 0, "{name}");
                    assert_eq!(p.valid_values.as_ref().unwrap().len(), 1, "{name}");
                    assert_eq!(value(&p.valid_values.as_ref().unwrap()[0]), 0, "{name}");
                    assert!(p.valid_range.is_none(), "{name}");
                }
            }
        }
    }
    // Disabled publishes nothing shared.
    let model = DeviceModel::build(&inv, &shares_options("disabled"));
    assert!(model.devices().all(|d| d.memory_sharing.is_none()));
    assert!(
        model
            .devices()
            .all(|d| !d.attributes.capacity.contains_key("shares"))
    );
}

fn shares_options(mode: &str) -> BuildOptions {
    shares(mode, false)
}

/// Under dynamic MIG a GPU that can be used whole is published whole and
/// shared (no placements), as memory-fraction sharing does; one that cannot
/// keeps its placements, unshared.
#[test]
fn consumable_shares_under_dynamic_mig() {
    let inv = inventory(vec![
        gpu(0, HOPPER, Some(mig_info(false, vec![])), &[]),
        gpu(1, AMPERE, Some(mig_info(true, vec![])), &[]),
    ]);
    let model = DeviceModel::build(&inv, &shares("unlimited", true));
    let g0 = model.groups.iter().find(|g| g.minor == 0).unwrap();
    assert_eq!(g0.devices.len(), 1);
    assert!(g0.counter_set.is_none());
    assert!(g0.devices[0].memory_sharing.is_some());
    let g1 = model.groups.iter().find(|g| g.minor == 1).unwrap();
    assert!(g1.devices.len() > 1);
    assert!(g1.devices.iter().all(|d| d.memory_sharing.is_none()));
}
