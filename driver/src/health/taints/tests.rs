//! Unit tests of the `taints` module on real device models: whole-GPU
//! faults reach every device on the GPU (static MIG, dynamic MIG
//! placements, a memory-shared GPU, the VFIO sibling), MIG faults only
//! their device; effects, eviction, the 16-taint cap, the health
//! stream's view, and the slice limits once devices are tainted.

use std::collections::BTreeSet;

use gpu_nvml::health::{EventKind, HealthEvent, HealthPoll, Liveness};
use gpu_nvml::{MigDevice, MigPlacement};

use super::*;
use crate::devices::BuildOptions;
use crate::devices::fixtures::{HOPPER, dgx_h100, dynamic, gpu, inventory, mig_info};
use crate::health::store::HealthStore;
use crate::health::testing::{event_at, t, xid_at};
use crate::health::tracker::{GpuId, MigInstance};
use crate::slices::SliceRules;
use crate::slices::split::split;

fn mig(gi: u32, profile_id: u32, start: u32, size: u32) -> MigDevice {
    MigDevice {
        uuid: format!("MIG-{gi}"),
        profile_id,
        gpu_instance_id: gi,
        compute_instance_id: 0,
        placement: MigPlacement { start, size },
        memory_bytes: 10_000 << 20,
        compute_slices: None,
    }
}

/// GPU 0 in static MIG mode (two MIG devices), GPU 1 whole, GPU 2 shared
/// by memory fraction.
fn node() -> (DeviceModel, Vec<MigDevice>) {
    let migs = vec![mig(1, 9, 4, 4), mig(2, 20, 0, 1)];
    let inv = inventory(vec![
        gpu(0, HOPPER, Some(mig_info(true, migs.clone())), &[]),
        gpu(1, HOPPER, None, &[]),
        gpu(2, HOPPER, None, &[]),
    ]);
    let options = BuildOptions {
        memory_sharing: "2".parse().unwrap(),
        ..BuildOptions::default()
    };
    let model = DeviceModel::build(&inv, &options);
    let names: Vec<&str> = model.devices().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpu-0-mig-3g40gb-9-4",
            "gpu-0-mig-1g10gb-me-20-0",
            "gpu-1",
            "gpu-2"
        ]
    );
    assert!(model.device("gpu-2").unwrap().memory_sharing.is_some());
    (model, migs)
}

fn ids(model: &DeviceModel) -> Vec<GpuId> {
    model
        .groups
        .iter()
        .enumerate()
        .map(|(i, g)| GpuId {
            index: u32::try_from(i).unwrap(),
            minor: g.minor,
            uuid: g.uuid.clone(),
        })
        .collect()
}

fn tracker_for(model: &DeviceModel, policy: Policy) -> Tracker {
    Tracker::new(policy, ids(model), "boot".into(), None, t(0))
}

fn xid(gpu: u32, xid: u64, gi: Option<u32>) -> HealthEvent {
    xid_at(gpu, xid, gi, t(0))
}

fn taint(key: &str, value: Option<&str>, effect: TaintEffect) -> Taint {
    Taint {
        key: format!("gpu.nvidia.com/{key}"),
        value: value.map(str::to_owned),
        effect,
    }
}

fn tainted(map: &BTreeMap<String, Vec<Taint>>) -> Vec<&str> {
    map.keys().map(String::as_str).collect()
}

#[test]
fn whole_gpu_fault_taints_every_static_mig_device() {
    let (model, migs) = node();
    let mut tr = tracker_for(&model, Policy::default());
    tr.set_mig_instances(0, &migs.iter().map(MigInstance::from).collect::<Vec<_>>());
    tr.event(&xid(0, 79, None), t(1));
    let map = device_taints(&tr, &model);
    assert_eq!(
        tainted(&map),
        ["gpu-0-mig-1g10gb-me-20-0", "gpu-0-mig-3g40gb-9-4"]
    );
    let want = vec![
        taint("gpu-lost", None, TaintEffect::NoSchedule),
        taint("xid", Some("79"), TaintEffect::NoSchedule),
    ];
    assert_eq!(map["gpu-0-mig-3g40gb-9-4"], want);
    assert_eq!(map["gpu-0-mig-1g10gb-me-20-0"], want);
}

