//! Harness for the real test cluster of `hack/cluster/`: a single-node
//! Kubernetes built from the official Go modules and started on this machine,
//! with the driver installed from its Helm chart. [`Cluster::up_or_skip`]
//! brings it up once (or says loudly why it cannot), and tests then talk to it
//! with `kubectl` (as users do) and the kube client, and look at the node's
//! own files (CDI specs, the plugin's checkpoint, the fake NVML state).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// When set to `1`, a cluster that cannot be built or started is a failure,
/// not a skip (`.ci/run` sets it once it has built the cluster).
pub const REQUIRE_ENV: &str = "GPU_DRA_E2E_REQUIRE_CLUSTER";
/// When set to `1`, the cluster is left running after the tests.
pub const KEEP_ENV: &str = "GPU_DRA_E2E_KEEP_CLUSTER";
/// When set to `1`, the tests use the cluster that runs already (brought up
/// by `hack/cluster/up --with-driver --profile dgx-a100 --set-string
/// kubeletPlugin.memorySharing=7 --set kubeletPlugin.dynamicMig=false`),
/// neither bringing it up nor taking it down: for iterating on one test.
pub const USE_RUNNING_ENV: &str = "GPU_DRA_E2E_USE_RUNNING_CLUSTER";
/// The node's name (hack/cluster/lib.sh).
pub const NODE: &str = "gpu-dra-node";
/// The driver's name.
pub const DRIVER: &str = "gpu.nvidia.com";
/// The driver's namespace and Helm release.
pub const DRIVER_NS: &str = "gpu-dra-driver";
/// The busybox image `up` imports for test pods (`imagePullPolicy: Never`).
pub const BUSYBOX: &str = "gpu-dra.local/busybox:1";
/// Where the plugin keeps its state on the node (`<kubelet plugins>/<driver>`).
pub const PLUGIN_DIR: &str = "/var/lib/kubelet/plugins/gpu.nvidia.com";
/// The MPS daemons' folders on the node (the chart's `mpsDir` plus the driver name).
pub const MPS_DIR: &str = "/run/gpu-dra-driver/mps/gpu.nvidia.com";
/// Where the plugin writes transient CDI specs (the chart's `cdiRoot`).
pub const CDI_DIR: &str = "/var/run/cdi";
/// The machine profile the tests run the node as: MIG devices already made
/// (static MIG), a MIG-enabled GPU without devices (dynamic MIG), whole GPUs
/// on an NVSwitch fabric.
pub const PROFILE: &str = "dgx-a100";
/// The GPU the node shares by memory fraction in the tests (`--memory-sharing`).
pub const MEMORY_SHARED_GPU: &str = "7";

/// Namespaces made by the running test (see [`Cluster::delete_test_namespaces`]).
static CREATED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Errors of the cluster harness.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The cluster cannot run here; the reason says what to do.
    #[error("the real cluster cannot run here: {0}")]
    Unavailable(String),
    /// A command could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A command failed.
    #[error("{what} failed ({status}):\n{output}")]
    Failed {
        /// The command, in words.
        what: String,
        /// Its exit status.
        status: String,
        /// Its stderr and stdout.
        output: String,
    },
    /// `up` did not print the exports it promises.
    #[error("hack/cluster/up printed no `{0}` line")]
    NoExport(&'static str),
    /// A condition was not met in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        after: Duration,
    },
}

/// A running cluster with the driver.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The folder holding `kubectl`, `helm` and the other built binaries.
    pub bin: PathBuf,
    /// The repository root.
    pub repo: PathBuf,
}

/// The cluster's state folder (`hack/cluster/lib.sh`).
pub fn cluster_state() -> PathBuf {
    std::env::var_os("GPU_DRA_CLUSTER_STATE")
        .map_or_else(|| PathBuf::from("/var/lib/gpu-dra-cluster"), PathBuf::from)
}

/// The repository root (this crate is `<root>/e2e`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e has a parent")
        .to_path_buf()
}

