//! GPU health through the real NVML code path: `NvmlBackend`'s
//! `HealthSource` against the fake `libnvidia-ml.so`, driven by its control
//! file (`MOCK_NVML_CONTROL`) and its profiles' `health:` blocks. Every
//! control command must come out as exactly the event or poll result NVML
//! would give.

use std::io::Write;
use std::time::{Duration, Instant};

mod common;

use common::Controlled as Machine;
use common::PATIENCE;
use gpu_nvml::{
    EventKind, EventWatch, HealthPoll, HealthSource, LinkState, Liveness, NvmlBackend,
    RecoveryAction, RemapState,
};

/// Two A100s (minors 4 and 6, NVLinks 0 and 1 between them) and a T4
/// (minor 9), on `driver`; `extra[i]` is appended to GPU i's YAML.
fn profile(driver: &str, extra: [&str; 3]) -> String {
    let gpu = |model: &str, minor: u32, bus: &str, rest: &str| {
        format!(
            "  - model: {model}\n    uuid: GPU-0000000{minor}-f29d-4da9-953f-48f1a09f76b5\n    \
             pciBusId: \"{bus}\"\n    minor: {minor}\n    numaNode: 0\n    pcieRoot: pci0000:00\n{rest}"
        )
    };
    let links = |remote: &str| {
        format!(
            "    nvlinks: [{{link: 0, remote: \"{remote}\"}}, {{link: 1, remote: \"{remote}\"}}]\n"
        )
    };
    let mig = "    mig:\n      current: true\n      devices: [{profile: 3g.40gb, placement: 0}, {profile: 3g.40gb, placement: 4}]\n";
    format!(
        "driverVersion: \"{driver}\"\ncudaDriverVersion: 13000\ngpus:\n{}{}{}",
        gpu(
            "A100-SXM4-80GB",
            4,
            "0000:07:00.0",
            &format!("{}{}", links("0000:0f:00.0"), extra[0])
        ),
        gpu(
            "A100-SXM4-80GB",
            6,
            "0000:0f:00.0",
            &format!("{}{mig}{}", links("0000:07:00.0"), extra[1])
        ),
        gpu("T4", 9, "0000:47:00.0", extra[2]),
    )
}

/// Polls GPU `index` until `accept` holds; panics with the last poll after
/// [`PATIENCE`].
fn poll_until(
    backend: &NvmlBackend,
    index: u32,
    accept: impl Fn(&HealthPoll) -> bool,
) -> HealthPoll {
    common::until(
        &format!("GPU {index}"),
        || backend.poll(index).expect("poll"),
        accept,
    )
}

fn next_event(watch: &mut Box<dyn EventWatch>) -> gpu_nvml::HealthEvent {
    watch
        .wait(PATIENCE)
        .expect("wait")
        .expect("an event before the timeout")
}

fn no_event(watch: &mut Box<dyn EventWatch>) {
    let got = watch.wait(Duration::from_millis(100)).expect("wait");
    assert!(got.is_none(), "unexpected event {got:?}");
}

/// A healthy A100 of the test profile: two of its 12 NVLinks active.
fn healthy_a100() -> HealthPoll {
    HealthPoll {
        nvlinks: (0..12)
            .map(|link| LinkState {
                link,
                active: link < 2,
            })
            .collect(),
        ..HealthPoll::healthy()
    }
}

#[test]
fn a_healthy_machine_polls_clean_and_waits_time_out() {
    let m = Machine::new(&profile("580.95.05", ["", "", ""]), "");
    let backend = m.open();
    assert_eq!(backend.poll(0).unwrap(), healthy_a100());
    // A T4: page retirement instead of row remapping, no NVLink.
    let t4 = backend.poll(2).unwrap();
    assert_eq!(t4.remap, None);
    assert_eq!(t4.retired_pages_pending, Some(false));
    assert_eq!(t4.recovery_action, Some(RecoveryAction::None));
    assert!(t4.nvlinks.is_empty());

    let mut watch = backend.watch(0).unwrap();
    let start = Instant::now();
    assert_eq!(watch.wait(Duration::from_millis(150)).unwrap(), None);
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(150), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    assert_eq!(watch.wait(Duration::ZERO).unwrap(), None);
}

#[test]
fn an_xid_reaches_the_watch_of_its_gpu_only() {
    let m = Machine::new(&profile("580.95.05", ["", "", ""]), "");
    let backend = m.open();
    let mut first = backend.watch(0).unwrap();
    let mut second = backend.watch(1).unwrap();
    let mut again = backend.watch(0).unwrap();
    m.command("xid 4 79");
    for watch in [&mut first, &mut again] {
        let event = next_event(watch);
        assert_eq!(event.gpu_index, 0);
        assert_eq!(event.kind, EventKind::Xid(79));
        assert_eq!(event.gpu_instance_id, None);
        assert_eq!(event.compute_instance_id, None);
    }
    no_event(&mut second);
    no_event(&mut first);
    // Each XID is its own event, in order.
    m.command("xid 6 13");
    m.command("xid 6 43");
    assert_eq!(next_event(&mut second).kind, EventKind::Xid(13));
    assert_eq!(next_event(&mut second).kind, EventKind::Xid(43));
    no_event(&mut first);
}

