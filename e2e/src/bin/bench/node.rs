//! A node for the prepare benchmarks: the release plugin on a fake machine
//! (the fake NVML with a profile, its sysfs tree, stand-in `/dev` and
//! `/proc`, a fake driver root with its MPS daemon), the in-process test API
//! server holding the claims, and the kubelet simulator registered over the
//! plugin's real sockets. Claims are written into the server's store
//! in-process (allocated, as the scheduler would leave them); the plugin
//! reads them over HTTP with its kube client.
//!
//! Where things are, as on a node: the plugin's state directory (checkpoint,
//! MPS daemon directories) on disk under /tmp; CDI specs (`/var/run/cdi`),
//! the GPUs' state, `/proc` and `/dev` on a tmpfs (`/dev/shm`) when the
//! machine has one.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use gpu_dra_sim::apiserver::{
    DeleteOptions, PatchBody, Resource, ServerOptions, TestApiServer, ValidationRules, WriteOptions,
};
use gpu_dra_sim::kubelet::{Claim, DraVersion, KubeletSim};
use serde_json::{Value, json};

use crate::Ctx;
use crate::children::{Plugin, Root};
use crate::start::{NODE, proc_kib, time_of_day};

/// The driver's name.
pub const DRIVER: &str = "gpu.nvidia.com";
/// Where the claims live.
const NAMESPACE: &str = "default";
/// The machine every prepare benchmark runs on: 8× H100 SXM 80 GB.
pub const PROFILE: &str = "dgx-h100";

/// The fake machine a plugin runs on: the fake NVML (with a state file,
/// writing MIG capabilities into the stand-in `/proc` and `/dev`) for
/// [`PROFILE`], its sysfs tree, and a fake driver root. The GPU state (the
/// fake's state file), `/proc` and `/dev` are not on disk on a real node:
/// they go to the volatile (tmpfs) directory, so the fake's own writes do
/// not add disk flushes the real hardware does not have.
pub struct Machine {
    library: PathBuf,
    sysfs: PathBuf,
    dev_root: PathBuf,
    proc_root: PathBuf,
    driver_root: fake_driver_root::FakeDriverRoot,
    /// The driver root's registration: what runs from it is stopped when
    /// the bench is killed.
    _registered: Root,
}

impl Machine {
    /// Lays the machine out in `dir`, its volatile parts in `volatile`.
    pub fn create(dir: &Path, volatile: &Path) -> anyhow::Result<Self> {
        Self::create_with(dir, volatile, None)
    }

    /// [`Self::create`], with the fake NVML reading GPU faults from
    /// `control` (a file or FIFO, `MOCK_NVML_CONTROL`) when given.
    pub fn create_with(
        dir: &Path,
        volatile: &Path,
        control: Option<PathBuf>,
    ) -> anyhow::Result<Self> {
        for d in [dir, volatile] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let dev_root = volatile.join("devroot");
        fake_driver_root::create_dev_root(&dev_root, &(0..16).collect::<Vec<u32>>())
            .context("creating the stand-in dev root")?;
        let proc_root = fake_driver_root::create_proc_root(&volatile.join("proc"))
            .context("creating the stand-in proc root")?;
        let driver_root = fake_driver_root::FakeDriverRoot::create(&dir.join("driver"))
            .context("creating the fake driver root")?;
        let profile = nvidia_ml::fixture::bundled_profile(PROFILE);
        let library = nvidia_ml::fixture::install_with(
            &dir.join("nvml"),
            &profile,
            &nvidia_ml::fixture::InstallOptions {
                state: Some(volatile.join("nvml-state.json")),
                proc_root: Some(proc_root.clone()),
                dev_root: Some(dev_root.clone()),
                control,
            },
        )
        .context("installing the fake NVML (build it with `cargo build --release -p mock-nvml`)")?;
        let sysfs = dir.join("sys");
        nvidia_ml::sysfs::write(&nvidia_ml::Profile::load(&profile)?, &sysfs)?;
        let registered = Root::register(driver_root.path());
        Ok(Self {
            library,
            sysfs,
            dev_root,
            proc_root,
            driver_root,
            _registered: registered,
        })
    }

