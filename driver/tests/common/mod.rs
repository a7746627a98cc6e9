//! Running the real `gpu-kubelet-plugin` binary on short temporary
//! directories (socket paths must stay under 108 bytes), each plugin with
//! what it needs to start: a private copy of the fake libnvidia-ml with a
//! machine profile, the matching sysfs tree, and a test API server (with the
//! Node object) reached through a kubeconfig.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_dra_sim::apiserver::{
    Faults, Resource, Selectors, ServerOptions, Store, TestApiServer, ValidationRules,
};
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_gpu-kubelet-plugin");
pub const DRIVER: &str = "gpu.nvidia.com";
/// The node every harness plugin runs as, unless a test says otherwise.
pub const NODE: &str = "node-a";
/// The machine of plugins whose GPUs do not matter to the test: small (4
/// GPUs), no MIG, no NVLink, so startup is quick.
pub const SMALL_PROFILE: &str = "t4-inference";

/// A short temporary directory under /tmp.
pub fn short_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("p")
        .tempdir_in("/tmp")
        .unwrap()
}

// ---------------------------------------------------------------------------
// The test API server, on a thread of its own.

/// A test API server on its own thread and runtime, so that synchronous
/// tests, and async tests that block their runtime while a plugin runs, can
/// use it. Stopped and joined on drop.
pub struct ApiServer {
    url: String,
    store: Arc<Store>,
    faults: Arc<Faults>,
    kubeconfig_yaml: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApiServer {
    /// Starts a server enforcing `rules`.
    pub fn start(rules: ValidationRules) -> Self {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("test-apiserver".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let server = TestApiServer::start(ServerOptions {
                        rules,
                        ..ServerOptions::default()
                    })
                    .await
                    .unwrap();
                    ready_tx
                        .send((
                            server.url(),
                            server.store().clone(),
                            server.faults().clone(),
                            server.kubeconfig_yaml(),
                        ))
                        .unwrap();
                    let _ = stopped.await;
                    // Dropping the server stops it without waiting for open
                    // watches of plugins that are still running.
                    drop(server);
                });
            })
            .unwrap();
        let (url, store, faults, kubeconfig_yaml) = ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("test API server did not start");
        Self {
            url,
            store,
            faults,
            kubeconfig_yaml,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server's object store (in-process access).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The server's fault knob (writes refused or hung).
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    pub fn write_kubeconfig(&self, path: &Path) {
        std::fs::write(path, &self.kubeconfig_yaml).unwrap();
    }

    /// Creates the Node object `name`; returns its UID.
    pub fn create_node(&self, name: &str) -> String {
        let node = self.store.create_node(name).unwrap();
        node["metadata"]["uid"].as_str().unwrap().to_owned()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// ---------------------------------------------------------------------------
// What a plugin runs on.

/// Where the machine profile comes from.
enum ProfileSource {
    Bundled(String),
    Yaml(String),
}

/// Builds a [`TestEnv`].
pub struct EnvBuilder {
    dir: PathBuf,
    profile: ProfileSource,
    state: Option<PathBuf>,
    rules: ValidationRules,
    node: Option<String>,
    cdi_root: Option<PathBuf>,
    control: Option<PathBuf>,
}

impl EnvBuilder {
    /// A profile shipped in `hack/mock-nvml/profiles`.
    pub fn bundled(mut self, name: &str) -> Self {
        self.profile = ProfileSource::Bundled(name.to_owned());
        self
    }

    /// A profile given as YAML text.
    pub fn yaml(mut self, text: &str) -> Self {
        self.profile = ProfileSource::Yaml(text.to_owned());
        self
    }

    /// A fake-NVML state file (`MOCK_NVML_STATE`).
    pub fn state(mut self, path: &Path) -> Self {
        self.state = Some(path.to_owned());
        self
    }

    /// The API server's ResourceSlice validation rules.
    pub fn rules(mut self, rules: ValidationRules) -> Self {
        self.rules = rules;
        self
    }

    /// The CDI spec directory (default: a fresh one in the environment).
    pub fn cdi_root(mut self, path: &Path) -> Self {
        self.cdi_root = Some(path.to_owned());
        self
    }

    /// The fake NVML's control file (`MOCK_NVML_CONTROL`, in its sidecar):
    /// fault commands, one per line, applied while it runs.
    pub fn control(mut self, path: &Path) -> Self {
        self.control = Some(path.to_owned());
        self
    }

    /// Do not create the Node object.
    pub fn without_node(mut self) -> Self {
        self.node = None;
        self
    }

    pub fn build(self) -> TestEnv {
        let root = tempfile::Builder::new()
            .prefix("env")
            .tempdir_in(&self.dir)
            .unwrap()
            .keep();
        let nvml_dir = root.join("nvml");
        // The node's other stand-ins: device nodes, the proc tree the NVIDIA
        // module shows (the fake NVML writes MIG capabilities there, as the
        // kernel does), the driver's files and programs, a CDI directory.
        let dev_root = root.join("devroot");
        fake_driver_root::create_dev_root(&dev_root, &(0..16).collect::<Vec<u32>>())
            .expect("create the stand-in dev root");
        let proc_root =
            fake_driver_root::create_proc_root(&root.join("proc")).expect("create the proc root");
        let driver_root =
            fake_driver_root::FakeDriverRoot::create(&root.join("driver")).expect("driver root");
        let cdi_root = self.cdi_root.clone().unwrap_or_else(|| root.join("cdi"));
        let state = self
            .state
            .clone()
            .unwrap_or_else(|| root.join("nvml-state.json"));
        let options = nvidia_ml::fixture::InstallOptions {
            state: Some(state),
            proc_root: Some(proc_root.clone()),
            dev_root: Some(dev_root.clone()),
            control: self.control.clone(),
        };
        let (library, profile) = match &self.profile {
            ProfileSource::Bundled(name) => {
                let path = nvidia_ml::fixture::bundled_profile(name);
                let lib = nvidia_ml::fixture::install_with(&nvml_dir, &path, &options)
                    .expect("install the fake NVML");
                (lib, path)
            }
            ProfileSource::Yaml(text) => {
                let path = nvml_dir.join("profile.yaml");
                std::fs::create_dir_all(&nvml_dir).unwrap();
                std::fs::write(&path, text).unwrap();
                let lib = nvidia_ml::fixture::install_with(&nvml_dir, &path, &options)
                    .expect("install the fake NVML");
                (lib, path)
            }
        };
        let sysfs = root.join("sys");
        // A malformed profile has no sysfs tree: the plugin must fail in
        // NVML init before it looks there.
        if let Ok(p) = nvidia_ml::Profile::load(&profile) {
            nvidia_ml::sysfs::write(&p, &sysfs).expect("write the fake sysfs");
        }
        let api = ApiServer::start(self.rules);
        let node_uid = self.node.as_deref().map(|n| api.create_node(n));
        let kubeconfig = root.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig);
        TestEnv {
            root,
            library,
            profile,
            sysfs,
            kubeconfig,
            node_uid,
            api,
            dev_root,
            proc_root,
            driver_root,
            cdi_root,
        }
    }
}

/// A fake machine (NVML copy, profile, sysfs) and an API server.
pub struct TestEnv {
    /// Directory holding the pieces (inside the test's directory).
    pub root: PathBuf,
    /// The installed fake `libnvidia-ml.so.1`.
    pub library: PathBuf,
    /// The machine profile it simulates.
    pub profile: PathBuf,
    /// The sysfs tree of that machine.
    pub sysfs: PathBuf,
    /// A kubeconfig for the API server.
    pub kubeconfig: PathBuf,
    /// UID of the Node object, when created.
    pub node_uid: Option<String>,
    pub api: ApiServer,
    /// Stand-in device nodes (`--dev-root`).
    pub dev_root: PathBuf,
    /// Stand-in `/proc` (`--proc-root`).
    pub proc_root: PathBuf,
    /// The fake NVIDIA driver root (`--driver-root`).
    pub driver_root: fake_driver_root::FakeDriverRoot,
    /// The CDI spec directory (`--cdi-root`).
    pub cdi_root: PathBuf,
}

impl TestEnv {
    /// Options for an environment in `dir` (default: the small profile, 1.35
    /// rules, Node `node-a`).
    pub fn builder(dir: &Path) -> EnvBuilder {
        EnvBuilder {
            dir: dir.to_owned(),
            profile: ProfileSource::Bundled(SMALL_PROFILE.to_owned()),
            state: None,
            rules: ValidationRules::V1_35,
            node: Some(NODE.to_owned()),
            cdi_root: None,
            control: None,
        }
    }

    /// The default environment in `dir`.
    pub fn new(dir: &Path) -> Self {
        Self::builder(dir).build()
    }

    /// The flags pointing a plugin at this environment.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--nvml-lib".into(),
            self.library.to_str().unwrap().into(),
            "--sysfs-root".into(),
            self.sysfs.to_str().unwrap().into(),
            "--kubeconfig".into(),
            self.kubeconfig.to_str().unwrap().into(),
            "--dev-root".into(),
            self.dev_root.to_str().unwrap().into(),
            "--proc-root".into(),
            self.proc_root.to_str().unwrap().into(),
            "--driver-root".into(),
            self.driver_root.path().to_str().unwrap().into(),
            "--cdi-root".into(),
            self.cdi_root.to_str().unwrap().into(),
        ]
    }

    /// The driver's ResourceSlices of `node` in the store, by name.
    pub fn slices(&self, node: &str) -> Vec<Value> {
        let (items, _) =
            self.api
                .store()
                .list(Resource::ResourceSlices, None, &Selectors::default());
        items
            .into_iter()
            .filter(|s| is_pool_slice(s, node))
            .collect()
    }

    /// Waits until the pool of `node` is complete (see [`complete_pool`]) and
    /// returns its slices, by name; panics with the last state after
    /// `timeout`.
    pub async fn wait_pool(&self, node: &str, timeout: Duration) -> Vec<Value> {
        self.wait_slices(timeout, |slices| {
            complete_pool(&pool_of(slices, node)).is_some()
        })
        .await;
        self.slices(node)
    }

    /// Waits until `predicate` holds for all ResourceSlices in the store.
    pub async fn wait_slices(
        &self,
        timeout: Duration,
        predicate: impl FnMut(&[Value]) -> bool,
    ) -> Vec<Value> {
        match self
            .api
            .store()
            .wait_for(Resource::ResourceSlices, timeout, predicate)
            .await
        {
            Ok(items) => items,
            Err(last) => panic!(
                "ResourceSlices never matched within {timeout:?}; last: {}",
                serde_json::to_string_pretty(&last).unwrap()
            ),
        }
    }
}

