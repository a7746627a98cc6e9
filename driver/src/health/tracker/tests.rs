//! Unit tests of the `tracker` module: whole fault histories on a fake
//! clock: sticky fatal versus expiring informational, escalation, MIG
//! attribution, recovery after the quiet time, boot id changes, the polled
//! conditions and the checkpointed state.

use gpu_nvml::health::{EventKind, LinkState, Liveness, RemapState};

use super::super::classify::XidSet;
use super::super::testing::{event_at, t, xid_at};
use super::*;

const BOOT: &str = "boot-1";

fn gpus() -> Vec<GpuId> {
    (0..2)
        .map(|i| GpuId {
            index: i,
            minor: i + 4,
            uuid: format!("GPU-{i}"),
        })
        .collect()
}

fn tracker() -> Tracker {
    let mut tr = Tracker::new(Policy::default(), gpus(), BOOT.into(), None, t(0));
    assert!(tr.changed(), "a new tracker reports once");
    assert!(tr.take_transitions().is_empty());
    tr
}

fn xid(gpu: u32, xid: u64, gi: Option<u32>, at: u64) -> HealthEvent {
    xid_at(gpu, xid, gi, t(at))
}

fn event(gpu: u32, kind: EventKind, at: u64) -> HealthEvent {
    event_at(gpu, kind, t(at))
}

/// A poll of an old driver: nothing but liveness.
fn old_driver() -> HealthPoll {
    HealthPoll::liveness_only(Liveness::Alive)
}

/// The (scope, key, taint value, blocks) of GPU `i`'s conditions.
fn active(tr: &Tracker, i: usize) -> Vec<(Scope, Key, Option<String>, bool)> {
    tr.conditions()[i]
        .conditions
        .iter()
        .map(|c| (c.scope, c.key, c.taint_value(), c.blocks()))
        .collect()
}

/// A GPU-wide condition as [`active`] lists it.
fn on_gpu(key: Key, value: Option<&str>, blocks: bool) -> (Scope, Key, Option<String>, bool) {
    (Scope::Gpu, key, value.map(str::to_owned), blocks)
}

fn keys(tr: &Tracker, i: usize) -> Vec<Key> {
    active(tr, i).into_iter().map(|c| c.1).collect()
}

#[test]
fn fatal_xid_without_recovery_action_needs_a_reset() {
    let mut tr = tracker();
    tr.event(&xid(0, 119, None, 1), t(1));
    assert_eq!(
        active(&tr, 0),
        [
            on_gpu(Key::ResetRequired, Some("GPU_RESET"), true),
            on_gpu(Key::Xid(119), Some("119"), true),
        ]
    );
    assert!(keys(&tr, 1).is_empty(), "the other GPU is untouched");
    assert!(tr.changed());
    assert!(!tr.changed(), "once");
    let report = &tr.conditions()[0];
    assert_eq!(report.state, HealthState::Unhealthy);
    assert_eq!(
        report.taint_keys(),
        ["gpu.nvidia.com/reset-required", "gpu.nvidia.com/xid"]
    );
    let xid_message = &report.conditions[1].message;
    assert_eq!(
        xid_message,
        "XID 119 at 2026-11-29T12:03:06Z; fatal (XID catalog)"
    );
    let tr_list = tr.take_transitions();
    assert_eq!(tr_list.len(), 1);
    assert_eq!(tr_list[0].uuid, "GPU-0");
    assert_eq!(tr_list[0].minor, 4);
    assert_eq!(tr_list[0].from, HealthState::Healthy);
    assert_eq!(tr_list[0].to, HealthState::Unhealthy);
    assert_eq!(tr_list[0].reason, "GpuUnhealthy");
    assert!(
        tr_list[0].message.contains("XID 119"),
        "{}",
        tr_list[0].message
    );
    assert!(tr.take_transitions().is_empty());
}

#[test]
fn recovery_action_classifies_and_names_the_reset() {
    let mut tr = tracker();
    let mut poll = HealthPoll::healthy();
    poll.recovery_action = Some(RecoveryAction::DrainAndReset);
    tr.poll(0, &poll, t(1));
    tr.event(&xid(0, 94, None, 2), t(2));
    assert_eq!(
        active(&tr, 0),
        [
            on_gpu(Key::ResetRequired, Some("DRAIN_AND_RESET"), true),
            on_gpu(Key::Xid(94), Some("94"), true),
        ]
    );
    let msg = &tr.conditions()[0].conditions[1].message;
    assert_eq!(
        msg,
        "XID 94 at 2026-11-29T12:03:07Z; recovery action DRAIN_AND_RESET"
    );
    // Without an action (no poll yet), the catalog: informational.
    tr.event(&xid(1, 94, None, 3), t(3));
    assert_eq!(active(&tr, 1), [on_gpu(Key::Xid(94), Some("94"), false)]);
    assert_eq!(tr.conditions()[1].state, HealthState::Degraded);
}

