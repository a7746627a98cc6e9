//! The Kubernetes CEL libraries (quantity, semver, strings, regex, sets,
//! `cel.bind`): results and run-time errors.

use super::*;

/// Each expression must evaluate to true against an H100.
fn all_true(expressions: &[&str]) {
    let compiler = Compiler::new();
    for expression in expressions {
        assert!(check(&compiler, expression), "{expression}");
    }
}

/// Each expression must fail at run time with a message containing the
/// fragment.
fn all_fail(cases: &[(&str, &str)]) {
    let compiler = Compiler::new();
    for (expression, fragment) in cases {
        match eval(&compiler, &h100(), expression) {
            Err(EvalError::Runtime(message)) => {
                assert!(message.contains(fragment), "{expression}: {message}");
            }
            other => panic!("{expression}: {other:?}"),
        }
    }
}

#[test]
fn quantities_behave_like_kubernetes() {
    all_true(&[
        "quantity('1Gi').isGreaterThan(quantity('1000Mi'))",
        "!quantity('1G').isGreaterThan(quantity('1Gi'))",
        "quantity('1G').isLessThan(quantity('1Gi'))",
        "quantity('1Gi') == quantity('1024Mi')",
        "quantity('1Gi') != quantity('1G')",
        "quantity('1Gi').compareTo(quantity('1073741824')) == 0",
        "quantity('1k').compareTo(quantity('999')) == 1",
        "quantity('500m').compareTo(quantity('1')) == -1",
        "quantity('1.5Gi').asInteger() == 1610612736",
        "quantity('7Ei').isInteger()",
        "!quantity('8Ei').isInteger()",
        "!quantity('1.5').isInteger()",
        "quantity('-2').sign() == -1 && quantity('0').sign() == 0 && quantity('1n').sign() == 1",
        "quantity('1.5').asApproximateFloat() == 1.5",
        "quantity('1Gi').add(quantity('1Gi')) == quantity('2Gi')",
        "quantity('1Gi').add(1) == quantity('1073741825')",
        "quantity('1').sub(quantity('1m')) == quantity('999m')",
        "quantity('10').sub(11).sign() == -1",
        "isQuantity('10Gi') && isQuantity('1e3') && isQuantity('-1.5m')",
        "!isQuantity('10GB') && !isQuantity('') && !isQuantity('Gi') && !isQuantity('1e400')",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('79Gi')) > 0",
        "device.capacity['gpu.nvidia.com'].memory.isLessThan(quantity('80Gi'))",
        "device.capacity['gpu.nvidia.com'].memory.asInteger() == 81559 * 1024 * 1024",
    ]);
    all_fail(&[
        ("quantity('8Ei').asInteger() > 0", "overflows int64"),
        ("quantity('1.5').asInteger() > 0", "not a whole number"),
        ("quantity('10GB').sign() == 1", "unknown suffix"),
        ("quantity('1e1000').sign() == 1", "out of range"),
        ("quantity('1').isGreaterThan(1)", "no matching overload"),
        ("quantity('1') < quantity('2')", ""),
        ("quantity(1) == quantity('1')", "no matching overload"),
    ]);
}

#[test]
fn semantic_versions_behave_like_kubernetes() {
    all_true(&[
        "semver('1.2.3').major() == 1 && semver('1.2.3').minor() == 2 && semver('1.2.3').patch() == 3",
        "semver('2.0.0').isGreaterThan(semver('1.99.99'))",
        "semver('1.0.0-alpha').isLessThan(semver('1.0.0'))",
        "semver('1.0.0-alpha.1').compareTo(semver('1.0.0-alpha.beta')) == -1",
        "semver('1.0.0+build.1') == semver('1.0.0+build.2')",
        "semver('1.0.0+build.1').compareTo(semver('1.0.0')) == 0",
        "semver('v1.02', true) == semver('1.2.0')",
        "semver('3', true).compareTo(semver('3.0.0')) == 0",
        "semver('1.2.3-rc.1+b', true) == semver('1.2.3-rc.1')",
        "isSemver('1.2.3') && !isSemver('1.2') && !isSemver('v1.2.3') && !isSemver('01.2.3')",
        "isSemver('v1.2', true) && !isSemver('1.2.3.4', true) && !isSemver('x', true)",
        "device.attributes['gpu.nvidia.com'].driverVersion.major() == 550",
        "device.attributes['gpu.nvidia.com'].cudaComputeCapability.compareTo(semver('8.0.0')) > 0",
        "device.attributes['gpu.nvidia.com'].driverVersion == semver('550.54.15')",
    ]);
    all_fail(&[
        ("semver('1.2').major() == 1", "invalid semantic version"),
        ("semver('1.2.3.4', true).major() == 1", "more than three"),
        (
            "semver('1.0.0').isGreaterThan(quantity('1'))",
            "no matching overload",
        ),
        ("semver('1.0.0') < semver('2.0.0')", ""),
    ]);
}

