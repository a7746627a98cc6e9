//! Shared support of the `slices_*` integration tests: hand-built inventories
//! mirroring the fake NVML profiles, a test API server with a Node, a kube
//! client for it, and a publisher running in the background.

#![allow(dead_code)]

use std::time::Duration;

use gpu_dra_sim::apiserver::{Resource, Selectors, ServerOptions, TestApiServer, ValidationRules};
use gpu_kubelet_plugin::discovery::{DiscoveredGpu, Inventory};
use gpu_kubelet_plugin::slices::{Flags, PublishStatus, Publisher, PublisherOptions};
use gpu_nvml::topology::SWITCH_SENTINEL_BUS_ID;
use gpu_nvml::{
    ComputeMode, GpuInfo, MigInfo, MigPlacement, MigProfile, NvLinkInfo, NvLinkRemote, SystemInfo,
};
use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::sync::{oneshot, watch};

pub const NODE: &str = "node-a";
pub const DRIVER: &str = "gpu.nvidia.com";

/// Fast retries for tests.
pub fn options() -> PublisherOptions {
    PublisherOptions {
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        debounce: Duration::from_millis(5),
        resync: Duration::from_secs(300),
        exit_timeout: Duration::from_secs(5),
        reconcile_timeout: Duration::from_secs(30),
    }
}

#[allow(clippy::too_many_arguments)]
fn profile(
    id: u32,
    name: &str,
    count: u32,
    sm: u32,
    engines: [u32; 5],
    mem_mib: u64,
    size: u32,
    starts: &[u32],
) -> MigProfile {
    MigProfile {
        id,
        name: name.into(),
        slice_count: size.min(7),
        instance_count: count,
        multiprocessors: sm,
        copy_engines: engines[0],
        decoders: engines[1],
        encoders: engines[2],
        jpeg_engines: engines[3],
        ofa_engines: engines[4],
        memory_mib: mem_mib,
        placements: starts
            .iter()
            .map(|&start| MigPlacement { start, size })
            .collect(),
    }
}

/// The H100 80GB GPU instance profiles (25 placements over 8 memory slices).
pub fn h100_profiles() -> Vec<MigProfile> {
    vec![
        profile(
            19,
            "1g.10gb",
            7,
            16,
            [1, 1, 0, 1, 0],
            9856,
            1,
            &[0, 1, 2, 3, 4, 5, 6],
        ),
        profile(
            20,
            "1g.10gb+me",
            1,
            16,
            [1, 1, 0, 1, 1],
            9856,
            1,
            &[0, 1, 2, 3, 4, 5, 6],
        ),
        profile(
            15,
            "1g.20gb",
            4,
            26,
            [1, 1, 0, 1, 0],
            19968,
            2,
            &[0, 2, 4, 6],
        ),
        profile(14, "2g.20gb", 3, 32, [2, 2, 0, 2, 0], 19968, 2, &[0, 2, 4]),
        profile(9, "3g.40gb", 2, 60, [3, 3, 0, 3, 0], 40448, 4, &[0, 4]),
        profile(5, "4g.40gb", 1, 64, [4, 4, 0, 4, 0], 40448, 4, &[0]),
        profile(0, "7g.80gb", 1, 132, [8, 7, 0, 7, 1], 80896, 8, &[0]),
    ]
}

pub fn gpu(
    index: u32,
    product: &str,
    cc: (u32, u32),
    mig: Option<MigInfo>,
    links: &[String],
) -> DiscoveredGpu {
    DiscoveredGpu {
        info: GpuInfo {
            index,
            minor: index,
            uuid: format!("GPU-{index:08x}-1111-2222-3333-444444444444"),
            product_name: product.into(),
            brand: "Nvidia".into(),
            architecture: if cc.0 >= 9 { "Hopper" } else { "Ampere" }.into(),
            cuda_compute_capability: cc,
            memory_bytes: 81_559 << 20,
            pci_bus_id: bus(index),
            addressing_mode: None,
            compute_mode: ComputeMode::Default,
            mig,
            // A link to NVML's switch sentinel is a switch link; any other
            // far end a GPU through a bridge.
            nvlinks: links
                .iter()
                .enumerate()
                .map(|(i, r)| NvLinkInfo {
                    link: i as u32,
                    remote: if r.as_str() == SWITCH_SENTINEL_BUS_ID {
                        NvLinkRemote::Switch
                    } else {
                        NvLinkRemote::Gpu
                    },
                    remote_pci_bus_id: (r.as_str() != SWITCH_SENTINEL_BUS_ID).then(|| r.clone()),
                })
                .collect(),
            fabric: None,
            nvlink_p2p_peers: Vec::new(),
        },
        pcie_root: Some(format!("pci0000:{:02x}", index * 16)),
        numa_node: Some(i64::from(index / 4)),
    }
}

