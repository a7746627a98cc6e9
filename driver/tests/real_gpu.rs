//! On a machine with a real NVIDIA GPU and driver, never in CI: the plugin
//! binary on the real `libnvidia-ml.so.1`, its pool checked against what
//! `nvidia-smi` reports, and a whole-GPU claim prepared through the kubelet
//! simulator and consumed by podman. A container started with exactly the
//! CDI ids the plugin returned runs `nvidia-smi` and a CUDA kernel, and sees
//! the GPU the claim was allocated; the same container without them sees no
//! GPU.
//!
//! Read-only for the GPU: no MIG, MPS, compute mode or time-slice claim is
//! prepared, and the dynamic-MIG pass only publishes (its startup sweep has
//! nothing to do on a GPU with MIG off, and it runs only then). The GPU
//! machines lent to this project are shared; nothing here may change them.
//!
//! `hack/real-gpu/run.sh` runs these tests with what they need:
//! - `GPU_DRA_REAL_DRIVER_ROOT`: the driver root (default `/`);
//! - `GPU_DRA_REAL_CUDA_CHECK`: the CUDA check program built from
//!   `hack/real-gpu/cuda_check.cu` (the container part needs it);
//! - `GPU_DRA_REAL_OUT`: where the published slices, the CDI spec and the
//!   containers' output are saved (optional);
//! - `GPU_DRA_REAL_PLUGIN`: the plugin binary, when this test binary runs on
//!   another machine than the one it was built on (default: cargo's).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::prepare::{allocated_claim, result};
use common::{ApiServer, BIN, NODE, short_dir};
use gpu_dra_e2e::podman::{CdiSpecFile, Podman};
use gpu_dra_sim::apiserver::{Resource, ValidationRules};
use gpu_dra_sim::kubelet::KubeletSim;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use serde_json::{Value, json};

const DRIVER: &str = "gpu.nvidia.com";
const CDI_DIR: &str = "/var/run/cdi";
/// The image of the CUDA container: busybox, the C libraries the programs
/// need, the CUDA check program; the driver's files come from CDI alone.
const IMAGE: &str = "localhost/gpu-dra-real/cuda-check:latest";

/// One GPU as `nvidia-smi` reports it.
#[derive(Debug)]
struct SmiGpu {
    index: u32,
    uuid: String,
    name: String,
    memory_mib: u64,
    bus_id: String,
    driver: String,
    compute_cap: String,
    mig_current: String,
}

fn driver_root() -> PathBuf {
    std::env::var_os("GPU_DRA_REAL_DRIVER_ROOT").map_or_else(|| PathBuf::from("/"), PathBuf::from)
}

/// Saves `contents` as `name` under `GPU_DRA_REAL_OUT`, when set.
fn save(name: &str, contents: &str) {
    if let Some(dir) = std::env::var_os("GPU_DRA_REAL_OUT") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), contents).unwrap();
    }
}

fn nvidia_smi(args: &[&str]) -> String {
    let out = Command::new("nvidia-smi")
        .args(args)
        .output()
        .expect("run nvidia-smi (is it on PATH?)");
    assert!(out.status.success(), "nvidia-smi {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn smi_gpus() -> Vec<SmiGpu> {
    let text = nvidia_smi(&[
        "--query-gpu=index,uuid,name,memory.total,pci.bus_id,driver_version,compute_cap,mig.mode.current",
        "--format=csv,noheader,nounits",
    ]);
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            assert_eq!(f.len(), 8, "{line}");
            SmiGpu {
                index: f[0].parse().unwrap(),
                uuid: f[1].to_owned(),
                name: f[2].to_owned(),
                memory_mib: f[3].parse().unwrap(),
                bus_id: f[4].to_owned(),
                driver: f[5].to_owned(),
                compute_cap: f[6].to_owned(),
                mig_current: f[7].to_owned(),
            }
        })
        .collect()
}