#[test]
fn a_mig_xid_keeps_its_gpu_and_compute_instance() {
    let m = Machine::new(&profile("580.95.05", ["", "", ""]), "");
    let backend = m.open();
    let mut watch = backend.watch(1).unwrap();
    m.command("xid 6 31 2 0");
    let event = next_event(&mut watch);
    assert_eq!(event.gpu_index, 1);
    assert_eq!(event.kind, EventKind::Xid(31));
    assert_eq!(event.gpu_instance_id, Some(2));
    assert_eq!(event.compute_instance_id, Some(0));
    // 0xFFFFFFFF spelled out is the whole GPU.
    m.command("xid 6 48 4294967295 4294967295");
    let event = next_event(&mut watch);
    assert_eq!(event.kind, EventKind::Xid(48));
    assert_eq!(event.gpu_instance_id, None);
    assert_eq!(event.compute_instance_id, None);
}

#[test]
fn a_lost_gpu_answers_nothing_until_restored() {
    let m = Machine::new(&profile("580.95.05", ["", "", ""]), "");
    let backend = m.open();
    let mut lost = backend.watch(0).unwrap();
    let mut other = backend.watch(1).unwrap();
    m.command("lose 4");
    let poll = poll_until(&backend, 0, |p| p.liveness != Liveness::Alive);
    assert_eq!(poll, HealthPoll::liveness_only(Liveness::Lost));
    let err = lost.wait(PATIENCE).unwrap_err().to_string();
    assert!(err.contains("on GPU 0"), "{err}");
    assert!(err.contains("nvmlEventSetWait_v2"), "{err}");
    let err = backend.watch(0).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("on GPU 0"), "{err}");
    // The other GPU is untouched.
    no_event(&mut other);
    assert_eq!(backend.poll(1).unwrap().liveness, Liveness::Alive);

    m.command("restore 4");
    poll_until(&backend, 0, |p| *p == healthy_a100());
    let mut watch = backend.watch(0).unwrap();
    m.command("xid 4 94");
    assert_eq!(next_event(&mut watch).kind, EventKind::Xid(94));
}

#[test]
fn a_gpu_lost_before_its_first_use_is_lost_not_an_error() {
    let m = Machine::new(&profile("580.95.05", ["", "", ""]), "lose 9\n");
    let backend = m.open();
    assert_eq!(backend.poll(2).unwrap().liveness, Liveness::Lost);
    assert!(backend.watch(2).is_err());
    assert_eq!(backend.poll(0).unwrap(), healthy_a100());
    // A GPU that does not exist is an error, not a lost GPU.
    let err = backend.poll(3).unwrap_err().to_string();
    assert!(err.contains("on GPU 3"), "{err}");
}

#[test]
fn a_recovery_action_is_an_event_and_the_field() {
    let m = Machine::new(&profile("580.95.05", ["", "", ""]), "");
    let backend = m.open();
    let mut watch = backend.watch(1).unwrap();
    for (word, action) in [
        ("reset", RecoveryAction::GpuReset),
        ("reboot", RecoveryAction::NodeReboot),
        ("drain", RecoveryAction::DrainP2p),
        ("none", RecoveryAction::None),
    ] {
        m.command(&format!("recovery 6 {word}"));
        let event = next_event(&mut watch);
        assert_eq!(event.kind, EventKind::RecoveryAction(action), "{word}");
        assert_eq!(event.gpu_instance_id, None);
        assert_eq!(backend.poll(1).unwrap().recovery_action, Some(action));
    }
    assert_eq!(
        backend.poll(0).unwrap().recovery_action,
        Some(RecoveryAction::None)
    );
}

