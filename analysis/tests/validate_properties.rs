//! Property tests of the validator against the CEL engine and hostile input.
//!
//! Soundness of the selector analysis: random selectors over the schema's
//! attributes and capacities (comparisons, `has()`, `in`, optionals, foreign
//! domains, `device.driver`, `!`, `&&`, `||`, `?:`) are evaluated by the
//! real engine on devices of every kind, built from the schema with and
//! without their conditional attributes, and on devices of another driver.
//! Whenever the engine says true on a device, the validator must say the
//! selector can match that kind; whenever it fails on a device, the
//! validator must have reported something.
//!
//! Robustness of the object walk: arbitrary JSON made of the words the
//! validator looks for never panics, and objects that do not name the
//! driver are never ours.

use std::sync::{Arc, OnceLock};

use gpu_dra_analysis::cel::{AttrValue, CelDevice, Compiler};
use gpu_dra_analysis::validate::{DeviceSet, StaticClasses, Validator};
use gpu_dra_api::quantity::Quantity;
use gpu_dra_api::schema::{DeviceKind, Presence, SCHEMA, Section, ValueType};
use proptest::prelude::*;
use serde_json::{Map, Value};

const DRIVER: &str = "gpu.nvidia.com";
const OTHER: &str = "nic.example.com";

/// Something a selector can read: (section field, domain, id, type).
#[derive(Debug, Clone)]
struct Readable {
    field: &'static str,
    domain: String,
    id: String,
    value_type: ValueType,
}

fn readables() -> &'static [Readable] {
    static READABLES: OnceLock<Vec<Readable>> = OnceLock::new();
    READABLES.get_or_init(|| {
        let mut out: Vec<Readable> = SCHEMA
            .iter()
            .map(|e| {
                let (domain, id) = e.cel_key(DRIVER);
                Readable {
                    field: match e.section {
                        Section::Attribute => "attributes",
                        Section::Capacity => "capacity",
                    },
                    domain: domain.to_owned(),
                    id: id.to_owned(),
                    value_type: e.value_type,
                }
            })
            .collect();
        out.push(Readable {
            field: "attributes",
            domain: OTHER.to_owned(),
            id: "model".to_owned(),
            value_type: ValueType::String,
        });
        out
    })
}

/// Devices of every kind, with and without conditional entries, and two
/// devices of another driver.
fn devices() -> &'static [(Option<DeviceKind>, CelDevice)] {
    static DEVICES: OnceLock<Vec<(Option<DeviceKind>, CelDevice)>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let mut out = Vec::new();
        for kind in DeviceKind::ALL {
            for conditional in [true, false] {
                let mut device = CelDevice::new(DRIVER);
                for e in SCHEMA.iter().filter(|e| e.carried_by(kind)) {
                    if matches!(e.presence, Presence::When(_)) && !conditional {
                        continue;
                    }
                    match e.section {
                        Section::Capacity => device
                            .add_capacity(e.name, Quantity::from_units(1))
                            .unwrap(),
                        Section::Attribute => {
                            let value = match e.value_type {
                                ValueType::Int => AttrValue::Int(1),
                                ValueType::Bool => AttrValue::Bool(true),
                                ValueType::Version => AttrValue::version("1.0.0").unwrap(),
                                ValueType::String if e.name == "type" => {
                                    AttrValue::String(kind.type_value().to_owned())
                                }
                                ValueType::String | ValueType::Quantity => {
                                    AttrValue::String("x".to_owned())
                                }
                            };
                            device.add_attribute(e.name, value).unwrap();
                        }
                    }
                }
                out.push((Some(kind), device));
            }
        }
        for standard in [true, false] {
            let mut device = CelDevice::new(OTHER);
            device
                .add_attribute("model", AttrValue::String("x".to_owned()))
                .unwrap();
            if standard {
                device
                    .add_attribute(
                        "resource.kubernetes.io/pcieRoot",
                        AttrValue::String("x".to_owned()),
                    )
                    .unwrap();
            }
            out.push((None, device));
        }
        out
    })
}

