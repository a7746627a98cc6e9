//! What `gpu-dra-demo` shows people: a progress line per step, tables of
//! the GPUs, slices, claims and the cleanup proof, colour only on a
//! terminal. Silent in JSON mode (the report is printed whole at the end).

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::time::Instant;

use serde_json::Value;

use super::Output;
use super::proof::Leftovers;
use super::walk::{Outcome, Walked};

/// Human output: progress lines and tables (colour only on a terminal);
/// silent in JSON mode.
pub struct Printer {
    text: bool,
    colour: bool,
}

/// A progress line in flight.
pub struct Step<'a> {
    printer: &'a Printer,
    started: Instant,
    finished: bool,
}

/// ANSI colours used.
const BLUE_BOLD: &str = "1;34";
const GREEN: &str = "32";
const GREEN_BOLD: &str = "1;32";
const YELLOW: &str = "33";
const RED: &str = "31";
const RED_BOLD: &str = "1;31";
const DIM: &str = "2";

impl Printer {
    pub fn new(output: Output) -> Self {
        Self {
            text: output == Output::Text,
            colour: std::io::stdout().is_terminal(),
        }
    }

    fn paint(&self, code: &str, s: &str) -> String {
        if self.colour {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }

    /// Starts a progress line: `==> what (detail) ... `.
    pub fn step(&self, what: &str, detail: &str) -> Step<'_> {
        if self.text {
            print!("{} {what} ({detail}) ... ", self.paint(BLUE_BOLD, "==>"));
            let _ = std::io::Write::flush(&mut std::io::stdout());
        }
        Step {
            printer: self,
            started: Instant::now(),
            finished: false,
        }
    }

    pub fn gpu_table(&self, gpus: &[Value]) {
        if !self.text {
            return;
        }
        let rows: Vec<Vec<String>> = gpus
            .iter()
            .map(|g| {
                vec![
                    plain(&g["device"]),
                    plain(&g["product"]),
                    format!("{:.0} GiB", g["memoryGiB"].as_f64().unwrap_or(0.0)),
                    plain(&g["mig"]),
                    plain(&g["nvlinks"]),
                    plain(&g["nvlinkDomain"]),
                    plain(&g["pcieRoot"]),
                    plain(&g["numaNode"]),
                    if g["memorySharing"] == true {
                        "memory fraction".to_owned()
                    } else {
                        "-".to_owned()
                    },
                ]
            })
            .collect();
        println!("\nGPUs found");
        print_table(
            &[
                "DEVICE",
                "PRODUCT",
                "MEMORY",
                "MIG",
                "NVLINKS",
                "NVLINK DOMAIN",
                "PCIE ROOT",
                "NUMA",
                "SHARED BY",
            ],
            &rows,
        );
    }

    pub fn slice_table(&self, slices: &[Value]) {
        if !self.text {
            return;
        }
        let rows: Vec<Vec<String>> = slices
            .iter()
            .map(|s| {
                vec![
                    plain(&s["metadata"]["name"]),
                    plain(&s["spec"]["pool"]["name"]),
                    plain(&s["spec"]["pool"]["generation"]),
                    s["spec"]["devices"]
                        .as_array()
                        .map_or(0, Vec::len)
                        .to_string(),
                    s["spec"]["sharedCounters"]
                        .as_array()
                        .map_or(0, Vec::len)
                        .to_string(),
                ]
            })
            .collect();
        println!("\nResourceSlices published");
        print_table(
            &["NAME", "POOL", "GENERATION", "DEVICES", "COUNTER SETS"],
            &rows,
        );
    }

    pub fn device_summary(&self, pool: &Value) {
        if !self.text {
            return;
        }
        let by_type = pool["byType"].as_object().map(|m| {
            m.iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        });
        println!("\nDevices: {}", by_type.unwrap_or_default());
        if let Some(profiles) = pool["migProfiles"].as_object().filter(|m| !m.is_empty()) {
            let list: Vec<String> = profiles.iter().map(|(k, v)| format!("{k} x{v}")).collect();
            println!("MIG devices by profile: {}", list.join(", "));
        }
        println!();
    }

