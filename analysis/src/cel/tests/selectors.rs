//! The real selectors (classes, MIG profiles, memory, product names,
//! driver versions) against realistic devices.

use std::sync::Arc;

use super::*;

const GPU_CLASS: &str =
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'";
const MIG_1G12: &str = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' && device.attributes['gpu.nvidia.com'].profile == '1g.12gb'";
const MEMORY_40GI: &str =
    "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity(\"40Gi\"))";
const A100_NAME: &str =
    "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$')";
const DRIVER_550: &str =
    "device.attributes[\"gpu.nvidia.com\"].driverVersion.compareTo(semver(\"550.54.15\")) >= 0";

#[test]
fn the_five_real_selectors() {
    let compiler = Compiler::new();
    let old_gpu = gpu("NVIDIA A100-PCIE-40GB", "40Gi", "535.104.5");
    let devices = [
        ("h100", h100()),
        ("a100", a100()),
        ("a100-old", old_gpu),
        ("mig-1g.12gb", mig("1g.12gb", "11008Mi")),
        ("mig-2g.24gb", mig("2g.24gb", "22144Mi")),
    ];
    // expected result per device, in the order above
    let cases: [(&str, [bool; 5]); 5] = [
        (GPU_CLASS, [true, true, true, false, false]),
        (MIG_1G12, [false, false, false, true, false]),
        // 40Gi is not greater than 40Gi
        (MEMORY_40GI, [true, false, false, false, false]),
        (A100_NAME, [false, true, true, false, false]),
        (DRIVER_550, [true, false, false, true, true]),
    ];
    for (expression, expected) in cases {
        let selector = compiler.compile(expression).unwrap();
        for ((name, device), want) in devices.iter().zip(expected) {
            let got = compiler.evaluator(device).matches(&selector);
            assert_eq!(got, Ok(want), "{name}: {expression}");
        }
    }
}

#[test]
fn a_missing_attribute_is_an_error_not_false() {
    let compiler = Compiler::new();
    // a full GPU has no `profile`: the MIG class selector's last term errors,
    // but only once `type == 'mig'` let evaluation reach it
    assert_eq!(eval(&compiler, &h100(), MIG_1G12), Ok(false));
    let unguarded = "device.attributes['gpu.nvidia.com'].profile == '1g.12gb'";
    assert_eq!(
        eval(&compiler, &h100(), unguarded),
        Err(EvalError::NoSuchKey("profile".to_owned()))
    );
    // MIG devices have no pciBusID
    let pci = "device.attributes['resource.kubernetes.io'].pciBusID.startsWith('0000:')";
    assert_eq!(eval(&compiler, &h100(), pci), Ok(true));
    assert_eq!(
        eval(&compiler, &mig("1g.12gb", "11Gi"), pci),
        Err(EvalError::NoSuchKey("pciBusID".to_owned()))
    );
    let capacity = "device.capacity['gpu.nvidia.com'].multiprocessors.isGreaterThan(quantity('8'))";
    assert_eq!(
        eval(&compiler, &h100(), capacity),
        Err(EvalError::NoSuchKey("multiprocessors".to_owned()))
    );
    assert_eq!(eval(&compiler, &mig("1g.12gb", "11Gi"), capacity), Ok(true));
    // guarded, the same lookups are fine
    for guarded in [
        "has(device.attributes['gpu.nvidia.com'].profile) && device.attributes['gpu.nvidia.com'].profile == '1g.12gb'",
        "device.attributes['gpu.nvidia.com'].?profile.orValue('') == '1g.12gb'",
        "'profile' in device.attributes['gpu.nvidia.com'] && device.attributes['gpu.nvidia.com'].profile == '1g.12gb'",
    ] {
        assert_eq!(eval(&compiler, &h100(), guarded), Ok(false), "{guarded}");
        assert_eq!(
            eval(&compiler, &mig("1g.12gb", "11Gi"), guarded),
            Ok(true),
            "{guarded}"
        );
    }
}

