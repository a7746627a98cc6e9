//! `gpu-dra-demo`: the whole driver, end to end, in one process and one
//! temporary directory. It wires the real plugin code
//! ([`gpu_kubelet_plugin::plugin::Plugin`]) to the simulation pieces: the
//! fake `libnvidia-ml.so` with an embedded machine profile (and the MIG
//! capability files it keeps, as the kernel does), a sysfs tree laid out
//! from the same profile, a fake driver root whose MPS daemon really runs,
//! the API server stand-in and the kubelet simulator (`gpu-dra-sim`). The
//! webhook's review code judges every object, the allocator stands in for
//! kube-scheduler.
//!
//! Steps: the node and its GPUs; the ResourceSlices published; the example
//! claims of `demo/` ([`claims`]), each admitted or denied ([`admission`]),
//! placed ([`scheduler`]), prepared and resolved as a runtime would
//! ([`walk`], [`inspect`]); then one unprepare of all of them and the
//! proof that nothing is left ([`proof`]); a GPU that falls off the bus and
//! comes back, through the plugin's health monitor ([`health`]); the
//! plugin's shutdown; and the removal of the temporary directory. Output: [`print`](mod@print), or one JSON document.

mod admission;
mod claims;
mod health;
mod inspect;
mod print;
mod proof;
mod scheduler;
mod walk;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser as _;
use gpu_dra_sim::apiserver::{Resource, ServerOptions, TestApiServer};
use gpu_dra_sim::kubelet::KubeletSim;
use gpu_dra_sim::pool;
use gpu_kubelet_plugin::flags::Flags;
use gpu_kubelet_plugin::plugin::{Plugin, Services, kube_client};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

use gpu_dra::{manifest, shipped};
use print::Printer;
use proof::{Leftovers, NodePaths, OutsidePaths};

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
/// The plugin's `--health-poll-interval` in the demo: short, so that the
/// demo sees a fault and the recovery soon.
const HEALTH_POLL: Duration = Duration::from_millis(500);

/// Flags of `gpu-dra-demo`.
#[derive(Debug, clap::Parser)]
#[command(
    name = "gpu-dra-demo",
    version,
    about = "Run the kubelet plugin on a simulated GPU node (fake NVML, API server stand-in, \
             simulated kubelet) and show what it publishes"
)]
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

    /// Keep the temporary directory (its path is in the report) to look
    /// at what the run left there; by default it is removed.
    #[arg(long)]
    keep_temp_dir: bool,

    /// The plugin's `--health-quiet-period`: how long a GPU that was lost
    /// stays tainted after it answers again (the plugin's default is 60 s;
    /// short here so the demo shows the recovery).
    #[arg(long, default_value = "2s", value_parser = gpu_kubelet_plugin::health::flags::parse_quiet)]
    health_quiet_period: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Text,
    Json,
}

