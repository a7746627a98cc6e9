//! Faults of the node under the real plugin binary: a full disk (a small
//! tmpfs) under the plugin's state directory and under the CDI root, a
//! read-only CDI root (at run time and at start), an API server that
//! refuses or never answers writes (the stand-in's fault knob), kubelet's
//! socket directories removed under the running plugin, and gRPC requests
//! over the message size limit.
//!
//! The file system faults need `mount -t tmpfs` (root): where mounting is
//! refused, those tests say so loudly and pass without checking anything,
//! unless `GPU_DRA_E2E_REQUIRE_MOUNT=1` (CI) makes that a failure.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::prepare::{Node, gpu_config, node, node_with, result};
use common::{DRIVER, NODE, Plugin, SMALL_PROFILE, short_dir};
use gpu_dra_sim::apiserver::{DeleteOptions, Resource, Selectors, WriteFault};
use gpu_dra_sim::kubelet::{Claim, DraVersion, KubeletSim};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// A small tmpfs, unmounted on drop.

/// A tmpfs mounted for one test; unmounted (lazily, so that a plugin
/// still holding files there cannot keep it) when dropped, also when the
/// test fails.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`mount -o size=`) on `dir` (created).
    /// `None` when mounting is refused and not required.
    fn mount(dir: &Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .expect("run mount");
        if out.status.success() {
            return Some(Self {
                dir: dir.to_owned(),
            });
        }
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(
            std::env::var("GPU_DRA_E2E_REQUIRE_MOUNT").as_deref() != Ok("1"),
            "mount -t tmpfs on {} refused: {why}",
            dir.display()
        );
        eprintln!(
            "\n*** SKIPPED: mount -t tmpfs on {} refused ({}); this test needs root. \
             Set GPU_DRA_E2E_REQUIRE_MOUNT=1 to make this a failure. ***\n",
            dir.display(),
            why.trim()
        );
        None
    }

    /// Remounts it read-only (`ro`) or read-write.
    fn remount(&self, read_only: bool) {
        let mode = if read_only {
            "remount,ro"
        } else {
            "remount,rw"
        };
        let ok = Command::new("mount")
            .args(["-o", mode])
            .arg(&self.dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount -o {mode} {} failed", self.dir.display());
    }

    /// Fills it up: a file written until `ENOSPC`; removing the returned
    /// path frees the space.
    fn fill(&self) -> PathBuf {
        let path = self.dir.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 4096];
        loop {
            match f.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        // Whatever the last page left.
        while f.write_all(&[0]).is_ok() {}
        path
    }

    /// Names in the directory, `filler` left out.
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "filler")
            .collect();
        names.sort();
        names
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// A claim for a whole GPU and a time-sliced one: the time slice is a
/// hardware change the checkpoint journals before it is made.
async fn two_gpu_claim(n: &Node, name: &str) -> Claim {
    two_gpu_claim_on(n, name, "gpu-0").await
}

/// [`two_gpu_claim`] with `whole` as the whole GPU (`gpu-2` time-sliced).
async fn two_gpu_claim_on(n: &Node, name: &str, whole: &str) -> Claim {
    let mut ts =
        gpu_config(json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}));
    ts["requests"] = json!(["ts"]);
    n.claim(
        name,
        json!([result("gpu", whole), result("ts", "gpu-2")]),
        json!([ts]),
    )
    .await
}

/// The time slice settings the fake `nvidia-smi` was asked for, in order
/// (the last argument of each `--set-timeslice` call).
fn time_slice_calls(n: &Node) -> Vec<String> {
    n.env
        .driver_root
        .nvidia_smi_calls()
        .unwrap()
        .into_iter()
        .filter(|c| c.args.iter().any(|a| a == "--set-timeslice"))
        .map(|c| c.args.last().cloned().unwrap_or_default())
        .collect()
}