#[test]
fn an_unknown_domain_is_an_empty_map() {
    let compiler = Compiler::new();
    for (expression, want) in [
        ("size(device.attributes['dra.example.com']) == 0", true),
        ("has(device.attributes['dra.example.com'].model)", false),
        (
            "device.attributes['dra.example.com'].?model.orValue('none') == 'none'",
            true,
        ),
        (
            "device.attributes['dra.example.com'][?'model'].hasValue()",
            false,
        ),
        ("'dra.example.com' in device.attributes", false),
        ("'gpu.nvidia.com' in device.attributes", true),
        ("size(device.capacity['dra.example.com']) == 0", true),
        ("device.attributes['dra.example.com'].all(k, false)", true),
    ] {
        assert_eq!(check(&compiler, expression), want, "{expression}");
    }
    // a direct lookup of an id in it is still an error
    assert_eq!(
        eval(
            &compiler,
            &h100(),
            "device.attributes['dra.example.com'].model == 'x'"
        ),
        Err(EvalError::NoSuchKey("model".to_owned()))
    );
}

#[test]
fn unqualified_names_belong_to_the_driver_domain() {
    let mut device = CelDevice::new("dra.example.com");
    device
        .add_attribute("model", AttrValue::String("LATEST-GPU-MODEL".to_owned()))
        .unwrap();
    device
        .add_attribute("gpu.nvidia.com/model", AttrValue::Int(7))
        .unwrap();
    device.add_capacity("memory", q("1Gi")).unwrap();
    let compiler = Compiler::new();
    for expression in [
        "device.attributes['dra.example.com'].model == 'LATEST-GPU-MODEL'",
        "device.attributes['gpu.nvidia.com'].model == 7",
        "device.capacity['dra.example.com'].memory == quantity('1024Mi')",
        "device.driver == 'dra.example.com'",
        "!device.allowMultipleAllocations",
    ] {
        assert_eq!(
            eval(&compiler, &device, expression),
            Ok(true),
            "{expression}"
        );
    }
    device.allow_multiple_allocations = true;
    assert_eq!(
        eval(&compiler, &device, "device.allowMultipleAllocations"),
        Ok(true)
    );

    assert_eq!(
        split_qualified_name("d.io", "memory"),
        Ok(("d.io", "memory"))
    );
    assert_eq!(
        split_qualified_name("d.io", "x.io/memory"),
        Ok(("x.io", "memory"))
    );
    for bad in ["", "/memory", "x.io/", "a/b/c"] {
        assert!(
            matches!(
                split_qualified_name("d.io", bad),
                Err(DeviceError::InvalidName { .. })
            ),
            "{bad:?}"
        );
    }
    // `memory` and `<driver>/memory` are the same capacity
    assert_eq!(
        device.add_capacity("dra.example.com/memory", q("2Gi")),
        Err(DeviceError::Duplicate {
            domain: "dra.example.com".to_owned(),
            id: "memory".to_owned()
        })
    );
    assert!(matches!(
        AttrValue::version("550.54"),
        Err(DeviceError::InvalidVersion { .. })
    ));
}

#[test]
fn optional_syntax() {
    let compiler = Compiler::new();
    for (expression, want) in [
        (
            "device.attributes['gpu.nvidia.com'].?profile.orValue('none') == 'none'",
            true,
        ),
        (
            "device.attributes['gpu.nvidia.com'].?productName.orValue('') == 'NVIDIA H100 80GB HBM3'",
            true,
        ),
        (
            "device.attributes['gpu.nvidia.com'].?profile.hasValue()",
            false,
        ),
        (
            "device.attributes['gpu.nvidia.com'][?'index'].value() == 0",
            true,
        ),
        ("optional.of(1).or(optional.none()).value() == 1", true),
        ("optional.none().orValue(2) == 2", true),
        ("[?optional.none(), ?optional.of(3)] == [3]", true),
        ("{?'a': optional.none(), 'b': 1} == {'b': 1}", true),
        (
            "device.capacity['gpu.nvidia.com'].?memory.orValue(quantity('0')).isGreaterThan(quantity('79Gi'))",
            true,
        ),
    ] {
        assert_eq!(check(&compiler, expression), want, "{expression}");
    }
}

