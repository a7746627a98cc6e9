use super::*;
use crate::devices::fixtures::*;
use crate::devices::{BuildOptions, DeviceModel};
use crate::slices::SliceRules;
use crate::slices::split::split;

fn owner() -> PoolOwner {
    PoolOwner {
        node: "node-a".into(),
        driver: "gpu.nvidia.com".into(),
        node_uid: "uid-1".into(),
    }
}

fn desired(inv: &crate::discovery::Inventory, dynamic_mig: bool) -> Vec<ResourceSlice> {
    let rules = SliceRules::V1_35;
    let model = DeviceModel::build(
        inv,
        &BuildOptions {
            dynamic_mig,
            group_limits: rules.group_limits(),
            ..BuildOptions::default()
        },
    );
    build_slices(&owner(), &split(&model, &rules.limits()), 0)
}

/// A stand-in for the API server's storage: applies plans, bumps
/// resourceVersions, and may transform what it stores.
#[derive(Default)]
struct Store {
    objects: BTreeMap<String, ResourceSlice>,
    rv: u64,
    writes: usize,
    transform: Option<fn(&mut ResourceSlice)>,
}

impl Store {
    fn put(&mut self, mut s: ResourceSlice) -> String {
        self.rv += 1;
        if let Some(t) = self.transform {
            t(&mut s);
        }
        s.metadata.resource_version = Some(self.rv.to_string());
        self.objects.insert(s.metadata.name.clone().unwrap(), s);
        self.rv.to_string()
    }

    fn run(&mut self, plan: &Plan, desired: &[ResourceSlice], state: &mut PoolState) {
        for op in plan.ops() {
            self.writes += 1;
            match op {
                Op::Apply(i) => {
                    let s = &desired[*i];
                    let rv = self.put(s.clone());
                    record_write(state, &Wanted::of(s), s.spec.pool.generation, Some(rv));
                }
                Op::Delete(name) => {
                    self.objects.remove(name);
                    record_delete(state, name);
                }
            }
        }
    }

    fn list(&self) -> Vec<ResourceSlice> {
        self.objects.values().cloned().collect()
    }

    fn reconcile(&mut self, desired: &[ResourceSlice], state: &mut PoolState) -> Plan {
        let mut desired = desired.to_vec();
        let observed: Vec<Observed> = self.list().iter().filter_map(Observed::of).collect();
        let plan = plan(&mut desired, &observed, state);
        assert!(
            desired
                .iter()
                .all(|d| d.spec.pool.generation == plan.generation),
            "plan sets the generation of every desired slice"
        );
        self.run(&plan, &desired, state);
        plan
    }

    fn generations(&self) -> Vec<(i64, i64)> {
        self.objects
            .values()
            .map(|s| (s.spec.pool.generation, s.spec.pool.resource_slice_count))
            .collect()
    }
}

#[test]
fn first_publication_then_nothing_to_do() {
    let want = desired(&dgx_h100(false), true);
    assert_eq!(want.len(), 5);
    let mut store = Store::default();
    let mut state = PoolState::default();
    let plan = store.reconcile(&want, &mut state);
    assert_eq!(plan.generation, 0);
    assert_eq!(plan.len(), 5);
    assert_eq!(store.generations(), vec![(0, 5); 5]);
    // No change: no write.
    let again = store.reconcile(&want, &mut state);
    assert!(again.is_empty(), "{:?}", again.waves);
    assert_eq!(store.writes, 5);
    let names: Vec<&str> = store.objects.keys().map(String::as_str).collect();
    assert_eq!(names[0], "node-a-gpu.nvidia.com-0");
    let s = &store.objects["node-a-gpu.nvidia.com-0"];
    assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
    assert_eq!(s.spec.pool.name, "node-a");
    let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Node", "uid-1", Some(true))
    );
}

