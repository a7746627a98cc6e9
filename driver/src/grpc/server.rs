//! Starting and stopping the two gRPC servers: the registration socket and
//! the DRA socket (DRAPlugin v1 + v1beta1, DRAResourceHealth v1alpha1 + v1).
//!
//! Start order: check both paths, create directories, take the instance
//! lock, clear stale sockets, bind the DRA socket, then the registration
//! socket last, so kubelet only learns of the plugin once it can take
//! calls. A failure part-way removes what was bound. Stop order: remove the
//! registration socket (kubelet deregisters the plugin), stop the
//! registration server, end the health streams and drain in-flight DRA calls
//! (up to the drain timeout), remove the DRA socket.
//!
//! [`Server::start`] serves with the given preparer. A rolling update with
//! per-instance sockets ([`super::instance`]) binds and registers first
//! ([`Server::bind`]), passing calls on to the instance that serves
//! ([`super::handover`]) while this one waits for the node's state, and
//! answers them itself from [`Bound::serve`] on.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dra_proto::dra::v1::dra_plugin_server::DraPluginServer as DraV1Server;
use dra_proto::dra::v1beta1::dra_plugin_server::DraPluginServer as DraV1beta1Server;
use dra_proto::health::v1::dra_resource_health_server::DraResourceHealthServer as HealthV1Server;
use dra_proto::health::v1alpha1::dra_resource_health_server::DraResourceHealthServer as HealthV1alpha1Server;
use dra_proto::registration::PluginInfo;
use dra_proto::registration::registration_server::RegistrationServer;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::dra::{DraCore, DraV1, DraV1beta1};
use super::handover::Handover;
use super::health::{self, HealthReceiver, HealthService};
use super::instance;
use super::limits::{DRA_MAX_MESSAGE, ResourceExhaustedLayer, SMALL_MAX_MESSAGE};
use super::metrics::GrpcMetrics;
use super::rebind::{self, Listening};
use super::registration::{RegistrationService, RegistrationStatus};
use super::{Error, SUPPORTED_VERSIONS};
use crate::prepare::claim::{ClaimPreparer, NotReady};
use crate::sockets::{self, SocketLock};

/// Where and as whom the plugin serves.
#[derive(Clone, Debug)]
pub struct Config {
    /// The DRA driver name (`gpu.nvidia.com`).
    pub driver_name: String,
    /// Directory kubelet's plugin watcher watches.
    pub registrar_dir: PathBuf,
    /// Directory under which `<driver>/dra.sock` is created.
    pub plugins_dir: PathBuf,
    /// How long shutdown waits for in-flight DRA calls.
    pub drain_timeout: Duration,
    /// This instance's socket tag ([`instance`]); `None`: the shared names.
    pub instance: Option<String>,
    /// How often the socket paths are checked, to bind them again when
    /// they were removed under the plugin (`grpc::rebind`).
    pub socket_check_interval: Duration,
}

impl Config {
    /// A configuration with the default drain timeout (20 s).
    pub fn new(
        driver_name: impl Into<String>,
        registrar_dir: impl Into<PathBuf>,
        plugins_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            driver_name: driver_name.into(),
            registrar_dir: registrar_dir.into(),
            plugins_dir: plugins_dir.into(),
            drain_timeout: Duration::from_secs(20),
            instance: None,
            socket_check_interval: rebind::DEFAULT_CHECK_INTERVAL,
        }
    }

    /// The same with socket tag `instance` (`None`: the shared names).
    pub fn with_instance(mut self, instance: Option<String>) -> Self {
        self.instance = instance;
        self
    }

    /// `<registrar-dir>/<driver>-reg.sock`, or `<driver>-<tag>-reg.sock`.
    pub fn registration_socket(&self) -> PathBuf {
        self.registrar_dir.join(instance::registration_socket_name(
            &self.driver_name,
            self.instance.as_deref(),
        ))
    }

    /// `<plugins-dir>/<driver>`: the DRA sockets and the serving link.
    pub fn dra_dir(&self) -> PathBuf {
        self.plugins_dir.join(&self.driver_name)
    }

    /// `<plugins-dir>/<driver>/dra.sock`, or `dra-<tag>.sock`.
    pub fn dra_socket(&self) -> PathBuf {
        self.dra_dir()
            .join(instance::dra_socket_name(self.instance.as_deref()))
    }

    /// Whether both socket paths fit into `sun_path`.
    pub fn fits(&self) -> bool {
        sockets::check_path_len(&self.dra_socket()).is_ok()
            && sockets::check_path_len(&self.registration_socket()).is_ok()
    }

    /// Removes this instance's tagged sockets and socket lock; for a
    /// process that exits without dropping its server (nothing for the
    /// shared names, which the next instance replaces).
    pub fn remove_instance_files(&self) {
        if self.instance.is_some() {
            let dra = self.dra_socket();
            sockets::remove_socket(&self.registration_socket());
            sockets::remove_socket(&dra);
            sockets::remove_socket(&sockets::lock_path(&dra));
        }
    }
}

