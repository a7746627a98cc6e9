//! The commands of the control file (`MOCK_NVML_CONTROL`), one per line
//! (`xid 0 79`, `lose 1`, `processes 0 4242:512`, ...): [`Command`] and its parser, pure so that
//! hostile input is unit tested. [`crate::control`] follows the file and
//! [`crate::faults`] applies each command.

use std::fmt;

use crate::health::{Recovery, Slowdown};
use crate::processes::{self, MAX_PROCESSES, Process};

/// One command. GPUs are named by their minor number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `xid <minor> <xid> [<gi> <ci>]`: an XID event, of one MIG device
    /// when GI and CI are given, of the whole GPU otherwise.
    Xid {
        /// The GPU.
        minor: u32,
        /// The XID number.
        xid: u64,
        /// GPU instance and compute instance ids.
        instance: Option<(u32, u32)>,
    },
    /// `lose <minor>`: the GPU falls off the bus.
    Lose {
        /// The GPU.
        minor: u32,
    },
    /// `restore <minor>`: the GPU answers again.
    Restore {
        /// The GPU.
        minor: u32,
    },
    /// `recovery <minor> none|reset|reboot|drain`: field 230 changes, with
    /// a recovery-action event.
    Recovery {
        /// The GPU.
        minor: u32,
        /// The new action.
        action: Recovery,
    },
    /// `remap <minor> <pending> <failure>` (each 0 or 1).
    Remap {
        /// The GPU.
        minor: u32,
        /// A remap waits for a reset.
        pending: bool,
        /// A remap failed.
        failure: bool,
    },
    /// `ecc <minor> <uncorrected>`: the volatile uncorrected ECC count; a
    /// rise emits a double-bit ECC event.
    Ecc {
        /// The GPU.
        minor: u32,
        /// The new count.
        uncorrected: u64,
    },
    /// `nvlink <minor> <link> up|down`.
    Nvlink {
        /// The GPU.
        minor: u32,
        /// The link number.
        link: u32,
        /// Up (true) or down.
        up: bool,
    },
    /// `refuse-events <minor>`: event registration fails from now on.
    RefuseEvents {
        /// The GPU.
        minor: u32,
    },
    /// `accept-events <minor>`: event registration works again.
    AcceptEvents {
        /// The GPU.
        minor: u32,
    },
    /// `slowdown <minor> none|hw|thermal|power-brake`: the active
    /// clock-event reason.
    Slowdown {
        /// The GPU.
        minor: u32,
        /// The reason.
        reason: Slowdown,
    },
    /// `pcie-replays <minor> <count>`: the PCIe replay counter.
    PcieReplays {
        /// The GPU.
        minor: u32,
        /// The new counter value.
        count: u32,
    },
    /// `processes <minor> [<pid>[:<MiB>] ...]` (compute contexts) or
    /// `graphics-processes <minor> ...` (graphics contexts): replaces that
    /// list of the GPU's processes; no pid clears it.
    Processes {
        /// The GPU.
        minor: u32,
        /// The graphics list (true) or the compute list.
        graphics: bool,
        /// The new list (checked: pids not 0 and unique, at most
        /// [`MAX_PROCESSES`]).
        processes: Vec<Process>,
    },
}

impl Command {
    /// The GPU the command is about.
    pub fn minor(&self) -> u32 {
        match *self {
            Command::Xid { minor, .. }
            | Command::Lose { minor }
            | Command::Restore { minor }
            | Command::Recovery { minor, .. }
            | Command::Remap { minor, .. }
            | Command::Ecc { minor, .. }
            | Command::Nvlink { minor, .. }
            | Command::RefuseEvents { minor }
            | Command::AcceptEvents { minor }
            | Command::Slowdown { minor, .. }
            | Command::PcieReplays { minor, .. }
            | Command::Processes { minor, .. } => minor,
        }
    }
}

