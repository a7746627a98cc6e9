//! `Validator::validate` on whole objects: NVIDIA's shipped classes and
//! example claim template (drop-in compatibility), bad opaque configs,
//! request references, constraints, objects of other drivers (never
//! touched), malformed, huge and deeply nested input.

use std::cell::Cell;

use gpu_dra_analysis::validate::{ClassLookup, Finding, Report, StaticClasses, Validator};
use serde_json::{Value, json};

const DRIVER: &str = "gpu.nvidia.com";

fn class(name: &str, selectors: &[&str]) -> Value {
    let selectors: Vec<Value> = selectors
        .iter()
        .map(|s| json!({"cel": {"expression": s}}))
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": selectors},
    })
}

/// NVIDIA's two shipped classes, a class of both kinds, and another
/// driver's class.
fn classes() -> StaticClasses {
    let mut gpu = class(
        "gpu.nvidia.com",
        &["device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"],
    );
    gpu["spec"]["extendedResourceName"] = json!("nvidia.com/gpu");
    StaticClasses::new([
        gpu,
        class(
            "mig.nvidia.com",
            &[
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
            ],
        ),
        class(
            "vfio.gpu.nvidia.com",
            &[
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'",
            ],
        ),
        class("any.nvidia.com", &["device.driver == 'gpu.nvidia.com'"]),
        class(
            "nic.example.com",
            &["device.driver == 'nic.example.com' && device.attributes['memory'] >= 1"],
        ),
        json!({"kind": "ConfigMap", "metadata": {"name": "not-a-class"}}),
    ])
}

fn claim(devices: Value) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "test", "namespace": "default"},
        "spec": {"devices": devices},
    })
}

fn gpu_config(sharing: Value) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing})
}

fn opaque(requests: &[&str], parameters: Value) -> Value {
    json!({"requests": requests, "opaque": {"driver": DRIVER, "parameters": parameters}})
}

fn validate(object: &Value) -> Report {
    Validator::new(DRIVER).validate(object, &classes())
}

fn find<'a>(findings: &'a [Finding], path: &str) -> &'a Finding {
    findings
        .iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("no finding at {path}: {findings:#?}"))
}

fn assert_clean(report: &Report) {
    assert!(report.ours, "{report:#?}");
    assert!(report.errors.is_empty(), "{:#?}", report.errors);
    assert!(report.warnings.is_empty(), "{:#?}", report.warnings);
    assert!(report.is_ok());
}

// ------------------------------------------------------------------ NVIDIA

#[test]
fn nvidia_shipped_classes_pass() {
    let validator = Validator::new(DRIVER);
    let lookup = classes();
    for name in ["gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"] {
        let object = lookup.device_class(name).unwrap();
        let report = validator.validate(&object, &lookup);
        assert_clean(&report);
        assert_eq!(report.kind, "DeviceClass");
        assert_eq!(report.name, name);
    }
}

#[test]
fn nvidia_example_claim_template_passes() {
    let yaml = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: shared-gpus}
spec:
  spec:
    devices:
      requests:
      - {name: ts-gpu, exactly: {deviceClassName: gpu.nvidia.com}}
      - {name: mps-gpu, exactly: {deviceClassName: gpu.nvidia.com}}
      config:
      - requests: ["ts-gpu"]
        opaque:
          driver: gpu.nvidia.com
          parameters: {apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig,
                       sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Long}}}
      - requests: ["mps-gpu"]
        opaque:
          driver: gpu.nvidia.com
          parameters: {apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig,
                       sharing: {strategy: MPS, mpsConfig: {defaultActiveThreadPercentage: 50, defaultPinnedDeviceMemoryLimit: 10Gi}}}
"#;
    let object: Value = yaml_serde::from_str(yaml).unwrap();
    let report = validate(&object);
    assert_clean(&report);
    assert_eq!(report.kind, "ResourceClaimTemplate");
    assert_eq!(report.name, "shared-gpus");
}

