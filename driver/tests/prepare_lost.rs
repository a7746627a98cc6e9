//! Checkpoint entries lost while the plugin was down (quarantined, or the
//! whole file unusable, or read as an earlier boot's): kubelet still counts
//! their claims as prepared and does not prepare them again while their
//! pods run, so what the entries set up must survive the start, and go
//! when kubelet unprepares the claims. The real plugin binary, the fake
//! NVML and driver root, the kubelet simulator (see `prepare_kinds.rs`).

mod common;

use common::prepare::{Node, long_time_slices, mig_config, node, result, shared_claim};
use gpu_dra_sim::kubelet::{Claim, DraVersion};
use serde_json::json;

/// Drops a quote from every completed entry of the checkpoint file while
/// the plugin is down: no longer JSON, so the next start moves it aside,
/// and no entry can be taken back from it. (A file cut short loses the
/// text of its last entries, and nothing names what they set up any more.)
fn break_checkpoint(n: &Node) {
    let path = n.state_dir().join("checkpoint.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let broken = text.replace("\"PrepareCompleted\"", "PrepareCompleted\"");
    assert_ne!(broken, text);
    std::fs::write(&path, broken).unwrap();
}

/// The line of the start's report on what was kept for lost claims.
fn kept_line(n: &Node) -> String {
    let logs = n.logs();
    logs.lines()
        .find(|l| l.contains("kept for claims whose checkpoint entries were lost"))
        .unwrap_or_else(|| panic!("no line on what was kept\n{logs}"))
        .to_owned()
}

/// An MPS claim prepared, its entry lost to a bad checksum while the
/// plugin was down, and the plugin started again with `flags`: the node,
/// the claim, and the daemon's processes before the loss.
async fn lost_mps_claim(flags: &[&str]) -> (Node, Claim, Vec<u32>) {
    let mut n = node("t4-inference", &[], DraVersion::V1).await;
    let c = n.mps_claim("lost").await;
    n.prepare_ok(&c).await;
    let running = n.live_processes();
    assert!(!running.is_empty(), "the daemon runs");
    n.stop();
    n.tamper_entry(&c);
    n.restart_with_flags(flags).await;
    (n, c, running)
}

/// A time-slicing claim's entry lost to a bad checksum: its CDI spec is
/// kept, the time slice it set is not reported as unknown (the damaged
/// entry still says who set it), and kubelet's unprepare resets it.
#[tokio::test]
async fn a_lost_time_slice_entry_keeps_its_spec_and_is_reset_at_its_unprepare() {
    let mut n = node("t4-inference", &[], DraVersion::V1).await;
    let c = long_time_slices(&n, "lost").await;
    n.prepare_ok(&c).await;
    let kept = n.gpu_claim("kept", "gpu-1").await;
    n.prepare_ok(&kept).await;
    assert_eq!(n.env.driver_root.nvidia_smi_calls().unwrap().len(), 1);

    n.lose_entry(&c).await;

    let logs = n.logs();
    assert!(logs.contains("checkpoint entry quarantined"), "{logs}");
    let line = kept_line(&n);
    assert!(
        line.contains(&c.uid) && line.contains("its CDI spec"),
        "{line}"
    );
    assert!(n.spec_path(&c).exists(), "the pod's spec is kept");
    // Unused GPUs are named as unknown; the lost claim's, whose setting the
    // ledger holds, and the remaining claim's are not.
    let unknown = logs
        .lines()
        .find(|l| l.contains("may have set the time slice"))
        .unwrap_or_else(|| panic!("no warning\n{logs}"));
    for index in [0, 3] {
        assert!(unknown.contains(&format!("(index {index})")), "{unknown}");
    }
    for index in [1, 2] {
        assert!(!unknown.contains(&format!("(index {index})")), "{unknown}");
    }
    assert_eq!(n.env.driver_root.nvidia_smi_calls().unwrap().len(), 1);

    n.unprepare_ok(&c).await;
    let calls = n.env.driver_root.nvidia_smi_calls().unwrap();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[1].args.last().unwrap(), "0", "reset to Default");
    assert_eq!(
        calls[0].args[calls[0].args.iter().position(|a| a == "-i").unwrap() + 1],
        calls[1].args[calls[1].args.iter().position(|a| a == "-i").unwrap() + 1],
        "on the GPU it was set on"
    );
    assert!(!n.spec_path(&c).exists());
    assert!(!n.ledger_path().exists(), "the ledger is empty");
    // A second unprepare finds nothing to do.
    n.unprepare_ok(&c).await;
    assert_eq!(n.env.driver_root.nvidia_smi_calls().unwrap().len(), 2);
    n.unprepare_ok(&kept).await;
}