fn is_pool_slice(slice: &Value, node: &str) -> bool {
    slice["spec"]["nodeName"] == node && slice["spec"]["driver"] == DRIVER
}

/// The driver's slices of `node` among `slices`.
pub fn pool_of(slices: &[Value], node: &str) -> Vec<Value> {
    slices
        .iter()
        .filter(|s| is_pool_slice(s, node))
        .cloned()
        .collect()
}

/// `Some(generation)` when `slices` (one pool) is complete: every slice at
/// the same, highest generation, as many as their `resourceSliceCount`.
pub fn complete_pool(slices: &[Value]) -> Option<i64> {
    let generation = slices
        .iter()
        .map(|s| s["spec"]["pool"]["generation"].as_i64())
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .max()?;
    let complete = slices.iter().all(|s| {
        s["spec"]["pool"]["generation"] == generation
            && s["spec"]["pool"]["resourceSliceCount"].as_u64() == Some(slices.len() as u64)
    });
    complete.then_some(generation)
}

/// `(key, value, effect)` of every taint of `device` in the harness node's
/// slices.
pub fn taints_of(slices: &[Value], device: &str) -> Vec<(String, String, String)> {
    pool_of(slices, NODE)
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter(|d| d["name"] == device)
        .flat_map(|d| d["taints"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            let s = |k: &str| t[k].as_str().unwrap_or_default().to_owned();
            (s("key"), s("value"), s("effect"))
        })
        .collect()
}

