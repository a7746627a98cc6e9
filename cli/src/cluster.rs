//! Reaching a cluster through a kubeconfig, for the subcommands that read
//! one (`simulate --kubeconfig`, `health --kubeconfig`): the client, the
//! server's address for messages and the kubeconfig's namespace, with
//! timeouts so that an unreachable server is an error, not a hang.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

/// A connected client.
pub struct Cluster {
    /// The client.
    pub client: kube::Client,
    /// The server's URL, for messages.
    pub server: String,
    /// The kubeconfig context's namespace (`default` when it names none).
    pub default_namespace: String,
}

/// A single-threaded runtime for the CLI's few requests.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Loads `kubeconfig` (its `context`, or the current one) and builds a
/// client: 10 s to connect, 60 s per read.
pub async fn connect(kubeconfig: &Path, context: Option<&str>) -> anyhow::Result<Cluster> {
    let file = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", kubeconfig.display()))?;
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let mut config = kube::Config::from_custom_kubeconfig(file, &options)
        .await
        .with_context(|| format!("loading kubeconfig {}", kubeconfig.display()))?;
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(60));
    let default_namespace = config.default_namespace.clone();
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).context("creating the Kubernetes client")?;
    Ok(Cluster {
        client,
        server,
        default_namespace,
    })
}