#[test]
fn nvidia_real_request_selectors_pass_in_all_api_versions() {
    let selectors = [
        "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity(\"40Gi\"))",
        "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$')",
    ];
    let selectors: Vec<Value> = selectors
        .iter()
        .map(|s| json!({"cel": {"expression": s}}))
        .collect();
    // v1 and v1beta2: `exactly`; v1beta1: the request itself
    for (version, request) in [
        (
            "v1",
            json!({"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": selectors}}),
        ),
        (
            "v1beta2",
            json!({"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": selectors}}),
        ),
        (
            "v1beta1",
            json!({"name": "gpu", "deviceClassName": "gpu.nvidia.com", "selectors": selectors}),
        ),
    ] {
        let mut object = claim(json!({"requests": [request]}));
        object["apiVersion"] = json!(format!("resource.k8s.io/{version}"));
        assert_clean(&validate(&object));
    }
}

// ------------------------------------------------------------------ selectors in objects

#[test]
fn request_selectors_are_checked_with_paths_and_the_class_narrows_them() {
    let object = claim(json!({"requests": [
        {"name": "a", "exactly": {"deviceClassName": "any.nvidia.com", "selectors": [
            {"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}},
        ]}},
        {"name": "b", "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [
            {"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}},
            {"cel": {"expression": "device.attributes['memory'] >= 40000"}},
        ]}},
    ]}));
    let report = validate(&object);
    assert!(report.ours);
    // `profile` on a class of every device fails on full GPUs; on the MIG class it is fine
    let missing = find(
        &report.errors,
        "spec.devices.requests[0].exactly.selectors[0].cel.expression",
    );
    assert!(
        missing
            .message
            .contains("`profile` is not published on full GPUs"),
        "{missing:?}"
    );
    assert!(
        !report
            .errors
            .iter()
            .any(|f| f.path == "spec.devices.requests[1].exactly.selectors[0].cel.expression"),
        "{:#?}",
        report.errors
    );
    let keyed = find(
        &report.errors,
        "spec.devices.requests[1].exactly.selectors[1].cel.expression",
    );
    assert!(keyed.message.contains("keyed by domain"), "{keyed:?}");
    assert_eq!(
        keyed.hint.as_deref(),
        Some("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40000Mi')) >= 0")
    );
}

#[test]
fn class_selectors_are_checked_in_order() {
    let object = class(
        "broken",
        &[
            "device.driver == 'gpu.nvidia.com'",
            "device.attributes['gpu.nvidia.com'].driverVersion >= 550",
            "device.attributes['gpu.nvidia.com'].type == 'gpu' &&",
        ],
    );
    let report = validate(&object);
    assert!(report.ours);
    let mismatch = find(&report.errors, "spec.selectors[1].cel.expression");
    assert!(
        mismatch.message.contains("is a version and `550` an int"),
        "{mismatch:?}"
    );
    let syntax = find(&report.errors, "spec.selectors[2].cel.expression");
    assert!(
        syntax.message.starts_with("1:53: syntax error"),
        "{syntax:?}"
    );
    // the first selector restricts the driver, so the second does not warn
    // about other drivers' devices
    assert!(
        !report
            .warnings
            .iter()
            .any(|w| w.message.contains("other drivers")),
        "{:#?}",
        report.warnings
    );
}

#[test]
fn a_class_that_does_not_compile_is_ours_when_it_names_the_driver() {
    let report = validate(&class("c", &["device.driver == 'gpu.nvidia.com' &&"]));
    assert!(report.ours);
    assert_eq!(report.errors.len(), 1, "{:#?}", report.errors);
    let report = validate(&class("c", &["device.driver == 'nic.example.com' &&"]));
    assert!(!report.ours);
    assert!(report.errors.is_empty());
}

