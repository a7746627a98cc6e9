//! Crash safety of claim preparation, end to end: the real plugin binary is
//! made to abort (`GPU_DRA_FAILPOINT`, `std::process::abort`: for the files,
//! daemons and fake hardware the same as SIGKILL) at every step of a
//! prepare, of an unprepare, and of the checkpoint write (every step of the
//! first write; each later write of the prepare torn and made durable,
//! `checkpoint-<step>@N`), then restarted on
//! the same machine (fake NVML state file, proc and dev roots, driver root,
//! plugin state directory). Startup recovery must leave the node either
//! clean (a half-prepared claim) or fully prepared (a completed one); the
//! same prepare then succeeds, an unprepare succeeds, and nothing is left:
//! no MIG instance (fake NVML state and capability files), no MPS daemon
//! (directories and processes), no CDI file, no checkpoint entry, no
//! `status.devices` entry of ours, every compute mode back to `Default`.
//!
//! The claim exercises every step: a whole GPU with time-slicing
//! (`nvidia-smi compute-policy`), a whole GPU with an MPS config (MIG mode
//! check, compute mode change, a control daemon), then a dynamic MIG
//! device on another GPU with a `MigDeviceConfig` MPS config (GPU instance
//! and compute instance creation, capability nodes, a second daemon), on a
//! DGX H100 with `--dynamic-mig`.
//!
//! At the end, two checkpoint writes that fail in a row (injected I/O
//! errors, `checkpoint-fail-<step>@N`) instead of a crash.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use common::prepare::{Node, gpu_config, mig_config, node_with, result};
use common::{DRIVER, NODE};
use gpu_dra_sim::kubelet::{Claim, DraVersion};
use serde_json::json;

const PROFILE: &str = "dgx-h100";
const FLAGS: &[&str] = &["--dynamic-mig"];
const FAILPOINT: &str = "GPU_DRA_FAILPOINT";
/// The whole GPU with MPS; the MIG device is on GPU 0.
const WHOLE: &str = "gpu-1";
/// The whole GPU with time-slicing.
const TIME_SLICED: &str = "gpu-2";

/// The claim described in the module docs (and a time-sliced GPU first):
/// `(claim, MIG device name)`.
async fn full_claim(n: &Node) -> (Claim, String) {
    let mig = n.device_starting_with("gpu-0-mig-1g10gb-19-").await;
    let mut whole = gpu_config(json!({"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "8Gi"}}));
    whole["requests"] = json!(["whole"]);
    let mut time_sliced =
        gpu_config(json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}));
    time_sliced["requests"] = json!(["ts"]);
    let claim = n
        .claim(
            "crash",
            json!([
                result("ts", TIME_SLICED),
                result("whole", WHOLE),
                result("mig", &mig)
            ]),
            json!([
                time_sliced,
                whole,
                mig_config(
                    &["mig"],
                    json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20}})
                ),
            ]),
        )
        .await;
    (claim, mig)
}

/// Our entries in the claim's `status.devices`, once there are
/// `expected` entries (written in the background after the answer).
async fn our_status(n: &Node, claim: &Claim, expected: usize) -> Vec<serde_json::Value> {
    n.status_devices_eventually(claim, expected)
        .await
        .into_iter()
        .filter(|d| d["driver"] == DRIVER && d["pool"] == NODE)
        .collect()
}

/// Asserts that the node holds nothing of `claim`.
async fn assert_clean(n: &Node, claim: &Claim, when: &str) {
    let gis = n.mig_instances();
    assert!(
        gis.is_empty(),
        "{when}: MIG instances left in NVML: {gis:?}\n{}",
        n.logs()
    );
    let caps = n.mig_caps();
    assert!(
        caps.is_empty(),
        "{when}: MIG capability files left: {caps:?}\n{}",
        n.logs()
    );
    assert_eq!(
        n.mps_daemons(),
        0,
        "{when}: MPS daemon directories left\n{}",
        n.logs()
    );
    assert_eq!(n.processes(), 0, "{when}: MPS processes left\n{}", n.logs());
    let files = n.cdi_files();
    assert!(
        files.is_empty(),
        "{when}: CDI files left: {files:?}\n{}",
        n.logs()
    );
    let entries = n.checkpoint_claims();
    assert!(
        entries.is_empty(),
        "{when}: checkpoint entries left: {entries:?}\n{}",
        n.logs()
    );
    {
        let modes = n.compute_modes();
        assert!(
            modes.values().all(|m| m == "Default"),
            "{when}: compute modes not restored: {modes:?}\n{}",
            n.logs()
        );
        let slices = n.env.driver_root.gpu_state().unwrap().timeslice;
        assert!(
            slices.values().all(|v| *v == 0),
            "{when}: time-slice intervals not reset: {slices:?}\n{}",
            n.logs()
        );
    }
    let status = our_status(n, claim, 0).await;
    assert!(
        status.is_empty(),
        "{when}: status.devices entries left: {status:?}\n{}",
        n.logs()
    );
}