    /// The plugin flags pointing at this machine (all but `--cdi-root`).
    pub fn args(&self) -> Vec<std::ffi::OsString> {
        let mut args = Vec::new();
        for (flag, path) in [
            ("--nvml-lib", &self.library),
            ("--sysfs-root", &self.sysfs),
            ("--dev-root", &self.dev_root),
            ("--proc-root", &self.proc_root),
            ("--driver-root", &self.driver_root.path().to_path_buf()),
        ] {
            args.push(flag.into());
            args.push(path.into());
        }
        args
    }

    /// Kills what was started from the driver root (MPS daemons).
    pub fn kill_processes(&self) {
        self.driver_root.kill_processes();
    }
}

/// A running plugin on a fake machine, with its API server and kubelet.
pub struct Node {
    server: TestApiServer,
    machine: Machine,
    child: Plugin,
    /// The plugin's JSON log.
    pub log: PathBuf,
    /// The plugin's state directory (checkpoint, MPS daemons).
    pub state_dir: PathBuf,
    kubeconfig: PathBuf,
    /// The plugin's registration socket.
    reg_socket: PathBuf,
    kubelet: gpu_dra_sim::kubelet::Plugin,
    /// Device names of the published pool.
    pub devices: Vec<String>,
    next: AtomicU64,
}