#[test]
fn first_available_subrequests_get_the_same_checks() {
    let object = claim(json!({
        "requests": [{"name": "main", "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu.nvidia.com", "selectors": [
                {"cel": {"expression": "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('40Gi'))"}},
            ]},
            {"name": "small", "deviceClassName": "mig.nvidia.com", "selectors": [
                {"cel": {"expression": "device.attributes['gpu.nvidia.com'].prfile == '1g.10gb'"}},
            ]},
        ]}],
        "config": [
            opaque(&["main/big"], gpu_config(json!({"strategy": "TimeSlicing"}))),
            opaque(&["main"], gpu_config(json!({"strategy": "TimeSlicing"}))),
        ],
    }));
    let report = validate(&object);
    assert!(report.ours);
    let typo = find(
        &report.errors,
        "spec.devices.requests[0].firstAvailable[1].selectors[0].cel.expression",
    );
    assert!(typo.message.contains("did you mean `profile`?"), "{typo:?}");
    // `main` covers both sub-requests, and `main/small` gets MIG devices
    let kind = find(&report.errors, "spec.devices.config[1].opaque.parameters");
    assert!(
        kind.message
            .contains("request `main/small` (class mig.nvidia.com) gets only MIG devices"),
        "{kind:?}"
    );
    // `main/big` gets full GPUs only: its GpuConfig is fine
    assert!(
        !report
            .errors
            .iter()
            .any(|f| f.path == "spec.devices.config[0].opaque.parameters"),
        "{:#?}",
        report.errors
    );
}

// ------------------------------------------------------------------ opaque configs

#[test]
fn bad_opaque_configs_are_denied_with_paths() {
    let object = claim(json!({
        "requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
            {"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com"}},
        ],
        "config": [
            opaque(&["gpu"], gpu_config(json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50, "bogus": 1}}))),
            opaque(&["gpu"], gpu_config(json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}))),
            opaque(&["mig"], gpu_config(json!({"strategy": "TimeSlicing"}))),
            opaque(&["gpu"], json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}})),
            opaque(&["gpu"], json!({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"})),
            opaque(&["gpu"], json!("not an object")),
            {"requests": ["gpu"], "opaque": {"driver": DRIVER}},
        ],
    }));
    let report = validate(&object);
    assert!(report.ours);
    let base = "spec.devices.config";
    let unknown = find(
        &report.errors,
        &format!("{base}[0].opaque.parameters.sharing.mpsConfig.bogus"),
    );
    assert!(
        unknown.message.contains("unknown field `bogus`"),
        "{unknown:?}"
    );
    let percent = find(
        &report.errors,
        &format!("{base}[1].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage"),
    );
    assert!(percent.message.contains("150"), "{percent:?}");
    let wrong_kind = find(&report.errors, &format!("{base}[2].opaque.parameters"));
    assert!(
        wrong_kind
            .message
            .contains("a GpuConfig cannot be applied to MIG devices")
            && wrong_kind.message.contains("use a MigDeviceConfig"),
        "{wrong_kind:?}"
    );
    let other_way = find(&report.errors, &format!("{base}[3].opaque.parameters"));
    assert!(
        other_way
            .message
            .contains("a MigDeviceConfig cannot be applied to full GPUs"),
        "{other_way:?}"
    );
    let version = find(&report.errors, &format!("{base}[4].opaque.parameters"));
    assert!(
        version.message.contains("unsupported apiVersion"),
        "{version:?}"
    );
    let not_object = find(&report.errors, &format!("{base}[5].opaque.parameters"));
    assert!(
        not_object.message.contains("must be a JSON object"),
        "{not_object:?}"
    );
    let missing = find(&report.errors, &format!("{base}[6].opaque.parameters"));
    assert!(missing.message.contains("needs parameters"), "{missing:?}");
    assert_eq!(report.errors.len(), 7, "{:#?}", report.errors);
}

#[test]
fn a_config_for_both_kinds_of_device_is_a_warning() {
    let object = claim(json!({
        "requests": [{"name": "any", "exactly": {"deviceClassName": "any.nvidia.com"}}],
        "config": [opaque(&[], gpu_config(json!({"strategy": "TimeSlicing"})))],
    }));
    let report = validate(&object);
    assert!(report.is_ok(), "{:#?}", report.errors);
    let warning = find(&report.warnings, "spec.devices.config[0].opaque.parameters");
    assert!(
        warning
            .message
            .contains("can get MIG devices and VFIO passthrough GPUs as well as full GPUs"),
        "{warning:?}"
    );
}

