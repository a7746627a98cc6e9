//! The ResourceSlice publisher against the test API server, over HTTP with
//! the real kube client: publication, generations, restarts, repair of
//! deletion and drift, API errors, and deletion on exit.

mod slices_support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_dra_sim::apiserver::{
    DeleteOptions, Resource, Selectors, ServerOptions, ValidationRules, WriteOptions,
};
use gpu_kubelet_plugin::slices::{Flags, RulesFlag, SliceRules};
use slices_support::*;

fn flags(dynamic_mig: bool) -> Flags {
    Flags {
        dynamic_mig,
        ..Flags::default()
    }
}

#[tokio::test]
async fn publishes_the_pool_and_then_stays_quiet() {
    let server = server(ValidationRules::V1_35).await;
    let mut p = Running::start(&server, flags(true), dgx_h100());
    let status = p.synced(1).await;
    // auto rules: the server says 1.35.
    assert_eq!(status.rules, Some(SliceRules::V1_35));
    assert_eq!(
        (status.generation, status.slices, status.devices),
        (Some(0), 5, 8 * 26)
    );
    assert_eq!(status.writes, 5);

    let slices = slices(&server);
    assert_eq!(slices.len(), 5);
    for s in &slices {
        assert_eq!(s.spec.driver, DRIVER);
        assert_eq!(s.spec.node_name.as_deref(), Some(NODE));
        assert_eq!(s.spec.pool.name, NODE);
        assert_eq!(
            (s.spec.pool.generation, s.spec.pool.resource_slice_count),
            (0, 5)
        );
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", NODE));
    }
    let counters: Vec<_> = slices
        .iter()
        .filter(|s| s.spec.shared_counters.is_some())
        .collect();
    assert_eq!(counters.len(), 1);
    assert_eq!(counters[0].spec.shared_counters.as_ref().unwrap().len(), 8);

    // Nothing changes: no write, however many events and resyncs come by.
    let version = store_version(&server);
    p.inventory.send_modify(|_| {});
    p.synced(2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store_version(&server), version);
    assert_eq!(p.status.borrow().writes, 5);
    p.stop().await.unwrap();
    // Default policy: the slices stay on exit.
    assert_eq!(slices_support::slices(&server).len(), 5);
}

#[tokio::test]
async fn a_restart_with_the_same_gpus_republishes_the_identical_pool() {
    let server = server(ValidationRules::V1_35).await;
    let mut first = Running::start(&server, flags(true), dgx_h100());
    first.synced(1).await;
    // A second generation, so "identical" is not just generation 0 again.
    first.inventory.send_modify(|inv| inv.gpus.truncate(7));
    first.wait(|s| s.generation == Some(1) && s.in_sync).await;
    first.inventory.send_modify(|inv| *inv = dgx_h100());
    first.wait(|s| s.generation == Some(2) && s.in_sync).await;
    first.stop().await.unwrap();
    let before = slices(&server);
    let version = store_version(&server);

    let mut second = Running::start(&server, flags(true), dgx_h100());
    let status = second.synced(1).await;
    assert_eq!(status.generation, Some(2));
    assert_eq!(status.writes, 0);
    assert_eq!(store_version(&server), version);
    assert_eq!(slices(&server), before);
    second.stop().await.unwrap();
}

