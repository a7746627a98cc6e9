//! The control file (`MOCK_NVML_CONTROL`): commands, one per line, that
//! change GPU health while the library runs (`xid 0 79`, `lose 1`, ...).
//!
//! [`Lines`] cuts a byte stream into bounded lines; [`start`] runs the
//! background thread that follows the file (a regular file like `tail -f`,
//! a FIFO re-opened after every writer closes it), parses each line with
//! [`crate::command`] and applies it through [`crate::faults`]. A bad line
//! is reported on stderr with its number and changes nothing.

use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use crate::command::parse_bytes;
use crate::faults;

/// Longest line accepted, in bytes (without the newline).
pub const MAX_LINE: usize = 1024;

/// How often a regular file is checked for new lines.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(50);
/// How often a missing control file is looked for.
const MISSING_INTERVAL: Duration = Duration::from_millis(100);

/// A line cut from the stream: its number and its bytes, or a line that
/// was too long (its bytes dropped).
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A complete line (without the newline; a trailing `\r` removed).
    Text(u64, Vec<u8>),
    /// A line longer than [`MAX_LINE`].
    TooLong(u64),
}

/// Cuts a byte stream into numbered lines of at most [`MAX_LINE`] bytes;
/// memory stays bounded whatever the input.
#[derive(Debug, Default)]
pub struct Lines {
    buffer: Vec<u8>,
    overlong: bool,
    number: u64,
}

impl Lines {
    /// Feeds bytes; returns the lines completed by them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Line> {
        let mut out = Vec::new();
        for &b in bytes {
            if b == b'\n' {
                out.push(self.finish());
            } else if !self.overlong {
                if self.buffer.len() == MAX_LINE {
                    self.overlong = true;
                    self.buffer.clear();
                } else {
                    self.buffer.push(b);
                }
            }
        }
        out
    }

    /// Ends the stream: a last line without its newline, if any.
    pub fn flush(&mut self) -> Option<Line> {
        (self.overlong || !self.buffer.is_empty()).then(|| self.finish())
    }

    fn finish(&mut self) -> Line {
        self.number += 1;
        let line = if self.overlong {
            Line::TooLong(self.number)
        } else {
            let mut text = std::mem::take(&mut self.buffer);
            if text.last() == Some(&b'\r') {
                text.pop();
            }
            Line::Text(self.number, text)
        };
        self.overlong = false;
        self.buffer.clear();
        line
    }

    /// Starts over at line 1 (a truncated file).
    fn reset(&mut self) {
        *self = Lines::default();
    }
}

/// Applies one line: parsed, then applied whole or not at all; a failure
/// is reported on stderr with the line number.
fn apply_line(path: &Path, line: Line) {
    let (number, result) = match line {
        Line::TooLong(n) => (n, Err(format!("longer than {MAX_LINE} bytes, ignored"))),
        Line::Text(n, bytes) => (
            n,
            parse_bytes(&bytes)
                .map_err(|e| e.to_string())
                .and_then(|c| c.map_or(Ok(()), |c| faults::apply(&c))),
        ),
    };
    if let Err(message) = result {
        eprintln!(
            "mock-nvml: control file {} line {number}: {message}",
            path.display()
        );
    }
}

/// The control paths whose follower thread runs (one per path).
static FOLLOWED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Starts following `path` unless it is followed already. A regular file
/// that exists is read to its end first, before this returns, so faults it
/// records are in place when `nvmlInit` returns (a restarted process sees
/// the faults again, without their events); the thread then follows what is
/// appended. A FIFO, or a file that does not exist yet, is read by the
/// thread only.
pub fn start(path: &Path) {
    {
        let mut followed = FOLLOWED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if followed.iter().any(|p| p == path) {
            return;
        }
        followed.push(path.to_path_buf());
    }
    let mut lines = Lines::default();
    let mut file = None;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.file_type().is_file()
        && let Ok(mut f) = std::fs::File::open(path)
    {
        read_available(path, &mut f, &mut lines);
        file = Some(f);
    }
    let path = path.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("mock-nvml-control".into())
        .spawn(move || follow(&path, file, lines));
    if let Err(e) = spawned {
        eprintln!("mock-nvml: cannot start the control file thread: {e}");
    }
}