#[test]
fn class_configs_are_checked_against_the_class_devices() {
    let mut object = class(
        "mig-mps",
        &["device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"],
    );
    object["spec"]["config"] = json!([opaque(&[], gpu_config(json!({"strategy": "MPS"})))]);
    let report = validate(&object);
    let finding = find(&report.errors, "spec.config[0].opaque.parameters");
    assert!(
        finding.message.contains("this class gets only MIG devices"),
        "{finding:?}"
    );
    // a class with nothing but a config of ours is ours
    let object = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "c"},
        "spec": {"config": [opaque(&[], json!({"kind": "GpuConfig"}))]},
    });
    let report = validate(&object);
    assert!(report.ours);
    assert!(!report.errors.is_empty());
}

#[test]
fn request_references_are_checked() {
    let object = claim(json!({
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
                     {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}],
        "config": [
            opaque(&["gpuu"], gpu_config(json!({"strategy": "TimeSlicing"}))),
            opaque(&["nic"], gpu_config(json!({"strategy": "TimeSlicing"}))),
        ],
        "constraints": [{"requests": ["gpu", "nope"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}],
    }));
    let report = validate(&object);
    let typo = find(&report.errors, "spec.devices.config[0].requests[0]");
    assert!(
        typo.message
            .contains("`gpuu` is not a request of this claim; did you mean `gpu`?"),
        "{typo:?}"
    );
    assert_eq!(typo.hint.as_deref(), Some("gpu"));
    let nope = find(&report.errors, "spec.devices.constraints[0].requests[1]");
    assert!(nope.message.contains("its requests: gpu, nic"), "{nope:?}");
    let foreign = find(&report.warnings, "spec.devices.config[1].requests");
    assert!(
        foreign
            .message
            .contains("request `nic` gets no device of gpu.nvidia.com"),
        "{foreign:?}"
    );
}

#[test]
fn unknown_classes_with_our_configs_are_a_warning() {
    let object = claim(json!({
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "missing-class"}}],
        "config": [opaque(&["gpu"], gpu_config(json!({"strategy": "TimeSlicing"})))],
    }));
    let report = validate(&object);
    assert!(report.ours && report.is_ok(), "{report:#?}");
    let warning = find(
        &report.warnings,
        "spec.devices.requests[0].exactly.deviceClassName",
    );
    assert!(
        warning
            .message
            .contains("device class `missing-class` was not found"),
        "{warning:?}"
    );
}

// ------------------------------------------------------------------ constraints and capacity

