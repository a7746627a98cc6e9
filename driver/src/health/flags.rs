//! The health monitor's flags (flattened into [`crate::flags::Flags`]):
//! whether it runs, how often it polls, and the classification policy,
//! with NVIDIA's `--additional-xids-to-ignore` (env
//! `ADDITIONAL_XIDS_TO_IGNORE`) accepted in NVIDIA's format.

use std::collections::BTreeSet;
use std::time::Duration;

use super::classify::{self, Policy, XidSet};

/// `--health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HealthMode {
    /// Watch and poll every GPU, taint and report what is broken.
    On,
    /// No monitor: no taints, an empty health list (kubelet shows the
    /// devices' health as Unknown).
    Off,
}

/// The health monitor's flags.
#[derive(Debug, Clone, clap::Args)]
#[group(id = "health_flags")]
pub struct Flags {
    /// The GPU health monitor: NVML events and polls of every GPU turned
    /// into device taints on the published devices, the KEP-4680 health
    /// stream, metrics and Node Events (docs/health.md).
    #[arg(long = "health", env = "GPU_HEALTH", value_enum, default_value_t = HealthMode::On)]
    pub mode: HealthMode,

    /// How often every GPU is polled (recovery action, row remapping, ECC,
    /// liveness, slowdown, PCIe replays, NVLinks); the first poll runs
    /// before kubelet's calls are served. `100ms` to `1h`.
    #[arg(long = "health-poll-interval", env = "HEALTH_POLL_INTERVAL", default_value = "10s", value_parser = gpu_dra_cmdline::parse_interval)]
    pub poll_interval: Duration,

    /// Health taint keys whose `NoSchedule` taints become `NoExecute`, so
    /// Kubernetes evicts the pods using the device: a comma list of
    /// `gpu-lost`, `reset-required`, `reboot-required`, `hardware-failure`,
    /// `xid` (or their `gpu.nvidia.com/` keys). Empty (the default): never
    /// `NoExecute`, as NVIDIA's driver.
    #[arg(long = "health-evict", env = "HEALTH_EVICT", default_value = "", value_parser = Short(parse_evict))]
    pub evict: BTreeSet<String>,

    /// NVIDIA's flag: XIDs, comma separated, that taint with effect `None`
    /// (informational) on top of the default list 13, 31, 43, 45, 68, 109.
    /// A malformed entry is an error (NVIDIA's driver drops it silently).
    #[arg(long = "additional-xids-to-ignore", env = "ADDITIONAL_XIDS_TO_IGNORE", default_value = "", value_parser = Short(parse_xid_list))]
    pub additional_xids_to_ignore: BTreeSet<u64>,

    /// XIDs that always taint `NoSchedule`, whatever NVML's recovery action
    /// or the ignore lists say: `all`, or a comma list. Empty: none.
    #[arg(long = "xids-fatal", env = "XIDS_FATAL", default_value = "", value_parser = Short(parse_xid_set))]
    pub xids_fatal: XidSet,

    /// A GPU that needed a reset or reboot, or was lost, is taken as
    /// recovered once its checks pass and nothing new happened for this
    /// long. `1s` to `1h`.
    #[arg(long = "health-quiet-period", env = "HEALTH_QUIET_PERIOD", default_value = "60s", value_parser = parse_quiet)]
    pub quiet_period: Duration,

    /// Informational taints (`xid` with effect `None`, `degraded`) expire
    /// this long after they were last seen. `1m` to `24h`.
    #[arg(long = "health-info-ttl", env = "HEALTH_INFO_TTL", default_value = "1h", value_parser = parse_ttl)]
    pub info_ttl: Duration,
}

impl Flags {
    /// Whether the monitor runs.
    pub fn enabled(&self) -> bool {
        self.mode == HealthMode::On
    }

    /// The classification policy these flags give.
    pub fn policy(&self) -> Policy {
        Policy {
            ignored_xids: self.additional_xids_to_ignore.clone(),
            fatal_xids: self.xids_fatal.clone(),
            evict: self.evict.clone(),
            quiet: self.quiet_period,
            info_ttl: self.info_ttl,
            ..Policy::default()
        }
    }
}

/// A value parser whose error quotes at most the first 32 characters of
/// the value: clap's own message repeats all of it, and a list flag may
/// be given kilobytes.
#[derive(Clone, Copy)]
struct Short<T: Clone + Send + Sync + 'static>(fn(&str) -> Result<T, String>);

/// Longest part of a bad value an error quotes.
const QUOTED: usize = 32;

impl<T: Clone + Send + Sync + 'static> clap::builder::TypedValueParser for Short<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        let name = arg
            .and_then(clap::Arg::get_long)
            .map_or_else(|| "value".to_owned(), |l| format!("--{l}"));
        let fail = |why: String| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for '{name}': {why}\n"),
            )
            .with_cmd(cmd)
        };
        let text = value
            .to_str()
            .ok_or_else(|| fail("not valid UTF-8".to_owned()))?;
        (self.0)(text).map_err(|why| {
            let quoted: String = text.chars().take(QUOTED).collect();
            let more = if text.chars().count() > QUOTED {
                "..."
            } else {
                ""
            };
            fail(format!("{quoted:?}{more}: {why}"))
        })
    }
}

fn parse_evict(s: &str) -> Result<BTreeSet<String>, String> {
    classify::parse_evict(s).map_err(|e| e.to_string())
}

