//! YAML manifest loading with line mapping (`gpu_dra::manifest`): split a
//! file into documents, parse each, expand `List`s, and map JSON paths of
//! every field back to file lines.
//!
//! Checked beyond "no panic": every line reported (a document's start, a
//! located field, an error's position) lies inside the file.

#![no_main]

use gpu_dra::manifest::parse;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// The JSON paths of `value`'s fields, in `locate`'s syntax
/// (`a.b[0].c`), at most `budget` of them.
fn paths(value: &Value, prefix: &str, out: &mut Vec<String>, budget: usize) {
    if out.len() >= budget {
        return;
    }
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.push(p.clone());
                paths(v, &p, out, budget);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let p = format!("{prefix}[{i}]");
                out.push(p.clone());
                paths(v, &p, out, budget);
            }
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Lines as the YAML reader (libyaml's rules) counts them: `\r\n`, `\n`,
    // a lone `\r`, NEL, LS and PS each end one; plus the line after a
    // final break (where an error at the end of the file is).
    let breaks = text
        .matches(['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}'])
        .count()
        - text.matches("\r\n").count();
    // An end-of-file error of a file without a final break is held to its
    // last line (corpus file crash-eof-error-line-past-end: it was one past).
    let lines = breaks + 1;
    let parsed = parse("fuzz.yaml", text);
    for e in &parsed.errors {
        assert!(
            e.line >= 1 && e.line <= lines,
            "error at line {} of {lines}: {e}",
            e.line
        );
        let _ = e.to_string();
    }
    for doc in &parsed.documents {
        assert!(
            doc.line >= 1 && doc.line <= lines,
            "document at line {} of {lines}",
            doc.line
        );
        let _ = (doc.kind(), doc.api_version(), doc.name(), doc.position());
        let mut found = Vec::new();
        paths(&doc.value, "", &mut found, 256);
        // Paths that are not in the object, too: the enclosing field's line.
        found.push("spec.devices.requests[7].exactly.count".to_owned());
        found.push("[".to_owned());
        for p in &found {
            let line = doc.locate(p);
            assert!(
                line >= 1 && line <= lines,
                "{p} located at line {line} of {lines}"
            );
        }
    }
});