#[test]
fn constraints_and_capacity_requests_are_checked_against_the_schema() {
    let object = claim(json!({
        "requests": [
            {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2,
                "capacity": {"requests": {"memry": "10Gi", "gpu.nvidia.com/memory": "1Gi", "other.example.com/x": "1"}}}},
            {"name": "migs", "exactly": {"deviceClassName": "mig.nvidia.com", "count": 2}},
        ],
        "constraints": [
            {"requests": ["gpus"], "matchAttribute": "gpu.nvidia.com/nvlinkDomian"},
            {"requests": ["gpus"], "matchAttribute": "gpu.nvidia.com/memory"},
            {"requests": ["migs"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"},
            {"requests": ["gpus"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"},
            {"requests": ["migs"], "matchAttribute": "resource.kubernetes.io/pcieRoot"},
        ],
    }));
    let report = validate(&object);
    let base = "spec.devices.constraints";
    let typo = find(&report.errors, &format!("{base}[0].matchAttribute"));
    assert_eq!(
        typo.hint.as_deref(),
        Some("gpu.nvidia.com/nvlinkDomain"),
        "{typo:?}"
    );
    let capacity = find(&report.errors, &format!("{base}[1].matchAttribute"));
    assert!(capacity.message.contains("is a capacity"), "{capacity:?}");
    let never = find(&report.errors, &format!("{base}[2].matchAttribute"));
    assert!(
        never.message.contains("published only on full GPUs"),
        "{never:?}"
    );
    let memry = find(
        &report.errors,
        "spec.devices.requests[0].exactly.capacity.requests.memry",
    );
    assert_eq!(memry.hint.as_deref(), Some("memory"));
    assert_eq!(report.errors.len(), 4, "{:#?}", report.errors);
}

// ------------------------------------------------------------------ not ours

#[test]
fn objects_of_other_drivers_and_kinds_are_untouched() {
    let validator = Validator::new(DRIVER);
    let lookup = classes();
    let untouched = [
        // another driver's class and claim, with mistakes we would flag
        lookup.device_class("nic.example.com").unwrap(),
        claim(json!({
            "requests": [{"name": "nic", "exactly": {"deviceClassName": "nic.example.com", "selectors": [
                {"cel": {"expression": "device.attributes['memory'] >= 40000"}}]}}],
            "config": [{"opaque": {"driver": "nic.example.com", "parameters": {"anything": true}}}],
        })),
        class(
            "amd",
            &["device.driver == 'gpu.amd.com' && device.attributes['uuid'] == 'x'"],
        ),
        // an unknown class and no config of ours
        claim(
            json!({"requests": [{"name": "x", "exactly": {"deviceClassName": "unknown", "selectors": [
            {"cel": {"expression": "device.attributes['gpu.nvidia.com'].memry > 1"}}]}}]}),
        ),
        // other kinds and groups
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "spec": {"driver": DRIVER}}),
        json!({"apiVersion": "example.com/v1", "kind": "DeviceClass", "spec": {"selectors": [
            {"cel": {"expression": "device.driver == 'gpu.nvidia.com' &&"}}]}}),
        // not objects at all
        json!(null),
        json!([1, 2]),
        json!("DeviceClass"),
        json!({"kind": 5, "apiVersion": ["x"]}),
    ];
    for object in untouched {
        let report = validator.validate(&object, &lookup);
        assert!(!report.ours, "{object}: {report:#?}");
        assert!(
            report.errors.is_empty() && report.warnings.is_empty(),
            "{object}: {report:#?}"
        );
        assert!(report.is_ok());
    }
}

// ------------------------------------------------------------------ malformed and hostile

#[test]
fn malformed_objects_get_errors_with_paths() {
    let cases = [
        (
            claim(
                json!({"requests": "gpu", "config": [opaque(&[], gpu_config(json!({"strategy": "TimeSlicing"})))]}),
            ),
            "spec.devices.requests",
            "must be a list, not a string",
        ),
        (
            claim(
                json!({"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": 5}}]}}]}),
            ),
            "spec.devices.requests[0].exactly.selectors[0].cel.expression",
            "must be a string, not a number",
        ),
        (
            claim(
                json!({"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [7]}}]}),
            ),
            "spec.devices.requests[0].exactly.selectors[0]",
            "must be an object, not a number",
        ),
        (
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "c"},
                   "spec": {"selectors": {"cel": "device.driver == 'gpu.nvidia.com'"}}}),
            "spec.selectors",
            "must be a list, not an object",
        ),
        (
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "t"},
                   "spec": {"spec": {"devices": {"requests": [], "config": [{"requests": [1], "opaque": {"driver": DRIVER, "parameters": gpu_config(json!({"strategy": "TimeSlicing"}))}}]}}}}),
            "spec.spec.devices.config[0].requests[0]",
            "must be a string, not a number",
        ),
        (
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "t"},
                   "spec": ["gpu.nvidia.com"]}),
            "spec",
            "must be an object",
        ),
    ];
    for (object, path, message) in cases {
        let report = validate(&object);
        assert!(report.ours, "{object}");
        let finding = find(&report.errors, path);
        assert!(finding.message.contains(message), "{finding:?}");
    }
}

