//! A real container runtime consumes the claim CDI specs: the specs built by
//! `prepare::cdi` from a fake driver root (real files) and stand-in device
//! nodes (char devices with /dev/null's numbers, so the runtime accepts
//! them) are written to `/var/run/cdi`, and podman (Debian's 4.3, with runc)
//! starts busybox with the claim's CDI ids. The container's own view (env,
//! device nodes, mounted files, hooks run) is checked against the spec.
//!
//! Skipped with a loud message where podman cannot run (see
//! `gpu_dra_e2e::podman`); CI installs it and sets
//! `GPU_DRA_E2E_REQUIRE_PODMAN=1`, which turns a skip into a failure.

use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use fake_driver_root::{FakeDriverRoot, NodeKind, Options, create_dev_root, create_proc_root};
use gpu_dra_e2e::podman::{CDI_DIR, CdiSpecFile, Output, Podman};
use gpu_kubelet_plugin::prepare::cdi::driver_root::discover;
use gpu_kubelet_plugin::prepare::cdi::{
    BuiltClaimSpec, ClaimSpec, DriverFiles, HostRoot, NodeLocator, Spec, SpecDir, claim_edits,
};

const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";
const GPU0: &str = "GPU-5a1e4c3b-0f5e-4a7d-9c55-1c2b3d4e5f60";

/// A claim UID unique to this process and call, shaped like a Kubernetes UID.
fn claim_uid() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed) & 0xffff,
        nanos & 0xfff,
        (nanos >> 12) & 0xfff,
        u64::from(nanos) << 8
    )
}

/// The fake driver, dev and proc roots of one test.
struct Roots {
    _tmp: tempfile::TempDir,
    driver: FakeDriverRoot,
    dev: PathBuf,
    proc: PathBuf,
}

impl Roots {
    /// A driver root (with `nvidia-cdi-hook` when `hook`), a dev root with
    /// char-device stand-ins for the GPUs `minors` and the control nodes,
    /// and a proc root.
    fn new(minors: &[u32], hook: bool) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let driver = FakeDriverRoot::create_with(
            &tmp.path().join("driver"),
            Options {
                gpus: vec![GPU0.into()],
                cdi_hook: hook,
                ..Options::default()
            },
        )
        .unwrap();
        let dev = create_dev_root(&tmp.path().join("devroot"), minors).unwrap();
        assert!(
            matches!(dev.kind, NodeKind::CharDevice { .. }),
            "a container runtime needs char devices: {:?}",
            dev.kind
        );
        let proc = create_proc_root(&tmp.path().join("proc")).unwrap();
        Self {
            dev: dev.path,
            _tmp: tmp,
            driver,
            proc,
        }
    }

    /// More stand-in char devices (1:3, as /dev/null) under the dev root.
    fn nodes(&self, paths: &[&str]) {
        for path in paths {
            let node = self.dev.join(path.trim_start_matches('/'));
            let out = Command::new("mknod")
                .arg(&node)
                .args(["c", "1", "3"])
                .output()
                .unwrap();
            assert!(out.status.success(), "mknod {}: {out:?}", node.display());
        }
    }

    /// A MIG capability `access` file under the proc root, as the kernel
    /// module writes it when the instance is created.
    fn capability(&self, rel: &str, minor: u32) {
        let path = self.proc.join("driver/nvidia/capabilities").join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(
            path,
            format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\n"),
        )
        .unwrap();
    }

    fn files(&self) -> DriverFiles {
        discover(&HostRoot::same(self.driver.path())).unwrap()
    }

    fn locator(&self) -> NodeLocator {
        NodeLocator::new(HostRoot::same(&self.dev), &self.proc)
    }
}

/// Writes the spec where podman reads it; removed when the guard drops.
fn install(uid: &str, built: &BuiltClaimSpec) -> CdiSpecFile {
    fs::create_dir_all(CDI_DIR).unwrap();
    let path = SpecDir::nvidia(CDI_DIR).write(uid, &built.spec).unwrap();
    CdiSpecFile::adopt(path)
}

fn ids(built: &BuiltClaimSpec) -> Vec<&str> {
    built.device_ids.iter().map(|(_, id)| id.as_str()).collect()
}

/// Every device node path of the spec (claim-level and per device).
fn node_paths(spec: &Spec) -> Vec<&str> {
    spec.container_edits
        .device_nodes
        .iter()
        .chain(
            spec.devices
                .iter()
                .flat_map(|d| &d.container_edits.device_nodes),
        )
        .map(|n| n.path.as_str())
        .collect()
}

