//! The claim preparer of a rolling update's new instance while it waits to
//! take over.
//!
//! With per-instance sockets ([`super::instance`]) the new instance
//! registers with kubelet before the old one has let the node go, and
//! kubelet calls the newest plugin. Until the new instance holds the node's
//! state, [`Handover`] passes each prepare and unprepare on to the serving
//! instance over its DRA socket: the old instance answers, as the only
//! owner of the checkpoint, the MIG devices and the MPS daemons. Once this
//! instance has taken over, calls go to its own preparer.
//!
//! A call the old instance cannot answer (it is draining, has gone, or
//! broke the connection) waits until this instance has taken over and is
//! then made here. Kubelet never sees the old instance's shutdown: its
//! connection is to this instance throughout. Running such a call again is
//! safe: prepare and unprepare are idempotent and crash-safe, so a call the
//! old instance had finished, or begun, is completed or answered from the
//! checkpoint.
//!
//! Calls are passed on as DRAPlugin v1, which every version of this plugin
//! serves, whichever version kubelet used. They share one connection to
//! the serving instance, made by the first: a connection set-up costs
//! about as much as the call itself, and a rollout passes on several calls
//! when many pods start. A call that fails over it lets it go; the next
//! call connects afresh (the serving link may name another instance by
//! then).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use dra_proto::dra::v1;
use dra_proto::dra::v1::dra_plugin_client::DraPluginClient;
use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::prepare::claim::{ClaimError, ClaimPreparer, ClaimRef, ClaimResults, PreparedDevice};

/// Passes calls on to the serving instance until this one has taken over.
pub(super) struct Handover {
    targets: Vec<PathBuf>,
    /// This instance's own preparer, once it has taken over.
    local: watch::Sender<Option<Arc<dyn ClaimPreparer>>>,
    /// The connection the calls passed on share; none before the first
    /// call, after a failed one and after the take-over.
    connection: Mutex<Option<Connection>>,
    /// The id the next connection gets.
    connections: AtomicU64,
    forwarded: AtomicU64,
}

/// A client over one connection to a target (clones share it).
#[derive(Clone)]
pub(super) struct Connection {
    /// Tells this connection from those made before and after it.
    pub(super) id: u64,
    target: PathBuf,
    client: DraPluginClient<Channel>,
}

impl Handover {
    /// Calls go to the first of `targets` that takes a connection, until
    /// [`take_over`](Self::take_over).
    pub(super) fn new(targets: Vec<PathBuf>) -> Self {
        Self {
            targets,
            local: watch::Sender::new(None),
            connection: Mutex::new(None),
            connections: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
        }
    }

    /// From now on `preparer` answers every call, those waiting included.
    pub(super) fn take_over(&self, preparer: Arc<dyn ClaimPreparer>) {
        self.local.send_replace(Some(preparer));
        // Closes the connection to the instance that served until now.
        self.kept_connection().take();
    }

    /// Calls answered by another instance so far.
    pub(super) fn forwarded(&self) -> u64 {
        self.forwarded.load(Ordering::Relaxed)
    }

    fn taken_over(&self) -> Option<Arc<dyn ClaimPreparer>> {
        self.local.borrow().clone()
    }

    /// This instance's preparer, once it has one. The sender lives as
    /// long as `self`, so the wait ends only with the take-over (or with
    /// the call, when the server drops it).
    async fn wait_for_takeover(&self) -> Arc<dyn ClaimPreparer> {
        let mut local = self.local.subscribe();
        loop {
            if let Some(preparer) = local.borrow_and_update().clone() {
                return preparer;
            }
            // Cannot fail: `self` holds the sender.
            let _ = local.changed().await;
        }
    }

    fn kept_connection(&self) -> std::sync::MutexGuard<'_, Option<Connection>> {
        self.connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Lets the connection `id` go, if it is still the kept one: a call
    /// that fails late on an older connection keeps the newer one.
    pub(super) fn forget_connection(&self, id: u64) {
        let mut kept = self.kept_connection();
        if kept.as_ref().is_some_and(|c| c.id == id) {
            kept.take();
        }
    }

    /// Whether a connection to a serving instance is kept.
    #[cfg(test)]
    pub(super) fn has_connection(&self) -> bool {
        self.kept_connection().is_some()
    }

