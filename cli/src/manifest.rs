//! Reading Kubernetes manifests for `lint` and `simulate`: files and
//! directories (recursively, `*.yaml`/`*.yml`), multi-document YAML split on
//! `---`, `List` objects expanded into their items, YAML errors with the
//! file's own line numbers, and a best-effort mapping from a JSON path such as
//! `spec.devices.requests[0].exactly.count` back to the line that holds it.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Largest manifest file read: 16 MiB. An object in etcd is at most
/// 1.5 MiB; a file is bigger only as a `List` dump (`kubectl get
/// resourceslices -o yaml` of about a thousand 8-GPU nodes fits). Within it,
/// each document is held to [`bounded_yaml`]'s nesting depth and alias
/// expansion limits, checked while reading.
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// One object read from a file.
#[derive(Debug, Clone)]
pub struct Document {
    /// The file, as given or found.
    pub file: String,
    /// 1-based position of the YAML document among the non-empty ones of
    /// the file.
    pub index: usize,
    /// For an item of a `List`: its 0-based position in `items`.
    pub item: Option<usize>,
    /// First line of the object in the file (1-based).
    pub line: usize,
    /// The object.
    pub value: Value,
    /// The document's text, for [`Document::locate`].
    source: Source,
}

/// A YAML document's lines and where they start in the file.
#[derive(Debug, Clone)]
struct Source {
    text: std::sync::Arc<str>,
    first_line: usize,
}

/// A YAML syntax (or structure) error, with file coordinates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    /// The file.
    pub file: String,
    /// 1-based position of the document in the file.
    pub index: usize,
    /// 1-based line in the file.
    pub line: usize,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// What is wrong, with any positions it mentions given in file lines.
    pub message: String,
}

impl fmt::Display for YamlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.column {
            Some(c) => write!(
                f,
                "{}:{}:{c}: invalid YAML: {}",
                self.file, self.line, self.message
            ),
            None => write!(
                f,
                "{}:{}: invalid YAML: {}",
                self.file, self.line, self.message
            ),
        }
    }
}

impl std::error::Error for YamlError {}

/// Why the manifest files could not be found or read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A path could not be read (the message is the path; the I/O error
    /// is its source).
    #[error("{}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// A directory named on the command line holds no YAML file.
    #[error("{}: no *.yaml or *.yml files in this directory", path.display())]
    NoYaml {
        /// The directory.
        path: PathBuf,
    },
    /// A file is larger than a manifest may be.
    #[error(
        "{}: file is {len} bytes, more than the {MAX_FILE_BYTES} bytes a manifest may have",
        path.display()
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size in bytes.
        len: u64,
    },
    /// A file is not UTF-8 text.
    #[error("{}: not UTF-8 text (invalid byte at offset {offset})", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// Where the first invalid byte is.
        offset: usize,
    },
}

/// The [`ReadError::Io`] of `path`.
fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ReadError + '_ {
    move |source| ReadError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What a file holds.
#[derive(Debug, Default)]
pub struct Parsed {
    /// The objects, in file order (`List` items in place of the list).
    pub documents: Vec<Document>,
    /// Documents that could not be read.
    pub errors: Vec<YamlError>,
}

impl Document {
    /// `kind` of the object, empty if absent.
    pub fn kind(&self) -> &str {
        self.value.get("kind").and_then(Value::as_str).unwrap_or("")
    }