#[test]
fn informational_xid_expires_after_the_ttl() {
    let mut tr = tracker();
    tr.event(&xid(0, 13, None, 0), t(0));
    assert_eq!(active(&tr, 0), [on_gpu(Key::Xid(13), Some("13"), false)]);
    assert_eq!(tr.take_transitions()[0].reason, "GpuDegraded");
    assert!(tr.changed());
    tr.tick(t(3599));
    assert_eq!(keys(&tr, 0), [Key::Xid(13)]);
    assert!(!tr.changed());
    // Seen again: the TTL counts from the last one.
    tr.event(&xid(0, 13, None, 1800), t(1800));
    assert!(!tr.changed(), "a repeat changes no taint");
    tr.tick(t(3600));
    assert_eq!(keys(&tr, 0), [Key::Xid(13)]);
    tr.tick(t(1800 + 3600));
    assert!(keys(&tr, 0).is_empty());
    assert!(tr.changed());
    let back = tr.take_transitions();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].reason, "GpuRecovered");
    assert_eq!(back[0].to, HealthState::Healthy);
}

#[test]
fn fatal_is_sticky_against_later_informational_xids() {
    let mut tr = tracker();
    let mut reset = HealthPoll::healthy();
    reset.recovery_action = Some(RecoveryAction::GpuReset);
    // Ignored by default: informational even under a reset action.
    tr.poll(0, &reset, t(0));
    tr.event(&xid(0, 31, None, 1), t(1));
    assert!(active(&tr, 0).contains(&on_gpu(Key::Xid(31), Some("31"), false)));
    let p = Policy {
        fatal_xids: XidSet::Some([31].into()),
        ..Policy::default()
    };
    let mut tr2 = Tracker::new(p, gpus(), BOOT.into(), None, t(0));
    tr2.event(&xid(0, 31, None, 1), t(1));
    assert_eq!(active(&tr2, 0), [on_gpu(Key::Xid(31), Some("31"), true)]);
    // A later informational XID 45 does not touch the fatal 31, and a
    // repeat of 31 under a recovery action NONE keeps it fatal.
    tr2.poll(0, &HealthPoll::healthy(), t(2));
    tr2.event(&xid(0, 45, None, 3), t(3));
    tr2.event(&xid(0, 31, None, 4), t(4));
    let list = active(&tr2, 0);
    assert!(list.contains(&on_gpu(Key::Xid(31), Some("31"), true)));
    assert!(list.contains(&on_gpu(Key::Xid(45), Some("45"), false)));
    // Informational first, fatal later: the same condition turns fatal.
    let mut tr3 = tracker();
    tr3.event(&xid(0, 94, None, 1), t(1));
    assert!(!active(&tr3, 0)[0].3);
    tr3.poll(0, &reset, t(2));
    tr3.event(&xid(0, 94, None, 3), t(3));
    assert!(active(&tr3, 0).contains(&on_gpu(Key::Xid(94), Some("94"), true)));
    // Fatal first, then the same XID under the action NONE: stays fatal.
    tr3.poll(0, &HealthPoll::healthy(), t(4));
    tr3.event(&xid(0, 94, None, 5), t(5));
    assert!(active(&tr3, 0).contains(&on_gpu(Key::Xid(94), Some("94"), true)));
    // The informational expiry never removes a fatal XID.
    tr2.tick(t(10 * 3600));
    assert!(keys(&tr2, 0).contains(&Key::Xid(31)));
    assert!(!keys(&tr2, 0).contains(&Key::Xid(45)));
}

#[test]
fn recovery_after_the_quiet_time() {
    let mut tr = tracker();
    tr.event(&xid(0, 48, None, 0), t(0));
    tr.poll(0, &old_driver(), t(10));
    tr.tick(t(59));
    assert_eq!(keys(&tr, 0), [Key::ResetRequired, Key::Xid(48)]);
    // Something new at 30 s restarts the quiet time.
    tr.event(&xid(0, 48, None, 30), t(30));
    tr.tick(t(60));
    assert_eq!(keys(&tr, 0).len(), 2, "no poll since the last fault");
    tr.poll(0, &old_driver(), t(40));
    tr.tick(t(89));
    assert_eq!(keys(&tr, 0).len(), 2, "quiet only since 30 s");
    let _ = tr.take_transitions();
    tr.tick(t(90));
    assert!(keys(&tr, 0).is_empty());
    let back = tr.take_transitions();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].reason, "GpuRecovered");
    assert_eq!(back[0].from, HealthState::Unhealthy);
}

