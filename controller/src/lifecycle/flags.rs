//! The claim lifecycle's, slice GC's and leader election's flags (a group
//! flattened into the controller's command line) and the settings they
//! resolve to. Every flag can also be set from an environment variable.

use std::time::Duration;

use gpu_dra_api::schema::{is_dns_label, is_dns_subdomain};
use gpu_dra_cmdline::parse_duration;

use super::Error;
use super::claims::ClaimSettings;
use super::gc::GcSettings;
use super::leader::LeaseSettings;

/// Flags of the claim lifecycle, slice GC and leader election, flattened
/// into [`crate::flags::Flags`].
#[derive(Debug, Clone, clap::Args)]
#[group(id = "lifecycle_flags")]
pub struct Flags {
    /// How long a claim using one of the driver's DeviceClasses may stay
    /// unallocated before the controller simulates its allocation and, if
    /// no node can satisfy it, records a Warning Event saying why (`0s`:
    /// at once). Durations: `<n>ms`, `<n>s`, `<n>m` or `<n>h`.
    #[arg(long, env = "PENDING_GRACE_PERIOD", default_value = "30s", value_parser = parse_duration)]
    pub pending_grace_period: Duration,

    /// How often a pending claim that could be allocated (the scheduler has
    /// not got to it) is simulated again.
    #[arg(long, env = "PENDING_RECHECK_INTERVAL", default_value = "1m", value_parser = parse_positive_duration)]
    pub pending_recheck_interval: Duration,

    /// How often a claim that no node can satisfy is simulated again (a
    /// new Event is recorded only when the explanation changes).
    #[arg(long, env = "UNALLOCATABLE_RECHECK_INTERVAL", default_value = "5m", value_parser = parse_positive_duration)]
    pub unallocatable_recheck_interval: Duration,

    /// Do not delete the driver's ResourceSlices whose Node is gone.
    #[arg(long, env = "NO_SLICE_GC", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    pub no_slice_gc: bool,

    /// Time between garbage collection passes over the ResourceSlices (a
    /// pass also runs when a Node is deleted).
    #[arg(long, env = "SLICE_GC_INTERVAL", default_value = "1m", value_parser = parse_positive_duration)]
    pub slice_gc_interval: Duration,

    /// How long a ResourceSlice must stay without its Node (over at least
    /// two passes) before it is deleted.
    #[arg(long, env = "SLICE_GC_GRACE_PERIOD", default_value = "30s", value_parser = parse_duration)]
    pub slice_gc_grace_period: Duration,

    /// Elect a leader through a coordination.k8s.io Lease: only the leader
    /// runs the claim lifecycle and slice GC (needed with more than one
    /// replica; the webhook serves on every replica).
    #[arg(long, env = "LEADER_ELECTION", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    pub leader_election: bool,

    /// Namespace of the Lease (default: $POD_NAMESPACE, else `default`).
    #[arg(long, env = "LEADER_ELECTION_NAMESPACE", value_parser = parse_dns_label)]
    pub leader_election_namespace: Option<String>,

    /// Name of the Lease.
    #[arg(long, visible_alias = "lease-name", env = "LEADER_ELECTION_LEASE_NAME",
          default_value = "gpu-dra-controller", value_parser = parse_dns_subdomain)]
    pub leader_election_lease_name: String,

    /// This replica's identity in the Lease and in the Events it records
    /// (default: $POD_NAME, else the host name with a random suffix).
    #[arg(long, env = "POD_NAME", value_parser = parse_identity)]
    pub leader_election_identity: Option<String>,

    /// How long the Lease is valid without renewal: how long the others
    /// wait before taking over from a leader that died.
    #[arg(long, env = "LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = parse_positive_duration)]
    pub leader_election_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it steps down
    /// (shorter than the lease duration).
    #[arg(long, env = "LEADER_ELECTION_RENEW_DEADLINE", default_value = "10s", value_parser = parse_positive_duration)]
    pub leader_election_renew_deadline: Duration,

    /// Time between attempts to acquire or renew the Lease (shorter than
    /// the renew deadline).
    #[arg(long, env = "LEADER_ELECTION_RETRY_PERIOD", default_value = "2s", value_parser = parse_positive_duration)]
    pub leader_election_retry_period: Duration,
}