/// Asserts that the node holds nothing of `claim`: no checkpoint entry in
/// `checkpoint` (the file), no CDI spec, every time slice set also reset.
fn nothing_left_of(n: &Node, claim: &Claim, checkpoint: &Path) {
    let text = std::fs::read_to_string(checkpoint).unwrap_or_default();
    assert!(
        !text.contains(&claim.uid),
        "checkpoint still names the claim: {text}"
    );
    assert!(!n.spec_path(claim).exists(), "{:?}", n.cdi_files());
    let calls = time_slice_calls(n);
    assert!(
        calls.last().is_none_or(|last| last == "0"),
        "a time slice was left set: {calls:?}"
    );
}

/// The one per-claim error of a prepare of `claim`.
async fn prepare_error(n: &Node, claim: &Claim) -> String {
    let mut answers = n.prepare(std::slice::from_ref(claim)).await;
    let r = answers.remove(&claim.uid).unwrap();
    assert!(r.devices.is_empty(), "{r:?}");
    match r.error {
        Some(e) => e,
        None => panic!("prepared on a faulty node: {:?}\n{}", r.devices, n.logs()),
    }
}

/// The plugin still answers kubelet: an unknown claim unprepares fine.
async fn still_serving(n: &Node) {
    let r = n
        .kubelet
        .unprepare(&[Claim::new("default", "nobody", "never-prepared")])
        .await
        .unwrap_or_else(|e| panic!("the plugin stopped serving: {e}\n{}", n.logs()));
    assert_eq!(r["never-prepared"].error, None);
}

// ---------------------------------------------------------------------------
// A full disk.

#[tokio::test]
async fn a_full_state_dir_fails_the_claim_cleanly_and_it_prepares_once_freed() {
    let mounts = short_dir();
    let Some(state) = Tmpfs::mount(&mounts.path().join("state"), "1m") else {
        return;
    };
    let state_flag = state.dir.to_str().unwrap().to_owned();
    let n = node_with(
        SMALL_PROFILE,
        &["--state-dir", &state_flag],
        DraVersion::V1,
        &[],
    )
    .await;
    let checkpoint = state.dir.join("checkpoint.json");
    let claim = two_gpu_claim(&n, "full-state").await;
    let before = state.names();
    let filler = state.fill();

    let error = prepare_error(&n, &claim).await;
    assert!(
        error.contains("No space left on device") && error.contains(&state_flag),
        "not precise: {error}"
    );
    nothing_left_of(&n, &claim, &checkpoint);
    // Nothing new: `checkpoint.json.tmp` is there before too, the buffer
    // the store exchanges with the checkpoint on every write.
    assert_eq!(before, state.names(), "the state directory changed");
    still_serving(&n).await;

    std::fs::remove_file(filler).unwrap();
    let r = n.prepare_ok(&claim).await;
    assert_eq!(r.devices.len(), 2, "{r:?}");
    assert!(
        std::fs::read_to_string(&checkpoint)
            .unwrap()
            .contains(&claim.uid)
    );
    n.unprepare_ok(&claim).await;
    nothing_left_of(&n, &claim, &checkpoint);
}

/// Size of a file, 0 when it is missing.
fn size(path: &Path) -> usize {
    std::fs::metadata(path).map_or(0, |m| m.len() as usize)
}

