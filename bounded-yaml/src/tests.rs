use std::fmt::Write as _;
use std::path::Path;

use serde_json::{Value, json};

use super::*;

#[test]
fn size_at_the_limit_passes_one_byte_over_is_refused() {
    let text = "a: 1\n";
    assert_eq!(to_value(text, text.len()).unwrap(), json!({"a": 1}));
    match to_value(text, text.len() - 1) {
        Err(Error::TooLarge { len: 5, limit: 4 }) => {}
        other => panic!("{other:?}"),
    }
    let e = check(text, 4).unwrap_err();
    assert_eq!(e.to_string(), "5 bytes, more than the 4 bytes allowed");
    assert_eq!(e.location(), None);
}

#[test]
fn depth_errors_say_where() {
    let text = "a: 1\nb: ".to_owned() + &"[".repeat(1000);
    let e = to_value(&text, usize::MAX).unwrap_err();
    assert_eq!(
        e.to_string(),
        "collections nested deeper than 128 levels at line 2 column 131"
    );
    assert_eq!(e.location(), Some((2, 131)));
    let e = from_str::<Value>(&text, usize::MAX).unwrap_err();
    assert!(matches!(e, Error::TooDeep { .. }), "{e}");
}

/// Nine levels of ten aliases each: 10^9 strings if expanded.
fn laughs() -> String {
    let mut text = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for level in 1..9 {
        let prev = format!("*a{}", level - 1);
        let items = [prev.as_str(); 10].join(", ");
        writeln!(text, "a{level}: &a{level} [{items}]").unwrap();
    }
    text
}

#[test]
fn alias_expansion_is_bounded() {
    let text = laughs();
    for e in [
        to_value(&text, usize::MAX).unwrap_err(),
        from_str::<Value>(&text, usize::MAX).unwrap_err(),
    ] {
        let message = e.to_string();
        assert!(
            message.contains(&format!(
                "expands to more than {} nodes",
                max_nodes(text.len())
            )),
            "{message}"
        );
        assert!(matches!(e, Error::Yaml(_)), "{e:?}");
    }
    // Ordinary alias use is fine.
    let text = "base: &base {cpu: 1, memory: 2}\na: *base\nb: [*base, *base]\n";
    let v = to_value(text, usize::MAX).unwrap();
    assert_eq!(v["b"][1], json!({"cpu": 1, "memory": 2}));
}

#[test]
fn the_budget_counts_every_node() {
    // A document whose aliases expand to just past the allowance.
    let n = 1_000;
    let anchor = format!("a: &a [{}]\n", vec!["x"; n].join(", "));
    let copies = ALIAS_ALLOWANCE / n + 1;
    let text = anchor.clone() + "b: [" + &vec!["*a"; copies].join(", ") + "]\n";
    assert!(
        to_value(&text, usize::MAX).is_ok(),
        "below the budget: {copies} copies"
    );
    let many = ALIAS_ALLOWANCE / n * 4;
    let text = anchor + "b: [" + &vec!["*a"; many].join(", ") + "]\n";
    let e = to_value(&text, usize::MAX).unwrap_err();
    assert!(e.to_string().contains("nodes (aliases expanded)"), "{e}");
}

#[test]
fn values_match_the_library() {
    let cases = [
        "",
        "a: 1\nb: [x, 2.5, true, null, ~]\nc: {d: e}\n",
        "- .nan\n- .inf\n- 18446744073709551615\n- -3\n",
        "a: |\n  text\n  more\nb: >-\n  folded\n  text\n",
        "? a\n: b\n",
        "1: one\ntrue: yes\n",
    ];
    for text in cases {
        let ours = to_value(text, usize::MAX).unwrap();
        let theirs: Value = yaml_serde::from_str(text).unwrap();
        assert_eq!(ours, theirs, "{text}");
    }
    for text in [
        "[1, 2",
        "a: b: c",
        "{[a]: 1}",
        "a: !tag 1\n",
        "- 1\n---\n- 2\n",
    ] {
        let ours = to_value(text, usize::MAX).unwrap_err().to_string();
        let theirs = yaml_serde::from_str::<Value>(text).unwrap_err().to_string();
        assert_eq!(ours, theirs, "{text}");
    }
}

#[test]
fn shipped_profiles_read_the_same() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/mock-nvml/profiles");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let theirs: Value = yaml_serde::from_str(&text).unwrap();
        assert_eq!(to_value(&text, 1 << 20).unwrap(), theirs);
        assert_eq!(from_str::<Value>(&text, 1 << 20).unwrap(), theirs);
        n += 1;
    }
    assert!(n >= 5);
}