impl Default for Flags {
    fn default() -> Self {
        Flags {
            pending_grace_period: Duration::from_secs(30),
            pending_recheck_interval: Duration::from_secs(60),
            unallocatable_recheck_interval: Duration::from_secs(300),
            no_slice_gc: false,
            slice_gc_interval: Duration::from_secs(60),
            slice_gc_grace_period: Duration::from_secs(30),
            leader_election: false,
            leader_election_namespace: None,
            leader_election_lease_name: "gpu-dra-controller".to_owned(),
            leader_election_identity: None,
            leader_election_lease_duration: Duration::from_secs(15),
            leader_election_renew_deadline: Duration::from_secs(10),
            leader_election_retry_period: Duration::from_secs(2),
        }
    }
}

/// Everything the lifecycle needs, resolved from [`Flags`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The claim reconciler.
    pub claims: ClaimSettings,
    /// The slice GC (`None`: off).
    pub slice_gc: Option<GcSettings>,
    /// Leader election (`None`: this replica always leads).
    pub leader_election: Option<LeaseSettings>,
    /// `reportingController` of the Events (`<driver>/controller`).
    pub reporting_controller: String,
    /// This replica (`reportingInstance`, Lease holder identity).
    pub identity: String,
}

impl Settings {
    /// Settings with the defaults for `driver` and no leader election
    /// (tests and embedding).
    pub fn new(driver: &str, identity: &str) -> Self {
        Flags::default().base_settings(driver, identity.to_owned())
    }
}

impl Flags {
    /// Resolves the flags for `driver` (the controller's `--driver-name`).
    pub fn settings(&self, driver: &str) -> Result<Settings, Error> {
        let identity = self
            .leader_election_identity
            .clone()
            .unwrap_or_else(default_identity);
        let mut settings = self.base_settings(driver, identity.clone());
        if self.leader_election {
            let namespace = self
                .leader_election_namespace
                .clone()
                .or_else(|| {
                    std::env::var("POD_NAMESPACE")
                        .ok()
                        .filter(|n| !n.is_empty())
                })
                .unwrap_or_else(|| "default".to_owned());
            let lease = LeaseSettings {
                namespace,
                name: self.leader_election_lease_name.clone(),
                identity,
                lease_duration: self.leader_election_lease_duration,
                renew_deadline: self.leader_election_renew_deadline,
                retry_period: self.leader_election_retry_period,
            };
            lease.validate()?;
            settings.leader_election = Some(lease);
        }
        Ok(settings)
    }

    /// Everything but leader election.
    fn base_settings(&self, driver: &str, identity: String) -> Settings {
        Settings {
            claims: ClaimSettings {
                driver: driver.to_owned(),
                grace_period: self.pending_grace_period,
                recheck_interval: self.pending_recheck_interval,
                unallocatable_recheck_interval: self.unallocatable_recheck_interval,
                error_backoff: Duration::from_secs(10),
            },
            slice_gc: (!self.no_slice_gc).then_some(GcSettings {
                interval: self.slice_gc_interval,
                grace_period: self.slice_gc_grace_period,
            }),
            leader_election: None,
            reporting_controller: format!("{driver}/controller"),
            identity,
        }
    }
}

/// `$HOSTNAME` (or the kernel's host name) with a random suffix, so two
/// processes on one host differ.
fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "gpu-dra-controller".to_owned());
    let suffix = {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        hasher.finish() & 0xffff_ffff
    };
    let host: String = host.chars().take(200).collect();
    format!("{host}_{suffix:08x}")
}

/// Like [`parse_duration`], at least 10 ms.
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(10) {
        return Err(format!("duration {s:?} is too short (at least 10ms)"));
    }
    Ok(d)
}

fn parse_dns_label(s: &str) -> Result<String, String> {
    if is_dns_label(s) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "invalid namespace {s:?}: must be a lowercase DNS label of at most 63 characters"
        ))
    }
}

fn parse_dns_subdomain(s: &str) -> Result<String, String> {
    if is_dns_subdomain(s) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "invalid lease name {s:?}: must be a lowercase DNS subdomain of at most 253 characters"
        ))
    }
}

