//! Property tests: hostile input never panics the test API server's store, validation, patch
//! and selector code, and a rejected write leaves the store exactly as it was.

use gpu_dra_sim::apiserver::{
    DeleteOptions, FieldSelector, LabelSelector, PatchBody, Resource, Selectors, Store,
    ValidationRules, WriteOptions,
};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Arbitrary JSON, biased towards the keys the server looks at.
fn json_value() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("apiVersion".to_owned()),
        Just("kind".to_owned()),
        Just("metadata".to_owned()),
        Just("name".to_owned()),
        Just("spec".to_owned()),
        Just("status".to_owned()),
        Just("devices".to_owned()),
        Just("attributes".to_owned()),
        Just("capacity".to_owned()),
        Just("sharedCounters".to_owned()),
        Just("consumesCounters".to_owned()),
        Just("counters".to_owned()),
        Just("taints".to_owned()),
        Just("pool".to_owned()),
        Just("driver".to_owned()),
        Just("nodeName".to_owned()),
        Just("nodeSelector".to_owned()),
        Just("labels".to_owned()),
        Just("ownerReferences".to_owned()),
        Just("managedFields".to_owned()),
        Just("resourceVersion".to_owned()),
        Just("reservedFor".to_owned()),
        Just("allocation".to_owned()),
        Just("requests".to_owned()),
        Just("op".to_owned()),
        Just("path".to_owned()),
        Just("value".to_owned()),
        Just("$patch".to_owned()),
        "[a-zA-Z/._$-]{0,12}",
        "\\PC{0,6}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        Just(json!("resource.k8s.io/v1")),
        Just(json!("ResourceSlice")),
        Just(json!("gpu.nvidia.com")),
        Just(json!("/spec/devices/0")),
        Just(json!("80Gi")),
        "\\PC{0,20}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn seeded_store() -> Store {
    let store = Store::new(ValidationRules::V1_35, 100, 64);
    let slice = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
                 "nodeName": "n", "devices": [{"name": "gpu-0"}]}
    });
    store
        .create(
            Resource::ResourceSlices,
            None,
            slice,
            &WriteOptions::default(),
        )
        .unwrap();
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
    });
    store
        .create(
            Resource::ResourceClaims,
            Some("default"),
            claim,
            &WriteOptions::default(),
        )
        .unwrap();
    store
}

fn snapshot(store: &Store) -> Vec<Value> {
    Resource::ALL
        .iter()
        .flat_map(|r| store.list(*r, None, &Selectors::default()).0)
        .collect()
}

fn manager() -> WriteOptions {
    WriteOptions {
        field_manager: Some("fuzzer".into()),
        ..WriteOptions::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn creates_never_panic_and_failures_store_nothing(body in json_value(), which in 0usize..Resource::ALL.len()) {
        let store = seeded_store();
        let resource = Resource::ALL[which];
        let before = snapshot(&store);
        let rv = store.resource_version();
        let ns = resource.info().namespaced.then_some("default");
        if store.create(resource, ns, body, &manager()).is_err() {
            prop_assert_eq!(snapshot(&store), before);
            prop_assert_eq!(store.resource_version(), rv);
        }
    }

    #[test]
    fn typed_garbage_in_a_slice_never_panics(spec in json_value()) {
        let store = seeded_store();
        let body = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                          "metadata": {"name": "fuzz"}, "spec": spec});
        let _ = store.create(Resource::ResourceSlices, None, body, &manager());
    }

    #[test]
    fn patches_never_panic_and_failures_change_nothing(
        patch in json_value(),
        kind in 0usize..2,
        status in any::<bool>(),
        force in any::<bool>(),
    ) {
        let store = seeded_store();
        let before = snapshot(&store);
        let patch = match kind {
            0 => PatchBody::Merge(patch),
            _ => PatchBody::Apply(patch),
        };
        let opts = WriteOptions { force, ..manager() };
        let (resource, ns, name) = if status {
            (Resource::ResourceClaims, Some("default"), "c")
        } else {
            (Resource::ResourceSlices, None, "s")
        };
        if store.patch(resource, ns, name, &patch, status, &opts).is_err() {
            prop_assert_eq!(snapshot(&store), before);
        }
    }

    #[test]
    fn updates_never_panic(body in json_value(), status in any::<bool>()) {
        let store = seeded_store();
        let before = snapshot(&store);
        if store
            .update(Resource::ResourceClaims, Some("default"), "c", body, status, &manager())
            .is_err()
        {
            prop_assert_eq!(snapshot(&store), before);
        }
    }

    #[test]
    fn selectors_never_panic(selector in "\\PC{0,40}", which in 0usize..Resource::ALL.len()) {
        let resource = Resource::ALL[which];
        let fields = FieldSelector::parse(resource, &selector);
        let labels = LabelSelector::parse(&selector);
        if let (Ok(fields), Ok(labels)) = (fields, labels) {
            let store = seeded_store();
            let selectors = Selectors { fields, labels };
            let _ = store.list(resource, None, &selectors);
            let _ = store.delete_collection(resource, None, &selectors, &DeleteOptions::default());
        }
    }
}