fn run(what: &str, cmd: &mut Command) -> Result<Output, ClusterError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ClusterError::Spawn {
            program: cmd.get_program().to_string_lossy().into_owned(),
            source,
        })?;
    if !out.status.success() {
        return Err(ClusterError::Failed {
            what: what.to_owned(),
            status: out.status.to_string(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            ),
        });
    }
    Ok(out)
}

impl Cluster {
    /// Why the cluster cannot run here, if it cannot: not root, or the
    /// binaries not built (`hack/cluster/build`, which takes long cold, is
    /// left to `.ci/run` or the developer).
    pub fn unavailable_reason() -> Option<String> {
        if !rustix::process::geteuid().is_root() {
            return Some("not root (kubelet, containerd and the node's network need it)".into());
        }
        let check = Command::new(repo_root().join("hack/cluster/build"))
            .arg("--check")
            .stdin(Stdio::null())
            .output();
        match check {
            Ok(out) if out.status.success() => None,
            Ok(out) => Some(format!(
                "the cluster's binaries are not built ({}); run hack/cluster/build (about 40 min cold on 2 cores)",
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => Some(format!("cannot run hack/cluster/build --check: {e}")),
        }
    }

    /// Brings the cluster up with the driver (`hack/cluster/up --with-driver
    /// --profile PROFILE`, the shared GPU set), or returns `Ok(None)` after a
    /// loud skip message when it cannot run here and [`REQUIRE_ENV`] is not
    /// `1`.
    pub fn up_or_skip(test: &str) -> Result<Option<Self>, ClusterError> {
        if std::env::var(USE_RUNNING_ENV).is_ok_and(|v| v == "1") {
            return Self::running().map(Some);
        }
        if let Some(reason) = Self::unavailable_reason() {
            return gpu_dra_e2e::skip_unless_required(
                test,
                REQUIRE_ENV,
                ClusterError::Unavailable(reason),
            );
        }
        Self::up(&[
            "--with-driver",
            "--profile",
            PROFILE,
            "--set-string",
            &format!("kubeletPlugin.memorySharing={MEMORY_SHARED_GPU}"),
            // Static MIG first: the MIG test switches to dynamic MIG (which
            // destroys the static devices no claim uses) for the tests after it.
            "--set",
            "kubeletPlugin.dynamicMig=false",
        ])
        .map(Some)
    }

    /// The cluster that runs already (see [`USE_RUNNING_ENV`]).
    pub fn running() -> Result<Self, ClusterError> {
        let repo = repo_root();
        let out = run(
            "hack/cluster/build --check",
            Command::new(repo.join("hack/cluster/build")).arg("--check"),
        )?;
        let kubeconfig = cluster_state().join("admin.kubeconfig");
        if !kubeconfig.exists() {
            return Err(ClusterError::Unavailable(format!(
                "{USE_RUNNING_ENV}=1 but no cluster runs ({} is missing)",
                kubeconfig.display()
            )));
        }
        Ok(Self {
            kubeconfig,
            bin: String::from_utf8_lossy(&out.stdout).trim().into(),
            repo,
        })
    }

    /// Runs `hack/cluster/up` with `args` and reads its exports.
    pub fn up(args: &[&str]) -> Result<Self, ClusterError> {
        let repo = repo_root();
        let out = run(
            "hack/cluster/up",
            Command::new(repo.join("hack/cluster/up"))
                .args(args)
                .stderr(Stdio::inherit()),
        )?;
        Self::from_exports(&String::from_utf8_lossy(&out.stdout), repo)
    }

    /// The cluster `up` described in its two export lines.
    pub fn from_exports(stdout: &str, repo: PathBuf) -> Result<Self, ClusterError> {
        let kubeconfig = stdout
            .lines()
            .find_map(|l| l.strip_prefix("export KUBECONFIG="))
            .ok_or(ClusterError::NoExport("export KUBECONFIG="))?;
        let bin = stdout
            .lines()
            .find_map(|l| l.strip_prefix("export PATH="))
            .and_then(|p| p.strip_suffix(":$PATH"))
            .ok_or(ClusterError::NoExport("export PATH=<bin>:$PATH"))?;
        Ok(Self {
            kubeconfig: kubeconfig.into(),
            bin: bin.into(),
            repo,
        })
    }

    /// Stops the cluster (`hack/cluster/down`), unless [`KEEP_ENV`] is `1`.
    pub fn down(&self) -> Result<(), ClusterError> {
        let set = |var: &str| std::env::var(var).is_ok_and(|v| v == "1");
        if set(USE_RUNNING_ENV) {
            return Ok(());
        }
        if set(KEEP_ENV) {
            eprintln!(
                "cluster kept ({KEEP_ENV}=1): export KUBECONFIG={}; hack/cluster/down stops it",
                self.kubeconfig.display()
            );
            return Ok(());
        }
        run(
            "hack/cluster/down",
            Command::new(self.repo.join("hack/cluster/down")).stderr(Stdio::inherit()),
        )
        .map(|_| ())
    }

    /// A command for one of the cluster's binaries, pointed at the cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        cmd.env("KUBECONFIG", &self.kubeconfig);
        cmd
    }

    /// Runs `kubectl args`; its stdout on success.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, ClusterError> {
        let out = run(
            &format!("kubectl {}", args.join(" ")),
            self.command("kubectl").args(args),
        )?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `kubectl args` with `stdin`; the whole output and whether it
    /// succeeded (for the commands that must fail).
    pub fn kubectl_with_input(
        &self,
        args: &[&str],
        stdin: &str,
    ) -> Result<(bool, String), ClusterError> {
        use std::io::Write;
        let mut child = self
            .command("kubectl")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| ClusterError::Spawn {
                program: "kubectl".into(),
                source,
            })?;
        let mut input = child.stdin.take().expect("piped");
        let text = stdin.to_owned();
        let writer = std::thread::spawn(move || input.write_all(text.as_bytes()));
        let out = child
            .wait_with_output()
            .map_err(|source| ClusterError::Spawn {
                program: "kubectl".into(),
                source,
            })?;
        let _ = writer.join();
        Ok((
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ))
    }