#[test]
fn remap_and_ecc_show_in_the_poll_with_their_events() {
    let m = Machine::new(&profile("580.95.05", ["", "", ""]), "");
    let backend = m.open();
    let mut watch = backend.watch(0).unwrap();
    m.command("remap 4 1 0");
    assert_eq!(next_event(&mut watch).kind, EventKind::DramRetirement);
    assert_eq!(
        backend.poll(0).unwrap().remap,
        Some(RemapState {
            pending: true,
            failure: false
        })
    );
    m.command("remap 4 1 1");
    assert_eq!(
        next_event(&mut watch).kind,
        EventKind::DramRetirementFailure
    );
    no_event(&mut watch);
    assert_eq!(
        backend.poll(0).unwrap().remap,
        Some(RemapState {
            pending: true,
            failure: true
        })
    );
    m.command("ecc 4 3");
    assert_eq!(next_event(&mut watch).kind, EventKind::DoubleBitEcc);
    assert_eq!(backend.poll(0).unwrap().volatile_uncorrected_ecc, Some(3));
    // The same count again is no new error.
    m.command("ecc 4 3");
    no_event(&mut watch);
    // Page retirement on the T4.
    m.command("remap 9 1 0");
    let t4 = poll_until(&backend, 2, |p| p.retired_pages_pending == Some(true));
    assert_eq!(t4.remap, None);
}

#[test]
fn nvlinks_slowdowns_and_replays_are_polled() {
    let m = Machine::new(&profile("580.95.05", ["", "", ""]), "");
    let backend = m.open();
    m.command("nvlink 4 1 down");
    let poll = poll_until(&backend, 0, |p| {
        p.nvlinks.iter().any(|l| l.link == 1 && !l.active)
    });
    assert!(poll.nvlinks[0].active);
    // The topology query sees the same.
    let links = gpu_nvml::GpuBackend::gpu(&backend, 0).unwrap().nvlinks;
    assert_eq!(links.len(), 1, "{links:?}");
    m.command("nvlink 4 1 up");
    poll_until(&backend, 0, |p| *p == healthy_a100());

    m.command("slowdown 4 thermal");
    let poll = poll_until(&backend, 0, |p| p.thermal_slowdown == Some(true));
    assert_eq!(poll.hw_slowdown, Some(false));
    m.command("slowdown 4 power-brake");
    let poll = poll_until(&backend, 0, |p| p.hw_slowdown == Some(true));
    assert_eq!(poll.thermal_slowdown, Some(false));
    m.command("pcie-replays 4 17");
    poll_until(&backend, 0, |p| p.pcie_replays == Some(17));
}

#[test]
fn refused_events_fail_the_watch_of_that_gpu_only() {
    let m = Machine::new(&profile("580.95.05", ["", "", ""]), "");
    let backend = m.open();
    m.command("refuse-events 6");
    // Applied once the next command is: send a marker and wait for it.
    m.command("pcie-replays 6 1");
    poll_until(&backend, 1, |p| p.pcie_replays == Some(1));
    let err = backend.watch(1).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("nvmlDeviceRegisterEvents"), "{err}");
    assert!(err.contains("on GPU 1"), "{err}");
    let mut ok = backend.watch(0).unwrap();
    m.command("xid 4 79");
    assert_eq!(next_event(&mut ok).kind, EventKind::Xid(79));
    m.command("accept-events 6");
    m.command("pcie-replays 6 2");
    poll_until(&backend, 1, |p| p.pcie_replays == Some(2));
    assert!(backend.watch(1).is_ok());
}

#[test]
fn malformed_and_hostile_lines_change_nothing_and_stop_nothing() {
    let m = Machine::new(&profile("580.95.05", ["", "", ""]), "");
    let backend = m.open();
    let mut watch = backend.watch(0).unwrap();
    let mut hostile = Vec::new();
    for line in [
        "frobnicate 4",
        "xid",
        "xid 4",
        "xid 4 79 1",
        "xid 5 79",
        "lose 4 4",
        "lose 99999999999999999999",
        "ecc 4 -1",
        "remap 4 2 0",
        "recovery 4 maybe",
        "nvlink 4 7 down",
        "nvlink 9 0 down",
        "recovery 9 reboot now",
    ] {
        hostile.extend_from_slice(line.as_bytes());
        hostile.push(b'\n');
    }
    hostile.extend_from_slice(b"lose 4\0\n");
    hostile.extend_from_slice(b"lose \xff\xfe\n");
    hostile.extend(std::iter::repeat_n(b'7', 100_000));
    hostile.push(b'\n');
    m.send(&hostile);
    m.command("xid 4 63");
    assert_eq!(next_event(&mut watch).kind, EventKind::Xid(63));
    no_event(&mut watch);
    assert_eq!(backend.poll(0).unwrap(), healthy_a100());
}

#[test]
fn a_fifo_is_reopened_after_each_writer() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("control.fifo");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(status.success());
    let m = Machine::with_control(dir, &profile("580.95.05", ["", "", ""]), fifo.clone());
    let backend = m.open();
    let mut watch = backend.watch(0).unwrap();
    for xid in [79, 48] {
        // Each writer opens, writes and closes: the library reads it to EOF
        // and opens the FIFO again for the next one.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&fifo)
            .expect("open FIFO");
        writeln!(f, "xid 4 {xid}").unwrap();
        drop(f);
        assert_eq!(next_event(&mut watch).kind, EventKind::Xid(xid));
    }
    // A last line without newline counts when the writer closes.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .expect("open FIFO");
    write!(f, "xid 4 13").unwrap();
    drop(f);
    assert_eq!(next_event(&mut watch).kind, EventKind::Xid(13));
}

