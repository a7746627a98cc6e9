//! The selector corpus (`tests/data/selectors.yaml`): each selector's
//! expected outcome from the validator, and its result from the CEL engine
//! on reference devices as the plugin publishes them (taken from the
//! plugin's golden ResourceSlices). Both must agree: a device for which the
//! engine says true must be in the validator's `matches`, and a device on
//! which the engine fails must have been warned about or rejected.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gpu_dra_analysis::cel::{AttrValue, CelDevice, Compiler, EvalError};
use gpu_dra_analysis::validate::{Check, DeviceSet, Diagnostic, Severity, Validator};
use gpu_dra_api::quantity::Quantity;
use gpu_dra_api::schema::DeviceKind;
use serde::Deserialize;
use serde_json::Value;

const DRIVER: &str = "gpu.nvidia.com";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Corpus {
    devices: BTreeMap<String, DeviceSpec>,
    classes: BTreeMap<String, String>,
    selectors: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceSpec {
    kind: String,
    snapshot: Option<String>,
    #[serde(rename = "where")]
    filter: Option<BTreeMap<String, String>>,
    device: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    expression: String,
    #[serde(default)]
    note: Option<String>,
    #[serde(default = "any_class")]
    class: String,
    outcome: Outcome,
    #[serde(default)]
    messages: Vec<String>,
    #[serde(default)]
    warnings: Vec<String>,
    #[serde(default)]
    hint: Option<String>,
    #[serde(default)]
    eval: BTreeMap<String, Expect>,
}

fn any_class() -> String {
    "any".to_owned()
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
enum Outcome {
    Valid,
    ParseError,
    UnknownAttribute,
    TypeError,
    RuntimeError,
}

#[derive(Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(untagged)]
enum Expect {
    Bool(bool),
    Word(String),
}

/// What the engine said.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Result3 {
    True,
    False,
    Error(String),
}

impl Expect {
    fn matches(&self, got: &Result3) -> bool {
        match (self, got) {
            (Expect::Bool(true), Result3::True) | (Expect::Bool(false), Result3::False) => true,
            (Expect::Word(w), Result3::Error(_)) => w == "error",
            _ => false,
        }
    }
}

/// The outcome class of a check.
fn class_of(check: Check) -> Outcome {
    match check {
        Check::Syntax | Check::Limit | Check::Undeclared | Check::Unsupported => {
            Outcome::ParseError
        }
        Check::UnknownAttribute | Check::UnknownDomain | Check::UnknownField => {
            Outcome::UnknownAttribute
        }
        Check::TypeMismatch | Check::NotBool => Outcome::TypeError,
        _ => Outcome::RuntimeError,
    }
}

fn snapshot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../driver/tests/snapshots")
}

/// The first device of a golden snapshot (an insta file: a header, then
/// the JSON list of ResourceSlices) whose string attributes have the values
/// of `filter`.
fn snapshot_device(file: &str, filter: &BTreeMap<String, String>) -> Value {
    let path = snapshot_dir().join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let body = text
        .splitn(3, "---")
        .nth(2)
        .unwrap_or_else(|| panic!("{file}: no insta header"));
    let slices: Vec<Value> = serde_json::from_str(body).expect("snapshot body is JSON");
    slices
        .iter()
        .filter_map(|s| s.pointer("/spec/devices").and_then(Value::as_array))
        .flatten()
        .find(|d| {
            filter.iter().all(|(attribute, value)| {
                d.pointer(&format!("/attributes/{attribute}/string"))
                    .and_then(Value::as_str)
                    == Some(value.as_str())
            })
        })
        .unwrap_or_else(|| panic!("{file} has no device with {filter:?}"))
        .clone()
}