/// An MPS claim's entry lost to a bad checksum: its daemon serves on
/// through the start (no quit, same process), the compute mode stays, and
/// kubelet's unprepare stops the daemon and restores the mode.
#[tokio::test]
async fn an_mps_daemon_whose_entry_was_lost_serves_on_until_its_unprepare() {
    let (mut n, c, running) = lost_mps_claim(&[]).await;

    let logs = n.logs();
    assert!(!logs.contains("unreferenced MPS daemons stopped"), "{logs}");
    assert_eq!(n.live_processes(), running, "the same daemon serves on");
    assert_eq!(n.mps_daemons(), 1);
    assert_eq!(n.exclusive_gpus().len(), 1, "{:?}", n.compute_modes());
    assert!(n.spec_path(&c).exists());
    let line = kept_line(&n);
    assert!(line.contains("MPS daemons"), "{line}");
    assert!(
        !logs.contains("not in compute mode Default"),
        "the mode's setter is known\n{logs}"
    );

    // A second start keeps it too: the ledger is on disk.
    n.restart(&[]).await;
    assert_eq!(n.live_processes(), running);

    n.unprepare_ok(&c).await;
    assert_eq!(n.processes(), 0, "no process left");
    assert_eq!(n.mps_daemons(), 0);
    assert!(n.exclusive_gpus().is_empty(), "{:?}", n.compute_modes());
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
    assert!(!n.ledger_path().exists());
}

/// A lost MPS claim prepared again (a restarted kubelet does this) finds
/// its GPU still in the mode the lost entry set: the new prepare changes
/// nothing, so the new entry takes over the mode to restore from the
/// ledger, and its unprepare sets the GPU back.
#[tokio::test]
async fn a_lost_mps_claim_prepared_again_restores_the_compute_mode_at_its_unprepare() {
    let (mut n, c, running) = lost_mps_claim(&[]).await;

    n.prepare_ok(&c).await;
    assert!(!n.ledger_path().exists(), "released\n{}", n.logs());
    assert_eq!(n.live_processes(), running, "the daemon is taken over");
    assert_eq!(n.exclusive_gpus().len(), 1, "{:?}", n.compute_modes());
    // On disk: a start in between still restores it.
    n.restart(&[]).await;
    n.unprepare_ok(&c).await;
    assert!(n.exclusive_gpus().is_empty(), "{:?}", n.compute_modes());
    assert_eq!(n.processes(), 0, "no process left");
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
}

/// The daemon of a claim whose entry was lost dies: the plugin's periodic
/// check starts it again (its pods run on, and kubelet will not prepare
/// the claim again), and the unprepare stops the new one.
#[tokio::test]
async fn a_lost_claims_dead_daemon_is_started_again_until_its_unprepare() {
    let (n, c, _) = lost_mps_claim(&["--mps-check-interval=100ms"]).await;
    n.kill_daemons_and_see_them_started_again();
    n.unprepare_ok(&c).await;
    assert_eq!(n.processes(), 0, "no process left");
    assert!(n.exclusive_gpus().is_empty(), "{:?}", n.compute_modes());
    assert!(!n.ledger_path().exists());
}

/// An MPS claim's entry lost, and the plugin back with another --mps-dir:
/// the daemon under the old directory is found by its mark, and since the
/// lost text names it, it is taken over where it runs instead of killed;
/// the unprepare stops it there, and the next claim's daemon starts under
/// the new directory.
#[tokio::test]
async fn a_lost_entrys_daemon_under_an_earlier_mps_dir_is_taken_over_until_its_unprepare() {
    let outside = tempfile::tempdir().unwrap();
    let new_dir = outside.path().join("run-mps");
    let flag = format!("--mps-dir={}", new_dir.display());
    let (n, c, running) = lost_mps_claim(&[&flag]).await;

    let logs = n.logs();
    assert!(logs.contains("checkpoint entry quarantined"), "{logs}");
    assert!(logs.contains("taken over where it runs"), "{logs}");
    assert_eq!(n.live_processes(), running, "left running\n{logs}");
    assert!(n.spec_path(&c).exists());

    n.unprepare_ok(&c).await;
    assert_eq!(n.processes(), 0, "no process left\n{}", n.logs());
    assert!(n.exclusive_gpus().is_empty(), "{:?}", n.compute_modes());
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
    let again = n.mps_claim("again").await;
    n.prepare_ok(&again).await;
    let daemon_dirs = std::fs::read_dir(&new_dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().is_dir())
        .count();
    assert_eq!(daemon_dirs, 1, "{}", n.logs());
    n.unprepare_ok(&again).await;
    assert_eq!(n.processes(), 0, "no process left");
}

