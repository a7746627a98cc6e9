use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    Counter, Device, DeviceAttribute, DeviceCapacity, DeviceTaint, ResourcePool,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Serialize;

use super::*;

const NONE: Skip = &[];

fn device(memory: &str) -> Device {
    Device {
        name: "gpu-0".into(),
        attributes: Some(BTreeMap::from([(
            "uuid".to_owned(),
            DeviceAttribute {
                string: Some("GPU-1".into()),
                ..Default::default()
            },
        )])),
        capacity: Some(BTreeMap::from([(
            "memory".to_owned(),
            DeviceCapacity {
                value: Quantity(memory.into()),
                request_policy: None,
            },
        )])),
        ..Default::default()
    }
}

#[test]
fn equal_values_have_equal_digests_and_different_values_do_not() {
    assert_eq!(of(&device("80Gi"), NONE), of(&device("80Gi"), NONE));
    assert_ne!(of(&device("80Gi"), NONE), of(&device("40Gi"), NONE));
    let mut renamed = device("80Gi");
    renamed.name = "gpu-1".into();
    assert_ne!(of(&renamed, NONE), of(&device("80Gi"), NONE));
    // Strings, integers, booleans and floats never collide by kind.
    assert_ne!(of("1", NONE), of(&1_i64, NONE));
    assert_ne!(of(&true, NONE), of(&1_u8, NONE));
    assert_ne!(of(&1.0_f64, NONE), of(&1_i64, NONE));
    // Integers count by value, whatever their Rust type (as in JSON).
    assert_eq!(of(&7_u8, NONE), of(&7_i64, NONE));
    assert_eq!(of(&7_u128, NONE), of(&7_i32, NONE));
    assert_ne!(of(&u128::MAX, NONE), of(&-1_i128, NONE));
    // Keys and values do not run into each other.
    let a = BTreeMap::from([("ab", "c")]);
    let b = BTreeMap::from([("a", "bc")]);
    assert_ne!(of(&a, NONE), of(&b, NONE));
    // Order of list elements matters.
    assert_ne!(of(&["a", "b"], NONE), of(&["b", "a"], NONE));
}

#[test]
fn quantities_compare_by_value() {
    assert_eq!(of(&device("80Gi"), NONE), of(&device("85899345920"), NONE));
    assert_eq!(
        of(&Quantity("1k".into()), NONE),
        of(&Quantity("1e3".into()), NONE)
    );
    assert_ne!(
        of(&Quantity("1k".into()), NONE),
        of(&Quantity("1Ki".into()), NONE)
    );
    // Not a quantity: compared as text, and not equal to a real one.
    assert_eq!(
        of(&Quantity("x".into()), NONE),
        of(&Quantity("x".into()), NONE)
    );
    assert_ne!(of(&Quantity("1".into()), NONE), of("1", NONE));
}

#[test]
fn empty_and_absent_are_the_same() {
    let mut with_empties = device("80Gi");
    with_empties.taints = Some(Vec::new());
    with_empties.consumes_counters = Some(Vec::new());
    with_empties.binding_conditions = Some(Vec::new());
    with_empties.node_name = None;
    assert_eq!(of(&with_empties, NONE), of(&device("80Gi"), NONE));
    // A map whose values are all empty is empty.
    let nested: BTreeMap<&str, Option<Vec<u8>>> =
        BTreeMap::from([("a", None), ("b", Some(vec![]))]);
    assert_eq!(of(&nested, NONE), of(&(), NONE));
    assert_eq!(
        of(&Option::<String>::None, NONE),
        of(&BTreeMap::<String, String>::new(), NONE)
    );
    // But an empty string is a value.
    assert_ne!(of("", NONE), of(&(), NONE));
    // Inside a list an empty element keeps its place.
    assert_ne!(of(&[None, Some(1)], NONE), of(&[Some(1)], NONE));
}

#[test]
fn structs_hash_like_maps_with_the_same_keys() {
    #[derive(Serialize)]
    struct S {
        a: u32,
        b: &'static str,
    }
    #[derive(Serialize)]
    #[serde(untagged)]
    enum V {
        N(u32),
        S(&'static str),
    }
    let as_map = BTreeMap::from([("a", V::N(1)), ("b", V::S("x"))]);
    assert_eq!(of(&S { a: 1, b: "x" }, NONE), of(&as_map, NONE));
}

#[test]
fn server_set_times_are_left_out() {
    let taint = |time: Option<Time>| DeviceTaint {
        key: "gpu.nvidia.com/xid".into(),
        value: Some("79".into()),
        effect: "NoSchedule".into(),
        time_added: time,
    };
    let now = Time("2026-11-21T19:00:00Z".parse().unwrap());
    assert_eq!(of(&taint(Some(now)), NONE), of(&taint(None), NONE));
}

#[test]
fn skipped_fields_are_left_out_and_only_in_the_named_struct() {
    let pool = |generation| ResourcePool {
        generation,
        name: "node-a".into(),
        resource_slice_count: 5,
    };
    let skip: Skip = &[("ResourcePool", "generation")];
    assert_eq!(of(&pool(1), skip), of(&pool(9), skip));
    assert_ne!(of(&pool(1), NONE), of(&pool(9), NONE));
    let mut other = pool(1);
    other.resource_slice_count = 4;
    assert_ne!(of(&other, skip), of(&pool(1), skip));
    // A field of the same name elsewhere still counts.
    #[derive(Serialize)]
    struct Other {
        generation: i64,
    }
    assert_ne!(
        of(&Other { generation: 1 }, skip),
        of(&Other { generation: 2 }, skip)
    );
}

#[test]
fn enums_hash_like_their_json() {
    #[derive(Serialize)]
    enum E {
        Unit,
        New(u32),
        Tuple(u32, u32),
        Struct { a: u32 },
    }
    assert_eq!(of(&E::Unit, NONE), of("Unit", NONE));
    assert_eq!(
        of(&E::New(3), NONE),
        of(&BTreeMap::from([("New", 3)]), NONE)
    );
    assert_eq!(
        of(&E::Tuple(1, 2), NONE),
        of(&BTreeMap::from([("Tuple", [1, 2])]), NONE)
    );
    assert_eq!(
        of(&E::Struct { a: 1 }, NONE),
        of(
            &BTreeMap::from([("Struct", BTreeMap::from([("a", 1)]))]),
            NONE
        )
    );
    assert_eq!(of(&b"ab"[..], NONE), of(&[97_u8, 98], NONE));
}

#[test]
fn values_that_cannot_be_digested_equal_nothing() {
    struct Failing;
    impl Serialize for Failing {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no"))
        }
    }
    assert_ne!(of(&Failing, NONE), of(&Failing, NONE));
    // A Quantity must hold a string.
    #[derive(Serialize)]
    #[serde(rename = "Quantity")]
    struct BadQuantity(u32);
    assert_ne!(of(&BadQuantity(1), NONE), of(&BadQuantity(1), NONE));
}

#[test]
fn counters_normalise_too() {
    let c = |v: &str| Counter {
        value: Quantity(v.into()),
    };
    assert_eq!(of(&c("2Gi"), NONE), of(&c("2147483648"), NONE));
}
