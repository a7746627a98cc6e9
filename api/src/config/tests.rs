use serde_json::{Value, json};

use super::*;

/// The config [`resolve_entry`] picks, without its index.
fn resolve(
    configs: &[AllocationConfig],
    request: &str,
    driver: &str,
    device_kind: DeviceKind,
) -> Result<Option<DeviceConfig>, ConfigError> {
    Ok(resolve_entry(configs, request, driver, device_kind)?.map(|(_, config)| config))
}

const DRIVER: &str = "gpu.nvidia.com";

fn gpu(sharing: &Value) -> Value {
    json!({"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig", "sharing": sharing})
}

fn mig(sharing: &Value) -> Value {
    json!({"apiVersion": NVIDIA_API_VERSION, "kind": "MigDeviceConfig", "sharing": sharing})
}

fn q(s: &str) -> crate::quantity::Quantity {
    crate::quantity::Quantity::parse(s).unwrap()
}

/// Pinned memory limits by UUID, as `MpsConfig::pinned_memory_limits` gives them.
fn by_uuid<const N: usize>(pairs: [(&str, &str); N]) -> std::collections::BTreeMap<String, String> {
    pairs.map(|(k, v)| (k.to_owned(), v.to_owned())).into()
}

/// The error of `decode_validated`, as text.
fn error_of(v: &Value) -> String {
    decode_validated(v).expect_err(&v.to_string()).to_string()
}

// --- NVIDIA's example claim template -----------------------------------------

#[test]
fn nvidia_example_time_slicing_round_trips() {
    let params =
        gpu(&json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}));
    let config = decode_validated(&params).unwrap();
    let DeviceConfig::Gpu(gpu_config) = &config else {
        panic!("{config:?}")
    };
    assert_eq!(gpu_config.time_slice(), Some(TimeSliceInterval::Long));
    assert_eq!(gpu_config.time_slice().unwrap().as_int(), 3);
    assert!(gpu_config.mps().is_none());
    let back = serde_json::to_value(&config).unwrap();
    assert_eq!(back, params);
    assert_eq!(decode_validated(&back).unwrap(), config);
}

#[test]
fn nvidia_example_mps_round_trips() {
    let params = gpu(&json!({"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}}));
    let config = decode_validated(&params).unwrap();
    let DeviceConfig::Gpu(gpu_config) = &config else {
        panic!("{config:?}")
    };
    assert_eq!(gpu_config.time_slice(), None);
    let mps = gpu_config.mps().unwrap();
    assert_eq!(mps.default_active_thread_percentage, Some(50));
    assert_eq!(mps.default_pinned_device_memory_limit, Some(q("10Gi")));
    assert_eq!(
        mps.pinned_memory_limits(&["GPU-a", "GPU-b"]).unwrap(),
        by_uuid([("GPU-a", "10240M"), ("GPU-b", "10240M")])
    );
    let back = serde_json::to_value(&config).unwrap();
    assert_eq!(back, params);
    assert_eq!(decode_validated(&back).unwrap(), config);
}

#[test]
fn quantities_with_surrounding_spaces_decode_as_in_kubernetes() {
    let text = br#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{
        "strategy":"MPS","mpsConfig":{"defaultPinnedDeviceMemoryLimit":" 10Gi ",
        "defaultPerDevicePinnedMemoryLimit":{"0":"2Gi  "}}}}"#;
    for config in [
        decode_bytes_validated(text).unwrap(),
        decode_validated(&serde_json::from_slice(text).unwrap()).unwrap(),
    ] {
        let DeviceConfig::Gpu(gpu_config) = &config else {
            panic!("{config:?}")
        };
        let mps = gpu_config.mps().unwrap();
        assert_eq!(mps.default_pinned_device_memory_limit, Some(q("10Gi")));
        assert_eq!(
            mps.pinned_memory_limits(&["GPU-a", "GPU-b"]).unwrap(),
            by_uuid([("GPU-a", "2048M"), ("GPU-b", "10240M")])
        );
    }
}

#[test]
fn the_same_config_decodes_from_bytes_and_from_a_value() {
    let text = br#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig",
                    "sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":10}}}"#;
    let from_bytes = decode_bytes_validated(text).unwrap();
    let from_value = decode_validated(&serde_json::from_slice(text).unwrap()).unwrap();
    assert_eq!(from_bytes, from_value);
    assert_eq!(from_bytes.device_kind(), DeviceKind::Mig);
}

// --- defaults -----------------------------------------------------------------

#[test]
fn normalize_fills_nvidia_defaults() {
    let cases = [
        (
            json!({"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig"}),
            Some(TimeSliceInterval::Default),
            false,
        ),
        (
            gpu(&json!({"strategy": "TimeSlicing"})),
            Some(TimeSliceInterval::Default),
            false,
        ),
        (
            gpu(&json!({"strategy": "TimeSlicing", "timeSlicingConfig": {}})),
            Some(TimeSliceInterval::Default),
            false,
        ),
        (gpu(&json!({"strategy": "MPS"})), None, true),
    ];
    for (params, slice, mps) in cases {
        let DeviceConfig::Gpu(config) = decode_validated(&params).unwrap() else {
            panic!()
        };
        assert_eq!(config.time_slice(), slice, "{params}");
        assert_eq!(config.mps() == Some(&MpsConfig::default()), mps, "{params}");
    }
    assert_eq!(
        DeviceConfig::default_for(DeviceKind::Gpu),
        decode_validated(&json!({"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig"})).unwrap()
    );

    let DeviceConfig::Mig(config) =
        decode_validated(&json!({"apiVersion": NVIDIA_API_VERSION, "kind": "MigDeviceConfig"}))
            .unwrap()
    else {
        panic!()
    };
    assert_eq!(
        config.sharing, None,
        "a MIG device is not shared by default"
    );
    let DeviceConfig::Mig(config) = decode_validated(&mig(&json!({"strategy": "MPS"}))).unwrap()
    else {
        panic!()
    };
    assert_eq!(config.mps(), Some(&MpsConfig::default()));
    // time-slicing is accepted on MIG devices and does nothing
    let DeviceConfig::Mig(config) =
        decode_validated(&mig(&json!({"strategy": "TimeSlicing"}))).unwrap()
    else {
        panic!()
    };
    assert_eq!(config.mps(), None);
}