#[test]
fn a_restart_with_the_same_gpus_adopts_the_pool() {
    let want = desired(&dgx_h100(false), true);
    let mut store = Store::default();
    let mut state = PoolState::default();
    store.reconcile(&want, &mut state);
    // Bump the generation to something non-trivial first.
    let other = desired(&dgx_h100(false), false);
    store.reconcile(&other, &mut state);
    store.reconcile(&want, &mut state);
    let before = store.list();
    let writes = store.writes;

    let mut fresh = PoolState::default();
    let plan = store.reconcile(&want, &mut fresh);
    assert!(plan.is_empty(), "{:?}", plan.waves);
    assert_eq!(plan.generation, 2);
    assert_eq!(store.writes, writes);
    assert_eq!(store.list(), before);
}

#[test]
fn a_restart_with_other_gpus_moves_above_the_old_generation() {
    let mut store = Store::default();
    let mut state = PoolState::default();
    store.reconcile(&desired(&dgx_h100(false), true), &mut state);
    store.reconcile(&desired(&dgx_h100(false), false), &mut state);
    let mut fresh = PoolState::default();
    let want = desired(&pcie_a100_bridged(), false);
    let plan = store.reconcile(&want, &mut fresh);
    assert_eq!(plan.generation, 2);
    assert_eq!(store.generations(), [(2, 1)]);
}

#[test]
fn new_content_bumps_every_slice_and_deletes_surplus_last() {
    let mut store = Store::default();
    let mut state = PoolState::default();
    store.reconcile(&desired(&dgx_h100(false), true), &mut state);
    let plan = store.reconcile(&desired(&dgx_h100(false), false), &mut state);
    assert_eq!(plan.generation, 1);
    let kinds: Vec<&str> = plan
        .ops()
        .map(|o| match o {
            Op::Apply(_) => "apply",
            Op::Delete(_) => "delete",
        })
        .collect();
    assert_eq!(kinds, ["apply", "delete", "delete", "delete", "delete"]);
    assert_eq!(store.generations(), [(1, 1)]);
}

#[test]
fn deleted_slices_come_back_at_the_same_generation() {
    let want = desired(&dgx_h100(false), true);
    let mut store = Store::default();
    let mut state = PoolState::default();
    store.reconcile(&want, &mut state);
    store.objects.remove("node-a-gpu.nvidia.com-2");
    let plan = store.reconcile(&want, &mut state);
    assert_eq!(plan.generation, 0);
    assert_eq!(plan.ops().collect::<Vec<_>>(), [&Op::Apply(2)]);
    assert_eq!(
        want[2].metadata.name.as_deref(),
        Some("node-a-gpu.nvidia.com-2")
    );
    assert!(store.objects.contains_key("node-a-gpu.nvidia.com-2"));
    // Kubelet restart: everything gone.
    store.objects.clear();
    let plan = store.reconcile(&want, &mut state);
    assert_eq!((plan.generation, plan.len()), (0, 5));
}

#[test]
fn drift_is_repaired() {
    let want = desired(&dgx_h100(false), false);
    let mut store = Store::default();
    let mut state = PoolState::default();
    store.reconcile(&want, &mut state);
    let name = "node-a-gpu.nvidia.com-0".to_owned();
    let mut tampered = store.objects[&name].clone();
    tampered.spec.devices.as_mut().unwrap().pop();
    store.put(tampered);
    let plan = store.reconcile(&want, &mut state);
    assert_eq!((plan.generation, plan.len()), (0, 1));
    assert_eq!(store.objects[&name].spec.devices.as_ref().unwrap().len(), 8);

    // Someone raises the generation: we rewrite above it.
    let mut tampered = store.objects[&name].clone();
    tampered.spec.pool.generation = 7;
    store.put(tampered);
    let plan = store.reconcile(&want, &mut state);
    assert_eq!(plan.generation, 8);
    assert_eq!(store.generations(), [(8, 1)]);
}

