//! Shared helpers of the integration tests: a private copy of the project's
//! fake `libnvidia-ml.so` (built by cargo as a dev-dependency) configured by a
//! `mock-nvml.env` sidecar, so every test loads its own library instance with
//! its own machine profile and state file, independent of the other tests.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpu_nvml::{ComputeMode, GpuBackend, MigPlacement, NvmlBackend};

/// How long a test waits for a command to take effect.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Calls `get` until `accept` holds and returns that value; panics with
/// the last value after [`PATIENCE`].
pub fn until<T: std::fmt::Debug>(
    what: &str,
    mut get: impl FnMut() -> T,
    accept: impl Fn(&T) -> bool,
) -> T {
    let start = Instant::now();
    loop {
        let got = get();
        if accept(&got) {
            return got;
        }
        assert!(start.elapsed() < PATIENCE, "{what}: never; last {got:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A private copy of the fake library configured for one machine.
pub struct Machine {
    /// Holds the library copy, its sidecar, the profile and the state file.
    pub dir: tempfile::TempDir,
    /// The library copy to open.
    pub library: PathBuf,
    /// The state file (MIG devices and modes are saved there after every change).
    pub state: PathBuf,
}

impl Machine {
    /// A machine running one of the profiles shipped in hack/mock-nvml/profiles.
    pub fn shipped(name: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = dir.path().join("state.json");
        let profile = nvidia_ml::fixture::bundled_profile(name);
        let library = nvidia_ml::fixture::install(dir.path(), &profile, Some(&state))
            .unwrap_or_else(|e| panic!("install the fake NVML: {e}"));
        Self {
            dir,
            library,
            state,
        }
    }

    /// A machine running a profile given as YAML text.
    pub fn from_yaml(yaml: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = dir.path().join("state.json");
        let library = nvidia_ml::fixture::install_yaml(dir.path(), yaml, Some(&state))
            .unwrap_or_else(|e| panic!("install the fake NVML: {e}"));
        Self {
            dir,
            library,
            state,
        }
    }

    /// A second library copy over the same state file but another profile
    /// text (e.g. the same machine without an injected failure).
    pub fn sibling(&self, yaml: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let library = nvidia_ml::fixture::install_yaml(dir.path(), yaml, Some(&self.state))
            .unwrap_or_else(|e| panic!("install the fake NVML: {e}"));
        Self {
            dir,
            library,
            state: self.state.clone(),
        }
    }

    /// Opens the production backend on this machine.
    pub fn open(&self) -> NvmlBackend {
        NvmlBackend::open(Some(&self.library)).unwrap_or_else(|e| panic!("open the fake NVML: {e}"))
    }

    /// The GPU instances the state file records for GPU `index`, as
    /// (id, profile id, start, size).
    pub fn gpu_instances(&self, index: usize) -> Vec<(u64, u64, u64, u64)> {
        let text = match std::fs::read_to_string(&self.state) {
            Ok(text) => text,
            // Nothing changed yet: the profile's instances (none, in these tests).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => panic!("read state file: {e}"),
        };
        let state: serde_json::Value = serde_json::from_str(&text).expect("state file is JSON");
        state["gpus"][index]["gpuInstances"]
            .as_array()
            .expect("gpuInstances array")
            .iter()
            .map(|gi| {
                let n = |k: &str| gi[k].as_u64().unwrap_or_else(|| panic!("{k} in {gi}"));
                (n("id"), n("profileId"), n("start"), n("size"))
            })
            .collect()
    }
}

/// A shipped profile's path.
pub fn profile(name: &str) -> PathBuf {
    nvidia_ml::fixture::bundled_profile(name)
}

/// Reads a shipped profile's text.
pub fn profile_text(name: &str) -> String {
    std::fs::read_to_string(profile(name)).expect("profile readable")
}

/// Lays out a sysfs tree for a profile file under `root`.
pub fn write_sysfs(profile: &Path, root: &Path) {
    nvidia_ml::Profile::load(profile)
        .and_then(|p| nvidia_ml::sysfs::write(&p, root))
        .unwrap_or_else(|e| panic!("write sysfs: {e}"));
}

/// Asserts that every NVLink of `gpu` ends at an NVSwitch: NVML's switch
/// sentinel bus id is no peer.
pub fn assert_links_end_at_switches(gpu: &gpu_nvml::GpuInfo) {
    assert!(
        gpu.nvlinks.iter().all(|l| {
            l.remote == gpu_nvml::NvLinkRemote::Switch && l.remote_pci_bus_id.is_none()
        }),
        "GPU {}: {:?}",
        gpu.index,
        gpu.nvlinks
    );
}

/// A private copy of the fake library whose faults a control file
/// (`MOCK_NVML_CONTROL`) drives.
pub struct Controlled {
    _dir: tempfile::TempDir,
    /// The library copy to open.
    pub library: PathBuf,
    /// The control file.
    pub control: PathBuf,
}

impl Controlled {
    /// A machine whose control is a regular file holding `initial`.
    pub fn new(yaml: &str, initial: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let control = dir.path().join("control");
        std::fs::write(&control, initial).expect("write control file");
        Self::with_control(dir, yaml, control)
    }

    /// A machine of profile `yaml` whose control file is `control` (a
    /// FIFO, say), laid out in `dir`.
    pub fn with_control(dir: tempfile::TempDir, yaml: &str, control: PathBuf) -> Self {
        let options = nvidia_ml::fixture::InstallOptions {
            control: Some(control.clone()),
            ..Default::default()
        };
        let library =
            nvidia_ml::fixture::install_yaml_with(&dir.path().join("lib"), yaml, &options)
                .unwrap_or_else(|e| panic!("install the fake NVML: {e}"));
        Self {
            _dir: dir,
            library,
            control,
        }
    }

    /// `NvmlBackend` on the library copy.
    pub fn open(&self) -> NvmlBackend {
        NvmlBackend::open(Some(&self.library)).unwrap_or_else(|e| panic!("open the fake NVML: {e}"))
    }

    /// Appends lines to the control file.
    pub fn send(&self, text: &[u8]) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.control)
            .expect("open control file");
        f.write_all(text).expect("write control file");
    }

    /// Appends one command line to the control file.
    pub fn command(&self, line: &str) {
        self.send(format!("{line}\n").as_bytes());
    }
}

/// A backend with only the methods the trait requires, each forwarded to
/// the production backend: it exercises the trait's defaults.
pub struct Minimal(pub NvmlBackend);

impl GpuBackend for Minimal {
    fn system(&self) -> gpu_nvml::Result<gpu_nvml::SystemInfo> {
        self.0.system()
    }
    fn gpu_count(&self) -> gpu_nvml::Result<u32> {
        self.0.gpu_count()
    }
    fn gpu(&self, index: u32) -> gpu_nvml::Result<gpu_nvml::GpuInfo> {
        self.0.gpu(index)
    }
    fn set_mig_mode(&self, index: u32, enabled: bool) -> gpu_nvml::Result<()> {
        self.0.set_mig_mode(index, enabled)
    }
    fn create_mig_device(
        &self,
        index: u32,
        profile_id: u32,
        placement: MigPlacement,
    ) -> gpu_nvml::Result<gpu_nvml::MigDevice> {
        self.0.create_mig_device(index, profile_id, placement)
    }
    fn destroy_mig_device(&self, index: u32, gi: u32, ci: u32) -> gpu_nvml::Result<()> {
        self.0.destroy_mig_device(index, gi, ci)
    }
    fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> gpu_nvml::Result<()> {
        self.0.set_compute_mode(index, mode)
    }
}