/// Dynamic MIG, the checkpoint file unusable as a whole (moved aside): the
/// MIG devices its entries name are not swept. One claim is prepared again
/// (a restarted kubelet does that) and adopts its device, which then stays
/// with it; the other is unprepared and its device destroyed.
#[tokio::test]
async fn mig_devices_of_a_moved_aside_checkpoint_stay_until_their_claims_let_go() {
    let mut n = node("dgx-h100", &["--dynamic-mig"], DraVersion::V1).await;
    let on0 = n.device_starting_with("gpu-0-mig-1g10gb").await;
    let on1 = n.device_starting_with("gpu-1-mig-1g10gb").await;
    let again = n
        .claim("again", json!([result("mig", &on0)]), json!([]))
        .await;
    let gone = n
        .claim("gone", json!([result("mig", &on1)]), json!([]))
        .await;
    n.prepare_ok(&again).await;
    n.prepare_ok(&gone).await;
    let before = n.mig_instances();
    assert_eq!(before.len(), 2);

    n.stop();
    break_checkpoint(&n);
    n.restart(&[]).await;
    let logs = n.logs();
    assert!(logs.contains("unusable checkpoint moved aside"), "{logs}");
    assert!(
        !logs.contains("unreferenced MIG devices destroyed"),
        "{logs}"
    );
    assert_eq!(n.mig_instances(), before, "nothing swept");
    assert_eq!(n.cdi_files().len(), 2, "{:?}", n.cdi_files());
    assert!(n.checkpoint_claims().is_empty());

    // Prepared again: the device is adopted, and the claim leaves the
    // ledger without losing it.
    let mark = n.log_mark();
    n.prepare_ok(&again).await;
    assert_eq!(
        n.lines_after(mark, &["already exists", "adopted"]).len(),
        1,
        "{}",
        n.logs()
    );
    assert_eq!(n.mig_instances(), before, "the same device");
    let ledger = n.ledger();
    let names: Vec<&String> = ledger["claims"].as_object().unwrap().keys().collect();
    assert_eq!(names, [&gone.uid], "{ledger}");

    n.unprepare_ok(&gone).await;
    let left = n.mig_instances();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(!n.ledger_path().exists());
    n.unprepare_ok(&again).await;
    assert!(n.mig_instances().is_empty());
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
}

/// After a real reboot the entries of the earlier boot name nothing that
/// still runs: the daemon is gone, and the start forgets the claim's names
/// (a later daemon of that id is not taken for the lost one's). Its CDI
/// spec, on a directory that outlived the reboot, keeps it in the ledger
/// until kubelet prepares it again.
#[tokio::test]
async fn after_a_reboot_the_lost_names_of_things_gone_are_forgotten() {
    let mut n = node("t4-inference", &[], DraVersion::V1).await;
    let c = n.mps_claim("before").await;
    n.prepare_ok(&c).await;
    n.stop();
    // The reboot: the daemons are gone, the boot id is another.
    n.env.driver_root.kill_processes();
    assert_eq!(n.processes(), 0);
    let path = n.state_dir().join("checkpoint.json");
    let mut doc = n.checkpoint();
    doc["bootId"] = json!("an-earlier-boot");
    std::fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
    n.restart(&[]).await;

    let logs = n.logs();
    assert!(
        logs.contains("discarding prepared state of the previous boot"),
        "{logs}"
    );
    let line = kept_line(&n);
    assert!(
        line.contains("its CDI spec") && !line.contains("MPS daemons"),
        "{line}"
    );
    let ledger = n.ledger();
    assert!(
        ledger["claims"][&c.uid].get("mpsDaemons").is_none(),
        "{ledger}"
    );

    // Prepared again after the reboot: a fresh daemon, and the ledger is
    // done with the claim.
    n.prepare_ok(&c).await;
    assert_eq!(n.mps_daemons(), 1);
    assert!(!n.ledger_path().exists());
    n.unprepare_ok(&c).await;
    assert_eq!(n.processes(), 0);
    assert!(n.cdi_files().is_empty());
}