/// Reads and applies every complete line available now; returns false at a
/// read error.
fn read_available(path: &Path, file: &mut std::fs::File, lines: &mut Lines) -> bool {
    let mut chunk = [0u8; 4096];
    loop {
        match file.read(&mut chunk) {
            Ok(0) => return true,
            Ok(n) => {
                for line in lines.feed(&chunk[..n]) {
                    apply_line(path, line);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                eprintln!("mock-nvml: control file {}: {e}", path.display());
                return false;
            }
        }
    }
}

/// The thread: follows a regular file, or re-opens a FIFO after each EOF.
fn follow(path: &Path, mut file: Option<std::fs::File>, mut lines: Lines) {
    use std::io::Seek;
    let mut reported_missing = false;
    loop {
        let Some(f) = file.as_mut() else {
            match std::fs::File::open(path) {
                Ok(f) => {
                    file = Some(f);
                    reported_missing = false;
                }
                Err(e) => {
                    if !reported_missing {
                        eprintln!(
                            "mock-nvml: control file {}: {e}; waiting for it",
                            path.display()
                        );
                        reported_missing = true;
                    }
                    std::thread::sleep(MISSING_INTERVAL);
                }
            }
            continue;
        };
        let fifo = f.metadata().is_ok_and(|m| m.file_type().is_fifo());
        if !read_available(path, f, &mut lines) {
            file = None;
            std::thread::sleep(MISSING_INTERVAL);
            continue;
        }
        if fifo {
            // Every writer closed it: a last line without newline counts,
            // and the next writer starts a fresh stream.
            if let Some(line) = lines.flush() {
                apply_line(path, line);
            }
            file = None;
            continue;
        }
        // A regular file at its end: wait for more; start over when it was
        // truncated or replaced.
        std::thread::sleep(FOLLOW_INTERVAL);
        let position = f.stream_position().unwrap_or(0);
        let replaced = match (f.metadata(), std::fs::metadata(path)) {
            (Ok(open), Ok(named)) => {
                use std::os::unix::fs::MetadataExt;
                open.ino() != named.ino() || open.dev() != named.dev() || named.len() < position
            }
            _ => false,
        };
        if replaced {
            lines.reset();
            file = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_numbered_bounded_and_split_across_reads() {
        let mut lines = Lines::default();
        assert_eq!(lines.feed(b"xid 0 "), vec![]);
        assert_eq!(
            lines.feed(b"79\r\nlose 1\n\n"),
            vec![
                Line::Text(1, b"xid 0 79".to_vec()),
                Line::Text(2, b"lose 1".to_vec()),
                Line::Text(3, Vec::new()),
            ]
        );
        let mut long = vec![b'x'; MAX_LINE + 1];
        long.push(b'\n');
        long.extend_from_slice(b"restore 1\n");
        assert_eq!(
            lines.feed(&long),
            vec![Line::TooLong(4), Line::Text(5, b"restore 1".to_vec())]
        );
        // Exactly MAX_LINE bytes is still a line.
        let mut edge = vec![b'#'; MAX_LINE];
        edge.push(b'\n');
        assert_eq!(lines.feed(&edge), vec![Line::Text(6, vec![b'#'; MAX_LINE])]);
        // A huge line without newline keeps memory bounded.
        assert_eq!(lines.feed(&vec![b'y'; 10 * MAX_LINE]), vec![]);
        assert!(lines.buffer.len() <= MAX_LINE);
        assert_eq!(lines.flush(), Some(Line::TooLong(7)));
        assert_eq!(lines.flush(), None);
        assert_eq!(lines.feed(b"lose 2"), vec![]);
        assert_eq!(lines.flush(), Some(Line::Text(8, b"lose 2".to_vec())));
    }
}