/// The plugin's command line on `machine`, as every benchmark runs it:
/// the deployed environment, JSON logs to `log`, sockets and state under
/// `dir` (`reg/`, `plugins/`), CDI specs on the volatile side, and `flags`.
pub fn plugin_command(
    ctx: &Ctx,
    dir: &Path,
    machine: &Machine,
    kubeconfig: &Path,
    flags: &[&str],
    log: &Path,
) -> anyhow::Result<Command> {
    let mut cmd = program_command(ctx, log)?;
    cmd.args(["--node-name", NODE, "--log-format", "json"])
        .arg("--kubelet-registrar-dir")
        .arg(dir.join("reg"))
        .arg("--kubelet-plugins-dir")
        .arg(dir.join("plugins"))
        .args(machine.args())
        .arg("--cdi-root")
        .arg(ctx.volatile_for(dir).join("cdi"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(flags);
    Ok(cmd)
}

/// The plugin's program with the deployed environment, info logs, no
/// stdin or stdout, stderr into `log`: what the plugin and its MPS host
/// start from.
fn program_command(ctx: &Ctx, log: &Path) -> anyhow::Result<Command> {
    let mut cmd = Command::new(&ctx.plugin_bin);
    cmd.env_clear()
        .env("RUST_LOG", "info")
        .envs(ctx.envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?);
    Ok(cmd)
}

/// Where [`start_mps_host`] serves in `dir`.
pub fn mps_host_socket(dir: &Path) -> PathBuf {
    dir.join("mps-host.sock")
}

/// Starts the MPS daemon host (`<plugin> mps-host`) for `node`'s driver
/// root on [`mps_host_socket`] of `dir`, logging to `<dir>/mps-host.log`,
/// and waits until it serves.
pub async fn start_mps_host(ctx: &Ctx, dir: &Path, node: &Node) -> anyhow::Result<Plugin> {
    let socket = mps_host_socket(dir);
    let log = dir.join("mps-host.log");
    let mut cmd = program_command(ctx, &log)?;
    cmd.args(["mps-host", "--log-format", "json", "--socket"])
        .arg(&socket)
        .arg("--container-driver-root")
        .arg(node.machine.driver_root.path());
    let mut child = crate::children::spawn_plugin(&mut cmd).context("spawning the MPS host")?;
    wait_for_log(&log, "MPS daemon host serving", &mut child).await?;
    Ok(child)
}

/// What the plugin logs once its kubelet sockets serve.
pub const SERVING: &str = "serving kubelet plugin sockets";

/// Waits (up to 30 s) until the JSON log `log` of `child` has a line
/// containing `message`, and returns the log then. The child exiting
/// first, or the time running out (the child is then killed), is an error
/// with the log.
pub async fn wait_for_log(log: &Path, message: &str, child: &mut Plugin) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(message) {
            return Ok(text);
        }
        if let Some(status) = child.try_wait()? {
            bail!("the plugin exited with {status} before logging {message:?}:\n{text}");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("the plugin did not log {message:?} within 30 s:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The registration socket a plugin's JSON log names on its `SERVING`
/// line (with per-instance sockets, a name of its own), which must lie in
/// `reg_dir`.
pub fn registration_socket(log: &str, reg_dir: &Path) -> anyhow::Result<PathBuf> {
    let path = PathBuf::from(JsonLog::parse(log).field(SERVING, "registration")?);
    anyhow::ensure!(
        path.parent() == Some(reg_dir),
        "the plugin registered {} outside {}",
        path.display(),
        reg_dir.display()
    );
    Ok(path)
}

/// A plugin's JSON log, its lines parsed once (lines that are not JSON,
/// such as the supervisor's, left out).
pub struct JsonLog<'a> {
    text: &'a str,
    lines: Vec<Value>,
}

impl<'a> JsonLog<'a> {
    pub fn parse(text: &'a str) -> Self {
        let lines = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        Self { text, lines }
    }

    /// The first line whose message contains `what`.
    fn line(&self, what: &str) -> Option<&Value> {
        self.lines
            .iter()
            .find(|v| v["message"].as_str().is_some_and(|m| m.contains(what)))
    }

    /// Seconds since midnight of the first line whose message contains
    /// `what`.
    pub fn at(&self, what: &str) -> anyhow::Result<f64> {
        self.line(what)
            .and_then(|v| time_of_day(v["timestamp"].as_str()?))
            .with_context(|| format!("no timestamped {what:?} line in the log:\n{}", self.text))
    }

    /// String field `field` of the first line whose message contains
    /// `what`.
    pub fn field(&self, what: &str, field: &str) -> anyhow::Result<&str> {
        self.line(what)
            .and_then(|v| v[field].as_str())
            .with_context(|| format!("no {what:?} line with {field:?} in the log:\n{}", self.text))
    }
}

/// Registers the kubelet simulator with the plugin behind `reg_socket`.
async fn register(reg_socket: &Path) -> anyhow::Result<gpu_dra_sim::kubelet::Plugin> {
    KubeletSim::new()
        .with_dra_versions([DraVersion::V1])
        .register(reg_socket)
        .await
        .context("registering the plugin with the kubelet simulator")
}

/// Waits (up to 20 s) for `child`, sent SIGTERM, to exit.
fn wait_exit(child: &mut Plugin) -> anyhow::Result<std::process::ExitStatus> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(s);
        }
        if Instant::now() > deadline {
            bail!("the plugin did not exit within 20 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A test API server (1.35 rules) holding the Node object, and a
/// kubeconfig for it written to `<dir>/kubeconfig`.
pub async fn api_server_with_node(dir: &Path) -> anyhow::Result<(TestApiServer, PathBuf)> {
    let server = TestApiServer::start(ServerOptions {
        rules: ValidationRules::V1_35,
        ..ServerOptions::default()
    })
    .await?;
    server
        .store()
        .create_node(NODE)
        .map_err(|e| anyhow::anyhow!("creating the Node: {e:?}"))?;
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig)?;
    Ok((server, kubeconfig))
}

impl Node {
    /// Lays out the machine in `dir`, starts the plugin with `flags`, waits
    /// for its complete pool and registers the kubelet simulator.
    pub async fn start(ctx: &Ctx, dir: &Path, flags: &[&str]) -> anyhow::Result<Self> {
        Self::start_with(ctx, dir, flags, None).await
    }

    /// [`Self::start`] on a machine whose fake NVML reads GPU faults from
    /// `control` when given ([`Machine::create_with`]).
    pub async fn start_with(
        ctx: &Ctx,
        dir: &Path,
        flags: &[&str],
        control: Option<PathBuf>,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let machine = Machine::create_with(dir, &ctx.volatile_for(dir), control)?;

        let (server, kubeconfig) = api_server_with_node(dir).await?;

        let reg = dir.join("reg");
        let plugins = dir.join("plugins");
        let log = dir.join("plugin.log");
        let mut cmd = plugin_command(ctx, dir, &machine, &kubeconfig, flags, &log)?;
        let mut child = crate::children::spawn_plugin(&mut cmd).context("spawning the plugin")?;

        let text = wait_for_log(&log, SERVING, &mut child).await?;
        let items = server
            .store()
            .wait_for(Resource::ResourceSlices, Duration::from_secs(30), |items| {
                crate::start::complete_pool(items).is_some()
            })
            .await
            .map_err(|_| anyhow::anyhow!("no complete pool within 30 s"))?;
        let devices = items
            .iter()
            .filter(|s| s["spec"]["nodeName"] == NODE)
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .filter_map(|d| d["name"].as_str().map(str::to_owned))
            .collect();
        let reg_socket = registration_socket(&text, &reg)?;
        let kubelet = register(&reg_socket).await?;
        Ok(Self {
            server,
            machine,
            child,
            log,
            state_dir: plugins.join(DRIVER),
            kubeconfig,
            reg_socket,
            kubelet,
            devices,
            next: AtomicU64::new(0),
        })
    }

    /// The serving plugin's registration socket.
    pub fn reg_socket(&self) -> &Path {
        &self.reg_socket
    }

    /// The first published device whose name starts with `prefix`.
    pub fn device(&self, prefix: &str) -> anyhow::Result<String> {
        self.devices
            .iter()
            .find(|d| d.starts_with(prefix))
            .cloned()
            .with_context(|| format!("no device {prefix}* in the pool"))
    }

    /// Creates a fresh ResourceClaim (new name, new UID) allocated with
    /// `results` and `config`, as the scheduler leaves it.
    pub fn claim(&self, results: &Value, config: &Value) -> anyhow::Result<Claim> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("claim-{n}");
        let mut requests: Vec<&str> = results
            .as_array()
            .context("results are not a list")?
            .iter()
            .filter_map(|r| r["request"].as_str())
            .collect();
        requests.sort_unstable();
        requests.dedup();
        let requests: Vec<Value> = requests
            .into_iter()
            .map(|r| json!({"name": r, "exactly": {"deviceClassName": DRIVER}}))
            .collect();
        let store = self.server.store();
        let created = store
            .create(
                Resource::ResourceClaims,
                Some(NAMESPACE),
                json!({
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": NAMESPACE},
                    "spec": {"devices": {"requests": requests}},
                }),
                &WriteOptions::default(),
            )
            .map_err(|e| anyhow::anyhow!("creating claim {name}: {e:?}"))?;
        let uid = created["metadata"]["uid"]
            .as_str()
            .context("the created claim has no UID")?
            .to_owned();
        let status =
            json!({"status": {"allocation": {"devices": {"results": results, "config": config}}}});
        store
            .patch(
                Resource::ResourceClaims,
                Some(NAMESPACE),
                &name,
                &PatchBody::Merge(status),
                true,
                &WriteOptions {
                    field_manager: Some("bench-scheduler".into()),
                    ..WriteOptions::default()
                },
            )
            .map_err(|e| anyhow::anyhow!("allocating claim {name}: {e:?}"))?;
        Ok(Claim::new(NAMESPACE, name, uid))
    }

    /// Deletes a claim's object (its pod is gone).
    pub fn delete(&self, claim: &Claim) -> anyhow::Result<()> {
        self.server
            .store()
            .delete(
                Resource::ResourceClaims,
                Some(NAMESPACE),
                &claim.name,
                &DeleteOptions::default(),
            )
            .map_err(|e| anyhow::anyhow!("deleting claim {}: {e:?}", claim.name))?;
        Ok(())
    }

    /// NodePrepareResources for `claims` (one call); every claim must get
    /// devices and no error.
    pub async fn prepare(&self, claims: &[Claim]) -> anyhow::Result<()> {
        let answers = self.kubelet.prepare(claims).await?;
        for (uid, r) in answers {
            if let Some(e) = r.error {
                bail!("prepare of {uid} failed: {e}");
            }
            if r.devices.is_empty() {
                bail!("prepare of {uid} returned no devices");
            }
        }
        Ok(())
    }

    /// NodePrepareResources with no claims: the plugin answers at once, so
    /// this is the gRPC round trip alone (the floor of any prepare here).
    pub async fn prepare_nothing(&self) -> anyhow::Result<()> {
        let answers = self.kubelet.prepare(&[]).await?;
        anyhow::ensure!(answers.is_empty(), "answers for no claims: {answers:?}");
        Ok(())
    }

    /// NodeUnprepareResources for `claims` (one call); no claim may fail.
    pub async fn unprepare(&self, claims: &[Claim]) -> anyhow::Result<()> {
        let answers = self.kubelet.unprepare(claims).await?;
        for (uid, r) in answers {
            if let Some(e) = r.error {
                bail!("unprepare of {uid} failed: {e}");
            }
        }
        Ok(())
    }

    /// The API server stand-in the plugin publishes to.
    pub fn server(&self) -> &TestApiServer {
        &self.server
    }

    /// The kubelet simulator's connection to the plugin.
    pub fn kubelet(&self) -> &gpu_dra_sim::kubelet::Plugin {
        &self.kubelet
    }

    /// The plugin's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A `kB` field of the plugin's `/proc/<pid>/status`, in MiB.
    pub fn memory_mib(&self, field: &str) -> anyhow::Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .context("reading the plugin's /proc status")?;
        Ok(proc_kib(&status, field)? / 1024.0)
    }

    /// The plugin's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Starts another instance of the plugin with `flags` on this node's
    /// machine, API server, state directory and sockets (`dir`, where the
    /// node was started), logging to `log`: a rolling update's new pod
    /// beside the serving one.
    pub fn spawn_successor(
        &self,
        ctx: &Ctx,
        dir: &Path,
        flags: &[&str],
        log: &Path,
    ) -> anyhow::Result<Plugin> {
        let mut cmd = plugin_command(ctx, dir, &self.machine, &self.kubeconfig, flags, log)?;
        crate::children::spawn_plugin(&mut cmd).context("spawning the successor")
    }

    /// Hands the node over to `successor` (spawned by
    /// [`Self::spawn_successor`], logging to `log`): SIGTERM to the serving
    /// plugin, which must exit 0; then, once the successor serves, the
    /// kubelet simulator registers it, as kubelet's plugin watcher does with
    /// a new registration socket. Returns the old plugin's log.
    pub async fn hand_over(&mut self, successor: Plugin, log: PathBuf) -> anyhow::Result<String> {
        // The successor is the node's plugin from here on, so that it is
        // killed with the node should anything below fail.
        let mut old = std::mem::replace(&mut self.child, successor);
        let old_log_path = std::mem::replace(&mut self.log, log);
        fake_driver_root::terminate(old.id());
        let exited = tokio::task::block_in_place(|| wait_exit(&mut old));
        let old_log = std::fs::read_to_string(&old_log_path).unwrap_or_default();
        match exited {
            Ok(status) if status.success() => {}
            Ok(status) => bail!("the old plugin exited with {status}:\n{old_log}"),
            Err(e) => {
                let _ = old.kill();
                let _ = old.wait();
                return Err(e.context(old_log));
            }
        }
        let text = wait_for_log(&self.log, SERVING, &mut self.child).await?;
        let reg_dir = self
            .reg_socket
            .parent()
            .context("a registration directory")?;
        self.reg_socket = registration_socket(&text, reg_dir)?;
        self.kubelet = register(&self.reg_socket).await?;
        Ok(old_log)
    }

    /// Stops the plugin (SIGTERM; it must exit 0) and whatever it started
    /// from the driver root.
    pub fn stop(mut self) -> anyhow::Result<()> {
        fake_driver_root::terminate(self.child.id());
        let status = wait_exit(&mut self.child)?;
        self.machine.kill_processes();
        if !status.success() {
            bail!("the plugin exited with {status}:\n{}", self.log_text());
        }
        Ok(())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.machine.kill_processes();
    }
}

/// The one durable write nothing can avoid: a small file written next to
/// the plugin's checkpoint (same directory, same file system), fsynced,
/// renamed over its old version, and the directory fsynced. Returns how
/// long it took.
pub fn durable_write(dir: &Path, round: usize) -> anyhow::Result<Duration> {
    use std::io::Write as _;
    let path = dir.join("bench-durable-write.json");
    let temp = dir.join(".bench-durable-write.json.tmp");
    let body = durable_body(round);
    let start = Instant::now();
    let mut f =
        std::fs::File::create(&temp).with_context(|| format!("creating {}", temp.display()))?;
    f.write_all(body.as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&temp, &path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(start.elapsed())
}

/// The plugin's own kind of durable write (its checkpoint store's): the
/// same body written in place into a spare file that holds the version
/// before (from the start, cut to length), fdatasynced, swapped with the
/// file by `renameat2(RENAME_EXCHANGE)`, and the directory fsynced. No
/// inode is made or freed, which on ext4 is about half the cost of
/// [`durable_write`]. Returns how long it took.
pub fn swapped_write(dir: &Path, round: usize) -> anyhow::Result<Duration> {
    use std::io::Write as _;
    let path = dir.join("bench-swapped-write.json");
    let spare = dir.join("bench-swapped-write.json.tmp");
    let body = durable_body(round);
    let start = Instant::now();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&spare)
        .with_context(|| format!("opening {}", spare.display()))?;
    f.write_all(body.as_bytes())?;
    f.set_len(body.len() as u64)?;
    f.sync_data()?;
    drop(f);
    // As the store does: an exchange, a plain rename for the first write
    // (no file to exchange with yet; no extra stat in the timed part).
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    match renameat_with(CWD, &spare, CWD, &path, RenameFlags::EXCHANGE) {
        Ok(()) => {}
        Err(rustix::io::Errno::NOENT) => std::fs::rename(&spare, &path)?,
        Err(e) => {
            return Err(anyhow::Error::from(std::io::Error::from(e)))
                .with_context(|| format!("exchanging {} and {}", spare.display(), path.display()));
        }
    }
    std::fs::File::open(dir)?.sync_all()?;
    Ok(start.elapsed())
}

/// About the size of a checkpoint holding one claim.
fn durable_body(round: usize) -> String {
    format!(
        "{{\"round\": {round}, \"claim\": \"{:0>36}\", \"devices\": [\"gpu-{}\"], \"padding\": \"{}\"}}\n",
        round,
        round % 8,
        "x".repeat(400)
    )
}

/// One allocation result of `device` on this node for request `request`.
pub fn result(request: &str, device: &str) -> Value {
    json!({"request": request, "driver": DRIVER, "pool": NODE, "device": device})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registration_socket_comes_from_the_serving_line() {
        let serving = |path: &str| {
            serde_json::json!({"message": SERVING, "registration": path, "dra": "/p/dra.sock"})
                .to_string()
        };
        let reg = Path::new("/n/reg");
        let log = format!(
            "supervisor: starting\n{}\n",
            serving("/n/reg/gpu.nvidia.com-0a1b2c3d-reg.sock")
        );
        assert_eq!(
            registration_socket(&log, reg).unwrap(),
            reg.join("gpu.nvidia.com-0a1b2c3d-reg.sock")
        );
        // Elsewhere than the node's directory, or missing: errors.
        let err = registration_socket(&serving("/elsewhere/x-reg.sock"), reg).unwrap_err();
        assert!(err.to_string().contains("outside /n/reg"), "{err}");
        let err = registration_socket("not json\n", reg).unwrap_err();
        assert!(err.to_string().contains("\"registration\""), "{err}");
    }
}