/// The commit that fails is the second of the prepare, after the time
/// slice was set: the checkpoint is grown with other claims until the
/// claim's `PrepareStarted` version still fits into the one page the
/// store's temp file holds, and its `PrepareCompleted` version does not.
/// On the full tmpfs the first write then succeeds and the second fails.
#[tokio::test]
async fn a_commit_failing_on_a_full_disk_after_the_hardware_was_set_rolls_it_back() {
    const PAGE: usize = 4096;
    let mounts = short_dir();
    let Some(state) = Tmpfs::mount(&mounts.path().join("state"), "1m") else {
        return;
    };
    let state_flag = state.dir.to_str().unwrap().to_owned();
    let n = node_with(
        "dgx-h100",
        &["--dynamic-mig", "--state-dir", &state_flag],
        DraVersion::V1,
        &[],
    )
    .await;
    let checkpoint = state.dir.join("checkpoint.json");
    let temp = state.dir.join("checkpoint.json.tmp");

    // What the claim adds to the checkpoint, started and completed (after
    // a prepare, the temp file holds the version before the last write).
    // The same claim on the DGX's GPUs 1 and 2.
    let claim = two_gpu_claim_on(&n, "late-full", "gpu-1").await;
    n.prepare_ok(&claim).await;
    let (started, completed) = (size(&temp), size(&checkpoint));
    n.unprepare_ok(&claim).await;
    let base = size(&checkpoint);
    let (d_started, d_completed) = (started - base, completed - base);
    assert!(d_completed > d_started + 32, "{d_started} {d_completed}");
    // The base size that puts the page boundary in the middle of the two.
    let wanted = PAGE - usize::midpoint(d_started, d_completed);

    // Pad claims on the other GPUs, their names sized to hit it.
    let mut pad_cost = None;
    for gpu in [3, 4, 5, 6, 7, 0] {
        let now = size(&checkpoint);
        if now >= wanted - 8 {
            break;
        }
        let len = match pad_cost {
            None => 100,
            Some(cost) => (wanted - now).saturating_sub(cost).clamp(1, 240),
        };
        // DNS labels are at most 63 bytes: a dot every 50.
        let filling: String = (1..=len)
            .map(|i| if i % 50 == 0 && i < len { '.' } else { 'a' })
            .collect();
        let name = format!("pad{gpu}-{filling}");
        let pad = n.gpu_claim(&name, &format!("gpu-{gpu}")).await;
        n.prepare_ok(&pad).await;
        pad_cost.get_or_insert(size(&checkpoint) - now - len);
    }
    let padded = size(&checkpoint);
    assert!(
        padded + d_started + 4 <= PAGE && padded + d_completed >= PAGE + 4,
        "cannot place the page boundary: base {padded}, +{d_started}, +{d_completed}"
    );
    assert!(size(&temp) <= PAGE, "the temp file holds more than a page");

    let before = state.names();
    let filler = state.fill();
    let error = prepare_error(&n, &claim).await;
    assert!(
        error.contains("No space left on device") && error.contains(&state_flag),
        "not precise: {error}"
    );
    // Set by this attempt (after the measuring prepare's set and reset),
    // and set back by the rollback.
    assert_eq!(time_slice_calls(&n), ["3", "0", "3", "0"]);
    nothing_left_of(&n, &claim, &checkpoint);
    assert_eq!(before, state.names(), "the state directory changed");
    still_serving(&n).await;

    std::fs::remove_file(filler).unwrap();
    n.prepare_ok(&claim).await;
    n.unprepare_ok(&claim).await;
    nothing_left_of(&n, &claim, &checkpoint);
}

#[tokio::test]
async fn a_full_cdi_root_fails_the_claim_cleanly_and_it_prepares_once_freed() {
    let n = node(SMALL_PROFILE, &[], DraVersion::V1).await;
    let Some(cdi) = Tmpfs::mount(&n.env.cdi_root, "256k") else {
        return;
    };
    let checkpoint = n.state_dir().join("checkpoint.json");
    let claim = two_gpu_claim(&n, "full-cdi").await;
    let filler = cdi.fill();

    let error = prepare_error(&n, &claim).await;
    let root = n.env.cdi_root.to_str().unwrap();
    assert!(
        error.contains("No space left on device") && error.contains(root),
        "not precise: {error}"
    );
    // The time slice was set (journalled first) before the spec write
    // failed, and set back by the rollback.
    assert_eq!(time_slice_calls(&n), ["3", "0"]);
    nothing_left_of(&n, &claim, &checkpoint);
    assert_eq!(
        cdi.names(),
        Vec::<String>::new(),
        "a partial spec or temp file is left"
    );
    still_serving(&n).await;

    std::fs::remove_file(filler).unwrap();
    n.prepare_ok(&claim).await;
    assert!(n.spec_path(&claim).exists());
    n.unprepare_ok(&claim).await;
    nothing_left_of(&n, &claim, &checkpoint);
    assert!(cdi.names().is_empty(), "{:?}", cdi.names());
}

// ---------------------------------------------------------------------------
// A read-only CDI root.

