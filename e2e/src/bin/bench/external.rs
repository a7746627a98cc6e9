//! The benchmarks other crates own, run by their own commands (release
//! builds through cargo) and read back from what they print: the admission
//! webhook's review latency (`gpu-dra-controller`'s `webhook` bench), CEL
//! selector evaluations per second and the allocator against 1,000 nodes
//! (`gpu-dra-analysis`'s `cel` and `allocator` benches), the checkpoint's
//! commit against a bare durable write (`gpu-kubelet-plugin`'s
//! `checkpoint_commit` bench): `cargo bench` targets, release builds. Their output is
//! echoed to stderr; a command that fails, or prints nothing this module
//! recognises, leaves a row that says so instead of a number.

use std::process::{Command, Stdio};

use crate::Ctx;
use crate::table::{Goal, Row, Stat, Values, number};

/// A benchmark command: cargo arguments.
struct Cargo(&'static [&'static str]);

impl Cargo {
    fn text(&self) -> String {
        format!("cargo {}", self.0.join(" "))
    }

    /// Runs it in the workspace; its stdout, or why there is none.
    fn run(&self, ctx: &Ctx) -> Result<String, String> {
        eprintln!("bench: running `{}`", self.text());
        let out = Command::new(&ctx.cargo)
            .args(self.0)
            .current_dir(&ctx.workspace)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("`{}` could not start: {e}", self.text()))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        for line in stdout.lines() {
            eprintln!("  | {line}");
        }
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!("`{}` failed ({})", self.text(), out.status))
        }
    }
}

const WEBHOOK: Cargo = Cargo(&[
    "bench",
    "-p",
    "gpu-dra-controller",
    "--bench",
    "webhook",
    "--",
    "10000",
    "1",
]);

const CEL: Cargo = Cargo(&["bench", "-p", "gpu-dra-analysis", "--bench", "cel"]);

const ALLOCATOR: Cargo = Cargo(&["bench", "-p", "gpu-dra-analysis", "--bench", "allocator"]);

const CHECKPOINT: Cargo = Cargo(&[
    "bench",
    "-p",
    "gpu-kubelet-plugin",
    "--bench",
    "checkpoint_commit",
]);

/// A row saying why `metric` has no number.
fn missing(name: &str, metric: &str, unit: &'static str, why: String) -> Row {
    Row::with(name, metric, unit, Values::Missing(why))
}

/// Admission webhook: 10,000 reviews over one kept-alive HTTPS connection.
pub fn webhook(ctx: &Ctx, name: &str) -> Vec<Row> {
    const METRIC: &str = "review round trip over HTTPS, 5 kinds of review";
    let goal = Goal::below(Stat::P99, 5.0);
    let out = match WEBHOOK.run(ctx) {
        Ok(out) => out,
        Err(why) => return vec![missing(name, METRIC, "ms", why).goal(goal)],
    };
    let mut rows = match parse_webhook(&out) {
        Some((n, p50, p99, max)) => vec![
            Row::with(
                name,
                METRIC,
                "ms",
                Values::Reported {
                    n,
                    p50: Some(p50),
                    p99: Some(p99),
                    max: Some(max),
                },
            )
            .goal(goal),
        ],
        None => vec![
            missing(
                name,
                METRIC,
                "ms",
                format!("no `all` line in the output of `{}`", WEBHOOK.text()),
            )
            .goal(goal),
        ],
    };
    if let Some(rate) = out.lines().find_map(throughput) {
        rows.push(Row::with(
            name,
            "  reviews per second, one connection",
            "1/s",
            Values::One(rate),
        ));
    }
    rows
}

