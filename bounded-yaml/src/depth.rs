//! The nesting pre-scan: one pass over the text that tracks how deeply
//! block and flow collections nest and stops at the first collection past
//! the limit, before the YAML library sees the text.
//!
//! Hand-written because `yaml_serde` checks its recursion limit only while
//! it deserializes, after its loader has scanned the whole document into
//! events; on 100,000 nested `[` that scan is most of a second (release)
//! for an input that is refused at the 129th. The library exposes no event
//! stream to stop early on, and its scanner is `unsafe` code we may not call
//! directly (`unsafe_code = "forbid"`).
//!
//! The scan is deliberately a *lower bound* of the depth the library will
//! find, so that it never refuses a document the library would accept:
//! whatever it is unsure of (scalar text, block scalars, continuation
//! lines, the rest of a line after a flow collection) it skips without
//! counting, and a block collection that starts at the same column as its
//! parent (`key:` then `- item` below it) is counted once. A document it
//! lets through is still held to the library's own limit.

/// Where the nesting limit was crossed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crossing {
    /// Byte offset of the indicator (`[`, `{`, `-`, `?`, `:` or the first
    /// character of a key) that opened the collection one level too deep.
    /// The scan read nothing past it.
    pub offset: usize,
    /// Its 1-based line, counting `\n` only: the lines a file split on
    /// `\n` has, as the CLI numbers them (libyaml's own messages count a
    /// lone `\r` too).
    pub line: usize,
    /// Its 1-based column, in characters.
    pub column: usize,
}

/// Scans `text` and returns where a collection nests deeper than `limit`
/// levels, if one does. Linear in the bytes read, and it reads no further
/// than the crossing.
pub fn scan(text: &str, limit: usize) -> Result<(), Crossing> {
    let mut scanner = Scanner {
        b: text.as_bytes(),
        i: 0,
        limit,
        block: Vec::new(),
        flow: 0,
        skip_deeper_than: None,
    };
    while scanner.i < scanner.b.len() {
        if let Err(offset) = scanner.line() {
            return Err(crossing(text, offset));
        }
    }
    Ok(())
}

/// Line and column of a byte offset.
fn crossing(text: &str, offset: usize) -> Crossing {
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |n| n + 1);
    Crossing {
        offset,
        line: before.bytes().filter(|&c| c == b'\n').count() + 1,
        column: before[line_start..].chars().count() + 1,
    }
}

/// A line break: YAML's are `\n`, `\r` and `\r\n`, and libyaml takes a
/// lone `\r` as one, so the scan must too (or a `\r`-separated document
/// would read as one line, and its nesting go uncounted).
fn is_break(c: u8) -> bool {
    matches!(c, b'\n' | b'\r')
}

/// Space, tab, or a line break.
fn is_blank(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

struct Scanner<'a> {
    b: &'a [u8],
    /// Where the scan is.
    i: usize,
    limit: usize,
    /// Columns of the open block collections, innermost last.
    block: Vec<usize>,
    /// Open flow collections.
    flow: usize,
    /// After a scalar value: lines indented more than this continue it
    /// (-1: every line, for a scalar at the top).
    skip_deeper_than: Option<isize>,
}

/// The scan stops with the offset of the crossing.
type Step<T> = Result<T, usize>;