/// Asserts that the node holds `claim` fully prepared: two daemons
/// running, the MIG instance with its capability files, the CDI spec, the
/// completed checkpoint entry, GPU 1 in exclusive-process mode.
fn assert_prepared(n: &Node, claim: &Claim, when: &str) {
    assert_eq!(n.mig_instances().len(), 1, "{when}\n{}", n.logs());
    assert_eq!(n.mig_caps().len(), 2, "{when}: gi and ci\n{}", n.logs());
    assert_eq!(n.mps_daemons(), 2, "{when}\n{}", n.logs());
    assert!(
        n.live_processes().len() >= 2,
        "{when}: daemons not running\n{}",
        n.logs()
    );
    assert!(n.spec_path(claim).is_file(), "{when}\n{}", n.logs());
    assert_eq!(
        n.checkpoint()["entries"][&claim.uid]["entry"]["state"],
        "PrepareCompleted",
        "{when}: {}\n{}",
        n.checkpoint(),
        n.logs()
    );
    assert_eq!(
        n.exclusive_gpus().len(),
        1,
        "{when}: {:?}\n{}",
        n.compute_modes(),
        n.logs()
    );
    let slices = n.env.driver_root.gpu_state().unwrap().timeslice;
    assert_eq!(
        slices.values().filter(|v| **v == 3).count(),
        1,
        "{when}: {slices:?}\n{}",
        n.logs()
    );
}

/// Waits for the aborted plugin and checks it died at the failpoint.
fn assert_aborted(n: &mut Node, failpoint: &str) {
    let status = n.plugin.wait_exit(Duration::from_secs(10));
    assert_eq!(
        status.signal(),
        Some(6),
        "{failpoint}: the plugin did not abort: {status}\n{}",
        n.logs()
    );
    assert!(
        n.plugin.stderr().contains("failpoint hit"),
        "{failpoint}: not aborted by the failpoint\n{}",
        n.logs()
    );
}

/// A successful prepare of `claim` as the claim shape expects it.
async fn prepare_and_check(n: &Node, claim: &Claim, mig: &str) {
    let r = n.prepare_ok(claim).await;
    let mut devices: Vec<&str> = r.devices.iter().map(|d| d.device_name.as_str()).collect();
    devices.sort_unstable();
    let mut expected = vec![TIME_SLICED, WHOLE, mig];
    expected.sort_unstable();
    assert_eq!(devices, expected, "{}", n.logs());
    assert_prepared(n, claim, "after the prepare");
    let status = our_status(n, claim, 3).await;
    assert_eq!(
        status.len(),
        3,
        "status.devices after the prepare: {status:?}\n{}",
        n.logs()
    );
    let mig_entry = status
        .iter()
        .find(|d| d["device"] == mig)
        .unwrap_or_else(|| panic!("{mig} not in {status:?}"));
    assert!(
        mig_entry["data"]["uuid"]
            .as_str()
            .is_some_and(|u| u.starts_with("MIG-")),
        "{status:?}"
    );
}

/// What startup recovery must leave after a crash in a prepare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum After {
    /// The crash came before `PrepareCompleted` was durable: all undone.
    Clean,
    /// `PrepareCompleted` was durable: kept, daemons re-adopted.
    Prepared,
}

/// Crash in a prepare at `failpoint`, restart, recovery, prepare again,
/// unprepare.
async fn crash_in_prepare(failpoint: &str, after: After) {
    let mut n = node_with(PROFILE, FLAGS, DraVersion::V1, &[(FAILPOINT, failpoint)]).await;
    let (claim, mig) = full_claim(&n).await;
    let answer = n.kubelet.prepare(std::slice::from_ref(&claim)).await;
    assert!(
        answer.is_err(),
        "{failpoint}: the prepare was answered: {answer:?}\n{}",
        n.logs()
    );
    assert_aborted(&mut n, failpoint);

    n.restart(&[]).await;
    match after {
        After::Prepared => assert_prepared(&n, &claim, &format!("{failpoint}: after recovery")),
        After::Clean => assert_clean(&n, &claim, &format!("{failpoint}: after recovery")).await,
    }
    prepare_and_check(&n, &claim, &mig).await;
    n.unprepare_ok(&claim).await;
    assert_clean(&n, &claim, &format!("{failpoint}: after the unprepare")).await;
    assert_no_temp_files(&n);
}

