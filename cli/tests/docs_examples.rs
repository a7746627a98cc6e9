//! Every example in the user documentation is checked, so the docs cannot
//! drift from what the driver accepts.
//!
//! - Every ```` ```yaml ```` block in `README.md` and `docs/**/*.md` goes
//!   through `gpu-dra lint` (the binary, so the same engine as the admission
//!   webhook). The blocks of one page are linted together, so a claim may use
//!   a DeviceClass defined earlier on the same page. An unmarked block must
//!   lint with no error and no warning, and every DRA object in it must be
//!   judged as the driver's (`ours`). A block can be marked by an HTML comment
//!   on the line right before its opening fence:
//!   - `<!-- lint: expect-error -->` or `<!-- lint: expect-error: TEXT -->`:
//!     the block is deliberately wrong and must FAIL lint (with an error
//!     message containing TEXT, when given), so the marker stays honest;
//!   - `<!-- lint: expect-warning: TEXT -->`: no error, and a warning
//!     containing TEXT;
//!   - `<!-- lint: fragment -->`: a piece of YAML that is not a whole object
//!     (part of a claim, Helm values): it must parse as a YAML mapping and
//!     must not have a `kind` (a whole object must be linted).
//!
//!   Unknown markers, markers not followed by a YAML block and unclosed
//!   fences are errors.
//! - Every ```` ```console ```` block is a transcript: each `$ ` line is run
//!   with `sh` in the repository root with `gpu-dra` on `PATH` (all commands
//!   of a block in one shell, so `echo $?` works), and what it prints (stdout
//!   and stderr) must equal the lines that follow it, up to the next `$ `.
//!
//! - Every relative link (`[text](path)`, `[text](path#anchor)`, `[text](#anchor)`)
//!   outside code blocks points at a file or directory that exists, and an
//!   anchor into a Markdown file at one of its headings.
//!
//! Failures name the Markdown file and line.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The repository root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What a marker asks of a YAML block.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Marker {
    /// Must lint clean.
    Clean,
    /// Must fail lint, with an error containing the text when given.
    ExpectError(Option<String>),
    /// Must lint without errors and with a warning containing the text.
    ExpectWarning(String),
    /// Not a whole object: valid YAML mapping, no `kind`.
    Fragment,
}

/// The language of a fenced block we check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lang {
    Yaml,
    Console,
}

/// One fenced block.
#[derive(Debug, Clone)]
struct Block {
    /// The Markdown file, as shown in messages.
    file: String,
    /// 1-based line of the block's first content line in the file.
    line: usize,
    lang: Lang,
    marker: Marker,
    /// The content, with the fence's indentation removed.
    text: String,
}

impl Block {
    /// `file:line` of the block's `n`th content line (1-based).
    fn at(&self, n: usize) -> String {
        format!("{}:{}", self.file, self.line + n.max(1) - 1)
    }
}

/// How a marker line starts (a line starting so that is not a well-formed
/// marker is an error, not ignored).
const MARKER_PREFIX: &str = "<!-- lint";

/// Parses a `<!-- lint: ... -->` line.
fn parse_marker(line: &str) -> Result<Marker, String> {
    let inner = line
        .trim()
        .strip_prefix(MARKER_PREFIX)
        .and_then(|s| s.strip_prefix(':'))
        .and_then(|s| s.strip_suffix("-->"))
        .ok_or_else(|| {
            format!(
                "malformed marker `{}`: write `<!-- lint: WHAT -->`",
                line.trim()
            )
        })?
        .trim();
    let (word, text) = match inner.split_once(':') {
        Some((w, t)) => (
            w.trim(),
            Some(t.trim().to_owned()).filter(|t| !t.is_empty()),
        ),
        None => (inner, None),
    };
    match (word, text) {
        ("expect-error", text) => Ok(Marker::ExpectError(text)),
        ("expect-warning", Some(text)) => Ok(Marker::ExpectWarning(text)),
        ("expect-warning", None) => Err("`expect-warning` needs the text the warning must contain (`<!-- lint: expect-warning: TEXT -->`)".to_owned()),
        ("fragment", None) => Ok(Marker::Fragment),
        _ => Err(format!(
            "unknown marker `{}`: use `expect-error[: TEXT]`, `expect-warning: TEXT` or `fragment`",
            line.trim()
        )),
    }
}