/// `nvidia-smi`'s bus id (`00000000:00:06.0`, 8-digit domain) as published
/// (`0000:00:06.0`, lower case).
fn short_bus_id(id: &str) -> String {
    let (domain, rest) = id.split_once(':').unwrap();
    let domain = u32::from_str_radix(domain, 16).unwrap();
    format!("{domain:04x}:{}", rest.to_ascii_lowercase())
}

/// `580.159.04` as semver: `580.159.4`.
fn semver(version: &str) -> String {
    let mut parts: Vec<String> = version
        .split('.')
        .map(|p| p.parse::<u64>().unwrap().to_string())
        .collect();
    parts.resize(3, "0".to_owned());
    parts.join(".")
}

/// A quantity in bytes (`81559Mi`, `85520809984`).
fn bytes(quantity: &str) -> u64 {
    let split = quantity
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(quantity.len());
    let (n, unit) = quantity.split_at(split);
    let shift = match unit {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        "Ti" => 40,
        other => panic!("unit {other:?} of {quantity}"),
    };
    n.parse::<u64>().unwrap() << shift
}

/// A plugin on the real NVML, the host's sysfs, `/dev` and `/proc`.
struct RealPlugin {
    child: std::process::Child,
    log: PathBuf,
    reg_dir: PathBuf,
}

impl RealPlugin {
    /// Starts the plugin in `dir`, logging to `<name>.log` (saved when it
    /// is dropped), and waits until it serves.
    fn start(name: &str, dir: &Path, kubeconfig: &Path, extra: &[&str]) -> Self {
        let reg_dir = dir.join("reg");
        let log = dir.join(format!("{name}.log"));
        let root = driver_root();
        let (state, plugins) = (dir.join("state"), dir.join("plugins"));
        let mut args: Vec<&str> = vec![
            "--node-name",
            NODE,
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--driver-root",
            root.to_str().unwrap(),
            "--cdi-root",
            CDI_DIR,
            "--state-dir",
            state.to_str().unwrap(),
            "--kubelet-registrar-dir",
            reg_dir.to_str().unwrap(),
            "--kubelet-plugins-dir",
            plugins.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let bin = std::env::var_os("GPU_DRA_REAL_PLUGIN").unwrap_or_else(|| BIN.into());
        let child = common::program_command(bin, &args, &log)
            .env("RUST_LOG", "info")
            .spawn()
            .unwrap();
        let mut plugin = Self {
            child,
            log,
            reg_dir,
        };
        common::wait_serving(&mut plugin.child, &plugin.log, Duration::from_secs(60));
        plugin
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for RealPlugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        save(
            self.log.file_name().unwrap().to_str().unwrap(),
            &self.stderr(),
        );
    }
}

/// The devices of the node's complete pool, by name.
async fn published(api: &ApiServer) -> Vec<Value> {
    let slices = api
        .store()
        .wait_for(Resource::ResourceSlices, Duration::from_secs(60), |s| {
            let pool = common::pool_of(s, NODE);
            !pool.is_empty() && common::complete_pool(&pool).is_some()
        })
        .await
        .unwrap_or_else(|last| panic!("no complete pool: {last:?}"));
    let pool = common::pool_of(&slices, NODE);
    pool.iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn attribute<'a>(device: &'a Value, name: &str) -> &'a Value {
    let a = &device["attributes"][name];
    a.get("string")
        .or_else(|| a.get("version"))
        .or_else(|| a.get("int"))
        .or_else(|| a.get("bool"))
        .unwrap_or(&Value::Null)
}