    /// `kubectl apply -n ns -f -` of `yaml`; an error with kubectl's message
    /// when refused.
    pub fn apply(&self, ns: &str, yaml: &str) -> Result<String, ClusterError> {
        let (ok, out) = self.kubectl_with_input(&["apply", "-n", ns, "-f", "-"], yaml)?;
        if ok {
            Ok(out)
        } else {
            Err(ClusterError::Failed {
                what: format!("kubectl apply -n {ns}"),
                status: "refused".into(),
                output: out,
            })
        }
    }

    /// A kube client for the cluster (one per runtime: call it inside the
    /// runtime that uses it).
    pub async fn client(&self) -> Result<kube::Client, ClusterError> {
        let unavailable = |e: String| ClusterError::Unavailable(format!("kube client: {e}"));
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| unavailable(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| unavailable(e.to_string()))?;
        kube::Client::try_from(config).map_err(|e| unavailable(e.to_string()))
    }

    /// Creates namespace `ns` (deleting a leftover of an earlier run first),
    /// labelled for admin access (DRAAdminAccess needs the label).
    pub fn fresh_namespace(&self, ns: &str) -> Result<(), ClusterError> {
        CREATED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(ns.to_owned());
        let _ = self.kubectl(&[
            "delete",
            "namespace",
            ns,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
        ]);
        self.kubectl(&["create", "namespace", ns])?;
        self.kubectl(&[
            "label",
            "namespace",
            ns,
            "resource.kubernetes.io/admin-access=true",
        ])?;
        Ok(())
    }