#[test]
fn no_recovery_while_a_check_fails() {
    // Each case: the poll after the fault, which must hold recovery back.
    let mut reset = HealthPoll::healthy();
    reset.recovery_action = Some(RecoveryAction::GpuReset);
    let mut p2p = HealthPoll::healthy();
    p2p.recovery_action = Some(RecoveryAction::DrainP2p);
    let mut pending = HealthPoll::healthy();
    pending.remap = Some(RemapState {
        pending: true,
        failure: false,
    });
    let mut retired = old_driver();
    retired.retired_pages_pending = Some(true);
    let mut error = HealthPoll::healthy();
    error.liveness = Liveness::Error("Unknown".into());
    for (name, poll) in [
        ("action GPU_RESET", reset),
        ("action DRAIN_P2P", p2p),
        ("remap pending", pending),
        ("pages pending", retired),
        ("no answer", error),
    ] {
        let mut tr = tracker();
        tr.event(&xid(0, 119, None, 0), t(0));
        tr.poll(0, &poll, t(10));
        tr.tick(t(1000));
        assert!(keys(&tr, 0).contains(&Key::Xid(119)), "{name}");
        // The check passes: recovery after the quiet time since the last
        // fault (the poll's own reset action counts as one).
        tr.poll(0, &HealthPoll::healthy(), t(1010));
        tr.tick(t(1100));
        assert!(
            !keys(&tr, 0).contains(&Key::Xid(119)),
            "{name}: {:?}",
            keys(&tr, 0)
        );
        assert!(!keys(&tr, 0).contains(&Key::ResetRequired), "{name}");
    }
}

#[test]
fn lost_gpu_recovers_when_it_answers_again() {
    let mut tr = tracker();
    tr.event(&xid(1, 79, None, 0), t(0));
    assert_eq!(keys(&tr, 1), [Key::GpuLost, Key::Xid(79)]);
    let mut lost = old_driver();
    lost.liveness = Liveness::Lost;
    for s in (10..200).step_by(10) {
        tr.poll(1, &lost, t(s));
        tr.tick(t(s));
    }
    assert_eq!(keys(&tr, 1), [Key::GpuLost, Key::Xid(79)]);
    tr.poll(1, &HealthPoll::healthy(), t(200));
    tr.tick(t(249));
    assert_eq!(keys(&tr, 1).len(), 2, "lost seen at 190 s");
    tr.tick(t(250));
    assert!(keys(&tr, 1).is_empty());
    // A GPU-unavailable event and NVML's reset-required answer.
    tr.event(&event(1, EventKind::GpuUnavailable, 300), t(300));
    assert_eq!(keys(&tr, 1), [Key::GpuLost]);
    let mut rr = old_driver();
    rr.liveness = Liveness::ResetRequired;
    tr.poll(0, &rr, t(300));
    assert_eq!(
        active(&tr, 0),
        [on_gpu(Key::ResetRequired, Some("GPU_RESET"), true)]
    );
}

#[test]
fn escalation_of_repeated_informational_xids() {
    let mut tr = tracker();
    for s in 0..4 {
        tr.event(&xid(0, 13, None, s * 100), t(s * 100));
    }
    assert_eq!(keys(&tr, 0), [Key::Xid(13)]);
    tr.event(&xid(0, 43, None, 599), t(599));
    assert_eq!(
        active(&tr, 0),
        [
            on_gpu(Key::Xid(13), Some("13"), false),
            on_gpu(Key::Xid(43), Some("43"), false),
            on_gpu(Key::Degraded(Degradation::XidRate), Some("xid-rate"), false),
        ]
    );
    assert!(
        tr.conditions()[0].conditions[2]
            .message
            .starts_with("5 informational XIDs within 600 s")
    );
    // Spread out beyond the window: no escalation.
    let mut tr = tracker();
    for s in 0..10 {
        tr.event(&xid(0, 13, None, s * 200), t(s * 200));
    }
    assert_eq!(keys(&tr, 0), [Key::Xid(13)]);
    // Fatal XIDs do not count; escalation off with 0.
    let p = Policy {
        escalate_after: 0,
        ..Policy::default()
    };
    let mut tr = Tracker::new(p, gpus(), BOOT.into(), None, t(0));
    for s in 0..20 {
        tr.event(&xid(0, 13, None, s), t(s));
    }
    assert_eq!(keys(&tr, 0), [Key::Xid(13)]);
}