    /// `apiVersion` of the object, empty if absent.
    pub fn api_version(&self) -> &str {
        self.value
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// `metadata.name` (or `metadata.generateName`), empty if absent.
    pub fn name(&self) -> &str {
        let meta = self.value.get("metadata");
        meta.and_then(|m| m.get("name"))
            .or_else(|| meta.and_then(|m| m.get("generateName")))
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// Where the document is, for messages: `file:line` plus the document
    /// (and list item) number.
    pub fn position(&self) -> String {
        match self.item {
            Some(i) => format!(
                "{}:{} (document {}, items[{i}])",
                self.file, self.line, self.index
            ),
            None => format!("{}:{} (document {})", self.file, self.line, self.index),
        }
    }

    /// The file line holding the field at `path` (dotted keys and `[n]`
    /// indices, e.g. `spec.selectors[0].cel.expression`), or the closest
    /// enclosing field that could be found; the object's first line when
    /// nothing matches. Block-style YAML is followed exactly; inside a flow
    /// collection (`{...}`, `[...]`) the line of the collection is returned.
    pub fn locate(&self, path: &str) -> usize {
        let mut steps = parse_path(path);
        if let Some(i) = self.item {
            steps.insert(0, Step::Index(i));
            steps.insert(0, Step::Key("items".to_owned()));
        }
        locate_in(&self.source.text, self.source.first_line, &steps).unwrap_or(self.line)
    }
}

/// The YAML files named by `paths`: files as given (whatever their
/// extension), directories searched recursively for `*.yaml` and `*.yml`,
/// in name order. A directory without any is an error, as is a path that
/// does not exist.
pub fn collect_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ReadError> {
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(io(path))?;
        if meta.is_dir() {
            let before = files.len();
            walk(path, &mut files)?;
            if files.len() == before {
                return Err(ReadError::NoYaml { path: path.clone() });
            }
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), ReadError> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io(dir))?;
    entries.sort();
    for path in entries {
        let meta = std::fs::metadata(&path).map_err(io(&path))?;
        if meta.is_dir() {
            walk(&path, out)?;
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e == "yaml" || e == "yml")
        {
            out.push(path);
        }
    }
    Ok(())
}

/// Reads a file as UTF-8 text (at most [`MAX_FILE_BYTES`]). The limit
/// holds while reading too, for files whose size the metadata does not
/// tell (pipes, `/dev/zero`): no more than one byte past it is read.
pub fn read_file(path: &Path) -> Result<String, ReadError> {
    use std::io::Read as _;
    let too_large = |len| ReadError::TooLarge {
        path: path.to_owned(),
        len,
    };
    let meta = std::fs::metadata(path).map_err(io(path))?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(io(path))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| ReadError::NotUtf8 {
        path: path.to_owned(),
        offset: e.utf8_error().valid_up_to(),
    })
}

/// Splits `text` into YAML documents and parses each one. `file` names the
/// file in messages.
pub fn parse(file: &str, text: &str) -> Parsed {
    let mut parsed = Parsed::default();
    let mut index = 0;
    for segment in split_documents(text) {
        let value: Value = match bounded_yaml::to_value(segment.text, MAX_FILE_BYTES as usize) {
            Ok(v) => v,
            Err(e) => {
                index += 1;
                parsed.errors.push(yaml_error(file, index, &segment, &e));
                continue;
            }
        };
        if value.is_null() {
            continue;
        }
        index += 1;
        let source = Source {
            text: segment.text.into(),
            first_line: segment.first_line,
        };
        let line =
            first_content_line(segment.text).map_or(segment.first_line, |l| segment.first_line + l);
        let items = is_list(&value).then(|| value.get("items").and_then(Value::as_array).cloned());
        match items {
            Some(Some(items)) => {
                for (i, item) in items.into_iter().enumerate() {
                    let item_line = locate_in(
                        &source.text,
                        source.first_line,
                        &[Step::Key("items".to_owned()), Step::Index(i)],
                    )
                    .unwrap_or(line);
                    parsed.documents.push(Document {
                        file: file.to_owned(),
                        index,
                        item: Some(i),
                        line: item_line,
                        value: item,
                        source: source.clone(),
                    });
                }
            }
            Some(None) => parsed.errors.push(YamlError {
                file: file.to_owned(),
                index,
                line,
                column: None,
                message: format!(
                    "a {} must have an `items` list",
                    value.get("kind").and_then(Value::as_str).unwrap_or("List")
                ),
            }),
            None => parsed.documents.push(Document {
                file: file.to_owned(),
                index,
                item: None,
                line,
                value,
                source,
            }),
        }
    }
    parsed
}

/// Whether `value` is a `List` (`kind: List` or `kind: <Something>List` in
/// `v1` or any group, as `kubectl get -o yaml` writes them).
fn is_list(value: &Value) -> bool {
    value
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k.ends_with("List"))
        && value
            .get("metadata")
            .is_none_or(|m| m.get("name").is_none())
}

/// One YAML document's text.
struct Chunk<'a> {
    text: &'a str,
    /// File line of the segment's first line (1-based).
    first_line: usize,
}

