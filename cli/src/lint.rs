//! `gpu-dra lint`: checks DeviceClass, ResourceClaim and
//! ResourceClaimTemplate manifests offline with the same validation engine
//! as the admission webhook ([`gpu_dra_analysis::validate`]), and reports like a
//! compiler (`file:line: error: ...`) or as JSON.
//!
//! Class references resolve against the classes in the linted files and the
//! shipped `deviceclasses/` (the files win on a name clash). Other kinds are
//! skipped with a note. Exit status: 0 clean (warnings allowed), 1 on any
//! error in a manifest, 2 when the command could not run (usage, I/O).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use gpu_dra_analysis::validate::{Finding, StaticClasses, Validator};
use serde::Serialize;
use serde_json::Value;

use crate::manifest::{self, Document};
use crate::{OutputFormat, shipped};

/// Kinds the validator judges.
const KINDS: &[&str] = &["DeviceClass", "ResourceClaim", "ResourceClaimTemplate"];

/// `gpu-dra lint` flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Driver name the manifests are checked for.
    #[arg(long, default_value = "gpu.nvidia.com")]
    driver: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    output: OutputFormat,
    /// YAML files, or directories searched recursively for *.yaml and *.yml.
    #[arg(required = true, value_name = "FILE|DIR")]
    paths: Vec<PathBuf>,
}

/// One finding, with the line it points at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Located {
    /// JSON path of the field (empty for a whole document).
    pub path: String,
    /// File line of the field (1-based).
    pub line: usize,
    /// What is wrong.
    pub message: String,
    /// A fix, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// The verdict on one document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// The file.
    pub file: String,
    /// 1-based document number in the file.
    pub document: usize,
    /// Position in a `List`'s `items`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item: Option<usize>,
    /// First line of the object.
    pub line: usize,
    /// The object's kind (empty when unreadable).
    pub kind: String,
    /// The object's name.
    pub name: String,
    /// Whether the validator judged it (false: skipped, see `note`).
    pub checked: bool,
    /// Whether the object concerns the driver.
    pub ours: bool,
    /// Why it was skipped, or other remarks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Errors.
    pub errors: Vec<Located>,
    /// Warnings.
    pub warnings: Vec<Located>,
}

/// Runs `lint`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let files = manifest::collect_files(&args.paths)?;
    let mut parsed = Vec::with_capacity(files.len());
    for file in &files {
        let text = manifest::read_file(file)?;
        parsed.push(manifest::parse(&file.display().to_string(), &text));
    }
    let entries = lint(&args.driver, &parsed)?;
    match args.output {
        OutputFormat::Text => print!("{}", render_text(&entries, files.len())),
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&entries)?),
    }
    let failed = entries.iter().any(|e| !e.errors.is_empty());
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Lints parsed files: YAML errors and every document, in file order.
fn lint(driver: &str, files: &[manifest::Parsed]) -> anyhow::Result<Vec<Entry>> {
    // Shipped classes first, so that classes in the linted files replace
    // them (StaticClasses keeps the last one of a name).
    let mut class_objects = shipped::classes()?;
    class_objects.extend(
        files
            .iter()
            .flat_map(|p| &p.documents)
            .filter(|d| d.kind() == "DeviceClass")
            .map(|d| d.value.clone()),
    );
    let classes = StaticClasses::new(class_objects);
    let validator = Validator::new(driver);

    let mut entries = Vec::new();
    for file in files {
        let mut file_entries: Vec<Entry> = file
            .errors
            .iter()
            .map(|e| Entry {
                file: e.file.clone(),
                document: e.index,
                item: None,
                line: e.line,
                kind: String::new(),
                name: String::new(),
                checked: false,
                ours: false,
                note: None,
                errors: vec![Located {
                    path: String::new(),
                    line: e.line,
                    message: match e.column {
                        Some(c) => format!("invalid YAML (column {c}): {}", e.message),
                        None => format!("invalid YAML: {}", e.message),
                    },
                    hint: None,
                }],
                warnings: Vec::new(),
            })
            .collect();
        for doc in &file.documents {
            file_entries.push(lint_document(&validator, &classes, driver, doc));
        }
        file_entries.sort_by_key(|e| (e.document, e.item));
        entries.extend(file_entries);
    }
    Ok(entries)
}