#[test]
fn mig_events_land_on_their_device() {
    let mut tr = tracker();
    tr.set_mig_instances(
        0,
        &[
            MigInstance {
                gpu_instance_id: 1,
                profile_id: 9,
                placement_start: 4,
            },
            MigInstance {
                gpu_instance_id: 2,
                profile_id: 19,
                placement_start: 0,
            },
        ],
    );
    let mig = Scope::Mig {
        profile_id: 9,
        placement_start: 4,
    };
    // Informational on a MIG device: that device only.
    tr.event(&xid(0, 13, Some(1), 0), t(0));
    assert_eq!(
        active(&tr, 0),
        [(mig, Key::Xid(13), Some("13".into()), false)]
    );
    let tr_list = tr.take_transitions();
    assert_eq!(tr_list.len(), 1);
    assert_eq!(tr_list[0].scope, mig);
    assert_eq!(tr.conditions()[0].state, HealthState::Healthy, "GPU scope");
    // A catalog reset XID on a MIG device: its XID there, the reset on the
    // whole GPU.
    tr.event(&xid(0, 119, Some(2), 1), t(1));
    let mig2 = Scope::Mig {
        profile_id: 19,
        placement_start: 0,
    };
    assert!(active(&tr, 0).contains(&(mig2, Key::Xid(119), Some("119".into()), true)));
    assert!(active(&tr, 0).contains(&on_gpu(Key::ResetRequired, Some("GPU_RESET"), true)));
    // An unknown GPU instance counts for the whole GPU, and says so.
    tr.event(&xid(0, 94, Some(7), 2), t(2));
    let c = tr.conditions()[0]
        .conditions
        .iter()
        .find(|c| c.key == Key::Xid(94))
        .cloned()
        .unwrap();
    assert_eq!(c.scope, Scope::Gpu);
    assert!(
        c.message.contains("unknown GPU instance 7"),
        "{}",
        c.message
    );
    // Recovery clears the MIG device's fatal XID with the GPU's reset.
    tr.poll(0, &HealthPoll::healthy(), t(10));
    tr.tick(t(100));
    assert_eq!(
        keys(&tr, 0),
        [Key::Xid(94), Key::Xid(13)],
        "only the informational ones stay"
    );
    // From a MigDevice as discovery reports it.
    let d = MigDevice {
        uuid: "MIG-x".into(),
        profile_id: 5,
        gpu_instance_id: 3,
        compute_instance_id: 0,
        placement: gpu_nvml::MigPlacement { start: 2, size: 4 },
        memory_bytes: 1,
        compute_slices: None,
    };
    assert_eq!(
        MigInstance::from(&d),
        MigInstance {
            gpu_instance_id: 3,
            profile_id: 5,
            placement_start: 2
        }
    );
}

#[test]
fn polled_conditions() {
    let mut tr = tracker();
    tr.poll(0, &HealthPoll::healthy(), t(0));
    assert!(keys(&tr, 0).is_empty());
    // Remap pending: None taint, cleared by the first poll without it.
    let mut p = HealthPoll::healthy();
    p.remap = Some(RemapState {
        pending: true,
        failure: false,
    });
    tr.poll(0, &p, t(10));
    assert_eq!(active(&tr, 0), [on_gpu(Key::RemapPending, None, false)]);
    tr.poll(0, &HealthPoll::healthy(), t(20));
    assert!(keys(&tr, 0).is_empty());
    // Thermal and hardware slowdown: degraded=thermal, expiring.
    let mut p = HealthPoll::healthy();
    p.hw_slowdown = Some(true);
    tr.poll(0, &p, t(30));
    assert_eq!(
        active(&tr, 0),
        [on_gpu(
            Key::Degraded(Degradation::Thermal),
            Some("thermal"),
            false
        )]
    );
    tr.tick(t(30 + 3600));
    assert!(keys(&tr, 0).is_empty());
    // PCIe replays: 1 a minute is fine, 20 in 60 s is not.
    let mut p = HealthPoll::healthy();
    p.pcie_replays = Some(1);
    tr.poll(1, &p, t(0));
    p.pcie_replays = Some(2);
    tr.poll(1, &p, t(60));
    assert!(keys(&tr, 1).is_empty());
    p.pcie_replays = Some(22);
    tr.poll(1, &p, t(120));
    assert_eq!(keys(&tr, 1), [Key::Degraded(Degradation::Pcie)]);
    // A counter that went back re-baselines.
    p.pcie_replays = Some(0);
    tr.poll(1, &p, t(130));
    tr.tick(t(130 + 3600));
    assert!(keys(&tr, 1).is_empty());
    // An NVLink that was up goes down; one never up does not count.
    let mut p = HealthPoll::healthy();
    p.nvlinks = vec![
        LinkState {
            link: 0,
            active: true,
        },
        LinkState {
            link: 1,
            active: false,
        },
    ];
    tr.poll(1, &p, t(5000));
    assert!(keys(&tr, 1).is_empty());
    p.nvlinks[0].active = false;
    tr.poll(1, &p, t(5010));
    assert_eq!(keys(&tr, 1), [Key::Degraded(Degradation::Nvlink)]);
    let msg = &tr.conditions()[1].conditions[0].message;
    assert!(msg.starts_with("NVLink 0 down since"), "{msg}");
}

