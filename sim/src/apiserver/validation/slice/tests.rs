use serde_json::{Value, json};

use super::*;
use crate::apiserver::resources::Resource;
use crate::apiserver::validation::validate_create;

fn device(i: usize) -> Value {
    json!({
        "name": format!("gpu-{i}"),
        "attributes": {
            "type": {"string": "gpu"},
            "index": {"int": i},
            "driverVersion": {"version": "550.54.15"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"}
        },
        "capacity": {"memory": {"value": "80Gi"}}
    })
}

fn slice_with(devices: usize) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu.nvidia.com-abcde"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": "node-a", "generation": 0, "resourceSliceCount": 1},
            "nodeName": "node-a",
            "devices": (0..devices).map(device).collect::<Vec<_>>()
        }
    })
}

fn errors(obj: &Value, rules: ValidationRules) -> Vec<String> {
    let mut errs = Errors::new(Resource::ResourceSlices);
    validate(&mut errs, obj.as_object().unwrap(), None, rules);
    errs.fields.iter().map(ToString::to_string).collect()
}

fn both(obj: &Value) -> (Vec<String>, Vec<String>) {
    (
        errors(obj, ValidationRules::V1_34),
        errors(obj, ValidationRules::V1_35),
    )
}

#[test]
fn a_full_valid_slice_passes_both_rule_sets() {
    let (a, b) = both(&slice_with(128));
    assert!(a.is_empty(), "{a:?}");
    assert!(b.is_empty(), "{b:?}");
    assert!(
        validate_create(
            Resource::ResourceSlices,
            &slice_with(3),
            ValidationRules::V1_35
        )
        .is_ok()
    );
}

#[test]
fn too_many_devices() {
    let (a, b) = both(&slice_with(129));
    let want = ["spec.devices: Too many: 129: must have at most 128 items"];
    assert_eq!(a, want);
    assert_eq!(b, want);
}

#[test]
fn taints_lower_the_device_limit_from_1_35() {
    let mut s = slice_with(65);
    s["spec"]["devices"][0]["taints"] =
        json!([{"key": "example.com/unhealthy", "effect": "NoSchedule"}]);
    let (a, b) = both(&s);
    assert!(a.is_empty(), "{a:?}");
    assert_eq!(
        b,
        ["spec.devices: Too many: 65: must have at most 64 items"]
    );
    let mut s = slice_with(64);
    s["spec"]["devices"][0]["taints"] = json!([{"key": "k", "effect": "NoSchedule"}]);
    assert!(errors(&s, ValidationRules::V1_35).is_empty());
}

#[test]
fn taint_limits_and_effects_per_rule_set() {
    let mut s = slice_with(1);
    let taint = json!({"key": "k", "effect": "None"});
    s["spec"]["devices"][0]["taints"] = json!([taint, taint, taint, taint, taint]);
    let (a, b) = both(&s);
    assert_eq!(
        a,
        ["spec.devices[0].taints: Too many: 5: must have at most 4 items"]
    );
    assert!(b.is_empty(), "{b:?}");
    s["spec"]["devices"][0]["taints"] = json!([taint, {"key": "-bad", "value": "-x"}]);
    let a = errors(&s, ValidationRules::V1_34).join("\n");
    assert!(a.contains("spec.devices[0].taints[0].effect: Unsupported value: \"None\": supported values: \"NoExecute\", \"NoSchedule\""), "{a}");
    assert!(
        a.contains("spec.devices[0].taints[1].key: Invalid value: \"-bad\""),
        "{a}"
    );
    assert!(
        a.contains("spec.devices[0].taints[1].value: Invalid value: \"-x\""),
        "{a}"
    );
    assert!(
        a.contains("spec.devices[0].taints[1].effect: Required value"),
        "{a}"
    );
    s["spec"]["devices"][0]["taints"] = json!(vec![taint; 17]);
    assert_eq!(
        errors(&s, ValidationRules::V1_35),
        ["spec.devices[0].taints: Too many: 17: must have at most 16 items"]
    );
}

