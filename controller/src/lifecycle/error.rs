//! Errors of the claim lifecycle, the slice GC and leader election.

/// What can go wrong while reconciling claims, collecting slices or
/// holding the lease.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the Kubernetes API failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done, e.g. "recording an event on claim ns/name".
        action: String,
        /// The client's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// A cache (reflector) was shut down before it synced.
    #[error("the {0} cache stopped before it was ready")]
    CacheGone(&'static str),
    /// The simulation thread is gone (it panicked or was shut down).
    #[error("the allocation simulator is not running")]
    SimulatorGone,
    /// The simulation thread could not be started.
    #[error("cannot start the allocation simulator thread: {0}")]
    SpawnSimulator(#[source] std::io::Error),
    /// The settings contradict each other.
    #[error("invalid lifecycle settings: {0}")]
    Settings(String),
    /// The lifecycle task ended abnormally (it panicked).
    #[error("the claim lifecycle task failed: {0}")]
    Stopped(String),
}

impl Error {
    /// Wraps a kube error with what was being done.
    pub(crate) fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action: action.into(),
            source: Box::new(source),
        }
    }

    /// A short, stable name for metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::CacheGone(_) => "cache",
            Error::SimulatorGone | Error::SpawnSimulator(_) => "simulator",
            Error::Settings(_) => "settings",
            Error::Stopped(_) => "task",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_action_and_kinds_are_stable() {
        let err = Error::kube(
            "deleting ResourceSlice s1",
            kube::Error::LinesCodecMaxLineLengthExceeded,
        );
        assert!(
            err.to_string().starts_with("deleting ResourceSlice s1: "),
            "{err}"
        );
        assert_eq!(err.kind(), "kube");
        assert_eq!(Error::CacheGone("Node").kind(), "cache");
        assert_eq!(
            Error::CacheGone("Node").to_string(),
            "the Node cache stopped before it was ready"
        );
        assert_eq!(Error::SimulatorGone.kind(), "simulator");
    }
}