#[test]
fn memory_errors() {
    // Old driver: uncorrected ECC growth means a reset.
    let mut tr = tracker();
    let mut p = old_driver();
    p.volatile_uncorrected_ecc = Some(3);
    tr.poll(0, &p, t(0));
    assert!(keys(&tr, 0).is_empty(), "the first count is the baseline");
    p.volatile_uncorrected_ecc = Some(4);
    tr.poll(0, &p, t(10));
    assert_eq!(
        active(&tr, 0),
        [on_gpu(Key::ResetRequired, Some("GPU_RESET"), true)]
    );
    // A DBE event likewise; with the recovery action NONE it is contained.
    tr.event(&event(1, EventKind::DoubleBitEcc, 0), t(0));
    assert_eq!(keys(&tr, 1), [Key::ResetRequired]);
    let mut tr = tracker();
    tr.poll(1, &HealthPoll::healthy(), t(0));
    tr.event(&event(1, EventKind::DoubleBitEcc, 1), t(1));
    tr.event(&event(1, EventKind::FatalPoison, 1), t(1));
    tr.event(&event(1, EventKind::SingleBitEcc, 1), t(1));
    assert!(keys(&tr, 1).is_empty());
    // The recovery action event sets the action like a poll.
    tr.event(
        &event(1, EventKind::RecoveryAction(RecoveryAction::NodeReboot), 2),
        t(2),
    );
    assert_eq!(keys(&tr, 1), [Key::RebootRequired]);
    tr.event(&event(1, EventKind::DoubleBitEcc, 3), t(3));
    assert_eq!(keys(&tr, 1), [Key::RebootRequired]);
    // DRAM retirement: pending, then failure (sticky).
    tr.event(&event(0, EventKind::DramRetirement, 4), t(4));
    tr.event(&event(0, EventKind::DramRetirementFailure, 5), t(5));
    assert_eq!(
        active(&tr, 0),
        [
            on_gpu(Key::HardwareFailure, Some(ROW_REMAP_FAILURE), true),
            on_gpu(Key::RemapPending, None, false),
        ]
    );
}

#[test]
fn hardware_failure_stays_until_cleared() {
    let mut tr = tracker();
    let mut p = HealthPoll::healthy();
    p.remap = Some(RemapState {
        pending: false,
        failure: true,
    });
    tr.poll(0, &p, t(0));
    assert_eq!(keys(&tr, 0), [Key::HardwareFailure]);
    assert_eq!(tr.conditions()[0].state, HealthState::Unhealthy);
    for s in 1..100 {
        tr.poll(0, &HealthPoll::healthy(), t(s * 100));
        tr.tick(t(s * 100));
    }
    assert_eq!(
        keys(&tr, 0),
        [Key::HardwareFailure],
        "never clears by itself"
    );
    let _ = tr.changed();
    assert!(!tr.clear_hardware_failure("GPU-1"));
    assert!(tr.clear_hardware_failure("GPU-0"));
    assert!(keys(&tr, 0).is_empty());
    assert!(tr.changed());
    assert!(!tr.clear_hardware_failure("GPU-0"));
}

#[test]
fn unmonitored_is_unknown_until_watched_again() {
    let mut tr = tracker();
    tr.unmonitored(1, "NVML: Not Supported", t(0));
    assert_eq!(active(&tr, 1), [on_gpu(Key::Unmonitored, None, false)]);
    assert_eq!(tr.conditions()[1].state, HealthState::Unknown);
    let tr_list = tr.take_transitions();
    assert_eq!(tr_list[0].reason, "GpuUnmonitored");
    assert!(tr_list[0].message.contains("NVML: Not Supported"));
    tr.tick(t(100_000));
    assert_eq!(keys(&tr, 1), [Key::Unmonitored], "no expiry");
    // A hostile reason is cut, and kept on one line.
    tr.unmonitored(0, &"x\n\r\u{1b}".repeat(100_000), t(0));
    let msg = &tr.conditions()[0].conditions[0].message;
    assert!(msg.len() < 400, "{}", msg.len());
    assert!(!msg.chars().any(char::is_control), "{msg:?}");
    assert!(msg.ends_with("..."));
    tr.monitored(1);
    assert!(keys(&tr, 1).is_empty());
    // Unknown GPUs are ignored.
    tr.unmonitored(9, "x", t(0));
    tr.event(&xid(9, 48, None, 0), t(0));
    tr.poll(9, &HealthPoll::healthy(), t(0));
    assert_eq!(tr.conditions().len(), 2);
}

