//! `gpu-dra demo`: the node side of the driver, end to end, in one process
//! and one temporary directory. It wires the real plugin code
//! ([`gpu_kubelet_plugin::plugin::Plugin`]) to the simulation pieces: the fake
//! `libnvidia-ml.so` with an embedded machine profile, a sysfs tree laid out
//! from the same profile, the test API server and the kubelet simulator.
//! Then it shows what the plugin found and published, stops it and checks
//! that nothing is left behind.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser as _;
use gpu_dra_e2e::apiserver::{Resource, ServerOptions, TestApiServer, WriteOptions};
use gpu_dra_e2e::kubelet::KubeletSim;
use gpu_dra_e2e::pool;
use gpu_kubelet_plugin::flags::Flags;
use gpu_kubelet_plugin::grpc;
use gpu_kubelet_plugin::plugin::Plugin;
use serde_json::{Value, json};

/// The machine profiles shipped with the fake NVML library, embedded so the
/// demo needs no file next to the binary.
const PROFILES: &[(&str, &str)] = &[
    (
        "dgx-h100",
        include_str!("../../hack/mock-nvml/profiles/dgx-h100.yaml"),
    ),
    (
        "dgx-a100",
        include_str!("../../hack/mock-nvml/profiles/dgx-a100.yaml"),
    ),
    (
        "pcie-a100-bridged",
        include_str!("../../hack/mock-nvml/profiles/pcie-a100-bridged.yaml"),
    ),
    (
        "t4-inference",
        include_str!("../../hack/mock-nvml/profiles/t4-inference.yaml"),
    ),
    (
        "mixed",
        include_str!("../../hack/mock-nvml/profiles/mixed.yaml"),
    ),
];

const NODE: &str = "demo-node";
const DRIVER: &str = "gpu.nvidia.com";
const WAIT: Duration = Duration::from_secs(30);

/// Flags of `gpu-dra demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Machine profile: a shipped name (dgx-h100, dgx-a100, pcie-a100-bridged,
    /// t4-inference, mixed) or the path of a profile YAML file.
    #[arg(long, default_value = "dgx-h100")]
    profile: String,

    /// Publish every possible MIG placement (dynamic MIG).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    dynamic_mig: bool,

    /// Output: readable tables, or one JSON document for scripts.
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Text,
    Json,
}