/// The verbs with their arguments, for error messages.
pub const USAGE: &[&str] = &[
    "xid <minor> <xid> [<gi> <ci>]",
    "lose <minor>",
    "restore <minor>",
    "recovery <minor> none|reset|reboot|drain",
    "remap <minor> <pending 0|1> <failure 0|1>",
    "ecc <minor> <uncorrected>",
    "nvlink <minor> <link> up|down",
    "refuse-events <minor>",
    "accept-events <minor>",
    "slowdown <minor> none|hw|thermal|power-brake",
    "pcie-replays <minor> <count>",
    "processes <minor> [<pid>[:<MiB>] ...]",
    "graphics-processes <minor> [<pid>[:<MiB>] ...]",
];

/// Why a line is not a command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError(String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Shows at most 40 characters of a word (hostile lines can be long).
fn shown(word: &str) -> String {
    let mut out: String = word.chars().take(40).collect();
    if out.len() < word.len() {
        out.push('…');
    }
    format!("{out:?}")
}

fn number<T: std::str::FromStr + Bounded>(
    verb: &str,
    what: &str,
    word: &str,
) -> Result<T, ParseError> {
    // Decimal digits only: no sign, no spaces, no 0x.
    if word.is_empty() || !word.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError(format!(
            "{verb}: {what} {} is not a decimal number",
            shown(word)
        )));
    }
    word.parse().map_err(|_| {
        ParseError(format!(
            "{verb}: {what} {} is out of range (0 to {})",
            shown(word),
            T::MAX
        ))
    })
}

/// A number type with its largest value (shown in range errors).
trait Bounded: fmt::Display {
    const MAX: Self;
}
impl Bounded for u32 {
    const MAX: Self = u32::MAX;
}
impl Bounded for u64 {
    const MAX: Self = u64::MAX;
}

fn flag(verb: &str, what: &str, word: &str) -> Result<bool, ParseError> {
    match word {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(ParseError(format!(
            "{verb}: {what} {} is not 0 or 1",
            shown(word)
        ))),
    }
}

/// `word` read by `from_word`, else an error listing `words`, the ones it
/// takes.
fn one_of<T>(
    verb: &str,
    what: &str,
    word: &str,
    from_word: fn(&str) -> Option<T>,
    words: &[&str],
) -> Result<T, ParseError> {
    from_word(word).ok_or_else(|| {
        ParseError(format!(
            "{verb}: {what} {} is not one of {}",
            shown(word),
            words.join(", ")
        ))
    })
}

