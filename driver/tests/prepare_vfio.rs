//! VFIO passthrough end to end, with the real plugin binary (`--passthrough`)
//! on a fake PCIe A100 machine whose sysfs is the stand-in of
//! `fake_driver_root::sysfs` (a stand-in kernel rebinds GPUs as the plugin
//! writes `driver_override`, `unbind` and `drivers_probe`, and records each
//! event): what is published, prepare and unprepare (the binds, the CDI
//! spec as each `VfioDeviceConfig` asks, the checkpoint record), the refusal
//! of a GPU another claim holds or processes use (NVML's process lists, set
//! through the fake's control file), and a crash at every step of a prepare and
//! of an unprepare, then a restart: the GPU ends on a known driver and
//! nothing is left.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use common::prepare::{Node, Vfio, bus_of, node, node_with, node_with_control, result, vfio_of};
use common::{DRIVER, inject};
use gpu_dra_sim::kubelet::{Claim, DraVersion};
use serde_json::{Value, json};

const PROFILE: &str = "pcie-a100-bridged";
const FLAGS: &[&str] = &["--passthrough"];
const FAILPOINT: &str = "GPU_DRA_FAILPOINT";

fn vfio_config(iommu: Value) -> Value {
    json!({"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig", "iommu": iommu}}})
}