/// Appends one command line to the fake NVML's control file.
pub fn inject(control: &Path, line: &str) {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(control)
        .unwrap();
    writeln!(f, "{line}").unwrap();
}

// ---------------------------------------------------------------------------
// Running the binary.

/// The plugin binary with a clean environment and the given arguments,
/// stderr going to `stderr`; nothing else added.
pub fn bare_command(args: &[&str], stderr: &Path) -> Command {
    program_command(BIN, args, stderr)
}

/// [`bare_command`] for another build of the plugin, `program`.
pub fn program_command(program: impl AsRef<OsStr>, args: &[&str], stderr: &Path) -> Command {
    let mut c = Command::new(program);
    c.env_clear()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(stderr).unwrap());
    c
}

/// Like [`bare_command`], with a fresh default [`TestEnv`] (next to
/// `stderr`) passed through the environment (`NVML_LIB`, `SYSFS_ROOT`,
/// `KUBECONFIG`), for tests that build the command line themselves. The
/// environment is leaked: its API server lives until the test process ends.
pub fn command(args: &[&str], stderr: &Path) -> Command {
    let env = TestEnv::new(stderr.parent().unwrap());
    let mut c = bare_command(args, stderr);
    c.env("NVML_LIB", &env.library)
        .env("SYSFS_ROOT", &env.sysfs)
        .env("KUBECONFIG", &env.kubeconfig);
    std::mem::forget(env);
    c
}