#[test]
fn attribute_values_and_names() {
    let mut s = slice_with(4);
    s["spec"]["devices"][3]["attributes"]["productName"] = json!({"string": "x".repeat(65)});
    s["spec"]["devices"][2]["attributes"]["driverVersion"] = json!({"version": "550.54"});
    s["spec"]["devices"][1]["attributes"]["9lives"] = json!({"bool": true});
    s["spec"]["devices"][1]["attributes"]["Bad_Domain/x"] = json!({"bool": true});
    s["spec"]["devices"][0]["attributes"]["both"] = json!({"bool": true, "int": 1});
    s["spec"]["devices"][0]["attributes"]["none"] = json!({});
    let (a, b) = both(&s);
    assert_eq!(a, b);
    let all = b.join("\n");
    for want in [
        "spec.devices[3].attributes[productName].string: Too long: may not be more than 64 bytes",
        "spec.devices[2].attributes[driverVersion].version: Invalid value: \"550.54\": must be a string compatible with semver.org spec 2.0.0",
        "spec.devices[1].attributes: Invalid value: \"9lives\": a valid C identifier",
        "spec.devices[1].attributes: Invalid value: \"Bad_Domain\": a lowercase RFC 1123 subdomain",
        "spec.devices[0].attributes[both]: Invalid value: {\"bool\":true,\"int\":1}: exactly one value must be specified",
        "spec.devices[0].attributes[none]: Invalid value: \"\": exactly one value must be specified",
    ] {
        assert!(all.contains(want), "missing {want} in\n{all}");
    }
    assert_eq!(b.len(), 6, "{all}");
}

#[test]
fn attributes_and_capacity_share_a_limit_of_32() {
    let mut s = slice_with(1);
    let attrs: serde_json::Map<String, Value> = (0..30)
        .map(|i| (format!("attr_{i}"), json!({"int": i})))
        .collect();
    s["spec"]["devices"][0]["attributes"] = Value::Object(attrs);
    s["spec"]["devices"][0]["capacity"] = json!({"a": {"value": "1"}, "b": {"value": "2"}});
    assert!(errors(&s, ValidationRules::V1_35).is_empty());
    s["spec"]["devices"][0]["capacity"]["c"] = json!({"value": "3"});
    assert_eq!(
        errors(&s, ValidationRules::V1_35),
        [
            "spec.devices[0]: Invalid value: 33: the total number of attributes and capacities must not exceed 32"
        ]
    );
}

#[test]
fn names_of_slice_driver_pool_and_devices() {
    let mut s = slice_with(2);
    s["spec"]["devices"][1]["name"] = json!("GPU_1");
    s["spec"]["devices"][0]["name"] = json!("gpu-1");
    s["spec"]["driver"] = json!(format!("{}.com", "d".repeat(60)));
    s["spec"]["pool"]["name"] = json!("node-a/Bad");
    let all = errors(&s, ValidationRules::V1_35).join("\n");
    for want in [
        "spec.driver: Too long: may not be more than 63 bytes",
        "spec.pool.name: Invalid value: \"Bad\"",
        "spec.devices[1].name: Invalid value: \"GPU_1\": a lowercase RFC 1123 label",
    ] {
        assert!(all.contains(want), "missing {want} in\n{all}");
    }
    let mut s = slice_with(2);
    s["spec"]["devices"][1]["name"] = json!("gpu-0");
    assert_eq!(
        errors(&s, ValidationRules::V1_35),
        ["spec.devices[1]: Duplicate value: \"gpu-0\""]
    );
    // Uppercase driver names pass: the API server lowercases before checking.
    s["spec"]["devices"][1]["name"] = json!("gpu-1");
    s["spec"]["driver"] = json!("GPU.nvidia.com");
    assert!(errors(&s, ValidationRules::V1_35).is_empty());
}