#[test]
fn mig_fault_taints_only_its_device() {
    let (model, migs) = node();
    let mut tr = tracker_for(&model, Policy::default());
    tr.set_mig_instances(0, &migs.iter().map(MigInstance::from).collect::<Vec<_>>());
    tr.event(&xid(0, 13, Some(2)), t(1));
    let map = device_taints(&tr, &model);
    assert_eq!(tainted(&map), ["gpu-0-mig-1g10gb-me-20-0"]);
    assert_eq!(
        map["gpu-0-mig-1g10gb-me-20-0"],
        [taint("xid", Some("13"), TaintEffect::None)]
    );
    // A catalog reset XID on the other MIG device: its XID there, the reset
    // on both.
    tr.event(&xid(0, 119, Some(1)), t(2));
    let map = device_taints(&tr, &model);
    assert_eq!(
        map["gpu-0-mig-3g40gb-9-4"],
        [
            taint("reset-required", Some("GPU_RESET"), TaintEffect::NoSchedule),
            taint("xid", Some("119"), TaintEffect::NoSchedule),
        ]
    );
    assert_eq!(
        map["gpu-0-mig-1g10gb-me-20-0"],
        [
            taint("reset-required", Some("GPU_RESET"), TaintEffect::NoSchedule),
            taint("xid", Some("13"), TaintEffect::None),
        ]
    );
    assert!(!map.contains_key("gpu-1"));
}

#[test]
fn shared_gpu_is_tainted_whole() {
    let (model, _) = node();
    let mut tr = tracker_for(&model, Policy::default());
    tr.event(&xid(2, 48, None), t(1));
    let map = device_taints(&tr, &model);
    assert_eq!(tainted(&map), ["gpu-2"]);
    assert_eq!(map["gpu-2"].len(), 2);
}

#[test]
fn whole_gpu_fault_taints_every_dynamic_placement() {
    let inv = inventory(vec![
        gpu(0, HOPPER, Some(mig_info(false, vec![])), &[]),
        gpu(1, HOPPER, Some(mig_info(false, vec![])), &[]),
    ]);
    let model = DeviceModel::build(&inv, &dynamic());
    let on_gpu0: BTreeSet<&str> = model.groups[0]
        .devices
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert!(on_gpu0.len() > 10, "full GPU and placements: {on_gpu0:?}");
    let mut tr = tracker_for(&model, Policy::default());
    let mut poll = HealthPoll::liveness_only(Liveness::Lost);
    tr.poll(0, &poll, t(1));
    let map = device_taints(&tr, &model);
    assert_eq!(
        map.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        on_gpu0
    );
    // A placement's own fault (GI 5 created for a claim on profile 9 at 4).
    poll.liveness = Liveness::Alive;
    tr.poll(0, &poll, t(2));
    tr.tick(t(100));
    assert!(device_taints(&tr, &model).is_empty(), "recovered");
    tr.set_mig_instances(
        1,
        &[MigInstance {
            gpu_instance_id: 5,
            profile_id: 9,
            placement_start: 4,
        }],
    );
    tr.event(&xid(1, 43, Some(5)), t(101));
    let map = device_taints(&tr, &model);
    assert_eq!(tainted(&map), ["gpu-1-mig-3g40gb-9-4"]);
}

#[test]
fn eviction_turns_noschedule_into_noexecute_only() {
    let (model, _) = node();
    let policy = Policy {
        evict: ["gpu-lost".to_owned(), "xid".to_owned()].into(),
        ..Policy::default()
    };
    let mut tr = tracker_for(&model, policy);
    tr.event(&xid(1, 79, None), t(1));
    tr.event(&xid(1, 13, None), t(1));
    tr.unmonitored(1, "refused", t(1));
    let map = device_taints(&tr, &model);
    assert_eq!(
        map["gpu-1"],
        [
            taint("gpu-lost", None, TaintEffect::NoExecute),
            taint("xid", Some("79"), TaintEffect::NoExecute),
            taint("unmonitored", None, TaintEffect::None),
            taint("xid", Some("13"), TaintEffect::None),
        ]
    );
    // Keys not opted in stay NoSchedule.
    tr.event(&xid(2, 119, None), t(1));
    let map = device_taints(&tr, &model);
    assert_eq!(
        map["gpu-2"][0],
        taint("reset-required", Some("GPU_RESET"), TaintEffect::NoSchedule)
    );
    assert_eq!(
        map["gpu-2"][1],
        taint("xid", Some("119"), TaintEffect::NoExecute)
    );
}

