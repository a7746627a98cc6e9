//! The test API server (the stand-in): a small HTTP server speaking the subset of the Kubernetes
//! REST API the driver's programs (the plugin, the controller, the demo, the bench) use, faithful
//! enough that the kube client cannot tell it from a real one, and no larger: what nothing of the
//! driver sends is not served. The real cluster's tests (`gpu-dra-e2e`,
//! `tests/real_cluster/apiserver.rs`) check it against the real kube-apiserver.
//!
//! Served: `resource.k8s.io/v1` ResourceSlices, ResourceClaims (with the `status` subresource),
//! DeviceClasses, core `v1` Nodes, `events.k8s.io/v1` Events (what kube-runtime's event recorder
//! writes) and `coordination.k8s.io/v1` Leases (leader election); verbs create, get, list (field
//! and label selectors, `limit`/`continue` paging), watch (resourceVersion resumption, bookmarks,
//! `sendInitialEvents`, `timeoutSeconds`), update, patch (JSON merge and server-side apply),
//! delete (preconditions) and deletecollection; `/version` (no discovery documents). Every write
//! can be made to fail or hang ([`TestApiServer::faults`], [`WriteFault`]).
//! Errors are `metav1.Status` bodies with the real server's reasons and codes; ResourceSlices are
//! validated with the 1.34 or 1.35+ rules ([`ValidationRules`]).
//!
//! Bodies are decoded as the real server decodes them into its Go types: fields the type does
//! not declare are dropped with a `Warning` header (refused with `fieldValidation=Strict`, and
//! failing a server-side apply), `null`s and empty lists and maps disappear, struct values (a
//! claim's `status`) are always there.
//!
//! Not modelled (documented simplifications): authentication and authorization, admission,
//! finalizers and graceful deletion, namespace existence, CEL compilation, duplicate JSON fields
//! (the last one wins, without a warning), defaulting beyond ResourceClaim requests, protobuf,
//! lists at an old resourceVersion (lists always reflect the current state), strategic merge
//! and JSON patches (`415 UnsupportedMediaType`: nothing of the driver sends them), and every
//! resource but the six above.
//!
//! ```no_run
//! # async fn demo() -> Result<(), gpu_dra_sim::apiserver::Error> {
//! use gpu_dra_sim::apiserver::{ServerOptions, TestApiServer};
//! let server = TestApiServer::start(ServerOptions::default()).await?;
//! server.write_kubeconfig(std::path::Path::new("/tmp/kubeconfig"))?;
//! println!("serving at {}", server.url());
//! server.shutdown().await?;
//! # Ok(()) }
//! ```

mod faults;
mod fields;
mod http;
mod meta;
mod patch;
mod resources;
mod routes;
mod schema;
mod selectors;
mod status;
mod store;
mod validation;
mod watch;

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use faults::{Faults, WriteFault};
pub use patch::PatchBody;
pub use resources::Resource;
pub use selectors::{FieldSelector, LabelSelector, Selectors};
pub use status::{ApiError, StatusCause, StatusDetails};
pub use store::{
    DeleteOptions, EventType, ListPage, ObjectKey, Store, StoreEvent, WatchFrom, WatchStart,
    WriteOptions,
};
pub use validation::ValidationRules;

/// Errors starting, running or stopping the test API server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listen address could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: io::Error,
    },
    /// The HTTP server stopped with an I/O error.
    #[error("serving HTTP: {0}")]
    Serve(#[source] io::Error),
    /// The server task panicked or was cancelled.
    #[error("server task failed: {0}")]
    Task(String),
    /// The kubeconfig file could not be written.
    #[error("writing kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
}

/// Settings of a test API server.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Address to listen on; port 0 picks a free port. Default `127.0.0.1:0`.
    pub addr: SocketAddr,
    /// ResourceSlice validation rules. Default 1.35+.
    pub rules: ValidationRules,
    /// Interval of watch `BOOKMARK` events when the client allows them. Default 5 s (the real
    /// server sends them about once a minute).
    pub bookmark_interval: Duration,
    /// Largest accepted request body. Default 3 MiB, the real server's limit.
    pub max_body_bytes: usize,
    /// How many past events are kept for watches that resume from a resourceVersion; older
    /// ones get `410 Expired`. Default 1024 (the real watch cache keeps a few hundred per
    /// resource).
    pub history_limit: usize,
    /// Events buffered per watcher before it is cut off with `410 Expired`. Default 1024.
    pub watcher_buffer: usize,
    /// Longest watch; `timeoutSeconds` is capped to this and it is the default. Default 30 min.
    pub max_watch_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            rules: ValidationRules::default(),
            bookmark_interval: Duration::from_secs(5),
            max_body_bytes: 3 * 1024 * 1024,
            history_limit: 1024,
            watcher_buffer: 1024,
            max_watch_timeout: Duration::from_secs(30 * 60),
        }
    }
}