#[test]
fn huge_objects_are_answered_with_errors() {
    // 10,000 requests of our class, each with a selector
    let requests: Vec<Value> = (0..10_000)
        .map(|i| {
            json!({"name": format!("r{i}"), "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [
                {"cel": {"expression": format!("device.attributes['gpu.nvidia.com'].index == {i}")}}]}})
        })
        .collect();
    let report = validate(&claim(json!({"requests": requests})));
    assert!(report.ours);
    let limit = find(&report.errors, "spec.devices.requests");
    assert!(
        limit
            .message
            .contains("has 10000 entries; Kubernetes allows at most 32"),
        "{limit:?}"
    );

    // a 1 MB expression
    let expression = format!(
        "device.driver == 'gpu.nvidia.com' && {}",
        "true && ".repeat(125_000) + "true"
    );
    assert!(expression.len() > 1_000_000);
    let report = validate(&class("big", &[&expression]));
    assert!(report.ours);
    let too_long = find(&report.errors, "spec.selectors[0].cel.expression");
    assert!(
        too_long
            .message
            .contains("more than the 10240 bytes allowed"),
        "{too_long:?}"
    );

    // the longest allowed expression, full of typos: findings are capped
    let typo = "device.attributes['gpu.nvidia.com'].memry == 1 || ";
    let expression = format!(
        "device.driver == 'gpu.nvidia.com' && ({}false)",
        typo.repeat(10_000 / typo.len() - 1)
    );
    assert!(expression.len() <= 10 * 1024, "{}", expression.len());
    let analysis = Validator::new(DRIVER)
        .check_selector(&expression, gpu_dra_analysis::validate::DeviceSet::ALL);
    assert!(
        analysis.diagnostics.len() <= 21,
        "{}",
        analysis.diagnostics.len()
    );
    assert!(
        analysis
            .diagnostics
            .last()
            .unwrap()
            .finding
            .message
            .contains("more findings in this selector are not shown"),
        "{:?}",
        analysis.diagnostics.last()
    );
}

#[test]
fn many_distinct_classes_are_resolved_a_bounded_number_of_times() {
    struct Counting(Cell<usize>);
    impl ClassLookup for Counting {
        fn device_class(&self, _name: &str) -> Option<Value> {
            self.0.set(self.0.get() + 1);
            None
        }
    }
    let lookup = Counting(Cell::new(0));
    let requests: Vec<Value> = (0..5_000)
        .map(|i| json!({"name": format!("r{i}"), "firstAvailable": (0..20).map(|j| json!({"name": format!("s{j}"), "deviceClassName": format!("class-{i}-{j}")})).collect::<Vec<_>>()}))
        .collect();
    let object = claim(
        json!({"requests": requests, "config": [opaque(&[], gpu_config(json!({"strategy": "TimeSlicing"})))]}),
    );
    let report = Validator::new(DRIVER).validate(&object, &lookup);
    assert!(report.ours);
    assert!(lookup.0.get() <= 64, "{} lookups", lookup.0.get());
}

#[test]
fn deeply_nested_json_is_rejected_without_recursion_trouble() {
    // nesting as deep as serde_json parses by default, in the parameters
    let mut nested = json!(1);
    for _ in 0..120 {
        let mut level = serde_json::Map::new();
        level.insert("a".to_owned(), nested);
        nested = Value::Object(level);
    }
    let parameters = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": nested});
    let object = claim(json!({
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
        "config": [opaque(&["gpu"], parameters)],
    }));
    let report = validate(&object);
    let finding = find(&report.errors, "spec.devices.config[0].opaque.parameters");
    assert!(
        finding.message.contains("nesting deeper than"),
        "{finding:?}"
    );

    // and deeper than that where selectors are expected: the walk does not
    // descend into it
    // (built by hand: `json!` would serialise it recursively)
    let mut deep = json!("gpu.nvidia.com");
    for _ in 0..5_000 {
        deep = Value::Array(vec![deep]);
    }
    let mut object = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "c"},
                            "spec": {"selectors": []}});
    object["spec"]["selectors"] = Value::Array(vec![deep]);
    let report = validate(&object);
    assert!(report.ours, "the driver's name is in the malformed part");
    let finding = find(&report.errors, "spec.selectors[0]");
    assert!(
        finding.message.contains("must be an object, not a list"),
        "{finding:?}"
    );
    // serde_json drops nested values recursively; unwind it by hand
    let mut current = object["spec"]["selectors"][0].take();
    while let Value::Array(mut items) = current {
        current = items.pop().unwrap_or(Value::Null);
    }
}

