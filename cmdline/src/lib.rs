//! What every binary of the project does at its edge, written once: flag
//! errors as one `error: ...` line (exit 2), one duration syntax for flags
//! (`30s`, `500ms`), `--log-format text|json` logging to stderr, and
//! running the async main with a one-line error and exit 1 on failure. The
//! binaries (`gpu-kubelet-plugin`, `gpu-dra-controller`, `kubelet-sim`)
//! share these conventions, and their tests check them, so they live in
//! one place.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

/// Longest duration [`parse_duration`] accepts.
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Parses the command line. On a usage error prints one line
/// (`error: <what>`, without usage and tips) and returns exit code 2; on
/// `--help`/`--version` prints them and returns exit code 0.
pub fn parse_flags<F: clap::Parser>() -> Result<F, ExitCode> {
    parse_flags_from(std::env::args_os())
}

/// [`parse_flags`] of `args` (the program's name first), for a subcommand
/// that parses the rest of the command line itself.
pub fn parse_flags_from<F, I, T>(args: I) -> Result<F, ExitCode>
where
    F: clap::Parser,
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    F::try_parse_from(args).map_err(|e| {
        if e.use_stderr() {
            eprintln!("{}", one_line_error(&e));
            ExitCode::from(2)
        } else {
            let _ = e.print();
            ExitCode::SUCCESS
        }
    })
}

/// Turns a clap error into one line, `error: <what>`, without usage and
/// tips.
pub fn one_line_error(err: &clap::Error) -> String {
    let rendered = err.render().to_string();
    let mut parts = Vec::new();
    for line in rendered.lines() {
        let line = line.trim();
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if line.is_empty() || line.starts_with("tip:") {
            continue;
        }
        parts.push(line);
    }
    let joined = parts.join(" ");
    if joined.starts_with("error:") {
        joined
    } else {
        format!("error: {joined}")
    }
}

/// Logs to stderr in `format`, at the level `RUST_LOG` says (default
/// `info`); colours only when stderr is a terminal.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// Builds the runtime from `builder` and runs `main` on it. An error is
/// printed as one line (`error: <context>: <cause>`) and gives exit code 1.
pub fn run<Fut>(mut builder: tokio::runtime::Builder, main: Fut) -> ExitCode
where
    Fut: Future<Output = anyhow::Result<()>>,
{
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(main) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error chain as one line: `error: outer: inner: ...`.
pub fn one_line(err: &anyhow::Error) -> String {
    format!("error: {}", format!("{err:#}").replace('\n', " "))
}

/// `0`, or `<n>ms`, `<n>s`, `<n>m`, `<n>h`, at most 24 hours: the one
/// duration syntax of the binaries' flags (each flag may narrow it).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("invalid duration {s:?}: missing unit (ms, s, m or h)"))?;
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 30s, 500ms, 5m"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => {
            return Err(format!(
                "invalid duration {s:?}: unit must be ms, s, m or h"
            ));
        }
    };
    if d > MAX_DURATION {
        return Err(format!("duration {s:?} is too long (at most 24h)"));
    }
    Ok(d)
}

/// A duration as [`parse_duration`] reads it, between 100 ms and one hour:
/// the range of the binaries' check and reload intervals.
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
        return Err(format!("duration {s:?} is out of range (100ms to 1h)"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    #[command(name = "tool")]
    struct Flags {
        #[arg(long)]
        node_name: String,
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
    }

    #[test]
    fn usage_errors_become_one_line_naming_the_problem() {
        let cases: [(&[&str], &str); 3] = [
            (&["tool"], "--node-name"),
            (&["tool", "--node-name", "n", "--bogus"], "--bogus"),
            (&["tool", "--node-name", "n", "--log-format", "xml"], "xml"),
        ];
        for (args, needle) in cases {
            let err = Flags::try_parse_from(args).unwrap_err();
            let line = one_line_error(&err);
            assert!(line.starts_with("error: "), "{line}");
            assert!(line.contains(needle), "{line}");
            assert!(!line.contains('\n'), "{line}");
            assert!(!line.contains("Usage:"), "{line}");
        }
    }

    #[test]
    fn error_chains_become_one_line() {
        let err = anyhow::anyhow!("root cause\nsecond line").context("cannot start");
        assert_eq!(
            one_line(&err),
            "error: cannot start: root cause second line"
        );
    }

    #[test]
    fn run_maps_results_to_exit_codes() {
        let ok = run(tokio::runtime::Builder::new_current_thread(), async {
            Ok(())
        });
        assert_eq!(ok, ExitCode::SUCCESS);
        let failed = run(tokio::runtime::Builder::new_current_thread(), async {
            Err(anyhow::anyhow!("boom"))
        });
        assert_eq!(failed, ExitCode::FAILURE);
    }

    #[test]
    fn durations_parse_and_bad_ones_are_explained() {
        for (text, want) in [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("250ms", Duration::from_millis(250)),
            ("30s", Duration::from_secs(30)),
            ("5m", Duration::from_secs(300)),
            ("24h", Duration::from_secs(86_400)),
        ] {
            assert_eq!(parse_duration(text).unwrap(), want, "{text}");
        }
        for (text, needle) in [
            ("", "missing unit"),
            ("30", "missing unit"),
            ("s", "expected e.g."),
            ("-5s", "expected e.g."),
            ("5d", "unit must be"),
            ("1.5s", "unit must be"),
            ("25h", "too long"),
            ("99999999999999999999s", "expected e.g."),
            ("18446744073709551615h", "too long"),
        ] {
            let err = parse_duration(text).unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }

    #[test]
    fn intervals_parse_in_every_unit() {
        for (text, want) in [
            ("500ms", Duration::from_millis(500)),
            ("10s", Duration::from_secs(10)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
        ] {
            assert_eq!(parse_interval(text).unwrap(), want, "{text}");
        }
    }
}