#[test]
fn at_most_sixteen_taints_worst_first() {
    let (model, _) = node();
    let policy = Policy {
        ignored_xids: (3000..3020).collect(),
        ..Policy::default()
    };
    let mut tr = tracker_for(&model, policy);
    // 20 informational XIDs first (which also escalate to degraded), then
    // 20 fatal ones, then unmonitored.
    for x in 3000..3020 {
        tr.event(&xid(1, x, None), t(1));
    }
    for x in 2000..2020 {
        tr.event(&xid(1, x, None), t(2));
    }
    tr.unmonitored(1, "refused", t(3));
    let map = device_taints(&tr, &model);
    let list = &map["gpu-1"];
    assert_eq!(list.len(), MAX_TAINTS);
    assert!(list.iter().all(|t| t.effect == TaintEffect::NoSchedule));
    assert_eq!(list[0].value.as_deref(), Some("2000"));
    assert_eq!(list[15].value.as_deref(), Some("2015"));
    let health = device_health(&tr, &model, "pool", t(4));
    let gpu1 = health.iter().find(|h| h.device_name == "gpu-1").unwrap();
    assert_eq!(gpu1.status, HealthStatus::Unhealthy);
    assert!(
        gpu1.message.starts_with(
            "26 taints not published (limit 16): gpu.nvidia.com/xid=2016, \
             gpu.nvidia.com/xid=2017, gpu.nvidia.com/xid=2018, gpu.nvidia.com/xid=2019, \
             gpu.nvidia.com/unmonitored, gpu.nvidia.com/degraded=xid-rate, "
        ),
        "{}",
        gpu1.message
    );
    assert_eq!(gpu1.message.chars().count(), MAX_HEALTH_MESSAGE);
    assert!(gpu1.message.ends_with("..."));
}

#[test]
fn health_of_every_device() {
    let (model, migs) = node();
    let mut ids = ids(&model);
    ids.pop(); // GPU 2 is not watched.
    let mut tr = Tracker::new(Policy::default(), ids, "boot".into(), None, t(0));
    tr.set_mig_instances(0, &migs.iter().map(MigInstance::from).collect::<Vec<_>>());
    tr.event(&xid(0, 119, Some(1)), t(1));
    tr.unmonitored(1, "NVML: Not Supported", t(1));
    let health = device_health(&tr, &model, "node-a", t(5));
    let by_name: BTreeMap<&str, &DeviceHealth> =
        health.iter().map(|h| (h.device_name.as_str(), h)).collect();
    assert_eq!(health.len(), 4, "every published device");
    for h in &health {
        assert_eq!(h.pool_name, "node-a");
        assert_eq!(h.last_updated, t(5));
        assert_eq!(h.health_check_timeout, Some(Duration::from_secs(30)));
    }
    let m = by_name["gpu-0-mig-3g40gb-9-4"];
    assert_eq!(m.status, HealthStatus::Unhealthy);
    assert!(
        m.message.contains("XID 119 at 2026-11-29T12:03:05Z"),
        "{}",
        m.message
    );
    assert_eq!(
        by_name["gpu-0-mig-1g10gb-me-20-0"].status,
        HealthStatus::Unhealthy
    );
    assert_eq!(by_name["gpu-1"].status, HealthStatus::Unknown);
    assert!(by_name["gpu-1"].message.contains("NVML: Not Supported"));
    assert_eq!(by_name["gpu-2"].status, HealthStatus::Unknown);
    assert_eq!(
        by_name["gpu-2"].message,
        "GPU not watched by the health monitor"
    );
    // Informational: Healthy with a message; nothing: Healthy, empty.
    let mut tr = tracker_for(&model, Policy::default());
    tr.event(&xid(1, 13, None), t(1));
    let health = device_health(&tr, &model, "p", t(2));
    let gpu1 = health.iter().find(|h| h.device_name == "gpu-1").unwrap();
    assert_eq!(gpu1.status, HealthStatus::Healthy);
    assert!(gpu1.message.starts_with("XID 13 at "), "{}", gpu1.message);
    let gpu2 = health.iter().find(|h| h.device_name == "gpu-2").unwrap();
    assert_eq!(gpu2.status, HealthStatus::Healthy);
    assert_eq!(gpu2.message, "");
}

