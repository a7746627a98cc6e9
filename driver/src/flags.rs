//! The plugin's command line. Every flag can also be set from an environment
//! variable. Each module owns its flag group ([`crate::discovery::Flags`],
//! [`crate::slices::Flags`]), flattened here.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::paths::{absolute_without_dotdot, parse_socket_path};
use std::time::Duration;

pub use gpu_dra_cmdline::LogFormat;

/// All flags of `gpu-kubelet-plugin`.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "gpu-kubelet-plugin", version, about = "GPU DRA kubelet plugin")]
#[group(id = "plugin_flags")]
pub struct Flags {
    /// Name of the node this plugin runs on.
    #[arg(long, env = "NODE_NAME", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub node_name: String,

    /// DRA driver name, as used in ResourceSlices and allocation results.
    #[arg(long, env = "DRIVER_NAME", default_value = "gpu.nvidia.com", value_parser = parse_driver_name)]
    pub driver_name: String,

    /// Directory kubelet watches for plugin registration sockets.
    #[arg(
        long,
        env = "KUBELET_REGISTRAR_DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    pub kubelet_registrar_dir: PathBuf,

    /// Directory under which the plugin's DRA socket lives (`<dir>/<driver>/dra.sock`).
    #[arg(
        long,
        env = "KUBELET_PLUGINS_DIR",
        default_value = "/var/lib/kubelet/plugins"
    )]
    pub kubelet_plugins_dir: PathBuf,

    /// Directory for transient CDI specs.
    #[arg(long, env = "CDI_ROOT", default_value = "/var/run/cdi")]
    pub cdi_root: PathBuf,

    /// Root of the NVIDIA driver installation (libraries and binaries) on
    /// the host: CDI specs mount driver files from here.
    #[arg(long, env = "DRIVER_ROOT", default_value = "/")]
    pub driver_root: PathBuf,

    /// Where the plugin itself sees the driver root, when it runs in a
    /// container with the host's driver root mounted elsewhere (NVIDIA's
    /// `CONTAINER_DRIVER_ROOT`): files are read here, while CDI specs name
    /// host paths under `--driver-root`. Default: `--driver-root`.
    #[arg(long, env = "CONTAINER_DRIVER_ROOT")]
    pub container_driver_root: Option<PathBuf>,

    /// Host path of `nvidia-cdi-hook` (NVIDIA Container Toolkit), which CDI
    /// specs name for their ldcache and symlink hooks (NVIDIA's
    /// `NVIDIA_CDI_HOOK_PATH`), e.g. the GPU Operator's
    /// `/usr/local/nvidia/toolkit/nvidia-cdi-hook`. The runtime runs it on
    /// the host, so the plugin does not look for it. Default:
    /// `<driver-root>/usr/bin/nvidia-cdi-hook` when that exists; without a
    /// hook, libraries are also mounted where the loaders of both image
    /// families look (docs/install.md).
    #[arg(long, env = "NVIDIA_CDI_HOOK_PATH", value_parser = parse_hook_path)]
    pub nvidia_cdi_hook_path: Option<String>,

    /// Root under which device nodes are looked up (`<dev-root>/dev/nvidia0`);
    /// tests and the demo point it at stand-in nodes. CDI specs give each
    /// node its real `/dev/...` path in the container and the path under
    /// the dev root as its host path, so set it only to a directory the
    /// container runtime sees at the same path.
    #[arg(long, env = "DEV_ROOT", default_value = "/")]
    pub dev_root: PathBuf,

    /// The proc filesystem as far as NVIDIA's module shows it: MIG
    /// capabilities are read from `<proc-root>/driver/nvidia/capabilities`,
    /// and the `nvidia-caps` major number from `<proc-root>/devices`.
    #[arg(long, env = "PROC_ROOT", default_value = "/proc")]
    pub proc_root: PathBuf,

    /// The plugin's state: the prepare checkpoint and the MPS daemons'
    /// directories. Default: `<kubelet-plugins-dir>/<driver-name>`.
    #[arg(long, env = "STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// The MPS daemons' directories (`<mps-dir>/<id>/{pipe,log,shm}`),
    /// which MPS containers mount from the same host path. Put it on a
    /// tmpfs (the Helm chart uses the host's `/run`) to keep MPS shared
    /// memory off the disk. One per plugin instance: the plugin locks it
    /// and stops the daemons in it that none of its claims use. Default:
    /// `<state-dir>/mps`.
    #[arg(long, env = "MPS_DIR", value_parser = parse_mps_dir)]
    pub mps_dir: Option<PathBuf>,

    /// Have MPS control daemons started by the MPS daemon host listening
    /// on this socket (`gpu-kubelet-plugin mps-host --socket <path>`, in a
    /// pod of its own), so they live in its container and outlive the
    /// plugin's (an upgrade of the plugin keeps MPS workloads running).
    /// Both must share the PID namespace (hostPID) and see the MPS
    /// directory and the driver root at the same paths. Unset: the plugin
    /// starts daemons itself.
    #[arg(long, env = "MPS_HOST_SOCKET", value_parser = parse_socket_path)]
    pub mps_host_socket: Option<PathBuf>,

    /// How often the MPS control daemons of prepared claims (and of claims
    /// whose checkpoint entries were lost) are checked; one found dead is
    /// started again with its settings. `100ms` to `1h`.
    #[arg(long, env = "MPS_CHECK_INTERVAL", default_value = "10s", value_parser = gpu_dra_cmdline::parse_interval)]
    pub mps_check_interval: Duration,

    /// KEP-5304 device metadata: for every prepared claim, one file per
    /// request under `<kubelet-plugins-dir>/<driver>/dra-device-metadata`
    /// with its devices and their published attributes
    /// (`resource.kubernetes.io/pciBusID`, ...), mounted read-only into the
    /// containers at
    /// `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json`
    /// (`resourceclaimtemplates/<pod-claim-name>/...` for a claim made from
    /// a template). NVIDIA's feature gate `DeviceMetadata` (VFIO devices
    /// only there); here every device. `false`: no files.
    #[arg(
        long,
        env = "DEVICE_METADATA",
        default_value_t = true,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new(),
    )]
    pub device_metadata: bool,

    /// A DaemonSet rolling update with a surge pod (`maxSurge: 1`): when
    /// another plugin instance holds the state directory, wait for it to
    /// exit, then take the node over, instead of failing at once. The
    /// waiting instance has loaded NVML, found the GPUs and built its API
    /// client, and `/readyz` says it is ready; it touches nothing of the
    /// node's until the other one is gone. Off: a held state directory is a
    /// startup error.
    #[arg(
        long,
        env = "ROLLING_UPDATE",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new(),
    )]
    pub rolling_update: bool,

    /// With `--rolling-update`: give each instance socket names of its own
    /// (`<driver>-<tag>-reg.sock`, `dra-<tag>.sock`), so that a new
    /// instance registers with kubelet while the old one still serves and
    /// passes kubelet's calls on to it until it takes over: kubelet never goes
    /// without a plugin. Needs kubelet 1.33 or newer; an older kubelet
    /// loses the driver when the old instance deregisters. `auto`: when the
    /// Node's `status.nodeInfo.kubeletVersion` says 1.33 or newer (else,
    /// or when the Node cannot be read, the shared names).
    #[arg(long, env = "PER_INSTANCE_SOCKETS", value_enum, default_value_t = PerInstanceSockets::Auto)]
    pub per_instance_sockets: PerInstanceSockets,

    /// Not a flag: this instance's socket tag when it uses names of its own
    /// ([`crate::grpc::instance`]), chosen by `main` from
    /// `--per-instance-sockets` before the plugin starts.
    #[arg(skip)]
    pub instance: Option<String>,

    /// Path of a kubeconfig; in-cluster configuration when unset.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Address (host:port) of the Prometheus metrics endpoint (`/metrics`);
    /// no endpoint when unset. Port 0 picks a free port (logged).
    #[arg(long, env = "METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,

    /// Threads of the async runtime: the kubelet gRPC servers, the claim
    /// reads and `status.devices` writes, publishing. NVML calls, file
    /// writes and program starts run on the blocking pool whatever this is.
    /// With 1 (the default) all of that runs on the main thread. More threads
    /// help a node that prepares dozens of claims at once only together with
    /// more glibc malloc arenas (`MALLOC_ARENA_MAX`, 1 in the shipped
    /// images), at about 1 MiB more resident memory: BENCHMARKS.md,
    /// "Claims at once on 16 cores".
    #[arg(long, env = "RUNTIME_THREADS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub runtime_threads: u16,

    /// Log format on stderr. The level comes from RUST_LOG (default info).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Run the plugin as a child of this process, which restarts it when it
    /// dies and reaps what it leaves, so MPS daemons outlive a plugin crash
    /// (for the container's main process; see `supervise`). The plugin gets
    /// every other flag as given.
    #[arg(long)]
    pub supervise: bool,

    /// Not a flag: the program that starts MPS daemons in a private mount
    /// namespace (`/proc/self/exe` where `main` runs
    /// [`crate::prepare::mps::launch::run_if_asked`] first). `None`: daemons
    /// share the plugin's `/dev/shm`.
    #[arg(skip)]
    pub mps_launcher: Option<PathBuf>,

    /// Label the Node with NVIDIA's `nvidia.com/gpu.clique`: the NVLink
    /// fabric clique of its GPUs, `<clusterUUID>.<cliqueId>` (GPU Feature
    /// Discovery's format, from NVML's GPU fabric info; multi-node NVLink
    /// systems such as GB200). The label is removed where the GPUs are in no
    /// clique or in different ones. Needs `patch` on nodes (the chart grants
    /// it with `gpuCliqueLabelEnabled`). Off: the label is left alone.
    #[arg(
        long,
        env = "GPU_CLIQUE_LABEL",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new(),
    )]
    pub gpu_clique_label: bool,

    /// VFIO passthrough (NVIDIA's `PassthroughSupport`): every GPU published
    /// whole is also published as `gpu-vfio-<index>` (`type=vfio`, class
    /// `vfio.gpu.nvidia.com`), which shares a counter with the full GPU so
    /// only one of the two is allocated at a time. A claim for it rebinds
    /// the GPU from `nvidia` to `vfio-pci` under `--sysfs-root` and hands the
    /// container its VFIO nodes; unprepare binds it back. Needs the IOMMU
    /// on, the `vfio-pci` module loaded and the DRAPartitionableDevices
    /// feature gate (docs/passthrough.md).
    #[arg(
        long,
        env = "PASSTHROUGH",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new(),
    )]
    pub passthrough: bool,

    /// GPU discovery's flags.
    #[command(flatten)]
    pub discovery: crate::discovery::Flags,

    /// The slice publisher's flags.
    #[command(flatten)]
    pub slices: crate::slices::Flags,

    /// The GPU health monitor's flags.
    #[command(flatten)]
    pub health: crate::health::flags::Flags,
}