/// Splits on document markers: a line starting with `---` begins a
/// document (and belongs to it), a line starting with `...` ends one. In
/// YAML such lines are markers wherever they occur (even inside block
/// scalars), so no parsing is needed. Leading directives and comments are
/// kept with the document that follows them.
fn split_documents(text: &str) -> Vec<Chunk<'_>> {
    let mut segments = Vec::new();
    let mut start = 0; // byte offset of the current segment
    let mut start_line = 1;
    let mut has_content = false; // a line other than blank, comment, directive
    let mut has_marker = false; // the segment starts with `---`
    let mut offset = 0;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let number = n + 1;
        let bare = line.trim_end_matches(['\n', '\r']);
        if is_marker(bare, "---") {
            if has_content || has_marker {
                segments.push(Chunk {
                    text: &text[start..offset],
                    first_line: start_line,
                });
                start = offset;
                start_line = number;
                has_content = false;
            }
            has_marker = true;
        }
        offset += line.len();
        if is_marker(bare, "...") {
            segments.push(Chunk {
                text: &text[start..offset],
                first_line: start_line,
            });
            start = offset;
            start_line = number + 1;
            has_content = false;
            has_marker = false;
            continue;
        }
        let trimmed = bare.trim_start();
        if is_marker(bare, "---") {
            // `--- value` carries content on the marker line.
            has_content |= !bare[3..].trim().is_empty() && !bare[3..].trim().starts_with('#');
            continue;
        }
        if !(trimmed.is_empty() || trimmed.starts_with('#') || bare.starts_with('%')) {
            has_content = true;
        }
    }
    if start < text.len() {
        segments.push(Chunk {
            text: &text[start..],
            first_line: start_line,
        });
    }
    segments
}

fn is_marker(line: &str, marker: &str) -> bool {
    line.strip_prefix(marker)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
}

/// 0-based offset of the first line that is not blank, a comment, a
/// directive or a bare document marker.
fn first_content_line(text: &str) -> Option<usize> {
    text.lines().position(|l| {
        let t = l.trim_start();
        !(t.is_empty()
            || t.starts_with('#')
            || l.starts_with('%')
            || is_marker(l.trim_end(), "---"))
    })
}

fn yaml_error(file: &str, index: usize, segment: &Chunk<'_>, e: &bounded_yaml::Error) -> YamlError {
    let offset = segment.first_line - 1;
    // The YAML reader puts an error at the end of a document without a
    // final line break one line past its last line: held to the last line
    // that has text, so the position is always in the file.
    let last_line = segment.first_line
        + segment
            .text
            .trim_end_matches(['\n', '\r'])
            .matches('\n')
            .count();
    let (line, column) = match e.location() {
        Some((line, column)) => ((line + offset).min(last_line), Some(column)),
        None => (
            first_content_line(segment.text).map_or(segment.first_line, |l| segment.first_line + l),
            None,
        ),
    };
    YamlError {
        file: file.to_owned(),
        index,
        line,
        column,
        message: shift_lines(&e.to_string(), offset, last_line),
    }
}

/// Rewrites every "line N column" in a parser message by `offset` lines, so
/// that positions inside one document read as positions in the file, held
/// to `last_line` (see `yaml_error`).
fn shift_lines(message: &str, offset: usize, last_line: usize) -> String {
    const WORD: &str = "line ";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(WORD) {
        out.push_str(&rest[..at + WORD.len()]);
        rest = &rest[at + WORD.len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0
            && rest[digits..].starts_with(" column")
            && let Ok(n) = rest[..digits].parse::<usize>()
        {
            out.push_str(&(n + offset).min(last_line).to_string());
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out
}

/// A step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// A mapping key.
    Key(String),
    /// A sequence index.
    Index(usize),
}

/// Parses `a.b[0].c` (also `a["x.y"]`, `a['x.y']`) into steps.
fn parse_path(path: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut key = String::new();
    let mut chars = path.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '.' => {
                if !key.is_empty() {
                    steps.push(Step::Key(std::mem::take(&mut key)));
                }
            }
            '[' => {
                if !key.is_empty() {
                    steps.push(Step::Key(std::mem::take(&mut key)));
                }
                let mut inner = String::new();
                for c in chars.by_ref() {
                    if c == ']' {
                        break;
                    }
                    inner.push(c);
                }
                let quoted = inner.len() >= 2
                    && ((inner.starts_with('"') && inner.ends_with('"'))
                        || (inner.starts_with('\'') && inner.ends_with('\'')));
                if quoted {
                    steps.push(Step::Key(inner[1..inner.len() - 1].to_owned()));
                } else if let Ok(i) = inner.parse() {
                    steps.push(Step::Index(i));
                } else {
                    steps.push(Step::Key(inner));
                }
            }
            c => key.push(c),
        }
    }
    if !key.is_empty() {
        steps.push(Step::Key(key));
    }
    steps
}