#[test]
fn a_gpu_another_driver_holds_is_unknown_not_unmonitored_and_keeps_its_faults() {
    let mut tr = tracker();
    // The event thread lost the GPU first: `unmonitored`, then the
    // monitor sees it on vfio-pci.
    tr.unmonitored(0, "event wait failed: GPU is lost", t(0));
    assert_eq!(keys(&tr, 0), [Key::Unmonitored]);
    let _ = tr.take_transitions();
    let _ = tr.changed();
    tr.bound_elsewhere(0, Some("vfio-pci"));
    assert!(tr.changed(), "a health change to publish");
    assert!(
        keys(&tr, 0).is_empty(),
        "no `unmonitored` taint while a VM holds it"
    );
    let report = &tr.conditions()[0];
    assert_eq!(report.state, HealthState::Unknown);
    let why = report.not_probed.as_deref().unwrap();
    assert!(
        why.contains("vfio-pci") && why.contains("not probed"),
        "{why}"
    );
    // Unknown stays Unknown: no transition, no Event.
    assert!(tr.take_transitions().is_empty());
    // Repeated reports while held change nothing.
    tr.unmonitored(0, "event registration failed: GPU is lost", t(10));
    tr.bound_elsewhere(0, Some("vfio-pci"));
    assert!(keys(&tr, 0).is_empty());
    assert!(!tr.changed());
    // The other GPU is untouched.
    assert_eq!(tr.conditions()[1].state, HealthState::Healthy);
    assert_eq!(tr.conditions()[1].not_probed, None);

    // Back on nvidia: probed again, Healthy; a failing registration after
    // that is news again.
    tr.bound_elsewhere(0, None);
    assert!(tr.changed());
    assert_eq!(tr.conditions()[0].state, HealthState::Healthy);
    assert_eq!(tr.conditions()[0].not_probed, None);
    let back = tr.take_transitions();
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(
        (back[0].from, back[0].to, back[0].reason),
        (HealthState::Unknown, HealthState::Healthy, "GpuRecovered")
    );
    tr.unmonitored(0, "event registration failed: GPU is lost", t(20));
    assert_eq!(keys(&tr, 0), [Key::Unmonitored]);
    assert_eq!(tr.take_transitions()[0].reason, "GpuUnmonitored");

    // A Healthy GPU handed over: one `GpuNotProbed` transition.
    tr.bound_elsewhere(1, Some("no driver"));
    let over = tr.take_transitions();
    assert_eq!(over.len(), 1, "{over:?}");
    assert_eq!(
        (over[0].to, over[0].reason),
        (HealthState::Unknown, "GpuNotProbed")
    );
    assert!(
        over[0].message.contains("bound to no driver"),
        "{}",
        over[0].message
    );

    // Faults from before the hand-over stay (nothing probes them away) and
    // keep the GPU Unhealthy; a hostile driver name is cut.
    let mut tr = tracker();
    tr.event(&xid(1, 79, None, 0), t(0));
    tr.bound_elsewhere(1, Some(&"v\n".repeat(1000)));
    assert_eq!(keys(&tr, 1), [Key::GpuLost, Key::Xid(79)]);
    assert_eq!(tr.conditions()[1].state, HealthState::Unhealthy);
    for s in (10..200).step_by(10) {
        tr.tick(t(s));
    }
    assert_eq!(
        keys(&tr, 1),
        [Key::GpuLost, Key::Xid(79)],
        "no poll, no recovery"
    );
    let why = tr.conditions()[1].not_probed.clone().unwrap();
    assert!(why.len() < 300 && !why.contains('\n'), "{why}");
    // Unknown GPUs are ignored.
    tr.bound_elsewhere(9, Some("vfio-pci"));
    assert_eq!(tr.conditions().len(), 2);
}

#[test]
fn drain_p2p_is_degraded_until_recovered() {
    let mut tr = tracker();
    let mut p = HealthPoll::healthy();
    p.recovery_action = Some(RecoveryAction::DrainP2p);
    tr.poll(0, &p, t(0));
    assert_eq!(
        active(&tr, 0),
        [on_gpu(Key::Degraded(Degradation::P2p), Some("p2p"), false)]
    );
    tr.poll(0, &HealthPoll::healthy(), t(10));
    tr.tick(t(59));
    assert_eq!(keys(&tr, 0).len(), 1);
    tr.tick(t(60));
    assert!(keys(&tr, 0).is_empty());
}