#[test]
fn intervals_map_to_nvidia_smi_values() {
    for (name, value) in [("Default", 0), ("Short", 1), ("Medium", 2), ("Long", 3)] {
        let params =
            gpu(&json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": name}}));
        let DeviceConfig::Gpu(config) = decode_validated(&params).unwrap() else {
            panic!()
        };
        assert_eq!(config.time_slice().unwrap().as_int(), value, "{name}");
    }
}

// --- validation -----------------------------------------------------------------

#[test]
fn every_validation_rule_names_its_field() {
    let mps = |c: Value| gpu(&json!({"strategy": "MPS", "mpsConfig": c}));
    let cases = [
        (
            mps(json!({"defaultActiveThreadPercentage": 150})),
            "sharing.mpsConfig.defaultActiveThreadPercentage: must be between 0 and 100, got 150",
        ),
        (
            mps(json!({"defaultActiveThreadPercentage": -1})),
            "sharing.mpsConfig.defaultActiveThreadPercentage: must be between 0 and 100, got -1",
        ),
        (
            mps(json!({"defaultPinnedDeviceMemoryLimit": "512Ki"})),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be at least 1Mi, got 512Ki",
        ),
        (
            mps(json!({"defaultPinnedDeviceMemoryLimit": "0"})),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be at least 1Mi, got 0",
        ),
        (
            mps(json!({"defaultPinnedDeviceMemoryLimit": "-1Gi"})),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be at least 1Mi, got -1Gi",
        ),
        (
            mps(json!({"defaultPinnedDeviceMemoryLimit": "8Ei"})),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be less than 8Ei, got 8Ei",
        ),
        (
            mps(json!({"defaultPerDevicePinnedMemoryLimit": {"0": "1Ki"}})),
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[\"0\"]: must be at least 1Mi, got 1Ki",
        ),
        (
            gpu(&json!({"strategy": "TimeSlicing", "mpsConfig": {}})),
            "sharing.mpsConfig: only allowed with strategy MPS, the strategy is TimeSlicing",
        ),
        (
            gpu(&json!({"strategy": "MPS", "timeSlicingConfig": {"interval": "Short"}})),
            "sharing.timeSlicingConfig: only allowed with strategy TimeSlicing, the strategy is MPS",
        ),
        (
            mig(&json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}})),
            "sharing.mpsConfig.defaultActiveThreadPercentage: must be between 0 and 100, got 101",
        ),
    ];
    for (params, expected) in cases {
        assert_eq!(error_of(&params), expected, "{params}");
    }
    // boundaries are accepted
    for p in [0, 100] {
        decode_validated(&mps(json!({"defaultActiveThreadPercentage": p}))).unwrap();
    }
    for limit in ["1Mi", "1048576", "7Ei", "9223372036854775807", "1.5Mi"] {
        decode_validated(&mps(json!({"defaultPinnedDeviceMemoryLimit": limit}))).unwrap();
    }
}