/// Runs the demo.
pub fn run(args: &Args) -> Result<()> {
    let (profile_name, profile_yaml) = load_profile(&args.profile)?;
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start the async runtime")?;
    let out = Printer::new(args.output);
    let report = runtime.block_on(demo(&out, &profile_name, &profile_yaml, args.dynamic_mig))?;
    if args.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// A shipped profile by name, or a profile file.
fn load_profile(arg: &str) -> Result<(String, String)> {
    if let Some((name, yaml)) = PROFILES.iter().find(|(n, _)| *n == arg) {
        return Ok(((*name).to_string(), (*yaml).to_string()));
    }
    let path = Path::new(arg);
    if path.is_file() {
        let yaml = std::fs::read_to_string(path)
            .with_context(|| format!("read profile {}", path.display()))?;
        return Ok((arg.to_string(), yaml));
    }
    let names: Vec<&str> = PROFILES.iter().map(|(n, _)| *n).collect();
    bail!(
        "unknown profile {arg:?}: not a shipped profile ({}) and no such file",
        names.join(", ")
    )
}

async fn demo(
    out: &Printer,
    profile_name: &str,
    profile_yaml: &str,
    dynamic_mig: bool,
) -> Result<Value> {
    let tmp = tempfile::Builder::new()
        .prefix("gpu-dra-demo-")
        .tempdir()
        .context("create a temporary directory")?;
    let root = tmp.path().to_path_buf();

    // 1. The simulated machine: fake NVML with the profile, and its sysfs tree.
    let step = out.step("simulated GPU node", profile_name);
    let nvml_lib = nvidia_ml::fixture::install_yaml(&root.join("nvml"), profile_yaml, None)
        .context("install the fake NVML library")?;
    let sysfs = root.join("sys");
    nvidia_ml::Profile::load(&root.join("nvml/profile.yaml"))
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("load the machine profile")?
        .write_sysfs(&sysfs)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("lay out the sysfs tree")?;
    step.done();

    // 2. The API server stand-in, with the Node object the slices belong to.
    let step = out.step("Kubernetes API server stand-in", "in-process");
    let server = TestApiServer::start(ServerOptions::default())
        .await
        .context("start the test API server")?;
    let kubeconfig = root.join("kubeconfig");
    server
        .write_kubeconfig(&kubeconfig)
        .context("write the kubeconfig")?;
    server
        .store()
        .create(
            Resource::Nodes,
            None,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
            &WriteOptions::default(),
        )
        .map_err(|e| anyhow::anyhow!("{}", e.message))
        .context("create the Node")?;
    step.done_with(&server.url());

    // 3. The real plugin, in-process, and the kubelet simulator registering it.
    let step = out.step("gpu-kubelet-plugin", "discovery, sockets, slice publisher");
    let registrar_dir = root.join("registry");
    let plugins_dir = root.join("plugins");
    let mut argv: Vec<String> = vec![
        "gpu-kubelet-plugin".into(),
        format!("--node-name={NODE}"),
        format!("--driver-name={DRIVER}"),
        format!("--kubelet-registrar-dir={}", registrar_dir.display()),
        format!("--kubelet-plugins-dir={}", plugins_dir.display()),
        format!("--cdi-root={}", root.join("cdi").display()),
        format!("--nvml-lib={}", nvml_lib.display()),
        format!("--sysfs-root={}", sysfs.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        "--delete-slices-on-exit".into(),
    ];
    if dynamic_mig {
        argv.push("--dynamic-mig".into());
    }
    let flags = Flags::try_parse_from(&argv).context("plugin flags")?;
    std::fs::create_dir_all(&registrar_dir).context("create the registrar directory")?;
    let sim = KubeletSim::new();
    let mut registrar = sim.watch_registrar(&registrar_dir);
    let started = Instant::now();
    let handle = Plugin::start(&flags, grpc::Services::default())
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("start the plugin")?;
    let registered = registrar
        .wait_registered(DRIVER, WAIT)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("kubelet registration")?;
    let registration_socket = registered.registration_socket.clone();
    let dra_socket = registered.endpoint.clone();
    step.done_with(&format!(
        "registered, kubelet speaks {}",
        registered.dra_version.as_str()
    ));

    // 4. Wait for the complete pool.
    let step = out.step("ResourceSlices", "waiting for the complete pool");
    let slices = server
        .store()
        .wait_for(Resource::ResourceSlices, WAIT, |items| {
            pool::complete(pool::of(items, DRIVER, NODE)).is_some()
        })
        .await
        .map_err(|last| {
            anyhow::anyhow!(
                "the pool was not complete after {WAIT:?} ({} slices seen)",
                last.len()
            )
        })?;
    let publish_ms = started.elapsed().as_secs_f64() * 1000.0;
    step.done_with(&format!("published in {publish_ms:.0} ms"));

    let inventory = handle.inventory();
    let devices: Vec<&Value> = slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .collect();
    let gpus = gpu_rows(&inventory, &devices);
    let pool = pool_summary(&slices, &devices);
    out.gpu_table(&gpus);
    out.slice_table(&slices);
    out.device_summary(&pool);

    // 5. Stop: deregistration first, then drain, then the pool is removed.
    let step = out.step("shutdown", "deregister, drain, delete slices");
    handle
        .shutdown()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("stop the plugin")?;
    registrar
        .wait_deregistered(DRIVER, WAIT)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("kubelet deregistration")?;
    let (left, _) = server.store().list(
        Resource::ResourceSlices,
        None,
        &gpu_dra_e2e::apiserver::Selectors::default(),
    );
    server
        .shutdown()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    step.done();

    // 6. Proof that nothing is left behind.
    let sockets_left: Vec<PathBuf> = [&registration_socket, &dra_socket]
        .into_iter()
        .filter(|p| p.exists())
        .cloned()
        .collect();
    let tmp_path = tmp.path().to_path_buf();
    tmp.close().context("remove the temporary directory")?;
    let cleanup = json!({
        "socketsLeft": sockets_left,
        "slicesLeft": left.len(),
        "tempDirRemoved": !tmp_path.exists(),
    });
    out.cleanup(&sockets_left, left.len(), &tmp_path);
    if !sockets_left.is_empty() || !left.is_empty() || tmp_path.exists() {
        bail!("the demo left something behind: {cleanup}");
    }

    Ok(json!({
        "profile": profile_name,
        "node": NODE,
        "driver": DRIVER,
        "dynamicMig": dynamic_mig,
        "registration": {
            "draVersion": registered.dra_version.as_str(),
            "healthVersion": registered.health_version.map(gpu_dra_e2e::kubelet::HealthVersion::as_str),
            "supportedVersions": registered.supported_versions,
        },
        "publishMs": publish_ms,
        "gpus": gpus,
        "pool": pool,
        "cleanup": cleanup,
    }))
}

/// One row per GPU: what NVML said, plus topology attributes as published.
fn gpu_rows(
    inventory: &gpu_kubelet_plugin::discovery::Inventory,
    devices: &[&Value],
) -> Vec<Value> {
    inventory
        .gpus
        .iter()
        .map(|g| {
            let name = format!("gpu-{}", g.info.minor);
            let attrs = devices
                .iter()
                .find(|d| d["name"] == name.as_str())
                .map(|d| &d["attributes"]);
            let attr = |key: &str| attrs.map_or(Value::Null, |a| {
                let v = &a[key];
                v.get("string").or_else(|| v.get("int")).cloned().unwrap_or(Value::Null)
            });
            json!({
                "device": name,
                "index": g.info.index,
                "product": g.info.product_name,
                "memoryGiB": g.info.memory_bytes as f64 / f64::from(1u32 << 30),
                "mig": g.info.mig.as_ref().map_or("not capable", |m| if m.current_enabled { "on" } else { "off" }),
                "nvlinks": g.info.nvlinks.len(),
                "nvlinkDomain": attr("nvlinkDomain"),
                "pcieRoot": attr("resource.kubernetes.io/pcieRoot"),
                "numaNode": attr("resource.kubernetes.io/numaNode"),
            })
        })
        .collect()
}

/// Counts of the published pool.
fn pool_summary(slices: &[Value], devices: &[&Value]) -> Value {
    let mut by_type = std::collections::BTreeMap::<String, usize>::new();
    let mut profiles = std::collections::BTreeMap::<String, usize>::new();
    for d in devices {
        let t = d["attributes"]["type"]["string"].as_str().unwrap_or("?");
        *by_type.entry(t.to_string()).or_default() += 1;
        if let Some(p) = d["attributes"]["profile"]["string"].as_str() {
            *profiles.entry(p.to_string()).or_default() += 1;
        }
    }
    let counter_sets: usize = slices
        .iter()
        .map(|s| s["spec"]["sharedCounters"].as_array().map_or(0, Vec::len))
        .sum();
    json!({
        "generation": slices.first().map(|s| s["spec"]["pool"]["generation"].clone()),
        "slices": slices.len(),
        "devices": devices.len(),
        "counterSets": counter_sets,
        "byType": by_type,
        "migProfiles": profiles,
    })
}

/// Human output: progress lines and tables (colour only on a terminal);
/// silent in JSON mode.
struct Printer {
    text: bool,
    colour: bool,
}

/// A progress line in flight.
struct Step<'a> {
    printer: &'a Printer,
    started: Instant,
    finished: bool,
}

impl Printer {
    fn new(output: Output) -> Self {
        Self {
            text: output == Output::Text,
            colour: std::io::stdout().is_terminal(),
        }
    }

    fn paint(&self, code: &str, s: &str) -> String {
        if self.colour {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }

    fn step(&self, what: &str, detail: &str) -> Step<'_> {
        if self.text {
            print!("{} {what} ({detail}) ... ", self.paint("1;34", "==>"));
            let _ = std::io::Write::flush(&mut std::io::stdout());
        }
        Step {
            printer: self,
            started: Instant::now(),
            finished: false,
        }
    }

    fn gpu_table(&self, gpus: &[Value]) {
        if !self.text {
            return;
        }
        let rows: Vec<Vec<String>> = gpus
            .iter()
            .map(|g| {
                vec![
                    plain(&g["device"]),
                    plain(&g["product"]),
                    format!("{:.0} GiB", g["memoryGiB"].as_f64().unwrap_or(0.0)),
                    plain(&g["mig"]),
                    plain(&g["nvlinks"]),
                    plain(&g["nvlinkDomain"]),
                    plain(&g["pcieRoot"]),
                    plain(&g["numaNode"]),
                ]
            })
            .collect();
        println!("\nGPUs found");
        print_table(
            &[
                "DEVICE",
                "PRODUCT",
                "MEMORY",
                "MIG",
                "NVLINKS",
                "NVLINK DOMAIN",
                "PCIE ROOT",
                "NUMA",
            ],
            &rows,
        );
    }

    fn slice_table(&self, slices: &[Value]) {
        if !self.text {
            return;
        }
        let rows: Vec<Vec<String>> = slices
            .iter()
            .map(|s| {
                vec![
                    plain(&s["metadata"]["name"]),
                    plain(&s["spec"]["pool"]["name"]),
                    plain(&s["spec"]["pool"]["generation"]),
                    s["spec"]["devices"]
                        .as_array()
                        .map_or(0, Vec::len)
                        .to_string(),
                    s["spec"]["sharedCounters"]
                        .as_array()
                        .map_or(0, Vec::len)
                        .to_string(),
                ]
            })
            .collect();
        println!("\nResourceSlices published");
        print_table(
            &["NAME", "POOL", "GENERATION", "DEVICES", "COUNTER SETS"],
            &rows,
        );
    }

    fn device_summary(&self, pool: &Value) {
        if !self.text {
            return;
        }
        let by_type = pool["byType"].as_object().map(|m| {
            m.iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        });
        println!("\nDevices: {}", by_type.unwrap_or_default());
        if let Some(profiles) = pool["migProfiles"].as_object().filter(|m| !m.is_empty()) {
            let list: Vec<String> = profiles.iter().map(|(k, v)| format!("{k} x{v}")).collect();
            println!("MIG devices by profile: {}", list.join(", "));
        }
        println!();
    }

    fn cleanup(&self, sockets_left: &[PathBuf], slices_left: usize, tmp: &Path) {
        if !self.text {
            return;
        }
        let ok = sockets_left.is_empty() && slices_left == 0 && !tmp.exists();
        println!(
            "\nLeft behind: {} sockets, {} ResourceSlices, temporary directory {}",
            sockets_left.len(),
            slices_left,
            if tmp.exists() {
                "still there"
            } else {
                "removed"
            }
        );
        let verdict = if ok {
            self.paint("1;32", "nothing left behind")
        } else {
            self.paint("1;31", "something was left behind")
        };
        println!("{verdict}");
    }
}

impl Step<'_> {
    fn done(self) {
        self.done_with("");
    }

    fn done_with(mut self, detail: &str) {
        self.finished = true;
        if self.printer.text {
            let ms = self.started.elapsed().as_secs_f64() * 1000.0;
            let sep = if detail.is_empty() { "" } else { ", " };
            println!(
                "{} ({ms:.0} ms{sep}{detail})",
                self.printer.paint("32", "ok")
            );
        }
    }
}

impl Drop for Step<'_> {
    /// A step dropped unfinished failed: end its progress line so the error
    /// that follows starts on a line of its own.
    fn drop(&mut self) {
        if !self.finished && self.printer.text {
            println!("{}", self.printer.paint("31", "failed"));
        }
    }
}

/// A JSON scalar as table text (`-` for null).
fn plain(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("  {}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}
