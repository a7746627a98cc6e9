use super::*;
use std::collections::HashSet;

#[test]
fn names_are_valid_and_unique_across_sections() {
    let mut seen = HashSet::new();
    for e in SCHEMA {
        assert!(
            is_qualified_name(e.name),
            "{} is not a qualified name",
            e.name
        );
        // Kubernetes requires attribute and capacity names to be distinct.
        assert!(seen.insert(e.name), "{} appears twice", e.name);
        assert!(!e.kinds.is_empty(), "{} is carried by no kind", e.name);
        assert!(!e.description.is_empty());
        let is_capacity = e.section == Section::Capacity;
        assert_eq!(
            is_capacity,
            e.value_type == ValueType::Quantity,
            "{}",
            e.name
        );
    }
}

#[test]
fn every_kind_fits_the_attribute_limit() {
    for kind in DeviceKind::ALL {
        let n = SCHEMA.iter().filter(|e| e.carried_by(kind)).count();
        assert!(n <= MAX_ATTRIBUTES_AND_CAPACITIES, "{kind}: {n}");
    }
}

#[test]
fn counter_names_are_dns_labels() {
    for c in COUNTERS {
        assert!(is_dns_label(c.name), "{}", c.name);
    }
    assert!(is_dns_label(&counters::memory_slice(31)));
    assert_eq!(counters::counter_set(3), "gpu-3-counter-set");
    assert!(is_dns_label(&counters::counter_set(u32::MAX)));
}