/// `--per-instance-sockets`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PerInstanceSockets {
    /// When the node's kubelet is 1.33 or newer.
    Auto,
    /// Always (with `--rolling-update`).
    Always,
    /// Never: the shared names.
    Never,
}

impl Flags {
    /// `--state-dir`, or its default `<kubelet-plugins-dir>/<driver-name>`.
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| self.kubelet_plugins_dir.join(&self.driver_name))
    }

    /// `--mps-dir`, or its default `<state-dir>/mps`.
    pub fn mps_dir(&self) -> PathBuf {
        self.mps_dir
            .clone()
            .unwrap_or_else(|| self.state_dir().join("mps"))
    }

    /// `--container-driver-root`, or `--driver-root`.
    pub fn container_driver_root(&self) -> PathBuf {
        self.container_driver_root
            .clone()
            .unwrap_or_else(|| self.driver_root.clone())
    }
}

fn parse_driver_name(s: &str) -> Result<String, String> {
    crate::grpc::validate_driver_name(s)
        .map(|()| s.to_owned())
        .map_err(|e| e.to_string())
}

/// An absolute path without `..` that names a file: CDI specs carry it as
/// the hooks' program.
fn parse_hook_path(s: &str) -> Result<String, String> {
    let path = absolute_without_dotdot(s, "the container runtime runs the hook by this host path")?;
    if s.ends_with('/') || path.file_name().is_none() {
        return Err(format!("{s:?} names a directory, not the hook program"));
    }
    Ok(s.to_owned())
}