#[test]
fn node_selection_is_exactly_one() {
    let mut s = slice_with(1);
    s["spec"]["allNodes"] = json!(true);
    assert_eq!(
        errors(&s, ValidationRules::V1_35),
        [
            "spec: Invalid value: \"{`nodeName`, `allNodes`}\": exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple fields are set"
        ]
    );
    let spec = s["spec"].as_object_mut().unwrap();
    spec.remove("allNodes");
    spec.remove("nodeName");
    assert_eq!(
        errors(&s, ValidationRules::V1_35),
        [
            "spec: Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
        ]
    );
    s["spec"]["allNodes"] = json!(false);
    s["spec"]["nodeSelector"] = json!({"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "Bogus"}]}
    ]});
    let all = errors(&s, ValidationRules::V1_35).join("\n");
    assert!(
        all.contains("spec.allNodes: Invalid value: false: must be either unset or set to true"),
        "{all}"
    );
    assert!(
        all.contains("spec.nodeSelector.nodeSelectorTerms: Invalid value"),
        "{all}"
    );
    assert!(all.contains("spec.nodeSelector.nodeSelectorTerms[1].matchExpressions[0].operator: Unsupported value: \"Bogus\""), "{all}");
}

#[test]
fn per_device_node_selection() {
    let mut s = slice_with(3);
    let spec = s["spec"].as_object_mut().unwrap();
    spec.remove("nodeName");
    spec.insert("perDeviceNodeSelection".into(), json!(true));
    s["spec"]["devices"][0]["nodeName"] = json!("node-a");
    s["spec"]["devices"][1]["allNodes"] = json!(true);
    s["spec"]["devices"][1]["nodeName"] = json!("node-b");
    let all = errors(&s, ValidationRules::V1_35);
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(
        all[0].starts_with("spec.devices[1]: Invalid value: \"{`nodeName`, `allNodes`}\""),
        "{all:?}"
    );
    assert!(all[1].starts_with("spec.devices[2]: Required value: exactly one of `nodeName`, `nodeSelector`, or `allNodes`"), "{all:?}");
    let mut s = slice_with(1);
    s["spec"]["devices"][0]["nodeName"] = json!("node-a");
    assert_eq!(
        errors(&s, ValidationRules::V1_35),
        [
            "spec.devices[0]: Invalid value: null: `nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set to true in the ResourceSlice spec"
        ]
    );
}

#[test]
fn pool_numbers() {
    let mut s = slice_with(1);
    s["spec"]["pool"]["generation"] = json!(-1);
    s["spec"]["pool"]["resourceSliceCount"] = json!(0);
    assert_eq!(
        errors(&s, ValidationRules::V1_35),
        [
            "spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero",
            "spec.pool.generation: Invalid value: -1: must be greater than or equal to zero",
        ]
    );
}

fn counter_sets(n: usize, counters: usize) -> Value {
    json!((0..n)
        .map(|i| json!({
            "name": format!("gpu-{i}-counters"),
            "counters": (0..counters).map(|c| (format!("c{c}"), json!({"value": "1"}))).collect::<serde_json::Map<_, _>>()
        }))
        .collect::<Vec<_>>())
}

#[test]
fn devices_and_shared_counters_together() {
    let mut s = slice_with(2);
    s["spec"]["sharedCounters"] = counter_sets(1, 2);
    s["spec"]["devices"][0]["consumesCounters"] =
        json!([{"counterSet": "gpu-0-counters", "counters": {"c0": {"value": "1"}}}]);
    let (a, b) = both(&s);
    assert!(a.is_empty(), "{a:?}");
    assert_eq!(
        b,
        ["spec: Invalid value: \"\": only one of `sharedCounters` or `devices` is allowed"]
    );
}

#[test]
fn counter_set_limits_1_35() {
    let mut s = slice_with(0);
    s["spec"].as_object_mut().unwrap().remove("devices");
    s["spec"]["sharedCounters"] = counter_sets(9, 1);
    assert_eq!(
        errors(&s, ValidationRules::V1_35),
        ["spec.sharedCounters: Too many: 9: must have at most 8 items"]
    );
    s["spec"]["sharedCounters"] = counter_sets(8, 33);
    let errs = errors(&s, ValidationRules::V1_35);
    assert_eq!(errs.len(), 8);
    assert_eq!(
        errs[0],
        "spec.sharedCounters[0].counters: Too many: 33: must have at most 32 items"
    );
    s["spec"]["sharedCounters"] = counter_sets(8, 32);
    assert!(errors(&s, ValidationRules::V1_35).is_empty());
    // Under 1.34 rules the total over all sets is limited instead.
    assert_eq!(
        errors(&s, ValidationRules::V1_34),
        [
            "spec.sharedCounters: Invalid value: 256: the total number of shared counters must not exceed 32"
        ]
    );
}