fn lint_document(
    validator: &Validator,
    classes: &StaticClasses,
    driver: &str,
    doc: &Document,
) -> Entry {
    let mut entry = Entry {
        file: doc.file.clone(),
        document: doc.index,
        item: doc.item,
        line: doc.line,
        kind: doc.kind().to_owned(),
        name: doc.name().to_owned(),
        checked: false,
        ours: false,
        note: None,
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    let whole = |message: String| Located {
        path: String::new(),
        line: doc.line,
        message,
        hint: None,
    };
    if !doc.value.is_object() {
        entry.errors.push(whole(format!(
            "not a Kubernetes object: expected a mapping with apiVersion and kind, found {}",
            json_type(&doc.value)
        )));
        return entry;
    }
    if entry.kind.is_empty() {
        entry.errors.push(whole("object has no `kind`".to_owned()));
        return entry;
    }
    if !KINDS.contains(&entry.kind.as_str()) {
        entry.note = Some(format!("{} is not checked by lint: skipped", entry.kind));
        return entry;
    }
    let api_version = doc.api_version();
    if !api_version.starts_with("resource.k8s.io/") {
        if api_version.is_empty() {
            entry
                .errors
                .push(whole("object has no `apiVersion`".to_owned()));
        } else {
            entry.note = Some(format!(
                "{api_version} is not resource.k8s.io: not a DRA object, skipped"
            ));
        }
        return entry;
    }
    let report = validator.validate(&doc.value, classes);
    entry.checked = true;
    entry.ours = report.ours;
    if !report.name.is_empty() {
        entry.name.clone_from(&report.name);
    }
    if !report.ours {
        entry.note = Some(format!("does not use driver {driver}: nothing to check"));
    }
    let locate = |f: &Finding| Located {
        path: f.path.clone(),
        line: doc.locate(&f.path),
        message: f.message.clone(),
        hint: f.hint.clone(),
    };
    entry.errors = report.errors.iter().map(locate).collect();
    entry.warnings = report.warnings.iter().map(locate).collect();
    entry
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// `Kind/name (document N)`, or `document N` when unnamed.
fn subject(e: &Entry) -> String {
    let what = match (e.kind.is_empty(), e.name.is_empty()) {
        (true, _) => String::new(),
        (false, true) => format!("{} ", e.kind),
        (false, false) => format!("{}/{} ", e.kind, e.name),
    };
    match e.item {
        Some(i) => format!("{what}(document {}, items[{i}])", e.document),
        None => format!("{what}(document {})", e.document),
    }
}

/// Compiler-style report: one block per finding, notes for skipped
/// documents, and a summary line.
fn render_text(entries: &[Entry], files: usize) -> String {
    let mut out = String::new();
    let (mut errors, mut warnings, mut checked, mut skipped) = (0, 0, 0, 0);
    for e in entries {
        if e.checked {
            checked += 1;
        } else if e.errors.is_empty() {
            skipped += 1;
        }
        if let Some(note) = &e.note {
            let _ = writeln!(out, "{}:{}: note: {}: {note}", e.file, e.line, subject(e));
        }
        for (severity, findings) in [("error", &e.errors), ("warning", &e.warnings)] {
            for f in findings {
                let at = if f.path.is_empty() {
                    String::new()
                } else {
                    format!(" {}:", f.path)
                };
                let mut lines = f.message.lines();
                let first = lines.next().unwrap_or_default();
                let _ = writeln!(
                    out,
                    "{}:{}: {severity}: {}:{at} {first}",
                    e.file,
                    f.line,
                    subject(e)
                );
                for line in lines {
                    let _ = writeln!(out, "    {line}");
                }
                if let Some(hint) = &f.hint {
                    let mut hint_lines = hint.lines();
                    let _ = writeln!(out, "    hint: {}", hint_lines.next().unwrap_or_default());
                    for line in hint_lines {
                        let _ = writeln!(out, "          {line}");
                    }
                }
            }
        }
        errors += e.errors.len();
        warnings += e.warnings.len();
    }
    let _ = writeln!(
        out,
        "{}: {} checked, {} skipped in {}",
        match (errors, warnings) {
            (0, 0) => "ok".to_owned(),
            _ => format!(
                "{}, {}",
                plural(errors, "error", "errors"),
                plural(warnings, "warning", "warnings")
            ),
        },
        plural(checked, "object", "objects"),
        skipped,
        plural(files, "file", "files"),
    );
    out
}

fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lint_text(text: &str) -> Vec<Entry> {
        lint("gpu.nvidia.com", &[manifest::parse("t.yaml", text)]).unwrap()
    }

    #[test]
    fn other_kinds_are_skipped_with_a_note() {
        let entries = lint_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n");
        assert_eq!(entries.len(), 1);
        assert!(!entries[0].checked);
        assert!(entries[0].errors.is_empty());
        assert!(entries[0].note.as_deref().unwrap().contains("Pod"));
    }

    #[test]
    fn documents_that_are_not_objects_are_errors() {
        let entries = lint_text("just a string\n---\n- a\n- b\n---\nmetadata: {name: x}\n");
        assert_eq!(entries.len(), 3);
        assert!(entries[0].errors[0].message.contains("a string"));
        assert!(entries[1].errors[0].message.contains("a list"));
        assert!(entries[2].errors[0].message.contains("no `kind`"));
        assert_eq!(entries[2].line, 6);
    }

    #[test]
    fn foreign_api_groups_are_skipped() {
        let entries =
            lint_text("apiVersion: example.com/v1\nkind: DeviceClass\nmetadata: {name: x}\n");
        assert!(!entries[0].checked);
        assert!(entries[0].errors.is_empty());
        let entries = lint_text("kind: DeviceClass\nmetadata: {name: x}\n");
        assert!(entries[0].errors[0].message.contains("apiVersion"));
    }

    #[test]
    fn yaml_errors_become_entries_in_document_order() {
        let entries = lint_text(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n---\nkind: [unclosed\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: b}\n",
        );
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[1].document, 2);
        assert!(entries[1].errors[0].message.starts_with("invalid YAML"));
        assert_eq!(entries[2].name, "b");
    }

    #[test]
    fn text_report_summarises() {
        let entries = lint_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n");
        let text = render_text(&entries, 1);
        assert!(
            text.contains("t.yaml:1: note: Pod/p (document 1)"),
            "{text}"
        );
        assert!(
            text.ends_with("ok: 0 objects checked, 1 skipped in 1 file\n"),
            "{text}"
        );
    }
}