/// A random selector.
#[derive(Debug, Clone)]
enum Sel {
    Literal(bool),
    Driver(bool),
    /// Read `readables()[i]` and compare with literal number `j`.
    Compare(usize, usize, bool),
    Has(usize),
    In(usize),
    Optional(usize, usize),
    Not(Box<Sel>),
    And(Box<Sel>, Box<Sel>),
    Or(Box<Sel>, Box<Sel>),
    Cond(Box<Sel>, Box<Sel>, Box<Sel>),
}

fn read(r: &Readable) -> String {
    format!("device.{}['{}'].{}", r.field, r.domain, r.id)
}

fn literal(r: &Readable, j: usize) -> String {
    match r.value_type {
        ValueType::Int => (j % 2).to_string(),
        ValueType::Bool => j.is_multiple_of(2).to_string(),
        ValueType::String => ["'x'", "'y'", "'gpu'", "'mig'"][j % 4].to_owned(),
        ValueType::Version => format!("semver('{}.0.0')", 1 + j % 2),
        ValueType::Quantity => format!("quantity('{}')", 1 + j % 2),
    }
}

fn render(sel: &Sel) -> String {
    let items = readables();
    match sel {
        Sel::Literal(b) => b.to_string(),
        Sel::Driver(ours) => format!("device.driver == '{}'", if *ours { DRIVER } else { OTHER }),
        Sel::Compare(i, j, eq) => {
            let r = &items[*i % items.len()];
            match r.value_type {
                ValueType::Version | ValueType::Quantity => format!(
                    "{}.compareTo({}) {} 0",
                    read(r),
                    literal(r, *j),
                    if *eq { "==" } else { ">=" }
                ),
                _ => format!(
                    "{} {} {}",
                    read(r),
                    if *eq { "==" } else { "!=" },
                    literal(r, *j)
                ),
            }
        }
        Sel::Has(i) => format!("has({})", read(&items[*i % items.len()])),
        Sel::In(i) => {
            let r = &items[*i % items.len()];
            format!("'{}' in device.{}['{}']", r.id, r.field, r.domain)
        }
        Sel::Optional(i, j) => {
            let r = &items[*i % items.len()];
            format!(
                "device.{}['{}'].?{}.orValue({}) == {}",
                r.field,
                r.domain,
                r.id,
                literal(r, *j + 1),
                literal(r, *j)
            )
        }
        Sel::Not(a) => format!("!({})", render(a)),
        Sel::And(a, b) => format!("({}) && ({})", render(a), render(b)),
        Sel::Or(a, b) => format!("({}) || ({})", render(a), render(b)),
        Sel::Cond(c, a, b) => format!("({}) ? ({}) : ({})", render(c), render(a), render(b)),
    }
}

fn selector() -> impl Strategy<Value = Sel> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(Sel::Literal),
        any::<bool>().prop_map(Sel::Driver),
        (0usize..64, 0usize..8, any::<bool>()).prop_map(|(i, j, eq)| Sel::Compare(i, j, eq)),
        (0usize..64).prop_map(Sel::Has),
        (0usize..64).prop_map(Sel::In),
        (0usize..64, 0usize..8).prop_map(|(i, j)| Sel::Optional(i, j)),
    ];
    leaf.prop_recursive(4, 24, 3, |inner| {
        prop_oneof![
            inner.clone().prop_map(|a| Sel::Not(Box::new(a))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Sel::And(Box::new(a), Box::new(b))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Sel::Or(Box::new(a), Box::new(b))),
            (inner.clone(), inner.clone(), inner).prop_map(|(c, a, b)| Sel::Cond(
                Box::new(c),
                Box::new(a),
                Box::new(b)
            )),
        ]
    })
}

