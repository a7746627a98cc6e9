//! A stand-in sysfs for VFIO passthrough, with a stand-in kernel that acts on
//! the writes the plugin makes, as Linux does, and records each in order.
//!
//! [`FakeSysfs::create`] lays out, per GPU, what the plugin reads and writes
//! under `--sysfs-root`: `devices/pci0000:<bus>/<bus id>/` (reached through
//! the `bus/pci/devices/<bus id>` link) with `vendor`, `device`,
//! `numa_node`, `driver_override` (`(null)`), the `iommu_group` link into
//! `kernel/iommu_groups/<n>` and the `driver` link into
//! `bus/pci/drivers/nvidia`; and the drivers `nvidia` and `vfio-pci`.
//!
//! The files the kernel acts on at once are FIFOs that the kernel's threads
//! ([`FakeSysfs::start_kernel`]) read: `bus/pci/drivers_probe` (binds the
//! device to its `driver_override`, else to `nvidia`, and, for `vfio-pci`,
//! makes its iommufd cdev `vfio-dev/vfio<group>`) and each driver's
//! `unbind` (removes the device's `driver` link). One write is one event, as
//! for the kernel (a write of at most `PIPE_BUF` bytes is atomic). Every
//! event goes to `fake-kernel.log` beside the tree as `unbind <bus>
//! <driver>`, `bind <bus> <driver>` or `refused <bus> <driver>` (a driver
//! made to refuse with [`FakeSysfs::refuse`]); [`FakeSysfs::events`] reads
//! them back. `driver_override` stays a plain file: the kernel only reads
//! it at a probe.
//!
//! The kernel lives as long as the [`Kernel`] handle, in the test process,
//! so it outlives plugin processes that crash and restart.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crate::{Error, io_err};

/// The drivers of the stand-in sysfs.
pub const DRIVERS: &[&str] = &["nvidia", "vfio-pci"];
/// The event log, beside the tree (`<root>/fake-kernel.log`).
pub const KERNEL_LOG: &str = "fake-kernel.log";

/// One GPU of the stand-in sysfs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SysfsGpu {
    /// PCI bus id, `0000:18:00.0`.
    pub bus: String,
    /// PCI vendor id, `0x10de`.
    pub vendor: String,
    /// PCI device id, `0x2330`.
    pub device: String,
    /// IOMMU group number.
    pub iommu_group: u32,
}

/// A stand-in sysfs tree.
#[derive(Clone, Debug)]
pub struct FakeSysfs {
    root: PathBuf,
    gpus: Vec<SysfsGpu>,
}

/// The stand-in kernel: stops (and joins its threads) when dropped.
#[derive(Debug)]
pub struct Kernel {
    stop: Arc<AtomicBool>,
    fifos: Vec<PathBuf>,
    threads: Vec<JoinHandle<()>>,
}

fn mkfifo(path: &Path) -> Result<(), Error> {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .map_err(|e| io_err("mkfifo", path, e.into()))
}

fn write_file(path: &Path, content: &str) -> Result<(), Error> {
    fs::write(path, content).map_err(|e| io_err("write", path, e))
}

fn mkdir(path: &Path) -> Result<(), Error> {
    fs::create_dir_all(path).map_err(|e| io_err("create", path, e))
}

fn link(target: &Path, at: &Path) -> Result<(), Error> {
    symlink(target, at).map_err(|e| io_err("symlink", at, e))
}

impl FakeSysfs {
    /// Adds the passthrough pieces to the tree a machine profile already
    /// wrote under `root` (mock-nvml's `sysfs::write`): every device of
    /// `bus/pci/devices`, in bus id order, gets IOMMU group 10, 11, ...
    pub fn adopt(root: &Path) -> Result<Self, Error> {
        let links = root.join("bus/pci/devices");
        let mut buses: Vec<String> = fs::read_dir(&links)
            .map_err(|e| io_err("list", &links, e))?
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        buses.sort();
        let read = |bus: &str, file: &str| {
            fs::read_to_string(links.join(bus).join(file))
                .map(|t| t.trim().to_owned())
                .unwrap_or_default()
        };
        let gpus: Vec<SysfsGpu> = buses
            .iter()
            .zip(10..)
            .map(|(bus, group)| SysfsGpu {
                bus: bus.clone(),
                vendor: read(bus, "vendor"),
                device: read(bus, "device"),
                iommu_group: group,
            })
            .collect();
        Self::create(root, &gpus)
    }

