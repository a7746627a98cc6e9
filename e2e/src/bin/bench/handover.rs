//! A rolling update's hand-over (`--rolling-update`, as the chart runs the
//! plugin: with `--supervise`): how long kubelet is without a plugin while a
//! new instance takes a node over from the old one, with the shared socket
//! names and with per-instance names (`--per-instance-sockets`, kubelet
//! 1.33 and later).
//!
//! One node, a chain of instances: the first prepares a whole-GPU claim;
//! then, run after run, a successor starts beside the serving instance and
//! waits for its state directory, the bench sends the serving one SIGTERM,
//! and the successor takes over and serves the claim from the checkpoint.
//! The spans come from the two plugins' JSON log timestamps (the same
//! clock as the bench's), so the bench's own polling does not enter them.
//! With per-instance names the bench also times prepares made while the
//! successor waits, which it passes on to the serving instance.
//!
//! What kubelet sees: throughout, a task calls NodePrepareResources on the
//! claim, one call after another, through the plugin the kubelet
//! simulator's registrar names, which like kubelet makes a pass once a
//! second, runs one operation per socket path, and calls the plugin of the
//! driver registered last. The longest time between two answered calls is
//! how long pods on the node could not have their claims prepared. Not
//! here: outside a test node, the old pod's termination and the new pod's
//! scheduling and start, which a surge pod takes out of the gap.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use gpu_dra_sim::kubelet::{Claim, KUBELET_RECONCILE_PERIOD, KubeletSim, Registrar};
use serde_json::json;
use tokio::sync::watch;

use crate::node::{DRIVER, JsonLog, Node, SERVING, result, wait_for_log};
use crate::start::{span_ms, wall_of_day};
use crate::table::{Row, ms};
use crate::{Ctx, Settings};

/// The plugin's flags, as the chart's DaemonSet passes them, with the
/// shared socket names.
const SHARED: &[&str] = &[
    "--rolling-update",
    "--supervise",
    "--per-instance-sockets=never",
];

/// The same with per-instance socket names.
const PER_INSTANCE: &[&str] = &[
    "--rolling-update",
    "--supervise",
    "--per-instance-sockets=always",
];

/// Answered calls after the hand-over before the call stream stops.
const CALLS_AFTER: u32 = 20;
/// Prepares timed per hand-over while a successor with sockets of its own
/// waits and passes kubelet's calls on to the serving instance.
const PASSED_ON: usize = 10;

/// What the old instance logs when it removes its registration socket
/// (kubelet deregisters it).
const DEREGISTERED: &str = "removing the registration socket";
/// What the successor logs when it finds the state directory held.
const WAITING: &str = "waiting for it to exit";
/// What the successor logs when the old instance has let the lock go.
const TAKING_OVER: &str = "taking over";
/// What a successor with sockets of its own logs once they are bound.
const BOUND: &str = "kubelet plugin sockets bound";

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

/// What kubelet saw of one hand-over: the call stream's outcome.
#[derive(Debug, Default)]
struct Calls {
    /// Calls to a registered plugin that failed (an error, or a claim
    /// error).
    failed: u32,
    /// The longest time between two answered calls, in ms.
    longest_gap: f64,
}

