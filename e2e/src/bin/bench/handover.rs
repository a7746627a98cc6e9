//! A rolling update's hand-over (`--rolling-update`, as the chart runs the
//! plugin: with `--supervise`): how long kubelet is without a plugin while a
//! new instance takes a node over from the old one.
//!
//! One node, a chain of instances: the first prepares a whole-GPU claim;
//! then, run after run, a successor starts beside the serving instance and
//! waits for its state directory, the bench sends the serving one SIGTERM,
//! and the successor takes over and serves the claim from the checkpoint.
//! The spans come from the two plugins' JSON log timestamps (the same
//! clock as the bench's), so the bench's own polling does not enter them.
//! Not here: kubelet's re-registration of the driver, which its plugin
//! manager does in a once-a-second reconcile loop (the simulator polls every
//! 50 ms and registers at once), and, outside a test node, the old pod's
//! termination and the new pod's scheduling and start, which a surge pod
//! takes out of the gap.

use std::time::{Instant, SystemTime};

use anyhow::Context as _;
use serde_json::{Value, json};

use crate::node::{Node, SERVING, result, wait_for_log};
use crate::start::{span_ms, time_of_day, wall_of_day};
use crate::table::{Row, ms};
use crate::{Ctx, Settings};

/// The plugin's flags, as the chart's DaemonSet passes them.
const FLAGS: &[&str] = &["--rolling-update", "--supervise"];

/// What the old instance logs when it removes its registration socket
/// (kubelet deregisters it).
const DEREGISTERED: &str = "removing the registration socket";
/// What the successor logs when it finds the state directory held.
const WAITING: &str = "waiting for it to exit";
/// What the successor logs when the old instance has let the lock go.
const TAKING_OVER: &str = "taking over";

/// One hand-over, in ms.
#[derive(Debug)]
struct HandOver {
    /// The successor's spawn to its wait (its start work before the lock).
    to_waiting: f64,
    /// SIGTERM to the old instance's deregistration.
    to_deregistered: f64,
    /// The old instance's deregistration to the successor serving.
    gap: f64,
    /// The lock let go to the successor serving.
    taking_over: f64,
    /// SIGTERM to the successor serving.
    to_serving: f64,
}

pub fn rolling_update(ctx: &Ctx, name: &str, settings: &Settings) -> anyhow::Result<Vec<Row>> {
    let dir = ctx.dir_for(name);
    ctx.runtime.block_on(async {
        let mut node = Node::start(ctx, &dir, FLAGS).await?;
        let claim = node.claim(&json!([result("gpu", "gpu-0")]), &json!([]))?;
        let claims = std::slice::from_ref(&claim);
        node.prepare(claims).await.context("the first instance")?;
        let mut runs = Vec::new();
        let mut first_prepare = Vec::new();
        for i in 1..=settings.runs {
            let log = dir.join(format!("plugin-{i}.log"));
            let spawned = SystemTime::now();
            let mut next = node.spawn_successor(ctx, &dir, FLAGS, &log)?;
            wait_for_log(&log, WAITING, &mut next)
                .await
                .with_context(|| format!("successor {i}"))?;
            let sent = SystemTime::now();
            let old_log = node
                .hand_over(next, log)
                .await
                .with_context(|| format!("hand-over {i}"))?;
            let t = Instant::now();
            node.prepare(claims)
                .await
                .with_context(|| format!("successor {i}: the old one's claim"))?;
            first_prepare.push(ms(t.elapsed()));
            runs.push(
                hand_over(spawned, sent, &old_log, &node.log_text())
                    .with_context(|| format!("hand-over {i}"))?,
            );
        }
        node.unprepare(claims).await?;
        node.stop()?;
        let col = |f: fn(&HandOver) -> f64| runs.iter().map(f).collect::<Vec<f64>>();
        Ok(vec![
            Row::new(
                name,
                "old plugin's deregistration to the new one serving (no plugin listening)",
                "ms",
                col(|r| r.gap),
            ),
            Row::new(
                name,
                "  of which the new plugin: lock let go to serving (checkpoint, recovery, sockets)",
                "ms",
                col(|r| r.taking_over),
            ),
            Row::new(
                name,
                "SIGTERM to the old plugin to its deregistration",
                "ms",
                col(|r| r.to_deregistered),
            ),
            Row::new(
                name,
                "SIGTERM to the old plugin to the new one serving",
                "ms",
                col(|r| r.to_serving),
            ),
            Row::new(
                name,
                "the new plugin's first prepare: the old one's claim, from the checkpoint",
                "ms",
                first_prepare,
            ),
            Row::new(
                name,
                "new plugin's spawn to waiting for the old one (start work before the lock)",
                "ms",
                col(|r| r.to_waiting),
            ),
        ])
    })
}