/// A significant line: not blank, not a comment, not a marker.
#[derive(Debug, Clone, Copy)]
struct Line<'a> {
    /// File line number.
    number: usize,
    /// Column of the content.
    indent: usize,
    /// The content (from `indent` on, comments not removed).
    text: &'a str,
}

fn significant_lines(text: &str, first_line: usize) -> Vec<Line<'_>> {
    text.lines()
        .enumerate()
        .filter_map(|(i, raw)| {
            let trimmed = raw.trim_start_matches(' ');
            let t = trimmed.trim_end();
            if t.is_empty()
                || t.starts_with('#')
                || raw.starts_with('%')
                || is_marker(raw.trim_end(), "---")
                || is_marker(raw.trim_end(), "...")
            {
                return None;
            }
            Some(Line {
                number: first_line + i,
                indent: raw.len() - trimmed.len(),
                text: trimmed,
            })
        })
        .collect()
}

/// The key a block-mapping line starts with, and the rest after `key:`.
fn line_key(text: &str) -> Option<(String, &str)> {
    let (key, rest) = if let Some(q @ ('"' | '\'')) = text.chars().next() {
        let end = text[1..].find(q)? + 1;
        (text[1..end].to_owned(), &text[end + 1..])
    } else {
        let colon = text
            .match_indices(':')
            .find(|(i, _)| {
                let after = &text[i + 1..];
                after.is_empty() || after.starts_with([' ', '\t'])
            })?
            .0;
        (text[..colon].trim_end().to_owned(), &text[colon..])
    };
    let rest = rest.trim_start().strip_prefix(':')?;
    Some((key, rest.trim()))
}

/// Whether a value written after `key:` on the same line is a scalar or
/// flow collection (nothing below it can be followed).
fn inline_value(rest: &str) -> bool {
    !(rest.is_empty() || rest.starts_with('#') || rest.starts_with(['|', '>', '&', '!']))
}

fn is_item(text: &str) -> bool {
    text == "-" || text.starts_with("- ")
}

/// The line of the deepest step of `steps` found in `text` (whose first
/// line is file line `first_line`), `None` when not even the first is.
fn locate_in(text: &str, first_line: usize, steps: &[Step]) -> Option<usize> {
    let mut scope: Vec<Line<'_>> = significant_lines(text, first_line);
    let mut found = None;
    for step in steps {
        let Some(level) = scope.iter().map(|l| l.indent).min() else {
            break;
        };
        match step {
            Step::Key(k) => {
                let Some(p) = scope.iter().position(|l| {
                    l.indent == level && line_key(l.text).is_some_and(|(key, _)| key == *k)
                }) else {
                    break;
                };
                let line = scope[p];
                found = Some(line.number);
                if line_key(line.text).is_none_or(|(_, rest)| inline_value(rest)) {
                    break;
                }
                let end = scope[p + 1..]
                    .iter()
                    .position(|l| l.indent < level || (l.indent == level && !is_item(l.text)))
                    .map_or(scope.len(), |e| p + 1 + e);
                scope = scope[p + 1..end].to_vec();
            }
            Step::Index(i) => {
                let items: Vec<usize> = scope
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| l.indent == level && is_item(l.text))
                    .map(|(p, _)| p)
                    .collect();
                let Some(&p) = items.get(*i) else {
                    break;
                };
                let end = items.get(i + 1).copied().unwrap_or_else(|| {
                    scope[p + 1..]
                        .iter()
                        .position(|l| l.indent <= level)
                        .map_or(scope.len(), |e| p + 1 + e)
                });
                let line = scope[p];
                found = Some(line.number);
                let content = line.text[1..].trim_start_matches(' ');
                let mut next = Vec::with_capacity(end - p);
                if !content.is_empty() {
                    if line_key(content).is_none() {
                        // A scalar or flow collection as the item.
                        break;
                    }
                    next.push(Line {
                        number: line.number,
                        indent: line.indent + (line.text.len() - content.len()),
                        text: content,
                    });
                }
                next.extend_from_slice(&scope[p + 1..end]);
                scope = next;
            }
        }
    }
    found
}

#[cfg(test)]
mod tests;