/// What the gRPC services serve: the claim preparer, the health list, the
/// metrics and the registration verdict.
#[derive(Clone)]
pub struct Services {
    /// Prepares and unprepares claims.
    pub preparer: Arc<dyn ClaimPreparer>,
    /// The device health list the health streams send.
    pub health: HealthReceiver,
    /// Where calls are counted.
    pub metrics: GrpcMetrics,
    /// Where kubelet's registration verdict goes (the readiness probe
    /// subscribes to it before the server exists).
    pub registration: watch::Sender<RegistrationStatus>,
}

impl Default for Services {
    /// A preparer that answers that the plugin is still starting
    /// ([`NotReady`], until [`crate::plugin::Plugin`] puts the real one
    /// in), an empty health list, unregistered metrics, a registration
    /// status of its own.
    fn default() -> Self {
        let (_, health) = health::channel();
        Self {
            preparer: Arc::new(NotReady),
            health,
            metrics: GrpcMetrics::default(),
            registration: watch::channel(RegistrationStatus::Pending).0,
        }
    }
}

/// Checks that `name` can serve as a DRA driver name and as a file name:
/// a DNS subdomain of at most 63 bytes (the ResourceSlice limit).
pub fn validate_driver_name(name: &str) -> Result<(), Error> {
    let reason = if name.is_empty() {
        Some("it is empty")
    } else if name.len() > 63 {
        Some("it is longer than 63 bytes")
    } else if !super::dra::claims::is_dns_subdomain(name) {
        Some("it must be a DNS subdomain: lowercase letters, digits, '-' and '.'")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(Error::InvalidDriverName {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Entry point of the gRPC layer.
#[derive(Debug)]
pub struct Server;

impl Server {
    /// Binds both sockets and starts serving. Needs a Tokio runtime.
    pub async fn start(config: Config, services: Services) -> Result<ServerHandle, Error> {
        Ok(Self::bind_with(config, services, false).await?.serving())
    }

    /// Binds both sockets and serves them, passing prepare and unprepare
    /// on to the instance that serves the node (`grpc::handover`) until
    /// [`Bound::serve`] gives this instance's own preparer
    /// (`services.preparer` is not used). Like [`start`](Self::start),
    /// first removes the sockets of tagged instances that are gone.
    pub async fn bind(config: Config, services: Services) -> Result<Bound, Error> {
        Self::bind_with(config, services, true).await
    }

    async fn bind_with(
        config: Config,
        mut services: Services,
        handing_over: bool,
    ) -> Result<Bound, Error> {
        validate_driver_name(&config.driver_name)?;
        let config = Config {
            registrar_dir: sockets::absolute(&config.registrar_dir)?,
            plugins_dir: sockets::absolute(&config.plugins_dir)?,
            ..config
        };
        let reg_path = config.registration_socket();
        let dra_path = config.dra_socket();
        sockets::check_path_len(&dra_path)?;
        sockets::check_path_len(&reg_path)?;
        let dra_dir = config.dra_dir();
        sockets::ensure_dir(&dra_dir)?;
        sockets::ensure_dir(&config.registrar_dir)?;
        let mut lock = SocketLock::acquire(&dra_path)?;
        if config.instance.is_some() {
            lock = lock.removed_on_drop();
        }
        // With the shared names too: an instance before it may have had
        // names of its own (`--per-instance-sockets` changed, or a kubelet
        // downgrade), and kubelet retries a dead socket once a second.
        instance::clear_dead(
            &dra_dir,
            &config.registrar_dir,
            &config.driver_name,
            config.instance.as_deref(),
        )
        .await;
        sockets::clear_stale(&dra_path).await?;
        sockets::clear_stale(&reg_path).await?;

        let handover = handing_over.then(|| {
            Arc::new(Handover::new(instance::forward_targets(
                &dra_dir, &dra_path,
            )))
        });
        if let Some(h) = &handover {
            services.preparer = h.clone();
        }
        let (exited_tx, exited) = mpsc::unbounded_channel();
        let (stopping_tx, stopping_rx) = watch::channel(false);

        // DRA socket first.
        let dra_listener = sockets::bind(&dra_path)?;
        let (dra_listening, dra_listeners) = Listening::new(dra_path.clone(), dra_listener);
        let core = DraCore::new(services.preparer, services.metrics.clone());
        let health = HealthService::new(services.health, stopping_rx, services.metrics.clone());
        let dra_router = tonic::transport::Server::builder()
            .layer(ResourceExhaustedLayer)
            .add_service(
                DraV1Server::new(DraV1(core.clone()))
                    .max_decoding_message_size(DRA_MAX_MESSAGE)
                    .max_encoding_message_size(DRA_MAX_MESSAGE),
            )
            .add_service(
                DraV1beta1Server::new(DraV1beta1(core))
                    .max_decoding_message_size(DRA_MAX_MESSAGE)
                    .max_encoding_message_size(DRA_MAX_MESSAGE),
            )
            .add_service(
                HealthV1alpha1Server::new(health.clone())
                    .max_decoding_message_size(SMALL_MAX_MESSAGE)
                    .max_encoding_message_size(DRA_MAX_MESSAGE),
            )
            .add_service(
                HealthV1Server::new(health)
                    .max_decoding_message_size(SMALL_MAX_MESSAGE)
                    .max_encoding_message_size(DRA_MAX_MESSAGE),
            );
        let (dra_stop, dra_stop_rx) = oneshot::channel::<()>();
        let dra_task = spawn_server(
            "dra",
            dra_path.clone(),
            exited_tx.clone(),
            dra_router.serve_with_incoming_shutdown(rebind::incoming(dra_listeners), async {
                let _ = dra_stop_rx.await;
            }),
        );

        // Registration socket last.
        let reg_listener = match sockets::bind(&reg_path) {
            Ok(l) => l,
            Err(e) => {
                let _ = dra_stop.send(());
                dra_task.abort();
                sockets::remove_socket(&dra_path);
                return Err(e);
            }
        };
        let (reg_listening, reg_listeners) = Listening::new(reg_path.clone(), reg_listener);
        let status = services.registration.subscribe();
        let info = PluginInfo {
            r#type: dra_proto::DRA_PLUGIN_TYPE.to_owned(),
            name: config.driver_name.clone(),
            endpoint: dra_path.to_string_lossy().into_owned(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
        };
        let reg_router = tonic::transport::Server::builder()
            .layer(ResourceExhaustedLayer)
            .add_service(
                RegistrationServer::new(RegistrationService::new(
                    info,
                    services.registration,
                    services.metrics,
                ))
                .max_decoding_message_size(SMALL_MAX_MESSAGE)
                .max_encoding_message_size(SMALL_MAX_MESSAGE),
            );
        let (reg_stop, reg_stop_rx) = oneshot::channel::<()>();
        let reg_task = spawn_server(
            "registration",
            reg_path.clone(),
            exited_tx,
            reg_router.serve_with_incoming_shutdown(rebind::incoming(reg_listeners), async {
                let _ = reg_stop_rx.await;
            }),
        );
        let serving = Arc::new(AtomicBool::new(false));
        let watcher = tokio::spawn(
            rebind::Watcher {
                registration: reg_listening,
                dra: dra_listening,
                registrar_dir: config.registrar_dir.clone(),
                dra_dir: dra_dir.clone(),
                lock_id: rebind::identity(lock.path()),
                instance: config.instance.is_some(),
                serving: serving.clone(),
                interval: config.socket_check_interval,
            }
            .run(),
        );
        if handover.is_some() {
            tracing::info!(
                driver = %config.driver_name,
                registration = %reg_path.display(),
                dra = %dra_path.display(),
                "kubelet plugin sockets bound; passing calls on to the serving instance until this one takes over"
            );
        }
        Ok(Bound {
            handle: ServerHandle {
                reg_path,
                dra_path,
                dra_dir,
                drain_timeout: config.drain_timeout,
                status,
                exited,
                stopping: stopping_tx,
                reg: Some((reg_stop, reg_task)),
                dra: Some((dra_stop, dra_task)),
                watcher: Some(watcher),
                serving,
                _lock: lock,
            },
            handover,
        })
    }
}

/// Bound and served sockets of an instance that passes calls on to the
/// instance serving the node until [`serve`](Self::serve). Dropping it
/// stops the servers and removes the sockets.
pub struct Bound {
    handle: ServerHandle,
    /// `None` from [`Server::start`]: its own preparer serves from the
    /// start.
    handover: Option<Arc<Handover>>,
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound")
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl Bound {
    /// The server as far as it runs (sockets, registration status).
    pub fn handle(&self) -> &ServerHandle {
        &self.handle
    }

    /// Calls of kubelet's that the serving instance answered so far.
    pub fn forwarded(&self) -> u64 {
        self.handover.as_ref().map_or(0, |h| h.forwarded())
    }

    /// From now on `preparer` answers every call, those waiting for the
    /// take-over included, and the serving link names this instance.
    pub fn serve(self, preparer: Arc<dyn ClaimPreparer>) -> ServerHandle {
        if let Some(handover) = &self.handover {
            handover.take_over(preparer);
        }
        self.serving()
    }

    /// Points the serving link at this instance and says it serves.
    fn serving(self) -> ServerHandle {
        let forwarded = self.handover.as_ref().map(|h| h.forwarded());
        let handle = self.handle;
        handle.serving.store(true, Ordering::Release);
        if let Err(e) = instance::point_serving_link(&handle.dra_dir, &handle.dra_path) {
            tracing::warn!(dir = %handle.dra_dir.display(), error = %e, "cannot point the serving link at this instance; a successor passes its calls to dra.sock");
        }
        tracing::info!(
            registration = %handle.reg_path.display(),
            dra = %handle.dra_path.display(),
            forwarded,
            "serving kubelet plugin sockets"
        );
        handle
    }
}

type ServeResult = Result<(), tonic::transport::Error>;

fn spawn_server(
    name: &'static str,
    path: PathBuf,
    exited: mpsc::UnboundedSender<Exited>,
    serve: impl Future<Output = ServeResult> + Send + 'static,
) -> JoinHandle<ServeResult> {
    tokio::spawn(async move {
        let r = serve.await;
        let message = r.as_ref().err().map(|e| flatten_error(e));
        let _ = exited.send((name, path, message));
        r
    })
}

/// An error and its sources on one line.
fn flatten_error(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        s.push_str(": ");
        s.push_str(&src.to_string());
        cur = src.source();
    }
    s.replace('\n', " ")
}

type Running = (oneshot::Sender<()>, JoinHandle<ServeResult>);

/// The running servers. Dropping it stops them without draining and removes
/// both socket files; call [`shutdown`](Self::shutdown) for the orderly way.
#[derive(Debug)]
pub struct ServerHandle {
    reg_path: PathBuf,
    dra_path: PathBuf,
    dra_dir: PathBuf,
    drain_timeout: Duration,
    status: watch::Receiver<RegistrationStatus>,
    exited: mpsc::UnboundedReceiver<Exited>,
    stopping: watch::Sender<bool>,
    reg: Option<Running>,
    dra: Option<Running>,
    /// Binds the sockets again when they are removed under the server.
    watcher: Option<JoinHandle<()>>,
    /// Whether this instance serves (the serving link names it).
    serving: Arc<AtomicBool>,
    _lock: SocketLock,
}

/// A server that stopped: its name, socket, and error message if any.
type Exited = (&'static str, PathBuf, Option<String>);

impl ServerHandle {
    /// The registration socket (absolute).
    pub fn registration_socket(&self) -> &Path {
        &self.reg_path
    }

    /// The DRA socket (absolute), as advertised to kubelet.
    pub fn dra_socket(&self) -> &Path {
        &self.dra_path
    }

    /// Kubelet's registration verdict, updated on every
    /// `NotifyRegistrationStatus`.
    pub fn registration_status(&self) -> watch::Receiver<RegistrationStatus> {
        self.status.clone()
    }

    /// Resolves when a server stops on its own (which it should never do);
    /// pending forever otherwise. For `select!` next to the signal handlers.
    pub async fn stopped(&mut self) -> Error {
        match self.exited.recv().await {
            Some((_, path, Some(message))) => Error::Serve { path, message },
            Some((_, path, None)) => Error::Stopped { path },
            None => std::future::pending().await,
        }
    }

    /// Deregisters, drains and stops: removes the registration socket,
    /// stops the registration server, ends the health streams, waits for
    /// in-flight DRA calls (up to the drain timeout), removes the DRA socket.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        if let Some(watcher) = self.watcher.take() {
            watcher.abort();
        }
        tracing::info!(socket = %self.reg_path.display(), "removing the registration socket; kubelet deregisters the plugin");
        sockets::remove_socket(&self.reg_path);
        let mut first_error = None;
        if let Some(running) = self.reg.take()
            && let Err(e) = stop(running, &self.reg_path, self.drain_timeout).await
        {
            first_error.get_or_insert(e);
        }
        self.stopping.send_replace(true);
        instance::remove_serving_link(&self.dra_dir, &self.dra_path);
        if let Some(running) = self.dra.take() {
            tracing::info!(socket = %self.dra_path.display(), "draining in-flight DRA calls");
            if let Err(e) = stop(running, &self.dra_path, self.drain_timeout).await {
                first_error.get_or_insert(e);
            }
        }
        sockets::remove_socket(&self.dra_path);
        tracing::info!("kubelet plugin sockets closed");
        first_error.map_or(Ok(()), Err)
    }
}

async fn stop((stop, mut task): Running, path: &Path, timeout: Duration) -> Result<(), Error> {
    let _ = stop.send(());
    match tokio::time::timeout(timeout, &mut task).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(Error::Serve {
            path: path.to_owned(),
            message: flatten_error(&e),
        }),
        Ok(Err(join)) => Err(Error::Serve {
            path: path.to_owned(),
            message: join.to_string(),
        }),
        Err(_) => {
            task.abort();
            tracing::warn!(socket = %path.display(), ?timeout, "drain timed out; cutting off in-flight calls");
            Err(Error::DrainTimeout {
                path: path.to_owned(),
                timeout,
            })
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if let Some(watcher) = self.watcher.take() {
            watcher.abort();
        }
        if self.reg.is_none() && self.dra.is_none() {
            return;
        }
        self.stopping.send_replace(true);
        instance::remove_serving_link(&self.dra_dir, &self.dra_path);
        for (stop, task) in [self.reg.take(), self.dra.take()].into_iter().flatten() {
            let _ = stop.send(());
            task.abort();
        }
        sockets::remove_socket(&self.reg_path);
        sockets::remove_socket(&self.dra_path);
    }
}

#[cfg(test)]
mod tests;