#[test]
fn an_mps_block_next_to_time_slicing_is_ignored_on_mig_but_refused_on_a_gpu() {
    // NVIDIA: MigDeviceSharing.Validate returns nil for TimeSlicing without
    // looking at mpsConfig, and prepare never reads it; a GpuConfig fails at
    // prepare (GetTimeSlicingConfig: "cannot use MpsConfig with the
    // 'TimeSlicing' strategy").
    let ignored = json!({"defaultActiveThreadPercentage": 101,
        "defaultPinnedDeviceMemoryLimit": "1k",
        "defaultPerDevicePinnedMemoryLimit": {"nope": "1Gi"}});
    for mps in [json!({}), ignored] {
        let params = mig(&json!({"strategy": "TimeSlicing", "mpsConfig": mps}));
        let DeviceConfig::Mig(config) =
            decode_validated(&params).unwrap_or_else(|e| panic!("{params}: {e}"))
        else {
            panic!("{params}")
        };
        assert_eq!(config.mps(), None, "{params}");
    }
    // still strictly decoded: a typo or a malformed quantity is an error
    assert!(
        error_of(&mig(
            &json!({"strategy": "TimeSlicing", "mpsConfig": {"defaultActiveThreadPercent": 1}})
        ))
        .contains("defaultActiveThreadPercent"),
    );
    assert!(
        decode_validated(&mig(&json!({"strategy": "TimeSlicing",
        "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}})))
        .is_err()
    );
    assert_eq!(
        error_of(&gpu(&json!({"strategy": "TimeSlicing", "mpsConfig": {}}))),
        "sharing.mpsConfig: only allowed with strategy MPS, the strategy is TimeSlicing"
    );
}

#[test]
fn all_invalid_fields_are_reported_together() {
    let params = gpu(&json!({"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": 200,
        "defaultPinnedDeviceMemoryLimit": "1k",
        "defaultPerDevicePinnedMemoryLimit": {"nope": "1Gi"}}}));
    let Err(ConfigError::Invalid(errors)) = decode_validated(&params) else {
        panic!()
    };
    let paths: Vec<_> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "sharing.mpsConfig.defaultActiveThreadPercentage",
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[\"nope\"]",
        ]
    );
}

#[test]
fn per_device_keys_must_be_indexes_or_uuids() {
    let with_key = |k: &str| {
        gpu(
            &json!({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {k: "1Gi"}}}),
        )
    };
    for good in [
        "0",
        "7",
        "GPU-3f2a9a1c-8d4e-4b6a-9f43-0c1d2e3f4a5b",
        "MIG-9c5a-11ee",
        "MIG-GPU-3f2a9a1c-8d4e-4b6a-9f43-0c1d2e3f4a5b/1/0",
    ] {
        decode_validated(&with_key(good)).unwrap_or_else(|e| panic!("{good}: {e}"));
    }
    for bad in [
        "",
        "-1",
        "+1",
        "1.0",
        "gpu0",
        "GPU-",
        "GPU-a b",
        "GPU-\u{e9}",
        "123456789012345678901",
    ] {
        let err = error_of(&with_key(bad));
        assert!(
            err.contains("must be a device index (0, 1, ...) or a GPU/MIG UUID"),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn pinned_limits_apply_default_then_overrides() {
    let params = gpu(&json!({"strategy": "MPS", "mpsConfig": {
        "defaultPinnedDeviceMemoryLimit": "2Gi",
        "defaultPerDevicePinnedMemoryLimit": {"1": "1.5Gi", "GPU-c": "3000Mi"}}}));
    let DeviceConfig::Gpu(config) = decode_validated(&params).unwrap() else {
        panic!()
    };
    let mps = config.mps().unwrap();
    let limits = mps
        .pinned_memory_limits(&["GPU-a", "GPU-b", "GPU-c"])
        .unwrap();
    let expected = [("GPU-a", "2048M"), ("GPU-b", "1536M"), ("GPU-c", "3000M")];
    assert_eq!(limits, by_uuid(expected));

    // keys must name one of the config's devices
    assert_eq!(
        mps.pinned_memory_limits(&["GPU-a"]),
        Err(ConfigError::UnknownDevice {
            key: "1".to_owned(),
            count: 1
        })
    );
    assert!(matches!(
        mps.pinned_memory_limits(&["GPU-a", "GPU-b"]),
        Err(ConfigError::UnknownDevice { key, .. }) if key == "GPU-c"
    ));
    // indexes count in the sorted UUIDs, not in the order given (NVIDIA:
    // AllocatableDevices.UUIDs() sorts before MpsPerDevicePinnedMemoryLimit.Normalize)
    let by_index = MpsConfig {
        default_per_device_pinned_memory_limit: Some(
            [("0".to_owned(), q("1Gi")), ("2".to_owned(), q("3Gi"))].into(),
        ),
        ..MpsConfig::default()
    };
    assert_eq!(
        by_index
            .pinned_memory_limits(&["GPU-c", "GPU-a", "GPU-b"])
            .unwrap(),
        by_uuid([("GPU-a", "1024M"), ("GPU-c", "3072M")])
    );
    assert_eq!(
        by_index.pinned_memory_limits(&["GPU-b", "GPU-a", "GPU-b"]),
        Err(ConfigError::UnknownDevice {
            key: "2".to_owned(),
            count: 2
        }),
        "a UUID given twice is one device"
    );
    // no default: only the overrides
    let only = MpsConfig {
        default_per_device_pinned_memory_limit: Some([("0".to_owned(), q("1Gi"))].into()),
        ..MpsConfig::default()
    };
    assert_eq!(
        only.pinned_memory_limits(&["GPU-x", "GPU-y"]).unwrap(),
        [("GPU-x".to_owned(), "1024M".to_owned())].into()
    );
}

#[test]
fn mps_limits_round_like_nvidia() {
    assert_eq!(mps_memory_limit(&q("1Mi")).unwrap(), "1M");
    assert_eq!(mps_memory_limit(&q("1.9Mi")).unwrap(), "1M");
    assert_eq!(mps_memory_limit(&q("1G")).unwrap(), "953M");
    // rounded up to whole bytes first: 1048575.5 bytes is 1048576
    assert_eq!(mps_memory_limit(&q("1048575.5")).unwrap(), "1M");
    assert!(mps_memory_limit(&q("1048575")).is_err());
    // Above 16 TiB (accepted, as by NVIDIA's driver), sent as 16 TiB,
    // which the plugin's MPS settings take.
    assert_eq!(mps_memory_limit(&q("16Ti")).unwrap(), "16777216M");
    for big in ["100Ti", "7Ei"] {
        assert_eq!(mps_memory_limit(&q(big)).unwrap(), "16777216M", "{big}");
    }
    assert!(mps_memory_limit(&q("8Ei")).is_err());
}

// --- strict decoding --------------------------------------------------------------

#[test]
fn unknown_fields_are_rejected_at_every_level() {
    let cases = [
        (
            json!({"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig", "metadata": {"name": "x"}}),
            "metadata",
            "unknown field `metadata`",
        ),
        (
            gpu(&json!({"strategy": "MPS", "replicas": 2})),
            "sharing.replicas",
            "unknown field `replicas`",
        ),
        (
            gpu(
                &json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long", "slice": 1}}),
            ),
            "sharing.timeSlicingConfig.slice",
            "unknown field `slice`",
        ),
        (
            gpu(&json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercent": 5}})),
            "sharing.mpsConfig.defaultActiveThreadPercent",
            "unknown field `defaultActiveThreadPercent`",
        ),
        (
            mig(&json!({"strategy": "MPS", "timeSlicingConfig": {}})),
            "sharing.timeSlicingConfig",
            "unknown field `timeSlicingConfig`",
        ),
        // field names are case-sensitive, as in Kubernetes' strict decoder
        (
            gpu(&json!({"Strategy": "MPS"})),
            "sharing.Strategy",
            "unknown field `Strategy`",
        ),
    ];
    for (params, path, message) in cases {
        match decode(&params) {
            Err(ConfigError::Decode {
                path: p,
                message: m,
            }) => {
                assert_eq!(p, path, "{params}");
                assert!(m.contains(message), "{params}: {m}");
            }
            other => panic!("{params}: {other:?}"),
        }
    }
}

#[test]
fn wrong_types_and_values_are_rejected_with_their_path() {
    let mps = |c: Value| gpu(&json!({"strategy": "MPS", "mpsConfig": c}));
    let cases = [
        (gpu(&json!("MPS")), "sharing", "invalid type: string"),
        (
            gpu(&json!({"strategy": 1})),
            "sharing.strategy",
            "invalid type: integer",
        ),
        (
            gpu(&json!({"strategy": "Fabric"})),
            "sharing.strategy",
            "unknown variant `Fabric`",
        ),
        (
            gpu(&json!({"strategy": "mps"})),
            "sharing.strategy",
            "unknown variant `mps`",
        ),
        (
            gpu(&json!({"strategy": null})),
            "sharing.strategy",
            "invalid type: null",
        ),
        (gpu(&json!({})), "sharing", "missing field `strategy`"),
        (
            gpu(&json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "VeryLong"}})),
            "sharing.timeSlicingConfig.interval",
            "unknown variant `VeryLong`",
        ),
        (
            mps(json!({"defaultActiveThreadPercentage": "50"})),
            "sharing.mpsConfig.defaultActiveThreadPercentage",
            "invalid type: string",
        ),
        (
            mps(json!({"defaultActiveThreadPercentage": 50.5})),
            "sharing.mpsConfig.defaultActiveThreadPercentage",
            "invalid type: floating point",
        ),
        (
            mps(json!({"defaultActiveThreadPercentage": 1e308})),
            "sharing.mpsConfig.defaultActiveThreadPercentage",
            "invalid type: floating point",
        ),
        (
            mps(json!({"defaultActiveThreadPercentage": u64::MAX})),
            "sharing.mpsConfig.defaultActiveThreadPercentage",
            "invalid value: integer",
        ),
        (
            mps(json!({"defaultPinnedDeviceMemoryLimit": true})),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
            "invalid type: boolean",
        ),
        (
            mps(json!({"defaultPinnedDeviceMemoryLimit": "10GB"})),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
            "unknown suffix",
        ),
        (
            mps(json!({"defaultPinnedDeviceMemoryLimit": 1e308})),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
            "out of range",
        ),
        (
            mps(json!({"multiUser": "true"})),
            "sharing.mpsConfig.multiUser",
            "invalid type: string \"true\", expected a boolean",
        ),
        (
            mps(json!({"multiUser": 1})),
            "sharing.mpsConfig.multiUser",
            "invalid type: integer `1`, expected a boolean",
        ),
        (
            mps(json!({"multiuser": true})),
            "sharing.mpsConfig.multiuser",
            "unknown field `multiuser`",
        ),
        (
            mps(json!({"defaultPerDevicePinnedMemoryLimit": ["1Gi"]})),
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit",
            "invalid type: sequence",
        ),
        (
            mps(json!({"defaultPerDevicePinnedMemoryLimit": {"0": null}})),
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.0",
            "invalid type: null",
        ),
        (
            json!({"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}, "apiVersion2": 1}),
            "apiVersion2",
            "unknown field `apiVersion2`",
        ),
    ];
    for (params, path, message) in cases {
        match decode(&params) {
            Err(ConfigError::Decode {
                path: p,
                message: m,
            }) => {
                assert_eq!(p, path, "{params}");
                assert!(m.contains(message), "{params}: {m}");
            }
            other => panic!("{params}: {other:?}"),
        }
    }
    // a bare number is a quantity, as in Kubernetes
    decode_validated(&mps(
        json!({"defaultPinnedDeviceMemoryLimit": 1_073_741_824}),
    ))
    .unwrap();
    // null means unset for optional fields
    decode_validated(&gpu(&Value::Null)).unwrap();
}

#[test]
fn type_fields_dispatch_with_precise_errors() {
    let cases: [(Value, ConfigError); 9] = [
        (json!([1]), ConfigError::NotAnObject("an array")),
        (json!("GpuConfig"), ConfigError::NotAnObject("a string")),
        (Value::Null, ConfigError::NotAnObject("null")),
        (
            json!({"kind": "GpuConfig"}),
            ConfigError::MissingTypeField {
                field: "apiVersion",
            },
        ),
        (
            json!({"apiVersion": NVIDIA_API_VERSION}),
            ConfigError::MissingTypeField { field: "kind" },
        ),
        (
            json!({"apiVersion": NVIDIA_API_VERSION, "kind": 3}),
            ConfigError::MissingTypeField { field: "kind" },
        ),
        (
            json!({"apiVersion": "resource.nvidia.com/v1alpha1", "kind": "GpuConfig"}),
            ConfigError::UnsupportedApiVersion {
                api_version: "resource.nvidia.com/v1alpha1".to_owned(),
                supported: NVIDIA_API_VERSION,
            },
        ),
        (
            json!({"apiVersion": NVIDIA_API_VERSION, "kind": "ComputeDomainChannelConfig"}),
            ConfigError::UnsupportedKind {
                api_version: NVIDIA_API_VERSION.to_owned(),
                kind: "ComputeDomainChannelConfig".to_owned(),
                supported: "GpuConfig, MigDeviceConfig, VfioDeviceConfig",
            },
        ),
        (
            json!({"apiVersion": NVIDIA_API_VERSION, "kind": "gpuconfig"}),
            ConfigError::UnsupportedKind {
                api_version: NVIDIA_API_VERSION.to_owned(),
                kind: "gpuconfig".to_owned(),
                supported: "GpuConfig, MigDeviceConfig, VfioDeviceConfig",
            },
        ),
    ];
    for (params, expected) in cases {
        assert_eq!(decode(&params), Err(expected), "{params}");
    }
    assert_eq!(
        error_of(&json!({"apiVersion": "v1", "kind": "GpuConfig"})),
        "unsupported apiVersion \"v1\": this driver decodes resource.nvidia.com/v1beta1"
    );
}

#[test]
fn hostile_inputs_are_rejected_without_panicking() {
    // more than 10 KiB, as bytes and as a value
    let padding = "x".repeat(MAX_PARAMETERS_BYTES);
    let big = gpu(
        &json!({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {padding: "1Gi"}}}),
    );
    assert!(matches!(
        decode(&big),
        Err(ConfigError::TooLarge { max: 10240, .. })
    ));
    let raw = serde_json::to_vec(&big).unwrap();
    assert!(matches!(
        decode_bytes(&raw),
        Err(ConfigError::TooLarge { size, max: 10240 }) if size == raw.len()
    ));

    // deep nesting, within the size limit
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    assert!(
        matches!(decode_bytes(deep.as_bytes()), Err(ConfigError::Malformed(m)) if m.contains("recursion limit"))
    );
    let mut value = json!(1);
    for _ in 0..100 {
        value = json!([value]);
    }
    let nested = json!({"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig", "sharing": value});
    assert!(
        matches!(decode(&nested), Err(ConfigError::Malformed(m)) if m.contains("nesting deeper than 32"))
    );

    // not JSON at all, or truncated
    for raw in [
        &b""[..],
        b"{",
        b"\xff\xfe",
        b"apiVersion: v1",
        b"{\"kind\": \"GpuConfig\",}",
    ] {
        assert!(
            matches!(decode_bytes(raw), Err(ConfigError::Malformed(_))),
            "{raw:?}"
        );
    }

    // duplicate fields and duplicate map keys (only visible in the raw bytes)
    let dup_field = br#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig",
        "sharing":{"strategy":"MPS","strategy":"TimeSlicing"}}"#;
    assert!(matches!(
        decode_bytes(dup_field),
        Err(ConfigError::Decode { path, message }) if path == "sharing" && message.contains("duplicate field `strategy`")
    ));
    let dup_kind = br#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig","kind":"GpuConfig"}"#;
    assert!(matches!(
        decode_bytes(dup_kind),
        Err(ConfigError::Decode { message, .. }) if message.contains("duplicate field `kind`")
    ));
    let dup_key = br#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS",
        "mpsConfig":{"defaultPerDevicePinnedMemoryLimit":{"0":"1Gi","0":"2Gi"}}}}"#;
    assert!(matches!(
        decode_bytes(dup_key),
        Err(ConfigError::Decode { path, message })
            if path == "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit" && message.contains("duplicate key \"0\"")
    ));
    // trailing garbage after the object
    let trailing = br#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig"} {}"#;
    assert!(matches!(
        decode_bytes(trailing),
        Err(ConfigError::Malformed(_))
    ));
}