#[test]
fn one_fault_raising_two_taints_is_told_once() {
    let (model, _) = node();
    let mut tr = tracker_for(&model, Policy::default());
    tr.event(&xid(1, 79, None), t(1));
    let taints = device_taints(&tr, &model);
    let keys: Vec<&str> = taints["gpu-1"].iter().map(|t| t.key.as_str()).collect();
    assert!(
        keys.contains(&"gpu.nvidia.com/gpu-lost") && keys.contains(&"gpu.nvidia.com/xid"),
        "{keys:?}"
    );
    let health = device_health(&tr, &model, "p", t(2));
    let gpu1 = health.iter().find(|h| h.device_name == "gpu-1").unwrap();
    assert_eq!(gpu1.status, HealthStatus::Unhealthy);
    assert_eq!(
        gpu1.message.matches("XID 79 at ").count(),
        1,
        "{}",
        gpu1.message
    );
}

#[test]
fn messages_are_cut_to_the_kubelet_limit() {
    assert_eq!(cut_message("short"), "short");
    let long = "é".repeat(2000);
    let cut = cut_message(&long);
    assert_eq!(cut.chars().count(), 1024);
    assert!(cut.ends_with("..."));
    let exact = "a".repeat(1024);
    assert_eq!(cut_message(&exact), exact);
}

#[test]
fn taint_values_are_label_values() {
    let (model, _) = node();
    let mut tr = tracker_for(&model, Policy::default());
    tr.event(&xid(1, u64::from(u32::MAX), None), t(1));
    tr.event(
        &event_at(
            1,
            EventKind::RecoveryAction(gpu_nvml::health::RecoveryAction::Other(77)),
            t(1),
        ),
        t(1),
    );
    tr.event(&event_at(1, EventKind::DramRetirementFailure, t(1)), t(1));
    for taints in device_taints(&tr, &model).values() {
        for t in taints {
            assert!(t.key.starts_with("gpu.nvidia.com/"));
            if let Some(v) = &t.value {
                assert!(crate::health::store::is_label_value(v), "{v}");
            }
        }
    }
}

#[test]
fn tainted_slices_hold_at_most_64_devices() {
    // 8 Hopper GPUs under dynamic MIG: far more than 128 devices.
    let model = DeviceModel::build(&dgx_h100(false), &dynamic());
    assert!(model.devices().count() > 128);
    let mut tr = tracker_for(&model, Policy::default());
    tr.event(&xid(3, 48, None), t(1));
    let mut tainted_model = model.clone();
    tainted_model.set_taints(&device_taints(&tr, &model));
    for rules in [SliceRules::V1_34, SliceRules::V1_35] {
        let limits = rules.limits();
        for slice in split(&tainted_model, &limits) {
            if slice.devices.iter().any(|d| !d.taints.is_empty()) {
                assert!(
                    slice.devices.len() <= 64,
                    "{rules}: {}",
                    slice.devices.len()
                );
            }
            for d in &slice.devices {
                assert!(d.taints.len() <= limits.max_taints_per_device);
            }
        }
    }
}

#[test]
fn none_taints_are_dropped_under_134_rules() {
    let (model, _) = node();
    let mut tr = tracker_for(&model, Policy::default());
    // gpu-1: only informational; gpu-2: five taints, one informational.
    tr.event(&xid(1, 13, None), t(1));
    tr.event(&xid(2, 13, None), t(1));
    for x in [48, 62, 95, 119] {
        tr.event(&xid(2, x, None), t(1));
    }
    let mut tainted_model = model.clone();
    tainted_model.set_taints(&device_taints(&tr, &model));
    let find = |slices: &[crate::slices::split::SliceContent], name: &str| {
        slices
            .iter()
            .flat_map(|s| s.devices.iter())
            .find(|d| d.name == name)
            .unwrap()
            .taints
            .clone()
    };
    let old = split(&tainted_model, &SliceRules::V1_34.limits());
    assert!(find(&old, "gpu-1").is_empty(), "None dropped on 1.34");
    let gpu2 = find(&old, "gpu-2");
    assert_eq!(gpu2.len(), 4, "1.34 allows 4 taints, the worst are kept");
    assert_eq!(
        gpu2[0],
        taint("reset-required", Some("GPU_RESET"), TaintEffect::NoSchedule)
    );
    assert!(gpu2.iter().all(|t| t.effect != TaintEffect::None));
    let new = split(&tainted_model, &SliceRules::V1_35.limits());
    assert_eq!(
        find(&new, "gpu-1"),
        [taint("xid", Some("13"), TaintEffect::None)]
    );
    assert_eq!(find(&new, "gpu-2").len(), 6);
    // Without None taints the 1.34 model is not copied and not changed.
    let mut plain = model.clone();
    plain.set_taints(&BTreeMap::new());
    assert_eq!(split(&plain, &SliceRules::V1_34.limits()).len(), 1);
}

