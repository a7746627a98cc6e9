//! The bench's one table: rows of samples (or of numbers another program
//! reported), nearest-rank percentiles, the goal each row is judged
//! against and the verdict.

use std::fmt::Write as _;

/// A duration in milliseconds, the unit of most rows.
pub fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Which number of a row a goal looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    P50,
    P95,
    P99,
    Max,
}

impl Stat {
    fn label(self) -> &'static str {
        match self {
            Self::P50 => "p50",
            Self::P95 => "p95",
            Self::P99 => "p99",
            Self::Max => "max",
        }
    }
}

/// How a row is judged: `stat < limit` (or `>` with `above`).
#[derive(Clone, Copy, Debug)]
pub struct Goal {
    stat: Stat,
    limit: f64,
    above: bool,
}

impl Goal {
    /// The row's `stat` must be below `limit`.
    pub fn below(stat: Stat, limit: f64) -> Self {
        Self {
            stat,
            limit,
            above: false,
        }
    }

    /// The row's `stat` must be above `limit`.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn above(stat: Stat, limit: f64) -> Self {
        Self {
            stat,
            limit,
            above: true,
        }
    }

    fn met(self, value: f64) -> bool {
        if self.above {
            value > self.limit
        } else {
            value < self.limit
        }
    }
}

/// The numbers of a row.
#[derive(Clone, Debug)]
pub enum Values {
    /// Measured samples: the table computes the percentiles.
    Samples(Vec<f64>),
    /// One derived number (a ratio, a difference, a rate), shown as p50.
    One(f64),
    /// Statistics another program printed: `n` and what it gave.
    Reported {
        n: usize,
        p50: Option<f64>,
        p99: Option<f64>,
        max: Option<f64>,
    },
    /// Not measured, with the reason (shown in the metric column).
    Missing(String),
}

/// One line of the table.
#[derive(Clone, Debug)]
pub struct Row {
    pub benchmark: String,
    pub metric: String,
    pub unit: &'static str,
    pub values: Values,
    pub goal: Option<Goal>,
}

impl Row {
    /// A row of samples.
    pub fn new(benchmark: &str, metric: &str, unit: &'static str, samples: Vec<f64>) -> Self {
        Self::with(benchmark, metric, unit, Values::Samples(samples))
    }

    /// A row of any kind of values.
    pub fn with(benchmark: &str, metric: &str, unit: &'static str, values: Values) -> Self {
        Self {
            benchmark: benchmark.to_owned(),
            metric: metric.to_owned(),
            unit,
            values,
            goal: None,
        }
    }

    pub fn goal(mut self, goal: Goal) -> Self {
        self.goal = Some(goal);
        self
    }

    /// `(n, p50, p95, p99, max)`; `None` where the row has no such number.
    fn stats(&self) -> Stats {
        match &self.values {
            Values::Samples(samples) if !samples.is_empty() => {
                let mut s = samples.clone();
                s.sort_by(f64::total_cmp);
                Stats {
                    n: Some(s.len()),
                    p50: Some(percentile(&s, 50.0)),
                    p95: Some(percentile(&s, 95.0)),
                    p99: Some(percentile(&s, 99.0)),
                    max: Some(s[s.len() - 1]),
                }
            }
            Values::One(v) => Stats {
                p50: Some(*v),
                ..Stats::default()
            },
            Values::Reported { n, p50, p99, max } => Stats {
                n: Some(*n),
                p50: *p50,
                p95: None,
                p99: *p99,
                max: *max,
            },
            Values::Samples(_) | Values::Missing(_) => Stats::default(),
        }
    }

