//! Unit tests of the validator's parts: device sets, the public types, and
//! details of the selector analysis (guards, scopes, positions, the shared
//! compiler cache). Whole objects and the selector corpus are tested in
//! `api/tests/`.

use std::sync::Arc;

use serde_json::json;

use super::*;
use gpu_dra_api::schema::DeviceKind;

const DRIVER: &str = "gpu.nvidia.com";

fn check(expression: &str, reach: DeviceSet) -> SelectorAnalysis {
    Validator::new(DRIVER).check_selector(expression, reach)
}

fn checks(analysis: &SelectorAnalysis) -> Vec<(Check, Severity)> {
    analysis
        .diagnostics
        .iter()
        .map(|d| (d.check, d.severity))
        .collect()
}

#[test]
fn device_sets_combine_and_describe_themselves() {
    let gpu = DeviceSet::of(DeviceKind::Gpu);
    let mig = DeviceSet::of_kinds(&[DeviceKind::MigStatic, DeviceKind::MigDynamic]);
    let vfio = DeviceSet::of(DeviceKind::Vfio);
    assert_eq!(gpu.union(mig).union(vfio), DeviceSet::OURS);
    assert_eq!(vfio.describe(), "VFIO passthrough GPUs");
    assert_eq!(DeviceSet::ALL.intersection(mig), mig);
    assert!(DeviceSet::ALL.has_other_drivers() && !DeviceSet::OURS.has_other_drivers());
    assert!(DeviceSet::NONE.is_empty());
    assert_eq!(
        DeviceSet::OURS.kinds().collect::<Vec<_>>(),
        DeviceKind::ALL.to_vec()
    );
    assert_eq!(gpu.describe(), "full GPUs");
    assert_eq!(mig.describe(), "MIG devices");
    assert_eq!(
        DeviceSet::of(DeviceKind::MigDynamic).describe(),
        "dynamic MIG devices"
    );
    assert_eq!(
        DeviceSet::ALL.describe(),
        "full GPUs, MIG devices, VFIO passthrough GPUs and devices of other drivers"
    );
    assert_eq!(DeviceSet::NONE.to_string(), "no device");
}

#[test]
fn static_classes_keep_named_device_classes_only() {
    let classes = StaticClasses::new([
        json!({"kind": "DeviceClass", "metadata": {"name": "a"}, "spec": {}}),
        json!({"kind": "DeviceClass", "metadata": {}}),
        json!({"kind": "ResourceClaim", "metadata": {"name": "b"}}),
        json!("not an object"),
    ]);
    assert!(classes.device_class("a").is_some());
    assert!(classes.device_class("b").is_none());
    assert!(classes.device_class("").is_none());
}

#[test]
fn check_names_are_their_serialised_form() {
    for check in [
        Check::Syntax,
        Check::Limit,
        Check::Undeclared,
        Check::Unsupported,
        Check::UnknownAttribute,
        Check::UnknownDomain,
        Check::UnknownField,
        Check::DomainKey,
        Check::TypeMismatch,
        Check::NotBool,
        Check::InvalidLiteral,
        Check::MissingAttribute,
        Check::ConditionalAttribute,
        Check::ForeignDomain,
        Check::OtherDriverDevice,
        Check::NeverMatches,
        Check::Config,
        Check::ConfigDeviceKind,
        Check::RequestReference,
        Check::UnknownClass,
        Check::Constraint,
        Check::Structure,
        Check::Internal,
    ] {
        assert_eq!(serde_json::to_value(check).unwrap(), json!(check.as_str()));
        assert_eq!(check.to_string(), check.as_str());
    }
}

#[test]
fn findings_serialise_flat_and_without_an_absent_hint() {
    let diagnostic = Diagnostic {
        check: Check::Config,
        severity: Severity::Warning,
        finding: Finding {
            path: "spec".to_owned(),
            message: "m".to_owned(),
            hint: None,
        },
    };
    assert_eq!(
        serde_json::to_value(&diagnostic).unwrap(),
        json!({"check": "config", "severity": "warning", "path": "spec", "message": "m"})
    );
    let report = Report {
        ours: true,
        kind: "DeviceClass".to_owned(),
        name: "c".to_owned(),
        errors: Vec::new(),
        warnings: vec![diagnostic.finding],
    };
    assert!(report.is_ok());
}