/// A ledger edited by hand, or damaged, naming things that are not a lost
/// claim's: another claim's MIG device, a daemon id that is no id, GPUs
/// and modes this node does not have. Nothing is done with them: a device
/// a checkpoint entry names stays with that claim, the rest is forgotten
/// at the start, and the claim's unprepare succeeds.
#[tokio::test]
async fn hostile_names_in_the_ledger_touch_nothing() {
    let mut n = node("dgx-h100", &["--dynamic-mig"], DraVersion::V1).await;
    let on0 = n.device_starting_with("gpu-0-mig-1g10gb").await;
    let live = n
        .claim("live", json!([result("mig", &on0)]), json!([]))
        .await;
    n.prepare_ok(&live).await;
    let status = n.status_devices_eventually(&live, 1).await;
    let mig = status[0]["data"]["uuid"].as_str().unwrap().to_owned();
    let before = n.mig_instances();
    n.stop();
    let ledger = json!({"version": 1, "claims": {"hostile-uid": {
        "source": "by hand",
        "migUuids": [mig],
        "mpsDaemons": ["../../evil", "shared-gpu0"],
        "computeModes": {"GPU-not-here": "Default", &before[0].0: "Bogus"},
        "timeSlices": ["GPU-not-here"],
    }}});
    n.write_ledger(&ledger);
    n.restart(&[]).await;
    assert_eq!(n.mig_instances(), before);

    let hostile = Claim::new("default", "hostile", "hostile-uid");
    n.unprepare_ok(&hostile).await;
    assert_eq!(n.mig_instances(), before, "the live claim's device stays");
    assert!(n.env.driver_root.nvidia_smi_calls().unwrap().is_empty());
    assert!(!n.ledger_path().exists(), "{}", n.logs());
    n.unprepare_ok(&live).await;
    assert!(n.mig_instances().is_empty());
}

/// Two memory shares of one GPU, one share's entry lost: the GPU's daemon
/// serves both. The other share's unprepare leaves it running for the lost
/// share's pods (the last claim out would stop it otherwise), and the lost
/// share's unprepare stops it.
#[tokio::test]
async fn a_shared_daemon_stays_for_a_lost_share_when_the_other_share_leaves() {
    let mut n = node("t4-inference", &["--memory-sharing=all"], DraVersion::V1).await;
    let lost = shared_claim(&n, 'a', "4Gi").await;
    let other = shared_claim(&n, 'b', "4Gi").await;
    n.prepare_ok(&lost).await;
    n.prepare_ok(&other).await;
    let running = n.live_processes();
    assert!(!running.is_empty());

    n.lose_entry(&lost).await;
    assert_eq!(n.live_processes(), running);

    n.unprepare_ok(&other).await;
    assert_eq!(n.live_processes(), running, "{}", n.logs());
    assert_eq!(n.exclusive_gpus().len(), 1, "{:?}", n.compute_modes());
    n.unprepare_ok(&lost).await;
    assert_eq!(n.processes(), 0, "no process left");
    assert_eq!(n.mps_daemons(), 0);
    assert!(n.exclusive_gpus().is_empty(), "{:?}", n.compute_modes());
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
}

/// The first share of a GPU lost, then a second share joins: it takes the
/// mode to restore from the ledger (the lost entry recorded it, and no
/// entry left does). Whichever claim leaves last restores the GPU's mode.
#[tokio::test]
async fn a_share_that_joins_after_the_first_was_lost_restores_the_mode_last_out() {
    for lost_leaves_first in [true, false] {
        let mut n = node("t4-inference", &["--memory-sharing=all"], DraVersion::V1).await;
        let lost = shared_claim(&n, 'a', "4Gi").await;
        n.prepare_ok(&lost).await;
        n.lose_entry(&lost).await;
        let joined = shared_claim(&n, 'b', "4Gi").await;
        n.prepare_ok(&joined).await;
        let running = n.live_processes();
        assert!(!running.is_empty());

        let (first, last) = if lost_leaves_first {
            (&lost, &joined)
        } else {
            (&joined, &lost)
        };
        n.unprepare_ok(first).await;
        assert_eq!(n.live_processes(), running, "{}", n.logs());
        assert_eq!(n.exclusive_gpus().len(), 1, "{:?}", n.compute_modes());
        n.unprepare_ok(last).await;
        assert_eq!(n.processes(), 0, "no process left");
        assert!(
            n.exclusive_gpus().is_empty(),
            "lost first: {lost_leaves_first}: {:?}\n{}",
            n.compute_modes(),
            n.logs()
        );
        assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
    }
}