// --- resolution -------------------------------------------------------------------

fn alloc(
    source: ConfigSource,
    requests: &[&str],
    driver: &str,
    parameters: Value,
) -> AllocationConfig {
    AllocationConfig {
        source,
        requests: requests.iter().map(|r| (*r).to_owned()).collect(),
        opaque: Some(OpaqueConfig {
            driver: driver.to_owned(),
            parameters,
        }),
    }
}

fn ts(interval: &str) -> Value {
    gpu(&json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}))
}

fn interval_of(config: Option<DeviceConfig>) -> Option<TimeSliceInterval> {
    match config {
        Some(DeviceConfig::Gpu(c)) => c.time_slice(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn claim_configs_beat_class_configs_and_later_wins() {
    use ConfigSource::{FromClaim, FromClass};
    // listed claim-first on purpose: the source decides, not the position
    let configs = [
        alloc(FromClaim, &["a"], DRIVER, ts("Short")),
        alloc(FromClass, &["a"], DRIVER, ts("Long")),
        alloc(FromClaim, &["a"], DRIVER, ts("Medium")),
        alloc(FromClass, &[], DRIVER, ts("Long")),
    ];
    let resolved = resolve(&configs, "a", DRIVER, DeviceKind::Gpu).unwrap();
    assert_eq!(interval_of(resolved), Some(TimeSliceInterval::Medium));
    // "b" is only covered by the class config for all requests
    let resolved = resolve(&configs, "b", DRIVER, DeviceKind::Gpu).unwrap();
    assert_eq!(interval_of(resolved), Some(TimeSliceInterval::Long));
}

#[test]
fn the_winning_entry_is_named_by_its_index_in_the_allocation() {
    use ConfigSource::{FromClaim, FromClass};
    // Two entries with the same content stay two entries; the index is the
    // position in the list as written, not in the class-first order.
    let configs = [
        alloc(FromClaim, &["a"], DRIVER, ts("Short")),
        alloc(FromClass, &[], DRIVER, ts("Short")),
        alloc(FromClaim, &["b"], DRIVER, ts("Short")),
    ];
    let entry = |request| {
        resolve_entry(&configs, request, DRIVER, DeviceKind::Gpu)
            .unwrap()
            .map(|(index, _)| index)
    };
    assert_eq!(entry("a"), Some(0));
    assert_eq!(entry("b"), Some(2));
    assert_eq!(entry("c"), Some(1), "only the class config covers it");
    assert_eq!(
        resolve_entry(&configs, "c", DRIVER, DeviceKind::Mig),
        Ok(None),
        "a GpuConfig for all requests is skipped for a MIG device"
    );
}

#[test]
fn foreign_drivers_are_ignored_even_when_broken() {
    use ConfigSource::FromClaim;
    let configs = [
        alloc(FromClaim, &["a"], DRIVER, ts("Short")),
        alloc(
            FromClaim,
            &["a"],
            "net.example.com",
            json!({"anything": ["goes"]}),
        ),
    ];
    let resolved = resolve(&configs, "a", DRIVER, DeviceKind::Gpu).unwrap();
    assert_eq!(interval_of(resolved), Some(TimeSliceInterval::Short));
    assert_eq!(
        resolve(&configs, "a", "other.example.com", DeviceKind::Gpu),
        Ok(None)
    );
}

#[test]
fn request_filters_select_configs() {
    use ConfigSource::FromClaim;
    let configs = [
        alloc(FromClaim, &["ts-gpu"], DRIVER, ts("Long")),
        alloc(
            FromClaim,
            &["mps-gpu", "x"],
            DRIVER,
            gpu(&json!({"strategy": "MPS"})),
        ),
        alloc(FromClaim, &["pick/big"], DRIVER, ts("Medium")),
    ];
    assert_eq!(
        interval_of(resolve(&configs, "ts-gpu", DRIVER, DeviceKind::Gpu).unwrap()),
        Some(TimeSliceInterval::Long)
    );
    let Some(DeviceConfig::Gpu(mps)) =
        resolve(&configs, "mps-gpu", DRIVER, DeviceKind::Gpu).unwrap()
    else {
        panic!()
    };
    assert!(mps.mps().is_some());
    assert_eq!(
        resolve(&configs, "other", DRIVER, DeviceKind::Gpu),
        Ok(None)
    );
    // prioritized list: "main/sub" matches a config for "main" or for "main/sub"
    assert_eq!(
        interval_of(resolve(&configs, "ts-gpu/small", DRIVER, DeviceKind::Gpu).unwrap()),
        Some(TimeSliceInterval::Long)
    );
    assert_eq!(
        interval_of(resolve(&configs, "pick/big", DRIVER, DeviceKind::Gpu).unwrap()),
        Some(TimeSliceInterval::Medium)
    );
    assert_eq!(
        resolve(&configs, "pick/small", DRIVER, DeviceKind::Gpu),
        Ok(None)
    );
    assert_eq!(resolve(&configs, "pick", DRIVER, DeviceKind::Gpu), Ok(None));
}

#[test]
fn device_kind_mismatches() {
    use ConfigSource::{FromClaim, FromClass};
    let mig_mps = mig(&json!({"strategy": "MPS"}));
    // a config naming the request with the wrong kind is an error
    let configs = [alloc(FromClaim, &["m"], DRIVER, ts("Long"))];
    assert_eq!(
        resolve(&configs, "m", DRIVER, DeviceKind::Mig),
        Err(ConfigError::WrongDeviceKind {
            config_kind: "GpuConfig",
            device: DeviceKind::Mig,
            request: "m".to_owned()
        })
    );
    let configs = [alloc(FromClaim, &["g"], DRIVER, mig_mps.clone())];
    assert!(matches!(
        resolve(&configs, "g", DRIVER, DeviceKind::Gpu),
        Err(ConfigError::WrongDeviceKind {
            config_kind: "MigDeviceConfig",
            ..
        })
    ));
    // a config naming only the main request of a prioritized list applies
    // to the alternatives of its kind: one for each kind may name it
    let gpu_mps = gpu(&json!({"strategy": "MPS"}));
    let configs = [
        alloc(FromClaim, &["main"], DRIVER, gpu_mps.clone()),
        alloc(FromClaim, &["main"], DRIVER, mig_mps.clone()),
    ];
    assert!(matches!(
        resolve(&configs, "main/whole", DRIVER, DeviceKind::Gpu).unwrap(),
        Some(DeviceConfig::Gpu(_))
    ));
    assert!(matches!(
        resolve(&configs, "main/mig", DRIVER, DeviceKind::Mig).unwrap(),
        Some(DeviceConfig::Mig(_))
    ));
    let configs = [alloc(FromClaim, &["main"], DRIVER, mig_mps.clone())];
    assert_eq!(
        resolve(&configs, "main/whole", DRIVER, DeviceKind::Gpu),
        Ok(None)
    );
    // naming the alternative itself with the wrong kind stays an error
    let configs = [alloc(FromClaim, &["main/whole"], DRIVER, mig_mps.clone())];
    assert!(matches!(
        resolve(&configs, "main/whole", DRIVER, DeviceKind::Gpu),
        Err(ConfigError::WrongDeviceKind { .. })
    ));
    // a config for all requests applies only to its own kind, and an earlier
    // one of the right kind is found behind it
    let configs = [
        alloc(FromClass, &[], DRIVER, mig_mps),
        alloc(FromClaim, &[], DRIVER, ts("Short")),
    ];
    assert!(matches!(
        resolve(&configs, "m", DRIVER, DeviceKind::Mig).unwrap(),
        Some(DeviceConfig::Mig(_))
    ));
    assert_eq!(
        interval_of(resolve(&configs, "g", DRIVER, DeviceKind::Gpu).unwrap()),
        Some(TimeSliceInterval::Short)
    );
}

#[test]
fn broken_configs_of_ours_fail_resolution_with_their_index() {
    use ConfigSource::{FromClaim, FromClass};
    let configs = [
        alloc(FromClaim, &["a"], DRIVER, ts("Short")),
        alloc(
            FromClass,
            &["b"],
            DRIVER,
            gpu(&json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}})),
        ),
    ];
    let err = resolve(&configs, "a", DRIVER, DeviceKind::Gpu).unwrap_err();
    assert_eq!(
        err.to_string(),
        "config[1] (FromClass): sharing.mpsConfig.defaultActiveThreadPercentage: must be between 0 and 100, got 150"
    );
    let configs = [AllocationConfig {
        source: FromClaim,
        requests: vec![],
        opaque: None,
    }];
    assert_eq!(
        resolve(&configs, "a", DRIVER, DeviceKind::Gpu),
        Err(ConfigError::NotOpaque { index: 0 })
    );
    assert_eq!(
        "FromSomewhere".parse::<ConfigSource>(),
        Err(ConfigError::InvalidSource("FromSomewhere".to_owned()))
    );
    assert_eq!("FromClass".parse::<ConfigSource>(), Ok(FromClass));
}