fn parse_identity(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 128 || s.chars().any(char::is_control) {
        Err(format!(
            "invalid identity {s:?}: must be 1 to 128 printable characters"
        ))
    } else {
        Ok(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        flags: Flags,
    }

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).map(|c| c.flags)
    }

    #[test]
    fn the_group_is_consistent_and_defaults_match_default() {
        Cli::command().debug_assert();
        let parsed = parse(&[]).unwrap();
        let default = Flags::default();
        assert_eq!(parsed.pending_grace_period, default.pending_grace_period);
        assert_eq!(
            parsed.pending_recheck_interval,
            default.pending_recheck_interval
        );
        assert_eq!(
            parsed.unallocatable_recheck_interval,
            default.unallocatable_recheck_interval
        );
        assert_eq!(parsed.slice_gc_interval, default.slice_gc_interval);
        assert_eq!(parsed.slice_gc_grace_period, default.slice_gc_grace_period);
        assert_eq!(
            parsed.leader_election_lease_name,
            default.leader_election_lease_name
        );
        assert_eq!(
            parsed.leader_election_lease_duration,
            default.leader_election_lease_duration
        );
        assert_eq!(
            parsed.leader_election_renew_deadline,
            default.leader_election_renew_deadline
        );
        assert_eq!(
            parsed.leader_election_retry_period,
            default.leader_election_retry_period
        );
        assert!(!parsed.leader_election && !parsed.no_slice_gc);
    }

    #[test]
    fn settings_follow_the_flags() {
        let flags = parse(&[
            "--pending-grace-period",
            "0s",
            "--slice-gc-interval",
            "500ms",
            "--leader-election",
            "--leader-election-namespace",
            "gpu-system",
            "--lease-name",
            "gpu-lease",
            "--leader-election-identity",
            "pod-1",
        ])
        .unwrap();
        let s = flags.settings("gpu.nvidia.com").unwrap();
        assert_eq!(s.claims.grace_period, Duration::ZERO);
        assert_eq!(s.claims.driver, "gpu.nvidia.com");
        assert_eq!(s.slice_gc.unwrap().interval, Duration::from_millis(500));
        let lease = s.leader_election.unwrap();
        assert_eq!(lease.namespace, "gpu-system");
        assert_eq!(lease.name, "gpu-lease");
        assert_eq!(lease.identity, "pod-1");
        assert_eq!(s.identity, "pod-1");
        assert_eq!(s.reporting_controller, "gpu.nvidia.com/controller");

        let off = parse(&["--no-slice-gc"]).unwrap().settings("x.io").unwrap();
        assert!(off.slice_gc.is_none() && off.leader_election.is_none());
        assert!(!off.identity.is_empty());
    }

    #[test]
    fn inconsistent_lease_timing_is_an_error() {
        let flags = parse(&[
            "--leader-election",
            "--leader-election-lease-duration",
            "5s",
            "--leader-election-renew-deadline",
            "10s",
        ])
        .unwrap();
        let err = flags.settings("gpu.nvidia.com").unwrap_err().to_string();
        assert!(err.contains("lease duration"), "{err}");
        // Without election the timing is not used.
        let mut flags = flags;
        flags.leader_election = false;
        assert!(flags.settings("gpu.nvidia.com").is_ok());
    }

    #[test]
    fn positive_durations_are_at_least_10ms() {
        assert!(
            parse_positive_duration("0s")
                .unwrap_err()
                .contains("too short")
        );
        assert!(parse_positive_duration("5ms").is_err());
    }

    #[test]
    fn bad_flag_values_are_rejected_with_the_flag_named() {
        for (args, needle) in [
            (
                vec!["--pending-grace-period", "soon"],
                "--pending-grace-period",
            ),
            (vec!["--pending-recheck-interval", "0s"], "too short"),
            (
                vec!["--leader-election-namespace", "Kube_System"],
                "invalid namespace",
            ),
            (vec!["--lease-name", "a..b"], "invalid lease name"),
            (
                vec!["--leader-election-identity", "a\nb"],
                "invalid identity",
            ),
            (vec!["--leader-election", "maybe"], "maybe"),
        ] {
            let err = parse(&args).unwrap_err().to_string();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn default_identities_differ_per_call_and_are_bounded() {
        let a = default_identity();
        assert!(!a.is_empty() && a.len() <= 210, "{a}");
        assert!(a.contains('_'));
        assert_eq!(
            Settings::new("gpu.nvidia.com", "me").identity,
            "me".to_owned()
        );
    }
}