/// An absolute path without `..`, outside `/dev/shm`: container runtimes
/// mount its directories by the paths the CDI specs name, and each MPS
/// daemon's `/dev/shm` is replaced by its own shm directory.
fn parse_mps_dir(s: &str) -> Result<PathBuf, String> {
    let path = absolute_without_dotdot(s, "CDI specs mount its directories by this path")?;
    if path.starts_with("/dev/shm") {
        return Err(format!(
            "{s:?} is under /dev/shm, which each MPS daemon gets replaced by its own shm directory"
        ));
    }
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// A socket path over `sun_path`'s 107 bytes.
    const LONG_SOCKET: &str = "/dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd/h.sock";

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        Flags::try_parse_from(std::iter::once("gpu-kubelet-plugin").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_match_the_kubelet_layout() {
        let f = parse(&["--node-name", "n1"]).unwrap();
        assert_eq!(f.driver_name, "gpu.nvidia.com");
        assert_eq!(
            f.kubelet_registrar_dir,
            PathBuf::from("/var/lib/kubelet/plugins_registry")
        );
        assert_eq!(
            f.kubelet_plugins_dir,
            PathBuf::from("/var/lib/kubelet/plugins")
        );
        assert_eq!(f.cdi_root, PathBuf::from("/var/run/cdi"));
        assert_eq!(f.driver_root, PathBuf::from("/"));
        assert_eq!(f.log_format, LogFormat::Text);
        assert!(!f.supervise);
        assert_eq!(f.metrics_addr, None);
        assert_eq!(f.dev_root, PathBuf::from("/"));
        assert_eq!(f.proc_root, PathBuf::from("/proc"));
        assert_eq!(f.mps_check_interval, Duration::from_secs(10));
        assert_eq!(
            f.state_dir(),
            PathBuf::from("/var/lib/kubelet/plugins/gpu.nvidia.com")
        );
        assert_eq!(f.container_driver_root(), PathBuf::from("/"));
        assert_eq!(
            f.mps_dir(),
            PathBuf::from("/var/lib/kubelet/plugins/gpu.nvidia.com/mps")
        );
        let f = parse(&[
            "--node-name=n",
            "--driver-root=/run/nvidia/driver",
            "--container-driver-root=/driver-root",
            "--state-dir=/var/lib/gpu-dra",
        ])
        .unwrap();
        assert_eq!(f.container_driver_root(), PathBuf::from("/driver-root"));
        assert_eq!(f.driver_root, PathBuf::from("/run/nvidia/driver"));
        assert_eq!(f.state_dir(), PathBuf::from("/var/lib/gpu-dra"));
        assert_eq!(f.mps_dir(), PathBuf::from("/var/lib/gpu-dra/mps"));
        let f = parse(&["--node-name=n", "--mps-dir=/run/gpu-dra-driver/mps"]).unwrap();
        assert_eq!(f.mps_dir(), PathBuf::from("/run/gpu-dra-driver/mps"));
        assert_eq!(f.nvidia_cdi_hook_path, None);
        assert!(!f.passthrough, "passthrough is off by default");
        assert!(
            parse(&["--node-name=n", "--passthrough"])
                .unwrap()
                .passthrough
        );
        assert!(
            !parse(&["--node-name=n", "--passthrough=false"])
                .unwrap()
                .passthrough
        );
        let bad = parse(&["--node-name=n", "--passthrough=maybe"]).unwrap_err();
        assert!(
            bad.to_string()
                .contains("invalid value 'maybe' for '--passthrough"),
            "{bad}"
        );
        assert_eq!(f.runtime_threads, 1);
        assert!(!f.rolling_update);
        assert!(
            parse(&["--node-name=n", "--rolling-update"])
                .unwrap()
                .rolling_update
        );
        assert!(
            !parse(&["--node-name=n", "--rolling-update=false"])
                .unwrap()
                .rolling_update
        );
        assert_eq!(f.per_instance_sockets, PerInstanceSockets::Auto);
        assert_eq!(f.instance, None);
        for (value, want) in [
            ("auto", PerInstanceSockets::Auto),
            ("always", PerInstanceSockets::Always),
            ("never", PerInstanceSockets::Never),
        ] {
            let f = parse(&["--node-name=n", &format!("--per-instance-sockets={value}")]).unwrap();
            assert_eq!(f.per_instance_sockets, want);
        }
        let f = parse(&["--node-name=n", "--runtime-threads=4"]).unwrap();
        assert_eq!(f.runtime_threads, 4);
        let f = parse(&[
            "--node-name=n",
            "--nvidia-cdi-hook-path=/usr/local/nvidia/toolkit/nvidia-cdi-hook",
        ])
        .unwrap();
        assert_eq!(
            f.nvidia_cdi_hook_path.as_deref(),
            Some("/usr/local/nvidia/toolkit/nvidia-cdi-hook")
        );
        assert_eq!(f.mps_host_socket, None);
        let f = parse(&[
            "--node-name=n",
            "--mps-host-socket=/var/lib/kubelet/plugins/gpu.nvidia.com/mps-host.sock",
        ])
        .unwrap();
        assert_eq!(
            f.mps_host_socket,
            Some(PathBuf::from(
                "/var/lib/kubelet/plugins/gpu.nvidia.com/mps-host.sock"
            ))
        );
    }

    #[test]
    fn bad_flags_give_one_line_errors_naming_the_problem() {
        for (args, needle) in [
            (&["--node-name", "n", "--bogus"][..], "--bogus"),
            (&["--node-name", ""][..], "--node-name"),
            (
                &["--node-name", "n", "--driver-name", "../etc"][..],
                "invalid driver name",
            ),
            (&["--node-name", "n", "--log-format", "xml"][..], "xml"),
            (
                &["--node-name", "n", "--rolling-update", "maybe"][..],
                "--rolling-update",
            ),
            (
                &["--node-name", "n", "--per-instance-sockets", "yes"][..],
                "--per-instance-sockets",
            ),
            (
                &["--node-name", "n", "--runtime-threads", "0"][..],
                "--runtime-threads",
            ),
            (
                &["--node-name", "n", "--runtime-threads", "65"][..],
                "1..=64",
            ),
            (
                &["--node-name", "n", "--runtime-threads", "many"][..],
                "--runtime-threads",
            ),
            (
                &["--node-name", "n", "--metrics-addr", "nowhere"][..],
                "--metrics-addr",
            ),
            (
                &["--node-name", "n", "--mps-dir", "run/mps"][..],
                "\"run/mps\" is not an absolute path",
            ),
            (
                &["--node-name", "n", "--mps-dir", ""][..],
                "not an absolute path",
            ),
            (
                &["--node-name", "n", "--mps-dir", "/run/../dev/shm/mps"][..],
                "contains `..`",
            ),
            (
                &["--node-name", "n", "--mps-dir", "/dev/shm/mps"][..],
                "is under /dev/shm",
            ),
            (
                &["--node-name", "n", "--mps-check-interval", "50ms"][..],
                "out of range (100ms to 1h)",
            ),
            (
                &["--node-name", "n", "--mps-check-interval", "2h"][..],
                "out of range",
            ),
            (
                &["--node-name", "n", "--mps-check-interval", "10"][..],
                "missing unit",
            ),
            (
                &["--node-name", "n", "--mps-check-interval=-1s"][..],
                "expected e.g.",
            ),
            (
                &["--node-name", "n", "--mps-dir", "/dev/./shm"][..],
                "is under /dev/shm",
            ),
            (
                &["--node-name", "n", "--mps-host-socket", "host.sock"][..],
                "\"host.sock\" is not an absolute path",
            ),
            (
                &[
                    "--node-name",
                    "n",
                    "--mps-host-socket",
                    "/run/../tmp/h.sock",
                ][..],
                "contains `..`",
            ),
            (
                &["--node-name", "n", "--mps-host-socket", "/run/gpu/"][..],
                "names a directory",
            ),
            (
                &["--node-name", "n", "--mps-host-socket", LONG_SOCKET][..],
                "bytes",
            ),
            (
                &[
                    "--node-name",
                    "n",
                    "--nvidia-cdi-hook-path",
                    "nvidia-cdi-hook",
                ][..],
                "\"nvidia-cdi-hook\" is not an absolute path",
            ),
            (
                &[
                    "--node-name",
                    "n",
                    "--nvidia-cdi-hook-path",
                    "/usr/../tmp/hook",
                ][..],
                "contains `..`",
            ),
            (
                &["--node-name", "n", "--nvidia-cdi-hook-path", "/usr/bin/"][..],
                "names a directory",
            ),
            (
                &["--node-name", "n", "--nvidia-cdi-hook-path", "/"][..],
                "names a directory",
            ),
        ] {
            let e = parse(args).unwrap_err();
            let line = gpu_dra_cmdline::one_line_error(&e);
            assert!(line.starts_with("error: "), "{line}");
            assert!(!line.contains('\n'), "{line}");
            assert!(line.contains(needle), "{args:?}: {line}");
        }
    }

    #[test]
    fn gpu_clique_label_is_off_unless_asked() {
        assert!(!parse(&["--node-name=n"]).unwrap().gpu_clique_label);
        assert!(
            parse(&["--node-name=n", "--gpu-clique-label"])
                .unwrap()
                .gpu_clique_label
        );
        assert!(
            !parse(&["--node-name=n", "--gpu-clique-label=false"])
                .unwrap()
                .gpu_clique_label
        );
        for bad in ["maybe", "", "1; rm -rf /", "\u{0}"] {
            let err = parse(&["--node-name=n", &format!("--gpu-clique-label={bad}")])
                .unwrap_err()
                .to_string();
            assert!(err.contains("--gpu-clique-label"), "{bad:?}: {err}");
        }
    }
}