/// Prepare, crash in the unprepare at `failpoint`, restart, unprepare
/// again.
async fn crash_in_unprepare(failpoint: &str) {
    let mut n = node_with(PROFILE, FLAGS, DraVersion::V1, &[]).await;
    let (claim, mig) = full_claim(&n).await;
    prepare_and_check(&n, &claim, &mig).await;

    n.restart(&[(FAILPOINT, failpoint)]).await;
    let answer = n.kubelet.unprepare(std::slice::from_ref(&claim)).await;
    assert!(
        answer.is_err(),
        "{failpoint}: the unprepare was answered: {answer:?}\n{}",
        n.logs()
    );
    assert_aborted(&mut n, failpoint);

    n.restart(&[]).await;
    n.unprepare_ok(&claim).await;
    assert_clean(&n, &claim, &format!("{failpoint}: after the unprepare")).await;
    assert_no_temp_files(&n);
    // Once more: an unprepare of a claim no longer known succeeds.
    n.unprepare_ok(&claim).await;
}

/// No temp file of an interrupted write is left once later writes
/// succeeded, but the checkpoint's own: it stays, holding the version
/// before the current one (each write is swapped in with it).
fn assert_no_temp_files(n: &Node) {
    let temps: Vec<std::path::PathBuf> = std::fs::read_dir(n.state_dir())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "tmp"))
        .filter(|p| !p.ends_with("checkpoint.json.tmp"))
        .collect();
    assert!(temps.is_empty(), "{temps:?}\n{}", n.logs());
    let spare = n.state_dir().join("checkpoint.json.tmp");
    assert!(
        spare.is_file()
            && std::fs::read(&spare).unwrap()
                != std::fs::read(n.state_dir().join("checkpoint.json")).unwrap(),
        "the checkpoint's temp file should hold the version before the current one\n{}",
        n.logs()
    );
}

/// Checkpoint writes of the full claim's prepare, in order: the journal
/// before the time-slice change, the journal before the MPS GPU's compute
/// mode change, then `PrepareCompleted` (nothing else is journalled: the
/// time-sliced GPU is in `Default` mode already, and what the MIG device
/// gets is found by the startup sweep).
const PREPARE_WRITES: u32 = 3;

macro_rules! prepare_crash_tests {
    ($($name:ident => $failpoint:expr, $after:ident;)*) => {
        $(
            #[tokio::test]
            async fn $name() {
                crash_in_prepare(&$failpoint, After::$after).await;
            }
        )*
    };
}

macro_rules! unprepare_crash_tests {
    ($($name:ident => $failpoint:literal;)*) => {
        $(
            #[tokio::test]
            async fn $name() {
                crash_in_unprepare($failpoint).await;
            }
        )*
    };
}

prepare_crash_tests! {
    prepare_crash_after_started => "prepare-after-started", Clean;
    prepare_crash_after_mig => "prepare-after-mig", Clean;
    prepare_crash_after_mps => "prepare-after-mps", Clean;
    prepare_crash_after_cdi => "prepare-after-cdi", Clean;
    prepare_crash_after_completed => "prepare-after-completed", Prepared;
    // The first checkpoint write (the time-slice journal), at every step.
    prepare_crash_before_checkpoint_temp_write => "checkpoint-before-temp-write", Clean;
    prepare_crash_mid_checkpoint_temp_write => "checkpoint-mid-temp-write", Clean;
    prepare_crash_after_checkpoint_temp_write => "checkpoint-after-temp-write", Clean;
    prepare_crash_after_checkpoint_rename => "checkpoint-after-rename", Clean;
    prepare_crash_after_checkpoint_dir_sync => "checkpoint-after-dir-sync", Clean;
    // The later writes, each torn and each made durable: the compute mode
    // journal (the old entry or the new one is on disk, the change not yet
    // made) and PrepareCompleted (torn: all undone; durable: kept).
    prepare_crash_mid_second_checkpoint_write => "checkpoint-mid-temp-write@2", Clean;
    prepare_crash_after_second_checkpoint_rename => "checkpoint-after-rename@2", Clean;
    prepare_crash_mid_completed_checkpoint_write =>
        format!("checkpoint-mid-temp-write@{PREPARE_WRITES}"), Clean;
    prepare_crash_after_completed_checkpoint_rename =>
        format!("checkpoint-after-rename@{PREPARE_WRITES}"), Prepared;
}