    /// What happened to one claim, under its progress line.
    pub fn claim(&self, walked: &Walked) {
        if !self.text {
            return;
        }
        match &walked.outcome {
            Outcome::Rejected { message, .. } => {
                println!("  the webhook denied it:");
                for line in message.lines() {
                    println!("    {line}");
                }
            }
            Outcome::Unsatisfiable { explanation, .. } => {
                println!("  admitted by the webhook; the allocator cannot place it:");
                println!("    {explanation}");
                for funnel in &walked.funnels {
                    println!("    {}", self.paint(DIM, funnel));
                }
            }
            Outcome::PrepareFailed { error, allocated } => {
                println!("  allocated {}, but prepare failed:", allocated.join(", "));
                println!("    {}", self.paint(RED, error));
            }
            Outcome::Prepared(prepared) => {
                for warning in &walked.warnings {
                    println!("  {} {warning}", self.paint(YELLOW, "webhook warning:"));
                }
                for device in &prepared.devices {
                    let mut title = format!("  {} -> {}", walked.name, device.device);
                    if let Some(share) = &device.share {
                        let memory = walked
                            .allocation
                            .iter()
                            .find(|a| a["device"] == device.device.as_str())
                            .and_then(|a| a["consumedCapacity"]["memory"].as_str())
                            .map(|m| format!("{} of memory, ", binary_units(m)))
                            .unwrap_or_default();
                        let _ = write!(title, " ({memory}share {share})");
                    }
                    println!("{title}");
                    let rows = vec![
                        vec!["REQUEST".to_owned(), device.requests.join(", ")],
                        vec!["CDI ID".to_owned(), list_or_dash(&device.cdi_ids)],
                        vec!["DEVICE NODES".to_owned(), list_or_dash(&device.nodes)],
                        vec!["ENV".to_owned(), list_or_dash(&device.env)],
                        vec!["MOUNTS".to_owned(), mounts_text(&device.mounts)],
                    ];
                    print_rows(&rows, 4);
                }
                let common = &prepared.claim_edits;
                println!(
                    "  every container of the claim also gets: {}",
                    common.summary()
                );
                if !prepared.hardware.is_empty() {
                    println!("  on the node: {}", prepared.hardware.join("; "));
                }
            }
        }
        println!();
    }

    /// A titled block of lines, printed as given (already indented).
    pub fn lines(&self, title: &str, body: &str) {
        if !self.text {
            return;
        }
        println!("{title}");
        print!("{body}");
    }

    /// The state before and after unprepare.
    pub fn proof(&self, before: &Leftovers, after: &Leftovers) {
        if !self.text {
            return;
        }
        println!("\nWhat the prepared claims left on the node, before and after unprepare");
        let rows: Vec<Vec<String>> = Leftovers::LABELS
            .iter()
            .zip(before.counts().iter().zip(after.counts()))
            .map(|(label, (b, a))| {
                let verdict = match (b, a) {
                    (0, 0) => "-".to_owned(),
                    (_, 0) => self.paint(GREEN, "gone"),
                    _ => self.paint(RED, "LEFT"),
                };
                vec![(*label).to_owned(), b.to_string(), a.to_string(), verdict]
            })
            .collect();
        print_table(&["WHAT", "BEFORE", "AFTER", ""], &rows);
        for path in after.paths() {
            println!("  left: {path}");
        }
        println!();
    }

    pub fn cleanup(&self, ok: bool, lines: &[String]) {
        if !self.text {
            return;
        }
        println!();
        for line in lines {
            println!("{line}");
        }
        let verdict = if ok {
            self.paint(GREEN_BOLD, "nothing left behind")
        } else {
            self.paint(RED_BOLD, "something was left behind")
        };
        println!("{verdict}");
    }
}