#[test]
fn saved_state_round_trips_in_the_same_boot() {
    let mut tr = tracker();
    tr.set_mig_instances(
        0,
        &[MigInstance {
            gpu_instance_id: 1,
            profile_id: 9,
            placement_start: 4,
        }],
    );
    tr.event(&xid(0, 13, Some(1), 0), t(0));
    tr.event(&xid(0, 48, None, 1), t(1));
    tr.event(&event(1, EventKind::DramRetirementFailure, 2), t(2));
    let saved = tr.saved();
    assert_eq!(saved.boot_id, BOOT);
    let json = serde_json::to_string(&saved).unwrap();
    let back: Saved = serde_json::from_str(&json).unwrap();
    assert_eq!(back, saved);
    let mut restored = Tracker::new(Policy::default(), gpus(), BOOT.into(), Some(back), t(3));
    assert_eq!(active(&restored, 0), active(&tr, 0));
    assert_eq!(active(&restored, 1), active(&tr, 1));
    assert!(restored.changed());
    let tr_list = restored.take_transitions();
    assert!(
        tr_list
            .iter()
            .any(|t| t.uuid == "GPU-0" && t.to == HealthState::Unhealthy)
    );
    // The restored fault still needs a poll and the quiet time to clear.
    restored.tick(t(1000));
    assert!(keys(&restored, 0).contains(&Key::ResetRequired));
    restored.poll(0, &HealthPoll::healthy(), t(1001));
    restored.tick(t(1001));
    assert!(!keys(&restored, 0).contains(&Key::ResetRequired));
}

#[test]
fn a_new_boot_keeps_only_hardware_failures() {
    let mut tr = tracker();
    tr.event(&xid(0, 79, None, 0), t(0));
    tr.event(&xid(0, 13, None, 0), t(0));
    let mut p = HealthPoll::healthy();
    p.recovery_action = Some(RecoveryAction::NodeReboot);
    tr.poll(1, &p, t(1));
    tr.event(&event(1, EventKind::DramRetirementFailure, 2), t(2));
    let mut saved = tr.saved();
    // A GPU no longer present: its hardware failure is kept for later.
    saved
        .gpus
        .insert("GPU-gone".into(), saved.gpus["GPU-1"].clone());
    let restored = Tracker::new(
        Policy::default(),
        gpus(),
        "boot-2".into(),
        Some(saved.clone()),
        t(3),
    );
    assert!(keys(&restored, 0).is_empty());
    assert_eq!(keys(&restored, 1), [Key::HardwareFailure]);
    let again = restored.saved();
    assert_eq!(again.boot_id, "boot-2");
    assert_eq!(
        again.gpus["GPU-gone"]
            .conditions
            .iter()
            .map(|c| c.key)
            .collect::<Vec<_>>(),
        [Key::HardwareFailure]
    );
    // The same boot keeps everything.
    let same = Tracker::new(Policy::default(), gpus(), BOOT.into(), Some(saved), t(3));
    assert_eq!(keys(&same, 0), [Key::GpuLost, Key::Xid(13), Key::Xid(79)]);
    assert!(keys(&same, 1).contains(&Key::RebootRequired));
}

#[test]
fn saved_times_in_the_future_are_clamped() {
    let mut tr = tracker();
    tr.event(&xid(0, 13, None, 0), t(0));
    let mut saved = tr.saved();
    let c = &mut saved.gpus.get_mut("GPU-0").unwrap().conditions[0];
    c.since = u64::MAX;
    c.last = u64::MAX;
    let mut restored = Tracker::new(Policy::default(), gpus(), BOOT.into(), Some(saved), t(5));
    assert_eq!(restored.conditions()[0].conditions[0].last, t(5));
    restored.tick(t(5 + 3600));
    assert!(
        keys(&restored, 0).is_empty(),
        "expires, never stuck in the future"
    );
}

#[test]
fn conditions_per_gpu_are_capped() {
    let mut tr = tracker();
    for x in 1..=1000 {
        tr.event(&xid(0, 1000 + x, None, x), t(x));
    }
    // Every one of those is fatal (not in the catalog): kept up to the cap.
    assert_eq!(keys(&tr, 0).len(), MAX_CONDITIONS_PER_GPU);
    let p = Policy {
        ignored_xids: (2000..3000).collect(),
        ..Policy::default()
    };
    let mut tr = Tracker::new(p, gpus(), BOOT.into(), None, t(0));
    tr.event(&xid(0, 48, None, 0), t(0));
    for x in 0..1000 {
        tr.event(&xid(0, 2000 + x, None, x + 1), t(x + 1));
    }
    let k = keys(&tr, 0);
    assert_eq!(k.len(), MAX_CONDITIONS_PER_GPU);
    assert!(
        k.contains(&Key::Xid(48)),
        "a fatal condition is never evicted"
    );
    assert!(
        k.contains(&Key::Xid(2999)),
        "the newest informational stays"
    );
    assert!(!k.contains(&Key::Xid(2000)), "the oldest went");
}