impl Scanner<'_> {
    /// Index of the end of the line holding `from` (its line break, or the
    /// end of the text).
    fn line_end(&self, from: usize) -> usize {
        self.b[from..]
            .iter()
            .position(|&c| is_break(c))
            .map_or(self.b.len(), |n| from + n)
    }

    /// Whether `i` is at a line break or the end of the text.
    fn eol(&self, i: usize) -> bool {
        self.b.get(i).is_none_or(|&c| is_break(c))
    }

    /// Moves on to the line after the one holding `from`. Only a line
    /// that is done with is searched to its end: the scan never reads past
    /// a crossing, however long its line.
    fn next_line(&mut self, from: usize) {
        let end = self.line_end(from);
        self.i = end + 1;
        if self.b.get(end) == Some(&b'\r') && self.b.get(end + 1) == Some(&b'\n') {
            self.i += 1;
        }
    }

    /// Whether the byte at `i` is a blank or the end of the text.
    fn blank_at(&self, i: usize) -> bool {
        self.b.get(i).is_none_or(|&c| is_blank(c))
    }

    /// Whether the line at `start` is a document marker (`---` or `...`).
    fn marker(&self, start: usize, marker: &[u8]) -> bool {
        self.b[start..].starts_with(marker) && self.blank_at(start + 3)
    }

    /// Threshold for the lines that continue a scalar ending this line.
    fn scalar_ends_line(&mut self) {
        self.skip_deeper_than = Some(self.block.last().map_or(-1, |&c| c as isize));
    }

    /// A block collection whose indicator is at `column` (byte `at`).
    fn open_block(&mut self, column: usize, at: usize) -> Step<()> {
        if self.block.last().is_none_or(|&top| top < column) {
            self.block.push(column);
            if self.block.len() + self.flow > self.limit {
                return Err(at);
            }
        }
        Ok(())
    }

    /// One line, in block context, from its start.
    fn line(&mut self) -> Step<()> {
        let start = self.i;
        if self.marker(start, b"---") || self.marker(start, b"...") {
            self.block.clear();
            self.skip_deeper_than = None;
            if self.b[start] == b'.' {
                self.next_line(start);
                return Ok(());
            }
            return self.nodes(start, start + 3);
        }
        let indent = self.b[start..].iter().take_while(|&&c| c == b' ').count();
        let content = start + indent;
        let first = self.b.get(content).copied();
        if first.is_none_or(|c| c == b'#' || is_blank(c)) {
            self.next_line(start);
            return Ok(());
        }
        if let Some(t) = self.skip_deeper_than {
            if indent as isize > t {
                self.next_line(start);
                return Ok(());
            }
            self.skip_deeper_than = None;
        }
        if indent == 0 && first == Some(b'%') {
            self.next_line(start);
            return Ok(());
        }
        while self.block.last().is_some_and(|&top| top > indent) {
            self.block.pop();
        }
        self.nodes(start, content)
    }

    /// The nodes of a line from `p` (a node's start) to its end; `start` is
    /// where the line starts, for columns. Leaves `self.i` at the next line.
    fn nodes(&mut self, mut start: usize, mut p: usize) -> Step<()> {
        loop {
            while !self.eol(p) && matches!(self.b[p], b' ' | b'\t') {
                p += 1;
            }
            if self.eol(p) || matches!(self.b[p], b'#' | b'\r') {
                // An empty node: what follows on deeper lines is its content.
                self.next_line(p);
                return Ok(());
            }
            let column = p - start;
            match self.b[p] {
                b'-' | b'?' | b':' if self.blank_at(p + 1) => {
                    self.open_block(column, p)?;
                    p += 1;
                }
                b'&' | b'!' => {
                    while !self.blank_at(p) {
                        p += 1;
                    }
                }
                b'|' | b'>' => {
                    self.scalar_ends_line();
                    self.next_line(p);
                    return Ok(());
                }
                c @ (b'[' | b'{' | b'"' | b'\'') => {
                    let q = if matches!(c, b'[' | b'{') {
                        self.flow_collection(p)?
                    } else {
                        self.quoted(p)
                    };
                    let crossed = self.b[p..q].iter().any(|&c| is_break(c));
                    if crossed {
                        start =
                            p + self.b[p..q].iter().rposition(|&c| is_break(c)).unwrap_or(0) + 1;
                    }
                    let mut k = q;
                    while !self.eol(k) && matches!(self.b[k], b' ' | b'\t') {
                        k += 1;
                    }
                    if !crossed && !self.eol(k) && self.b[k] == b':' && self.blank_at(k + 1) {
                        // A single-line flow or quoted key.
                        self.open_block(column, p)?;
                        p = k + 1;
                        continue;
                    }
                    if c == b'"' || c == b'\'' {
                        self.scalar_ends_line();
                    }
                    self.next_line(k);
                    return Ok(());
                }
                _ => {
                    // A plain scalar (or an alias): a key if `: ` follows on
                    // this line, else a value that may continue below.
                    let mut k = p;
                    let mut key = None;
                    while !self.eol(k) {
                        match self.b[k] {
                            b':' if self.blank_at(k + 1) => {
                                key = Some(k);
                                break;
                            }
                            b'#' if is_blank(self.b[k - 1]) => break,
                            _ => k += 1,
                        }
                    }
                    let Some(k) = key else {
                        self.scalar_ends_line();
                        self.next_line(k);
                        return Ok(());
                    };
                    self.open_block(column, p)?;
                    p = k + 1;
                }
            }
        }
    }

    /// A flow collection from its opening bracket at `p`; returns the index
    /// after its closing bracket (or the end of the text).
    fn flow_collection(&mut self, p: usize) -> Step<usize> {
        let mut i = p;
        let mut node_start = true;
        let mut after_blank = true;
        while i < self.b.len() {
            let c = self.b[i];
            match c {
                b'[' | b'{' => {
                    self.flow += 1;
                    if self.block.len() + self.flow > self.limit {
                        return Err(i);
                    }
                    node_start = true;
                }
                b']' | b'}' => {
                    self.flow = self.flow.saturating_sub(1);
                    node_start = false;
                    if self.flow == 0 {
                        return Ok(i + 1);
                    }
                }
                b',' | b':' | b'?' => node_start = true,
                b'#' if after_blank => {
                    i = self.line_end(i);
                    continue;
                }
                b'"' | b'\'' if node_start => {
                    i = self.quoted(i);
                    node_start = false;
                    after_blank = false;
                    continue;
                }
                b'&' | b'!' if node_start => {
                    while i < self.b.len() && !is_blank(self.b[i]) && !b"[]{},".contains(&self.b[i])
                    {
                        i += 1;
                    }
                    continue;
                }
                _ if is_blank(c) => {}
                _ => node_start = false,
            }
            after_blank = is_blank(c);
            i += 1;
        }
        Ok(i)
    }

    /// A quoted scalar from its opening quote at `p`; returns the index
    /// after its closing quote (or the end of the text).
    fn quoted(&self, p: usize) -> usize {
        let quote = self.b[p];
        let mut i = p + 1;
        while i < self.b.len() {
            let c = self.b[i];
            if quote == b'"' && c == b'\\' {
                i += 2;
                continue;
            }
            if c == quote {
                if quote == b'\'' && self.b.get(i + 1) == Some(&b'\'') {
                    i += 2;
                    continue;
                }
                return i + 1;
            }
            i += 1;
        }
        self.b.len()
    }
}

#[cfg(test)]
mod tests;