/// The fenced `yaml`/`yml` and `console` blocks of a Markdown text, or the
/// problems with its markers and fences (`file:line: ...`).
fn extract(file: &str, text: &str) -> Result<Vec<Block>, Vec<String>> {
    let mut blocks = Vec::new();
    let mut problems = Vec::new();
    // (line, marker) of a marker line waiting for its block
    let mut pending: Option<(usize, Result<Marker, String>)> = None;
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        let number = i + 1;
        if let Some(info) = trimmed.strip_prefix("```") {
            let indent = line.len() - trimmed.len();
            let ticks = 3 + info.chars().take_while(|&c| c == '`').count();
            let info = info.trim_start_matches('`').trim();
            let lang = match info.split_whitespace().next().unwrap_or("") {
                "yaml" | "yml" => Some(Lang::Yaml),
                "console" => Some(Lang::Console),
                _ => None,
            };
            let marker = pending.take();
            // find the closing fence
            let close = (i + 1..lines.len()).find(|&j| {
                let t = lines[j].trim();
                t.len() >= ticks && t.chars().all(|c| c == '`')
            });
            let Some(close) = close else {
                problems.push(format!("{file}:{number}: code fence is never closed"));
                break;
            };
            let content: Vec<String> = lines[i + 1..close]
                .iter()
                .map(|l| {
                    let cut = l.len() - l.trim_start().len();
                    l[cut.min(indent)..].to_owned()
                })
                .collect();
            match (lang, marker) {
                (Some(Lang::Yaml), marker) => {
                    let marker = match marker {
                        None => Marker::Clean,
                        Some((_, Ok(m))) => m,
                        Some((at, Err(e))) => {
                            problems.push(format!("{file}:{at}: {e}"));
                            Marker::Clean
                        }
                    };
                    blocks.push(Block {
                        file: file.to_owned(),
                        line: number + 1,
                        lang: Lang::Yaml,
                        marker,
                        text: content.join("\n") + "\n",
                    });
                }
                (Some(Lang::Console), None) => blocks.push(Block {
                    file: file.to_owned(),
                    line: number + 1,
                    lang: Lang::Console,
                    marker: Marker::Clean,
                    text: content.join("\n") + "\n",
                }),
                (_, Some((at, _))) => problems.push(format!(
                    "{file}:{at}: a lint marker must be followed by a ```yaml block (found a ```{info} block)"
                )),
                (None, None) => {}
            }
            i = close + 1;
            continue;
        }
        if trimmed.starts_with(MARKER_PREFIX) {
            if let Some((at, _)) = pending.take() {
                problems.push(format!(
                    "{file}:{at}: a lint marker must be followed by a ```yaml block"
                ));
            }
            pending = Some((number, parse_marker(line)));
        } else if !trimmed.is_empty()
            && let Some((at, _)) = pending.take()
        {
            problems.push(format!(
                "{file}:{at}: a lint marker must be followed by a ```yaml block (found text)"
            ));
        }
        i += 1;
    }
    if let Some((at, _)) = pending {
        problems.push(format!(
            "{file}:{at}: a lint marker must be followed by a ```yaml block (found the end of the file)"
        ));
    }
    if problems.is_empty() {
        Ok(blocks)
    } else {
        Err(problems)
    }
}

/// `README.md` and every `*.md` under `docs/`, repository-relative, sorted.
fn doc_files(repo: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut files = vec![repo.join("README.md")];
    walk(&repo.join("docs"), &mut files);
    files
}