/// A lost claim prepared again, whose release then fails (here: a time
/// slice the ledger names cannot be reset): the ledger keeps the claim,
/// and its unprepare releases it too, failing (for kubelet to retry) until
/// the release succeeds.
#[tokio::test]
async fn a_release_that_failed_after_a_second_prepare_is_done_at_the_unprepare() {
    let mut n = node("t4-inference", &[], DraVersion::V1).await;
    let c = n.gpu_claim("whole", "gpu-1").await;
    n.prepare_ok(&c).await;
    let status = n.status_devices_eventually(&c, 1).await;
    let gpu = status[0]["data"]["uuid"].as_str().unwrap().to_owned();
    n.lose_entry(&c).await;
    n.stop();
    // The lost entry had set a time slice (as a time-sliced claim's does).
    let mut ledger = n.ledger();
    assert!(ledger.is_object(), "no ledger after the lost entry");
    ledger["claims"][&c.uid]["timeSlices"] = json!([gpu]);
    n.write_ledger(&ledger);
    n.restart(&[]).await;
    n.fake_behaves(fake_driver_root::Behaviour {
        nvidia_smi_failure: Some((3, "GPU is busy".into())),
        ..fake_driver_root::Behaviour::default()
    });

    n.prepare_ok(&c).await;
    assert!(
        n.ledger_path().exists(),
        "the failed release keeps the claim"
    );
    let r = n.kubelet.unprepare(std::slice::from_ref(&c)).await.unwrap();
    let error = r[&c.uid].error.clone().unwrap_or_default();
    assert!(
        error.contains("releasing what the lost checkpoint entry") && error.contains("GPU is busy"),
        "{error}\n{}",
        n.logs()
    );
    n.fake_behaves(fake_driver_root::Behaviour::default());
    n.unprepare_ok(&c).await;
    assert!(!n.ledger_path().exists());
    let calls = n.env.driver_root.nvidia_smi_calls().unwrap();
    let last = calls.last().unwrap();
    assert!(
        last.args.contains(&gpu) && last.args.last().unwrap() == "0",
        "{calls:?}"
    );
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
}

/// The review's case: a damaged quote of an entry's key. The entry is not
/// found as one, its text reads as the tail of the entry before it (or as
/// the head of the file), and that entry still verifies on its own. What
/// the damaged text names (a MIG device, an MPS daemon) is kept anyway, as
/// names no claim owns: the start sweeps neither. The claim's unprepare
/// stops its daemon (whose id names the claim) and removes its spec; its
/// MIG device names no claim and stays until the ledger is removed by hand,
/// when the next start sweeps it.
#[tokio::test]
async fn a_damaged_key_quote_keeps_the_entrys_mig_device_and_daemon_until_released() {
    let mut n = node("dgx-h100", &["--dynamic-mig"], DraVersion::V1).await;
    let on0 = n.device_starting_with("gpu-0-mig-1g10gb").await;
    let on1 = n.device_starting_with("gpu-1-mig-1g10gb").await;
    let whole = n.gpu_claim("whole", "gpu-2").await;
    let mig = n
        .claim("mig", json!([result("mig", &on0)]), json!([]))
        .await;
    let shared = n
        .claim(
            "shared",
            json!([result("mig", &on1)]),
            json!([mig_config(
                &["mig"],
                json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20}})
            )]),
        )
        .await;
    for c in [&whole, &mig, &shared] {
        n.prepare_ok(c).await;
    }
    let before = n.mig_instances();
    assert_eq!(before.len(), 2);
    let running = n.live_processes();
    assert!(!running.is_empty(), "the daemon runs");

    n.stop();
    let path = n.state_dir().join("checkpoint.json");
    let text = std::fs::read_to_string(&path).unwrap();
    // The opening quote of the shared claim's key, one bit flipped: a space.
    let key = format!("\"{}\": {{", shared.uid);
    assert_eq!(text.matches(&key).count(), 1);
    std::fs::write(&path, text.replacen(&key, &format!(" {}", &key[1..]), 1)).unwrap();
    n.restart(&[]).await;

    let logs = n.logs();
    assert!(logs.contains("unusable checkpoint moved aside"), "{logs}");
    assert!(
        !logs.contains("unreferenced MIG devices destroyed")
            && !logs.contains("unreferenced MPS daemons stopped"),
        "{logs}"
    );
    assert_eq!(n.mig_instances(), before, "nothing swept");
    assert_eq!(n.live_processes(), running, "the same daemon serves on");
    let mut loaded = n.checkpoint_claims();
    loaded.sort();
    let mut expected = vec![whole.uid.clone(), mig.uid.clone()];
    expected.sort();
    assert_eq!(loaded, expected, "the other two entries verify");
    let ledger = n.ledger();
    let names = &ledger["claims"]["unattributed names"];
    assert_eq!(
        names["migUuids"].as_array().map(Vec::len),
        Some(1),
        "{ledger}"
    );
    assert_eq!(
        names["mpsDaemons"],
        json!([format!("claim-{}-0", shared.uid)]),
        "{ledger}"
    );
    for verified in [&whole, &mig] {
        assert!(ledger["claims"].get(&verified.uid).is_none(), "{ledger}");
    }
    assert!(
        n.spec_path(&shared).exists(),
        "its UID is in the damaged text"
    );
    let line = kept_line(&n);
    assert!(line.contains("no claim (unattributed"), "{line}");

    // The claim before it in the file let go: its own device goes, the
    // damaged entry's stays.
    n.unprepare_ok(&mig).await;
    assert_eq!(n.mig_instances().len(), 1, "{:?}", n.mig_instances());
    // The damaged claim's unprepare: its daemon and spec go, its MIG
    // device names no claim and stays.
    n.unprepare_ok(&shared).await;
    assert_eq!(n.processes(), 0, "no process left\n{}", n.logs());
    assert!(!n.spec_path(&shared).exists());
    assert_eq!(n.mig_instances().len(), 1);
    let ledger = n.ledger();
    assert_eq!(
        ledger["claims"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["unattributed names"],
        "{ledger}"
    );
    assert!(
        ledger["claims"]["unattributed names"]
            .get("mpsDaemons")
            .is_none()
    );

    // A start keeps it; the admin's way releases it.
    n.restart(&[]).await;
    assert_eq!(n.mig_instances().len(), 1);
    n.stop();
    std::fs::remove_file(n.ledger_path()).unwrap();
    n.restart(&[]).await;
    assert!(n.mig_instances().is_empty(), "{}", n.logs());
    assert!(n.logs().contains("unreferenced MIG devices destroyed"));
    n.unprepare_ok(&whole).await;
}