/// A shell script printing what the container sees: its env, each node's
/// type and numbers, whether each `absent` path is absent, and each mounted
/// file's size, its first line if it is text, and whether it is writable.
fn probe_script(spec: &Spec, absent: &[&str]) -> String {
    let mut s = String::from("echo '== env'; env | sort\n");
    for path in node_paths(spec) {
        let _ = writeln!(
            s,
            "stat -c '== node %n %F %t:%T' '{path}' || echo '== node {path} MISSING'"
        );
    }
    for path in absent {
        let _ = writeln!(
            s,
            "if [ -e '{path}' ]; then echo '== present {path}'; else echo '== absent {path}'; fi"
        );
    }
    for m in &spec.container_edits.mounts {
        let path = &m.container_path;
        // A program (the fake MPS control is compiled) is checked by size.
        let first_line = if is_text(&m.host_path) {
            format!("; head -n 1 '{path}'")
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "echo \"== file {path} $(wc -c < '{path}') bytes\"{first_line}"
        );
        let _ = writeln!(
            s,
            "if echo x >> '{path}' 2>/dev/null; then echo '== writable {path}'; fi"
        );
    }
    s
}

/// Whether a mounted host file is text (its first line is compared).
fn is_text(path: &str) -> bool {
    fs::read(path).is_ok_and(|b| std::str::from_utf8(&b).is_ok())
}

/// The output `probe_script` must print for `spec`, from the host's view:
/// nodes are char devices 1:3, files have their host size and first line.
fn expected_probe(spec: &Spec, absent: &[&str]) -> String {
    let mut s = String::new();
    for path in node_paths(spec) {
        let _ = writeln!(s, "== node {path} character special file 1:3");
    }
    for path in absent {
        let _ = writeln!(s, "== absent {path}");
    }
    for m in &spec.container_edits.mounts {
        let host = fs::read(&m.host_path).unwrap();
        let _ = writeln!(s, "== file {} {} bytes", m.container_path, host.len());
        if let Ok(text) = std::str::from_utf8(&host) {
            let _ = writeln!(s, "{}", text.lines().next().unwrap_or_default());
        }
    }
    s
}

/// The probe's line for the driver root's libcuda mounted at `name` in
/// the library directory: its size and first line.
fn libcuda_probe_line(roots: &Roots, files: &DriverFiles, name: &str) -> String {
    let version = files.version.as_deref().unwrap();
    let libcuda =
        fs::read_to_string(roots.driver.lib_dir().join(format!("libcuda.so.{version}"))).unwrap();
    format!(
        "== file /{LIB_DIR}/{name} {} bytes\n{}\n",
        libcuda.len(),
        libcuda.lines().next().unwrap()
    )
}

/// Runs the probe with `ids`; returns (env lines, everything after the env).
fn probe(
    podman: &Podman,
    ids: &[&str],
    spec: &Spec,
    absent: &[&str],
    extra: &str,
) -> (Vec<String>, String) {
    let script = format!("{}{extra}", probe_script(spec, absent));
    let out: Output = podman.run(ids, &["sh", "-c", &script]).unwrap();
    eprintln!("podman run with {} CDI id(s): {:?}", ids.len(), out.elapsed);
    let out = out.into_success().unwrap();
    let rest = out
        .stdout
        .strip_prefix("== env\n")
        .unwrap_or_else(|| panic!("{out:?}"));
    let split = rest.find("== node").unwrap_or(rest.len());
    let env = rest[..split].lines().map(str::to_owned).collect();
    (env, rest[split..].to_owned())
}

#[test]
fn whole_gpu_claim_spec_is_applied_by_podman() {
    let Some(podman) = Podman::detect_or_skip("whole_gpu_claim_spec_is_applied_by_podman").unwrap()
    else {
        return;
    };
    let roots = Roots::new(&[0, 1], true);
    let files = roots.files();
    let loc = roots.locator();
    let uid = claim_uid();
    let mut claim = ClaimSpec::new(&uid).unwrap();
    claim.add_gpu("gpu-0", &loc.gpu(0).unwrap()).unwrap();
    let built = claim
        .build(claim_edits(&files, &loc.control().unwrap()))
        .unwrap();
    let spec = &built.spec;
    let _guard = install(&uid, &built);

    // The spec carries what the container must get (guards the checks below
    // against a spec that lost them).
    let nodes = node_paths(spec);
    for node in [
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ] {
        assert!(nodes.contains(&node), "{node} not in {nodes:?}");
    }
    assert!(
        spec.container_edits
            .env
            .contains(&"NVIDIA_VISIBLE_DEVICES=void".to_owned())
    );
    assert!(!spec.container_edits.hooks.is_empty());

    let (env, rest) = probe(
        &podman,
        &ids(&built),
        spec,
        &["/dev/nvidia1", "/dev/nvidia-caps"],
        "echo '== smi'; nvidia-smi\n",
    );
    for var in &spec.container_edits.env {
        assert!(
            env.contains(var),
            "{var} not in the container's env: {env:?}"
        );
    }
    assert!(
        env.contains(&"NVIDIA_VISIBLE_DEVICES=void".to_owned()),
        "{env:?}"
    );
    let (mounted, smi) = rest.split_once("== smi\n").unwrap();
    assert_eq!(
        mounted,
        expected_probe(spec, &["/dev/nvidia1", "/dev/nvidia-caps"])
    );
    // The driver's programs run from their mounts.
    let version = files.version.as_deref().unwrap();
    assert!(smi.contains(&format!("Driver Version: {version}")), "{smi}");
    let line = libcuda_probe_line(&roots, &files, "libcuda.so.1");
    assert!(mounted.contains(&line), "{line} in {mounted}");

    // The runtime ran the spec's createContainer hooks (on the host) with
    // their arguments, in order.
    let hook_args: Vec<Vec<String>> = roots
        .driver
        .calls_of("nvidia-cdi-hook")
        .unwrap()
        .into_iter()
        .map(|c| c.args)
        .collect();
    assert_eq!(
        hook_args,
        [
            vec![
                "create-symlinks".to_owned(),
                "--link".into(),
                format!("libcuda.so.1::/{LIB_DIR}/libcuda.so"),
            ],
            vec![
                "update-ldcache".into(),
                "--folder".into(),
                format!("/{LIB_DIR}")
            ],
        ]
    );
}

