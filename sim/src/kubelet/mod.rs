//! A kubelet simulator for DRA plugins, following kubelet's behaviour
//! (1.34+) over real Unix sockets:
//!
//! - [`Registrar`] watches a registrar directory like kubelet's plugin
//!   watcher: a new socket is registered, a deleted one deregistered;
//! - [`KubeletSim::register`] does what kubelet does with one socket:
//!   `GetInfo` with a 1 s deadline (tried again a second later when it
//!   times out, a few times), checks of type, name and endpoint, the
//!   first entry of the plugin's `supported_versions` that the simulated
//!   kubelet knows, and `NotifyRegistrationStatus` true or false with the
//!   reason;
//! - [`Plugin::prepare`] / [`Plugin::unprepare`] send one call with a 45 s
//!   deadline in the chosen DRAPlugin version and fail unless the response
//!   holds exactly the requested claim UIDs; [`Plugin::watch_health`] opens
//!   the health stream;
//! - [`raw`] sends hand-built HTTP/2 requests, for what a well-behaved
//!   client library refuses to send (any `:authority`, malformed bodies).
//!
//! The DRAPlugin versions the simulated kubelet knows are configurable, so
//! tests can play an old kubelet that only speaks v1beta1.

mod conn;
mod plugin;
pub mod raw;
mod register;
mod registrar;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

pub use plugin::{
    Device, DeviceHealth, HealthStream, Plugin, PrepareResult, UnprepareResult, check_uids,
};
pub use registrar::{Registrar, RegistrarEvent};

/// Kubelet's deadline for `GetInfo`.
pub const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
/// How many times [`KubeletSim::register`] sends a `GetInfo` that times out.
pub const REGISTER_TRIES: u32 = 3;
/// The pause before another try (also the registrar's): kubelet's
/// reconciler runs once a second.
pub(crate) const REGISTER_RETRY: Duration = Duration::from_secs(1);
/// Kubelet's deadline for NodePrepareResources / NodeUnprepareResources.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(45);

/// A simulated kubelet: which versions it knows, what `:authority` it
/// sends, and its deadlines.
#[derive(Clone, Debug)]
pub struct KubeletSim {
    pub(crate) dra_versions: Vec<DraVersion>,
    pub(crate) health_versions: Vec<HealthVersion>,
    pub(crate) authority: String,
    pub(crate) get_info_timeout: Duration,
    pub(crate) call_timeout: Duration,
    pub(crate) reconcile_period: Duration,
}

/// The registrar's default pass period: shorter than kubelet's second,
/// to keep tests quick; [`KubeletSim::with_reconcile_period`] sets
/// kubelet's own.
pub const RECONCILE_PERIOD: Duration = Duration::from_millis(50);

/// Kubelet's reconciler period (`loopSleepDuration`).
pub const KUBELET_RECONCILE_PERIOD: Duration = Duration::from_secs(1);

impl Default for KubeletSim {
    fn default() -> Self {
        Self::new()
    }
}

impl KubeletSim {
    /// A kubelet of 1.34 or later: knows v1 and v1beta1 DRAPlugin, both
    /// health versions, sends `localhost`, 1 s GetInfo and 45 s call deadlines.
    pub fn new() -> Self {
        Self {
            dra_versions: vec![DraVersion::V1, DraVersion::V1beta1],
            health_versions: vec![HealthVersion::V1alpha1, HealthVersion::V1],
            authority: "localhost".to_owned(),
            get_info_timeout: GET_INFO_TIMEOUT,
            call_timeout: CALL_TIMEOUT,
            reconcile_period: RECONCILE_PERIOD,
        }
    }

    /// How often the registrar ([`watch_registrar`](Self::watch_registrar))
    /// makes a pass over the directory; [`KUBELET_RECONCILE_PERIOD`] is
    /// kubelet's.
    pub fn with_reconcile_period(mut self, period: Duration) -> Self {
        self.reconcile_period = period;
        self
    }

    /// The DRAPlugin versions this kubelet knows (1.32/1.33: only v1beta1).
    pub fn with_dra_versions(mut self, versions: impl IntoIterator<Item = DraVersion>) -> Self {
        self.dra_versions = versions.into_iter().collect();
        self
    }

    /// The health versions this kubelet knows (none before 1.34).
    pub fn with_health_versions(
        mut self,
        versions: impl IntoIterator<Item = HealthVersion>,
    ) -> Self {
        self.health_versions = versions.into_iter().collect();
        self
    }

    /// The `:authority` sent on every call; must be a valid URI authority
    /// (for others, see [`raw`]).
    pub fn with_authority(mut self, authority: impl Into<String>) -> Self {
        self.authority = authority.into();
        self
    }

    /// The NodePrepare/NodeUnprepare deadline.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }
}