#[tokio::test]
#[ignore = "needs a real NVIDIA GPU and driver: hack/real-gpu/run.sh"]
async fn the_pool_publishes_what_nvidia_smi_reports() {
    let gpus = smi_gpus();
    assert!(!gpus.is_empty(), "nvidia-smi lists no GPU");
    let dir = short_dir();
    let api = ApiServer::start(ValidationRules::V1_35);
    api.create_node(NODE);
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);

    let plugin = RealPlugin::start("plugin-pool", dir.path(), &kubeconfig, &[]);
    let devices = published(&api).await;
    save(
        "devices.json",
        &serde_json::to_string_pretty(&devices).unwrap(),
    );
    assert_eq!(devices.len(), gpus.len(), "{devices:#?}");
    for gpu in &gpus {
        let name = format!("gpu-{}", gpu.index);
        let d = devices
            .iter()
            .find(|d| d["name"] == name.as_str())
            .unwrap_or_else(|| panic!("{name} not published: {devices:#?}"));
        let checks = [
            ("type", json!("gpu")),
            ("uuid", json!(gpu.uuid)),
            ("index", json!(gpu.index)),
            ("productName", json!(gpu.name)),
            ("driverVersion", json!(semver(&gpu.driver))),
            ("cudaComputeCapability", json!(semver(&gpu.compute_cap))),
            (
                "resource.kubernetes.io/pciBusID",
                json!(short_bus_id(&gpu.bus_id)),
            ),
        ];
        for (attr, want) in checks {
            assert_eq!(attribute(d, attr), &want, "{name} {attr}: {d:#}");
        }
        let memory = bytes(d["capacity"]["memory"]["value"].as_str().unwrap());
        assert_eq!(memory, gpu.memory_mib << 20, "{name} memory: {d:#}");
        // sysfs knows where the GPU sits; a NUMA node of -1 (none) is not
        // published.
        let sysfs = PathBuf::from("/sys/bus/pci/devices").join(short_bus_id(&gpu.bus_id));
        let root = std::fs::canonicalize(&sysfs).unwrap();
        let want_root = root
            .components()
            .find_map(|c| {
                let s = c.as_os_str().to_str()?;
                s.starts_with("pci").then(|| s.to_owned())
            })
            .unwrap();
        assert_eq!(
            attribute(d, "resource.kubernetes.io/pcieRoot"),
            &json!(want_root),
            "{d:#}"
        );
        let numa: i64 = std::fs::read_to_string(sysfs.join("numa_node"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let want_numa = if numa < 0 { Value::Null } else { json!(numa) };
        assert_eq!(
            attribute(d, "resource.kubernetes.io/numaNode"),
            &want_numa,
            "{d:#}"
        );
    }
    drop(plugin);

    // Dynamic MIG publishes every placement of every profile, read from
    // NVML; only where no GPU has MIG on, so that the startup sweep (which
    // only looks at GPUs with MIG on) has nothing to touch.
    if gpus.iter().any(|g| g.mig_current == "Enabled") {
        eprintln!("!!!!!!!! dynamic-MIG pass skipped: MIG is on on a GPU: {gpus:?}");
        return;
    }
    let dir = short_dir();
    let plugin = RealPlugin::start(
        "plugin-dynamic-mig",
        dir.path(),
        &kubeconfig,
        &["--dynamic-mig"],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let devices = loop {
        let devices = published(&api).await;
        if devices.len() > gpus.len() || Instant::now() > deadline {
            break devices;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    save(
        "devices-dynamic-mig.json",
        &serde_json::to_string_pretty(&devices).unwrap(),
    );
    let mig: Vec<&Value> = devices
        .iter()
        .filter(|d| attribute(d, "type") == "mig")
        .collect();
    let profiles: BTreeSet<&str> = mig
        .iter()
        .map(|d| attribute(d, "profile").as_str().unwrap())
        .collect();
    eprintln!(
        "dynamic MIG: {} placements of profiles {profiles:?}",
        mig.len()
    );
    // MIG-capable GPUs say Disabled here; the others [N/A].
    let mig_capable = gpus.iter().any(|g| g.mig_current == "Disabled");
    if mig_capable {
        assert!(
            !mig.is_empty(),
            "no MIG placement published: {}",
            plugin.stderr()
        );
    }
    for d in &mig {
        let parent = attribute(d, "parentUUID").as_str().unwrap();
        let gpu = gpus.iter().find(|g| g.uuid == parent).unwrap();
        let memory = bytes(d["capacity"]["memory"]["value"].as_str().unwrap());
        assert!(memory > 0 && memory < gpu.memory_mib << 20, "{d:#}");
    }
}

/// The libraries `program` loads (from `ldd`) outside the driver root: the
/// driver's own must come from the CDI spec, not the image.
fn libraries(program: &Path, driver_root: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(program).output().unwrap();
    assert!(out.status.success(), "ldd {}: {out:?}", program.display());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .filter(|p| driver_root == Path::new("/") || !p.starts_with(driver_root))
        .filter(|p| !p.to_string_lossy().contains("nvidia") && !p.ends_with("libcuda.so.1"))
        .collect()
}

/// Imports [`IMAGE`]: busybox, `cuda_check` at `/cuda-check`, and the C
/// libraries of it and of `nvidia-smi`.
fn import_image(podman: &Podman, cuda_check: &Path, smi: &Path) {
    let work = tempfile::tempdir().unwrap();
    let rootfs = work.path().join("rootfs");
    gpu_dra_e2e::podman::image::build_rootfs(&podman.tools().busybox, &rootfs).unwrap();
    let root = driver_root();
    let mut libs: BTreeSet<PathBuf> = libraries(cuda_check, &root).into_iter().collect();
    libs.extend(libraries(smi, &root));
    for lib in &libs {
        let dest = rootfs.join(lib.strip_prefix("/").unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(lib, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", lib.display()));
    }
    std::fs::copy(cuda_check, rootfs.join("cuda-check")).unwrap();
    let tarball = work.path().join("rootfs.tar");
    let ok = Command::new(&podman.tools().tar)
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(&rootfs)
        .arg("-cf")
        .arg(&tarball)
        .arg(".")
        .status()
        .unwrap();
    assert!(ok.success(), "tar");
    let out = podman
        .command()
        .unwrap()
        .args(["import", "--quiet"])
        .arg(&tarball)
        .arg(IMAGE)
        .output()
        .unwrap();
    assert!(out.status.success(), "podman import: {out:?}");
}

/// Runs `script` with `sh -c` in a container of [`IMAGE`] with `devices`.
fn run(podman: &Podman, devices: &[String], script: &str) -> (bool, String) {
    let mut cmd = podman.command().unwrap();
    cmd.args(["run", "--rm", "--pull=never", "--network=none"]);
    for id in devices {
        cmd.arg(format!("--device={id}"));
    }
    let out = cmd
        .args([IMAGE, "sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// What the container shows: its device nodes and env, `nvidia-smi -L`, and
/// the CUDA check's line.
const CONTAINER_SCRIPT: &str = "echo '== nodes'; ls -l /dev/nvidia* 2>&1; \
    echo '== env'; env | sort; \
    echo '== nvidia-smi'; nvidia-smi -L 2>&1; \
    echo '== cuda'; /cuda-check 2>&1";

#[tokio::test]
#[ignore = "needs a real NVIDIA GPU and driver: hack/real-gpu/run.sh"]
async fn a_container_runs_cuda_on_the_gpu_the_plugin_prepared() {
    let gpus = smi_gpus();
    let gpu = &gpus[0];
    let dir = short_dir();
    let api = ApiServer::start(ValidationRules::V1_35);
    api.create_node(NODE);
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let plugin = RealPlugin::start("plugin-prepare", dir.path(), &kubeconfig, &[]);
    let kubelet = KubeletSim::new()
        .register(&plugin.reg_dir.join(format!("{DRIVER}-reg.sock")))
        .await
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let device = format!("gpu-{}", gpu.index);
    let claim = allocated_claim(&client, "whole", json!([result("gpu", &device)]), json!([])).await;

    let started = Instant::now();
    let answers = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    let first = started.elapsed();
    let answer = &answers[&claim.uid];
    assert!(answer.error.is_none(), "{answer:?}\n{}", plugin.stderr());
    let ids: Vec<String> = answer
        .devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.clone())
        .collect();
    let spec_path = format!("{CDI_DIR}/k8s.{DRIVER}-claim_{}.json", claim.uid);
    let _spec = CdiSpecFile::adopt(&spec_path);
    let spec_text = std::fs::read_to_string(&spec_path).unwrap();
    save("cdi-spec.json", &spec_text);
    eprintln!("first prepare: {first:?}; CDI ids {ids:?}");

    // Everything the spec names exists on the host, as what it says it is.
    let spec: Value = serde_json::from_str(&spec_text).unwrap();
    let mut edits: Vec<&Value> = vec![&spec["containerEdits"]];
    edits.extend(
        spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| &d["containerEdits"]),
    );
    for e in &edits {
        for node in e["deviceNodes"].as_array().into_iter().flatten() {
            let path = node["hostPath"]
                .as_str()
                .or_else(|| node["path"].as_str())
                .unwrap();
            let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{path}: {e}"));
            assert!(
                std::os::unix::fs::FileTypeExt::is_char_device(&meta.file_type()),
                "{path} is not a character device"
            );
        }
        for mount in e["mounts"].as_array().into_iter().flatten() {
            let path = mount["hostPath"].as_str().unwrap();
            assert!(Path::new(path).exists(), "{path} does not exist");
        }
    }

    // The claim's status names the GPU.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = claims.get("whole").await.unwrap();
        let status = serde_json::to_value(c.status).unwrap();
        if status["devices"][0]["data"]["uuid"] == gpu.uuid.as_str() {
            break;
        }
        assert!(Instant::now() < deadline, "status.devices: {status:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    match (
        Podman::detect_or_skip("a_container_runs_cuda_on_the_gpu_the_plugin_prepared").unwrap(),
        std::env::var_os("GPU_DRA_REAL_CUDA_CHECK"),
    ) {
        (Some(podman), Some(cuda_check)) => {
            let smi = which("nvidia-smi");
            import_image(&podman, Path::new(&cuda_check), &smi);
            let (ok, text) = run(&podman, &ids, CONTAINER_SCRIPT);
            save("container.txt", &text);
            eprintln!("{text}");
            assert!(ok, "the container failed: {text}");
            assert!(
                text.contains(&format!("(UUID: {})", gpu.uuid)),
                "nvidia-smi -L in the container does not list {}",
                gpu.uuid
            );
            assert!(
                text.contains(&format!("cuda-check ok: 1 device(s), uuid {}", gpu.uuid)),
                "the CUDA check did not run on {}",
                gpu.uuid
            );
            // The same container without the CDI ids sees no GPU.
            let (ok, text) = run(&podman, &[], "/cuda-check");
            save("container-without-cdi.txt", &text);
            assert!(!ok, "a container without the CDI ids ran CUDA: {text}");
        }
        (_, None) => eprintln!(
            "!!!!!!!! container part skipped: GPU_DRA_REAL_CUDA_CHECK is not set (hack/real-gpu/run.sh builds it)"
        ),
        (None, _) => {}
    }

    // Prepare latency on the real GPU: 100 cycles of prepare and unprepare.
    let mut times = Vec::new();
    for _ in 0..100 {
        let gone = kubelet
            .unprepare(std::slice::from_ref(&claim))
            .await
            .unwrap();
        assert!(gone.values().all(|r| r.error.is_none()), "{gone:?}");
        let started = Instant::now();
        let again = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
        times.push(started.elapsed());
        assert!(again[&claim.uid].error.is_none(), "{again:?}");
    }
    times.sort();
    let summary = format!(
        "whole-GPU prepare on the real GPU, 100 cycles: p50 {:?}, p99 {:?}, max {:?}\n",
        times[49], times[98], times[99]
    );
    eprint!("{summary}");
    save("prepare-latency.txt", &summary);

    let gone = kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(gone.values().all(|r| r.error.is_none()), "{gone:?}");
    assert!(!Path::new(&spec_path).exists(), "{spec_path} left behind");
}

fn which(program: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} not on PATH"))
}