    /// The goal and whether it is met (`None` when there is no number).
    fn verdict(&self) -> Option<(Goal, Option<bool>)> {
        let goal = self.goal?;
        let stats = self.stats();
        let value = match (goal.stat, &self.values) {
            // A single derived number is its own p50, p99 and max.
            (_, Values::One(v)) => Some(*v),
            (Stat::P50, _) => stats.p50,
            (Stat::P95, _) => stats.p95,
            (Stat::P99, _) => stats.p99,
            (Stat::Max, _) => stats.max,
        };
        Some((goal, value.map(|v| goal.met(v))))
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Stats {
    n: Option<usize>,
    p50: Option<f64>,
    p95: Option<f64>,
    p99: Option<f64>,
    max: Option<f64>,
}

/// The `p`-th percentile (nearest rank) of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A number with as many decimals as its size warrants.
pub fn number(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        // Thousands separated, no decimals (rates).
        let s = format!("{a:.0}");
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        if v < 0.0 { format!("-{out}") } else { out }
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn cell(v: Option<f64>) -> String {
    v.map(number).unwrap_or_default()
}

/// The Markdown table of `rows`, then one line with the verdict.
pub fn render(rows: &[Row]) -> String {
    let mut out = String::from(
        "| benchmark | metric | n | p50 | p95 | p99 | max | goal | met |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let (mut met, mut judged) = (0, 0);
    for row in rows {
        let stats = row.stats();
        let metric = match &row.values {
            Values::Missing(why) => format!("{} (not measured: {why})", row.metric),
            _ => format!("{} ({})", row.metric, row.unit),
        };
        let (goal, verdict) = match row.verdict() {
            Some((g, v)) => {
                judged += 1;
                met += usize::from(v == Some(true));
                let op = if g.above { '>' } else { '<' };
                let stat = match row.values {
                    Values::One(_) => String::new(),
                    _ => format!("{} ", g.stat.label()),
                };
                (
                    format!("{stat}{op} {} {}", number(g.limit), row.unit),
                    match v {
                        Some(true) => "yes",
                        Some(false) => "NO",
                        None => "?",
                    },
                )
            }
            None => (String::new(), ""),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.benchmark,
            metric,
            stats.n.map(|n| n.to_string()).unwrap_or_default(),
            cell(stats.p50),
            cell(stats.p95),
            cell(stats.p99),
            cell(stats.max),
            goal,
            verdict
        );
    }
    let _ = writeln!(out, "\nGoals met: {met} of {judged}.");
    out
}

#[cfg(test)]
mod tests {
    // The values compared are exact (small integers).
    #![allow(clippy::float_cmp)]

    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let s: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&s, 50.0), 10.0);
        assert_eq!(percentile(&s, 95.0), 19.0);
        assert_eq!(percentile(&s, 99.0), 20.0);
        assert_eq!(percentile(&s, 100.0), 20.0);
        assert_eq!(percentile(&[7.0], 95.0), 7.0);
        let s: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(percentile(&s, 99.0), 198.0);
    }

    #[test]
    fn numbers_get_decimals_by_size() {
        assert_eq!(number(1_634_512.4), "1,634,512");
        assert_eq!(number(-1234.0), "-1,234");
        assert_eq!(number(999.0), "999");
        assert_eq!(number(123.46), "123");
        assert_eq!(number(12.34), "12.3");
        assert_eq!(number(1.234), "1.23");
        assert_eq!(number(0.1234), "0.123");
    }

    #[test]
    fn the_table_judges_goals_and_counts_them() {
        let rows = [
            Row::new("b", "t", "ms", vec![1.0, 2.0, 300.0]).goal(Goal::below(Stat::P95, 100.0)),
            Row::new("b", "m", "MiB", vec![5.0]).goal(Goal::below(Stat::Max, 16.0)),
            Row::with("b", "ratio", "x", Values::One(2.5)).goal(Goal::below(Stat::P50, 3.0)),
            Row::with("b", "rate", "1/s", Values::One(50.0)).goal(Goal::above(Stat::P50, 100.0)),
            Row::with(
                "w",
                "review",
                "ms",
                Values::Reported {
                    n: 10,
                    p50: Some(0.2),
                    p99: Some(0.3),
                    max: None,
                },
            )
            .goal(Goal::below(Stat::P99, 5.0)),
            Row::with("a", "alloc", "ms", Values::Missing("cargo failed".into()))
                .goal(Goal::below(Stat::P50, 50.0)),
        ];
        let t = render(&rows);
        for line in [
            "| b | t (ms) | 3 | 2.00 | 300 | 300 | 300 | p95 < 100 ms | NO |",
            "| b | m (MiB) | 1 | 5.00 | 5.00 | 5.00 | 5.00 | max < 16.0 MiB | yes |",
            "| b | ratio (x) |  | 2.50 |  |  |  | < 3.00 x | yes |",
            "| b | rate (1/s) |  | 50.0 |  |  |  | > 100 1/s | NO |",
            "| w | review (ms) | 10 | 0.200 |  | 0.300 |  | p99 < 5.00 ms | yes |",
            "| a | alloc (not measured: cargo failed) |  |  |  |  |  | p50 < 50.0 ms | ? |",
            "Goals met: 3 of 6.",
        ] {
            assert!(t.contains(line), "{line}\nnot in\n{t}");
        }
    }
}
