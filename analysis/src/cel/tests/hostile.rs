//! Hostile expressions: the length, nesting, size and cost limits hold
//! before and while an expression runs, without panics or runaway work.

use super::*;

/// `[1, 2, ..., n]`
fn list(n: usize) -> String {
    let items: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
    format!("[{}]", items.join(","))
}

#[test]
fn the_length_limit_applies_before_parsing() {
    let compiler = Compiler::new();
    let prefix = "'";
    let suffix = "' == 'a'";
    let filler = 10 * 1024 - prefix.len() - suffix.len();
    let at_limit = format!("{prefix}{}{suffix}", "a".repeat(filler));
    assert_eq!(at_limit.len(), 10240);
    assert_eq!(eval(&compiler, &h100(), &at_limit), Ok(false));
    let over = format!("{prefix}{}{suffix}", "a".repeat(filler + 1));
    assert_eq!(
        compiler.compile(&over).unwrap_err(),
        CompileError::TooLong {
            len: 10241,
            max: 10240
        }
    );
    // garbage is not even parsed
    assert_eq!(
        compiler.compile(&"(".repeat(10241)).unwrap_err(),
        CompileError::TooLong {
            len: 10241,
            max: 10240
        }
    );
    // the limit is in bytes
    let wide = format!("'{}' == ''", "é".repeat(5200));
    assert!(
        matches!(compiler.compile(&wide), Err(CompileError::TooLong { len, .. }) if len > 10240)
    );
}

#[test]
fn deep_nesting_is_rejected_without_overflowing_the_stack() {
    let compiler = Compiler::new();
    for (what, expression) in [
        (
            "parentheses",
            format!("{}true{}", "(".repeat(3000), ")".repeat(3000)),
        ),
        (
            "lists",
            format!("{}1{} == 1", "[".repeat(3000), "]".repeat(3000)),
        ),
        (
            "calls",
            format!("{}'a'{} == 1", "size(".repeat(1500), ")".repeat(1500)),
        ),
        ("additions", format!("{} == 1", vec!["1"; 3000].join("+"))),
        ("selects", format!("device{} == 1", ".a".repeat(3000))),
        ("indexes", format!("device{} == 1", "['a']".repeat(1500))),
        ("methods", format!("'a'{} == ''", ".trim()".repeat(1200))),
        ("ternaries", format!("{}true", "true ? true : ".repeat(700))),
        (
            "negations",
            format!("{}1{} == 1", "-(".repeat(2000), ")".repeat(2000)),
        ),
        (
            "comprehensions",
            format!("{}true{}", "[1].all(x, ".repeat(600), ")".repeat(600)),
        ),
    ] {
        match compiler.compile(&expression) {
            Err(CompileError::TooDeep { max: 48, .. }) => {}
            other => panic!("{what}: {other:?}"),
        }
    }
    // long but shallow: && and || chains are balanced by the parser
    let wide = vec!["device.driver == 'x'"; 400].join(" || ");
    assert_eq!(eval(&compiler, &h100(), &wide), Ok(false));
}

#[test]
fn programs_deeper_than_the_inline_threshold_evaluate_on_their_own_stack() {
    let compiler = Compiler::new();
    // 40 nested additions: within the depth limit, beyond the inline one
    let expression = format!("{} == 40", vec!["1"; 40].join(" + "));
    let selector = compiler.compile(&expression).unwrap();
    assert!(!selector.inline);
    assert_eq!(compiler.evaluator(&h100()).matches(&selector), Ok(true));
    let shallow = compiler
        .compile("device.driver == 'gpu.nvidia.com'")
        .unwrap();
    assert!(shallow.inline);
}