#[test]
fn mig_claim_spec_gives_the_capability_nodes() {
    let Some(podman) = Podman::detect_or_skip("mig_claim_spec_gives_the_capability_nodes").unwrap()
    else {
        return;
    };
    let roots = Roots::new(&[0], false);
    roots.nodes(&[
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
        "/dev/nvidia-caps/nvidia-cap30",
    ]);
    roots.capability("gpu0/mig/gi2/access", 21);
    roots.capability("gpu0/mig/gi2/ci0/access", 22);
    let files = roots.files();
    let loc = roots.locator();
    let mig = loc.mig(0, 2, 0).unwrap();
    assert_eq!((mig.gi_cap_minor, mig.ci_cap_minor), (21, 22));
    let uid = claim_uid();
    let mut claim = ClaimSpec::new(&uid).unwrap();
    claim.add_mig("gpu-0-mig-2-0", &mig).unwrap();
    let built = claim
        .build(claim_edits(&files, &loc.control().unwrap()))
        .unwrap();
    let spec = &built.spec;
    assert!(
        spec.container_edits.hooks.is_empty(),
        "no nvidia-cdi-hook in this root"
    );
    let _guard = install(&uid, &built);

    let absent = ["/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia1"];
    let (env, rest) = probe(&podman, &ids(&built), spec, &absent, "");
    assert!(
        env.contains(&"NVIDIA_VISIBLE_DEVICES=void".to_owned()),
        "{env:?}"
    );
    assert_eq!(rest, expected_probe(spec, &absent));
    // No hook made the unversioned link: libcuda.so is libcuda's file.
    let line = libcuda_probe_line(&roots, &files, "libcuda.so");
    assert!(rest.contains(&line), "{line} in {rest}");
    for node in [
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    ] {
        assert!(
            rest.contains(&format!("== node {node} character special file 1:3\n")),
            "{node}: {rest}"
        );
    }
}

#[test]
fn podman_resolves_claim_ids_only_while_their_spec_exists() {
    let Some(podman) =
        Podman::detect_or_skip("podman_resolves_claim_ids_only_while_their_spec_exists").unwrap()
    else {
        return;
    };
    let roots = Roots::new(&[0], false);
    let files = roots.files();
    let loc = roots.locator();
    let uid = claim_uid();
    let mut claim = ClaimSpec::new(&uid).unwrap();
    claim.add_gpu("gpu-0", &loc.gpu(0).unwrap()).unwrap();
    let built = claim
        .build(claim_edits(&files, &loc.control().unwrap()))
        .unwrap();
    let id = ids(&built)[0].to_owned();
    let guard = install(&uid, &built);

    let out = podman.run(&[&id], &["true"]).unwrap();
    eprintln!("podman run, spec present: {:?}", out.elapsed);
    out.into_success().unwrap();

    // A device the spec does not have.
    let missing = format!("k8s.gpu.nvidia.com/claim={uid}-gpu-9");
    let out = podman.run(&[&missing], &["true"]).unwrap();
    assert!(!out.success(), "{out:?}");
    assert!(out.stderr.contains(&missing), "{out:?}");

    // The same id once the spec file is gone (as after unprepare).
    let path = guard.path().to_path_buf();
    drop(guard);
    assert!(!path.exists());
    let out = podman.run(&[&id], &["true"]).unwrap();
    eprintln!("podman run, spec removed: {:?}", out.elapsed);
    assert!(!out.success(), "{out:?}");
    assert!(out.stderr.contains(&id), "{out:?}");
    assert!(out.stderr.contains("unresolvable CDI devices"), "{out:?}");
}