#[test]
fn results_must_be_bool() {
    let compiler = Compiler::new();
    for (expression, type_name) in [
        ("device.driver", "string"),
        ("device.attributes['gpu.nvidia.com'].index", "int"),
        (
            "device.capacity['gpu.nvidia.com'].memory",
            "kubernetes.Quantity",
        ),
        ("device.attributes['gpu.nvidia.com']", "map"),
        ("[true]", "list"),
        ("null", "null_type"),
    ] {
        assert_eq!(
            eval(&compiler, &h100(), expression),
            Err(EvalError::NotBool(type_name.to_owned())),
            "{expression}"
        );
    }
}

#[test]
fn parse_errors_carry_positions_and_never_panic() {
    let compiler = Compiler::new();
    for (expression, line, column) in [
        ("device.driver == ", 1, 18),
        ("a && (b ||", 1, 11),
        ("device.driver ==\n  'x' &&", 2, 9),
    ] {
        match compiler.compile(expression) {
            Err(CompileError::Syntax { errors, rendered }) => {
                assert_eq!(errors[0].0, Position { line, column }, "{expression}");
                assert!(rendered.contains('^'), "{rendered}");
            }
            other => panic!("{expression}: {other:?}"),
        }
    }
    // every prefix of the real selectors, and assorted garbage: an error or a
    // selector, never a panic
    let mut inputs: Vec<String> = Vec::new();
    for s in [GPU_CLASS, MIG_1G12, MEMORY_40GI, A100_NAME, DRIVER_550] {
        inputs.extend(s.char_indices().map(|(i, _)| s[..i].to_owned()));
    }
    inputs.extend(
        [
            "",
            " ",
            "(",
            ")",
            "[",
            "]",
            "{",
            "}",
            "'",
            "\"",
            "'''",
            "\\",
            "?",
            ":",
            ".",
            "..",
            ".?",
            "?.",
            "a.?",
            "[?",
            "{?",
            "1..2",
            "0x",
            "1e",
            "1e+",
            "9223372036854775808",
            "-9223372036854775809",
            "18446744073709551616u",
            "b'\\xff'",
            "'\\u12'",
            "'\\z'",
            "r'",
            "\u{0}",
            "\u{feff}device",
            "#",
            "$",
            "@in",
            "@cost(1, 2)",
            "device..driver",
            "device.driver.",
            "has()",
            "has(device)",
            "has(1)",
            "[1,2].all(1, true)",
            "[1,2].map(x)",
            "cel.bind(1, 2, 3)",
            "cel.bind(x, 1)",
            "device.driver in",
            "!",
            "-",
            "a ? b",
            "a ? b :",
            "x.y(",
            "Foo{",
            "Foo{a:}",
            "{1:}",
            "{,}",
            "[,]",
            "f(,)",
            "'unterminated",
        ]
        .map(str::to_owned),
    );
    // (a panic would be caught and reported as an internal error)
    let evaluator = compiler.evaluator(&h100());
    for input in &inputs {
        match compiler.compile(input) {
            Err(CompileError::Internal(e)) => panic!("{input:?}: {e}"),
            Err(_) => {}
            Ok(selector) => {
                if let Err(EvalError::Internal(e)) = evaluator.matches(&selector) {
                    panic!("{input:?}: {e}");
                }
            }
        }
    }
}