#[test]
fn clock_going_back_is_harmless() {
    let mut tr = tracker();
    tr.event(&xid(0, 48, None, 100), t(100));
    tr.poll(0, &HealthPoll::healthy(), t(50));
    tr.tick(t(10));
    assert_eq!(keys(&tr, 0).len(), 2);
}

#[test]
fn clear_requests_name_gpus_or_all() {
    let mut tr = tracker();
    for i in 0..2 {
        tr.event(&event(i, EventKind::DramRetirementFailure, 0), t(0));
    }
    let mut saved = tr.saved();
    saved
        .gpus
        .insert("GPU-gone".into(), saved.gpus["GPU-0"].clone());
    let mut tr = Tracker::new(Policy::default(), gpus(), BOOT.into(), Some(saved), t(1));
    let which = ClearRequest::Gpus(["GPU-1".to_owned(), "GPU-9".to_owned()].into());
    assert_eq!(tr.clear_hardware_failures(&which), ["GPU-1"]);
    assert_eq!(keys(&tr, 0), [Key::HardwareFailure]);
    assert!(keys(&tr, 1).is_empty());
    assert_eq!(
        tr.clear_hardware_failures(&ClearRequest::All),
        ["GPU-0", "GPU-gone"]
    );
    assert!(keys(&tr, 0).is_empty());
    assert!(tr.saved().gpus.is_empty());
}

#[test]
fn the_recovery_action_names_the_reset() {
    let mut tr = tracker();
    tr.event(&xid(0, 119, None, 0), t(0));
    let value = |tr: &Tracker| active(tr, 0)[0].2.clone();
    assert_eq!(value(&tr), Some("GPU_RESET".into()));
    let mut p = HealthPoll::healthy();
    p.recovery_action = Some(RecoveryAction::DrainAndReset);
    tr.poll(0, &p, t(1));
    assert_eq!(value(&tr), Some("DRAIN_AND_RESET".into()));
    assert!(tr.changed());
    // The action query fails once; a DBE then (which alone says GPU_RESET)
    // keeps the driver's name.
    tr.poll(0, &old_driver(), t(2));
    tr.event(&event(0, EventKind::DoubleBitEcc, 3), t(3));
    assert_eq!(tr.conditions()[0].conditions[0].count, 3);
    assert_eq!(value(&tr), Some("DRAIN_AND_RESET".into()));
}

#[test]
fn xid_48_with_a_remap_asks_to_drain_and_reset() {
    let value = |tr: &Tracker| {
        tr.conditions()[0]
            .conditions
            .iter()
            .find(|c| c.key == Key::ResetRequired)
            .and_then(|c| c.value.clone())
    };
    // 48 then 63 within 30 s, 64 then 48: drain and reset.
    for (first, second) in [(48, 63), (64, 48)] {
        let mut tr = tracker();
        tr.event(&xid(0, first, None, 0), t(0));
        tr.event(&xid(0, second, None, 20), t(20));
        assert_eq!(
            value(&tr),
            Some("DRAIN_AND_RESET".into()),
            "{first} {second}"
        );
        let msg = &tr.conditions()[0].conditions[0].message;
        assert!(msg.ends_with("drain and reset"), "{msg}");
    }
    // Too far apart, or 48 alone: a reset.
    let mut tr = tracker();
    tr.event(&xid(0, 63, None, 0), t(0));
    tr.event(&xid(0, 48, None, 31), t(31));
    assert_eq!(value(&tr), Some("GPU_RESET".into()));
    // The driver's recovery action decides where there is one.
    let mut tr = tracker();
    let mut p = HealthPoll::healthy();
    p.recovery_action = Some(RecoveryAction::GpuReset);
    tr.poll(0, &p, t(0));
    tr.event(&xid(0, 48, None, 1), t(1));
    tr.event(&xid(0, 63, None, 2), t(2));
    assert_eq!(value(&tr), Some("GPU_RESET".into()));
}

#[test]
fn pcie_replays_over_polls_under_a_second() {
    let mut tr = tracker();
    let mut p = HealthPoll::healthy();
    // Polls under a second apart add up to a window of a second: 10
    // replays over 1.2 s in 300 ms steps are over the rate, 0 are not.
    let base = t(100);
    let ms = |n: u64| base + std::time::Duration::from_millis(n);
    p.pcie_replays = Some(100);
    tr.poll(1, &p, base);
    for step in 1..=4 {
        tr.poll(1, &p, ms(step * 300));
    }
    assert!(keys(&tr, 1).is_empty());
    for step in 5..=8 {
        p.pcie_replays = Some(100 + (step - 4) * 3);
        tr.poll(1, &p, ms(step * 300));
    }
    assert_eq!(keys(&tr, 1), [Key::Degraded(Degradation::Pcie)]);
}