/// CEL: the five NVIDIA selectors, precompiled, against one device.
pub fn cel(ctx: &Ctx, name: &str) -> Vec<Row> {
    const METRIC: &str = "evaluations per second, five selectors in turn";
    let out = match CEL.run(ctx) {
        Ok(out) => out,
        Err(why) => return vec![missing(name, METRIC, "1/s", why)],
    };
    let rate_after = |prefix: &str| {
        out.lines()
            .filter_map(|l| l.trim().strip_prefix(prefix))
            .filter_map(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
            .collect::<Vec<f64>>()
    };
    let all = rate_after("all five:");
    let each: Vec<f64> = out
        .lines()
        .filter(|l| l.trim_start().starts_with("selector "))
        .filter_map(|l| l.split_once(':')?.1.split_whitespace().next()?.parse().ok())
        .collect();
    let Some(&all) = all.first() else {
        return vec![missing(
            name,
            METRIC,
            "1/s",
            format!("no `all five:` line in the output of `{}`", CEL.text()),
        )];
    };
    let mut rows = vec![Row::with(name, METRIC, "1/s", Values::One(all))];
    if let Some(slowest) = each.iter().copied().min_by(f64::total_cmp) {
        rows.push(Row::with(
            name,
            "  the slowest selector alone",
            "1/s",
            Values::One(slowest),
        ));
    }
    rows
}

/// Allocator: one claim against 1,000 nodes x 8 GPUs with dynamic MIG.
pub fn allocator(ctx: &Ctx, name: &str) -> Vec<Row> {
    let goal = Goal::below(Stat::P50, 50.0);
    let out = match ALLOCATOR.run(ctx) {
        Ok(out) => out,
        Err(why) => return vec![missing(name, "one claim answered", "ms", why).goal(goal)],
    };
    let rows: Vec<Row> = out
        .lines()
        .filter_map(parse_timing)
        .map(|t| {
            // Snapshot building blocks are parts of an answer, not answers.
            let answer = !t.label.starts_with("Snapshot");
            let row = match (t.p50, t.mean) {
                (Some(p50), _) => Row::with(
                    name,
                    &format!(
                        "{} (fresh snapshot per run{})",
                        t.label,
                        t.best
                            .map(|b| format!("; best {}", number(b)))
                            .unwrap_or_default()
                    ),
                    "ms",
                    Values::Reported {
                        n: t.runs,
                        p50: Some(p50),
                        p99: None,
                        max: t.worst,
                    },
                ),
                (None, Some(mean)) => Row::with(
                    name,
                    &format!(
                        "{}: mean of {} run{}{}",
                        t.label,
                        t.runs,
                        if t.runs == 1 { "" } else { "s" },
                        t.best
                            .map(|b| format!(" (best {})", number(b)))
                            .unwrap_or_default()
                    ),
                    "ms",
                    Values::One(mean),
                ),
                (None, None) => unreachable!("parse_timing returns lines with a p50 or a mean"),
            };
            if answer { row.goal(goal) } else { row }
        })
        .collect();
    if rows.is_empty() {
        return vec![
            missing(
                name,
                "one claim answered",
                "ms",
                format!("no timing lines in the output of `{}`", ALLOCATOR.text()),
            )
            .goal(goal),
        ];
    }
    rows
}

/// The checkpoint's commit against the bare durable write it is built on:
/// one row per line of the bench (each a mean of its writes).
pub fn checkpoint(ctx: &Ctx, name: &str) -> Vec<Row> {
    const METRIC: &str = "commit of one claim's entry";
    let out = match CHECKPOINT.run(ctx) {
        Ok(out) => out,
        Err(why) => return vec![missing(name, METRIC, "ms", why)],
    };
    let rows: Vec<Row> = out
        .lines()
        .filter_map(parse_mean_line)
        .map(|(label, ms)| Row::with(name, &format!("{label} (mean)"), "ms", Values::One(ms)))
        .collect();
    if rows.is_empty() {
        return vec![missing(
            name,
            METRIC,
            "ms",
            format!("no timing lines in the output of `{}`", CHECKPOINT.text()),
        )];
    }
    rows
}

/// `(label, ms)` from a `<label>: <Debug duration> per <thing>` line.
fn parse_mean_line(line: &str) -> Option<(String, f64)> {
    let (label, rest) = line.rsplit_once(": ")?;
    let mut words = rest.split_whitespace();
    let ms = duration_ms(words.next()?)?;
    (words.next() == Some("per") && !label.trim().is_empty()).then(|| (label.trim().to_owned(), ms))
}

/// `(n, p50, p99, max)` in ms from the webhook bench's `all` line.
fn parse_webhook(out: &str) -> Option<(usize, f64, f64, f64)> {
    let line = out.lines().find(|l| l.trim_start().starts_with("all "))?;
    let n = value_after(line, "n=")?.parse().ok()?;
    Some((
        n,
        duration_ms(value_after(line, "p50=")?)?,
        duration_ms(value_after(line, "p99=")?)?,
        duration_ms(value_after(line, "max=")?)?,
    ))
}

/// The word after `key` (spaces after it skipped).
fn value_after<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.split_whitespace().next()
}

/// A `Duration` as Rust's `Debug` prints it (`175.3µs`, `2.5ms`), in ms.
fn duration_ms(text: &str) -> Option<f64> {
    for (suffix, factor) in [
        ("ns", 1e-6),
        ("µs", 1e-3),
        ("us", 1e-3),
        ("ms", 1.0),
        ("s", 1e3),
    ] {
        if let Some(number) = text.strip_suffix(suffix) {
            return number.parse::<f64>().ok().map(|v| v * factor);
        }
    }
    None
}

/// The rate in `... (5500/s), ...`.
fn throughput(line: &str) -> Option<f64> {
    let (before, _) = line.split_once("/s)")?;
    let (_, number) = before.rsplit_once('(')?;
    number.parse().ok()
}

/// One timing line of the allocator benchmark.
#[derive(Debug, PartialEq)]
struct Timing {
    label: String,
    runs: usize,
    p50: Option<f64>,
    best: Option<f64>,
    worst: Option<f64>,
    mean: Option<f64>,
}