#[test]
fn profile_faults_are_there_at_start() {
    let yaml = profile(
        "580.95.05",
        [
            "    health:\n      recoveryAction: reboot\n      remapPending: true\n      remapFailure: true\n      eccUncorrected: 2\n      nvlinksDown: [0]\n      slowdown: hw\n      pcieReplays: 5\n",
            "    health: {refuseEvents: true}\n",
            "    health: {lost: true}\n",
        ],
    );
    let m = Machine::new(&yaml, "");
    let backend = m.open();
    let poll = backend.poll(0).unwrap();
    assert_eq!(
        poll,
        HealthPoll {
            liveness: Liveness::Alive,
            recovery_action: Some(RecoveryAction::NodeReboot),
            remap: Some(RemapState {
                pending: true,
                failure: true
            }),
            retired_pages_pending: None,
            volatile_uncorrected_ecc: Some(2),
            hw_slowdown: Some(true),
            thermal_slowdown: Some(false),
            pcie_replays: Some(5),
            nvlinks: (0..12)
                .map(|link| LinkState {
                    link,
                    active: link == 1,
                })
                .collect(),
        }
    );
    assert!(backend.watch(0).is_ok());
    assert!(backend.watch(1).is_err());
    assert_eq!(backend.poll(2).unwrap().liveness, Liveness::Lost);
}

#[test]
fn a_regular_control_file_is_replayed_at_start_without_its_events() {
    let m = Machine::new(
        &profile("580.95.05", ["", "", ""]),
        "xid 4 79\nrecovery 4 reset\nremap 6 1 0\n# a comment\n\n",
    );
    let backend = m.open();
    assert_eq!(
        backend.poll(0).unwrap().recovery_action,
        Some(RecoveryAction::GpuReset)
    );
    assert!(backend.poll(1).unwrap().remap.unwrap().pending);
    let mut watch = backend.watch(0).unwrap();
    no_event(&mut watch);
}

#[test]
fn an_old_driver_has_no_recovery_action_and_registers_what_it_supports() {
    let m = Machine::new(&profile("535.104.05", ["", "", ""]), "");
    let backend = m.open();
    let poll = backend.poll(0).unwrap();
    assert_eq!(poll.recovery_action, None);
    assert!(poll.remap.is_some());
    let mut watch = backend.watch(0).unwrap();
    // Refused by the library: nothing changes, the XID still arrives.
    m.command("recovery 4 reset");
    m.command("xid 4 119");
    assert_eq!(next_event(&mut watch).kind, EventKind::Xid(119));
    no_event(&mut watch);
    assert_eq!(backend.poll(0).unwrap().recovery_action, None);
}

#[test]
fn a_profile_with_a_bad_health_block_does_not_load() {
    for (block, expect) in [
        (
            "    health: {nvlinksDown: [5]}\n",
            "link 5 is not one of the GPU's nvlinks",
        ),
        (
            "    health: {recoveryAction: later}\n",
            "unknown variant `later`",
        ),
        ("    health: {color: red}\n", "unknown field `color`"),
    ] {
        let m = Machine::new(&profile("580.95.05", [block, "", ""]), "");
        let err = NvmlBackend::open(Some(&m.library)).unwrap_err().to_string();
        assert!(err.contains(expect), "{block}: {err}");
    }
    let old = Machine::new(
        &profile(
            "535.104.05",
            ["    health: {recoveryAction: none}\n", "", ""],
        ),
        "",
    );
    let err = NvmlBackend::open(Some(&old.library))
        .unwrap_err()
        .to_string();
    assert!(err.contains("before R565"), "{err}");
}

#[test]
fn an_injected_xid_reaches_the_waiting_watch_quickly() {
    // The fake's share of the "fault to taint under 1 s p95": the
    // control file is checked every 50 ms, the waiting thread wakes at once.
    let m = Machine::new(&profile("580.95.05", ["", "", ""]), "");
    let backend = m.open();
    let mut watch = backend.watch(0).unwrap();
    let mut latencies = Vec::new();
    for xid in 0..20 {
        let start = Instant::now();
        m.command(&format!("xid 4 {xid}"));
        assert_eq!(next_event(&mut watch).kind, EventKind::Xid(xid));
        latencies.push(start.elapsed());
    }
    latencies.sort();
    let p95 = latencies[18];
    eprintln!(
        "control command to event: median {:?}, p95 {p95:?}, max {:?}",
        latencies[10], latencies[19]
    );
    assert!(p95 < Duration::from_millis(500), "{latencies:?}");
}