/// The spans of one hand-over from the old and the new plugin's logs, the
/// successor spawned at `spawned` and the old one sent SIGTERM at `sent`.
fn hand_over(
    spawned: SystemTime,
    sent: SystemTime,
    old_log: &str,
    new_log: &str,
) -> anyhow::Result<HandOver> {
    let deregistered = JsonLog::parse(old_log).at(DEREGISTERED)?;
    let new_log = JsonLog::parse(new_log);
    let waiting = new_log.at(WAITING)?;
    let taking_over = new_log.at(TAKING_OVER)?;
    let serving = new_log.at(SERVING)?;
    let (spawned, sent) = (wall_of_day(spawned)?, wall_of_day(sent)?);
    Ok(HandOver {
        to_waiting: span_ms(spawned, waiting),
        to_deregistered: span_ms(sent, deregistered),
        gap: span_ms(deregistered, serving),
        taking_over: span_ms(taking_over, serving),
        to_serving: span_ms(sent, serving),
    })
}

/// A plugin's JSON log, its lines parsed once (lines that are not JSON,
/// such as the supervisor's, left out).
struct JsonLog<'a> {
    text: &'a str,
    lines: Vec<Value>,
}

impl<'a> JsonLog<'a> {
    fn parse(text: &'a str) -> Self {
        let lines = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        Self { text, lines }
    }

    /// Seconds since midnight of the first line whose message contains
    /// `what`.
    fn at(&self, what: &str) -> anyhow::Result<f64> {
        self.lines
            .iter()
            .find(|v| v["message"].as_str().is_some_and(|m| m.contains(what)))
            .and_then(|v| time_of_day(v["timestamp"].as_str()?))
            .with_context(|| format!("no timestamped {what:?} line in the log:\n{}", self.text))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn line(message: &str, ts: &str) -> String {
        json!({"timestamp": ts, "level": "INFO", "message": message}).to_string()
    }

    #[test]
    fn the_spans_come_from_both_logs() {
        let day = UNIX_EPOCH + Duration::from_secs(20_000 * 86_400);
        let old = [
            "supervisor: starting the plugin".to_owned(),
            line(SERVING, "2024-10-04T10:00:00.000000Z"),
            line(
                "removing the registration socket; kubelet deregisters the plugin",
                "2024-10-04T10:00:01.002000Z",
            ),
        ]
        .join("\n");
        let new = [
            line(
                "another plugin instance holds the state directory (a rolling update?); waiting for it to exit",
                "2024-10-04T10:00:00.500000Z",
            ),
            line(
                "the other instance let the state directory go; taking over",
                "2024-10-04T10:00:01.003000Z",
            ),
            line(SERVING, "2024-10-04T10:00:01.005500Z"),
        ]
        .join("\n");
        let at = |s: f64| day + Duration::from_secs_f64(s);
        let got = hand_over(at(36_000.25), at(36_001.0), &old, &new).unwrap();
        let want = HandOver {
            to_waiting: 250.0,
            to_deregistered: 2.0,
            gap: 3.5,
            taking_over: 2.5,
            to_serving: 5.5,
        };
        for (g, w) in [
            (got.to_waiting, want.to_waiting),
            (got.to_deregistered, want.to_deregistered),
            (got.gap, want.gap),
            (got.taking_over, want.taking_over),
            (got.to_serving, want.to_serving),
        ] {
            assert!((g - w).abs() < 1e-3, "{got:?} against {want:?}");
        }
        // The old log's SERVING line is not the new plugin's.
        assert!(hand_over(at(36_000.25), at(36_001.0), &old, &old).is_err());
    }

    #[test]
    fn a_missing_or_untimed_line_is_an_error() {
        let err = JsonLog::parse("not json\n").at(TAKING_OVER).unwrap_err();
        assert!(err.to_string().contains("\"taking over\""), "{err}");
        let untimed = json!({"message": "taking over"}).to_string();
        assert!(JsonLog::parse(&untimed).at(TAKING_OVER).is_err());
    }
}