/// Runs the plugin with exactly `args` (no fake NVML, no kubeconfig) to
/// completion, with a deadline. `envs` are added to the clean environment.
pub fn run_bare(args: &[&str], envs: &[(&str, &str)], dir: &Path) -> (ExitStatus, String) {
    // A log of its own: a plugin started by `Plugin::start` in the same
    // directory keeps logging to `run.log`.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = dir.join(format!("exit-{n}.log"));
    let mut c = bare_command(args, &log);
    c.envs(envs.iter().copied());
    let mut child = c.spawn().unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(20)).expect("plugin did not exit");
    (status, std::fs::read_to_string(&log).unwrap())
}

/// Runs the plugin (for startup failures) on a fresh default [`TestEnv`],
/// to completion, with a deadline.
pub fn run_to_exit(args: &[&str], dir: &Path) -> (ExitStatus, String) {
    let env = TestEnv::new(dir);
    let env_args = env.args();
    let mut all: Vec<&str> = env_args.iter().map(String::as_str).collect();
    all.extend_from_slice(args);
    run_bare(&all, &[], dir)
}

/// Waits until the plugin `child`, logging to `log`, says it serves its
/// sockets (the socket file alone proves nothing: a stale one may be
/// there); panics with the log if it exits first or `timeout` passes.
pub fn wait_serving(child: &mut Child, log: &Path, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let stderr = || std::fs::read_to_string(log).unwrap_or_default();
    while !stderr().contains("serving kubelet plugin sockets") {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("plugin exited with {status}: {}", stderr());
        }
        assert!(Instant::now() < deadline, "not serving: {}", stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asserts the shape of a startup failure: non-zero exit, no panic, and a
/// last line `error: ...` that contains `needle`.
pub fn assert_one_line_error(status: ExitStatus, stderr: &str, needle: &str) {
    assert!(!status.success(), "exited 0; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: "),
        "last line is not an error: {stderr}"
    );
    assert!(last.contains(needle), "{needle:?} not in {last:?}");
}

/// A running plugin process.
pub struct Plugin {
    pub child: Child,
    pub reg_dir: PathBuf,
    pub plugins_dir: PathBuf,
    pub log: PathBuf,
    /// What it runs on (shared with restarts of the same machine).
    pub env: Arc<TestEnv>,
}

impl Plugin {
    /// Starts the plugin on `<dir>/reg` and `<dir>/plugins` with a fresh
    /// default [`TestEnv`] and waits until it serves; panics with its stderr
    /// if it exits instead.
    pub fn start(dir: &Path, extra: &[&str]) -> Self {
        Self::start_named(dir, "run", extra)
    }

    pub fn start_named(dir: &Path, name: &str, extra: &[&str]) -> Self {
        let env = Arc::new(TestEnv::new(dir));
        Self::launch(&env, dir, name, extra)
    }

    /// Starts the plugin on `env` (log `<dir>/<name>.log`), waits until it
    /// serves.
    pub fn launch(env: &Arc<TestEnv>, dir: &Path, name: &str, extra: &[&str]) -> Self {
        Self::launch_with(env, dir, name, extra, &[])
    }

    /// Like [`Self::launch`], with environment variables.
    pub fn launch_with(
        env: &Arc<TestEnv>,
        dir: &Path,
        name: &str,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Self {
        let mut p = Self::spawn_with(env, dir, name, extra, envs);
        wait_serving(&mut p.child, &p.log, Duration::from_secs(20));
        p
    }

    /// Starts the plugin on `env` without waiting for anything.
    pub fn spawn(env: &Arc<TestEnv>, dir: &Path, name: &str, extra: &[&str]) -> Self {
        Self::spawn_with(env, dir, name, extra, &[])
    }

    /// Like [`Self::spawn`], with environment variables (e.g. `RUST_LOG`).
    pub fn spawn_with(
        env: &Arc<TestEnv>,
        dir: &Path,
        name: &str,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Self {
        let reg_dir = dir.join("reg");
        let plugins_dir = dir.join("plugins");
        let log = dir.join(format!("{name}.log"));
        let env_args = env.args();
        let mut args: Vec<&str> = env_args.iter().map(String::as_str).collect();
        args.extend_from_slice(&[
            "--node-name",
            NODE,
            "--kubelet-registrar-dir",
            reg_dir.to_str().unwrap(),
            "--kubelet-plugins-dir",
            plugins_dir.to_str().unwrap(),
        ]);
        args.extend_from_slice(extra);
        let child = bare_command(&args, &log)
            .envs(envs.iter().copied())
            .spawn()
            .unwrap();
        Self {
            child,
            reg_dir,
            plugins_dir,
            log,
            env: env.clone(),
        }
    }

    /// Its registration socket: the one its log names once bound (with
    /// per-instance names, a tag of its own), else the shared name.
    pub fn reg_socket(&self) -> PathBuf {
        self.logged_socket("registration")
            .unwrap_or_else(|| self.reg_dir.join(format!("{DRIVER}-reg.sock")))
    }

    /// Its DRA socket, as [`Self::reg_socket`].
    pub fn dra_socket(&self) -> PathBuf {
        self.logged_socket("dra")
            .unwrap_or_else(|| self.plugins_dir.join(DRIVER).join("dra.sock"))
    }

    /// The `field=path` of the text log's line saying the sockets are
    /// bound or served.
    fn logged_socket(&self, field: &str) -> Option<PathBuf> {
        let log = self.stderr();
        let line = log.lines().find(|l| {
            l.contains("serving kubelet plugin sockets")
                || l.contains("kubelet plugin sockets bound")
        })?;
        let prefix = format!("{field}=");
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&prefix))
            .map(PathBuf::from)
    }

    /// The address of its metrics endpoint (`--metrics-addr`), from its
    /// text log, once it listens.
    pub async fn metrics_addr(&self) -> String {
        self.wait_log("metrics endpoint listening").await;
        let log = self.stderr();
        let line = log
            .lines()
            .find(|l| l.contains("metrics endpoint listening"))
            .unwrap();
        let addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("addr="))
            .unwrap_or_else(|| panic!("no addr= in {line:?}"));
        addr.to_owned()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Polls stderr until it contains `needle`.
    pub async fn wait_log(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.stderr().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "{needle:?} never logged: {}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (blocking, up to `timeout`) for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        wait_exit(&mut self.child, timeout)
            .unwrap_or_else(|| panic!("still running: {}", self.stderr()))
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TestEnv {
    /// MPS daemons started from the fake driver root outlive the plugin by
    /// design; the test ends them.
    fn drop(&mut self) {
        self.driver_root.kill_processes();
    }
}

/// `GET path` from the HTTP server at `addr`: the whole response, status
/// line first (on a blocking thread).
pub async fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let addr = addr.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap()
}

/// The kubelet's side of the device health stream.
pub mod health;
/// Setup of the tests in which podman runs the prepared claims.
pub mod podman;
/// Claim-preparation helpers (node with restart, claims, leftovers).
pub mod prepare;
