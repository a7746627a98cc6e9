//! Rejection time of hostile YAML (not a test): deeply nested inputs at
//! 20k to 200k levels, read as before (`yaml_serde::from_str` into a JSON
//! value, what `gpu-dra lint` and the API server stand-in did) and through
//! [`bounded_yaml::to_value`]. Prints a Markdown table of medians.
//!
//! ```text
//! cargo bench -p bounded-yaml --bench hostile_yaml -- [runs]
//! ```

use std::time::{Duration, Instant};

/// A named way to build an input `n` levels deep.
type Shape = (&'static str, fn(usize) -> String);

/// Median wall time of `runs` calls of `f`, which must fail.
fn median<T, E>(runs: usize, mut f: impl FnMut() -> Result<T, E>) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            let refused = std::hint::black_box(f()).is_err();
            let elapsed = start.elapsed();
            assert!(refused, "a hostile input was accepted");
            elapsed
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn show(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{us:.1} µs")
    }
}

fn main() {
    let runs: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map_or(5, |a| a.parse().expect("runs: a number"));
    let shapes: [Shape; 3] = [
        ("YAML nested `[`", |n| "[".repeat(n)),
        ("YAML nested `{`", |n| "{".repeat(n)),
        ("YAML nested block lists (`- - - x`)", |n| {
            "- ".repeat(n) + "x\n"
        }),
    ];
    println!("| input | levels | bytes | before: yaml_serde | after: bounded_yaml |");
    println!("|---|---|---|---|---|");
    for (name, shape) in shapes {
        for n in [20_000, 40_000, 80_000, 100_000, 200_000] {
            let text = shape(n);
            let before = median(runs, || {
                yaml_serde::from_str::<serde_json::Value>(std::hint::black_box(&text))
            });
            let after = median(runs, || {
                bounded_yaml::to_value(std::hint::black_box(&text), usize::MAX)
            });
            println!(
                "| {name} | {n} | {} | {} | {} |",
                text.len(),
                show(before),
                show(after)
            );
        }
    }
}