#[test]
fn the_validator_shares_the_compiler_cache() {
    let compiler = Arc::new(Compiler::new());
    let validator = Validator::with_compiler(DRIVER, Arc::clone(&compiler));
    assert_eq!(validator.driver(), DRIVER);
    assert!(Arc::ptr_eq(validator.compiler(), &compiler));
    let class = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "c"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}});
    let classes = StaticClasses::new([]);
    validator.validate(&class, &classes);
    let misses = compiler.cache_stats().misses;
    validator.validate(&class, &classes);
    let stats = compiler.cache_stats();
    assert_eq!(
        stats.misses, misses,
        "the second validation compiles nothing"
    );
    assert!(stats.hits >= 1);
}

#[test]
fn carets_point_at_the_name_read() {
    let analysis = check(
        "device.driver == 'gpu.nvidia.com' &&\n  device.attributes['gpu.nvidia.com'].memry.isGreaterThan(quantity('1'))",
        DeviceSet::ALL,
    );
    let message = &analysis.diagnostics[0].finding.message;
    assert!(message.starts_with("2:39: `memry`"), "{message}");
    assert!(
        message.ends_with(&format!(
            "\n |   device.attributes['gpu.nvidia.com'].memry.isGreaterThan(quantity('1'))\n | {}^",
            ".".repeat(38)
        )),
        "{message}"
    );
}

#[test]
fn guards_silence_conditional_and_missing_reads() {
    let d = "device.attributes['gpu.nvidia.com']";
    for expression in [
        format!("has({d}.driverVersion) && {d}.driverVersion.major() > 500"),
        format!("!has({d}.driverVersion) || {d}.driverVersion.major() > 500"),
        format!("has({d}.driverVersion) ? {d}.driverVersion.major() > 500 : false"),
        format!("'driverVersion' in {d} && {d}.driverVersion.major() > 500"),
        format!("{d}.?driverVersion.orValue(semver('0.0.0')).major() > 500"),
        format!("{d}.type == 'gpu' && {d}.index == 0"),
        format!("{d}.type != 'gpu' || {d}.index == 0"),
        format!("{d}.type == 'mig' ? {d}.profile == '1g.10gb' : {d}.uuid == 'x'"),
        format!("{d}.type == 'vfio' && {d}.deviceID == '0x2330'"),
        format!("{d}.type == 'vfio' || {d}.brand == 'Nvidia'"),
        format!("has({d}.profile) && {d}.profile == '1g.10gb'"),
    ] {
        let analysis = check(&expression, DeviceSet::OURS);
        assert!(
            analysis.diagnostics.is_empty(),
            "{expression}: {:#?}",
            analysis.diagnostics
        );
    }
    // the guard must cover the read
    let analysis = check(
        &format!("has({d}.driverVersion) || {d}.driverVersion.major() > 500"),
        DeviceSet::of_kinds(&[
            DeviceKind::Gpu,
            DeviceKind::MigStatic,
            DeviceKind::MigDynamic,
        ]),
    );
    assert_eq!(
        checks(&analysis),
        [(Check::ConditionalAttribute, Severity::Warning)]
    );
}

#[test]
fn device_kinds_narrow_through_the_selector() {
    let d = "device.attributes['gpu.nvidia.com']";
    let cases = [
        ("true", DeviceSet::OURS),
        (
            &*format!("{d}.type == 'gpu'"),
            DeviceSet::of(DeviceKind::Gpu),
        ),
        (
            &*format!("{d}.type in ['mig']"),
            DeviceSet::of_kinds(&[DeviceKind::MigStatic, DeviceKind::MigDynamic]),
        ),
        (
            &*format!("has({d}.uuid)"),
            DeviceSet::of_kinds(&[DeviceKind::Gpu, DeviceKind::MigStatic, DeviceKind::Vfio]),
        ),
        (
            &*format!("{d}.type == 'vfio'"),
            DeviceSet::of(DeviceKind::Vfio),
        ),
        (
            &*format!("{d}.?profile.hasValue()"),
            DeviceSet::of_kinds(&[DeviceKind::MigStatic, DeviceKind::MigDynamic]),
        ),
        (
            &*format!("!has({d}.index)"),
            DeviceSet::of_kinds(&[
                DeviceKind::MigStatic,
                DeviceKind::MigDynamic,
                DeviceKind::Vfio,
            ]),
        ),
        (&*format!("{d}.productName == 'x'"), DeviceSet::OURS),
    ];
    for (expression, expected) in cases {
        let analysis = check(expression, DeviceSet::OURS);
        assert_eq!(
            analysis.matches, expected,
            "{expression}: {:#?}",
            analysis.diagnostics
        );
    }
    // `device.driver` decides for other drivers' devices
    assert_eq!(
        check("device.driver == 'gpu.nvidia.com'", DeviceSet::ALL).matches,
        DeviceSet::OURS
    );
    assert_eq!(
        check("device.driver != 'gpu.nvidia.com'", DeviceSet::ALL).matches,
        DeviceSet::OTHER_DRIVERS
    );
}