/// A running test API server. Dropping it stops the server (without waiting); use
/// [`TestApiServer::shutdown`] to stop it and wait.
#[derive(Debug)]
pub struct TestApiServer {
    addr: SocketAddr,
    store: Arc<Store>,
    faults: Arc<Faults>,
    shutdown: tokio::sync::watch::Sender<bool>,
    task: Option<JoinHandle<io::Result<()>>>,
}

impl TestApiServer {
    /// Binds `opts.addr` and starts serving in the background.
    pub async fn start(opts: ServerOptions) -> Result<Self, Error> {
        let listener = TcpListener::bind(opts.addr)
            .await
            .map_err(|source| Error::Bind {
                addr: opts.addr,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: opts.addr,
            source,
        })?;
        let store = Arc::new(Store::new(
            opts.rules,
            opts.history_limit,
            opts.watcher_buffer,
        ));
        let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
        let faults = Arc::new(Faults::default());
        let app = routes::router(Arc::new(http::AppState {
            store: store.clone(),
            faults: faults.clone(),
            opts,
            shutdown: shutdown_rx.clone(),
        }));
        let mut signal = shutdown_rx;
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = signal.wait_for(|stop| *stop).await;
                })
                .await
        });
        tracing::info!(%addr, "test API server listening");
        Ok(Self {
            addr,
            store,
            faults,
            shutdown,
            task: Some(task),
        })
    }

    /// The socket address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The object store, for direct in-process access (seeding objects, inspecting state,
    /// waiting for changes). Writes through it are validated and produce watch events exactly
    /// like writes over HTTP.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The fault knob: what write requests get ([`WriteFault`]), for tests of clients facing
    /// a sick API server.
    pub fn faults(&self) -> &Arc<Faults> {
        &self.faults
    }

    /// A kubeconfig (YAML) pointing at this server, with namespace `default` and no
    /// credentials.
    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig_yaml(&self.url())
    }

    /// Writes [`Self::kubeconfig_yaml`] to `path` (atomically: a temporary file, then rename).
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), Error> {
        let tmp = path.with_extension("tmp");
        let err = |source| Error::Kubeconfig {
            path: path.to_owned(),
            source,
        };
        std::fs::write(&tmp, self.kubeconfig_yaml()).map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)
    }

    /// Stops accepting connections, ends open watches, and waits for in-flight requests.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        let _ = self.shutdown.send(true);
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        match task.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Error::Serve(e)),
            Err(e) => Err(Error::Task(e.to_string())),
        }
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// A kubeconfig (YAML) for a server at `url`.
pub fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: test-apiserver\n  cluster:\n    server: {url}\n\
         contexts:\n\
         - name: test-apiserver\n  context:\n    cluster: test-apiserver\n    user: test-user\n    namespace: default\n\
         current-context: test-apiserver\n\
         users:\n\
         - name: test-user\n  user: {{}}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_is_valid_yaml_with_the_url() {
        let yaml = kubeconfig_yaml("http://127.0.0.1:1234");
        let value: serde_json::Value = yaml_serde::from_str(&yaml).unwrap();
        assert_eq!(
            value["clusters"][0]["cluster"]["server"],
            "http://127.0.0.1:1234"
        );
        assert_eq!(value["current-context"], "test-apiserver");
        assert_eq!(value["contexts"][0]["context"]["user"], "test-user");
        assert!(value["users"][0]["user"].as_object().unwrap().is_empty());
    }

    #[tokio::test]
    async fn start_write_kubeconfig_and_shutdown() {
        let server = TestApiServer::start(ServerOptions::default())
            .await
            .unwrap();
        assert!(server.url().starts_with("http://127.0.0.1:"));
        assert_ne!(server.addr().port(), 0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        server.write_kubeconfig(&path).unwrap();
        let written = std::fs::read_to_string(&path).unwrap();
        assert!(written.contains(&server.url()));
        let missing = dir.path().join("no/such/dir/kubeconfig");
        assert!(matches!(
            server.write_kubeconfig(&missing),
            Err(Error::Kubeconfig { .. })
        ));
        server.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn bind_errors_are_reported() {
        let first = TestApiServer::start(ServerOptions::default())
            .await
            .unwrap();
        let opts = ServerOptions {
            addr: first.addr(),
            ..ServerOptions::default()
        };
        let err = TestApiServer::start(opts).await.unwrap_err();
        assert!(matches!(err, Error::Bind { .. }), "{err}");
    }
}