impl Step<'_> {
    pub fn done(self) {
        self.done_with("");
    }

    pub fn done_with(self, detail: &str) {
        self.finish(GREEN, "ok", detail);
    }

    /// Ends the line with `label` in `colour` (`ok`, `rejected`, ...).
    fn finish(mut self, colour: &str, label: &str, detail: &str) {
        self.finished = true;
        if self.printer.text {
            let ms = self.started.elapsed().as_secs_f64() * 1000.0;
            let sep = if detail.is_empty() { "" } else { ", " };
            println!(
                "{} ({ms:.0} ms{sep}{detail})",
                self.printer.paint(colour, label)
            );
        }
    }

    /// Ends the line of a claim with its outcome.
    pub fn outcome(self, outcome: &Outcome) {
        let (colour, detail) = match outcome {
            Outcome::Prepared(p) => (GREEN, p.device_names().join(", ")),
            Outcome::Rejected { .. } => (YELLOW, "by the webhook".to_owned()),
            Outcome::Unsatisfiable { .. } => (YELLOW, "no allocation".to_owned()),
            Outcome::PrepareFailed { .. } => (RED, String::new()),
        };
        self.finish(colour, outcome.label(), &detail);
    }
}

impl Drop for Step<'_> {
    /// A step dropped unfinished failed: end its progress line so the error
    /// that follows starts on a line of its own.
    fn drop(&mut self) {
        if !self.finished && self.printer.text {
            println!("{}", self.printer.paint(RED, "failed"));
        }
    }
}

fn list_or_dash(items: &[String]) -> String {
    if items.is_empty() {
        "-".to_owned()
    } else {
        items.join(", ")
    }
}

/// `3 (/tmp/nvidia-mps, /dev/shm, ...)`: the count and the container paths.
fn mounts_text(mounts: &[String]) -> String {
    if mounts.is_empty() {
        "-".to_owned()
    } else {
        format!("{} ({})", mounts.len(), mounts.join(", "))
    }
}

/// A byte count as `4Gi` or `512Mi` when it is a whole number of them.
fn binary_units(bytes: &str) -> String {
    let Ok(n) = bytes.parse::<u64>() else {
        return bytes.to_owned();
    };
    for (unit, size) in [("Ti", 1u64 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20)] {
        if n >= size && n.is_multiple_of(size) {
            return format!("{}{unit}", n / size);
        }
    }
    bytes.to_owned()
}

/// A JSON scalar as table text (`-` for null).
pub fn plain(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Two-column rows (name, value), the names padded, indented by `indent`.
fn print_rows(rows: &[Vec<String>], indent: usize) {
    let width = rows.iter().map(|r| r[0].len()).max().unwrap_or(0);
    for row in rows {
        println!("{:indent$}{:<width$}  {}", "", row[0], row[1]);
    }
}

pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let visible = |s: &str| strip_ansi(s).chars().count();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(visible(cell));
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c}{}", " ".repeat(w.saturating_sub(visible(c)))))
            .collect();
        println!("  {}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// `s` without ANSI colour sequences (for column widths).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_codes_do_not_count_in_widths() {
        assert_eq!(strip_ansi("\x1b[32mgone\x1b[0m"), "gone");
        assert_eq!(strip_ansi("plain"), "plain");
    }

    #[test]
    fn byte_counts_read_in_binary_units() {
        assert_eq!(binary_units("4294967296"), "4Gi");
        assert_eq!(binary_units("536870912"), "512Mi");
        assert_eq!(binary_units("1000"), "1000");
        assert_eq!(binary_units("10Gi"), "10Gi");
    }

    #[test]
    fn mounts_list_their_count_and_paths() {
        assert_eq!(mounts_text(&[]), "-");
        assert_eq!(mounts_text(&["/a".into(), "/b".into()]), "2 (/a, /b)");
    }
}