#[tokio::test]
async fn deleted_slices_are_repaired_at_the_same_generation() {
    let server = server(ValidationRules::V1_35).await;
    let mut p = Running::start(&server, flags(true), dgx_h100());
    p.synced(1).await;
    let name = format!("{NODE}-{DRIVER}-3");

    let started = Instant::now();
    server
        .store()
        .delete(
            Resource::ResourceSlices,
            None,
            &name,
            &DeleteOptions::default(),
        )
        .unwrap();
    let restored = server
        .store()
        .wait_for(Resource::ResourceSlices, Duration::from_secs(10), |items| {
            items.len() == 5
        })
        .await
        .expect("slice restored");
    eprintln!("one deleted slice repaired in {:?}", started.elapsed());
    assert!(
        restored
            .iter()
            .all(|s| s["spec"]["pool"]["generation"] == 0)
    );

    // Kubelet restart: all node-local slices deleted at once.
    let started = Instant::now();
    server
        .store()
        .delete_collection(
            Resource::ResourceSlices,
            None,
            &Selectors::default(),
            &DeleteOptions::default(),
        )
        .unwrap();
    server
        .store()
        .wait_for(Resource::ResourceSlices, Duration::from_secs(10), |items| {
            items.len() == 5
        })
        .await
        .expect("pool restored");
    eprintln!("whole pool repaired in {:?}", started.elapsed());
    let status = p.synced(3).await;
    assert_eq!(status.generation, Some(0));
    assert_eq!(status.writes, 5 + 1 + 5);
    p.stop().await.unwrap();
}

#[tokio::test]
async fn drift_is_repaired() {
    let server = server(ValidationRules::V1_35).await;
    let mut p = Running::start(&server, flags(false), pcie_a100_bridged());
    p.synced(1).await;
    let name = format!("{NODE}-{DRIVER}-0");
    let mut tampered = server
        .store()
        .get(Resource::ResourceSlices, None, &name)
        .unwrap();
    tampered["spec"]["devices"]
        .as_array_mut()
        .unwrap()
        .truncate(1);
    server
        .store()
        .update(
            Resource::ResourceSlices,
            None,
            &name,
            tampered,
            false,
            &WriteOptions::default(),
        )
        .unwrap();
    let items = server
        .store()
        .wait_for(Resource::ResourceSlices, Duration::from_secs(10), |items| {
            items.len() == 1 && items[0]["spec"]["devices"].as_array().map(Vec::len) == Some(4)
        })
        .await
        .expect("drift repaired");
    assert_eq!(items[0]["spec"]["pool"]["generation"], 0);
    p.stop().await.unwrap();
}

#[tokio::test]
async fn a_new_inventory_regenerates_the_whole_pool() {
    let server = server(ValidationRules::V1_35).await;
    let mut p = Running::start(&server, flags(true), dgx_h100());
    p.synced(1).await;
    // MIG off everywhere: 8 full GPUs in one slice.
    p.inventory.send_modify(|inv| {
        for g in &mut inv.gpus {
            g.info.mig = None;
        }
    });
    let status = p.wait(|s| s.generation == Some(1) && s.in_sync).await;
    assert_eq!((status.slices, status.devices), (1, 8));
    let slices = slices(&server);
    assert_eq!(slices.len(), 1);
    assert_eq!(
        (
            slices[0].spec.pool.generation,
            slices[0].spec.pool.resource_slice_count
        ),
        (1, 1)
    );
    p.stop().await.unwrap();
}

#[tokio::test]
async fn api_server_1_34_gets_1_34_slices() {
    let server = server(ValidationRules::V1_34).await;
    let mut p = Running::start(&server, flags(true), dgx_h100());
    let status = p.synced(1).await;
    assert_eq!(status.rules, Some(SliceRules::V1_34));
    let slices = slices(&server);
    // Counter sets next to their devices: two GPUs per slice.
    assert_eq!(slices.len(), 4);
    for s in &slices {
        assert_eq!(s.spec.shared_counters.as_ref().unwrap().len(), 2);
        assert_eq!(s.spec.devices.as_ref().unwrap().len(), 52);
    }
    p.stop().await.unwrap();
}