#[test]
fn counter_set_names() {
    let mut s = slice_with(0);
    s["spec"].as_object_mut().unwrap().remove("devices");
    s["spec"]["sharedCounters"] = json!([
        {"name": "Bad_Name", "counters": {"memory": {"value": "1Gi"}}},
        {"name": "ok", "counters": {}},
        {"name": "ok", "counters": {"Bad": {"value": "1"}}}
    ]);
    let all = errors(&s, ValidationRules::V1_35);
    assert_eq!(all.len(), 4, "{all:?}");
    assert!(all[0].starts_with("spec.sharedCounters[0].name: Invalid value: \"Bad_Name\""));
    assert_eq!(all[1], "spec.sharedCounters[1].counters: Required value");
    assert!(all[2].starts_with("spec.sharedCounters[2].counters[Bad]: Invalid value: \"Bad\""));
    assert_eq!(all[3], "spec.sharedCounters[2]: Duplicate value: \"ok\"");
    assert_eq!(
        errors(&s, ValidationRules::V1_34)[3],
        "spec.sharedCounters[2].name: Duplicate value: \"ok\""
    );
}

#[test]
fn consumes_counters_1_35() {
    let mut s = slice_with(1);
    let consumption =
        |set: &str| json!({"counterSet": set, "counters": {"memory": {"value": "10Gi"}}});
    s["spec"]["devices"][0]["consumesCounters"] = json!([consumption("a"), consumption("a")]);
    assert_eq!(
        errors(&s, ValidationRules::V1_35),
        ["spec.devices[0].consumesCounters[1]: Duplicate value: \"a\""]
    );
    s["spec"]["devices"][0]["consumesCounters"] =
        json!([consumption("a"), consumption("b"), consumption("c")]);
    assert_eq!(
        errors(&s, ValidationRules::V1_35),
        ["spec.devices[0].consumesCounters: Too many: 3: must have at most 2 items"]
    );
    // 1.34 requires the counter sets to be in the same slice.
    s["spec"]["devices"][0]["consumesCounters"] = json!([consumption("a")]);
    assert_eq!(
        errors(&s, ValidationRules::V1_34),
        [
            "spec.devices[0].consumesCounters[0].counterSet: Invalid value: \"a\": must reference a counterSet defined in the ResourceSlice sharedCounters"
        ]
    );
    assert!(errors(&s, ValidationRules::V1_35).is_empty());
}

#[test]
fn consumes_counters_totals_1_34() {
    let mut s = slice_with(65);
    s["spec"]["sharedCounters"] = counter_sets(2, 16);
    let all_counters = |set: &str| json!({"counterSet": set, "counters": (0..16).map(|c| (format!("c{c}"), json!({"value": "1"}))).collect::<serde_json::Map<_, _>>()});
    for i in 0..64 {
        s["spec"]["devices"][i]["consumesCounters"] = json!([all_counters("gpu-0-counters")]);
    }
    s["spec"]["devices"][64]["consumesCounters"] = json!([all_counters("gpu-0-counters"), all_counters("gpu-1-counters"), {"counterSet": "gpu-1-counters", "counters": {"c0": {"value": "1"}, "nope": {"value": "1"}}}]);
    let all = errors(&s, ValidationRules::V1_34);
    assert_eq!(
        all,
        [
            "spec.devices[64].consumesCounters[2].counters: Invalid value: \"nope\": must reference a counter defined in the ResourceSlice sharedCounters",
            "spec.devices[64]: Invalid value: 34: the total number of counters must not exceed 32",
            "spec.devices: Invalid value: 1058: the total number of counters in devices must not exceed 1024",
        ]
    );
}