#[test]
fn rejection_reads_a_bounded_prefix_at_any_size() {
    // Over the size limit: refused on the length alone, before parsing.
    for n in [20_000, 40_000, 80_000, 100_000, 200_000] {
        let deep = "[".repeat(n);
        assert!(
            matches!(decode_bytes(deep.as_bytes()), Err(ConfigError::TooLarge { size, max: 10240 }) if size == n),
            "{n}"
        );
    }
    // Within it: refused at the same byte, serde_json's recursion limit
    // (never turned off in this workspace), for n, 2n, 4n, ... levels.
    for n in [640, 1_280, 2_560, 5_120, 10_240] {
        let deep = "[".repeat(n);
        match decode_bytes(deep.as_bytes()) {
            Err(ConfigError::Malformed(m)) => {
                assert_eq!(m, "recursion limit exceeded at line 1 column 128", "{n}");
            }
            other => panic!("{n}: {other:?}"),
        }
    }
    // Depth 32 passes the depth check, 33 does not.
    let nest = |levels: usize| {
        let mut value = json!({});
        for _ in 1..levels {
            value = json!({"a": value});
        }
        value
    };
    let at =
        |levels| json!({"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig", "x": nest(levels)});
    assert!(
        !matches!(decode(&at(MAX_PARAMETERS_DEPTH - 1)), Err(ConfigError::Malformed(m)) if m.contains("nesting deeper")),
    );
    assert!(
        matches!(decode(&at(MAX_PARAMETERS_DEPTH)), Err(ConfigError::Malformed(m)) if m.contains("nesting deeper than 32")),
    );
}

