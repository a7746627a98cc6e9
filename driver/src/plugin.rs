//! The whole kubelet plugin as one library call, so that the binary, the
//! demo and the tests run the very same orchestration.
//!
//! [`Plugin::start`] takes a kube client built by [`kube_client`]
//! (`--kubeconfig`, else the default kubeconfig or the in-cluster
//! configuration; the binary builds it first, since [`choose_instance`]
//! reads the Node with it), loads NVML (`--nvml-lib`, else the driver
//! root's library, else the system one), discovers the GPUs, starts the
//! gRPC servers, and then the ResourceSlice publisher with the inventory. The
//! publisher starts only once the sockets are bound: the preparer's start
//! takes the instance lock first, so a second instance on the same node
//! fails before it touches the pool, or, in a rolling update
//! (`--rolling-update`), waits there for the first to exit and binds the
//! same socket paths after it, or, with per-instance sockets, binds its
//! own before and passes kubelet's calls on meanwhile (see [`crate::phase`]
//! and [`crate::grpc::instance`]).
//! The publisher runs in the background and retries API
//! errors with backoff, so an unreachable API server never holds up
//! serving kubelet or shutting down.
//!
//! [`PluginHandle::shutdown`] keeps kubelet's order: remove the
//! registration socket (kubelet deregisters the plugin), drain in-flight
//! gRPC calls, then stop the publisher, which deletes the node's slices only
//! with `--delete-slices-on-exit` (see [`crate::slices`] for the policy).
//!
//! [`Plugin::start_with`] takes the NVML backend ready made too, for
//! callers that run the plugin in-process against their own
//! backend and API server.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use gpu_nvml::{GpuBackend, HealthSource};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::devices::BuildOptions;
use crate::discovery::{self, Inventory};
use crate::flags::{Flags, PerInstanceSockets};
use crate::grpc::{self, ServerHandle};
use crate::health::metrics::HealthMetrics;
use crate::health::monitor::{self as health_monitor, MonitorHandle, TaintMap};
use crate::micros;
use crate::phase::Phase;
use crate::prepare::cdi::{HostRoot, SpecDir};
use crate::prepare::{self, Preparer};
use crate::slices::{PublishError, PublishStatus, Publisher, PublisherOptions};