fn main() -> std::process::ExitCode {
    // The demo's plugin starts MPS daemons through this program (see
    // `launch`): nothing else may run first.
    if let Some(code) = gpu_kubelet_plugin::prepare::mps::launch::run_if_asked() {
        return code;
    }
    match run(&Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the demo.
fn run(args: &Args) -> Result<()> {
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
    let settings = Settings {
        profile_name: &profile_name,
        profile_yaml: &profile_yaml,
        dynamic_mig: args.dynamic_mig,
        keep_temp_dir: args.keep_temp_dir,
        health_quiet: args.health_quiet_period,
    };
    let (report, problems) = runtime.block_on(demo(&out, &settings))?;
    if args.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("; "));
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
        // The profile's own limit, before the file is read whole here.
        let len = std::fs::metadata(path)
            .with_context(|| format!("read profile {}", path.display()))?
            .len();
        let max = nvidia_ml::profile::MAX_PROFILE_BYTES;
        if len > max as u64 {
            bail!(
                "profile {}: {len} bytes, more than the {max} bytes allowed",
                path.display()
            );
        }
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

/// What to run.
struct Settings<'a> {
    profile_name: &'a str,
    profile_yaml: &'a str,
    dynamic_mig: bool,
    keep_temp_dir: bool,
    health_quiet: Duration,
}

/// The simulated machine in the temporary directory.
struct Machine {
    nvml_lib: PathBuf,
    /// The fake NVML's control file (GPU faults are written to it).
    control: PathBuf,
    sysfs: PathBuf,
    paths: NodePaths,
    /// NVML index of the GPU shared by memory fraction (the last one).
    shared_gpu: Option<u32>,
    gpus: usize,
}

/// Lays out the machine: fake NVML (keeping MIG capability files under the
/// proc root and nodes under the dev root, as the kernel does), its sysfs
/// tree, device nodes, the NVIDIA proc tree, a fake driver root.
fn machine(root: &Path, profile_yaml: &str) -> Result<Machine> {
    let nvml_dir = root.join("nvml");
    std::fs::create_dir_all(&nvml_dir).context("create the NVML directory")?;
    let profile_path = nvml_dir.join("profile.yaml");
    std::fs::write(&profile_path, profile_yaml).context("write the machine profile")?;
    let profile = nvidia_ml::Profile::load(&profile_path)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("load the machine profile")?;
    let minors: Vec<u32> = profile.gpus.iter().map(|g| g.minor).collect();
    let dev_root = root.join("devroot");
    fake_driver_root::create_dev_root(&dev_root, &minors).context("create the device nodes")?;
    let proc_root = fake_driver_root::create_proc_root(&root.join("proc"))
        .context("create the NVIDIA proc tree")?;
    let driver_root = fake_driver_root::FakeDriverRoot::create(&root.join("driver"))
        .context("create the fake driver root")?;
    let control = root.join("nvml-control");
    std::fs::write(&control, "").context("create the fake NVML's control file")?;
    let options = nvidia_ml::fixture::InstallOptions {
        state: Some(root.join("nvml-state.json")),
        proc_root: Some(proc_root.clone()),
        dev_root: Some(dev_root.clone()),
        control: Some(control.clone()),
    };
    let nvml_lib = nvidia_ml::fixture::install_with(&nvml_dir, &profile_path, &options)
        .context("install the fake NVML library")?;
    let sysfs = root.join("sys");
    nvidia_ml::sysfs::write(&profile, &sysfs)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("lay out the sysfs tree")?;
    let gpus = profile.gpus.len();
    Ok(Machine {
        nvml_lib,
        control,
        sysfs,
        paths: NodePaths {
            cdi: root.join("cdi"),
            proc_root,
            dev_root,
            state_dir: root.join("plugins").join(DRIVER),
            driver_root,
        },
        shared_gpu: gpus.checked_sub(1).and_then(|i| u32::try_from(i).ok()),
        gpus,
    })
}

/// The plugin's command line on the machine.
fn plugin_flags(
    root: &Path,
    machine: &Machine,
    kubeconfig: &Path,
    settings: &Settings<'_>,
) -> Result<Flags> {
    let paths = &machine.paths;
    let mut argv: Vec<String> = vec![
        "gpu-kubelet-plugin".into(),
        format!("--node-name={NODE}"),
        format!("--driver-name={DRIVER}"),
        format!(
            "--kubelet-registrar-dir={}",
            root.join("registry").display()
        ),
        format!("--kubelet-plugins-dir={}", root.join("plugins").display()),
        format!("--cdi-root={}", paths.cdi.display()),
        format!("--driver-root={}", paths.driver_root.path().display()),
        format!("--dev-root={}", paths.dev_root.display()),
        format!("--proc-root={}", paths.proc_root.display()),
        format!("--nvml-lib={}", machine.nvml_lib.display()),
        format!("--sysfs-root={}", machine.sysfs.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        "--delete-slices-on-exit".into(),
        // The health monitor: a short quiet period so the demo shows a
        // recovery, a short poll so it sees it soon.
        format!(
            "--health-quiet-period={}ms",
            settings.health_quiet.as_millis()
        ),
        format!("--health-poll-interval={}ms", HEALTH_POLL.as_millis()),
    ];
    if let Some(index) = machine.shared_gpu {
        argv.push(format!("--memory-sharing={index}"));
    }
    if settings.dynamic_mig {
        argv.push("--dynamic-mig".into());
    }
    let mut flags = Flags::try_parse_from(&argv).context("plugin flags")?;
    // `main` runs the launcher first, so this program is one.
    flags.mps_launcher = Some(gpu_kubelet_plugin::prepare::mps::launch::SELF_EXE.into());
    Ok(flags)
}

async fn demo(out: &Printer, settings: &Settings<'_>) -> Result<(Value, Vec<String>)> {
    let mut outside = OutsidePaths::observe();
    let tmp = tempfile::Builder::new()
        .prefix("gpu-dra-demo-")
        .tempdir()
        .context("create a temporary directory")?;
    let root = tmp.path().to_path_buf();
    let mut problems: Vec<String> = Vec::new();

    // 1. The simulated machine.
    let step = out.step("simulated GPU node", settings.profile_name);
    let machine = machine(&root, settings.profile_yaml)?;
    // Daemons started from the driver root die with the demo, whatever happens.
    let _processes = machine.paths.driver_root.guard();
    step.done_with(&format!(
        "{} GPUs, fake driver {}",
        machine.gpus,
        machine.paths.driver_root.options().driver_version
    ));

    // 2. The API server stand-in, the Node, the shipped DeviceClasses.
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
        .create_node(NODE)
        .map_err(|e| anyhow::anyhow!("{}", e.message))
        .context("create the Node")?;
    let client = kube::Client::try_from(kube::Config::new(
        server.url().parse().context("the API server's URL")?,
    ))
    .context("create the Kubernetes client")?;
    step.done_with(&server.url());

    let step = out.step("DeviceClasses", "shipped, judged by the webhook");
    let class_objects = crate::shipped::classes()?;
    let webhook = admission::Webhook::new(DRIVER, class_objects.clone());
    let classes: Api<DeviceClass> = Api::all(client.clone());
    for object in &class_objects {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let verdict = webhook.review_create(object)?;
        if !verdict.allowed {
            bail!(
                "the webhook denied the shipped DeviceClass {name}: {}",
                verdict.message.unwrap_or_default()
            );
        }
        let class: DeviceClass = serde_json::from_value(object.clone())
            .with_context(|| format!("the shipped DeviceClass {name} does not decode"))?;
        classes
            .create(&PostParams::default(), &class)
            .await
            .with_context(|| format!("create DeviceClass {name}"))?;
    }
    step.done_with(&format!("{} admitted and created", class_objects.len()));

    // 3. The real plugin, in-process, and the kubelet simulator registering it.
    let step = out.step(
        "gpu-kubelet-plugin",
        "discovery, preparer, sockets, slice publisher",
    );
    let flags = plugin_flags(&root, &machine, &kubeconfig, settings)?;
    std::fs::create_dir_all(&flags.kubelet_registrar_dir)
        .context("create the registrar directory")?;
    let sim = KubeletSim::new();
    let mut registrar = sim.watch_registrar(&flags.kubelet_registrar_dir);
    let started = Instant::now();
    let (phase, _) = gpu_kubelet_plugin::phase::channel();
    // The plugin's own client, from the kubeconfig as in a cluster.
    let plugin_client = kube_client(Some(&kubeconfig))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("the plugin's Kubernetes client")?;
    let handle = Plugin::start(&flags, plugin_client, Services::default(), phase)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("start the plugin")?;
    let kubelet = registrar
        .wait_registered(DRIVER, WAIT)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("kubelet registration")?;
    let registration_socket = kubelet.registration_socket.clone();
    let dra_socket = kubelet.endpoint.clone();
    step.done_with(&format!(
        "registered, kubelet speaks {}",
        kubelet.dra_version.as_str()
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
    let gpus = gpu_rows(&inventory, &devices, machine.shared_gpu);
    let pool = pool_summary(&slices, &devices);
    out.gpu_table(&gpus);
    out.slice_table(&slices);
    out.device_summary(&pool);

    // 5. The example claims.
    let cluster = walk::Cluster {
        client: client.clone(),
        kubelet: &kubelet,
        preparer: handle.preparer(),
        webhook: &webhook,
        node: NODE,
        cdi: &machine.paths.cdi,
    };
    let mut walked = Vec::new();
    for claim in claims::load()? {
        let step = out.step(
            &format!("claim {}", claim.name),
            &format!("{}, {}", claim.what, claim.file),
        );
        let w = walk::walk(&cluster, &claim).await?;
        step.outcome(&w.outcome);
        out.claim(&w);
        if let walk::Outcome::PrepareFailed { error, .. } = &w.outcome {
            problems.push(format!("prepare of claim {} failed: {error}", w.name));
        }
        walked.push(w);
    }

    // 6. Unprepare everything, and look for what is left.
    let mig_gpus: Vec<u32> = inventory
        .gpus
        .iter()
        .filter(|g| g.info.mig.is_some())
        .map(|g| g.info.index)
        .collect();
    let scan = |settle: bool| {
        let paths = machine.paths.clone();
        let backend = Arc::clone(handle.backend());
        let preparer = handle.preparer().clone();
        let mig_gpus = mig_gpus.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                Leftovers::scan(&paths, backend.as_ref(), &mig_gpus, &preparer, settle)
            })
            .await
            .context("the cleanup scan failed")
        }
    };
    let before = scan(false).await?;
    let step = out.step("unprepare", "every prepared claim, in one kubelet call");
    let unprepared = walk::unprepare_all(&cluster, &walked).await?;
    let after = scan(true).await?;
    let claims_left = walk::delete_all(&cluster, &walked).await?;
    step.done_with(&format!(
        "{unprepared} claims unprepared, {} deleted",
        walked.iter().filter(|w| w.uid.is_some()).count()
    ));
    out.proof(&before, &after);
    if !after.is_empty() {
        problems.push(format!(
            "unprepare left state behind: {}",
            after.paths().join(", ")
        ));
    }

    // 7. With the claims gone, a GPU falls off the bus and comes back.
    let allocated: Vec<String> = walked
        .iter()
        .flat_map(|w| &w.allocation)
        .filter_map(|a| a["device"].as_str().map(str::to_owned))
        .collect();
    let gpu_ids: Vec<(u32, String)> = inventory
        .gpus
        .iter()
        .map(|g| (g.info.minor, g.info.uuid.clone()))
        .collect();
    let health_report = match health::pick_gpu(&gpu_ids, &allocated) {
        Some(gpu) => {
            let setup = health::Setup {
                server: &server,
                client: client.clone(),
                kubelet: &kubelet,
                control: &machine.control,
                node: NODE,
                driver: DRIVER,
                gpu,
                quiet: settings.health_quiet,
                poll: HEALTH_POLL,
            };
            health::run(out, &setup).await?
        }
        None => Value::Null,
    };

    // 8. Stop: deregistration first, then drain, then the pool is removed.
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
        &gpu_dra_sim::apiserver::Selectors::default(),
    );
    server
        .shutdown()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    step.done();

    // 9. Nothing left: sockets, slices, claims, the temporary directory,
    // and outside it.
    let sockets_left: Vec<PathBuf> = [&registration_socket, &dra_socket]
        .into_iter()
        .filter(|p| p.exists())
        .cloned()
        .collect();
    let (outside_left, outside_note) = outside.settle();
    let tmp_path = tmp.path().to_path_buf();
    if settings.keep_temp_dir {
        let _ = tmp.keep();
    } else {
        tmp.close().context("remove the temporary directory")?;
    }
    let temp_dir_removed = !tmp_path.exists();
    let cleanup = json!({
        "unprepared": unprepared,
        "before": before.to_json(),
        "after": after.to_json(),
        "claimsLeft": claims_left,
        "socketsLeft": sockets_left,
        "slicesLeft": left.len(),
        "outsideTempDir": outside_left,
        "notes": outside_note.iter().collect::<Vec<_>>(),
        "tempDir": tmp_path,
        "tempDirRemoved": temp_dir_removed,
    });
    let mut lines = vec![format!(
        "Left behind: {} sockets, {} ResourceSlices, {} ResourceClaims, temporary directory {}",
        sockets_left.len(),
        left.len(),
        claims_left,
        if temp_dir_removed {
            "removed".to_owned()
        } else {
            format!("kept at {}", tmp_path.display())
        }
    )];
    lines.extend(outside_note);
    lines.extend(
        outside_left
            .iter()
            .map(|p| format!("outside the temporary directory: {p}")),
    );
    let clean = sockets_left.is_empty()
        && left.is_empty()
        && claims_left == 0
        && outside_left.is_empty()
        && after.is_empty()
        && (temp_dir_removed || settings.keep_temp_dir);
    out.cleanup(clean, &lines);
    if !clean && after.is_empty() {
        problems.push(format!("the demo left something behind: {cleanup}"));
    }

    let report = json!({
        "profile": settings.profile_name,
        "node": NODE,
        "driver": DRIVER,
        "dynamicMig": settings.dynamic_mig,
        "memorySharing": machine.shared_gpu.into_iter().collect::<Vec<_>>(),
        "registration": {
            "draVersion": kubelet.dra_version.as_str(),
            "healthVersion": kubelet.health_version.map(gpu_dra_sim::kubelet::HealthVersion::as_str),
            "supportedVersions": kubelet.supported_versions,
        },
        "publishMs": publish_ms,
        "gpus": gpus,
        "pool": pool,
        "claims": walked.iter().map(walk::Walked::to_json).collect::<Vec<_>>(),
        "health": health_report,
        "cleanup": cleanup,
    });
    Ok((report, problems))
}

/// One row per GPU: what NVML said, plus topology attributes as published.
fn gpu_rows(
    inventory: &gpu_kubelet_plugin::discovery::Inventory,
    devices: &[&Value],
    shared: Option<u32>,
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
                "memorySharing": shared == Some(g.info.index),
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