#[test]
fn none_effect_in_the_api() {
    let (mut model, _) = node();
    let mut map = BTreeMap::new();
    map.insert(
        "gpu-1".to_owned(),
        vec![taint("degraded", Some("thermal"), TaintEffect::None)],
    );
    model.set_taints(&map);
    let api = crate::devices::k8s::device(model.device("gpu-1").unwrap());
    let taints = api.taints.unwrap();
    assert_eq!(taints[0].effect, "None");
    assert_eq!(taints[0].key, "gpu.nvidia.com/degraded");
    assert_eq!(taints[0].value.as_deref(), Some("thermal"));
}

#[test]
fn every_published_key_is_in_the_shared_table() {
    use crate::health::tracker::{Degradation, Key};
    let keys = [
        Key::HardwareFailure,
        Key::GpuLost,
        Key::RebootRequired,
        Key::ResetRequired,
        Key::Xid(13),
        Key::Unmonitored,
        Key::RemapPending,
        Key::Degraded(Degradation::Thermal),
    ];
    for key in keys {
        let full = format!("{KEY_DOMAIN}/{}", key.short());
        let entry = gpu_dra_api::health::lookup(&full).expect(&full);
        let effect = if key.blocks(true) {
            "NoSchedule"
        } else {
            "None"
        };
        assert!(
            entry.default_effect.contains(effect),
            "{full}: {}",
            entry.default_effect
        );
        assert!(
            crate::health::classify::evictable_keys().any(|k| k == key.short()) == key.blocks(true)
        );
    }
    assert_eq!(gpu_dra_api::health::KEYS.len(), keys.len());
}