/// NVIDIA's VFIO configs decode, with their defaults: no `iommu` is the
/// legacy backend without the API device; `enableAPIDevice` defaults to
/// false.
#[test]
fn vfio_configs_decode_with_nvidias_defaults() {
    let vfio = |iommu: serde_json::Value| {
        let mut v = json!({"apiVersion": NVIDIA_API_VERSION, "kind": "VfioDeviceConfig"});
        if !iommu.is_null() {
            v["iommu"] = iommu;
        }
        v
    };
    for (params, policy, api_device) in [
        (
            vfio(serde_json::Value::Null),
            IommuBackendPolicy::LegacyOnly,
            false,
        ),
        (
            vfio(json!({"backendPolicy": "LegacyOnly"})),
            IommuBackendPolicy::LegacyOnly,
            false,
        ),
        (
            vfio(json!({"backendPolicy": "PreferIommuFD", "enableAPIDevice": true})),
            IommuBackendPolicy::PreferIommuFd,
            true,
        ),
        (
            vfio(json!({"backendPolicy": "PreferIommuFD", "enableAPIDevice": null})),
            IommuBackendPolicy::PreferIommuFd,
            false,
        ),
    ] {
        let Ok(DeviceConfig::Vfio(c)) = decode_validated(&params) else {
            panic!("{params}");
        };
        assert_eq!(c.backend_policy(), policy, "{params}");
        assert_eq!(c.enable_api_device(), api_device, "{params}");
        let raw = serde_json::to_vec(&params).unwrap();
        assert_eq!(
            decode_bytes_validated(&raw).unwrap(),
            DeviceConfig::Vfio(c),
            "{params}"
        );
    }
    assert_eq!(
        DeviceConfig::default_for(DeviceKind::Vfio),
        decode_validated(&vfio(serde_json::Value::Null)).unwrap()
    );
    assert_eq!(
        decode_validated(&vfio(serde_json::Value::Null))
            .unwrap()
            .device_kind(),
        DeviceKind::Vfio
    );
}