#[test]
fn undeclared_names_are_compile_errors_with_positions() {
    let compiler = Compiler::new();
    match compiler.compile("device.driver == 'x' ||\n  gpu.type == 'gpu'") {
        Err(CompileError::UndeclaredVariable {
            name,
            position,
            snippet,
        }) => {
            assert_eq!(name, "gpu");
            assert_eq!(position, Position { line: 2, column: 3 });
            assert_eq!(snippet, "\n |   gpu.type == 'gpu'\n | ..^");
        }
        other => panic!("{other:?}"),
    }
    for (expression, function) in [
        ("device.driver.bogus()", "bogus"),
        ("timestamp('2024-01-01T00:00:00Z') != null", "timestamp"),
        ("isURL('https://x')", "isURL"),
        ("lists.range(3).size() == 3", "range"),
    ] {
        match compiler.compile(expression) {
            Err(CompileError::UndeclaredFunction { name, .. }) => {
                assert_eq!(name, function, "{expression}");
            }
            other => panic!("{expression}: {other:?}"),
        }
    }
    assert!(matches!(
        compiler.compile("Foo{a: 1} == Foo{a: 1}"),
        Err(CompileError::Unsupported {
            what: "message construction",
            ..
        })
    ));
    // comprehension variables are declared inside their comprehension only
    assert!(compiler.compile("[1].all(x, x > 0)").is_ok());
    assert!(matches!(
        compiler.compile("[1].all(x, x > 0) && x > 0"),
        Err(CompileError::UndeclaredVariable { name, .. }) if name == "x"
    ));
    // namespaced functions, and a variable that shadows a namespace
    assert!(compiler.compile("sets.contains([1, 2], [1])").is_ok());
    assert!(compiler.compile("strings.quote('a') == '\"a\"'").is_ok());
    assert!(
        compiler
            .compile("['a'].all(sets, sets.contains('a'))")
            .is_ok()
    );
}

#[test]
fn compiled_selectors_are_cached() {
    let compiler = Compiler::with_limits(Limits {
        cache_capacity: 2,
        ..Limits::default()
    });
    let first = compiler.compile(GPU_CLASS).unwrap();
    let again = compiler.compile(GPU_CLASS).unwrap();
    assert!(Arc::ptr_eq(&first, &again));
    assert_eq!(
        compiler.cache_stats(),
        CacheStats {
            hits: 1,
            misses: 1,
            entries: 1
        }
    );
    // failures are not cached
    assert!(compiler.compile("device.driver ==").is_err());
    assert!(compiler.compile("device.driver ==").is_err());
    assert_eq!(compiler.cache_stats().misses, 3);
    // the least recently used selector is evicted
    compiler.compile(MIG_1G12).unwrap();
    compiler.compile(GPU_CLASS).unwrap();
    compiler.compile(A100_NAME).unwrap();
    assert_eq!(compiler.cache_stats().entries, 2);
    let hits = compiler.cache_stats().hits;
    assert!(Arc::ptr_eq(&first, &compiler.compile(GPU_CLASS).unwrap()));
    assert_eq!(compiler.cache_stats().hits, hits + 1);
    compiler.compile(MIG_1G12).unwrap();
    assert_eq!(
        compiler.cache_stats().hits,
        hits + 1,
        "MIG_1G12 was evicted"
    );
    assert_eq!(first.expression(), GPU_CLASS);
}

#[test]
fn one_evaluator_serves_many_selectors_and_threads() {
    let compiler = Arc::new(Compiler::new());
    let selectors: Vec<_> = [GPU_CLASS, MEMORY_40GI, DRIVER_550]
        .iter()
        .map(|s| compiler.compile(s).unwrap())
        .collect();
    let evaluator = compiler.evaluator(&h100());
    assert_eq!(
        evaluator.matches_all(selectors.iter().map(AsRef::as_ref)),
        Ok(true)
    );
    let evaluator = compiler.evaluator(&a100());
    assert_eq!(
        evaluator.matches_all(selectors.iter().map(AsRef::as_ref)),
        Ok(false)
    );
    // the compiler is shared between threads
    std::thread::scope(|s| {
        for device in [h100(), a100()] {
            let compiler = Arc::clone(&compiler);
            s.spawn(move || {
                let selector = compiler.compile(GPU_CLASS).unwrap();
                assert_eq!(compiler.evaluator(&device).matches(&selector), Ok(true));
            });
        }
    });
}