#[test]
fn foreign_slices_of_the_node_and_driver_are_deleted() {
    let want = desired(&pcie_a100_bridged(), false);
    let mut store = Store::default();
    let mut stray = want[0].clone();
    stray.metadata.name = Some("node-a-gpu.nvidia.com-abcde".into());
    stray.spec.pool.name = "old-pool".into();
    stray.spec.pool.generation = 40;
    store.put(stray);
    let mut state = PoolState::default();
    let plan = store.reconcile(&want, &mut state);
    // Another pool's generation does not count.
    assert_eq!(plan.generation, 0);
    assert_eq!(
        plan.ops().last(),
        Some(&Op::Delete("node-a-gpu.nvidia.com-abcde".into()))
    );
    assert_eq!(store.objects.len(), 1);
}

#[test]
fn immutable_differences_are_recreated() {
    let want = desired(&pcie_a100_bridged(), false);
    let mut store = Store::default();
    let mut wrong = want[0].clone();
    wrong.spec.pool.name = "other".into();
    store.put(wrong);
    let mut state = PoolState::default();
    let plan = store.reconcile(&want, &mut state);
    assert_eq!(
        plan.waves,
        [
            vec![Op::Delete("node-a-gpu.nvidia.com-0".into())],
            vec![Op::Apply(0)]
        ]
    );
    assert_eq!(
        store.objects["node-a-gpu.nvidia.com-0"].spec.pool.name,
        "node-a"
    );
}

#[test]
fn server_normalisation_is_not_drift() {
    let want = desired(&dgx_h100(false), true);
    let mut store = Store {
        transform: Some(|s: &mut ResourceSlice| {
            // Canonical quantity forms and server-set taint times.
            for d in s.spec.devices.iter_mut().flatten() {
                for c in d.capacity.iter_mut().flat_map(|m| m.values_mut()) {
                    if let Some(n) = k8s::quantity_nanos(&c.value.0)
                        && n != 0
                        && n % (1024 * 1_000_000_000) == 0
                    {
                        c.value.0 = format!("{}Ki", n / 1024 / 1_000_000_000);
                    }
                }
            }
            s.spec.per_device_node_selection = None;
        }),
        ..Default::default()
    };
    let mut state = PoolState::default();
    store.reconcile(&want, &mut state);
    assert!(
        store
            .objects
            .values()
            .any(|s| s.spec.devices.iter().flatten().any(|d| {
                d.capacity.as_ref().unwrap()["memory"]
                    .value
                    .0
                    .ends_with("Ki")
            }))
    );
    // A fresh state compares by value only.
    let mut fresh = PoolState::default();
    assert!(store.reconcile(&want, &mut fresh).is_empty());
}

#[test]
fn dropped_fields_do_not_cause_endless_rewrites() {
    // An API server with DRAPartitionableDevices off drops counters.
    let want = desired(&dgx_h100(false), true);
    let mut store = Store {
        transform: Some(|s: &mut ResourceSlice| {
            s.spec.shared_counters = None;
            for d in s.spec.devices.iter_mut().flatten() {
                d.consumes_counters = None;
            }
        }),
        ..Default::default()
    };
    let mut state = PoolState::default();
    store.reconcile(&want, &mut state);
    let writes = store.writes;
    assert!(store.reconcile(&want, &mut state).is_empty());
    assert_eq!(store.writes, writes);
    // A real change by someone else (new resourceVersion) is still repaired.
    let name = "node-a-gpu.nvidia.com-1".to_owned();
    let mut tampered = store.objects[&name].clone();
    tampered.spec.devices = None;
    store.put(tampered);
    assert_eq!(store.reconcile(&want, &mut state).len(), 1);
}

#[test]
fn slice_names_stay_valid_for_long_node_names() {
    let node = "n".repeat(240);
    let name = slice_name(&node, "gpu.nvidia.com", 12);
    assert!(name.len() <= 253);
    assert!(name.starts_with("gpu-dra-") && name.ends_with("-12"));
    assert_eq!(name, slice_name(&node, "gpu.nvidia.com", 12));
    assert_ne!(name, slice_name(&node, "other.example.com", 12));
    assert_eq!(slice_name("a", "b.c", 0), "a-b.c-0");
    assert_eq!(
        field_selector("a", "b.c"),
        "spec.nodeName=a,spec.driver=b.c"
    );
}