#[test]
fn the_static_estimate_rejects_expensive_expressions_at_compile_time() {
    let compiler = Compiler::new();
    let l = list(100);
    for expression in [
        // 100^3 iterations
        format!("{l}.all(a, {l}.all(b, {l}.all(c, a + b + c > 0)))"),
        // exponential string growth through cel.bind
        {
            let mut e = "size(x30) > 0".to_owned();
            for i in (1..=30).rev() {
                e = format!("cel.bind(x{i}, x{} + x{}, {e})", i - 1, i - 1);
            }
            format!("cel.bind(x0, 'abcdefghijklmnop', {e})")
        },
        // a replace chain
        format!(
            "'aaaaaaaaaa'{} != ''",
            ".replace('a', 'aaaaaaaaaa')".repeat(12)
        ),
    ] {
        assert!(
            matches!(
                compiler.compile(&expression),
                Err(CompileError::CostTooHigh {
                    limit: 1_000_000,
                    ..
                })
            ),
            "{expression}"
        );
    }
    // realistic selectors are far below the limit
    let cheap = compiler
        .compile(
            "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$')",
        )
        .unwrap();
    assert!(cheap.estimated_cost() < 100, "{}", cheap.estimated_cost());
    let loop_over_device = compiler
        .compile("device.attributes['gpu.nvidia.com'].all(k, k.size() < 64)")
        .unwrap();
    assert!(
        loop_over_device.estimated_cost() < 5000,
        "{}",
        loop_over_device.estimated_cost()
    );
}

#[test]
fn the_runtime_meter_stops_nested_comprehensions() {
    let compiler = runtime_only(1_000_000);
    let l = list(200);
    let expression = format!("{l}.all(a, {l}.all(b, {l}.all(c, a + b + c > 0)))");
    assert_eq!(
        eval(&compiler, &h100(), &expression),
        Err(EvalError::CostLimitExceeded { limit: 1_000_000 })
    );
    // a budget large enough for the work lets it finish
    let generous = runtime_only(10_000_000);
    let l = list(20);
    let expression = format!("{l}.all(a, {l}.all(b, {l}.all(c, a + b + c > 0)))");
    assert_eq!(eval(&generous, &h100(), &expression), Ok(true));
    // the same with a smaller budget: stopped
    assert_eq!(
        eval(&runtime_only(20_000), &h100(), &expression),
        Err(EvalError::CostLimitExceeded { limit: 20_000 })
    );
}

#[test]
fn the_runtime_meter_stops_growing_strings_before_they_are_built() {
    let compiler = runtime_only(1_000_000);
    // 2^40 bytes through cel.bind doubling
    let mut e = "size(x40) > 0".to_owned();
    for i in (1..=40).rev() {
        e = format!("cel.bind(x{i}, x{} + x{}, {e})", i - 1, i - 1);
    }
    let doubling = format!("cel.bind(x0, 'abcdefghijklmnop', {e})");
    assert_eq!(
        eval(&compiler, &h100(), &doubling),
        Err(EvalError::CostLimitExceeded { limit: 1_000_000 })
    );
    // 10^13 bytes through replace
    let replace = format!(
        "'aaaaaaaaaa'{} != ''",
        ".replace('a', 'aaaaaaaaaa')".repeat(12)
    );
    assert_eq!(
        eval(&compiler, &h100(), &replace),
        Err(EvalError::CostLimitExceeded { limit: 1_000_000 })
    );
    // lists of lists through comprehensions
    let lists = format!(
        "{}.map(a, {}.map(b, {})).size() > 0",
        list(300),
        list(300),
        list(300)
    );
    assert_eq!(
        eval(&compiler, &h100(), &lists),
        Err(EvalError::CostLimitExceeded { limit: 1_000_000 })
    );
    // big values read in a loop are charged on every read: 16 KiB read
    // 1500 times
    let sixteen = "'aaaaaaaaaaaaaaaa'";
    let reads = format!(
        "cel.bind(big, 'aaaa'.replace('a', {sixteen}).replace('a', {sixteen}).replace('a', {sixteen}), \
         {}.all(i, !big.contains('b')))",
        list(1500)
    );
    assert_eq!(
        eval(&compiler, &h100(), &reads),
        Err(EvalError::CostLimitExceeded { limit: 1_000_000 })
    );
    // with fewer reads it completes
    let reads = reads.replace(&list(1500), &list(10));
    assert_eq!(eval(&compiler, &h100(), &reads), Ok(true));
}

#[test]
fn the_runtime_meter_charges_regex_compilation() {
    let compiler = runtime_only(1_000_000);
    // a different pattern on every iteration: each one is compiled
    let expression = format!(
        "{}.all(i, !'x'.matches('a{{' + string(i) + '}}'))",
        list(2000)
    );
    assert_eq!(
        eval(&compiler, &h100(), &expression),
        Err(EvalError::CostLimitExceeded { limit: 1_000_000 })
    );
    // the same pattern is compiled once and cheap to reuse
    let expression = format!("{}.all(i, !'x'.matches('a{{3}}'))", list(2000));
    assert_eq!(eval(&compiler, &h100(), &expression), Ok(true));
}