/// A small deterministic generator (xorshift), so the random history is the
/// same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random fault histories on the static-MIG node: whatever happens, the
/// published taints stay within the API limits, every message within the
/// stream's, and what the tracker saves is accepted by the store and
/// restores the same conditions.
#[test]
fn random_histories_keep_every_limit() {
    use gpu_nvml::health::{LinkState, RecoveryAction, RemapState};
    let (model, migs) = node();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("health.json");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut tr = tracker_for(&model, Policy::default());
    tr.set_mig_instances(0, &migs.iter().map(MigInstance::from).collect::<Vec<_>>());
    let mut now = 0_u64;
    let mut most = 0;
    for step in 0..4_000 {
        // Mostly forward, sometimes back a little (clock adjustments).
        now = if rng.below(50) == 0 {
            now.saturating_sub(rng.below(30))
        } else {
            now + rng.below(20)
        };
        let gpu = u32::try_from(rng.below(4)).unwrap(); // 3 is unknown
        let at = t(now);
        match rng.below(10) {
            0..=3 => {
                let xid = [13, 31, 43, 48, 63, 74, 79, 94, 109, 119, 999, 4_294_967_295]
                    [usize::try_from(rng.below(12)).unwrap()];
                let gi = match rng.below(4) {
                    0 => Some(1),
                    1 => Some(2),
                    2 => Some(u32::try_from(rng.below(10)).unwrap()),
                    _ => None,
                };
                tr.event(&xid_at(gpu, xid, gi, at), at);
            }
            4 => {
                let kind = match rng.below(7) {
                    0 => EventKind::DoubleBitEcc,
                    1 => EventKind::SingleBitEcc,
                    2 => EventKind::GpuUnavailable,
                    3 => EventKind::DramRetirement,
                    4 if rng.below(20) == 0 => EventKind::DramRetirementFailure,
                    5 => EventKind::FatalPoison,
                    _ => EventKind::RecoveryAction(RecoveryAction::from_raw(
                        u32::try_from(rng.below(9)).unwrap(),
                    )),
                };
                tr.event(&event_at(gpu, kind, at), at);
            }
            5..=7 => {
                let poll = HealthPoll {
                    liveness: match rng.below(10) {
                        0 => Liveness::Lost,
                        1 => Liveness::ResetRequired,
                        2 => Liveness::Error("Unknown Error\nline two".into()),
                        _ => Liveness::Alive,
                    },
                    recovery_action: (rng.below(3) != 0)
                        .then(|| RecoveryAction::from_raw(u32::try_from(rng.below(9)).unwrap())),
                    remap: (rng.below(2) == 0).then(|| RemapState {
                        pending: rng.below(5) == 0,
                        failure: rng.below(200) == 0,
                    }),
                    retired_pages_pending: (rng.below(3) == 0).then(|| rng.below(5) == 0),
                    volatile_uncorrected_ecc: (rng.below(2) == 0).then(|| rng.below(4)),
                    hw_slowdown: Some(rng.below(10) == 0),
                    thermal_slowdown: Some(rng.below(10) == 0),
                    pcie_replays: Some(rng.below(1000)),
                    nvlinks: (0..4)
                        .map(|link| LinkState {
                            link,
                            active: rng.below(8) != 0,
                        })
                        .collect(),
                };
                tr.poll(gpu, &poll, at);
            }
            8 => tr.tick(at),
            _ => match rng.below(3) {
                0 => tr.unmonitored(gpu, "refused", at),
                1 => tr.monitored(gpu),
                _ => {
                    let _ = tr.clear_hardware_failure("GPU-00000000-aaaa-bbbb-cccc-dddddddddddd");
                }
            },
        }
        let _ = tr.take_transitions();
        let taints = device_taints(&tr, &model);
        for (device, list) in &taints {
            assert!(list.len() <= MAX_TAINTS, "{step}: {device}");
            most = most.max(list.len());
            for taint in list {
                if let Some(v) = &taint.value {
                    assert!(crate::health::store::is_label_value(v), "{step}: {v}");
                }
            }
        }
        for h in device_health(&tr, &model, "p", at) {
            assert!(h.message.chars().count() <= MAX_HEALTH_MESSAGE, "{step}");
            assert!(!h.message.contains('\n'), "{step}: {}", h.message);
        }
        if step % 200 == 0 {
            let store = HealthStore::open(&path).unwrap().0;
            store.save(&tr.saved()).unwrap();
            let (store, saved) = HealthStore::open(&path).unwrap();
            assert!(
                store.load_error().is_none(),
                "{step}: {:?}",
                store.load_error()
            );
            let restored = Tracker::new(Policy::default(), ids(&model), "boot".into(), saved, at);
            let view = |tr: &Tracker| {
                tr.conditions()
                    .into_iter()
                    .map(|r| {
                        r.conditions
                            .into_iter()
                            .map(|c| (c.scope, c.key, c.taint_value(), c.blocks()))
                            .collect::<Vec<_>>()
                    })
                    .collect::<Vec<_>>()
            };
            assert_eq!(view(&restored), view(&tr), "{step}");
            assert_eq!(device_taints(&restored, &model), taints, "{step}");
        }
    }
    assert!(
        most >= 8,
        "the history reached the interesting cases: {most}"
    );
}

/// The pcie-a100-bridged node with `--passthrough`: each GPU `gpu-<i>` has
/// its VFIO sibling `gpu-vfio-<i>`.
fn passthrough_node() -> DeviceModel {
    let inv = crate::devices::fixtures::pcie_a100_bridged();
    let pci_ids = inv
        .gpus
        .iter()
        .map(|g| {
            (
                g.info.pci_bus_id.clone(),
                crate::vfio::PciIds {
                    vendor: "0x10de".into(),
                    device: "0x20f1".into(),
                },
            )
        })
        .collect();
    let options = BuildOptions {
        passthrough: Some(crate::vfio::Passthrough {
            iommu_fd: false,
            pci_ids,
        }),
        ..BuildOptions::default()
    };
    let model = DeviceModel::build(&inv, &options);
    let names: Vec<&str> = model.devices().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpu-0",
            "gpu-vfio-0",
            "gpu-1",
            "gpu-vfio-1",
            "gpu-2",
            "gpu-vfio-2",
            "gpu-3",
            "gpu-vfio-3"
        ]
    );
    model
}