#[test]
fn selectors_that_never_match_are_a_warning_with_the_reason() {
    let analysis = check(
        "has(device.attributes['gpu.nvidia.com'].nvlinkDomain)",
        DeviceSet::of_kinds(&[DeviceKind::MigStatic, DeviceKind::MigDynamic]),
    );
    assert_eq!(
        checks(&analysis),
        [(Check::NeverMatches, Severity::Warning)]
    );
    let message = &analysis.diagnostics[0].finding.message;
    assert!(
        message.contains(
            "on MIG devices, `has(device.attributes['gpu.nvidia.com'].nvlinkDomain)` is false"
        ),
        "{message}"
    );
    // a request whose class already lets nothing of ours through is not
    // blamed again
    assert!(
        check("false", DeviceSet::OTHER_DRIVERS)
            .diagnostics
            .is_empty()
    );
}

#[test]
fn scopes_and_bindings_are_typed() {
    // a comprehension variable named `device` shadows the device
    assert!(
        check("['a'].exists(device, device == 'a')", DeviceSet::OURS)
            .diagnostics
            .is_empty()
    );
    // a bound variable has the type of its value
    let analysis = check(
        "cel.bind(m, device.capacity['gpu.nvidia.com'].memory, m > 1)",
        DeviceSet::OURS.intersection(DeviceSet::of_kinds(&[
            DeviceKind::Gpu,
            DeviceKind::MigStatic,
            DeviceKind::MigDynamic,
        ])),
    );
    assert_eq!(checks(&analysis), [(Check::TypeMismatch, Severity::Error)]);
    // non-literal keys are not second-guessed
    assert!(
        check(
            "device.attributes['gpu.nvidia.com'].exists(k, k == 'type')",
            DeviceSet::OURS
        )
        .diagnostics
        .is_empty()
    );
}

#[test]
fn compile_errors_keep_their_kind() {
    let cases = [
        ("device.driver == ", Check::Syntax),
        ("x == 1", Check::Undeclared),
        ("device.driver.frobnicate()", Check::Undeclared),
        ("google.protobuf.Empty{} == 1", Check::Unsupported),
    ];
    for (expression, expected) in cases {
        let analysis = check(expression, DeviceSet::OURS);
        assert_eq!(
            checks(&analysis),
            [(expected, Severity::Error)],
            "{expression}"
        );
        assert_eq!(
            analysis.matches,
            DeviceSet::OURS,
            "unknown: all of the reach"
        );
    }
    let long = format!("device.driver == '{}'", "a".repeat(20_000));
    let analysis = check(&long, DeviceSet::OURS);
    assert_eq!(checks(&analysis), [(Check::Limit, Severity::Error)]);
    assert!(!analysis.is_ok());
}

#[test]
fn hints_fix_misspelt_variables_on_later_lines() {
    let analysis = check(
        "true &&\n  devise.driver == 'gpu.nvidia.com'",
        DeviceSet::OURS,
    );
    assert_eq!(
        analysis.diagnostics[0].finding.hint.as_deref(),
        Some("true &&\n  device.driver == 'gpu.nvidia.com'")
    );
    assert!(analysis.diagnostics[0].finding.message.starts_with("2:3: "));
}

#[test]
fn the_validator_can_be_shared_by_webhook_threads() {
    fn shareable<T: Send + Sync + 'static>(_: &T) {}
    let validator = Validator::new(DRIVER);
    shareable(&validator);
    shareable(&StaticClasses::default());
    let cloned = validator.clone();
    let analysis = std::thread::spawn(move || cloned.check_selector("true", DeviceSet::OURS))
        .join()
        .unwrap();
    assert_eq!(analysis.matches, DeviceSet::OURS);
}
