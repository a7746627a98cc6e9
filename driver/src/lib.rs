//! The GPU DRA kubelet plugin as a library: the binary in `main.rs` only
//! parses flags and calls `run`-style entry points from these modules, so
//! the demo and the tests can run the very same code in-process.
//!
//! Module ownership (one job each):
//! - [`flags`]: the command line, one flattened group per module;
//! - [`grpc`]: registration, DRAPlugin v1/v1beta1 and health services;
//! - [`health`]: the GPU health monitor (conditions, taints, checkpoint);
//! - [`sockets`]: the plugin's Unix sockets (paths, locks, stale ones) and
//!   their errors, shared by the gRPC servers and the MPS daemon host;
//! - [`paths`]: checks of the absolute host paths the flags take;
//! - [`discovery`]: the node's GPUs through the NVML backend, plus sysfs topology;
//! - [`clique`]: NVIDIA's optional node label `nvidia.com/gpu.clique`;
//! - [`devices`]: the device model (GPUs, MIG devices, dynamic MIG placements);
//! - [`slices`]: building and publishing ResourceSlices;
//! - [`prepare`]: claim preparation (plan, locks, the kinds of device,
//!   checkpoint, CDI, status) and crash recovery;
//! - [`plugin`]: the whole plugin wired together (start, orderly shutdown);
//! - [`phase`]: how far the start has got, for the probes (rolling updates);
//! - [`supervise`]: `--supervise`, the plugin as a restarted child process;
//! - [`vfio`]: VFIO passthrough in sysfs (PCI ids, rebinding to `vfio-pci`).

pub mod clique;
pub mod devices;
pub mod discovery;
pub mod flags;
pub mod grpc;
pub mod health;
pub mod paths;
pub mod phase;
pub mod plugin;
pub mod prepare;
pub mod slices;
pub mod sockets;
pub mod supervise;
pub mod vfio;

/// Microseconds since `t`, for the timing fields (`..._us`) of log lines.
pub(crate) fn micros(t: std::time::Instant) -> u64 {
    u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Helpers the unit tests of several modules share.
#[cfg(test)]
pub(crate) mod test_support {
    use std::time::{Duration, Instant};

    /// Retries `take` while `held` says its error is a lock still held, for
    /// up to 5 s. A file lock dropped by a test can outlive the drop for a
    /// moment: `flock` belongs to the open file description, and a child
    /// that another test thread has just forked keeps a copy of it until
    /// its `exec` closes it.
    pub(crate) fn once_released<T, E>(
        mut take: impl FnMut() -> Result<T, E>,
        held: impl Fn(&E) -> bool,
    ) -> Result<T, E> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match take() {
                Err(e) if held(&e) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                other => return other,
            }
        }
    }

    /// A kube client for an API server that accepts connections and never
    /// answers, and the count of connections it accepted (the server runs
    /// until the returned task is aborted).
    pub(crate) async fn hung_api_server() -> (
        kube::Client,
        std::sync::Arc<std::sync::atomic::AtomicUsize>,
        tokio::task::JoinHandle<()>,
    ) {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url: http::Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        });
        let client = kube::Client::try_from(kube::Config::new(url)).unwrap();
        (client, accepted, server)
    }
}
