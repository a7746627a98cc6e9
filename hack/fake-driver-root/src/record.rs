//! The fake programs' call log, parsed back.
//!
//! Each record is a run of NUL-terminated fields: `REC`, the record kind, the
//! number of fields that follow, then the fields. Program arguments and
//! environment values cannot contain NUL, so any byte string (spaces,
//! newlines, quotes) round-trips exactly.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::layout::RECORDED_ENV;

/// One invocation of a fake program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The program's name (`nvidia-smi`, `nvidia-cuda-mps-control`, ...).
    pub tool: String,
    /// Its arguments (without argv\[0\]).
    pub args: Vec<String>,
    /// The recorded environment ([`RECORDED_ENV`]): `None` when unset.
    pub env: BTreeMap<String, Option<String>>,
}

impl Call {
    /// The value of a recorded environment variable, if it was set.
    pub fn env(&self, name: &str) -> Option<&str> {
        self.env.get(name).and_then(|v| v.as_deref())
    }
}

/// One command the fake MPS control daemon received from a client, in the
/// order the daemon processed them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpsCommand {
    /// The daemon's pipe directory (`CUDA_MPS_PIPE_DIRECTORY`).
    pub pipe_dir: PathBuf,
    /// The command line as received.
    pub command: String,
    /// Whether the daemon accepted it.
    pub ok: bool,
}

/// A record of the call log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A program was run.
    Call(Call),
    /// The MPS control daemon processed a command.
    MpsCommand(MpsCommand),
}

fn text(field: &[u8]) -> String {
    String::from_utf8_lossy(field).into_owned()
}

/// Parses a whole call log; the error names the byte offset of the bad record.
pub(crate) fn parse(bytes: &[u8]) -> Result<Vec<Record>, (usize, String)> {
    let mut fields: Vec<(usize, &[u8])> = Vec::new();
    let mut start = 0;
    for (i, b) in bytes.iter().enumerate() {
        if *b == 0 {
            fields.push((start, &bytes[start..i]));
            start = i + 1;
        }
    }
    if start != bytes.len() {
        return Err((start, "unterminated field at the end of the log".into()));
    }
    let mut out = Vec::new();
    let mut it = fields.into_iter();
    while let Some((offset, marker)) = it.next() {
        if marker != b"REC" {
            return Err((offset, format!("expected REC, found {:?}", text(marker))));
        }
        let kind = it
            .next()
            .ok_or((offset, "record without a kind".to_owned()))?
            .1;
        let count = it
            .next()
            .ok_or((offset, "record without a field count".to_owned()))?
            .1;
        let count: usize = std::str::from_utf8(count)
            .ok()
            .and_then(|c| c.parse().ok())
            .ok_or((offset, format!("bad field count {:?}", text(count))))?;
        let body: Vec<&[u8]> = it.by_ref().take(count).map(|(_, f)| f).collect();
        if body.len() != count {
            return Err((
                offset,
                format!("record announces {count} fields, has {}", body.len()),
            ));
        }
        out.push(match kind {
            b"call" => Record::Call(parse_call(&body).map_err(|e| (offset, e))?),
            b"mps-command" => {
                let [pipe, command, status] = body[..] else {
                    return Err((offset, format!("mps-command with {count} fields, not 3")));
                };
                Record::MpsCommand(MpsCommand {
                    pipe_dir: PathBuf::from(text(pipe)),
                    command: text(command),
                    ok: status == b"0",
                })
            }
            other => return Err((offset, format!("unknown record kind {:?}", text(other)))),
        });
    }
    Ok(out)
}

fn parse_call(body: &[&[u8]]) -> Result<Call, String> {
    let [tool, argc, rest @ ..] = body else {
        return Err("call record without tool and argument count".into());
    };
    let argc: usize = std::str::from_utf8(argc)
        .ok()
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad argument count {:?}", text(argc)))?;
    if rest.len() != argc + RECORDED_ENV.len() {
        return Err(format!(
            "call record has {} fields after the count, expected {} arguments and {} variables",
            rest.len(),
            argc,
            RECORDED_ENV.len()
        ));
    }
    let args = rest[..argc].iter().map(|a| text(a)).collect();
    let mut env = BTreeMap::new();
    for (name, field) in RECORDED_ENV.iter().zip(&rest[argc..]) {
        let field = text(field);
        let value = if field == *name {
            None
        } else if let Some(v) = field.strip_prefix(&format!("{name}=")) {
            Some(v.to_owned())
        } else {
            return Err(format!("expected variable {name}, found {field:?}"));
        };
        env.insert((*name).to_owned(), value);
    }
    Ok(Call {
        tool: text(tool),
        args,
        env,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: &str, fields: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for f in ["REC", kind, &fields.len().to_string()]
            .iter()
            .chain(fields.iter())
        {
            out.extend_from_slice(f.as_bytes());
            out.push(0);
        }
        out
    }

    #[test]
    fn calls_and_commands_round_trip() {
        let mut log = rec(
            "call",
            &[
                "nvidia-smi",
                "2",
                "a b",
                "line\nbreak",
                "CUDA_VISIBLE_DEVICES=GPU-1",
                "NVIDIA_VISIBLE_DEVICES",
                "CUDA_MPS_PIPE_DIRECTORY=",
                "CUDA_MPS_LOG_DIRECTORY",
            ],
        );
        log.extend(rec("mps-command", &["/p", "quit", "0"]));
        let records = parse(&log).unwrap();
        assert_eq!(records.len(), 2);
        let Record::Call(call) = &records[0] else {
            panic!("not a call: {records:?}")
        };
        assert_eq!(call.tool, "nvidia-smi");
        assert_eq!(call.args, ["a b", "line\nbreak"]);
        assert_eq!(call.env("CUDA_VISIBLE_DEVICES"), Some("GPU-1"));
        assert_eq!(call.env("CUDA_MPS_PIPE_DIRECTORY"), Some(""));
        assert_eq!(call.env("NVIDIA_VISIBLE_DEVICES"), None);
        assert_eq!(
            records[1],
            Record::MpsCommand(MpsCommand {
                pipe_dir: "/p".into(),
                command: "quit".into(),
                ok: true
            })
        );
    }

    #[test]
    fn empty_log_has_no_records() {
        assert_eq!(parse(b"").unwrap(), vec![]);
    }

    #[test]
    fn malformed_logs_name_the_offset() {
        let good = rec("mps-command", &["/p", "x", "1"]);
        let mut torn = good.clone();
        torn.extend_from_slice(b"REC\0call\x003\0nvid");
        let err = parse(&torn).unwrap_err();
        assert_eq!(err.0, good.len() + 11);
        assert!(err.1.contains("unterminated"), "{err:?}");

        let err = parse(b"XYZ\0").unwrap_err();
        assert_eq!(err, (0, "expected REC, found \"XYZ\"".into()));
        assert!(
            parse(b"REC\0call\0x\0")
                .unwrap_err()
                .1
                .contains("bad field count")
        );
        assert!(
            parse(b"REC\0call\x005\0a\0")
                .unwrap_err()
                .1
                .contains("announces 5 fields")
        );
        assert!(
            parse(b"REC\0what\x000\0")
                .unwrap_err()
                .1
                .contains("unknown record kind")
        );
        assert!(
            parse(&rec("call", &["t", "9", "x"]))
                .unwrap_err()
                .1
                .contains("expected 9 arguments")
        );
        assert!(
            parse(&rec("call", &["t", "0", "A", "B", "C", "D"]))
                .unwrap_err()
                .1
                .contains("expected variable CUDA_VISIBLE_DEVICES")
        );
    }
}