fn parse_xid_list(s: &str) -> Result<BTreeSet<u64>, String> {
    classify::parse_xid_list(s).map_err(|e| e.to_string())
}

fn parse_xid_set(s: &str) -> Result<XidSet, String> {
    classify::parse_xid_set(s).map_err(|e| e.to_string())
}

fn parse_within(s: &str, min: Duration, max: Duration, range: &str) -> Result<Duration, String> {
    let d = gpu_dra_cmdline::parse_duration(s)?;
    if d < min || d > max {
        return Err(format!("duration {s:?} is out of range ({range})"));
    }
    Ok(d)
}

/// A `--health-quiet-period` value: a duration from 1 s to 1 h. Public so
/// that the demo, which passes the flag on, accepts exactly what the plugin
/// does.
pub fn parse_quiet(s: &str) -> Result<Duration, String> {
    parse_within(
        s,
        Duration::from_secs(1),
        Duration::from_secs(3600),
        "1s to 1h",
    )
}

fn parse_ttl(s: &str) -> Result<Duration, String> {
    parse_within(
        s,
        Duration::from_secs(60),
        Duration::from_secs(24 * 3600),
        "1m to 24h",
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        health: Flags,
    }

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        Cli::try_parse_from(std::iter::once("p").chain(args.iter().copied())).map(|c| c.health)
    }

    #[test]
    fn defaults_are_on_with_nvidias_policy() {
        let f = parse(&[]).unwrap();
        assert!(f.enabled());
        assert_eq!(f.poll_interval, Duration::from_secs(10));
        assert_eq!(f.quiet_period, Duration::from_secs(60));
        assert_eq!(f.info_ttl, Duration::from_secs(3600));
        assert!(f.evict.is_empty());
        assert!(f.additional_xids_to_ignore.is_empty());
        assert_eq!(f.xids_fatal, XidSet::default());
        let p = f.policy();
        assert_eq!(p.quiet, Duration::from_secs(60));
        assert!(p.evict.is_empty());
    }

    #[test]
    fn values_are_read() {
        let f = parse(&[
            "--health=off",
            "--health-poll-interval=500ms",
            "--health-evict=gpu-lost, gpu.nvidia.com/reboot-required",
            "--additional-xids-to-ignore=48, 94",
            "--xids-fatal=ALL",
            "--health-quiet-period=5s",
            "--health-info-ttl=2h",
        ])
        .unwrap();
        assert!(!f.enabled());
        assert_eq!(f.poll_interval, Duration::from_millis(500));
        assert_eq!(
            f.evict,
            BTreeSet::from(["gpu-lost".to_owned(), "reboot-required".to_owned()])
        );
        assert_eq!(f.additional_xids_to_ignore, BTreeSet::from([48, 94]));
        assert_eq!(f.xids_fatal, XidSet::All);
        let p = f.policy();
        assert_eq!(p.ignored_xids, BTreeSet::from([48, 94]));
        assert_eq!(p.fatal_xids, XidSet::All);
        assert_eq!(p.quiet, Duration::from_secs(5));
        assert_eq!(p.info_ttl, Duration::from_secs(7200));
        let f = parse(&["--xids-fatal=79,119"]).unwrap();
        assert_eq!(f.xids_fatal, XidSet::Some(BTreeSet::from([79, 119])));
    }

    #[test]
    fn hostile_values_give_one_line_errors() {
        let huge = "1,".repeat(5000);
        let nul = "13,\u{0}";
        for (args, needle) in [
            (&["--health=maybe"][..], "--health"),
            (&["--health-poll-interval=0s"][..], "out of range"),
            (&["--health-poll-interval=10"][..], "missing unit"),
            (
                &["--health-poll-interval=-1s"][..],
                "--health-poll-interval",
            ),
            (&["--health-evict=gpu-lost,bogus"][..], "bogus"),
            (&["--health-evict=degraded"][..], "degraded"),
            (&["--health-evict=gpu-lost,,xid"][..], "empty"),
            (
                &["--additional-xids-to-ignore=13,x"][..],
                "--additional-xids-to-ignore",
            ),
            (
                &["--additional-xids-to-ignore=99999999999999999999"][..],
                "99999999999999999999",
            ),
            (&["--additional-xids-to-ignore=13,,31"][..], "empty"),
            (
                &["--additional-xids-to-ignore", &huge][..],
                "--additional-xids-to-ignore",
            ),
            (
                &["--additional-xids-to-ignore", nul][..],
                "--additional-xids-to-ignore",
            ),
            (&["--xids-fatal=al"][..], "--xids-fatal"),
            (&["--xids-fatal=-5"][..], "--xids-fatal"),
            (&["--health-quiet-period=0s"][..], "1s to 1h"),
            (&["--health-quiet-period=2h"][..], "1s to 1h"),
            (&["--health-info-ttl=1s"][..], "1m to 24h"),
            (&["--health-info-ttl=1000h"][..], "too long"),
        ] {
            let e = parse(args).unwrap_err();
            let line = gpu_dra_cmdline::one_line_error(&e);
            assert!(line.starts_with("error: "), "{line}");
            assert!(!line.contains('\n'), "{line}");
            assert!(line.contains(needle), "{args:?}: {needle} not in {line}");
            assert!(line.len() < 600, "{args:?}: {} bytes", line.len());
        }
    }
}