/// Errors starting or stopping the plugin.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// NVML could not be loaded or initialised, or a node-wide NVML query
    /// failed during discovery (the message names the library).
    #[error(transparent)]
    Discovery(#[from] discovery::Error),
    /// The kubeconfig named by `--kubeconfig` cannot be read or used.
    #[error("cannot use kubeconfig {path}: {reason}")]
    Kubeconfig {
        /// The file given.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// No `--kubeconfig`, no default kubeconfig, and not running in a
    /// cluster.
    #[error(
        "no Kubernetes API configuration: pass --kubeconfig (or KUBECONFIG), or run in a cluster ({0})"
    )]
    NoKubeConfig(String),
    /// The kube client could not be built from a configuration.
    #[error("cannot create the Kubernetes client: {0}")]
    Client(String),
    /// The plugin's Node could not be read.
    #[error("cannot read Node {name}: {reason}")]
    Node {
        /// The node name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The kubelet-facing gRPC servers failed to start or to stop.
    #[error(transparent)]
    Grpc(#[from] grpc::Error),
    /// The GPU health monitor could not start.
    #[error(transparent)]
    Health(#[from] health_monitor::Error),
    /// The publisher failed on exit (deleting the slices with
    /// `--delete-slices-on-exit`).
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The claim preparer could not start (checkpoint unreadable, bad
    /// CDI vendor).
    #[error(transparent)]
    Prepare(#[from] prepare::Error),
    /// The CDI settings are unusable.
    #[error("invalid CDI settings: {0}")]
    Cdi(#[from] crate::prepare::cdi::CdiError),
    /// The publisher task panicked.
    #[error("the ResourceSlice publisher failed: {0}")]
    PublisherTask(String),
}

/// What the plugin serves and where it counts: the gRPC services and the
/// GPU health monitor's metrics (the monitor feeds the services' health
/// list; see [`crate::health`]).
#[derive(Clone, Default)]
pub struct Services {
    /// The gRPC services (claim preparer, health list, call metrics).
    pub grpc: grpc::Services,
    /// The GPU health monitor's metrics.
    pub health_metrics: HealthMetrics,
}

/// What [`Plugin::start_with`] needs besides the flags.
pub struct Parts {
    /// The GPUs.
    pub backend: Arc<dyn GpuBackend>,
    /// The API server.
    pub client: kube::Client,
    /// The gRPC services and the health monitor's metrics.
    pub services: Services,
    /// Timing of the slice publisher.
    pub publisher: PublisherOptions,
    /// Where the start reports its phase (for the probes).
    pub phase: watch::Sender<Phase>,
    /// Where the health monitor gets its events and polls (the NVML
    /// backend); `None`: no monitor, whatever `--health` says.
    pub health: Option<Arc<dyn HealthSource>>,
}

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts")
            .field("publisher", &self.publisher)
            .finish_non_exhaustive()
    }
}

/// Entry point of the whole plugin.
#[derive(Debug)]
pub struct Plugin;

impl Plugin {
    /// Starts the plugin from its flags and a kube client made by
    /// [`kube_client`]: NVML from `--nvml-lib` (else the driver root's
    /// library, else the system one). Needs a Tokio runtime.
    pub async fn start(
        flags: &Flags,
        client: kube::Client,
        services: Services,
        phase: watch::Sender<Phase>,
    ) -> Result<PluginHandle, Error> {
        let started = Instant::now();
        // Loading and initialising NVML can take seconds: off the runtime
        // thread (the binary runs a current-thread runtime).
        let mut discovery_flags = flags.discovery.clone();
        if discovery_flags.nvml_lib.is_none() {
            discovery_flags.nvml_lib = nvml_in_driver_root(&flags.container_driver_root());
        }
        let nvml = tokio::task::spawn_blocking(move || {
            gpu_nvml::NvmlBackend::open(discovery_flags.nvml_lib.as_deref()).map(Arc::new)
        })
        .await
        .map_err(|e| discovery::Error::Task(e.to_string()))?
        .map_err(discovery::Error::from)?;
        tracing::info!(elapsed_us = micros(started), "NVML loaded");
        let backend: Arc<dyn GpuBackend> = nvml.clone();
        let health: Arc<dyn HealthSource> = nvml;
        Self::start_with(
            flags,
            Parts {
                backend,
                client,
                services,
                publisher: PublisherOptions::default(),
                phase,
                health: Some(health),
            },
        )
        .await
    }

    /// Starts the plugin with a ready backend and client: discovers the
    /// GPUs, binds the kubelet sockets, then starts publishing the pool.
    pub async fn start_with(flags: &Flags, parts: Parts) -> Result<PluginHandle, Error> {
        let started = Instant::now();
        tracing::info!(
            node = %flags.node_name,
            driver = %flags.driver_name,
            runtime_workers = tokio::runtime::Handle::current().metrics().num_workers(),
            "starting"
        );
        let inventory =
            discovery::discover(parts.backend.clone(), &flags.discovery.sysfs_root).await?;
        tracing::info!(
            elapsed_us = micros(started),
            gpus = inventory.gpus.len(),
            "GPU inventory ready"
        );
        // --passthrough: the VFIO facts of the GPUs, read once, for the
        // publisher's and the preparer's device model.
        let passthrough = if flags.passthrough {
            let (sysfs, dev, inv) = (
                flags.discovery.sysfs_root.clone(),
                flags.dev_root.clone(),
                inventory.clone(),
            );
            let facts = tokio::task::spawn_blocking(move || {
                crate::vfio::Passthrough::read(&sysfs, &dev, &inv)
            })
            .await
            .map_err(|e| discovery::Error::Task(e.to_string()))?;
            tracing::info!(
                gpus = facts.pci_ids.len(),
                iommu_fd = facts.iommu_fd,
                "VFIO passthrough on"
            );
            Some(facts)
        } else {
            None
        };
        if flags.gpu_clique_label {
            let (client, node, inventory) = (
                parts.client.clone(),
                flags.node_name.clone(),
                inventory.clone(),
            );
            tokio::spawn(async move {
                crate::clique::label_node(client, node, &inventory).await;
            });
        }

        // A CDI root that takes no files fails every claim: refuse to start
        // rather than publish devices no pod could get (docs/troubleshooting.md).
        preparer_options(flags)?.cdi.check_writable()?;
        let config = grpc_config(flags);
        // The health list the streams send comes from the monitor, when it runs.
        let health_metrics = parts.services.health_metrics;
        let mut services = parts.services.grpc;
        let health = match (&parts.health, flags.health.enabled()) {
            (Some(source), true) => {
                let (tx, rx) = grpc::health::channel();
                services.health = rx;
                Some((source.clone(), tx))
            }
            (None, true) => {
                tracing::warn!("no health source: the GPU health monitor does not run");
                None
            }
            (_, false) => None,
        };
        // Refuse unusable socket paths before anything is created.
        crate::sockets::check_path_len(&config.dra_socket())?;
        crate::sockets::check_path_len(&config.registration_socket())?;
        // With sockets of its own, a rolling update's new instance
        // registers now and passes kubelet's calls on to the old one while
        // it waits below.
        let bound = match config.instance {
            Some(_) => Some(grpc::Server::bind(config.clone(), services.clone()).await?),
            None => None,
        };
        // The preparer recovers from a crash (checkpoint, MIG, MPS, CDI)
        // before kubelet's calls reach it. In a rolling update it first
        // waits for the old instance to exit: everything above has
        // succeeded by then, so a new version that cannot start fails
        // while the old one still serves.
        let mut options = preparer_options(flags)?;
        options.build.passthrough.clone_from(&passthrough);
        // The monitor's device model is the one published and prepared
        // (with the VFIO siblings), so a GPU fault taints all of them.
        let monitor_build = options.build.clone();
        if flags.rolling_update {
            options.wait_for_lock = Some(parts.phase.clone());
        }
        let (preparer, _recovered) = Preparer::start(
            options,
            parts.client.clone(),
            parts.backend.clone(),
            &inventory,
        )
        .await?;
        tracing::info!(elapsed_us = micros(started), "claim preparer ready");
        // NVIDIA's prepared-device gauge counts the claims a restart finds
        // prepared, as NVIDIA's plugin reads them from its checkpoint.
        for (uid, entry) in preparer.checkpoint().claims {
            if entry.state == prepare::checkpoint::ClaimState::PrepareCompleted {
                let devices = entry.devices.iter().map(|d| d.device.as_str());
                services.metrics.nvidia().prepared(&uid.0, devices);
            }
        }
        services.preparer = Arc::new(preparer.clone());

        // The health monitor's first poll runs before kubelet's calls are
        // served, and its taints are in the first publication.
        let (inventory_tx, inventory_rx) = watch::channel(inventory);
        let (taints_tx, taints_rx) = watch::channel(TaintMap::new());
        let monitor = match health {
            Some((source, health_tx)) => Some(
                start_monitor(
                    flags,
                    monitor_build,
                    source,
                    &parts.backend,
                    health_monitor::Outputs {
                        taints: taints_tx,
                        health: health_tx,
                        inventory: inventory_tx.clone(),
                        metrics: health_metrics.clone(),
                        events: Some(crate::health::events::NodeEvents::new(
                            parts.client.clone(),
                            &flags.node_name,
                            &flags.driver_name,
                        )),
                    },
                )
                .await?,
            ),
            None => None,
        };

        let server = match bound {
            Some(bound) => bound.serve(services.preparer),
            None => grpc::Server::start(config, services).await?,
        };
        parts.phase.send_replace(Phase::Serving);

        let mut slice_flags = flags.slices.clone();
        slice_flags.passthrough = passthrough;
        let publisher = Publisher::new(
            parts.client,
            flags.node_name.clone(),
            flags.driver_name.clone(),
            slice_flags,
        )
        .with_options(parts.publisher);
        let publisher = match monitor {
            Some(_) => publisher.with_taints(taints_rx),
            None => publisher,
        };
        let status = publisher.status();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(publisher.run(inventory_rx, async move {
            let _ = stopped.await;
        }));
        tokio::spawn(log_first_publication(status.clone(), started));
        if monitor.is_some() {
            tokio::spawn(count_publish_failures(status.clone(), health_metrics));
        }

        Ok(PluginHandle {
            server,
            publisher: PublisherTask {
                stop: Some(stop),
                task: Some(task),
            },
            publish_status: status,
            inventory: inventory_tx,
            backend: parts.backend,
            preparer,
            monitor,
        })
    }
}

/// Starts the GPU health monitor from the flags: checkpoint in the state
/// directory, boot id under `--proc-root`, the device model of `build`
/// (the preparer's, `--passthrough`'s VFIO devices included).
async fn start_monitor(
    flags: &Flags,
    build: BuildOptions,
    source: Arc<dyn HealthSource>,
    backend: &Arc<dyn GpuBackend>,
    outputs: health_monitor::Outputs,
) -> Result<MonitorHandle, Error> {
    let inventory = outputs.inventory.borrow().clone();
    let proc_root = flags.proc_root.clone();
    let boot_id = tokio::task::spawn_blocking(move || health_monitor::boot_id(&proc_root))
        .await
        .unwrap_or_default();
    let mut setup = health_monitor::Setup::new(
        source,
        backend.clone(),
        inventory,
        build,
        flags.health.policy(),
        flags.health.poll_interval,
        flags.state_dir().join(crate::health::CHECKPOINT_FILE),
        boot_id,
        flags.node_name.clone(),
    );
    // --passthrough rebinds GPUs to vfio-pci: the monitor reads who holds
    // each GPU so that a VM's GPU is not probed (nor reported lost).
    setup.sysfs_root = flags
        .passthrough
        .then(|| flags.discovery.sysfs_root.clone());
    Ok(health_monitor::start(setup, outputs).await?)
}

/// Counts the publisher's failed reconciles in the health metrics.
async fn count_publish_failures(
    mut status: watch::Receiver<PublishStatus>,
    metrics: crate::health::metrics::HealthMetrics,
) {
    let mut counted = status.borrow_and_update().failures;
    while status.changed().await.is_ok() {
        let failures = status.borrow_and_update().failures;
        if failures > counted {
            metrics.publish_failures(failures - counted);
            counted = failures;
        }
    }
}

/// Where and as whom the gRPC servers serve, from the flags.
pub fn grpc_config(flags: &Flags) -> grpc::Config {
    grpc::Config::new(
        flags.driver_name.clone(),
        flags.kubelet_registrar_dir.clone(),
        flags.kubelet_plugins_dir.clone(),
    )
    .with_instance(flags.instance.clone())
}

/// The oldest kubelet that keeps several plugins of one driver registered
/// and calls the newest (Kubernetes 1.33).
pub const PER_INSTANCE_KUBELET: (u32, u32) = (1, 33);

/// The socket tag this instance is to use ([`Flags::instance`]): a new
/// one with `--rolling-update` and `--per-instance-sockets=always`, or
/// `auto` on a node whose kubelet is 1.33 or newer; `None` (the shared
/// names) otherwise, when the Node cannot be read, and when the tagged
/// socket paths would be too long (a driver name over 55 bytes under the
/// default directories). One GET of the Node with `auto`, nothing else.
pub async fn choose_instance(flags: &Flags, client: &kube::Client) -> Option<String> {
    if !flags.rolling_update {
        if flags.per_instance_sockets == PerInstanceSockets::Always {
            tracing::warn!(
                "--per-instance-sockets=always has no effect without --rolling-update; using the shared socket names"
            );
        }
        return None;
    }
    let wanted = match flags.per_instance_sockets {
        PerInstanceSockets::Never => false,
        PerInstanceSockets::Always => true,
        PerInstanceSockets::Auto => match kubelet_version(flags, client).await {
            Ok(Some((text, version))) => {
                let new_enough = version >= PER_INSTANCE_KUBELET;
                tracing::info!(
                    kubelet = %text,
                    per_instance_sockets = new_enough,
                    "the node's kubelet version decides the socket names"
                );
                new_enough
            }
            Ok(None) => {
                tracing::warn!(
                    node = %flags.node_name,
                    "the Node reports no kubelet version this plugin can read; using the shared socket names"
                );
                false
            }
            Err(e) => {
                tracing::warn!(node = %flags.node_name, error = %e, "cannot read the Node's kubelet version; using the shared socket names");
                false
            }
        },
    };
    if !wanted {
        return None;
    }
    let tag = grpc::instance::new_tag();
    let config = grpc_config(flags).with_instance(Some(tag.clone()));
    if !config.fits() {
        tracing::warn!(
            registration = %config.registration_socket().display(),
            "per-instance socket paths do not fit into a Unix socket address; using the shared names"
        );
        return None;
    }
    Some(tag)
}

/// The Node's `status.nodeInfo.kubeletVersion`, as given and as
/// (major, minor); `None` when it is missing or unreadable.
async fn kubelet_version(
    flags: &Flags,
    client: &kube::Client,
) -> Result<Option<(String, (u32, u32))>, Error> {
    const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
    let get = crate::slices::wire::node_kubelet_version(client, &flags.node_name);
    let node_error = |reason| Error::Node {
        name: flags.node_name.clone(),
        reason,
    };
    let text = tokio::time::timeout(TIMEOUT, get)
        .await
        .map_err(|_| node_error(format!("no answer in {TIMEOUT:?}")))?
        .map_err(|e| node_error(error_chain(&e)))?;
    Ok(parse_kubelet_version(&text).map(|v| (text, v)))
}

/// `v1.33.2`, `v1.34.0-eks-1a2b3c`, `1.35.1+k3s1`: (1, 33), (1, 34),
/// (1, 35); `None` for anything without a numeric major and minor.
pub fn parse_kubelet_version(text: &str) -> Option<(u32, u32)> {
    let text = text.trim();
    let text = text.strip_prefix('v').unwrap_or(text);
    let mut parts = text.splitn(3, '.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// The preparer's settings from the flags. The CDI vendor is `k8s.` + the
/// driver name (NVIDIA's `k8s.gpu.nvidia.com`), the class `claim`.
pub fn preparer_options(flags: &Flags) -> Result<prepare::Options, Error> {
    Ok(prepare::Options {
        driver_name: flags.driver_name.clone(),
        node_name: flags.node_name.clone(),
        cdi: SpecDir::new(
            flags.cdi_root.clone(),
            &format!("k8s.{}", flags.driver_name),
            crate::prepare::cdi::CLAIM_CLASS,
        )?,
        driver_root: HostRoot::new(flags.container_driver_root(), flags.driver_root.clone()),
        dev_root: HostRoot::same(flags.dev_root.clone()),
        proc_root: flags.proc_root.clone(),
        state_dir: HostRoot::same(flags.state_dir()),
        mps_dir: HostRoot::same(flags.mps_dir()),
        build: BuildOptions {
            dynamic_mig: flags.slices.dynamic_mig,
            memory_sharing: flags.slices.memory_sharing.clone(),
            consumable_shares: flags.slices.consumable_shares,
            ..BuildOptions::default()
        },
        mps_launcher: flags.mps_launcher.clone(),
        mps_host: flags.mps_host_socket.clone(),
        cdi_hook: flags.nvidia_cdi_hook_path.clone(),
        wait_for_lock: None,
        mps_check_interval: flags.mps_check_interval,
        sysfs_root: flags.discovery.sysfs_root.clone(),
        device_metadata: flags.device_metadata.then(|| {
            HostRoot::same(
                flags
                    .kubelet_plugins_dir
                    .join(&flags.driver_name)
                    .join(crate::prepare::metadata::paths::SUBDIR),
            )
        }),
    })
}

/// Without `--nvml-lib`: `libnvidia-ml.so.1` in the library directories of
/// a driver root other than `/` (a plugin in a container sees the host's
/// driver there, not on its own library path; `LD_LIBRARY_PATH` would drag
/// in the host's other libraries too). `None`: the system library.
pub fn nvml_in_driver_root(root: &Path) -> Option<PathBuf> {
    if root == Path::new("/") {
        return None;
    }
    crate::prepare::cdi::driver_root::LIB_DIRS
        .iter()
        .map(|dir| root.join(dir).join("libnvidia-ml.so.1"))
        .find(|p| p.exists())
}

/// Logs, once, how long the first complete publication took.
async fn log_first_publication(mut status: watch::Receiver<PublishStatus>, started: Instant) {
    if let Ok(s) = status.wait_for(|s| s.in_sync).await {
        tracing::info!(
            elapsed_us = micros(started),
            generation = s.generation,
            slices = s.slices,
            devices = s.devices,
            "ResourceSlice pool in sync"
        );
    }
}

/// The kube client: from the kubeconfig file when given, else inferred
/// (`KUBECONFIG`, `~/.kube/config`, then the in-cluster service account).
/// Building it does not contact the API server.
pub async fn kube_client(kubeconfig: Option<&Path>) -> Result<kube::Client, Error> {
    let config = match kubeconfig {
        Some(path) => {
            let bad = |e: &dyn std::error::Error| Error::Kubeconfig {
                path: path.to_owned(),
                reason: error_chain(e),
            };
            let file = Kubeconfig::read_from(path).map_err(|e| bad(&e))?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| bad(&e))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| Error::NoKubeConfig(error_chain(&e)))?,
    };
    kube::Client::try_from(config).map_err(|e| Error::Client(error_chain(&e)))
}

/// An error and its sources on one line: the first line of each message
/// (YAML errors add a multi-line source excerpt), skipping a source whose
/// text the message so far already contains.
fn error_chain(e: &dyn std::error::Error) -> String {
    let first_line = |e: &dyn std::error::Error| {
        e.to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    let mut s = first_line(e);
    let mut cur = e.source();
    while let Some(src) = cur {
        let text = first_line(src);
        if !text.is_empty() && !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = src.source();
    }
    s
}

/// The publisher's task and its stop signal; dropping it aborts the task
/// (no deletion on exit: that is for the orderly shutdown only).
struct PublisherTask {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), PublishError>>>,
}

impl PublisherTask {
    /// Signals the publisher to stop and waits for it.
    async fn stop(mut self) -> Result<(), Error> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => match task.await {
                Ok(r) => r.map_err(Error::Publish),
                Err(e) => Err(Error::PublisherTask(e.to_string())),
            },
            None => Ok(()),
        }
    }
}

impl Drop for PublisherTask {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The running plugin. Dropping it stops everything without the orderly
/// shutdown; call [`shutdown`](Self::shutdown).
pub struct PluginHandle {
    server: ServerHandle,
    publisher: PublisherTask,
    publish_status: watch::Receiver<PublishStatus>,
    inventory: watch::Sender<Inventory>,
    backend: Arc<dyn GpuBackend>,
    preparer: Preparer,
    monitor: Option<MonitorHandle>,
}

impl std::fmt::Debug for PluginHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginHandle")
            .field("server", &self.server)
            .field("publish_status", &*self.publish_status.borrow())
            .finish_non_exhaustive()
    }
}

impl PluginHandle {
    /// The gRPC servers (sockets, kubelet's registration verdict).
    pub fn server(&self) -> &ServerHandle {
        &self.server
    }

    /// The publisher's progress.
    pub fn publish_status(&self) -> watch::Receiver<PublishStatus> {
        self.publish_status.clone()
    }

    /// The inventory being published.
    pub fn inventory(&self) -> Inventory {
        self.inventory.borrow().clone()
    }

    /// The NVML backend the inventory came from.
    pub fn backend(&self) -> &Arc<dyn GpuBackend> {
        &self.backend
    }

    /// The claim preparer serving kubelet.
    pub fn preparer(&self) -> &Preparer {
        &self.preparer
    }

    /// Resolves when a gRPC server stops on its own (it should not); for
    /// `select!` next to the signal handlers. The publisher never stops on
    /// its own: it retries every error.
    pub async fn stopped(&mut self) -> Error {
        Error::Grpc(self.server.stopped().await)
    }

    /// Deregisters from kubelet (registration socket first), drains the
    /// gRPC calls, then stops the publisher (deleting the slices only with
    /// `--delete-slices-on-exit`). Calls cut off at the drain deadline are
    /// logged, not an error.
    pub async fn shutdown(self) -> Result<(), Error> {
        let grpc = match self.server.shutdown().await {
            Err(grpc::Error::DrainTimeout { .. }) | Ok(()) => Ok(()),
            Err(e) => Err(Error::Grpc(e)),
        };
        if let Some(monitor) = self.monitor {
            monitor.stop().await;
        }
        let published = self.publisher.stop().await;
        tracing::info!("plugin stopped");
        match (grpc, published) {
            (Err(e), Err(p)) => {
                tracing::error!(error = %p, "the ResourceSlice publisher failed on exit too");
                Err(e)
            }
            (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e),
            (Ok(()), Ok(())) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: inner detail")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner detail")]
    struct Inner;

    #[derive(Debug, thiserror::Error)]
    #[error("reading file\n  --> excerpt\n  | ^ here")]
    struct Wrapper(#[source] std::io::Error);

    #[test]
    fn nvml_is_found_in_a_container_driver_root_only() {
        assert_eq!(nvml_in_driver_root(Path::new("/")), None);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(nvml_in_driver_root(dir.path()), None);
        let lib = dir.path().join("usr/lib64");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libnvidia-ml.so.1"), b"elf").unwrap();
        assert_eq!(
            nvml_in_driver_root(dir.path()),
            Some(lib.join("libnvidia-ml.so.1"))
        );
    }

    #[test]
    fn kubelet_versions_are_read_leniently_and_refused_when_not_numeric() {
        for (text, want) in [
            ("v1.33.2", Some((1, 33))),
            ("v1.34.0-eks-1a2b3c", Some((1, 34))),
            ("1.35.1+k3s1", Some((1, 35))),
            (" v1.36.0 ", Some((1, 36))),
            ("v2.0", Some((2, 0))),
            ("v1.33-rc.1", Some((1, 33))),
            ("", None),
            ("v", None),
            ("v1", None),
            ("vx.33.1", None),
            ("v1.x", None),
            ("v99999999999.1", None),
        ] {
            assert_eq!(parse_kubelet_version(text), want, "{text:?}");
        }
    }

    #[tokio::test]
    async fn per_instance_sockets_follow_the_flag_and_the_kubelet_version() {
        use clap::Parser as _;
        use gpu_dra_sim::apiserver::{Resource, WriteOptions};
        use gpu_dra_sim::apiserver::{ServerOptions, TestApiServer};

        let server = TestApiServer::start(ServerOptions::default())
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        let client = kube_client(Some(&kubeconfig)).await.unwrap();
        let flags = |node: &str, extra: &[&str]| {
            let mut args = vec![
                "gpu-kubelet-plugin".to_owned(),
                format!("--node-name={node}"),
                format!("--kubeconfig={}", kubeconfig.display()),
            ];
            args.extend(extra.iter().map(|s| (*s).to_owned()));
            Flags::try_parse_from(args).unwrap()
        };
        let node = |name: &str, version: &str| {
            server
                .store()
                .create(
                    Resource::Nodes,
                    None,
                    serde_json::json!({
                        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                        "status": {"nodeInfo": {"kubeletVersion": version}},
                    }),
                    &WriteOptions::default(),
                )
                .unwrap();
        };
        for (name, version, want) in [
            ("k133", "v1.33.0", true),
            ("k134", "v1.34.2-eks-1", true),
            ("k132", "v1.32.9", false),
            ("kbad", "unknown", false),
        ] {
            node(name, version);
            let tag = choose_instance(&flags(name, &["--rolling-update"]), &client).await;
            assert_eq!(tag.is_some(), want, "{version}");
            if let Some(tag) = tag {
                assert!(grpc::instance::is_tag(&tag), "{tag}");
            }
            // Never without a rolling update, never when told so.
            assert_eq!(choose_instance(&flags(name, &[]), &client).await, None);
            let never = ["--rolling-update", "--per-instance-sockets=never"];
            assert_eq!(choose_instance(&flags(name, &never), &client).await, None);
        }
        // A Node that cannot be read: the shared names, unless told.
        assert_eq!(
            choose_instance(&flags("missing", &["--rolling-update"]), &client).await,
            None
        );
        let always = ["--rolling-update", "--per-instance-sockets=always"];
        assert!(
            choose_instance(&flags("missing", &always), &client)
                .await
                .is_some()
        );
        // Told, but the paths would not fit.
        let long = format!("--driver-name={}.example.com", "a".repeat(50));
        let long = [always[0], always[1], &long];
        assert_eq!(choose_instance(&flags("k133", &long), &client).await, None);
        server.shutdown().await.unwrap();
    }

    #[test]
    fn error_chain_is_one_line_without_repeats() {
        assert_eq!(error_chain(&Outer(Inner)), "outer: inner detail");
        let e = Wrapper(std::io::Error::other("denied"));
        assert_eq!(error_chain(&e), "reading file: denied");
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.yaml");
        let Err(err) = kube_client(Some(&path)).await else {
            panic!("a client from {}", path.display())
        };
        let text = err.to_string();
        assert!(matches!(err, Error::Kubeconfig { .. }), "{text}");
        assert!(
            text.starts_with(&format!("cannot use kubeconfig {}", path.display())),
            "{text}"
        );
        assert!(text.contains("No such file"), "{text}");
    }

    #[tokio::test]
    async fn hostile_kubeconfigs_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        for (body, needle) in [
            ("{{{{ not yaml", "kubeconfig"),
            ("apiVersion: v1\nkind: Config\n", "context"),
            (
                "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://[bad'}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\nusers: [{name: u, user: {}}]\n",
                "cluster url",
            ),
        ] {
            let path = dir.path().join("kubeconfig");
            std::fs::write(&path, body).unwrap();
            let Err(err) = kube_client(Some(&path)).await else {
                panic!("a client from {}", path.display())
            };
            let text = err.to_string();
            assert!(matches!(err, Error::Kubeconfig { .. }), "{body}: {text}");
            assert!(!text.contains('\n'), "{text}");
            assert!(
                text.to_lowercase().contains(needle),
                "{body}: {needle} not in {text}"
            );
        }
    }

    #[tokio::test]
    async fn a_valid_kubeconfig_gives_a_client_without_contacting_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        // Port 9 (discard) on localhost: nothing is contacted to build a client.
        std::fs::write(
            &path,
            gpu_dra_sim::apiserver::kubeconfig_yaml("http://127.0.0.1:9"),
        )
        .unwrap();
        let client = kube_client(Some(&path)).await.unwrap();
        assert_eq!(client.default_namespace(), "default");
    }
}