#[test]
fn whole_gpu_fault_taints_the_vfio_sibling_and_its_health() {
    let model = passthrough_node();
    let mut ids = ids(&model);
    ids.pop(); // GPU 3 is not watched (not probed).
    let mut tr = Tracker::new(Policy::default(), ids, "boot".into(), None, t(0));
    tr.event(&xid(1, 79, None), t(1));
    let map = device_taints(&tr, &model);
    assert_eq!(tainted(&map), ["gpu-1", "gpu-vfio-1"]);
    assert_eq!(map["gpu-vfio-1"], map["gpu-1"]);
    assert_eq!(
        map["gpu-vfio-1"],
        [
            taint("gpu-lost", None, TaintEffect::NoSchedule),
            taint("xid", Some("79"), TaintEffect::NoSchedule),
        ]
    );

    let health = device_health(&tr, &model, "node-a", t(2));
    assert_eq!(health.len(), 8, "every published device: {health:#?}");
    let by_name: BTreeMap<&str, &DeviceHealth> =
        health.iter().map(|h| (h.device_name.as_str(), h)).collect();
    let vfio1 = by_name["gpu-vfio-1"];
    assert_eq!(vfio1.status, HealthStatus::Unhealthy);
    assert_eq!(vfio1.message, by_name["gpu-1"].message);
    assert!(vfio1.message.contains("XID 79"), "{}", vfio1.message);
    assert_eq!(by_name["gpu-vfio-0"].status, HealthStatus::Healthy);
    assert_eq!(by_name["gpu-vfio-3"].status, HealthStatus::Unknown);
    assert_eq!(
        by_name["gpu-vfio-3"].message,
        "GPU not watched by the health monitor"
    );

    // A GPU whose events cannot be watched: its VFIO sibling is Unknown too.
    tr.unmonitored(2, "NVML: Not Supported", t(3));
    let health = device_health(&tr, &model, "node-a", t(4));
    let vfio2 = health
        .iter()
        .find(|h| h.device_name == "gpu-vfio-2")
        .unwrap();
    assert_eq!(vfio2.status, HealthStatus::Unknown);
    assert!(vfio2.message.contains("NVML: Not Supported"));
}

#[test]
fn a_gpu_on_vfio_pci_is_unknown_untainted_and_keeps_earlier_faults() {
    let model = passthrough_node();
    let mut tr = tracker_for(&model, Policy::default());
    tr.event(&xid(2, 13, None), t(1));
    tr.bound_elsewhere(0, Some("vfio-pci"));
    tr.bound_elsewhere(2, Some("vfio-pci"));
    let map = device_taints(&tr, &model);
    assert_eq!(
        tainted(&map),
        ["gpu-2", "gpu-vfio-2"],
        "only the XID's taint, none for being handed to a VM: {map:?}"
    );
    let health = device_health(&tr, &model, "node-a", t(2));
    let by_name: BTreeMap<&str, &DeviceHealth> =
        health.iter().map(|h| (h.device_name.as_str(), h)).collect();
    for name in ["gpu-0", "gpu-vfio-0"] {
        let h = by_name[name];
        assert_eq!(h.status, HealthStatus::Unknown, "{name}");
        assert!(
            h.message
                .starts_with("not probed: the GPU is bound to vfio-pci"),
            "{name}: {}",
            h.message
        );
    }
    // An informational fault from before: Unknown, both messages.
    let vfio2 = by_name["gpu-vfio-2"];
    assert_eq!(vfio2.status, HealthStatus::Unknown);
    assert!(
        vfio2.message.contains("vfio-pci") && vfio2.message.contains("XID 13"),
        "{}",
        vfio2.message
    );
    assert_eq!(by_name["gpu-vfio-1"].status, HealthStatus::Healthy);
    assert_eq!(by_name["gpu-vfio-1"].message, "");

    // A fatal fault from before stays Unhealthy, the hand-over told after.
    tr.event(&xid(2, 79, None), t(3));
    let health = device_health(&tr, &model, "node-a", t(4));
    let vfio2 = health
        .iter()
        .find(|h| h.device_name == "gpu-vfio-2")
        .unwrap();
    assert_eq!(vfio2.status, HealthStatus::Unhealthy);
    assert!(
        vfio2.message.contains("XID 79") && vfio2.message.ends_with("cannot reach it"),
        "{}",
        vfio2.message
    );
    assert!(vfio2.message.chars().count() <= MAX_HEALTH_MESSAGE);
}