/// `<label> p50 X ms  best Y ms  worst Z ms  (N cold runs)` or
/// `<label> best X ms  mean Y ms  (N runs)`.
fn parse_timing(line: &str) -> Option<Timing> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut t = Timing {
        label: String::new(),
        runs: 0,
        p50: None,
        best: None,
        worst: None,
        mean: None,
    };
    let mut label_end = None;
    for (i, w) in words.iter().enumerate() {
        let stat = match *w {
            "p50" => &mut t.p50,
            "best" => &mut t.best,
            "worst" => &mut t.worst,
            "mean" => &mut t.mean,
            _ => {
                if let Some(n) = w.strip_prefix('(')
                    && words
                        .get(i + 1)
                        .is_some_and(|n| n.starts_with("run") || *n == "cold")
                {
                    t.runs = n.parse().ok()?;
                }
                continue;
            }
        };
        let Some(v) = words.get(i + 1).and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        if words.get(i + 2) != Some(&"ms") {
            continue;
        }
        *stat = Some(v);
        label_end.get_or_insert(i);
    }
    let end = label_end?;
    if t.runs == 0 || (t.p50.is_none() && t.mean.is_none()) {
        return None;
    }
    t.label = words[..end].join(" ");
    (!t.label.is_empty()).then_some(t)
}

#[cfg(test)]
mod tests {
    // The values compared are exact decimal parses.
    #![allow(clippy::float_cmp)]

    use super::*;

    #[test]
    fn webhook_lines_parse() {
        let out = "10000 reviews over 1 HTTPS connection(s) in 1.82s (5493/s), round trip as the client sees it:\n\
                   nvidia DeviceClass     n=2000   p50=   170.1µs p90=   200.0µs p99=   260.0µs max=     1.2ms\n\
                   all                    n=10000  p50=   175.3µs p90=   223.0µs p99=   275.0µs max=     2.5ms\n";
        let (n, p50, p99, max) = parse_webhook(out).unwrap();
        assert_eq!(n, 10000);
        assert!((p50 - 0.1753).abs() < 1e-9);
        assert!((p99 - 0.275).abs() < 1e-9);
        assert_eq!(max, 2.5);
        assert_eq!(throughput(out.lines().next().unwrap()), Some(5493.0));
        assert_eq!(parse_webhook("nothing here"), None);
        assert_eq!(throughput("no rate"), None);
    }

    #[test]
    fn debug_durations_parse() {
        assert_eq!(duration_ms("2.5ms"), Some(2.5));
        assert_eq!(duration_ms("1.5s"), Some(1500.0));
        assert!((duration_ms("800ns").unwrap() - 0.0008).abs() < 1e-12);
        assert!((duration_ms("175.3µs").unwrap() - 0.1753).abs() < 1e-12);
        assert_eq!(duration_ms("fast"), None);
        assert_eq!(duration_ms("12"), None);
    }

    #[test]
    fn checkpoint_lines_parse() {
        let (label, ms) = parse_mean_line("commit, 1 claim (866 bytes): 881.581µs per commit")
            .expect("a timing line");
        assert_eq!(label, "commit, 1 claim (866 bytes)");
        assert!((ms - 0.881_581).abs() < 1e-12, "{ms}");
        assert_eq!(
            parse_mean_line("bare write+fsync+rename+dir fsync: 4.04ms per write"),
            Some(("bare write+fsync+rename+dir fsync".to_owned(), 4.04))
        );
        for other in [
            "commit, 1 claim: fast per commit",
            "commit: 1.0ms",
            ": 1.0ms per commit",
            "Running benches/checkpoint_commit.rs",
            "",
        ] {
            assert_eq!(parse_mean_line(other), None, "{other:?}");
        }
    }

    #[test]
    fn allocator_lines_parse() {
        let cold = "unsatisfiable (memory >= 160Gi), cold snapshot: 1000 nodes + explanation    p50   226.100 ms  best   202.000 ms  worst   251.500 ms  (7 cold runs)";
        assert_eq!(
            parse_timing(cold),
            Some(Timing {
                label: "unsatisfiable (memory >= 160Gi), cold snapshot: 1000 nodes + explanation"
                    .into(),
                runs: 7,
                p50: Some(226.1),
                best: Some(202.0),
                worst: Some(251.5),
                mean: None,
            })
        );
        let warm = "1 GPU, warm snapshot                          best     0.030 ms  mean     0.041 ms  (20 runs)";
        let t = parse_timing(warm).unwrap();
        assert_eq!(t.label, "1 GPU, warm snapshot");
        assert_eq!(
            (t.runs, t.best, t.mean, t.p50),
            (20, Some(0.03), Some(0.041), None)
        );
        for other in [
            "1000 nodes, 152000 devices, 4000 slices",
            "    summary: 0 of 8000 devices match",
            "test one_claim_against_1000_nodes_with_dynamic_mig ... ok",
            "best effort (no runs)",
            "",
        ] {
            assert_eq!(parse_timing(other), None, "{other:?}");
        }
    }
}