#[test]
fn comparable_ignores_spelling_but_not_values() {
    let want = desired(&pcie_a100_bridged(), false);
    let mut respelled = want[0].clone();
    for d in respelled.spec.devices.iter_mut().flatten() {
        let cap = d.capacity.as_mut().unwrap().get_mut("memory").unwrap();
        cap.value.0 = "40Gi".into();
    }
    assert_eq!(comparable(&respelled), comparable(&want[0]));
    let mut changed = want[0].clone();
    changed.spec.devices.as_mut().unwrap()[0]
        .capacity
        .as_mut()
        .unwrap()
        .get_mut("memory")
        .unwrap()
        .value
        .0 = "39Gi".into();
    assert_ne!(comparable(&changed), comparable(&want[0]));
    let mut owner_changed = want[0].clone();
    owner_changed.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-2".into();
    assert_ne!(comparable(&owner_changed), comparable(&want[0]));
}

#[test]
fn counter_set_slices_come_in_a_wave_before_device_slices() {
    let want = desired(&dgx_h100(false), true);
    let mut store = Store::default();
    let mut state = PoolState::default();
    let plan = store.reconcile(&want, &mut state);
    // 1.35: slice 0 holds the 8 counter sets, slices 1-4 the devices.
    assert!(want[0].spec.devices.is_none() && want[0].spec.shared_counters.is_some());
    assert_eq!(
        plan.waves,
        [
            vec![Op::Apply(0)],
            vec![Op::Apply(1), Op::Apply(2), Op::Apply(3), Op::Apply(4)]
        ]
    );
    // 1.34: counter sets travel with their devices, one wave.
    let rules = SliceRules::V1_34;
    let model = DeviceModel::build(
        &dgx_h100(false),
        &BuildOptions {
            dynamic_mig: true,
            group_limits: rules.group_limits(),
            ..BuildOptions::default()
        },
    );
    let want = build_slices(&owner(), &split(&model, &rules.limits()), 0);
    let plan = Store::default().reconcile(&want, &mut PoolState::default());
    assert_eq!(plan.waves.len(), 1);
    assert_eq!(plan.len(), want.len());
}

#[test]
fn a_slice_at_another_generation_is_not_in_sync() {
    let want = desired(&pcie_a100_bridged(), false);
    let mut store = Store::default();
    let mut state = PoolState::default();
    store.reconcile(&want, &mut state);
    // Same content, older generation (someone wrote it back): rewritten.
    let name = "node-a-gpu.nvidia.com-0".to_owned();
    let mut old = store.objects[&name].clone();
    old.spec.pool.generation = -1;
    store.put(old);
    let plan = store.reconcile(&want, &mut state);
    assert_eq!((plan.generation, plan.len()), (0, 1));
    assert_eq!(store.generations(), [(0, 1)]);
}

#[test]
fn the_state_keeps_digests_not_copies() {
    let want = desired(&dgx_h100(false), true);
    let mut store = Store::default();
    let mut state = PoolState::default();
    store.reconcile(&want, &mut state);
    let (generation, content) = state.published.as_ref().unwrap();
    assert_eq!((*generation, content.len()), (0, 5));
    assert_eq!(content[3], comparable(&want[3]));
    assert_eq!(state.written.len(), 5);
    let w = &state.written["node-a-gpu.nvidia.com-1"];
    assert_eq!((w.generation, w.content), (0, comparable(&want[1])));
    // The whole state is a few hundred bytes, whatever the pool's size.
    let bytes = std::mem::size_of::<Digest>() * content.len()
        + state
            .written
            .iter()
            .map(|(k, w)| k.len() + w.resource_version.len() + std::mem::size_of::<Written>())
            .sum::<usize>();
    assert!(bytes < 1024, "{bytes}");
    // A deletion forgets the write.
    record_delete(&mut state, "node-a-gpu.nvidia.com-1");
    assert!(!state.written.contains_key("node-a-gpu.nvidia.com-1"));
    // An answer without a resourceVersion forgets it too.
    record_write(&mut state, &Wanted::of(&want[2]), 0, None);
    assert!(!state.written.contains_key("node-a-gpu.nvidia.com-2"));
}