    /// Lays out the tree under `root` (the `--sysfs-root`), every GPU bound
    /// to `nvidia`. What is there already (a device's directory and link,
    /// its ids) is kept.
    pub fn create(root: &Path, gpus: &[SysfsGpu]) -> Result<Self, Error> {
        let drivers = root.join("bus/pci/drivers");
        for driver in DRIVERS {
            let dir = drivers.join(driver);
            mkdir(&dir)?;
            mkfifo(&dir.join("unbind"))?;
        }
        mkfifo(&root.join("bus/pci/drivers_probe"))?;
        mkdir(&root.join("bus/pci/devices"))?;
        for gpu in gpus {
            let bus = &gpu.bus;
            let at = root.join("bus/pci/devices").join(bus);
            let dir = if at.exists() {
                fs::canonicalize(&at).map_err(|e| io_err("resolve", &at, e))?
            } else {
                let host = format!("pci{}", &bus[..bus.len().min(7)]);
                let dir = root.join("devices").join(host).join(bus);
                mkdir(&dir)?;
                link(&dir, &at)?;
                dir
            };
            for (file, content) in [
                ("vendor", gpu.vendor.as_str()),
                ("device", gpu.device.as_str()),
                ("numa_node", "0"),
            ] {
                if !dir.join(file).exists() {
                    write_file(&dir.join(file), &format!("{content}\n"))?;
                }
            }
            write_file(&dir.join("driver_override"), "(null)\n")?;
            let group = root
                .join("kernel/iommu_groups")
                .join(gpu.iommu_group.to_string());
            mkdir(&group)?;
            link(&group, &dir.join("iommu_group"))?;
            link(&drivers.join("nvidia"), &dir.join("driver"))?;
        }
        write_file(&root.join(KERNEL_LOG), "")?;
        Ok(Self {
            root: root.to_path_buf(),
            gpus: gpus.to_vec(),
        })
    }

    /// The root (`--sysfs-root`).
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// The GPUs, in the order given (or bus id order when adopted).
    pub fn gpus(&self) -> &[SysfsGpu] {
        &self.gpus
    }

    fn device(&self, bus: &str) -> PathBuf {
        self.root.join("bus/pci/devices").join(bus)
    }

    /// The driver the GPU is bound to now.
    pub fn driver_of(&self, bus: &str) -> Option<String> {
        fs::read_link(self.device(bus).join("driver"))
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
    }

    /// The GPU's `driver_override` (`None`: unset or cleared).
    pub fn override_of(&self, bus: &str) -> Option<String> {
        let text = fs::read_to_string(self.device(bus).join("driver_override")).ok()?;
        let text = text.trim();
        (!text.is_empty() && text != "(null)").then(|| text.to_owned())
    }

    /// Binds the GPU to `driver` behind the plugin's back (a crash left it
    /// so, or an admin did).
    pub fn force_driver(&self, bus: &str, driver: Option<&str>) -> Result<(), Error> {
        let at = self.device(bus).join("driver");
        let _ = fs::remove_file(&at);
        if let Some(driver) = driver {
            link(&self.root.join("bus/pci/drivers").join(driver), &at)?;
        }
        Ok(())
    }