#[test]
fn every_evaluation_gets_a_fresh_budget() {
    let compiler = runtime_only(50_000);
    let selector = compiler
        .compile(&format!("{}.all(i, i > 0)", list(1000)))
        .unwrap();
    let evaluator = compiler.evaluator(&h100());
    for _ in 0..3 {
        assert_eq!(evaluator.matches(&selector), Ok(true));
    }
    let expensive = compiler
        .compile(&format!(
            "{}.all(i, {}.all(j, j > 0))",
            list(300),
            list(300)
        ))
        .unwrap();
    assert_eq!(
        evaluator.matches(&expensive),
        Err(EvalError::CostLimitExceeded { limit: 50_000 })
    );
    assert_eq!(evaluator.matches(&selector), Ok(true));
}

#[test]
fn the_deepest_inline_programs_fit_a_two_mebibyte_stack() {
    let compiler = Compiler::new();
    // the deepest program of each shape that is still evaluated inline
    let shapes: [fn(usize) -> String; 4] = [
        |n| format!("{} == {n}", vec!["1"; n].join(" + ")),
        |n| format!("{}true{}", "[1].all(x, ".repeat(n), ")".repeat(n)),
        |n| format!("{}'a'{} == 1", "size(".repeat(n), ")".repeat(n)),
        |n| format!("device{} == 1", ".a".repeat(n)),
    ];
    let mut deepest = Vec::new();
    for shape in shapes {
        let n = (1..48)
            .take_while(|&n| compiler.compile(&shape(n)).is_ok_and(|s| s.inline))
            .last()
            .unwrap();
        deepest.push(compiler.compile(&shape(n)).unwrap());
    }
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let evaluator = compiler.evaluator(&h100());
            for selector in &deepest {
                // a result or an error, but no stack overflow
                let _ = evaluator.matches(selector);
            }
            assert_eq!(evaluator.matches(&deepest[0]), Ok(true));
            assert_eq!(evaluator.matches(&deepest[1]), Ok(true));
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn mutated_selectors_never_panic() {
    let compiler = Compiler::new();
    let evaluator = compiler.evaluator(&mig("1g.12gb", "11Gi"));
    let seeds = [
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
        "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity(\"40Gi\"))",
        "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$')",
        "device.attributes[\"gpu.nvidia.com\"].driverVersion.compareTo(semver(\"550.54.15\")) >= 0",
        "cel.bind(x, [1,2,3].map(i, i * 2), x.exists(y, y > 4) && {'a': 1}.?a.orValue(0) == 1)",
        "'a,b'.split(',').join('-').replace('-', '+').substring(1) == '+b' ? 1u : -2.5",
    ];
    let alphabet: Vec<char> = "()[]{}.,?:!-+*/%<>=&|'\"\\ abcxyz019_@#eEnu"
        .chars()
        .collect();
    // xorshift: the same mutations on every run
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        usize::try_from(state % 1_000_003).unwrap()
    };
    let mut compiled = 0;
    for round in 0..600 {
        let mut chars: Vec<char> = seeds[round % seeds.len()].chars().collect();
        for _ in 0..=next() % 3 {
            let pos = next() % (chars.len() + 1);
            let c = alphabet[next() % alphabet.len()];
            match next() % 3 {
                0 if pos < chars.len() => {
                    chars.remove(pos);
                }
                1 if pos < chars.len() => chars[pos] = c,
                _ => chars.insert(pos, c),
            }
        }
        let input: String = chars.into_iter().collect();
        match compiler.compile(&input) {
            Err(CompileError::Internal(e)) => panic!("{input:?}: {e}"),
            Err(_) => {}
            Ok(selector) => {
                compiled += 1;
                if let Err(EvalError::Internal(e)) = evaluator.matches(&selector) {
                    panic!("{input:?}: {e}");
                }
            }
        }
    }
    // the mutations leave a fair share valid, so evaluation is exercised too
    assert!(compiled > 50, "{compiled}");
}