#[test]
fn nvidia_compatible_names_and_types() {
    // The contract of nvidia-compat.md: same names, same types.
    let expect = [
        ("type", ValueType::String),
        ("uuid", ValueType::String),
        ("productName", ValueType::String),
        ("brand", ValueType::String),
        ("architecture", ValueType::String),
        ("cudaComputeCapability", ValueType::Version),
        ("driverVersion", ValueType::Version),
        ("cudaDriverVersion", ValueType::Version),
        ("resource.kubernetes.io/pciBusID", ValueType::String),
        ("resource.kubernetes.io/pcieRoot", ValueType::String),
        ("resource.kubernetes.io/numaNode", ValueType::Int),
        ("addressingMode", ValueType::String),
        ("parentUUID", ValueType::String),
        ("profile", ValueType::String),
    ];
    for (name, ty) in expect {
        let e = lookup(Section::Attribute, name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(e.value_type, ty, "{name}");
        assert_eq!(e.origin, Origin::Nvidia, "{name}");
    }
    for name in [
        "memory",
        "multiprocessors",
        "copyEngines",
        "decoders",
        "encoders",
        "jpegEngines",
        "ofaEngines",
    ] {
        let e = lookup(Section::Capacity, name).unwrap_or_else(|| panic!("{name} missing"));
        assert!(e.carried_by(DeviceKind::MigStatic) && e.carried_by(DeviceKind::MigDynamic));
    }
    assert!(
        lookup(Section::Capacity, "memory")
            .unwrap()
            .carried_by(DeviceKind::Gpu)
    );
    // A dynamic MIG device has no UUID before it exists.
    assert!(
        !lookup(Section::Attribute, "uuid")
            .unwrap()
            .carried_by(DeviceKind::MigDynamic)
    );
}

#[test]
fn cel_key_splits_domains() {
    let t = lookup(Section::Attribute, names::TYPE).unwrap();
    assert_eq!(t.cel_key("gpu.nvidia.com"), ("gpu.nvidia.com", "type"));
    let r = lookup(Section::Attribute, names::PCIE_ROOT).unwrap();
    assert_eq!(r.cel_key("gpu.nvidia.com"), (STANDARD_DOMAIN, "pcieRoot"));
}

#[test]
fn nvml_versions_become_semver() {
    assert_eq!(semver_from_nvml("580.95.05").unwrap(), "580.95.5");
    assert_eq!(semver_from_nvml("580.159.04").unwrap(), "580.159.4");
    assert_eq!(semver_from_nvml("550.54").unwrap(), "550.54.0");
    assert_eq!(semver_from_nvml("7").unwrap(), "7.0.0");
    assert_eq!(semver_from_nvml("000.00.00").unwrap(), "0.0.0");
    for bad in [
        "",
        ".",
        "1..2",
        "580.95.05.1",
        "580.95.x",
        "580.95.05-beta",
        "-1.0.0",
        "99999999999999999999999.0.0",
        "５８０.1.1",
    ] {
        let err = semver_from_nvml(bad).unwrap_err();
        assert_eq!(
            err,
            SchemaError::InvalidNvmlVersion(bad.to_owned()),
            "{bad}"
        );
        assert!(err.to_string().contains("NVML version"), "{err}");
    }
    assert_eq!(semver_from_pair((13, 0)), "13.0.0");
}

#[test]
fn semver_check_is_strict() {
    for good in [
        "0.0.0",
        "1.2.3",
        "10.20.30",
        "1.0.0-alpha.1",
        "1.0.0+build.5",
        "1.0.0-0.a-b+x",
    ] {
        assert!(is_semver(good), "{good}");
    }
    for bad in [
        "1.2",
        "01.2.3",
        "1.2.3.4",
        "1.2.3-",
        "1.2.3-01",
        "1.2.3+",
        "a.b.c",
        "",
        "1.2.3-a..b",
    ] {
        assert!(!is_semver(bad), "{bad}");
    }
}

#[test]
fn fit_string_cuts_at_char_boundaries() {
    let (s, cut) = fit_string("NVIDIA H100 80GB HBM3");
    assert_eq!((s.as_str(), cut), ("NVIDIA H100 80GB HBM3", false));
    let long = "x".repeat(100);
    let (s, cut) = fit_string(&long);
    assert_eq!((s.len(), cut), (64, true));
    // 'é' is 2 bytes: 63 ASCII bytes + 'é' would end at byte 65.
    let tricky = format!("{}é", "a".repeat(63));
    let (s, cut) = fit_string(&tricky);
    assert!(cut);
    assert_eq!(s, "a".repeat(63));
    let exact = "b".repeat(64);
    assert_eq!(fit_string(&exact), (exact.clone(), false));
}

fn full_gpu() -> DeviceAttributes {
    let mut a = DeviceAttributes::new(DeviceKind::Gpu);
    a.set_string(names::UUID, "GPU-1").unwrap();
    a.set_int(names::INDEX, 0).unwrap();
    a.set_string(names::PRODUCT_NAME, "NVIDIA H100 80GB HBM3")
        .unwrap();
    a.set_string(names::BRAND, "Nvidia").unwrap();
    a.set_string(names::ARCHITECTURE, "Hopper").unwrap();
    a.set_version(names::CUDA_COMPUTE_CAPABILITY, "9.0.0")
        .unwrap();
    a.set_version(names::DRIVER_VERSION, "580.95.5").unwrap();
    a.set_version(names::CUDA_DRIVER_VERSION, "13.0.0").unwrap();
    a.set_string(names::PCI_BUS_ID, "0000:18:00.0").unwrap();
    a.set_string(names::NVLINK_DOMAIN, "abc").unwrap();
    a.set_int(names::NVLINK_COUNT, 18).unwrap();
    a.set_capacity(names::MEMORY, 80 << 30).unwrap();
    a
}

#[test]
fn builder_accepts_a_complete_gpu() {
    let checked = full_gpu().finish().unwrap();
    assert_eq!(
        checked.attributes[names::TYPE],
        AttributeValue::String("gpu".into())
    );
    assert_eq!(checked.capacity[names::MEMORY], 80 << 30);
}

#[test]
fn builder_rejects_what_the_schema_forbids() {
    let mut a = full_gpu();
    assert_eq!(
        a.set_string("color", "red").unwrap_err(),
        SchemaError::UnknownName {
            section: "attribute",
            name: "color".into()
        }
    );
    assert_eq!(
        a.set_string(names::PROFILE, "1g.10gb").unwrap_err(),
        SchemaError::WrongKind {
            name: names::PROFILE,
            kind: DeviceKind::Gpu
        }
    );
    assert_eq!(
        a.set_string(names::NUMA_NODE, "0").unwrap_err(),
        SchemaError::WrongType {
            name: names::NUMA_NODE,
            expected: ValueType::Int,
            got: ValueType::String
        }
    );
    assert!(matches!(
        a.set_string(names::PCIE_ROOT, "p".repeat(65)).unwrap_err(),
        SchemaError::TooLong {
            len: 65,
            max: 64,
            ..
        }
    ));
    assert!(matches!(
        a.set_string(names::UUID, "GPU-2").unwrap_err(),
        SchemaError::Duplicate { name: "uuid" }
    ));
    assert!(matches!(
        a.set_capacity(names::MULTIPROCESSORS, 1).unwrap_err(),
        SchemaError::WrongKind { .. }
    ));
    assert!(matches!(
        a.set_capacity(names::UUID, 1).unwrap_err(),
        SchemaError::UnknownName {
            section: "capacity",
            ..
        }
    ));
    assert!(matches!(
        a.set_string(names::TYPE, "mig").unwrap_err(),
        SchemaError::Duplicate { name: "type" }
    ));
    // Setting `type` to the kind's own value is harmless.
    a.set_string(names::TYPE, "gpu").unwrap();

    let mut b = DeviceAttributes::new(DeviceKind::MigDynamic);
    assert!(matches!(
        b.set_string(names::UUID, "MIG-1").unwrap_err(),
        SchemaError::WrongKind { .. }
    ));
    let err = b
        .set_version(names::DRIVER_VERSION, "580.95.05")
        .unwrap_err();
    assert!(matches!(err, SchemaError::InvalidVersion { .. }), "{err}");
}

#[test]
fn builder_reports_missing_always_entries() {
    let a = DeviceAttributes::new(DeviceKind::MigStatic);
    let err = a.finish().unwrap_err();
    assert!(
        matches!(
            err,
            SchemaError::Missing {
                kind: DeviceKind::MigStatic,
                ..
            }
        ),
        "{err}"
    );
    let mut g = DeviceAttributes::new(DeviceKind::Gpu);
    g.set_string(names::UUID, "GPU-1").unwrap();
    assert!(g.finish().is_err());
}

#[test]
fn markdown_table_lists_every_entry() {
    let md = markdown_table();
    for e in SCHEMA {
        assert!(md.contains(&format!("`{}`", e.name)), "{}", e.name);
    }
    assert_eq!(md.lines().count(), SCHEMA.len() + 2);
}

#[test]
fn dns_checks() {
    assert!(is_dns_label("gpu-0-mig-1g10gb-me-19-0"));
    assert!(!is_dns_label("gpu.0"));
    assert!(!is_dns_label("-a"));
    assert!(!is_dns_label(&"a".repeat(64)));
    assert!(is_dns_subdomain("gpu.nvidia.com"));
    assert!(!is_dns_subdomain("Gpu.nvidia.com"));
    assert!(!is_dns_subdomain("a..b"));
    assert!(!is_dns_subdomain("a.-b"));
    assert!(!is_dns_subdomain(""));
    // Kubernetes limits only the whole subdomain: one part may pass 63.
    assert!(is_dns_subdomain(&"a".repeat(64)));
    assert!(is_dns_subdomain(&format!(
        "{}.example.com",
        "b".repeat(200)
    )));
    assert!(is_dns_subdomain(&"a".repeat(253)));
    assert!(!is_dns_subdomain(&"a".repeat(254)));
    // A qualified name's prefix keeps its own 63-character limit.
    assert!(!is_qualified_name(&format!("{}/x", "a".repeat(64))));
    assert!(is_qualified_name(&format!("{}/x", "a".repeat(63))));
    assert!(is_qualified_name("resource.kubernetes.io/pciBusID"));
    assert!(!is_qualified_name("resource.kubernetes.io/9x"));
    assert!(!is_qualified_name(&"a".repeat(33)));
}