pub fn bus(index: u32) -> String {
    format!("0000:{:02x}:00.0", index + 0x18)
}

fn system() -> SystemInfo {
    SystemInfo {
        driver_version: "580.95.05".into(),
        cuda_driver_version: (13, 0),
    }
}

/// Like the dgx-h100 profile: 8 H100 SXM GPUs, 18 NVLinks each to the
/// NVSwitches (NVML's sentinel far end), P2P over NVLink OK between every
/// pair, no fabric clique, MIG capable, MIG mode off.
pub fn dgx_h100() -> Inventory {
    let links: Vec<String> = vec![SWITCH_SENTINEL_BUS_ID.to_owned(); 18];
    let mut gpus: Vec<DiscoveredGpu> = (0..8)
        .map(|i| {
            let mig = MigInfo {
                current_enabled: false,
                pending_enabled: false,
                profiles: h100_profiles(),
                devices: vec![],
            };
            gpu(i, "NVIDIA H100 80GB HBM3", (9, 0), Some(mig), &links)
        })
        .collect();
    let uuids: Vec<String> = gpus.iter().map(|g| g.info.uuid.clone()).collect();
    for g in &mut gpus {
        g.info.nvlink_p2p_peers = uuids
            .iter()
            .filter(|u| **u != g.info.uuid)
            .cloned()
            .collect();
    }
    Inventory {
        system: system(),
        gpus,
    }
}

/// Like the pcie-a100-bridged profile: 4 A100 PCIe 40GB, NVLink bridges
/// (12 links) joining GPUs 0+1 and 2+3, MIG off.
pub fn pcie_a100_bridged() -> Inventory {
    Inventory {
        system: system(),
        gpus: (0..4)
            .map(|i| {
                let links = vec![bus(i ^ 1); 12];
                let mut g = gpu(i, "NVIDIA A100-PCIE-40GB", (8, 0), None, &links);
                g.info.memory_bytes = 40_960 << 20;
                g
            })
            .collect(),
    }
}

/// A test API server with the Node `node-a`.
pub async fn server(rules: ValidationRules) -> TestApiServer {
    let server = TestApiServer::start(ServerOptions {
        rules,
        ..ServerOptions::default()
    })
    .await
    .unwrap();
    create_node(&server);
    server
}

/// Creates the Node object.
pub fn create_node(server: &TestApiServer) {
    server.store().create_node(NODE).unwrap();
}

/// A kube client talking HTTP to `server`.
pub fn client(server: &TestApiServer) -> kube::Client {
    let config = kube::Config::new(server.url().parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

/// A publisher running in the background.
pub struct Running {
    pub status: watch::Receiver<PublishStatus>,
    pub inventory: watch::Sender<Inventory>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), gpu_kubelet_plugin::slices::PublishError>>,
}

impl Running {
    /// Starts a publisher of `inventory` with `flags`.
    pub fn start(server: &TestApiServer, flags: Flags, inventory: Inventory) -> Self {
        let publisher = Publisher::new(client(server), NODE, DRIVER, flags).with_options(options());
        let status = publisher.status();
        let (inventory_tx, inventory_rx) = watch::channel(inventory);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(publisher.run(inventory_rx, async move {
            let _ = stopped.await;
        }));
        Self {
            status,
            inventory: inventory_tx,
            stop: Some(stop),
            task,
        }
    }

    /// Waits (up to 10 s) until the status satisfies `f`.
    pub async fn wait(&mut self, f: impl Fn(&PublishStatus) -> bool) -> PublishStatus {
        let mut rx = self.status.clone();
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            rx.wait_for(|s| f(s)).await.map(|s| s.clone())
        })
        .await;
        match waited {
            Ok(Ok(s)) => s,
            _ => panic!("status never matched; last: {:?}", *self.status.borrow()),
        }
    }

    /// Waits until the pool is in sync after at least `reconciles` reconciles.
    pub async fn synced(&mut self, reconciles: u64) -> PublishStatus {
        self.wait(|s| s.in_sync && s.reconciles >= reconciles).await
    }

    /// Stops the publisher and returns its result.
    pub async fn stop(mut self) -> Result<(), gpu_kubelet_plugin::slices::PublishError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.unwrap()
    }
}

/// The ResourceSlices in the store, by name order.
pub fn slices(server: &TestApiServer) -> Vec<ResourceSlice> {
    let (items, _) = server
        .store()
        .list(Resource::ResourceSlices, None, &Selectors::default());
    items
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect()
}

/// The store's current resourceVersion (bumped by every write).
pub fn store_version(server: &TestApiServer) -> u64 {
    server.store().resource_version()
}