/// A damaged byte inside a MIG device's UUID: the quarantined entry names
/// a device the node does not have. The start finds the node's device in
/// the damaged text, one byte off, keeps it for the claim, and the claim's
/// unprepare destroys it.
#[tokio::test]
async fn a_damaged_byte_inside_a_mig_uuid_still_keeps_the_device_for_its_claim() {
    let mut n = node("dgx-h100", &["--dynamic-mig"], DraVersion::V1).await;
    let on0 = n.device_starting_with("gpu-0-mig-1g10gb").await;
    let c = n
        .claim("mig", json!([result("mig", &on0)]), json!([]))
        .await;
    n.prepare_ok(&c).await;
    let before = n.mig_instances();
    let uuid = n.checkpoint()["entries"][&c.uid]["entry"]["devices"][0]["kind"]["migUuid"]
        .as_str()
        .unwrap()
        .to_owned();

    n.stop();
    let path = n.state_dir().join("checkpoint.json");
    let text = std::fs::read_to_string(&path).unwrap();
    // A bit flipped in the UUID's first group: still JSON, still a UUID,
    // another one.
    let mut damaged = uuid.clone().into_bytes();
    damaged[5] ^= 0x01;
    let damaged = String::from_utf8(damaged).unwrap();
    std::fs::write(&path, text.replacen(&uuid, &damaged, 1)).unwrap();
    n.restart(&[]).await;

    let logs = n.logs();
    assert!(logs.contains("checkpoint entry quarantined"), "{logs}");
    assert!(logs.contains("a byte off"), "{logs}");
    assert!(
        !logs.contains("unreferenced MIG devices destroyed"),
        "{logs}"
    );
    assert_eq!(n.mig_instances(), before, "nothing swept");
    let ledger = n.ledger();
    let kept = &ledger["claims"][&c.uid];
    assert!(
        kept["migUuids"].as_array().unwrap().contains(&json!(uuid)),
        "{ledger}"
    );
    assert!(
        kept.get("damagedText").is_none(),
        "looked in once: {ledger}"
    );

    n.unprepare_ok(&c).await;
    assert!(n.mig_instances().is_empty());
    assert!(!n.ledger_path().exists());
}