#[tokio::test]
async fn a_read_only_cdi_root_fails_claims_at_run_time_and_the_start_is_refused() {
    let mut n = node(SMALL_PROFILE, &[], DraVersion::V1).await;
    let Some(cdi) = Tmpfs::mount(&n.env.cdi_root, "1m") else {
        return;
    };
    let checkpoint = n.state_dir().join("checkpoint.json");
    let claim = two_gpu_claim(&n, "ro-cdi").await;
    cdi.remount(true);

    let error = prepare_error(&n, &claim).await;
    let root = n.env.cdi_root.to_str().unwrap().to_owned();
    assert!(
        error.contains("Read-only file system") && error.contains(&root),
        "not precise: {error}"
    );
    nothing_left_of(&n, &claim, &checkpoint);
    still_serving(&n).await;

    // Started on a read-only CDI root, the plugin refuses with the reason.
    n.stop();
    let mut refused = Plugin::spawn(&n.env, n.dir.path(), "ro-start", &[]);
    let status = refused.wait_exit(WAIT);
    let log = refused.stderr();
    common::assert_one_line_error(status, &log, "Read-only file system");
    assert!(log.contains(&root), "{log}");

    cdi.remount(false);
    n.restart(&[]).await;
    n.prepare_ok(&claim).await;
    n.unprepare_ok(&claim).await;
    nothing_left_of(&n, &claim, &checkpoint);
}

// ---------------------------------------------------------------------------
// An API server that refuses or never answers writes.

/// Deletes the node's ResourceSlices in the store (behind the plugin's
/// back, past the fault knob), so the plugin has to write them again.
fn delete_slices(n: &Node) {
    let store = n.env.api.store();
    let (items, _) = store.list(Resource::ResourceSlices, None, &Selectors::default());
    for s in items {
        let name = s["metadata"]["name"].as_str().unwrap();
        store
            .delete(
                Resource::ResourceSlices,
                None,
                name,
                &DeleteOptions::default(),
            )
            .unwrap();
    }
}