/// Bad VFIO configs are refused with the field's path and what is wrong.
#[test]
fn bad_vfio_configs_are_refused_precisely() {
    let vfio = |extra: serde_json::Value| {
        let mut v = json!({"apiVersion": NVIDIA_API_VERSION, "kind": "VfioDeviceConfig"});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    let cases = [
        (
            vfio(json!({"iommu": {"backendPolicy": "RequireIommuFD"}})),
            "iommu.backendPolicy: unknown variant `RequireIommuFD`, expected `LegacyOnly` or `PreferIommuFD`",
        ),
        (
            vfio(json!({"iommu": {"backendPolicy": "legacyonly"}})),
            "iommu.backendPolicy: unknown variant `legacyonly`, expected `LegacyOnly` or `PreferIommuFD`",
        ),
        (
            vfio(json!({"iommu": {}})),
            "iommu.backendPolicy: required when iommu is given: LegacyOnly or PreferIommuFD",
        ),
        (
            vfio(json!({"iommu": {"backendPolicy": null}})),
            "iommu.backendPolicy: required when iommu is given: LegacyOnly or PreferIommuFD",
        ),
        (
            vfio(json!({"iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": "yes"}})),
            "iommu.enableAPIDevice: invalid type: string \"yes\", expected a boolean",
        ),
        (
            vfio(json!({"iommu": {"backendPolicy": "LegacyOnly", "enableApiDevice": true}})),
            "iommu.enableApiDevice: unknown field `enableApiDevice`, expected `backendPolicy` or `enableAPIDevice`",
        ),
        (
            vfio(json!({"iommu": "LegacyOnly"})),
            "iommu: invalid type: string \"LegacyOnly\", expected struct IommuConfig",
        ),
        (
            vfio(json!({"sharing": {"strategy": "MPS"}})),
            "sharing: unknown field `sharing`, expected one of `apiVersion`, `kind`, `iommu`",
        ),
    ];
    for (params, expected) in cases {
        let error = decode_validated(&params).unwrap_err().to_string();
        assert_eq!(error, expected, "{params}");
        // From bytes, the same message, with the position added.
        let raw = serde_json::to_vec(&params).unwrap();
        let from_bytes = decode_bytes_validated(&raw).unwrap_err().to_string();
        assert!(from_bytes.starts_with(expected), "{params}: {from_bytes}");
    }
    // A duplicate field, seen only in the raw text.
    let raw = br#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"VfioDeviceConfig","iommu":{"backendPolicy":"LegacyOnly","backendPolicy":"PreferIommuFD"}}"#;
    let error = decode_bytes_validated(raw).unwrap_err().to_string();
    assert!(
        error.starts_with("iommu: duplicate field `backendPolicy`"),
        "{error}"
    );
}