/// A ResourceSlice device as the CEL engine sees it.
fn cel_device(device: &Value) -> CelDevice {
    let mut out = CelDevice::new(DRIVER);
    let entries = |key: &str| {
        device
            .get(key)
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    for (name, value) in entries("attributes") {
        let attr = if let Some(s) = value.get("string").and_then(Value::as_str) {
            AttrValue::String(s.to_owned())
        } else if let Some(i) = value.get("int").and_then(Value::as_i64) {
            AttrValue::Int(i)
        } else if let Some(b) = value.get("bool").and_then(Value::as_bool) {
            AttrValue::Bool(b)
        } else if let Some(v) = value.get("version").and_then(Value::as_str) {
            AttrValue::version(v).expect("a semantic version")
        } else {
            panic!("attribute {name}: unknown value {value}")
        };
        out.add_attribute(&name, attr).expect("valid attribute");
    }
    for (name, value) in entries("capacity") {
        let quantity = value
            .get("value")
            .and_then(Value::as_str)
            .and_then(|q| Quantity::parse(q).ok())
            .unwrap_or_else(|| panic!("capacity {name}: bad value {value}"));
        out.add_capacity(&name, quantity).expect("valid capacity");
    }
    out
}

fn device_kind(kind: &str) -> DeviceKind {
    match kind {
        "gpu" => DeviceKind::Gpu,
        "mig_static" => DeviceKind::MigStatic,
        "mig_dynamic" => DeviceKind::MigDynamic,
        "vfio" => DeviceKind::Vfio,
        other => panic!("unknown device kind {other}"),
    }
}

fn evaluate(compiler: &Compiler, device: &CelDevice, expression: &str) -> Result3 {
    let selector = compiler
        .compile(expression)
        .unwrap_or_else(|e| panic!("`eval` given for an expression that does not compile: {e}"));
    match compiler.evaluator(device).matches(&selector) {
        Ok(true) => Result3::True,
        Ok(false) => Result3::False,
        Err(e @ (EvalError::NoSuchKey(_) | EvalError::Runtime(_) | EvalError::NotBool(_))) => {
            Result3::Error(e.to_string())
        }
        Err(e) => panic!("unexpected evaluation failure: {e}"),
    }
}

fn describe(diagnostics: &[Diagnostic]) -> String {
    diagnostics
        .iter()
        .map(|d| {
            format!(
                "    [{:?} {}] {}{}",
                d.severity,
                d.check,
                d.finding.message.replace('\n', "\n      "),
                d.finding
                    .hint
                    .as_ref()
                    .map(|h| format!("\n      hint: {h}"))
                    .unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_selector_corpus_holds() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/selectors.yaml");
    let text = std::fs::read_to_string(&path).expect("corpus file");
    let corpus: Corpus = yaml_serde::from_str(&text).expect("corpus parses");
    let compiler = std::sync::Arc::new(Compiler::new());
    let validator = Validator::with_compiler(DRIVER, std::sync::Arc::clone(&compiler));

    let devices: BTreeMap<&str, (DeviceKind, CelDevice)> = corpus
        .devices
        .iter()
        .map(|(name, spec)| {
            let raw = match (&spec.snapshot, &spec.filter, &spec.device) {
                (Some(file), Some(filter), None) => snapshot_device(file, filter),
                (None, None, Some(device)) => device.clone(),
                _ => panic!("device {name}: give either snapshot and where, or device"),
            };
            (name.as_str(), (device_kind(&spec.kind), cel_device(&raw)))
        })
        .collect();
    // the reference devices are what the corpus says they are
    for (name, (kind, device)) in &devices {
        let expression = format!(
            "device.attributes['{DRIVER}'].type == '{}'",
            kind.type_value()
        );
        assert_eq!(
            evaluate(&compiler, device, &expression),
            Result3::True,
            "device {name}"
        );
    }
    let reach_of = |class: &str| -> DeviceSet {
        if class == "deviceclass" {
            return DeviceSet::ALL;
        }
        let expression = corpus
            .classes
            .get(class)
            .unwrap_or_else(|| panic!("unknown class {class}"));
        let analysis = validator.check_selector(expression, DeviceSet::ALL);
        assert!(
            analysis.diagnostics.is_empty(),
            "class {class}: {:?}",
            analysis.diagnostics
        );
        analysis.matches
    };

    let mut failures: Vec<String> = Vec::new();
    let mut per_outcome: BTreeMap<Outcome, usize> = BTreeMap::new();
    for (i, case) in corpus.selectors.iter().enumerate() {
        *per_outcome.entry(case.outcome).or_default() += 1;
        let mut problems: Vec<String> = Vec::new();
        let reach = reach_of(&case.class);
        let analysis = validator.check_selector(&case.expression, reach);
        let errors: Vec<&Diagnostic> = analysis
            .diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .collect();
        let warnings: Vec<&Diagnostic> = analysis
            .diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Warning)
            .collect();
        // the validator's verdict
        let got = errors.first().map_or(Outcome::Valid, |d| class_of(d.check));
        if got != case.outcome {
            problems.push(format!("outcome {got:?}, expected {:?}", case.outcome));
        }
        for fragment in &case.messages {
            if !errors.iter().any(|d| d.finding.message.contains(fragment)) {
                problems.push(format!("no error contains {fragment:?}"));
            }
        }
        if case.warnings.is_empty() && !warnings.is_empty() {
            problems.push("unexpected warnings".to_owned());
        }
        for fragment in &case.warnings {
            if !warnings
                .iter()
                .any(|d| d.finding.message.contains(fragment))
            {
                problems.push(format!("no warning contains {fragment:?}"));
            }
        }
        if let Some(hint) = &case.hint
            && !analysis
                .diagnostics
                .iter()
                .any(|d| d.finding.hint.as_deref() == Some(hint.as_str()))
        {
            problems.push(format!("no hint is {hint:?}"));
        }
        // the engine's verdict, and its agreement with the validator
        for (name, expect) in &case.eval {
            let Some((kind, device)) = devices.get(name.as_str()) else {
                problems.push(format!("unknown device {name}"));
                continue;
            };
            if case.class != "deviceclass" {
                let class = &corpus.classes[&case.class];
                if evaluate(&compiler, device, class) != Result3::True {
                    problems.push(format!("device {name} is not in class {}", case.class));
                    continue;
                }
            }
            let result = evaluate(&compiler, device, &case.expression);
            if !expect.matches(&result) {
                problems.push(format!(
                    "on {name}: engine says {result:?}, expected {expect:?}"
                ));
            }
            if result == Result3::True && !analysis.matches.contains(*kind) {
                problems.push(format!(
                    "true on {name}, but the validator says it matches only {}",
                    analysis.matches
                ));
            }
            if matches!(result, Result3::Error(_)) && analysis.diagnostics.is_empty() {
                problems.push(format!("fails on {name} ({result:?}) without any finding"));
            }
        }
        if !problems.is_empty() {
            failures.push(format!(
                "#{i} {}{}\n  {}\n  findings:\n{}",
                case.expression,
                case.note
                    .as_ref()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default(),
                problems.join("\n  "),
                describe(&analysis.diagnostics)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} corpus entries fail:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert!(
        corpus.selectors.len() >= 60,
        "the corpus has {} selectors",
        corpus.selectors.len()
    );
    for outcome in [
        Outcome::Valid,
        Outcome::ParseError,
        Outcome::UnknownAttribute,
        Outcome::TypeError,
        Outcome::RuntimeError,
    ] {
        assert!(
            per_outcome.get(&outcome).copied().unwrap_or(0) >= 5,
            "fewer than 5 {outcome:?} selectors: {per_outcome:?}"
        );
    }
}
