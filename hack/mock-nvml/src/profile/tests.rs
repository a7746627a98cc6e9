use super::*;
use crate::fixture::{BUNDLED_PROFILES, bundled_profile};

/// Two A100s joined by one NVLink, MIG on for the first; every test below
/// breaks it in one way.
const BASE: &str = r#"
driverVersion: "580.95.05"
cudaDriverVersion: 13000
gpus:
  - model: A100-SXM4-80GB
    uuid: GPU-11111111-2222-3333-4444-555555555555
    pciBusId: "0000:18:00.0"
    minor: 0
    numaNode: 0
    pcieRoot: pci0000:10
    mig:
      current: true
      devices:
        - {profile: 3g.40gb, placement: 4}
    nvlinks:
      - {link: 0, remote: "0000:19:00.0"}
  - model: A100-SXM4-80GB
    uuid: GPU-11111111-2222-3333-4444-666666666666
    pciBusId: "0000:19:00.0"
    minor: 1
    numaNode: 0
    pcieRoot: pci0000:10
    nvlinks:
      - {link: 0, remote: "0000:18:00.0"}
"#;

fn parse(yaml: &str) -> Profile {
    Profile::parse(yaml).unwrap_or_else(|e| panic!("{e}"))
}

fn error(yaml: &str) -> String {
    match Profile::parse(yaml) {
        Ok(_) => panic!("accepted:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

/// BASE with `from` replaced by `to` (which must occur).
fn edit(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "{from:?} not in BASE");
    BASE.replacen(from, to, 1)
}

#[track_caller]
fn assert_error(yaml: &str, expected: &[&str]) {
    let message = error(yaml);
    for part in expected {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
}

#[test]
fn base_profile_is_valid() {
    let p = parse(BASE);
    assert_eq!(p.gpus.len(), 2);
    assert_eq!(p.nvml_version, "13.580.95.05");
    let gi = &p.gpus[0].mig.gpu_instances[0];
    assert_eq!((gi.profile_id, gi.start, gi.size), (9, 4, 4));
    assert_eq!(gi.compute_instances.len(), 1, "a full CI by default");
    assert!(crate::ids::is_mig_uuid(&gi.compute_instances[0].uuid));
    assert!(!p.gpus[1].mig_current);
}

#[test]
fn bundled_profiles_are_valid() {
    for name in BUNDLED_PROFILES {
        let p = Profile::load(&bundled_profile(name)).unwrap_or_else(|e| panic!("{e}"));
        assert!(!p.gpus.is_empty(), "{name}");
    }
}

#[test]
fn dgx_a100_has_the_documented_mig_layout() {
    let p = Profile::load(&bundled_profile("dgx-a100")).unwrap();
    let layout: Vec<Vec<(u32, u32, usize)>> = p
        .gpus
        .iter()
        .map(|g| {
            g.mig
                .gpu_instances
                .iter()
                .map(|gi| (gi.profile_id, gi.start, gi.compute_instances.len()))
                .collect()
        })
        .collect();
    assert_eq!(layout[0], [(5, 0, 1), (9, 4, 1)]);
    assert_eq!(layout[1].len(), 7);
    assert!(layout[1].iter().all(|(id, _, cis)| *id == 19 && *cis == 1));
    // 2g.20gb at 0, 1g.20gb at 2 without CI, 3g.40gb at 4 with two CIs
    let mut gpu2 = layout[2].clone();
    gpu2.sort_by_key(|(_, start, _)| *start);
    assert_eq!(gpu2, [(14, 0, 1), (15, 2, 0), (9, 4, 2)]);
    assert!(layout[3].is_empty() && p.gpus[3].mig_current);
    assert!(
        p.gpus[4..]
            .iter()
            .all(|g| !g.mig_current && g.mig.gpu_instances.is_empty())
    );
    assert!(p.gpus.iter().all(|g| g.nvlinks.len() == 12));
    let uuids: HashSet<&str> = p
        .gpus
        .iter()
        .flat_map(|g| g.mig.mig_devices().map(|(_, c)| c.uuid.as_str()))
        .collect();
    assert_eq!(uuids.len(), 2 + 7 + 1 + 2, "MIG UUIDs are distinct");
}

#[test]
fn overrides_replace_table_values() {
    let yaml = edit(
        "    minor: 1\n",
        "    minor: 1\n    overrides: {name: \"NVIDIA A100 Custom\", brand: Tesla, memoryMib: 1024}\n",
    );
    let p = parse(&yaml);
    assert_eq!(p.gpus[1].model.name, "NVIDIA A100 Custom");
    assert_eq!(p.gpus[1].model.memory_mib, 1024);
    assert_eq!(
        p.gpus[1].model.brand,
        nvml_wrapper_sys::bindings::nvmlBrandType_enum_NVML_BRAND_TESLA
    );
    assert_eq!(p.gpus[0].model.memory_mib, 81920);
}

#[test]
fn syntax_errors_name_the_place() {
    assert_error("gpus: [", &["profile <inline>", "line"]);
    assert_error("", &["missing field"]);
    assert_error("- 1\n- 2\n", &["invalid type"]);
    assert_error(
        &edit("minor: 0", "minor: zero"),
        &["invalid type", "line 8"],
    );
    assert_error(
        &edit("minor: 0", "minor: -1"),
        &["gpus[0].minor", "`-1`", "line 8"],
    );
    assert_error(
        &edit("minor: 0", "minor: 99999999999"),
        &["gpus[0].minor", "99999999999"],
    );
}

#[test]
fn unknown_and_missing_fields_are_errors() {
    assert_error(&format!("{BASE}gpuz: []\n"), &["unknown field `gpuz`"]);
    assert_error(
        &edit("numaNode: 0", "numa_node: 0"),
        &["unknown field `numa_node`"],
    );
    assert_error(
        &edit("    uuid: GPU-11111111-2222-3333-4444-555555555555\n", ""),
        &["missing field `uuid`"],
    );
    assert_error(
        &edit("current: true", "current: true\n      extra: 1"),
        &["unknown field `extra`"],
    );
    assert_error(
        &edit("placement: 4}", "placement: 4, size: 4}"),
        &["unknown field `size`"],
    );
}

#[test]
fn duplicate_identities_are_errors() {
    assert_error(
        &edit(
            "GPU-11111111-2222-3333-4444-666666666666",
            "GPU-11111111-2222-3333-4444-555555555555",
        ),
        &[
            "gpus[1]",
            "uuid GPU-11111111-2222-3333-4444-555555555555 is used by another GPU",
        ],
    );
    // the same address written another way
    let yaml = edit(
        "pciBusId: \"0000:19:00.0\"",
        "pciBusId: \"00000000:18:00.0\"",
    );
    assert_error(
        &yaml,
        &["gpus[1]: pciBusId 0000:18:00.0 is also the address of gpus[0]"],
    );
    assert_error(
        &edit("minor: 1", "minor: 0"),
        &["gpus[1]: minor 0 is also the minor of gpus[0]"],
    );
}

#[test]
fn malformed_identities_are_errors() {
    assert_error(
        &edit("GPU-11111111-2222-3333-4444-555555555555", "GPU-1"),
        &["gpus[0] (GPU-1)", "uuid \"GPU-1\""],
    );
    assert_error(
        &edit("\"0000:18:00.0\"\n", "\"0000:18:00\"\n"),
        &["pciBusId \"0000:18:00\""],
    );
    assert_error(
        &edit(
            "pcieRoot: pci0000:10\n    mig",
            "pcieRoot: 0000:10\n    mig",
        ),
        &["pcieRoot \"0000:10\""],
    );
    assert_error(
        &edit(
            "pcieRoot: pci0000:10\n    mig",
            "pcieRoot: pci0001:10\n    mig",
        ),
        &["pcieRoot pci0001:10 is in PCI domain 0001"],
    );
    assert_error(
        &edit("minor: 0", "minor: 255"),
        &["minor 255 must be below 255"],
    );
    assert_error(&edit("numaNode: 0", "numaNode: -2"), &["numaNode -2"]);
    assert_error(
        &edit("\"580.95.05\"", "\"latest\""),
        &["driverVersion \"latest\""],
    );
    assert_error(&edit("13000", "13"), &["cudaDriverVersion 13"]);
    assert_error(
        &edit("model: A100-SXM4-80GB", "model: H200"),
        &[
            "model \"H200\" is not in the hardware table",
            "H100-SXM5-80GB",
        ],
    );
    assert_error(
        &edit(
            "    minor: 1\n",
            "    minor: 1\n    pciBridges: [\"0000:18:00.0\"]\n",
        ),
        &["pciBridges[0]: 0000:18:00.0 is the address of a GPU"],
    );
}

#[test]
fn nvlink_errors() {
    assert_error(
        &edit("remote: \"0000:19:00.0\"", "remote: \"0000:99:00.0\""),
        &[
            "gpus[0]",
            "remote 0000:99:00.0 is neither a GPU of the profile nor an NVSwitch",
        ],
    );
    assert_error(
        &edit(
            "      - {link: 0, remote: \"0000:18:00.0\"}\n",
            "      - {link: 1, remote: \"0000:18:00.0\"}\n      - {link: 2, remote: \"0000:18:00.0\"}\n",
        ),
        &["gpus[0] has 1 NVLink(s) to gpus[1]", "gpus[1] has 2 back"],
    );
    assert_error(
        &edit(
            "{link: 0, remote: \"0000:19:00.0\"}",
            "{link: 12, remote: \"0000:19:00.0\"}",
        ),
        &["link 12 does not exist", "links 0-11"],
    );
    assert_error(
        &edit(
            "{link: 0, remote: \"0000:19:00.0\"}",
            "{link: 0, remote: \"0000:18:00.0\"}",
        ),
        &["points at the GPU itself"],
    );
    let t4 = edit(
        "model: A100-SXM4-80GB\n    uuid: GPU-11111111-2222-3333-4444-666666666666",
        "model: T4\n    uuid: GPU-11111111-2222-3333-4444-666666666666",
    );
    assert_error(&t4, &["gpus[1]", "T4 has no NVLink"]);
}

#[test]
fn mig_errors() {
    assert_error(
        &edit(
            "- {profile: 3g.40gb, placement: 4}",
            "- {profile: 3g.40gb, placement: 4}\n        - {profile: 2g.20gb, placement: 4}",
        ),
        &["mig.devices[1]: 2g.20gb at placement 4 overlaps GPU instance 2 (3g.40gb at 4:4)"],
    );
    assert_error(
        &edit("current: true", "current: false"),
        &["MIG devices exist only while MIG mode is current"],
    );
    assert_error(
        &edit("profile: 3g.40gb", "profile: 3g.20gb"),
        &["profile \"3g.20gb\" is not one of", "1g.10gb+me"],
    );
    assert_error(
        &edit("placement: 4}", "placement: 3}"),
        &["placement 3 is not a placement of 3g.40gb (allowed: [0, 4])"],
    );
    assert_error(
        &edit(
            "- {profile: 3g.40gb, placement: 4}",
            "- {profile: 1g.10gb+me, placement: 0}\n        - {profile: 1g.10gb+me, placement: 1}",
        ),
        &["at most 1 instance(s) of 1g.10gb+me"],
    );
    let t4 = "driverVersion: \"580.95.05\"\ncudaDriverVersion: 13000\ngpus:\n  - {model: T4, uuid: GPU-11111111-2222-3333-4444-555555555555, pciBusId: \"18:00.0\", minor: 0, numaNode: 0, pcieRoot: pci0000:10, mig: {current: false}}\n";
    assert_error(t4, &["gpus[0]", "mig: T4 is not MIG capable"]);
    assert_error(
        &edit(
            "placement: 4}",
            "placement: 4, computeInstances: [{profile: 1c.3g.40gb}, {profile: 3g.40gb}]}",
        ),
        &["computeInstances[1]", "no free placement left for 3g.40gb"],
    );
    assert_error(
        &edit(
            "placement: 4}",
            "placement: 4, computeInstances: [{profile: 5c.3g.40gb}]}",
        ),
        &[
            "computeInstances[0]: profile \"5c.3g.40gb\" is not one of 1c.3g.40gb, 2c.3g.40gb, 3g.40gb",
        ],
    );
    assert_error(
        &edit("placement: 4}", "placement: 4, uuid: MIG-x}"),
        &["uuid \"MIG-x\" is not like MIG-"],
    );
    assert_error(
        &edit(
            "placement: 4}",
            "placement: 4, uuid: MIG-ea8d189c-bcdb-519a-a97e-8a2e7848bc1c, computeInstances: []}",
        ),
        &["uuid belongs on each of computeInstances"],
    );
    let same = "{profile: 1g.10gb, placement: 0, uuid: MIG-ea8d189c-bcdb-519a-a97e-8a2e7848bc1c}";
    assert_error(
        &edit(
            "- {profile: 3g.40gb, placement: 4}",
            &format!(
                "- {same}\n        - {}",
                same.replace("placement: 0", "placement: 1")
            ),
        ),
        &["uuid MIG-ea8d189c-bcdb-519a-a97e-8a2e7848bc1c is used twice"],
    );
}

#[test]
fn failure_injection_is_checked() {
    let ok = edit(
        "    minor: 1\n",
        "    minor: 1\n    fail: {nvmlDeviceGetMemoryInfo: UNKNOWN, nvmlDeviceGetUUID: NVML_ERROR_GPU_IS_LOST}\n",
    );
    let p = parse(&ok);
    assert_eq!(
        p.gpus[1].fail.get("nvmlDeviceGetMemoryInfo"),
        Some(&codes::UNKNOWN)
    );
    assert_eq!(p.gpus[1].fail.get("nvmlDeviceGetUUID"), Some(&15));
    assert_error(
        &edit(
            "    minor: 1\n",
            "    minor: 1\n    fail: {nvmlDeviceGetFanSpeed: UNKNOWN}\n",
        ),
        &[
            "gpus[1]",
            "fail: \"nvmlDeviceGetFanSpeed\" is not a function of the fake library",
        ],
    );
    assert_error(
        &edit(
            "    minor: 1\n",
            "    minor: 1\n    fail: {nvmlDeviceGetUUID: BROKEN}\n",
        ),
        &["\"BROKEN\" is not an NVML error code", "GPU_IS_LOST"],
    );
    assert_error(
        &edit(
            "    minor: 1\n",
            "    minor: 1\n    fail: {nvmlDeviceGetUUID: SUCCESS}\n",
        ),
        &["\"SUCCESS\" is not an NVML error code"],
    );
    assert_error(
        &format!("{BASE}fail: {{nvmlErrorString: UNKNOWN}}\n"),
        &["\"nvmlErrorString\" is not a function"],
    );
}

#[test]
fn override_errors() {
    assert_error(
        &edit(
            "    minor: 1\n",
            "    minor: 1\n    overrides: {brand: Acme}\n",
        ),
        &["overrides.brand \"Acme\""],
    );
    assert_error(
        &edit(
            "    minor: 1\n",
            "    minor: 1\n    overrides: {memoryMib: 0}\n",
        ),
        &["overrides.memoryMib must be positive"],
    );
    let bad_table = "    overrides:\n      migTable:\n        memorySlices: 8\n        computeSlices: 7\n        maxDevices: 7\n        modeChangeNeedsReset: false\n        profiles:\n          - {name: 1g.1gb, nvmlProfile: 0, id: 19, computeSlices: 1, instanceCount: 9, multiprocessors: 1, copyEngines: 1, decoders: 0, encoders: 0, jpegEngines: 0, ofaEngines: 0, memoryMib: 1, placements: [0, 1], placementSize: 1}\n";
    assert_error(
        &edit("    minor: 1\n", &format!("    minor: 1\n{bad_table}")),
        &[
            "overrides.migTable: profile 1g.1gb: instanceCount must be 1 to the number of placements",
        ],
    );
}

#[test]
fn hostile_documents_fail_fast() {
    // an alias bomb must not expand into gigabytes
    let mut lines = vec!["a0: &a0 [x, x, x, x, x, x, x, x, x, x]".to_owned()];
    for i in 1..12 {
        let prev = i - 1;
        let refs = vec![format!("*a{prev}"); 10].join(", ");
        lines.push(format!("a{i}: &a{i} [{refs}]"));
    }
    let bomb = lines.join("\n");
    let started = std::time::Instant::now();
    assert!(Profile::parse(&bomb).is_err());
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // deep nesting
    let deep = format!("gpus: {}{}", "[".repeat(10_000), "]".repeat(10_000));
    assert!(Profile::parse(&deep).is_err());
    // more GPUs than handles can address
    let gpu = |i: usize| {
        format!(
            "  - {{model: T4, uuid: GPU-11111111-2222-3333-4444-{i:012x}, pciBusId: \"{:04x}:{:02x}:00.0\", minor: 0, numaNode: 0, pcieRoot: pci{:04x}:00}}\n",
            i / 256,
            i % 256,
            i / 256
        )
    };
    let many: String = (0..=MAX_GPUS).map(gpu).collect();
    assert_error(
        &format!("driverVersion: \"1.2\"\ncudaDriverVersion: 13000\ngpus:\n{many}"),
        &["257 GPUs, at most 256"],
    );
    // binary garbage
    assert!(Profile::parse("\u{0}\u{1}\u{2}gpus").is_err());
}

#[test]
fn unreadable_file_is_a_clear_error() {
    let err = Profile::load(Path::new("/nonexistent/mock-nvml/profile.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("cannot read profile /nonexistent/mock-nvml/profile.yaml:"),
        "{err}"
    );
}

#[test]
fn limits_are_checked_while_reading() {
    // Depth: refused where the 129th level opens, whatever follows.
    for n in [20_000, 40_000, 80_000, 100_000, 200_000] {
        let deep = format!("gpus: {}", "[".repeat(n));
        assert_eq!(
            error(&deep),
            "profile <inline>: collections nested deeper than 128 levels at line 1 column 134"
        );
    }
    // Aliases: held to the node budget.
    let mut lines = vec!["a0: &a0 [x, x, x, x, x, x, x, x, x, x]".to_owned()];
    for i in 1..12 {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        lines.push(format!("a{i}: &a{i} [{refs}]"));
    }
    let bomb = lines.join("\n");
    assert!(error(&bomb).contains("nodes (aliases expanded)"));
    // Size: a profile of exactly the limit is read, one byte more is not.
    let mut text = BASE.to_owned() + "#";
    text += &"x".repeat(MAX_PROFILE_BYTES - text.len() - 1);
    text.push('\n');
    assert_eq!(text.len(), MAX_PROFILE_BYTES);
    parse(&text);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.yaml");
    std::fs::write(&path, &text).unwrap();
    assert!(Profile::load(&path).is_ok());
    text.push('\n');
    std::fs::write(&path, &text).unwrap();
    assert_eq!(
        Profile::load(&path).unwrap_err().to_string(),
        format!(
            "profile {}: 1048577 bytes, more than the 1048576 bytes allowed",
            path.display()
        )
    );
}

#[test]
fn processes_are_read_and_checked() {
    let p = parse(&edit(
        "    minor: 1\n",
        "    minor: 1\n    processes:\n      - {pid: 4242, usedMib: 512}\n      - {pid: 4243}\n      - {pid: 4242, graphics: true}\n",
    ));
    let h = &p.gpus[1].health;
    assert_eq!(
        h.compute_processes,
        vec![
            crate::processes::Process {
                pid: 4242,
                used_mib: Some(512)
            },
            crate::processes::Process {
                pid: 4243,
                used_mib: None
            },
        ]
    );
    assert_eq!(h.graphics_processes.len(), 1);
    assert!(p.gpus[0].health.compute_processes.is_empty());

    let with = |list: &str| {
        edit(
            "    minor: 1\n",
            &format!("    minor: 1\n    processes: {list}\n"),
        )
    };
    assert_error(
        &with("[{pid: 0}]"),
        &[
            "gpus[1] (GPU-",
            "processes (compute): pid 0 is not a process",
        ],
    );
    assert_error(
        &with("[{pid: 7, graphics: true}, {pid: 7, graphics: true}]"),
        &["processes (graphics): pid 7 is listed twice"],
    );
    assert_error(&with("[{pid: -1}]"), &["pid"]);
    assert_error(&with("[{pid: 4294967296}]"), &["pid"]);
    assert_error(
        &with("[{pid: 7, usedMib: 18446744073709551615}]"),
        &["pid 7: 18446744073709551615 MiB is out of range"],
    );
    assert_error(&with("[{pid: 7, user: root}]"), &["unknown field `user`"]);
    let many: Vec<String> = (1..=65).map(|pid| format!("{{pid: {pid}}}")).collect();
    assert_error(
        &with(&format!("[{}]", many.join(", "))),
        &["65 processes, at most 64"],
    );
}