    /// Makes probes for `driver` bind nothing (a module that refuses the
    /// device), or bind again (`refuse = false`).
    pub fn refuse(&self, driver: &str, refuse: bool) -> Result<(), Error> {
        let flag = self
            .root
            .join("bus/pci/drivers")
            .join(driver)
            .join("refuse");
        if refuse {
            write_file(&flag, "")
        } else {
            match fs::remove_file(&flag) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io_err("remove", &flag, e)),
            }
        }
    }

    /// Every event of the kernel so far, in order (`bind <bus> <driver>`...).
    pub fn events(&self) -> Result<Vec<String>, Error> {
        let path = self.root.join(KERNEL_LOG);
        let text = fs::read_to_string(&path).map_err(|e| io_err("read", &path, e))?;
        Ok(text.lines().map(str::to_owned).collect())
    }

    /// Starts the kernel's threads: one per FIFO.
    pub fn start_kernel(&self) -> Result<Kernel, Error> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut fifos = vec![self.root.join("bus/pci/drivers_probe")];
        fifos.extend(
            DRIVERS
                .iter()
                .map(|d| self.root.join("bus/pci/drivers").join(d).join("unbind")),
        );
        let mut threads = Vec::new();
        for fifo in &fifos {
            // O_RDWR: the read end never sees EOF between writers.
            let file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(0)
                .open(fifo)
                .map_err(|e| io_err("open", fifo, e))?;
            let me = self.clone();
            let stop = stop.clone();
            let fifo = fifo.clone();
            threads.push(std::thread::spawn(move || me.serve(&fifo, file, &stop)));
        }
        Ok(Kernel {
            stop,
            fifos,
            threads,
        })
    }

    fn serve(&self, fifo: &Path, mut file: fs::File, stop: &AtomicBool) {
        let mut buf = [0u8; 512];
        loop {
            let Ok(n) = file.read(&mut buf) else {
                return;
            };
            if stop.load(Ordering::SeqCst) {
                return;
            }
            for bus in bus_ids(&String::from_utf8_lossy(&buf[..n])) {
                if fifo.ends_with("drivers_probe") {
                    self.probe(&bus);
                } else if let Some(driver) = fifo
                    .parent()
                    .and_then(Path::file_name)
                    .map(|d| d.to_string_lossy().into_owned())
                {
                    self.unbind(&bus, &driver);
                }
            }
        }
    }

    fn log(&self, line: &str) {
        if let Ok(mut f) = fs::OpenOptions::new()
            .append(true)
            .open(self.root.join(KERNEL_LOG))
        {
            let _ = writeln!(f, "{line}");
        }
    }

    fn unbind(&self, bus: &str, driver: &str) {
        if self.driver_of(bus).as_deref() == Some(driver) {
            // Logged first: the writer sees the link change and goes on.
            self.log(&format!("unbind {bus} {driver}"));
            let _ = fs::remove_dir_all(self.device(bus).join("vfio-dev"));
            let _ = fs::remove_file(self.device(bus).join("driver"));
        } else {
            self.log(&format!("unbind-ignored {bus} {driver}"));
        }
    }

    fn probe(&self, bus: &str) {
        let Some(gpu) = self.gpus.iter().find(|g| g.bus == bus) else {
            self.log(&format!("probe-unknown {bus}"));
            return;
        };
        if self.driver_of(bus).is_some() {
            // A bound device is not probed again.
            self.log(&format!("probe-bound {bus}"));
            return;
        }
        let driver = self.override_of(bus).unwrap_or_else(|| "nvidia".to_owned());
        let dir = self.root.join("bus/pci/drivers").join(&driver);
        if !dir.is_dir() || dir.join("refuse").exists() {
            self.log(&format!("refused {bus} {driver}"));
            return;
        }
        if driver == "vfio-pci" {
            let _ = fs::create_dir_all(
                self.device(bus)
                    .join("vfio-dev")
                    .join(format!("vfio{}", gpu.iommu_group)),
            );
        }
        self.log(&format!("bind {bus} {driver}"));
        let _ = symlink(&dir, self.device(bus).join("driver"));
    }
}

/// The bus ids in what one read of a FIFO returned: writes the reader was
/// too slow to take one by one arrive together, with or without line
/// breaks (`dddd:bb:dd.f` is 12 bytes).
fn bus_ids(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for token in text.split_whitespace() {
        if token.len() > 12 && token.len() % 12 == 0 && token.is_ascii() {
            out.extend(
                (0..token.len())
                    .step_by(12)
                    .map(|i| token[i..i + 12].to_owned()),
            );
        } else {
            out.push(token.to_owned());
        }
    }
    out
}

impl Drop for Kernel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for fifo in &self.fifos {
            if let Ok(mut f) = fs::OpenOptions::new().write(true).open(fifo) {
                let _ = f.write_all(b"stop\n");
            }
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Stand-in VFIO nodes under `<dev_root>/dev`: `vfio/vfio`, `vfio/<group>`
/// and `vfio/devices/vfio<group>` per group, and, with `iommufd`,
/// `iommu`. As root, character devices with `/dev/null`'s numbers (what a
/// container runtime insists on for device nodes); else empty files.
pub fn create_vfio_nodes(dev_root: &Path, groups: &[u32], iommufd: bool) -> Result<(), Error> {
    let vfio = dev_root.join("dev/vfio");
    mkdir(&vfio.join("devices"))?;
    let mut paths = vec![vfio.join("vfio")];
    for g in groups {
        paths.push(vfio.join(g.to_string()));
        paths.push(vfio.join("devices").join(format!("vfio{g}")));
    }
    if iommufd {
        paths.push(dev_root.join("dev/iommu"));
    }
    let numbers = if rustix::process::geteuid().is_root() {
        crate::nodes::dev_null_numbers().ok()
    } else {
        None
    };
    for path in paths {
        let _ = fs::remove_file(&path);
        let made =
            numbers.is_some_and(|(major, minor)| crate::nodes::mknod(&path, major, minor).is_ok());
        if !made {
            write_file(&path, "")?;
        }
    }
    Ok(())
}