unprepare_crash_tests! {
    unprepare_crash_after_undo => "unprepare-after-undo";
    unprepare_crash_before_checkpoint_temp_write => "checkpoint-before-temp-write";
    unprepare_crash_mid_checkpoint_temp_write => "checkpoint-mid-temp-write";
    unprepare_crash_after_checkpoint_temp_write => "checkpoint-after-temp-write";
    unprepare_crash_after_checkpoint_rename => "checkpoint-after-rename";
    unprepare_crash_after_checkpoint_dir_sync => "checkpoint-after-dir-sync";
}

/// The prepare writes the checkpoint exactly [`PREPARE_WRITES`] times: a
/// failpoint at the next write does not fire in the prepare (the tests at
/// `@PREPARE_WRITES` show that write is `PrepareCompleted`), it fires in
/// the unprepare's one write, and the restarted plugin finishes the
/// unprepare.
#[tokio::test]
async fn the_full_claim_prepare_writes_the_checkpoint_exactly_that_often() {
    let failpoint = format!("checkpoint-before-temp-write@{}", PREPARE_WRITES + 1);
    let mut n = node_with(PROFILE, FLAGS, DraVersion::V1, &[(FAILPOINT, &failpoint)]).await;
    let (claim, mig) = full_claim(&n).await;
    prepare_and_check(&n, &claim, &mig).await;
    let answer = n.kubelet.unprepare(std::slice::from_ref(&claim)).await;
    assert!(
        answer.is_err(),
        "{failpoint}: the unprepare was answered: {answer:?}\n{}",
        n.logs()
    );
    assert_aborted(&mut n, &failpoint);
    n.restart(&[]).await;
    n.unprepare_ok(&claim).await;
    assert_clean(&n, &claim, "after the unprepare").await;
    assert_no_temp_files(&n);
}

/// The prepare's `PrepareCompleted` write fails after the new file took the
/// checkpoint's name (its directory's fsync), then the rollback's next
/// write (`second`) fails too. The completed entry is what the file holds,
/// and what a retry is answered from, so the hardware may go only once the
/// entry no longer reads completed. Returns the prepare's error too.
async fn failed_commit_then_failed_write(second: u32) -> (Node, Claim, String, String) {
    let failpoints =
        format!("checkpoint-fail-dir-sync@{PREPARE_WRITES},checkpoint-fail-temp-write@{second}");
    let n = node_with(PROFILE, FLAGS, DraVersion::V1, &[(FAILPOINT, &failpoints)]).await;
    let (claim, mig) = full_claim(&n).await;
    let r = n.prepare(std::slice::from_ref(&claim)).await;
    let error = r[&claim.uid].error.clone().unwrap_or_default();
    (n, claim, mig, error)
}

/// The mark for the rollback fails: nothing is undone, the claim stays
/// prepared as the file says, and the retry is answered from it, true.
#[tokio::test]
async fn a_completed_entry_on_disk_that_cannot_be_marked_keeps_its_hardware() {
    let (n, claim, mig, error) = failed_commit_then_failed_write(PREPARE_WRITES + 1).await;
    assert!(
        error.contains("injected directory fsync failure"),
        "{error}\n{}",
        n.logs()
    );
    assert_prepared(&n, &claim, "after the failed commit");
    assert!(n.logs().contains("rollback not started"), "{}", n.logs());
    prepare_and_check(&n, &claim, &mig).await;
    n.unprepare_ok(&claim).await;
    assert_clean(&n, &claim, "after the unprepare").await;
}

/// The mark succeeds and the hardware is undone, then the removal fails:
/// the entry stays `PrepareStarted`, so the retry undoes it again and
/// prepares afresh instead of answering a completed entry.
#[tokio::test]
async fn a_rollback_whose_removal_fails_leaves_a_started_entry_for_the_retry() {
    let (n, claim, mig, error) = failed_commit_then_failed_write(PREPARE_WRITES + 2).await;
    assert!(
        error.contains("(rollback)") && error.contains("injected write failure"),
        "{error}\n{}",
        n.logs()
    );
    assert_eq!(
        n.checkpoint()["entries"][&claim.uid]["entry"]["state"],
        "PrepareStarted",
        "{}\n{}",
        n.checkpoint(),
        n.logs()
    );
    assert_eq!(n.processes(), 0, "the daemons were stopped\n{}", n.logs());
    prepare_and_check(&n, &claim, &mig).await;
    n.unprepare_ok(&claim).await;
    assert_clean(&n, &claim, "after the unprepare").await;
}