#[test]
fn string_extensions() {
    all_true(&[
        "'NVIDIA A100'.lowerAscii() == 'nvidia a100'",
        "'nvidia é'.upperAscii() == 'NVIDIA é'",
        "'a,b,,c'.split(',') == ['a', 'b', '', 'c']",
        "'a,b,c'.split(',', 2) == ['a', 'b,c']",
        "'a,b'.split(',', 0) == []",
        "'héllo'.split('') == ['h', 'é', 'l', 'l', 'o']",
        "'abc'.split('', 2) == ['a', 'bc']",
        "['a', 'b'].join() == 'ab' && ['a', 'b'].join('-') == 'a-b' && [].join('-') == ''",
        "'aaa'.replace('a', 'b') == 'bbb' && 'aaa'.replace('a', 'b', 2) == 'bba' && 'aaa'.replace('a', 'b', -1) == 'bbb'",
        "'ab'.replace('', '-') == '-a-b-'",
        "'héllo'.substring(1) == 'éllo' && 'héllo'.substring(1, 3) == 'él' && 'abc'.substring(3) == ''",
        "'héllo'.charAt(1) == 'é' && 'abc'.charAt(3) == ''",
        "'abcabc'.indexOf('c') == 2 && 'abcabc'.indexOf('c', 3) == 5 && 'abc'.indexOf('x') == -1",
        "'héllo'.indexOf('l') == 2 && 'abc'.indexOf('') == 0 && 'abc'.indexOf('a', 5) == -1",
        "'abcabc'.lastIndexOf('c') == 5 && 'abcabc'.lastIndexOf('c', 4) == 2 && 'abc'.lastIndexOf('') == 3",
        "'héllo'.lastIndexOf('l') == 3 && 'abc'.lastIndexOf('abcd') == -1",
        "'  x \\t\\n'.trim() == 'x'",
        "strings.quote('a\"b\\n') == '\"a\\\\\"b\\\\n\"'",
        "'%s has %d GiB (%.1f%%)'.format(['GPU', 80, 12.5]) == 'GPU has 80 GiB (12.5%)'",
        "'%x %X %o %b %e'.format([255, 255, 8, 5, 1500.0]) == 'ff FF 10 101 1.500000e+03'",
        "'%s'.format([[1, 'a', true]]) == '[1, a, true]'",
        "'%s'.format([quantity('1.5Gi')]) == '1536Mi'",
        "device.attributes['gpu.nvidia.com'].productName.split(' ')[1] == 'H100'",
        "device.attributes['gpu.nvidia.com'].uuid.substring(0, 4) == 'GPU-'",
    ]);
    all_fail(&[
        ("'abc'.charAt(4) == ''", "index out of range: 4"),
        ("'abc'.charAt(-1) == ''", "index out of range: -1"),
        ("'abc'.substring(2, 1) == ''", "invalid substring range"),
        ("'abc'.substring(4) == ''", "index out of range: 4"),
        ("'abc'.indexOf('a', -1) == 0", "index out of range: -1"),
        ("[1, 2].join() == ''", "not a string"),
        ("'%d'.format(['x']) == ''", "%d does not format a string"),
        ("'%s %s'.format(['x']) == ''", "too few arguments"),
        ("'%s'.format(['x', 'y']) == ''", "too many arguments"),
        ("'%q'.format(['x']) == ''", "unknown verb"),
    ]);
}

#[test]
fn regular_expressions() {
    all_true(&[
        "'NVIDIA A100-SXM4-40GB'.matches('A100')",
        "matches('NVIDIA A100', '^NVIDIA')",
        "!'NVIDIA H100'.matches('^A100$')",
        "'gpu-0 gpu-12'.find('[0-9]+') == '0' && 'abc'.find('x') == ''",
        "'gpu-0 gpu-12'.findAll('[0-9]+') == ['0', '12'] && 'a1b2c3'.findAll('[0-9]', 2) == ['1', '2']",
        "device.attributes['gpu.nvidia.com'].productName.matches('(?i)h100')",
    ]);
    all_fail(&[
        ("'x'.matches('(')", "invalid regular expression"),
        ("'x'.matches('a{1000}{1000}')", "invalid regular expression"),
    ]);
}

#[test]
fn sets_bind_and_standard_library() {
    all_true(&[
        "sets.contains([1, 2, 3], [1, 3]) && !sets.contains([1], [2])",
        "sets.equivalent([1, 2, 1], [2, 1]) && !sets.equivalent([1], [1, 2])",
        "sets.intersects(['a', 'b'], ['b']) && !sets.intersects([1], [])",
        "cel.bind(name, device.attributes['gpu.nvidia.com'].productName, name.startsWith('NVIDIA') && name.contains('H100'))",
        "cel.bind(a, 2, cel.bind(b, a * 3, b == 6))",
        "device.attributes['gpu.nvidia.com'].index == 0.0",
        "device.attributes['gpu.nvidia.com'].index < 1u",
        "[1, 2, 3].exists(i, i == 2) && [1, 2, 3].all(i, i > 0) && [1, 2, 3].exists_one(i, i > 2)",
        "[1, 2, 3].map(i, i * 2) == [2, 4, 6] && [1, 2, 3].filter(i, i % 2 == 1) == [1, 3]",
        "[1, 2, 3].map(i, i > 1, i) == [2, 3]",
        "device.attributes['gpu.nvidia.com'].exists(k, k == 'profile') == false",
        "size('héllo') == 5 && 'abc'.startsWith('a') && 'abc'.endsWith('c') && 'abc'.contains('b')",
        "int('12') == 12 && string(12) == '12' && double(1) == 1.0 && type(1) == int",
        "bool('true') && bytes('a') == b'a' && uint(1) == 1u && dyn(1) == 1 && type('a') == string",
    ]);
    let compiler = Compiler::new();
    assert!(matches!(
        compiler.compile("cel.bind(1, 2, true)"),
        Err(CompileError::Syntax { rendered, .. }) if rendered.contains("simple identifier")
    ));
    all_fail(&[
        ("1 / 0 == 1", "ivision by zero"),
        ("9223372036854775807 + 1 > 0", "verflow"),
    ]);
}