/// A VFIO config names a VFIO device; on a GPU request it is an error.
#[test]
fn a_vfio_config_applies_only_to_vfio_devices() {
    let configs = vec![AllocationConfig {
        source: ConfigSource::FromClaim,
        requests: vec!["vm".to_owned()],
        opaque: Some(OpaqueConfig {
            driver: DRIVER.to_owned(),
            parameters: json!({"apiVersion": NVIDIA_API_VERSION, "kind": "VfioDeviceConfig",
                "iommu": {"backendPolicy": "PreferIommuFD"}}),
        }),
    }];
    let found = resolve_entry(&configs, "vm", DRIVER, DeviceKind::Vfio)
        .unwrap()
        .unwrap();
    assert_eq!(found.1.kind(), "VfioDeviceConfig");
    assert_eq!(
        resolve_entry(&configs, "vm", DRIVER, DeviceKind::Gpu)
            .unwrap_err()
            .to_string(),
        "VfioDeviceConfig cannot be applied to GPU of request \"vm\""
    );
}

#[test]
fn mps_multi_user_is_accepted_on_gpus_and_mig_devices_and_round_trips() {
    for params in [
        gpu(&json!({"strategy": "MPS", "mpsConfig": {"multiUser": true}})),
        mig(
            &json!({"strategy": "MPS", "mpsConfig": {"multiUser": false, "defaultActiveThreadPercentage": 20}}),
        ),
    ] {
        let config = decode_validated(&params).unwrap();
        let mps = match &config {
            DeviceConfig::Gpu(c) => c.mps(),
            DeviceConfig::Mig(c) => c.mps(),
            other => panic!("{other:?}"),
        }
        .unwrap();
        assert_eq!(
            mps.multi_user,
            Some(params.to_string().contains("\"multiUser\":true"))
        );
        let back = serde_json::to_value(&config).unwrap();
        assert_eq!(back, params);
    }
    // Absent means off; null means unset.
    let config = decode_validated(&gpu(
        &json!({"strategy": "MPS", "mpsConfig": {"multiUser": null}}),
    ))
    .unwrap();
    let DeviceConfig::Gpu(c) = &config else {
        panic!("{config:?}")
    };
    assert_eq!(c.mps().unwrap().multi_user, None);
}