/// The blocks of every documentation file (panics listing every marker or
/// fence problem).
fn all_blocks() -> Vec<Block> {
    let repo = repo();
    let mut blocks = Vec::new();
    let mut problems = Vec::new();
    for path in doc_files(&repo) {
        let shown = path
            .strip_prefix(&repo)
            .unwrap_or(&path)
            .display()
            .to_string();
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{shown}: {e}"));
        match extract(&shown, &text) {
            Ok(found) => blocks.extend(found),
            Err(p) => problems.extend(p),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    blocks
}

/// `gpu-dra lint --output json FILES`: exit status and entries, or a
/// failure message when the command itself failed.
fn lint(files: &[PathBuf]) -> Result<(i32, Vec<Value>), String> {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(["lint", "--output", "json"])
        .args(files)
        .output()
        .map_err(|e| format!("cannot run gpu-dra: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code().unwrap_or(-1);
    if code == 2 {
        return Err(format!("gpu-dra lint could not run: {stderr}"));
    }
    let entries: Value = serde_json::from_str(&stdout)
        .map_err(|e| format!("gpu-dra lint printed no JSON ({e}): {stdout}{stderr}"))?;
    let entries = entries
        .as_array()
        .cloned()
        .ok_or_else(|| format!("gpu-dra lint printed no array: {stdout}"))?;
    Ok((code, entries))
}

/// One finding of a lint entry, for messages.
fn findings(entry: &Value, severity: &str) -> Vec<(usize, String)> {
    entry[severity]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|f| {
                    let line = f["line"].as_u64().unwrap_or(1);
                    let message = f["message"].as_str().unwrap_or_default();
                    let path = f["path"].as_str().unwrap_or_default();
                    let text = if path.is_empty() {
                        message.to_owned()
                    } else {
                        format!("{path}: {message}")
                    };
                    (usize::try_from(line).unwrap_or(1), text)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Checks the YAML blocks of one page (as [`Block`]s of one file) in `dir`;
/// returns the failures.
fn check_yaml_page(blocks: &[&Block], dir: &Path) -> Vec<String> {
    let mut failures = Vec::new();
    let write = |index: usize, block: &Block| -> PathBuf {
        let path = dir.join(format!("block{index:03}-L{}.yaml", block.line));
        std::fs::write(&path, &block.text).expect("write a block");
        path
    };
    let clean: Vec<(PathBuf, &Block)> = blocks
        .iter()
        .enumerate()
        .filter(|(_, b)| b.marker == Marker::Clean)
        .map(|(i, b)| (write(i, b), *b))
        .collect();
    let clean_files: Vec<PathBuf> = clean.iter().map(|(p, _)| p.clone()).collect();
    let entries_of = |entries: &[Value], path: &Path| -> Vec<Value> {
        let shown = path.display().to_string();
        entries
            .iter()
            .filter(|e| e["file"].as_str() == Some(shown.as_str()))
            .cloned()
            .collect()
    };

    if !clean.is_empty() {
        match lint(&clean_files) {
            Err(e) => failures.push(format!("{}: {e}", clean[0].1.file)),
            Ok((_, entries)) => {
                for (path, block) in &clean {
                    let mine = entries_of(&entries, path);
                    if mine.is_empty() {
                        failures.push(format!("{}: lint found no document", block.at(1)));
                    }
                    for entry in &mine {
                        for severity in ["errors", "warnings"] {
                            for (line, message) in findings(entry, severity) {
                                failures.push(format!(
                                    "{}: lint {}: {message} (mark the block with `<!-- lint: expect-error -->` if that is deliberate)",
                                    block.at(line),
                                    severity.trim_end_matches('s')
                                ));
                            }
                        }
                        if entry["checked"] == true && entry["ours"] != true {
                            let line =
                                usize::try_from(entry["line"].as_u64().unwrap_or(1)).unwrap_or(1);
                            failures.push(format!(
                                "{}: {} {} does not concern the driver gpu.nvidia.com, so lint checked nothing in it",
                                block.at(line),
                                entry["kind"].as_str().unwrap_or_default(),
                                entry["name"].as_str().unwrap_or_default()
                            ));
                        }
                    }
                }
            }
        }
    }

    for (i, block) in blocks.iter().enumerate() {
        match &block.marker {
            Marker::Clean => {}
            Marker::Fragment => {
                match yaml_serde::from_str::<Value>(&block.text) {
                    Err(e) => failures.push(format!("{}: fragment is not valid YAML: {e}", block.at(1))),
                    Ok(Value::Object(map)) if map.contains_key("kind") => failures.push(format!(
                        "{}: marked as a fragment but it is a whole object (it has a `kind`): remove the marker so it is linted",
                        block.at(1)
                    )),
                    Ok(Value::Object(_)) => {}
                    Ok(_) => failures.push(format!("{}: a fragment must be a YAML mapping", block.at(1))),
                }
            }
            marker @ (Marker::ExpectError(_) | Marker::ExpectWarning(_)) => {
                let path = write(i, block);
                let mut files = clean_files.clone();
                files.push(path.clone());
                let (code, entries) = match lint(&files) {
                    Ok(r) => r,
                    Err(e) => {
                        failures.push(format!("{}: {e}", block.at(1)));
                        continue;
                    }
                };
                let mine = entries_of(&entries, &path);
                let errors: Vec<(usize, String)> =
                    mine.iter().flat_map(|e| findings(e, "errors")).collect();
                let warnings: Vec<(usize, String)> =
                    mine.iter().flat_map(|e| findings(e, "warnings")).collect();
                match marker {
                    Marker::ExpectError(text) => {
                        if errors.is_empty() || code != 1 {
                            failures.push(format!(
                                "{}: marked `expect-error` but lints without errors (exit status {code}): fix the example or drop the marker",
                                block.at(1)
                            ));
                        } else if let Some(text) = text
                            && !errors.iter().any(|(_, m)| m.contains(text.as_str()))
                        {
                            let mut listed = String::new();
                            for (line, m) in &errors {
                                let _ = write!(listed, "\n    {}: {m}", block.at(*line));
                            }
                            failures.push(format!(
                                "{}: no lint error contains `{text}`; the errors:{listed}",
                                block.at(1)
                            ));
                        }
                    }
                    Marker::ExpectWarning(text) => {
                        for (line, m) in &errors {
                            failures.push(format!(
                                "{}: lint error in a block marked `expect-warning`: {m}",
                                block.at(*line)
                            ));
                        }
                        if !warnings.iter().any(|(_, m)| m.contains(text.as_str())) {
                            failures.push(format!(
                                "{}: marked `expect-warning: {text}` but no lint warning contains it (warnings: {warnings:?})",
                                block.at(1)
                            ));
                        }
                    }
                    Marker::Clean | Marker::Fragment => unreachable!("matched above"),
                }
            }
        }
    }
    failures
}

/// Checks the YAML blocks of every page; returns the failures.
fn check_yaml(blocks: &[Block]) -> Vec<String> {
    let mut failures = Vec::new();
    let mut files: Vec<&str> = blocks
        .iter()
        .filter(|b| b.lang == Lang::Yaml)
        .map(|b| b.file.as_str())
        .collect();
    files.dedup();
    for file in files {
        let page: Vec<&Block> = blocks
            .iter()
            .filter(|b| b.lang == Lang::Yaml && b.file == file)
            .collect();
        let dir = tempfile::tempdir().expect("tempdir");
        failures.extend(check_yaml_page(&page, dir.path()));
    }
    failures
}

/// A console transcript: the commands and the output each must print.
fn transcript(block: &Block) -> Vec<(usize, String, Vec<String>)> {
    let mut steps: Vec<(usize, String, Vec<String>)> = Vec::new();
    for (n, line) in block.text.lines().enumerate() {
        if let Some(command) = line.strip_prefix("$ ") {
            steps.push((n + 1, command.to_owned(), Vec::new()));
        } else if let Some(step) = steps.last_mut() {
            step.2.push(line.trim_end().to_owned());
        }
    }
    for step in &mut steps {
        while step.2.last().is_some_and(String::is_empty) {
            step.2.pop();
        }
    }
    steps
}

/// Runs a console block in `cwd`; returns the failures.
fn check_console(block: &Block, cwd: &Path) -> Vec<String> {
    let steps = transcript(block);
    if steps.is_empty() {
        return vec![format!(
            "{}: a ```console block needs `$ ` command lines (use ```sh for commands that are not checked)",
            block.at(1)
        )];
    }
    let marker = |i: usize| format!("@@docs-examples-step-{i}@@");
    let mut script = String::from("exec 2>&1\n");
    for (i, (_, command, _)) in steps.iter().enumerate() {
        let _ = writeln!(script, "echo '{}'\n{command}", marker(i));
    }
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_gpu-dra"));
    let path = std::env::join_paths(
        std::iter::once(bin.parent().expect("bin dir").to_path_buf()).chain(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        )),
    )
    .expect("PATH");
    let out = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .current_dir(cwd)
        .env("PATH", path)
        .env("NO_COLOR", "1")
        .output()
        .expect("run sh");
    let output = String::from_utf8_lossy(&out.stdout);
    let mut failures = Vec::new();
    for (i, (line, command, expected)) in steps.iter().enumerate() {
        let start = output
            .find(&format!("{}\n", marker(i)))
            .map(|s| s + marker(i).len() + 1);
        let Some(start) = start else {
            failures.push(format!("{}: `{command}` did not run", block.at(*line)));
            continue;
        };
        let end = output[start..]
            .find(&marker(i + 1))
            .map_or(output.len(), |e| start + e);
        let mut actual: Vec<String> = output[start..end]
            .lines()
            .map(|l| l.trim_end().to_owned())
            .collect();
        while actual.last().is_some_and(String::is_empty) {
            actual.pop();
        }
        if &actual != expected {
            failures.push(format!(
                "{}: the output of `{command}` differs from the transcript\n--- documented\n{}\n--- actual\n{}\n---",
                block.at(*line),
                expected.join("\n"),
                actual.join("\n")
            ));
        }
    }
    failures
}

/// GitHub's anchor of a heading: lowercase, punctuation other than `-` and
/// `_` dropped, spaces turned into `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text's headings (outside code blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut fence = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
        } else if !fence && line.starts_with('#') {
            out.push(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// The relative link targets of a Markdown text, with their lines, outside
/// code blocks and inline code.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut fence = false;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        // drop inline code spans
        let plain: String = line
            .split('`')
            .enumerate()
            .map(|(i, part)| if i % 2 == 0 { part } else { "" })
            .collect();
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].trim();
            rest = &rest[end..];
            if !(target.is_empty() || target.contains("://") || target.starts_with("mailto:")) {
                out.push((n + 1, target.to_owned()));
            }
        }
    }
    out
}

/// Checks the links of one Markdown file (`path`, shown as `shown`).
fn check_links(path: &Path, shown: &str, text: &str) -> Vec<String> {
    let mut failures = Vec::new();
    let dir = path.parent().expect("a file has a directory");
    for (line, target) in links(text) {
        let (file, anchor) = match target.split_once('#') {
            Some((f, a)) => (f, Some(a)),
            None => (target.as_str(), None),
        };
        if file.is_empty() {
            if let Some(anchor) = anchor
                && !anchors(text).iter().any(|a| a == anchor)
            {
                failures.push(format!(
                    "{shown}:{line}: link to `{target}`: no heading with that anchor"
                ));
            }
            continue;
        }
        let resolved = dir.join(file);
        if !resolved.exists() {
            failures.push(format!(
                "{shown}:{line}: link to `{target}`: no such file or directory"
            ));
            continue;
        }
        if let Some(anchor) = anchor
            && resolved.extension().is_some_and(|e| e == "md")
        {
            let target_text = std::fs::read_to_string(&resolved).unwrap_or_default();
            if !anchors(&target_text).iter().any(|a| a == anchor) {
                failures.push(format!(
                    "{shown}:{line}: link to `{target}`: no heading with that anchor"
                ));
            }
        }
    }
    failures
}

#[test]
fn relative_links_resolve() {
    let repo = repo();
    let mut failures = Vec::new();
    let mut checked = 0;
    for path in doc_files(&repo) {
        let shown = path
            .strip_prefix(&repo)
            .unwrap_or(&path)
            .display()
            .to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        checked += links(&text).len();
        failures.extend(check_links(&path, &shown, &text));
    }
    assert!(checked > 0, "no relative link found in the docs");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn links_and_anchors_are_found_like_github_does() {
    assert_eq!(
        slug(" What is enforced, and what is not"),
        "what-is-enforced-and-what-is-not"
    );
    assert_eq!(slug(" `gpu-dra lint`"), "gpu-dra-lint");
    let text = "# Top\n\nSee [a](a.md#x) and `[b](not-a-link)`.\n```sh\n[c](in-code)\n```\n[d](https://example.com) [e](#top)\n";
    assert_eq!(
        links(text),
        vec![(3, "a.md#x".to_owned()), (7, "#top".to_owned())]
    );
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("page.md");
    std::fs::write(dir.path().join("a.md"), "# X\n").unwrap();
    let failures = check_links(&page, "page.md", text);
    assert_eq!(failures, Vec::<String>::new());
    let failures = check_links(
        &page,
        "page.md",
        "[a](a.md#y)\n[m](missing.md)\n[s](#nowhere)\n",
    );
    assert_eq!(failures.len(), 3, "{failures:?}");
    assert!(failures[0].starts_with("page.md:1: link to `a.md#y`: no heading"));
    assert!(failures[1].starts_with("page.md:2: link to `missing.md`: no such file"));
    assert!(failures[2].starts_with("page.md:3: link to `#nowhere`: no heading"));
}

#[test]
fn yaml_examples_lint_as_marked() {
    let blocks = all_blocks();
    let yaml = blocks.iter().filter(|b| b.lang == Lang::Yaml).count();
    assert!(yaml > 0, "no ```yaml block found in README.md and docs/");
    let failures = check_yaml(&blocks);
    assert!(
        failures.is_empty(),
        "{} problem(s) in the YAML examples of the docs:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn console_transcripts_match() {
    let repo = repo();
    let mut failures = Vec::new();
    for block in all_blocks().iter().filter(|b| b.lang == Lang::Console) {
        failures.extend(check_console(block, &repo));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

// The checker itself: markers that lie, and Markdown it must refuse.

fn page(text: &str) -> Vec<Block> {
    extract("page.md", text).expect("extracts")
}

const CLAIM: &str = "apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: c
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
";

const TYPO: &str = "apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: typo
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel:
            expression: \"device.attributes['gpu.nvidia.com'].prodcutName == 'x'\"
";

fn fenced(marker: &str, body: &str) -> String {
    format!("Some text.\n\n{marker}\n```yaml\n{body}```\n")
}

fn check_text(text: &str) -> Vec<String> {
    let blocks = page(text);
    let page: Vec<&Block> = blocks.iter().collect();
    let dir = tempfile::tempdir().unwrap();
    check_yaml_page(&page, dir.path())
}

#[test]
fn blocks_come_with_their_lines_markers_and_dedented_text() {
    let text = "# T\n\n```yaml\na: 1\n```\n\n- item\n\n  <!-- lint: expect-error: did you mean -->\n  ```yml\n  b: 2\n    c: 3\n  ```\n\n```sh\nnot: checked\n```\n\n<!-- lint: fragment -->\n```yaml\nd: 4\n```\n\n```console\n$ true\n```\n";
    let blocks = page(text);
    assert_eq!(blocks.len(), 4, "{blocks:?}");
    assert_eq!((blocks[0].line, &blocks[0].marker), (4, &Marker::Clean));
    assert_eq!(blocks[0].text, "a: 1\n");
    assert_eq!(blocks[1].line, 11);
    assert_eq!(
        blocks[1].marker,
        Marker::ExpectError(Some("did you mean".to_owned()))
    );
    assert_eq!(blocks[1].text, "b: 2\n  c: 3\n");
    assert_eq!(blocks[2].marker, Marker::Fragment);
    assert_eq!(blocks[3].lang, Lang::Console);
    assert_eq!(blocks[1].at(2), "page.md:12");
}

#[test]
fn bad_markers_and_fences_are_refused() {
    for (text, expected) in [
        (
            "<!-- lint: expect-eror -->\n```yaml\na: 1\n```\n",
            "page.md:1: unknown marker",
        ),
        (
            "<!-- lint: expect-warning -->\n```yaml\na: 1\n```\n",
            "needs the text",
        ),
        (
            "<!-- lint: fragment -->\nSome text.\n```yaml\na: 1\n```\n",
            "page.md:1: a lint marker must be followed",
        ),
        (
            "<!-- lint: fragment -->\n```sh\nls\n```\n",
            "found a ```sh block",
        ),
        (
            "text\n<!-- lint: fragment -->\n",
            "page.md:2: a lint marker must be followed by a ```yaml block (found the end",
        ),
        ("```yaml\na: 1\n", "page.md:1: code fence is never closed"),
        (
            "<!-- lint fragment -->\n```yaml\na: 1\n```\n",
            "malformed marker",
        ),
    ] {
        let problems = extract("page.md", text).expect_err(text);
        assert!(
            problems.iter().any(|p| p.contains(expected)),
            "{text:?}: {problems:?}"
        );
    }
}

#[test]
fn an_unmarked_broken_block_fails_with_its_markdown_line() {
    let failures = check_text(&fenced("", TYPO));
    // the fence opens on line 4; the expression is line 13 of the block
    assert!(
        failures
            .iter()
            .any(|f| f.starts_with("page.md:17: lint error:") && f.contains("prodcutName")),
        "{failures:?}"
    );
}

#[test]
fn an_expect_error_marker_on_a_clean_block_fails() {
    let failures = check_text(&fenced("<!-- lint: expect-error -->", CLAIM));
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].contains("lints without errors"), "{failures:?}");
    // and on a broken block it passes, with or without the expected text
    assert_eq!(
        check_text(&fenced("<!-- lint: expect-error -->", TYPO)),
        Vec::<String>::new()
    );
    assert_eq!(
        check_text(&fenced(
            "<!-- lint: expect-error: did you mean `productName`? -->",
            TYPO
        )),
        Vec::<String>::new()
    );
    let failures = check_text(&fenced("<!-- lint: expect-error: capacity -->", TYPO));
    assert!(
        failures
            .iter()
            .any(|f| f.contains("no lint error contains `capacity`")),
        "{failures:?}"
    );
}

#[test]
fn a_claim_may_use_a_class_defined_earlier_on_its_page() {
    let class = "apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: mine.example.com
spec:
  selectors:
  - cel:
      expression: \"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'\"
";
    let claim = CLAIM.replace("gpu.nvidia.com\n", "mine.example.com\n");
    let text = format!(
        "{}{}{}",
        fenced("", class),
        fenced("", &claim),
        fenced(
            "<!-- lint: expect-error: prodcutName -->",
            &TYPO.replace(
                "deviceClassName: gpu.nvidia.com",
                "deviceClassName: mine.example.com"
            )
        )
    );
    assert_eq!(check_text(&text), Vec::<String>::new());
    // without the class, the claim names an unknown class: not ours
    let failures = check_text(&fenced("", &claim));
    assert!(!failures.is_empty());
}

#[test]
fn fragments_must_be_yaml_mappings_without_kind() {
    assert_eq!(
        check_text(&fenced(
            "<!-- lint: fragment -->",
            "constraints:\n- matchAttribute: gpu.nvidia.com/nvlinkDomain\n"
        )),
        Vec::<String>::new()
    );
    let failures = check_text(&fenced("<!-- lint: fragment -->", CLAIM));
    assert!(failures[0].contains("whole object"), "{failures:?}");
    let failures = check_text(&fenced("<!-- lint: fragment -->", "a: [unclosed\n"));
    assert!(failures[0].contains("not valid YAML"), "{failures:?}");
    let failures = check_text(&fenced("<!-- lint: fragment -->", "- a\n"));
    assert!(failures[0].contains("mapping"), "{failures:?}");
}

#[test]
fn console_transcripts_are_compared_line_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let ok = page("```console\n$ echo one\none\n$ false; echo $?\n1\n```\n");
    assert_eq!(check_console(&ok[0], dir.path()), Vec::<String>::new());
    let wrong = page("text\n```console\n$ echo one\ntwo\n$ echo three\nthree\n```\n");
    let failures = check_console(&wrong[0], dir.path());
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].starts_with("page.md:3: the output of `echo one`"));
    let empty = page("```console\nno commands\n```\n");
    assert!(check_console(&empty[0], dir.path())[0].contains("needs `$ `"));
}
