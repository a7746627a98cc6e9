use std::path::{Path, PathBuf};

use super::*;
use crate::MAX_DEPTH;

/// A named way to build an input `n` levels deep.
type Shape = (&'static str, fn(usize) -> String);

/// `n` flow sequences, nested and closed.
fn flow_seqs(n: usize) -> String {
    "[".repeat(n) + &"]".repeat(n)
}

/// `n` flow mappings, nested and closed.
fn flow_maps(n: usize) -> String {
    "{a: ".repeat(n) + "1" + &"}".repeat(n)
}

/// `n` block sequences on one line (`- - - x`).
fn compact_seqs(n: usize) -> String {
    "- ".repeat(n) + "x\n"
}

/// `n` block mappings, one per line, each indented one more step.
fn indented_maps(n: usize) -> String {
    (0..n).map(|k| " ".repeat(k) + "a:\n").collect::<String>() + &" ".repeat(n) + "x\n"
}

/// Depth of a parsed value (a scalar is 0).
fn depth_of(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(a) => 1 + a.iter().map(depth_of).max().unwrap_or(0),
        serde_json::Value::Object(o) => 1 + o.values().map(depth_of).max().unwrap_or(0),
        _ => 0,
    }
}

#[test]
fn the_limit_is_the_librarys_for_every_shape() {
    let shapes: [Shape; 4] = [
        ("flow sequences", flow_seqs),
        ("flow mappings", flow_maps),
        ("compact block sequences", compact_seqs),
        ("indented block mappings", indented_maps),
    ];
    for (name, shape) in shapes {
        let ok = shape(MAX_DEPTH);
        assert_eq!(scan(&ok, MAX_DEPTH), Ok(()), "{name} at the limit");
        let v: serde_json::Value =
            yaml_serde::from_str(&ok).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(depth_of(&v), MAX_DEPTH, "{name}");
        let deep = shape(MAX_DEPTH + 1);
        let at = scan(&deep, MAX_DEPTH).expect_err(name);
        // The library refuses it too: the scan only refuses earlier.
        let e = yaml_serde::from_str::<serde_json::Value>(&deep).expect_err(name);
        assert!(e.to_string().contains("recursion limit"), "{name}: {e}");
        let opener = &deep[at.offset..];
        assert!(
            ["[", "{", "- ", "a:"].iter().any(|o| opener.starts_with(o)),
            "{name}: stopped at {:?}",
            &opener[..opener.len().min(10)]
        );
    }
}

#[test]
fn positions_name_the_opener_past_the_limit() {
    let at = scan(&flow_seqs(200), MAX_DEPTH).unwrap_err();
    assert_eq!((at.offset, at.line, at.column), (128, 1, 129));
    let at = scan(&compact_seqs(200), MAX_DEPTH).unwrap_err();
    assert_eq!((at.offset, at.line, at.column), (256, 1, 257));
    let at = scan(&indented_maps(200), MAX_DEPTH).unwrap_err();
    assert_eq!((at.line, at.column), (129, 129));
    let text = "# é\nkey: [é, ".to_owned() + &flow_seqs(200);
    let at = scan(&text, MAX_DEPTH).unwrap_err();
    // `key` is one level, the first `[` a second: the 127th `[` after `é, ` is the 129th.
    assert_eq!((at.line, at.column), (2, 10 + 126));
}

/// The deterministic form of "rejection time is linear": for inputs of
/// n, 2n, 4n, ... levels, the scan stops at the same offset, so it reads a
/// prefix that does not grow with the input.
#[test]
fn rejection_reads_a_bounded_prefix_at_any_size() {
    let shapes: [Shape; 3] = [
        ("flow sequences", |n| "[".repeat(n)),
        ("flow mappings", |n| "{".repeat(n)),
        ("compact block sequences", compact_seqs),
    ];
    for (name, shape) in shapes {
        let mut stops = Vec::new();
        for n in [20_000, 40_000, 80_000, 100_000, 200_000] {
            let text = shape(n);
            stops.push(scan(&text, MAX_DEPTH).unwrap_err().offset);
        }
        assert!(stops.iter().all(|&s| s == stops[0]), "{name}: {stops:?}");
        assert!(stops[0] <= 2 * (MAX_DEPTH + 1), "{name}: {stops:?}");
    }
    // Indented block nesting costs its indentation: the prefix read is
    // the first 129 lines, whatever follows.
    let stops: Vec<usize> = [500, 1_000, 2_000]
        .iter()
        .map(|&n| scan(&indented_maps(n), MAX_DEPTH).unwrap_err().offset)
        .collect();
    assert!(stops.iter().all(|&s| s == stops[0]), "{stops:?}");
}