async fn serves_and_republishes_despite(fault: WriteFault) {
    let n = node(SMALL_PROFILE, &[], DraVersion::V1).await;
    n.env.wait_pool(NODE, WAIT).await;
    let claim = n.gpu_claim("api-fault", "gpu-1").await;
    let faults = n.env.api.faults();
    faults.set_writes(fault);
    delete_slices(&n);

    // Kubelet's calls are answered while every write fails.
    let r = n.prepare_ok(&claim).await;
    assert_eq!(r.devices.len(), 1);
    n.unprepare_ok(&claim).await;
    n.prepare_ok(&claim).await;

    // The publisher retries with backoff (250 ms doubling; a 429 is
    // retried by the kube client after `Retry-After`, 1 s), and so do the
    // claim's `status.devices` writes (3 attempts of 5 s each): tens of
    // writes in these seconds (measured: 11 for a 500, 30 for a 429, 5
    // hung; the publisher alone, without the claim: 5, 4 and 1), where a
    // spinning client makes thousands.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let writes = faults.faulted_writes();
    eprintln!("{fault:?}: {writes} writes met the fault in 4 s");
    assert!(writes >= 1, "the publisher never tried again");
    assert!(
        writes <= 100,
        "{writes} writes refused in 4 s: the publisher spins\n{}",
        n.logs()
    );
    assert!(n.env.slices(NODE).is_empty());
    // Logged once a pass gives up: at once for a 500; a 429, which the
    // kube client retries on its own, and a write with no answer, after
    // the publisher's 30 s limit on one pass.
    let deadline = Instant::now() + Duration::from_secs(45);
    while !n.logs().contains("failed, will retry with backoff") {
        assert!(Instant::now() < deadline, "never logged: {}", n.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(n.env.slices(NODE).is_empty());

    // Recovered: the pool is published again.
    faults.set_writes(WriteFault::None);
    n.env.wait_pool(NODE, Duration::from_secs(40)).await;
    n.unprepare_ok(&claim).await;
}

#[tokio::test]
async fn an_api_server_refusing_every_write_with_500_does_not_stop_serving() {
    serves_and_republishes_despite(WriteFault::Status(500)).await;
}

#[tokio::test]
async fn an_api_server_throttling_every_write_does_not_stop_serving() {
    serves_and_republishes_despite(WriteFault::Status(429)).await;
}

#[tokio::test]
async fn an_api_server_hanging_every_write_does_not_stop_serving() {
    serves_and_republishes_despite(WriteFault::Hang).await;
}

// ---------------------------------------------------------------------------
// Kubelet's socket directories removed under the plugin.

#[tokio::test]
async fn socket_directories_removed_under_the_plugin_are_bound_again_and_kubelet_registers_anew() {
    let n = node(SMALL_PROFILE, &[], DraVersion::V1).await;
    let first = n.gpu_claim("before", "gpu-0").await;
    n.prepare_ok(&first).await;
    let mut registrar = KubeletSim::new().watch_registrar(&n.plugin.reg_dir);
    registrar.wait_registered(DRIVER, WAIT).await.unwrap();

    std::fs::remove_dir_all(&n.plugin.reg_dir).unwrap();
    std::fs::remove_dir_all(&n.plugin.plugins_dir).unwrap();
    let removed = Instant::now();
    registrar.wait_deregistered(DRIVER, WAIT).await.unwrap();
    let p = registrar
        .wait_registered(DRIVER, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", n.logs()));
    eprintln!("registered again {:?} after the removal", removed.elapsed());
    assert!(n.logs().contains("kubelet plugin sockets bound again"));
    // The checkpoint lived in the removed directory: it is written again
    // before any call comes, so a crash now would still find the claim.
    let checkpoint = n.state_dir().join("checkpoint.json");
    assert!(
        n.state_dir().starts_with(&n.plugin.plugins_dir),
        "the state dir is under the removed directory"
    );
    let deadline = Instant::now() + WAIT;
    while !checkpoint.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        n.checkpoint_claims(),
        vec![first.uid.clone()],
        "{}",
        n.logs()
    );
    eprintln!(
        "checkpoint written again {:?} after the removal",
        removed.elapsed()
    );
    assert!(
        n.logs()
            .contains("the checkpoint file was removed under the plugin; written again")
    );

    // The prepared claim is still known; a new one prepares.
    let second = n.gpu_claim("after", "gpu-1").await;
    let prepared = p.prepare(std::slice::from_ref(&second)).await.unwrap();
    assert_eq!(prepared[&second.uid].error, None, "{}", n.logs());
    let again = p.prepare(std::slice::from_ref(&first)).await.unwrap();
    assert_eq!(again[&first.uid].error, None);
    assert_eq!(again[&first.uid].devices.len(), 1);
    // The checkpoint, which lived in the removed directory, is whole again.
    let claims = n.checkpoint_claims();
    assert!(
        claims.contains(&first.uid) && claims.contains(&second.uid),
        "{claims:?}"
    );
    let unprepared = p.unprepare(&[first.clone(), second.clone()]).await.unwrap();
    assert!(
        unprepared.values().all(|r| r.error.is_none()),
        "{unprepared:?}"
    );
    assert!(n.checkpoint_claims().is_empty());
}

#[tokio::test]
async fn a_removed_registration_socket_alone_is_bound_again() {
    let n = node(SMALL_PROFILE, &[], DraVersion::V1).await;
    let mut registrar = KubeletSim::new().watch_registrar(&n.plugin.reg_dir);
    let before = registrar.wait_registered(DRIVER, WAIT).await.unwrap();
    std::fs::remove_file(n.plugin.reg_socket()).unwrap();
    registrar.wait_deregistered(DRIVER, WAIT).await.unwrap();
    let after = registrar.wait_registered(DRIVER, WAIT).await.unwrap();
    assert_eq!(before.endpoint, after.endpoint);
    let claim = n.gpu_claim("reg-only", "gpu-3").await;
    let r = after.prepare(std::slice::from_ref(&claim)).await.unwrap();
    assert_eq!(r[&claim.uid].error, None, "{}", n.logs());
    after.unprepare(&[claim]).await.unwrap();
}

// ---------------------------------------------------------------------------
// gRPC message size limits.

mod limits {
    use std::path::Path;

    use dra_proto::dra::v1;
    use gpu_kubelet_plugin::grpc::limits::{DRA_MAX_MESSAGE, SMALL_MAX_MESSAGE};
    use hyper_util::rt::TokioIo;
    use prost::Message;
    use tokio::net::UnixStream;
    use tonic::Code;
    use tonic::transport::{Channel, Endpoint, Uri};

    use super::*;

    const V1_PREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
    const V1BETA1_PREPARE: &str =
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources";
    const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
    const WATCH_HEALTH: &str = "/v1alpha1.DRAResourceHealth/NodeWatchResources";

    fn channel(socket: &Path) -> Channel {
        let path = socket.to_owned();
        Endpoint::from_static("http://localhost").connect_with_connector_lazy(
            tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
            }),
        )
    }

    /// One unary call of `path` with `request`, the answer decoded as `R`.
    async fn call<R: Message + Default + 'static>(
        socket: &Path,
        path: &'static str,
        request: v1::NodePrepareResourcesRequest,
    ) -> Result<R, tonic::Status> {
        let mut grpc = tonic::client::Grpc::new(channel(socket))
            .max_encoding_message_size(usize::MAX)
            .max_decoding_message_size(usize::MAX);
        grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<v1::NodePrepareResourcesRequest, R>::default();
        grpc.unary(
            tonic::Request::new(request),
            http::uri::PathAndQuery::from_static(path),
            codec,
        )
        .await
        .map(tonic::Response::into_inner)
    }

    /// A request of exactly `size` bytes: one claim whose namespace fills
    /// it up.
    fn request_of(size: usize) -> v1::NodePrepareResourcesRequest {
        let claim = |ns: usize| v1::NodePrepareResourcesRequest {
            claims: vec![v1::Claim {
                namespace: "n".repeat(ns),
                name: "big".into(),
                uid: "8d4c7f0e-0000-4000-8000-0000000000ff".into(),
            }],
        };
        let overhead = claim(0).encoded_len();
        // Varint lengths grow with the namespace: settle by trying.
        let mut ns = size - overhead;
        while claim(ns).encoded_len() > size {
            ns -= 1;
        }
        let r = claim(ns);
        assert_eq!(
            r.encoded_len(),
            size,
            "cannot build a request of {size} bytes"
        );
        r
    }

    #[tokio::test]
    async fn requests_over_the_limit_are_refused_with_resource_exhausted_and_the_plugin_stays_up() {
        let n = node(SMALL_PROFILE, &[], DraVersion::V1).await;
        let dra = n.plugin.dra_socket();
        let reg = n.plugin.reg_socket();
        for path in [V1_PREPARE, V1BETA1_PREPARE] {
            let over = call::<v1::NodePrepareResourcesResponse>(
                &dra,
                path,
                request_of(DRA_MAX_MESSAGE + 1),
            )
            .await
            .unwrap_err();
            assert_eq!(over.code(), Code::ResourceExhausted, "{path}: {over:?}");
            assert!(
                over.message().contains(&DRA_MAX_MESSAGE.to_string()),
                "{over:?}"
            );
            // Just under the limit: answered, with a per-claim error for
            // the absurd namespace.
            let under =
                call::<v1::NodePrepareResourcesResponse>(&dra, path, request_of(DRA_MAX_MESSAGE))
                    .await
                    .unwrap_or_else(|e| panic!("{path}: {e:?}\n{}", n.logs()));
            let answer = &under.claims["8d4c7f0e-0000-4000-8000-0000000000ff"];
            assert!(!answer.error.is_empty(), "{answer:?}");
            assert!(answer.error.len() < 4096, "the error echoes the request");
        }
        for (socket, path) in [(&reg, GET_INFO), (&dra, WATCH_HEALTH)] {
            let over = call::<()>(socket, path, request_of(SMALL_MAX_MESSAGE + 1))
                .await
                .unwrap_err();
            assert_eq!(over.code(), Code::ResourceExhausted, "{path}: {over:?}");
        }
        let info = call::<dra_proto::registration::PluginInfo>(
            &reg,
            GET_INFO,
            request_of(SMALL_MAX_MESSAGE),
        )
        .await
        .unwrap();
        assert_eq!(info.name, DRIVER);
        // Still up: kubelet's own calls work.
        still_serving(&n).await;
        let claim = n.gpu_claim("after-limits", "gpu-0").await;
        n.prepare_ok(&claim).await;
        n.unprepare_ok(&claim).await;
    }
}