#[tokio::test]
async fn wrong_rules_are_retried_and_reported_without_crashing() {
    // 1.35 layout on a 1.34 server: rejected with 422, retried with backoff.
    let server = server(ValidationRules::V1_34).await;
    let f = Flags {
        slice_rules: RulesFlag::V1_35,
        ..flags(true)
    };
    let mut p = Running::start(&server, f, dgx_h100());
    let status = p.wait(|s| s.last_error.is_some()).await;
    let error = status.last_error.unwrap();
    assert!(error.contains("422"), "{error}");
    assert!(!status.in_sync);
    // Still alive and still trying.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!p.status.borrow().in_sync);
    p.stop().await.unwrap();
}

/// A `tracing` writer collecting everything into a buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_missing_node_is_retried_logged_once_and_recovers() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = gpu_dra_sim::apiserver::TestApiServer::start(ServerOptions::default())
        .await
        .unwrap();
    let mut p = Running::start(&server, flags(false), pcie_a100_bridged());
    p.wait(|s| s.last_error.as_deref().is_some_and(|e| e.contains("404")))
        .await;
    // Let it retry a good number of times (20 ms doubling to 200 ms).
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(slices(&server).is_empty());
    create_node(&server);
    let status = p.synced(1).await;
    assert!(status.last_error.is_none());
    assert_eq!(slices(&server).len(), 1);
    p.stop().await.unwrap();

    let text = logs.text();
    let warnings = text
        .lines()
        .filter(|l| l.contains("failed, will retry"))
        .count();
    assert_eq!(warnings, 1, "{text}");
    assert_eq!(
        text.lines().filter(|l| l.contains("recovered")).count(),
        1,
        "{text}"
    );
}

#[tokio::test]
async fn slices_are_deleted_on_exit_when_asked() {
    let server = server(ValidationRules::V1_35).await;
    let f = Flags {
        delete_slices_on_exit: true,
        ..flags(true)
    };
    let mut p = Running::start(&server, f, dgx_h100());
    p.synced(1).await;
    assert_eq!(slices(&server).len(), 5);
    p.stop().await.unwrap();
    assert!(slices(&server).is_empty());
}

#[tokio::test]
async fn hostile_inventories_still_publish_valid_pools() {
    let server = server(ValidationRules::V1_35).await;

    // No GPU at all: one empty slice says the driver runs here.
    let empty = gpu_kubelet_plugin::discovery::Inventory {
        gpus: vec![],
        ..pcie_a100_bridged()
    };
    let mut p = Running::start(&server, flags(true), empty);
    let status = p.synced(1).await;
    assert_eq!((status.slices, status.devices), (1, 0));
    assert!(slices(&server)[0].spec.devices.is_none());

    // A 100-byte product name is cut to 64 bytes; the API server accepts it.
    p.inventory.send_modify(|inv| {
        *inv = pcie_a100_bridged();
        inv.gpus[0].info.product_name = "N".repeat(100);
    });
    p.wait(|s| s.generation == Some(1) && s.in_sync).await;
    let s = &slices(&server)[0];
    let name = s.spec.devices.as_ref().unwrap()[0]
        .attributes
        .as_ref()
        .unwrap()["productName"]
        .string
        .clone()
        .unwrap();
    assert_eq!(name, "N".repeat(64));

    // 300 placements on one GPU: many slices, all valid.
    p.inventory.send_modify(|inv| {
        *inv = dgx_h100();
        inv.gpus.truncate(1);
        let mig = inv.gpus[0].info.mig.as_mut().unwrap();
        mig.profiles = (0..12)
            .map(|i| {
                let mut p = h100_profiles()[0].clone();
                p.id = 100 + i;
                p.name = format!("1g.{i}gb");
                p.instance_count = 25;
                p.memory_mib = 512;
                p.placements = (0..25)
                    .map(|start| gpu_nvml::MigPlacement { start, size: 1 })
                    .collect();
                p
            })
            .collect();
    });
    let status = p.wait(|s| s.generation == Some(2) && s.in_sync).await;
    assert_eq!((status.slices, status.devices), (6, 301));
    assert_eq!(slices(&server).len(), 6);
    p.stop().await.unwrap();
}