/// The container paths of a CDI device's nodes.
fn node_paths(edits: &Value) -> Vec<String> {
    edits["deviceNodes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|n| n["path"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn events_of(v: &Vfio) -> Vec<String> {
    v.sysfs.events().unwrap()
}

#[tokio::test]
async fn vfio_devices_are_published_beside_the_gpus_and_share_their_counter() {
    let n = node(PROFILE, FLAGS, DraVersion::V1).await;
    let names = n.device_names().await;
    for i in 0..4 {
        assert!(names.contains(&format!("gpu-{i}")), "{names:?}");
        assert!(names.contains(&format!("gpu-vfio-{i}")), "{names:?}");
    }
    let vfio = n.published_device("gpu-vfio-0").await;
    let gpu = n.published_device("gpu-0").await;
    let a = &vfio["attributes"];
    assert_eq!(a["type"]["string"], "vfio");
    assert_eq!(a["vendorID"]["string"], "0x10de");
    assert!(
        a["deviceID"]["string"]
            .as_str()
            .is_some_and(|d| d.len() == 6 && d.starts_with("0x")),
        "{vfio}"
    );
    assert_eq!(a["iommuFDEnabled"]["bool"], false);
    assert_eq!(a["uuid"], gpu["attributes"]["uuid"]);
    assert_eq!(bus_of(&vfio), bus_of(&gpu));
    assert_eq!(
        vfio["capacity"]["addressableMemory"]["value"],
        gpu["capacity"]["memory"]["value"]
    );
    assert_eq!(
        vfio["consumesCounters"], gpu["consumesCounters"],
        "{vfio}\n{gpu}"
    );
    assert_eq!(
        vfio["consumesCounters"][0]["counterSet"],
        "gpu-0-counter-set"
    );
}

#[tokio::test]
async fn a_vfio_claim_rebinds_the_gpu_and_unprepare_binds_it_back() {
    let n = node(PROFILE, FLAGS, DraVersion::V1).await;
    let v = vfio_of(&n, false);
    let bus = n.published_bus("gpu-vfio-0").await;
    let group = v.iommu_group(&bus);
    let claim = n.vfio_claim("vm", "gpu-vfio-0").await;
    let r = n.prepare_ok(&claim).await;
    assert_eq!(r.devices.len(), 1);
    assert_eq!(v.sysfs.driver_of(&bus).as_deref(), Some("vfio-pci"));
    assert_eq!(
        events_of(&v),
        [
            format!("unbind {bus} nvidia"),
            format!("bind {bus} vfio-pci")
        ]
    );
    let spec = n.spec(&claim);
    assert_eq!(
        spec["containerEdits"]["env"],
        json!(["NVIDIA_VISIBLE_DEVICES=void"])
    );
    assert!(
        spec["containerEdits"]["mounts"].is_null() && spec["containerEdits"]["hooks"].is_null(),
        "no driver files for a VFIO claim: {spec}"
    );
    let device = n.spec_device(&claim, "gpu-vfio-0");
    assert_eq!(
        node_paths(&device["containerEdits"]),
        [format!("/dev/vfio/{group}"), "/dev/vfio/vfio".to_owned()]
    );
    let record = &n.checkpoint()["entries"][&claim.uid]["entry"]["devices"][0]["kind"];
    assert_eq!(record["type"], "vfio");
    assert_eq!(record["previousDriver"], "nvidia");
    assert_eq!(record["iommuGroup"], group.to_string());
    assert_eq!(record["pciBusId"], bus);

    n.unprepare_ok(&claim).await;
    assert_eq!(v.sysfs.driver_of(&bus).as_deref(), Some("nvidia"));
    assert_eq!(v.sysfs.override_of(&bus), None);
    assert_eq!(
        events_of(&v)[2..],
        [
            format!("unbind {bus} vfio-pci"),
            format!("bind {bus} nvidia")
        ]
    );
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
    assert!(n.checkpoint_claims().is_empty());
}

#[tokio::test]
async fn prefer_iommufd_gives_the_cdev_and_the_api_device_where_the_node_has_iommufd() {
    let mut n = node(PROFILE, FLAGS, DraVersion::V1).await;
    let v = vfio_of(&n, true);
    // /dev/iommu is looked for at start: restart to see it, and wait for
    // the pool to say so.
    n.restart(&[]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let published = loop {
        let d = n.published_device("gpu-vfio-1").await;
        if d["attributes"]["iommuFDEnabled"]["bool"] == true {
            break d;
        }
        assert!(std::time::Instant::now() < deadline, "{d}\n{}", n.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let bus = bus_of(&published);
    let group = v.iommu_group(&bus);
    for (name, iommu, expected) in [
        (
            "fd-api",
            json!({"backendPolicy": "PreferIommuFD", "enableAPIDevice": true}),
            vec![
                format!("/dev/vfio/devices/vfio{group}"),
                "/dev/vfio/vfio".to_owned(),
                "/dev/iommu".to_owned(),
            ],
        ),
        (
            "fd",
            json!({"backendPolicy": "PreferIommuFD"}),
            vec![
                format!("/dev/vfio/devices/vfio{group}"),
                "/dev/vfio/vfio".to_owned(),
            ],
        ),
        (
            "legacy-api",
            json!({"backendPolicy": "LegacyOnly", "enableAPIDevice": true}),
            vec![format!("/dev/vfio/{group}"), "/dev/vfio/vfio".to_owned()],
        ),
    ] {
        let claim = n
            .claim(
                name,
                json!([result("vm", "gpu-vfio-1")]),
                json!([vfio_config(iommu)]),
            )
            .await;
        n.prepare_ok(&claim).await;
        let device = n.spec_device(&claim, "gpu-vfio-1");
        assert_eq!(node_paths(&device["containerEdits"]), expected, "{name}");
        n.unprepare_ok(&claim).await;
        assert_eq!(v.sysfs.driver_of(&bus).as_deref(), Some("nvidia"), "{name}");
    }
}

#[tokio::test]
async fn a_gpu_another_claim_holds_is_refused_by_the_claims_name() {
    let n = node(PROFILE, FLAGS, DraVersion::V1).await;
    let v = vfio_of(&n, false);
    let bus = n.published_bus("gpu-vfio-2").await;
    // Held whole by a container: the VM claim is refused, the GPU untouched.
    let container = n.gpu_claim("training", "gpu-2").await;
    n.prepare_ok(&container).await;
    let vm = n.vfio_claim("vm", "gpu-vfio-2").await;
    let error = n.prepare_error(&vm).await;
    assert!(
        error.contains("gpu-vfio-2")
            && error.contains(&format!("claim default/training ({})", container.uid)),
        "{error}"
    );
    assert_eq!(v.sysfs.driver_of(&bus).as_deref(), Some("nvidia"));
    assert!(events_of(&v).is_empty(), "{:?}", events_of(&v));
    // Held by a monitoring container (admin access) too.
    n.unprepare_ok(&container).await;
    let mut admin = result("gpu", "gpu-2");
    admin["adminAccess"] = json!(true);
    let monitor = n.claim("monitor", json!([admin]), json!([])).await;
    n.prepare_ok(&monitor).await;
    let error = n.prepare_error(&vm).await;
    assert!(
        error.contains(&format!(
            "GPU {bus} is in use by claim default/monitor ({}) as gpu-2",
            monitor.uid
        )),
        "{error}"
    );
    assert!(events_of(&v).is_empty(), "{:?}", events_of(&v));
    // Free: the VM gets it; then the container is refused by the VM's name.
    n.unprepare_ok(&monitor).await;
    n.prepare_ok(&vm).await;
    let again = n.gpu_claim("training-2", "gpu-2").await;
    let error = n.prepare_error(&again).await;
    assert!(
        error.contains(&format!("claim default/vm ({})", vm.uid)),
        "{error}"
    );
    n.unprepare_ok(&vm).await;
    assert_eq!(v.sysfs.driver_of(&bus).as_deref(), Some("nvidia"));
}

#[tokio::test]
async fn a_gpu_that_processes_use_is_refused_by_their_pids_and_nothing_is_applied() {
    // GPU minor 1 (index 1) has two compute processes and a graphics one
    // (4242 again, and 4250) from the start.
    let (n, control) = node_with_control(
        PROFILE,
        FLAGS,
        DraVersion::V1,
        "processes 1 4242:512 4243\ngraphics-processes 1 4242 4250\n",
    )
    .await;
    let v = vfio_of(&n, false);
    let bus = n.published_bus("gpu-vfio-1").await;
    let vm = n.vfio_claim("vm", "gpu-vfio-1").await;
    let error = n.prepare_error(&vm).await;
    assert!(
        error.contains("gpu-vfio-1")
            && error.contains(&format!(
                "GPU {bus} is in use by 3 processes that NVML sees (PIDs 4242, 4243, 4250): \
                 a GPU is bound to vfio-pci only when no container uses it; stop them first"
            )),
        "{error}"
    );
    // Nothing half-applied: no bind or unbind, no entry, no CDI spec.
    assert_clean(&n, &v, &bus, "refused for 3 processes");
    assert!(events_of(&v).is_empty(), "{:?}", events_of(&v));
    // Another GPU without processes is not affected.
    let other = n.vfio_claim("vm-0", "gpu-vfio-0").await;
    n.prepare_ok(&other).await;
    n.unprepare_ok(&other).await;
    let before = events_of(&v).len();

    // The compute processes end; the graphics ones still hold it.
    inject(&control, "processes 1");
    let error = prepare_until(&n, &vm, |e| {
        e.is_some_and(|e| e.contains("in use by 2 processes that NVML sees (PIDs 4242, 4250)"))
    })
    .await
    .expect("still refused");
    assert!(error.contains(&bus), "{error}");
    assert_eq!(events_of(&v).len(), before, "{:?}", events_of(&v));
    assert_clean(&n, &v, &bus, "refused for 2 processes");

    // All gone: the same claim prepares.
    inject(&control, "graphics-processes 1");
    assert_eq!(prepare_until(&n, &vm, |e| e.is_none()).await, None);
    assert_eq!(v.sysfs.driver_of(&bus).as_deref(), Some("vfio-pci"));
    assert_eq!(
        events_of(&v)[before..],
        [
            format!("unbind {bus} nvidia"),
            format!("bind {bus} vfio-pci")
        ]
    );
    n.unprepare_ok(&vm).await;
    assert_eq!(v.sysfs.driver_of(&bus).as_deref(), Some("nvidia"));
}

#[tokio::test]
async fn a_lost_gpu_with_processes_is_handed_over_with_a_warning() {
    let (n, control) = node_with_control(PROFILE, FLAGS, DraVersion::V1, "processes 2 99\n").await;
    let v = vfio_of(&n, false);
    let bus = n.published_bus("gpu-vfio-2").await;
    inject(&control, "lose 2");
    let vm = n.vfio_claim("vm", "gpu-vfio-2").await;
    assert_eq!(prepare_until(&n, &vm, |e| e.is_none()).await, None);
    assert_eq!(v.sysfs.driver_of(&bus).as_deref(), Some("vfio-pci"));
    let logs = n.logs();
    assert!(logs.contains("no process can use it"), "{logs}");
    n.unprepare_ok(&vm).await;
}

/// Prepares `claim` until its error (`None`: prepared) satisfies `done`
/// (the fake NVML reads the control file every 50 ms); each failed try
/// must leave nothing behind. Returns the last error.
async fn prepare_until(
    n: &Node,
    claim: &Claim,
    done: impl Fn(Option<&str>) -> bool,
) -> Option<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = n.prepare(std::slice::from_ref(claim)).await;
        let error = r[&claim.uid].error.clone();
        if done(error.as_deref()) {
            return error;
        }
        assert!(n.checkpoint_claims().is_empty(), "{error:?}");
        assert!(
            std::time::Instant::now() < deadline,
            "never: last {error:?}\n{}",
            n.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_gpu_on_another_driver_or_that_vfio_pci_refuses_fails_the_claim_and_stays_known() {
    let n = node(PROFILE, FLAGS, DraVersion::V1).await;
    let v = vfio_of(&n, false);
    let bus = n.published_bus("gpu-vfio-3").await;
    let vm = n.vfio_claim("vm", "gpu-vfio-3").await;
    // vfio-pci does not take it: the prepare fails and the GPU is back on
    // nvidia, nothing recorded.
    v.sysfs.refuse("vfio-pci", true).unwrap();
    let error = n.prepare_error(&vm).await;
    assert!(
        error.contains("after asking for vfio-pci; is the module loaded"),
        "{error}"
    );
    assert_clean(&n, &v, &bus, "refused by vfio-pci");
    v.sysfs.refuse("vfio-pci", false).unwrap();
    n.prepare_ok(&vm).await;
    n.unprepare_ok(&vm).await;
    assert_eq!(v.sysfs.driver_of(&bus).as_deref(), Some("nvidia"));
}

/// Waits for the aborted plugin and checks it died at the failpoint.
fn assert_aborted(n: &mut Node, failpoint: &str) {
    let status = n.plugin.wait_exit(Duration::from_secs(20));
    assert_eq!(
        status.signal(),
        Some(6),
        "{failpoint}: the plugin did not abort: {status}\n{}",
        n.logs()
    );
}

/// Nothing of the claim is left, and the GPU is on nvidia, override
/// cleared.
fn assert_clean(n: &Node, v: &Vfio, bus: &str, when: &str) {
    assert_eq!(
        v.sysfs.driver_of(bus).as_deref(),
        Some("nvidia"),
        "{when}: {:?}\n{}",
        events_of(v),
        n.logs()
    );
    assert_eq!(v.sysfs.override_of(bus), None, "{when}");
    assert!(n.cdi_files().is_empty(), "{when}: {:?}", n.cdi_files());
    assert!(
        n.checkpoint_claims().is_empty(),
        "{when}: {:?}",
        n.checkpoint_claims()
    );
}

async fn crash_in_prepare(failpoint: &str, prepared_after: bool) {
    let mut n = node_with(PROFILE, FLAGS, DraVersion::V1, &[(FAILPOINT, failpoint)]).await;
    let v = vfio_of(&n, false);
    let bus = n.published_bus("gpu-vfio-0").await;
    let claim: Claim = n.vfio_claim("vm", "gpu-vfio-0").await;
    let answer = n.kubelet.prepare(std::slice::from_ref(&claim)).await;
    assert!(answer.is_err(), "{failpoint}: answered: {answer:?}");
    assert_aborted(&mut n, failpoint);
    n.restart(&[]).await;
    if prepared_after {
        assert_eq!(
            v.sysfs.driver_of(&bus).as_deref(),
            Some("vfio-pci"),
            "{failpoint}\n{}",
            n.logs()
        );
    } else {
        assert_clean(&n, &v, &bus, &format!("{failpoint}: after recovery"));
    }
    n.prepare_ok(&claim).await;
    assert_eq!(v.sysfs.driver_of(&bus).as_deref(), Some("vfio-pci"));
    n.unprepare_ok(&claim).await;
    assert_clean(&n, &v, &bus, &format!("{failpoint}: after the unprepare"));
}

async fn crash_in_unprepare(failpoint: &str) {
    let mut n = node(PROFILE, FLAGS, DraVersion::V1).await;
    let v = vfio_of(&n, false);
    let bus = n.published_bus("gpu-vfio-0").await;
    let claim: Claim = n.vfio_claim("vm", "gpu-vfio-0").await;
    n.prepare_ok(&claim).await;
    n.restart(&[(FAILPOINT, failpoint)]).await;
    let answer = n.kubelet.unprepare(std::slice::from_ref(&claim)).await;
    assert!(answer.is_err(), "{failpoint}: answered: {answer:?}");
    assert_aborted(&mut n, failpoint);
    n.restart(&[]).await;
    n.unprepare_ok(&claim).await;
    assert_clean(&n, &v, &bus, &format!("{failpoint}: after the unprepare"));
}

macro_rules! crash_tests {
    ($($name:ident => $run:ident($($arg:expr),*);)*) => {
        $(
            #[tokio::test]
            async fn $name() {
                $run($($arg),*).await;
            }
        )*
    };
}

crash_tests! {
    crash_after_started => crash_in_prepare("prepare-after-started", false);
    crash_after_journal => crash_in_prepare("vfio-after-journal", false);
    crash_after_override => crash_in_prepare("vfio-after-override", false);
    crash_after_unbind => crash_in_prepare("vfio-after-unbind", false);
    crash_after_probe => crash_in_prepare("vfio-after-probe", false);
    crash_after_cdi => crash_in_prepare("prepare-after-cdi", false);
    crash_after_completed => crash_in_prepare("prepare-after-completed", true);
    crash_in_undo_after_override => crash_in_unprepare("vfio-undo-after-override");
    crash_in_undo_after_unbind => crash_in_unprepare("vfio-undo-after-unbind");
    crash_in_undo_after_probe => crash_in_unprepare("vfio-undo-after-probe");
    crash_after_undo => crash_in_unprepare("unprepare-after-undo");
}

/// A GPU left on vfio-pci that no claim holds (the checkpoint lost with
/// the state directory, say) is bound back at start.
#[tokio::test]
async fn a_gpu_left_on_vfio_pci_is_bound_back_at_start() {
    let mut n = node(PROFILE, FLAGS, DraVersion::V1).await;
    let v = vfio_of(&n, false);
    let bus = n.published_bus("gpu-vfio-1").await;
    n.stop();
    v.sysfs.force_driver(&bus, Some("vfio-pci")).unwrap();
    n.restart(&[]).await;
    assert_eq!(
        v.sysfs.driver_of(&bus).as_deref(),
        Some("nvidia"),
        "{}",
        n.logs()
    );
    assert!(
        n.logs()
            .contains("GPUs on vfio-pci that no claim held bound back to nvidia"),
        "{}",
        n.logs()
    );
}

/// A checkpoint whose VFIO record names a hostile bus id: the unprepare
/// fails with that bus id named and writes nothing outside the sysfs root;
/// the GPU, which no entry names any more, is bound back at start.
#[tokio::test]
async fn a_hostile_bus_id_in_the_checkpoint_is_refused_by_name() {
    use gpu_kubelet_plugin::prepare::checkpoint::{Batch, ClaimUid, DeviceKind};
    let mut n = node(PROFILE, FLAGS, DraVersion::V1).await;
    let v = vfio_of(&n, false);
    let bus = n.published_bus("gpu-vfio-2").await;
    let claim = n.vfio_claim("vm", "gpu-vfio-2").await;
    n.prepare_ok(&claim).await;
    n.stop();
    let hostile = "../../../../x";
    n.edit_checkpoint(|store| {
        let uid = ClaimUid(claim.uid.clone());
        let mut entry = store.get(&uid).unwrap();
        let DeviceKind::Vfio { pci_bus_id, .. } = &mut entry.devices[0].kind else {
            panic!("{entry:?}");
        };
        *pci_bus_id = hostile.to_owned();
        store.commit(Batch::new().put(uid, entry)).unwrap();
    });
    n.restart(&[]).await;
    assert_eq!(
        v.sysfs.driver_of(&bus).as_deref(),
        Some("nvidia"),
        "{}",
        n.logs()
    );
    let r = n
        .kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    let error = r[&claim.uid].error.clone().expect("refused");
    assert!(
        error.contains(&format!(
            "PCI bus id \"{hostile}\" is not a sysfs device name"
        )),
        "{error}"
    );
    assert!(!n.env.sysfs.join("../../x").exists() && !n.env.root.join("x").exists());
    assert_eq!(
        n.checkpoint_claims(),
        std::slice::from_ref(&claim.uid),
        "kept for a retry"
    );
}