#[test]
fn reports_serialise_for_the_webhook_and_the_cli() {
    let report = validate(&class(
        "c",
        &["device.attributes['gpu.nvidia.com'].memry > 1"],
    ));
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["ours"], true);
    assert_eq!(json["kind"], "DeviceClass");
    assert_eq!(
        json["errors"][0]["path"],
        "spec.selectors[0].cel.expression"
    );
    assert!(json["errors"][0]["hint"].is_string());
    assert!(json["warnings"].is_array());
}

// ------------------------------------------------------------------ VFIO

fn vfio_config(iommu: Option<Value>) -> Value {
    let mut v = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig"});
    if let Some(iommu) = iommu {
        v["iommu"] = iommu;
    }
    v
}

/// NVIDIA's VFIO claims (KubeVirt passthrough) pass unchanged: the class,
/// no config, and each backend policy with or without the API device.
#[test]
fn nvidia_vfio_claims_pass() {
    for config in [
        None,
        Some(vfio_config(None)),
        Some(vfio_config(Some(json!({"backendPolicy": "LegacyOnly"})))),
        Some(vfio_config(Some(
            json!({"backendPolicy": "PreferIommuFD", "enableAPIDevice": true}),
        ))),
    ] {
        let mut devices = json!({
            "requests": [{"name": "vfio-gpu", "exactly": {"deviceClassName": "vfio.gpu.nvidia.com"}}],
        });
        if let Some(config) = &config {
            devices["config"] = json!([opaque(&["vfio-gpu"], config.clone())]);
        }
        assert_clean(&validate(&claim(devices)));
    }
}

/// Bad VFIO configs are denied at the field, and a VFIO config on a
/// request for full GPUs (or a GPU config on VFIO devices) names the kind
/// to use.
#[test]
fn bad_vfio_configs_are_denied_with_paths() {
    let object = claim(json!({
        "requests": [
            {"name": "vm", "exactly": {"deviceClassName": "vfio.gpu.nvidia.com"}},
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
        ],
        "config": [
            opaque(&["vm"], vfio_config(Some(json!({"backendPolicy": "RequireIommuFD"})))),
            opaque(&["vm"], vfio_config(Some(json!({})))),
            opaque(&["vm"], vfio_config(Some(json!({"backendPolicy": "LegacyOnly", "enableAPIDevice": 1})))),
            opaque(&["gpu"], vfio_config(None)),
            opaque(&["vm"], gpu_config(json!({"strategy": "TimeSlicing"}))),
        ],
    }));
    let report = validate(&object);
    let base = "spec.devices.config";
    let policy = find(
        &report.errors,
        &format!("{base}[0].opaque.parameters.iommu.backendPolicy"),
    );
    assert!(
        policy
            .message
            .contains("unknown variant `RequireIommuFD`, expected `LegacyOnly` or `PreferIommuFD`"),
        "{policy:?}"
    );
    let missing = find(
        &report.errors,
        &format!("{base}[1].opaque.parameters.iommu.backendPolicy"),
    );
    assert_eq!(
        missing.message,
        "required when iommu is given: LegacyOnly or PreferIommuFD"
    );
    let api = find(
        &report.errors,
        &format!("{base}[2].opaque.parameters.iommu.enableAPIDevice"),
    );
    assert!(api.message.contains("expected a boolean"), "{api:?}");
    let on_gpu = find(&report.errors, &format!("{base}[3].opaque.parameters"));
    assert!(
        on_gpu
            .message
            .contains("a VfioDeviceConfig cannot be applied to full GPUs")
            && on_gpu.message.contains("use a GpuConfig"),
        "{on_gpu:?}"
    );
    let on_vfio = find(&report.errors, &format!("{base}[4].opaque.parameters"));
    assert!(
        on_vfio
            .message
            .contains("a GpuConfig cannot be applied to VFIO passthrough GPUs")
            && on_vfio.message.contains("use a VfioDeviceConfig"),
        "{on_vfio:?}"
    );
    assert_eq!(report.errors.len(), 5, "{:#?}", report.errors);
}