#[test]
fn comparable_ignores_the_generation_only() {
    let want = desired(&dgx_h100(false), false);
    let mut other = want[0].clone();
    other.spec.pool.generation = 12;
    assert_eq!(comparable(&other), comparable(&want[0]));
    other.spec.pool.resource_slice_count = 2;
    assert_ne!(comparable(&other), comparable(&want[0]));
}

#[test]
fn summaries_carry_what_the_plan_compares() {
    let want = desired(&dgx_h100(false), true);
    let mut on_server = want[1].clone();
    on_server.metadata.resource_version = Some("7".into());
    on_server.spec.pool.generation = 4;
    let o = Observed::of(&on_server).unwrap();
    assert_eq!(
        (
            o.name.as_str(),
            o.resource_version.as_deref(),
            o.generation,
            o.pool.as_str(),
            o.driver.as_str(),
            o.node_name.as_deref()
        ),
        (
            "node-a-gpu.nvidia.com-1",
            Some("7"),
            4,
            "node-a",
            "gpu.nvidia.com",
            Some("node-a")
        )
    );
    let w = Wanted::of(&want[1]);
    assert_eq!(o.content, w.content);
    assert!(w.has_devices && !Wanted::of(&want[0]).has_devices);
    on_server.metadata.name = None;
    assert_eq!(Observed::of(&on_server), None);
    // plan_wanted on summaries decides as plan does on slices.
    let mut store = Store::default();
    let mut state = PoolState::default();
    store.reconcile(&want, &mut state);
    let observed: Vec<Observed> = store.list().iter().filter_map(Observed::of).collect();
    let wanted: Vec<Wanted> = want.iter().map(Wanted::of).collect();
    let mut trial = state.clone();
    assert!(plan_wanted(&wanted, &observed, &mut trial).is_empty());
    assert_eq!(trial, state);
    let fewer = &observed[1..];
    let p = plan_wanted(&wanted, fewer, &mut state.clone());
    assert_eq!(p.ops().collect::<Vec<_>>(), [&Op::Apply(0)]);
}

#[test]
fn a_taint_is_written_in_place_to_its_slice_only() {
    use crate::devices::{Taint, TaintEffect};
    let rules = SliceRules::V1_35;
    let inv = dgx_h100(false);
    let options = BuildOptions {
        dynamic_mig: true,
        group_limits: rules.group_limits(),
        ..BuildOptions::default()
    };
    let mut store = Store::default();
    let mut state = PoolState::default();
    let clean = desired(&inv, true);
    store.reconcile(&clean, &mut state);
    assert_eq!(store.generations(), vec![(0, 5); 5]);

    // A health taint on the devices of one GPU: same slices, same devices.
    let mut model = DeviceModel::build(&inv, &options);
    let taint = Taint {
        key: "gpu.nvidia.com/gpu-lost".into(),
        value: None,
        effect: TaintEffect::NoSchedule,
    };
    let tainted: BTreeMap<String, Vec<Taint>> = model.groups[0]
        .devices
        .iter()
        .map(|d| (d.name.clone(), vec![taint.clone()]))
        .collect();
    model.set_taints(&tainted);
    let slices = build_slices(&owner(), &split(&model, &rules.limits()), 0);
    let changed = slices
        .iter()
        .zip(&clean)
        .filter(|(a, b)| comparable(a) != comparable(b))
        .count();
    assert_eq!(changed, 1, "the GPU's devices share one slice");
    let writes = store.writes;
    let plan = store.reconcile(&slices, &mut state);
    assert_eq!((plan.generation, plan.len()), (0, 1));
    assert_eq!(store.writes - writes, 1);
    assert_eq!(store.generations(), vec![(0, 5); 5]);

    // Cleared again: in place too.
    let plan = store.reconcile(&clean, &mut state);
    assert_eq!((plan.generation, plan.len()), (0, 1));
    // A change of layout (other devices) still bumps every slice.
    let plan = store.reconcile(&desired(&inv, false), &mut state);
    assert_eq!(plan.generation, 1);
}