#[test]
fn nesting_in_scalars_and_comments_is_not_counted() {
    let deep = "[".repeat(300);
    let dashes = "- ".repeat(300);
    let cases = [
        format!("a: |\n  {deep}\n  {dashes}\nb: 1\n"),
        format!("- >-\n   {deep}\n- x\n"),
        format!("a: \"{deep}\"\nb: '{deep}'\n"),
        format!("a: \"multi\n  line {deep} \\\" still\"\n"),
        format!("a: 'it''s {deep}'\n"),
        format!("a: x{deep}\n"),
        format!("a: 1 # {deep}\n# {deep}\n"),
        format!("a: text\n  {dashes}x\n  continued\nb: 2\n"),
        format!("- [it's, {{k: \"{deep}\"}}, '{deep}'] # {deep}\n"),
        format!("a: !!str &anchor \"{deep}\"\n"),
    ];
    for text in cases {
        assert_eq!(scan(&text, MAX_DEPTH), Ok(()), "{text}");
        let v: serde_json::Value =
            yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(depth_of(&v) <= 3, "{text}");
    }
}

#[test]
fn flow_inside_block_adds_up() {
    // 101 block mappings, then flow sequences: 101 + k levels.
    let text = |k: usize| {
        (0..100).map(|i| " ".repeat(i) + "a:\n").collect::<String>()
            + &" ".repeat(100)
            + "x: "
            + &flow_seqs(k)
            + "\n"
    };
    assert_eq!(scan(&text(27), MAX_DEPTH), Ok(()));
    assert!(yaml_serde::from_str::<serde_json::Value>(&text(27)).is_ok());
    let at = scan(&text(28), MAX_DEPTH).unwrap_err();
    assert_eq!((at.line, at.column), (101, 104 + 27));
    assert!(yaml_serde::from_str::<serde_json::Value>(&text(28)).is_err());
}

fn shipped(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            shipped(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

/// Every shipped manifest and profile passes, and the scan never finds
/// more depth than the library does (it is a lower bound).
#[test]
fn shipped_files_are_never_refused() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in [
        "deviceclasses",
        "docs/examples",
        "deployments",
        "demo",
        "hack/mock-nvml/profiles",
    ] {
        shipped(&root.join(dir), &mut files);
    }
    assert!(files.len() >= 30, "{files:?}");
    let mut parsed = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        assert_eq!(scan(&text, MAX_DEPTH), Ok(()), "{}", file.display());
        let docs: Result<Vec<serde_json::Value>, _> = yaml_serde::Deserializer::from_str(&text)
            .map(serde::Deserialize::deserialize)
            .collect();
        // Helm templates are not YAML until rendered.
        let Ok(docs) = docs else { continue };
        parsed += 1;
        let depth = docs.iter().map(depth_of).max().unwrap_or(0);
        assert!(depth > 0, "{}", file.display());
        assert_eq!(
            scan(&text, depth),
            Ok(()),
            "{} at its own depth {depth}",
            file.display()
        );
    }
    assert!(parsed >= 25, "{parsed} of {} parsed", files.len());
}

/// A value `depth` levels deep, its collections chosen by `seed`, with
/// multi-line strings, keys needing quotes and empty collections on the way.
fn generated(depth: usize, seed: u64) -> serde_json::Value {
    use serde_json::json;
    let mut v = json!("leaf: [x] - y # z\nsecond line");
    let mut s = seed;
    for level in 0..depth {
        s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        v = match (s >> 33) % 4 {
            0 => json!([v, "- a", [], {}]),
            1 => json!({"k": v, "[q]": "{x}", "e": []}),
            2 => json!([{"a": level, "b": v}]),
            _ => json!({"l": ["|", ">", v, "'s"]}),
        };
    }
    v
}

/// Whatever shapes the YAML and JSON writers give a document, the scan
/// never counts deeper than it is (the lower bound that keeps it from
/// refusing what the library accepts).
#[test]
fn written_documents_are_never_overcounted() {
    for seed in 0..200 {
        // Up to two levels a step: at most MAX_DEPTH in all.
        let depth = 1 + (seed as usize * 7) % (MAX_DEPTH / 2);
        let value = generated(depth, seed);
        let depth = depth_of(&value);
        for text in [
            yaml_serde::to_string(&value).unwrap(),
            serde_json::to_string(&value).unwrap(),
            serde_json::to_string_pretty(&value).unwrap(),
        ] {
            assert_eq!(scan(&text, depth), Ok(()), "seed {seed}:\n{text}");
            let back: serde_json::Value = yaml_serde::from_str(&text).unwrap();
            assert_eq!(back, value, "seed {seed}");
        }
    }
}

/// A lone `\r` breaks lines for libyaml, so it does for the scan: nesting
/// after one is counted, not skipped as the rest of a line.
#[test]
fn carriage_returns_break_lines() {
    for (text, line) in [
        ("a:\r  b:\r    c: 1\r", 1),
        ("a:\r\n  b:\r\n    c: 1\r\n", 3),
    ] {
        let v: serde_json::Value = yaml_serde::from_str(text).unwrap();
        assert_eq!(depth_of(&v), 3);
        assert_eq!(scan(text, 3), Ok(()), "{text:?}");
        let at = scan(text, 2).unwrap_err();
        assert_eq!(at.line, line, "{text:?}: lines are counted by \\n");
    }
    let stops: Vec<usize> = [20_000, 200_000]
        .iter()
        .map(|&n| {
            scan(&("a:\r".to_owned() + &"[".repeat(n)), MAX_DEPTH)
                .unwrap_err()
                .offset
        })
        .collect();
    assert_eq!(stops, [3 + 127, 3 + 127]);
}