fn validator() -> &'static (Arc<Compiler>, Validator) {
    static VALIDATOR: OnceLock<(Arc<Compiler>, Validator)> = OnceLock::new();
    VALIDATOR.get_or_init(|| {
        let compiler = Arc::new(Compiler::new());
        let validator = Validator::with_compiler(DRIVER, Arc::clone(&compiler));
        (compiler, validator)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn the_analysis_is_sound_against_the_engine(sel in selector()) {
        let (compiler, validator) = validator();
        let expression = render(&sel);
        let compiled = compiler.compile(&expression).expect("generated selectors compile");
        // as a class selector (every device) and as a request selector of
        // a class of every device of the driver
        for (reach, with_other) in [(DeviceSet::ALL, true), (DeviceSet::OURS, false)] {
            let analysis = validator.check_selector(&expression, reach);
            for (kind, device) in devices() {
                if kind.is_none() && !with_other {
                    continue;
                }
                let result = compiler.evaluator(device).matches(&compiled);
                match (result, kind) {
                    (Ok(true), Some(kind)) => prop_assert!(
                        analysis.matches.contains(*kind),
                        "{expression}: true on a {kind} device, but matches = {}",
                        analysis.matches
                    ),
                    (Ok(true), None) => prop_assert!(
                        analysis.matches.has_other_drivers(),
                        "{expression}: true on another driver's device, but matches = {}",
                        analysis.matches
                    ),
                    (Ok(false), _) => {}
                    (Err(error), _) => prop_assert!(
                        !analysis.diagnostics.is_empty(),
                        "{expression}: fails on {:?} ({error}) without a finding",
                        device.driver
                    ),
                }
            }
        }
    }
}

/// Arbitrary JSON over the validator's vocabulary.
fn json_value() -> impl Strategy<Value = Value> {
    let words = prop_oneof![
        Just("DeviceClass"),
        Just("ResourceClaim"),
        Just("ResourceClaimTemplate"),
        Just("resource.k8s.io/v1"),
        Just("resource.k8s.io/v1beta1"),
        Just("nic.example.com"),
        Just("device.driver == 'nic.example.com'"),
        Just("device.attributes['memory'] >= 1"),
        Just("device.attributes['example.com'].x == 1"),
        Just("GpuConfig"),
        Just("resource.nvidia.com/v1beta1"),
        Just("x"),
    ];
    let keys = prop_oneof![
        Just("kind"),
        Just("apiVersion"),
        Just("metadata"),
        Just("name"),
        Just("spec"),
        Just("devices"),
        Just("requests"),
        Just("exactly"),
        Just("firstAvailable"),
        Just("deviceClassName"),
        Just("selectors"),
        Just("cel"),
        Just("expression"),
        Just("config"),
        Just("opaque"),
        Just("driver"),
        Just("parameters"),
        Just("constraints"),
        Just("matchAttribute"),
        Just("capacity"),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|i| Value::from(i64::from(i))),
        words.prop_map(|w| Value::String(w.to_owned())),
    ];
    leaf.prop_recursive(6, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((keys.clone(), inner), 0..6).prop_map(|entries| {
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect::<Map<String, Value>>(),
                )
            }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn arbitrary_objects_never_panic_and_are_not_ours_without_the_driver(
        mut object in json_value(),
        kind in prop_oneof![Just("DeviceClass"), Just("ResourceClaim"), Just("ResourceClaimTemplate")],
    ) {
        let (_, validator) = validator();
        if let Value::Object(map) = &mut object {
            map.insert("kind".to_owned(), Value::from(kind));
            map.insert("apiVersion".to_owned(), Value::from("resource.k8s.io/v1"));
        }
        let classes = StaticClasses::new([object.clone()]);
        let report = validator.validate(&object, &classes);
        prop_assert!(!report.ours, "{object}: {report:?}");
        prop_assert!(report.errors.is_empty() && report.warnings.is_empty());
    }
}