/// Parses one line. Blank lines and `#` comments are `Ok(None)`.
pub fn parse(line: &str) -> Result<Option<Command>, ParseError> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let words: Vec<&str> = line.split_ascii_whitespace().collect();
    let verb = words[0];
    let args = &words[1..];
    let usage = USAGE
        .iter()
        .find(|u| u.split(' ').next() == Some(verb))
        .ok_or_else(|| {
            ParseError(format!(
                "unknown command {} (one of: {})",
                shown(verb),
                USAGE
                    .iter()
                    .map(|u| u.split(' ').next().unwrap_or(u))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
    let arity = |counts: &[usize]| {
        if counts.contains(&args.len()) {
            Ok(())
        } else {
            Err(ParseError(format!(
                "{verb}: {} argument(s) given, expected: {usage}",
                args.len()
            )))
        }
    };
    let minor = || number::<u32>(verb, "minor", args[0]);
    let command = match verb {
        "xid" => {
            arity(&[2, 4])?;
            let instance = if args.len() == 4 {
                Some((
                    number(verb, "gpu instance id", args[2])?,
                    number(verb, "compute instance id", args[3])?,
                ))
            } else {
                None
            };
            Command::Xid {
                minor: minor()?,
                xid: number(verb, "xid", args[1])?,
                instance,
            }
        }
        "lose" | "restore" | "refuse-events" | "accept-events" => {
            arity(&[1])?;
            let minor = minor()?;
            match verb {
                "lose" => Command::Lose { minor },
                "restore" => Command::Restore { minor },
                "refuse-events" => Command::RefuseEvents { minor },
                _ => Command::AcceptEvents { minor },
            }
        }
        "recovery" => {
            arity(&[2])?;
            let action = one_of(
                verb,
                "action",
                args[1],
                Recovery::from_word,
                Recovery::WORDS,
            )?;
            Command::Recovery {
                minor: minor()?,
                action,
            }
        }
        "remap" => {
            arity(&[3])?;
            Command::Remap {
                minor: minor()?,
                pending: flag(verb, "pending", args[1])?,
                failure: flag(verb, "failure", args[2])?,
            }
        }
        "ecc" => {
            arity(&[2])?;
            Command::Ecc {
                minor: minor()?,
                uncorrected: number(verb, "uncorrected count", args[1])?,
            }
        }
        "nvlink" => {
            arity(&[3])?;
            let up = match args[2] {
                "up" => true,
                "down" => false,
                other => {
                    return Err(ParseError(format!(
                        "nvlink: state {} is not up or down",
                        shown(other)
                    )));
                }
            };
            Command::Nvlink {
                minor: minor()?,
                link: number(verb, "link", args[1])?,
                up,
            }
        }
        "slowdown" => {
            arity(&[2])?;
            let reason = one_of(
                verb,
                "reason",
                args[1],
                Slowdown::from_word,
                Slowdown::WORDS,
            )?;
            Command::Slowdown {
                minor: minor()?,
                reason,
            }
        }
        "pcie-replays" => {
            arity(&[2])?;
            Command::PcieReplays {
                minor: minor()?,
                count: number(verb, "count", args[1])?,
            }
        }
        "processes" | "graphics-processes" => {
            if args.is_empty() {
                arity(&[1])?;
            }
            process_list(verb, minor()?, &args[1..])?
        }
        _ => unreachable!("every verb of USAGE is handled"),
    };
    Ok(Some(command))
}

/// The list of a `processes` / `graphics-processes` line: each word
/// `<pid>` or `<pid>:<MiB>`, then the list checked whole.
fn process_list(verb: &str, minor: u32, words: &[&str]) -> Result<Command, ParseError> {
    if words.len() > MAX_PROCESSES {
        return Err(ParseError(format!(
            "{verb}: {} processes given, at most {MAX_PROCESSES}",
            words.len()
        )));
    }
    let mut list = Vec::with_capacity(words.len());
    for word in words {
        let (pid, mib) = match word.split_once(':') {
            Some((pid, mib)) => (pid, Some(mib)),
            None => (*word, None),
        };
        list.push(Process {
            pid: number(verb, "pid", pid)?,
            used_mib: mib.map(|m| number(verb, "MiB", m)).transpose()?,
        });
    }
    processes::check(verb, &list).map_err(ParseError)?;
    Ok(Command::Processes {
        minor,
        graphics: verb == "graphics-processes",
        processes: list,
    })
}

/// Checks the raw bytes of a line and parses it: a NUL byte or invalid
/// UTF-8 is an error before any parsing.
pub fn parse_bytes(line: &[u8]) -> Result<Option<Command>, ParseError> {
    if line.contains(&0) {
        return Err(ParseError("the line contains a NUL byte".into()));
    }
    let text =
        std::str::from_utf8(line).map_err(|_| ParseError("the line is not valid UTF-8".into()))?;
    parse(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(line: &str) -> Command {
        parse(line).unwrap().unwrap()
    }

    fn err(line: &str) -> String {
        parse(line).unwrap_err().to_string()
    }

    #[test]
    fn every_command_parses() {
        assert_eq!(
            ok("xid 0 79"),
            Command::Xid {
                minor: 0,
                xid: 79,
                instance: None
            }
        );
        assert_eq!(
            ok("  xid\t3 43 1 0  "),
            Command::Xid {
                minor: 3,
                xid: 43,
                instance: Some((1, 0))
            }
        );
        assert_eq!(ok("lose 2"), Command::Lose { minor: 2 });
        assert_eq!(ok("restore 2"), Command::Restore { minor: 2 });
        assert_eq!(
            ok("recovery 1 reboot"),
            Command::Recovery {
                minor: 1,
                action: Recovery::Reboot
            }
        );
        assert_eq!(
            ok("remap 1 1 0"),
            Command::Remap {
                minor: 1,
                pending: true,
                failure: false
            }
        );
        assert_eq!(
            ok("ecc 4 18446744073709551615"),
            Command::Ecc {
                minor: 4,
                uncorrected: u64::MAX
            }
        );
        assert_eq!(
            ok("nvlink 0 11 down"),
            Command::Nvlink {
                minor: 0,
                link: 11,
                up: false
            }
        );
        assert_eq!(ok("refuse-events 7"), Command::RefuseEvents { minor: 7 });
        assert_eq!(ok("accept-events 7"), Command::AcceptEvents { minor: 7 });
        assert_eq!(
            ok("slowdown 0 power-brake"),
            Command::Slowdown {
                minor: 0,
                reason: Slowdown::PowerBrake
            }
        );
        assert_eq!(
            ok("pcie-replays 0 12"),
            Command::PcieReplays {
                minor: 0,
                count: 12
            }
        );
        assert_eq!(ok("pcie-replays 5 12").minor(), 5);
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(parse("   ").unwrap(), None);
        assert_eq!(parse("# xid 0 79").unwrap(), None);
    }

    #[test]
    fn malformed_and_hostile_lines_are_precise_errors() {
        for (line, expect) in [
            ("boom 0", "unknown command \"boom\" (one of: xid, lose,"),
            ("XID 0 79", "unknown command \"XID\""),
            (
                "xid",
                "xid: 0 argument(s) given, expected: xid <minor> <xid> [<gi> <ci>]",
            ),
            ("xid 0", "xid: 1 argument(s) given"),
            ("xid 0 79 1", "xid: 3 argument(s) given"),
            ("xid 0 79 1 2 3", "xid: 5 argument(s) given"),
            ("lose", "lose: 0 argument(s) given, expected: lose <minor>"),
            ("lose 0 1", "lose: 2 argument(s) given"),
            ("restore 0 0", "restore: 2 argument(s) given"),
            ("lose -1", "lose: minor \"-1\" is not a decimal number"),
            ("lose +1", "lose: minor \"+1\" is not a decimal number"),
            ("lose 0x1", "lose: minor \"0x1\" is not a decimal number"),
            (
                "lose 4294967296",
                "lose: minor \"4294967296\" is out of range (0 to 4294967295)",
            ),
            (
                "xid 0 18446744073709551616",
                "xid: xid \"18446744073709551616\" is out of range (0 to 18446744073709551615)",
            ),
            (
                "xid 0 79 4294967296 0",
                "gpu instance id \"4294967296\" is out of range",
            ),
            (
                "xid 0 79 1 x",
                "compute instance id \"x\" is not a decimal number",
            ),
            (
                "recovery 0 RESET",
                "recovery: action \"RESET\" is not one of none, reset, reboot, drain",
            ),
            ("recovery 0", "recovery: 1 argument(s) given"),
            ("remap 0 2 0", "remap: pending \"2\" is not 0 or 1"),
            ("remap 0 0 yes", "remap: failure \"yes\" is not 0 or 1"),
            ("remap 0 1", "remap: 2 argument(s) given"),
            (
                "ecc 0 -5",
                "ecc: uncorrected count \"-5\" is not a decimal number",
            ),
            (
                "nvlink 0 1 sideways",
                "nvlink: state \"sideways\" is not up or down",
            ),
            ("nvlink 0 up", "nvlink: 2 argument(s) given"),
            (
                "slowdown 0 hot",
                "slowdown: reason \"hot\" is not one of none, hw, thermal, power-brake",
            ),
            (
                "pcie-replays 0 99999999999",
                "pcie-replays: count \"99999999999\" is out of range",
            ),
        ] {
            let e = err(line);
            assert!(e.contains(expect), "{line:?}: {e}");
        }
        // A very long word is cut in the message.
        let long = format!("lose {}", "9".repeat(500));
        let e = err(&long);
        assert!(e.len() < 200, "{e}");
        assert!(e.contains('…'), "{e}");
    }

    #[test]
    fn process_lists_parse() {
        let p = |pid, used_mib| Process { pid, used_mib };
        assert_eq!(
            ok("processes 0 4242:512 4243"),
            Command::Processes {
                minor: 0,
                graphics: false,
                processes: vec![p(4242, Some(512)), p(4243, None)],
            }
        );
        assert_eq!(
            ok("graphics-processes 3 7:0"),
            Command::Processes {
                minor: 3,
                graphics: true,
                processes: vec![p(7, Some(0))],
            }
        );
        // No pid clears the list.
        assert_eq!(
            ok("processes 2"),
            Command::Processes {
                minor: 2,
                graphics: false,
                processes: Vec::new(),
            }
        );
        assert_eq!(ok("graphics-processes 2").minor(), 2);
        assert_eq!(
            ok("processes 0 4294967295:17592186044415"),
            Command::Processes {
                minor: 0,
                graphics: false,
                processes: vec![p(u32::MAX, Some(processes::MAX_USED_MIB))],
            }
        );
        let full: Vec<String> = (1..=64).map(|pid| pid.to_string()).collect();
        let Command::Processes { processes, .. } = ok(&format!("processes 0 {}", full.join(" ")))
        else {
            panic!("not a processes command")
        };
        assert_eq!(processes.len(), 64);
    }

    #[test]
    fn hostile_process_lists_are_precise_errors() {
        let too_many: Vec<String> = (1..=65).map(|pid| pid.to_string()).collect();
        let too_many = format!("processes 0 {}", too_many.join(" "));
        for (line, expect) in [
            (
                "processes",
                "processes: 0 argument(s) given, expected: processes <minor> [<pid>[:<MiB>] ...]",
            ),
            (
                "graphics-processes",
                "graphics-processes: 0 argument(s) given",
            ),
            (
                "processes x 1",
                "processes: minor \"x\" is not a decimal number",
            ),
            ("processes 0 0", "processes: pid 0 is not a process"),
            ("processes 0 0:12", "processes: pid 0 is not a process"),
            ("processes 0 7 8 7", "processes: pid 7 is listed twice"),
            ("processes 0 7:1 7:2", "processes: pid 7 is listed twice"),
            (
                "graphics-processes 0 -1",
                "graphics-processes: pid \"-1\" is not a decimal number",
            ),
            (
                "processes 0 4294967296",
                "processes: pid \"4294967296\" is out of range (0 to 4294967295)",
            ),
            (
                "processes 0 99999999999999999999999",
                "processes: pid \"99999999999999999999999\" is out of range",
            ),
            (
                "processes 0 7:18446744073709551616",
                "processes: MiB \"18446744073709551616\" is out of range",
            ),
            (
                "processes 0 7:17592186044416",
                "processes: pid 7: 17592186044416 MiB is out of range (0 to 17592186044415)",
            ),
            (
                "processes 0 7:",
                "processes: MiB \"\" is not a decimal number",
            ),
            (
                "processes 0 :5",
                "processes: pid \"\" is not a decimal number",
            ),
            (
                "processes 0 7:1:2",
                "processes: MiB \"1:2\" is not a decimal number",
            ),
            (
                "processes 0 7:0x10",
                "processes: MiB \"0x10\" is not a decimal number",
            ),
            (
                "processes 0 7,8",
                "processes: pid \"7,8\" is not a decimal number",
            ),
            (
                "processes 0 4242 junk",
                "processes: pid \"junk\" is not a decimal number",
            ),
            (
                too_many.as_str(),
                "processes: 65 processes given, at most 64",
            ),
        ] {
            let e = err(line);
            assert!(e.contains(expect), "{line:?}: {e}");
        }
    }

    #[test]
    fn bytes_with_nul_or_bad_utf8_are_refused() {
        assert_eq!(
            parse_bytes(b"lose 0\0").unwrap_err().to_string(),
            "the line contains a NUL byte"
        );
        assert_eq!(
            parse_bytes(b"lose \xff").unwrap_err().to_string(),
            "the line is not valid UTF-8"
        );
        assert_eq!(
            parse_bytes(b"lose 0").unwrap(),
            Some(Command::Lose { minor: 0 })
        );
    }
}