    /// A client on the kept connection, or else on the first target that
    /// takes one (kept from then on). Calls passed on at the same moment
    /// before any connection is kept may each make one; the last is kept.
    pub(super) async fn serving_instance(&self) -> Option<Connection> {
        if let Some(kept) = self.kept_connection().clone() {
            return Some(kept);
        }
        for target in &self.targets {
            match connect(target).await {
                Ok(channel) => {
                    let connection = Connection {
                        id: self.connections.fetch_add(1, Ordering::Relaxed),
                        target: target.clone(),
                        client: DraPluginClient::new(channel),
                    };
                    *self.kept_connection() = Some(connection.clone());
                    return Some(connection);
                }
                Err(e) => {
                    tracing::debug!(target = %target.display(), error = %e, "no plugin instance there");
                }
            }
        }
        None
    }

    /// The serving instance's answer to `call` (a prepare or unprepare
    /// of `claims`, named `what`); `None` when there is none.
    async fn forward<T, F, Fut>(
        &self,
        what: &str,
        claims: usize,
        call: F,
    ) -> Option<ClaimResults<T>>
    where
        F: FnOnce(DraPluginClient<Channel>) -> Fut,
        Fut: Future<Output = Result<ClaimResults<T>, tonic::Status>>,
    {
        let Connection { id, target, client } = self.serving_instance().await?;
        match call(client).await {
            Ok(answer) => {
                self.forwarded.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(target = %target.display(), claims, "{what} answered by the serving instance");
                Some(answer)
            }
            Err(status) => {
                self.forget_connection(id);
                tracing::info!(target = %target.display(), error = %status, "the serving instance did not answer a {what}; it waits for this instance to take over");
                None
            }
        }
    }

    async fn forward_prepare(
        &self,
        claims: &[ClaimRef],
    ) -> Option<ClaimResults<Vec<PreparedDevice>>> {
        let request = v1::NodePrepareResourcesRequest {
            claims: claims.iter().map(v1::Claim::from).collect(),
        };
        self.forward("prepare", claims.len(), |mut client| async move {
            let answer = client.node_prepare_resources(request).await?.into_inner();
            Ok(results(answer.claims, |r| {
                (
                    r.error,
                    r.devices.into_iter().map(PreparedDevice::from).collect(),
                )
            }))
        })
        .await
    }

    async fn forward_unprepare(&self, claims: &[ClaimRef]) -> Option<ClaimResults<()>> {
        let request = v1::NodeUnprepareResourcesRequest {
            claims: claims.iter().map(v1::Claim::from).collect(),
        };
        self.forward("unprepare", claims.len(), |mut client| async move {
            let answer = client.node_unprepare_resources(request).await?.into_inner();
            Ok(results(answer.claims, |r| (r.error, ())))
        })
        .await
    }
}

/// Per-claim results from a response's per-claim `(error, value)`: an
/// empty error is success.
fn results<R, T>(
    claims: std::collections::HashMap<String, R>,
    split: impl Fn(R) -> (String, T),
) -> ClaimResults<T> {
    claims
        .into_iter()
        .map(|(uid, r)| {
            let (error, value) = split(r);
            let result = if error.is_empty() {
                Ok(value)
            } else {
                Err(ClaimError::Failed(error))
            };
            (uid, result)
        })
        .collect()
}

impl ClaimPreparer for Handover {
    fn prepare<'a>(
        &'a self,
        claims: &'a [ClaimRef],
    ) -> BoxFuture<'a, ClaimResults<Vec<PreparedDevice>>> {
        Box::pin(async move {
            if self.taken_over().is_none()
                && let Some(answer) = self.forward_prepare(claims).await
            {
                return answer;
            }
            self.wait_for_takeover().await.prepare(claims).await
        })
    }

    fn unprepare<'a>(&'a self, claims: &'a [ClaimRef]) -> BoxFuture<'a, ClaimResults<()>> {
        Box::pin(async move {
            if self.taken_over().is_none()
                && let Some(answer) = self.forward_unprepare(claims).await
            {
                return answer;
            }
            self.wait_for_takeover().await.unprepare(claims).await
        })
    }
}

/// A gRPC channel over the Unix socket `path`, connected now.
pub(super) async fn connect(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_owned();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}