#[test]
fn capacity_rules() {
    let mut s = slice_with(1);
    s["spec"]["devices"][0]["capacity"] = json!({
        "memory": {"value": "80Gi", "requestPolicy": {"default": "1Gi", "validValues": ["1Gi"]}},
        "missing": {}
    });
    let all = errors(&s, ValidationRules::V1_35);
    assert_eq!(
        all,
        [
            "spec.devices[0].capacity[memory].requestPolicy: Forbidden: allowMultipleAllocations must be true",
            "spec.devices[0].capacity[missing].value: Required value",
        ]
    );
    s["spec"]["devices"][0]["allowMultipleAllocations"] = json!(true);
    s["spec"]["devices"][0]["capacity"] = json!({
        "memory": {"value": "80Gi", "requestPolicy": {"validValues": ["1Gi"], "validRange": {"min": "1Gi"}}},
        "cores": {"value": "8", "requestPolicy": {"validRange": {}}}
    });
    let all = errors(&s, ValidationRules::V1_35).join("\n");
    assert!(
        all.contains(
            "capacity[memory].requestPolicy: Forbidden: exactly one policy can be specified"
        ),
        "{all}"
    );
    assert!(all.contains("capacity[cores].requestPolicy.default: Required value: required when validRange is defined"), "{all}");
    assert!(
        all.contains("capacity[cores].requestPolicy.validRange.min: Required value"),
        "{all}"
    );
}

#[test]
fn binding_conditions() {
    let mut s = slice_with(1);
    s["spec"]["devices"][0]["bindingConditions"] = json!(["ready", "ready"]);
    s["spec"]["devices"][0]["bindingFailureConditions"] = json!(["ready"]);
    let all = errors(&s, ValidationRules::V1_35);
    assert_eq!(
        all,
        [
            "spec.devices[0].bindingConditions[1]: Duplicate value: \"ready\"",
            "spec.devices[0].bindingFailureConditions[0]: Invalid value: \"ready\": bindingFailureConditions must not overlap with bindingConditions",
        ]
    );
    s["spec"]["devices"][0]["bindingFailureConditions"] = json!(["a", "b", "c", "d", "e"]);
    assert!(
        errors(&s, ValidationRules::V1_35)
            .join("\n")
            .contains("bindingFailureConditions: Too many: 5: must have at most 4 items")
    );
}

#[test]
fn immutable_fields_on_update() {
    let old = slice_with(1);
    let mut new = old.clone();
    new["spec"]["driver"] = json!("other.example.com");
    new["spec"]["nodeName"] = json!("node-b");
    let mut errs = Errors::new(Resource::ResourceSlices);
    validate(
        &mut errs,
        new.as_object().unwrap(),
        Some(&old),
        ValidationRules::V1_35,
    );
    let all: Vec<String> = errs.fields.iter().map(ToString::to_string).collect();
    assert_eq!(
        all,
        [
            "spec.driver: Invalid value: \"other.example.com\": field is immutable",
            "spec.nodeName: Invalid value: \"node-b\": field is immutable",
        ]
    );
}

#[test]
fn wrong_json_types_are_bad_requests() {
    for (pointer, value) in [
        ("/spec/devices", json!("gpu-0")),
        ("/spec/pool/generation", json!("1")),
        ("/spec/pool/resourceSliceCount", json!(1.5)),
        ("/spec/devices/0/attributes/index", json!(3)),
        ("/spec/devices/0/attributes/index/int", json!("3")),
        ("/spec/devices/0/capacity/memory/value", json!("80 GiB")),
        ("/spec/nodeName", json!(["a"])),
    ] {
        let mut s = slice_with(1);
        *s.pointer_mut(pointer).unwrap() = value;
        let err =
            validate_create(Resource::ResourceSlices, &s, ValidationRules::V1_35).unwrap_err();
        assert_eq!(err.code, 400, "{pointer}: {}", err.message);
        assert!(
            err.message.starts_with(
                "ResourceSlice in version \"v1\" cannot be handled as a ResourceSlice: "
            ),
            "{}",
            err.message
        );
    }
}

#[test]
fn missing_spec() {
    let s = json!({"metadata": {"name": "x"}});
    let err = validate_create(Resource::ResourceSlices, &s, ValidationRules::V1_35).unwrap_err();
    assert_eq!(err.code, 422);
    assert_eq!(err.details.causes.len(), 4);
}