/// Errors of the simulator. Each message is one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket could not be dialled.
    #[error("cannot connect to {socket}: {message}")]
    Connect {
        /// The socket path.
        socket: PathBuf,
        /// Why, flattened to one line.
        message: String,
    },
    /// The `:authority` cannot be expressed as a URI by tonic's client.
    #[error("authority {0:?} is not a valid URI authority; use the raw client")]
    InvalidAuthority(String),
    /// A call returned a gRPC error status.
    #[error("{method} failed: {code:?}: {message}")]
    Rpc {
        /// The method.
        method: &'static str,
        /// The gRPC status code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
    /// A call did not finish before its deadline.
    #[error("{method} did not answer within {after:?}")]
    Timeout {
        /// The method.
        method: &'static str,
        /// The deadline.
        after: Duration,
    },
    /// The simulated kubelet refused the plugin's registration.
    #[error("registration of {socket} rejected: {reason}")]
    Rejected {
        /// The registration socket.
        socket: PathBuf,
        /// The reason sent in `NotifyRegistrationStatus`.
        reason: String,
    },
    /// The response's claim UIDs differ from the request's.
    #[error("{method} answered the wrong claims: missing {missing:?}, unexpected {unexpected:?}")]
    ResponseMismatch {
        /// The method.
        method: &'static str,
        /// Requested UIDs without an answer.
        missing: Vec<String>,
        /// Answered UIDs nobody asked about.
        unexpected: Vec<String>,
    },
    /// The plugin does not serve what was asked of it.
    #[error("{0}")]
    Unsupported(String),
    /// Watching the registrar directory failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Nothing happened within the wait time.
    #[error("timed out after {0:?} waiting for {1}")]
    Wait(Duration, String),
    /// The raw HTTP/2 exchange failed.
    #[error("raw HTTP/2 call failed: {0}")]
    Raw(String),
    /// A claim given as text is not `namespace/name/uid`.
    #[error("invalid claim {0:?}: expected namespace/name/uid")]
    ClaimSyntax(String),
}

/// The DRAPlugin service versions kubelet may speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum DraVersion {
    /// `v1.DRAPlugin`.
    #[serde(rename = "v1.DRAPlugin")]
    V1,
    /// `v1beta1.DRAPlugin`.
    #[serde(rename = "v1beta1.DRAPlugin")]
    V1beta1,
}

impl DraVersion {
    /// The name used in `supported_versions`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => dra_proto::versions::DRA_V1,
            Self::V1beta1 => dra_proto::versions::DRA_V1BETA1,
        }
    }

    /// Parses a `supported_versions` entry.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::V1, Self::V1beta1]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

/// The DRAResourceHealth service versions kubelet may speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum HealthVersion {
    /// `v1alpha1.DRAResourceHealth`.
    #[serde(rename = "v1alpha1.DRAResourceHealth")]
    V1alpha1,
    /// `v1.DRAResourceHealth`.
    #[serde(rename = "v1.DRAResourceHealth")]
    V1,
}

impl HealthVersion {
    /// The name used in `supported_versions`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1alpha1 => dra_proto::versions::HEALTH_V1ALPHA1,
            Self::V1 => dra_proto::versions::HEALTH_V1,
        }
    }

    /// Parses a `supported_versions` entry.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::V1alpha1, Self::V1]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

/// A claim as kubelet names it in NodePrepareResources.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Claim {
    /// Namespace of the ResourceClaim.
    pub namespace: String,
    /// Name of the ResourceClaim.
    pub name: String,
    /// UID of the ResourceClaim.
    pub uid: String,
}

impl Claim {
    /// A claim reference.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        uid: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    /// The claim as a DRAPlugin v1 request carries it.
    pub fn to_v1(&self) -> dra_proto::dra::v1::Claim {
        dra_proto::dra::v1::Claim {
            namespace: self.namespace.clone(),
            uid: self.uid.clone(),
            name: self.name.clone(),
        }
    }

    /// The claim as a DRAPlugin v1beta1 request carries it.
    pub fn to_v1beta1(&self) -> dra_proto::dra::v1beta1::Claim {
        dra_proto::dra::v1beta1::Claim {
            namespace: self.namespace.clone(),
            uid: self.uid.clone(),
            name: self.name.clone(),
        }
    }
}

impl FromStr for Claim {
    type Err = Error;

    /// Parses `namespace/name/uid`; all three parts must be non-empty.
    fn from_str(s: &str) -> Result<Self, Error> {
        let parts: Vec<&str> = s.split('/').collect();
        match parts[..] {
            [ns, name, uid] if !ns.is_empty() && !name.is_empty() && !uid.is_empty() => {
                Ok(Self::new(ns, name, uid))
            }
            _ => Err(Error::ClaimSyntax(s.to_owned())),
        }
    }
}

impl fmt::Display for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.name, self.uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_parse_from_namespace_name_uid() {
        let c: Claim = "default/my-claim/1234".parse().unwrap();
        assert_eq!(c, Claim::new("default", "my-claim", "1234"));
        assert_eq!(c.to_string(), "default/my-claim/1234");
        for bad in ["", "a/b", "a/b/c/d", "/b/c", "a//c", "a/b/"] {
            assert!(
                matches!(bad.parse::<Claim>(), Err(Error::ClaimSyntax(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn version_names_round_trip() {
        for v in [DraVersion::V1, DraVersion::V1beta1] {
            assert_eq!(DraVersion::parse(v.as_str()), Some(v));
        }
        for v in [HealthVersion::V1alpha1, HealthVersion::V1] {
            assert_eq!(HealthVersion::parse(v.as_str()), Some(v));
        }
        assert_eq!(DraVersion::parse("v1alpha3.Node"), None);
        assert_eq!(HealthVersion::parse("v1.DRAPlugin"), None);
    }
}