    /// Deletes the namespaces made by [`Cluster::fresh_namespace`] since the
    /// last call and waits until they are gone, so that the next test finds
    /// every device free (run after each test, passed or failed).
    pub fn delete_test_namespaces(&self) -> Result<(), ClusterError> {
        let made: Vec<String> = std::mem::take(
            &mut *CREATED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if made.is_empty() {
            return Ok(());
        }
        let mut args = vec![
            "delete",
            "namespace",
            "--ignore-not-found",
            "--wait=true",
            "--timeout=180s",
        ];
        args.extend(made.iter().map(String::as_str));
        self.kubectl(&args).map(|_| ())
    }

    /// Waits until `kubectl get <what> -o jsonpath=<path>` prints `want`.
    pub fn wait_jsonpath(
        &self,
        ns: &str,
        what: &str,
        path: &str,
        want: &str,
        limit: Duration,
    ) -> Result<(), ClusterError> {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < limit {
            match self.kubectl(&["get", "-n", ns, what, "-o", &format!("jsonpath={path}")]) {
                Ok(out) if out.trim() == want => return Ok(()),
                Ok(out) => last = out,
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Err(ClusterError::Timeout {
            what: format!("{what} in {ns}: {path} = {want:?} (last: {last:?})"),
            after: limit,
        })
    }

    /// Waits until pod `name` has phase `phase`, failing early when it ends
    /// in the other final phase.
    pub fn wait_pod_phase(
        &self,
        ns: &str,
        name: &str,
        phase: &str,
        limit: Duration,
    ) -> Result<(), ClusterError> {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < limit {
            if let Ok(out) = self.kubectl(&[
                "get",
                "-n",
                ns,
                "pod",
                name,
                "-o",
                "jsonpath={.status.phase}",
            ]) {
                out.trim().clone_into(&mut last);
                if last == phase {
                    return Ok(());
                }
                if (last == "Failed" || last == "Succeeded") && phase != last {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let describe = self
            .kubectl(&["describe", "-n", ns, "pod", name])
            .unwrap_or_default();
        Err(ClusterError::Timeout {
            what: format!("pod {ns}/{name} to be {phase} (last phase {last:?})\n{describe}"),
            after: limit,
        })
    }
}

/// The node's own files (this machine is the node).
pub mod node {
    use std::path::Path;

    use super::{CDI_DIR, MPS_DIR, PLUGIN_DIR};

    /// The MPS daemons' folders on the node (one per daemon, named after
    /// the claim: `claim-<uid>-<n>`).
    pub fn mps_daemons() -> Vec<String> {
        std::fs::read_dir(MPS_DIR)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// The CDI spec files of the driver's claims on the node.
    pub fn claim_cdi_specs() -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(CDI_DIR)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("k8s.gpu.nvidia.com-claim_"))
            .collect();
        out.sort();
        out
    }

    /// The plugin's checkpoint file on the node, as text (empty when absent).
    pub fn checkpoint() -> String {
        std::fs::read_to_string(Path::new(PLUGIN_DIR).join("checkpoint.json")).unwrap_or_default()
    }

    /// The fake NVML library's saved hardware state (MIG instances...), as text.
    pub fn nvml_state() -> String {
        std::fs::read_to_string(Path::new(PLUGIN_DIR).join("mock-nvml-state.json"))
            .unwrap_or_default()
    }
}

/// Tests of the harness that need no cluster.
pub const OFFLINE: [(&str, crate::Offline); 1] = [(
    "harness::the_exports_of_up_are_read",
    the_exports_of_up_are_read,
)];

fn the_exports_of_up_are_read() -> Result<(), libtest_mimic::Failed> {
    let out = "noise\nexport KUBECONFIG=/var/lib/x/admin.kubeconfig\nexport PATH=/c/bin-1:$PATH\n";
    let c = Cluster::from_exports(out, "/r".into())?;
    if c.kubeconfig != Path::new("/var/lib/x/admin.kubeconfig") || c.bin != Path::new("/c/bin-1") {
        return Err(format!("read {c:?}").into());
    }
    for bad in [
        "export PATH=/c:$PATH\n",
        "export KUBECONFIG=/k\nexport PATH=/c\n",
    ] {
        if !matches!(
            Cluster::from_exports(bad, "/r".into()),
            Err(ClusterError::NoExport(_))
        ) {
            return Err(format!("{bad:?} was accepted").into());
        }
    }
    Ok(())
}