/// Calls NodePrepareResources on `claim` through the plugin `registrar`
/// names, one call after another, until `stop` and then
/// [`CALLS_AFTER`] answered calls more. With no plugin registered, it
/// looks again after a millisecond, as kubelet fails the call at once.
async fn call_stream(
    registrar: Arc<Registrar>,
    claim: Claim,
    mut stop: watch::Receiver<bool>,
) -> Calls {
    let mut calls = Calls::default();
    let mut last_answer = Instant::now();
    let mut after = 0;
    while after < CALLS_AFTER {
        // `None`: no plugin registered, no call made.
        let answered = match registrar.plugin(DRIVER) {
            None => None,
            Some(plugin) => Some(
                plugin
                    .prepare(std::slice::from_ref(&claim))
                    .await
                    .is_ok_and(|r| r.get(&claim.uid).is_some_and(|r| r.error.is_none())),
            ),
        };
        if answered == Some(true) {
            calls.longest_gap = calls.longest_gap.max(ms(last_answer.elapsed()));
            last_answer = Instant::now();
            if *stop.borrow_and_update() {
                after += 1;
            }
        } else {
            if answered == Some(false) {
                calls.failed += 1;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    calls
}

/// Waits until the plugin the registrar names is the one registered
/// through `reg_socket` by a registration numbered above `after` (up to
/// 10 s: kubelet's reconciler passes once a second); returns its number.
async fn wait_newest(
    registrar: &Registrar,
    reg_socket: &std::path::Path,
    after: u64,
) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some((n, p)) = registrar.newest(DRIVER)
            && n > after
            && p.registration_socket == reg_socket
        {
            return Ok(n);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the registrar did not register {} in 10 s",
            reg_socket.display()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn rolling_update(
    ctx: &Ctx,
    name: &str,
    settings: &Settings,
    per_instance: bool,
) -> anyhow::Result<Vec<Row>> {
    let dir = ctx.dir_for(name);
    let flags = if per_instance { PER_INSTANCE } else { SHARED };
    ctx.runtime.block_on(async {
        let mut node = Node::start(ctx, &dir, flags).await?;
        let claim = node.claim(&json!([result("gpu", "gpu-0")]), &json!([]))?;
        let claims = std::slice::from_ref(&claim);
        node.prepare(claims).await.context("the first instance")?;
        let reg_dir = dir.join("reg");
        let registrar = Arc::new(
            KubeletSim::new()
                .with_reconcile_period(KUBELET_RECONCILE_PERIOD)
                .watch_registrar(&reg_dir),
        );
        let mut registered = wait_newest(&registrar, node.reg_socket(), 0).await?;
        let mut runs = Vec::new();
        let mut seen = Vec::new();
        let mut first_prepare = Vec::new();
        let mut passed_on = Vec::new();
        for i in 1..=settings.runs {
            let log = dir.join(format!("plugin-{i}.log"));
            let spawned = SystemTime::now();
            let mut next = node.spawn_successor(ctx, &dir, flags, &log)?;
            wait_for_log(&log, WAITING, &mut next)
                .await
                .with_context(|| format!("successor {i}"))?;
            if per_instance {
                // Kubelet registers the waiting successor, on its own
                // sockets, before the old one is told to go.
                let text = std::fs::read_to_string(&log)?;
                wait_newest(&registrar, &bound_registration(&text)?, registered).await?;
                // Kubelet's calls meanwhile: the successor passes them on.
                let waiting = registrar
                    .plugin(DRIVER)
                    .context("the waiting successor is not registered")?;
                for _ in 0..PASSED_ON {
                    let t = Instant::now();
                    let answer = waiting.prepare(claims).await?;
                    anyhow::ensure!(
                        answer.get(&claim.uid).is_some_and(|r| r.error.is_none()),
                        "successor {i} passed a prepare on: {answer:?}"
                    );
                    passed_on.push(ms(t.elapsed()));
                }
            }
            let (stop, stopped) = watch::channel(false);
            let stream = tokio::spawn(call_stream(registrar.clone(), claim.clone(), stopped));
            tokio::time::sleep(Duration::from_millis(20)).await;
            let sent = SystemTime::now();
            let old_log = node
                .hand_over(next, log)
                .await
                .with_context(|| format!("hand-over {i}"))?;
            // Kubelet calls the new plugin: registered before the
            // hand-over (per-instance sockets) or anew after it.
            registered = wait_newest(&registrar, node.reg_socket(), registered).await?;
            stop.send_replace(true);
            seen.push(
                tokio::time::timeout(Duration::from_secs(30), stream)
                    .await
                    .context("the call stream did not end")??,
            );
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
        let calls = |f: fn(&Calls) -> f64| seen.iter().map(f).collect::<Vec<f64>>();
        let no_listener = if per_instance {
            "old plugin's deregistration to the new one serving itself"
        } else {
            "old plugin's deregistration to the new one serving (no plugin listening)"
        };
        let mut rows = vec![
            Row::new(
                name,
                "kubelet (simulated, 1 s reconcile): longest time between answered calls",
                "ms",
                calls(|c| c.longest_gap),
            ),
            Row::new(
                name,
                "kubelet (simulated): calls to a registered plugin that failed, per hand-over",
                "calls",
                calls(|c| f64::from(c.failed)),
            ),
            Row::new(name, no_listener, "ms", col(|r| r.gap)),
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
        ];
        if per_instance {
            rows.push(Row::new(
                name,
                "a prepare the waiting new plugin passes on to the old one (as kubelet sees it)",
                "ms",
                passed_on,
            ));
        }
        Ok(rows)
    })
}

/// The registration socket on a waiting successor's "sockets bound" line.
fn bound_registration(log: &str) -> anyhow::Result<PathBuf> {
    JsonLog::parse(log)
        .field(BOUND, "registration")
        .map(PathBuf::from)
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
    fn a_waiting_successors_registration_socket_is_on_its_bound_line() {
        let log = [
            line("NVML loaded", "2024-10-04T10:00:00.000000Z"),
            json!({
                "timestamp": "2024-10-04T10:00:00.100000Z",
                "message": "kubelet plugin sockets bound; passing calls on to the serving instance until this one takes over",
                "registration": "/r/gpu.nvidia.com-0a1b2c3d-reg.sock",
            })
            .to_string(),
        ]
        .join("\n");
        assert_eq!(
            bound_registration(&log).unwrap(),
            PathBuf::from("/r/gpu.nvidia.com-0a1b2c3d-reg.sock")
        );
        let err = bound_registration(&line(BOUND, "2024-10-04T10:00:00.1Z")).unwrap_err();
        assert!(err.to_string().contains("\"registration\""), "{err}");
    }

    #[test]
    fn a_missing_or_untimed_line_is_an_error() {
        let err = JsonLog::parse("not json\n").at(TAKING_OVER).unwrap_err();
        assert!(err.to_string().contains("\"taking over\""), "{err}");
        let untimed = json!({"message": "taking over"}).to_string();
        assert!(JsonLog::parse(&untimed).at(TAKING_OVER).is_err());
    }
}
