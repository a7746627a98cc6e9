//! What podman needs on this machine, and precisely why it cannot run when
//! something is missing: root (for `/var/run/cdi` and rootful containers),
//! the programs `podman`, `runc`, `conmon` and `tar`, a statically linked
//! busybox (Debian package busybox-static) for the image, and a writable CDI
//! spec directory.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{CDI_DIR, PodmanError};

/// Directories searched after `$PATH` (root's sbin dirs may be missing from
/// a CI's `PATH`).
const FALLBACK_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
    "/usr/libexec/podman",
];
/// Where a busybox binary is looked for.
const BUSYBOX_PATHS: &[&str] = &["/bin/busybox", "/usr/bin/busybox"];
/// ELF program header type of the dynamic loader request.
const PT_INTERP: u32 = 3;

/// The programs the harness runs, as absolute paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tools {
    /// `podman`.
    pub podman: PathBuf,
    /// `runc`, passed to podman as `--runtime`.
    pub runc: PathBuf,
    /// `conmon`, passed to podman as `--conmon`.
    pub conmon: PathBuf,
    /// A statically linked `busybox`, copied into the image.
    pub busybox: PathBuf,
    /// `tar`, which packs the image's rootfs.
    pub tar: PathBuf,
}

impl Tools {
    /// Finds everything, or [`PodmanError::Unavailable`] listing every
    /// missing piece with the Debian package that provides it.
    pub fn find() -> Result<Self, PodmanError> {
        let mut reasons = Vec::new();
        match effective_uid() {
            Ok(0) => {}
            Ok(uid) => reasons.push(format!(
                "not running as root (effective uid {uid}): rootful podman and writing CDI specs to {CDI_DIR} need root"
            )),
            Err(e) => reasons.push(format!("cannot read the effective uid: {e}")),
        }
        let mut program = |name: &str, package: &str| {
            let found = find_program(name);
            if found.is_none() {
                reasons.push(format!(
                    "`{name}` not found on PATH or in {} (Debian package {package})",
                    FALLBACK_DIRS.join(", ")
                ));
            }
            found
        };
        let podman = program("podman", "podman");
        let runc = program("runc", "runc");
        let conmon = program("conmon", "conmon, installed with podman");
        let tar = program("tar", "tar");
        let busybox = match find_static_busybox() {
            Ok(path) => Some(path),
            Err(reason) => {
                reasons.push(reason);
                None
            }
        };
        if reasons.is_empty()
            && let Err(reason) = probe_cdi_dir(Path::new(CDI_DIR))
        {
            reasons.push(reason);
        }
        match (podman, runc, conmon, busybox, tar) {
            (Some(podman), Some(runc), Some(conmon), Some(busybox), Some(tar))
                if reasons.is_empty() =>
            {
                Ok(Self {
                    podman,
                    runc,
                    conmon,
                    busybox,
                    tar,
                })
            }
            _ => Err(PodmanError::Unavailable { reasons }),
        }
    }
}

/// The effective uid, from `/proc/self/status` (no libc).
pub fn effective_uid() -> Result<u32, String> {
    let status = fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("read /proc/self/status: {e}"))?;
    parse_effective_uid(&status)
}

/// The effective uid from the text of `/proc/<pid>/status` (`Uid:` line:
/// real, effective, saved, filesystem).
pub fn parse_effective_uid(status: &str) -> Result<u32, String> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .ok_or("no Uid: line in /proc/self/status")?;
    let field = line
        .split_whitespace()
        .nth(1)
        .ok_or("the Uid: line has no effective uid")?;
    field
        .parse()
        .map_err(|_| format!("effective uid {field:?} is not a number"))
}

/// `name` on `$PATH` or in `FALLBACK_DIRS`: the first executable file.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(FALLBACK_DIRS.iter().map(PathBuf::from))
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The first busybox in [`BUSYBOX_PATHS`] that is statically linked, or why
/// there is none.
fn find_static_busybox() -> Result<PathBuf, String> {
    let mut seen = Vec::new();
    for path in BUSYBOX_PATHS.iter().map(Path::new) {
        if !is_executable(path) {
            continue;
        }
        match fs::read(path) {
            Ok(bytes) => match is_static_elf(&bytes) {
                Ok(true) => return Ok(path.to_path_buf()),
                Ok(false) => seen.push(format!("{} is dynamically linked", path.display())),
                Err(why) => seen.push(format!("{}: {why}", path.display())),
            },
            Err(e) => seen.push(format!("read {}: {e}", path.display())),
        }
    }
    let found = if seen.is_empty() {
        format!("none in {}", BUSYBOX_PATHS.join(", "))
    } else {
        seen.join(", ")
    };
    Err(format!(
        "no statically linked busybox for the container image ({found}; Debian package busybox-static)"
    ))
}

/// Whether a 64-bit little-endian ELF file has no `PT_INTERP` program
/// header (no dynamic loader: runs in an empty rootfs).
pub fn is_static_elf(bytes: &[u8]) -> Result<bool, String> {
    if bytes.get(..4) != Some(b"\x7fELF") {
        return Err("not an ELF file".into());
    }
    if bytes.get(4) != Some(&2) || bytes.get(5) != Some(&1) {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let u16_at = |off: usize| {
        bytes
            .get(off..off + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let truncated = || "truncated ELF header".to_owned();
    let phoff = bytes
        .get(0x20..0x28)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
        .ok_or_else(truncated)?;
    let phentsize = usize::from(u16_at(0x36).ok_or_else(truncated)?);
    let phnum = usize::from(u16_at(0x38).ok_or_else(truncated)?);
    if phentsize < 4 {
        return Err(format!("program header entries of {phentsize} bytes"));
    }
    let phoff = usize::try_from(phoff).map_err(|_| "program header offset too large")?;
    for i in 0..phnum {
        let off = i
            .checked_mul(phentsize)
            .and_then(|o| o.checked_add(phoff))
            .ok_or("program header offset overflows")?;
        let end = off
            .checked_add(4)
            .ok_or("program header offset overflows")?;
        let p_type = bytes
            .get(off..end)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_le_bytes)
            .ok_or("program headers run past the end of the file")?;
        if p_type == PT_INTERP {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Creates `dir` if needed and checks a file can be written in it.
fn probe_cdi_dir(dir: &Path) -> Result<(), String> {
    fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    static PROBES: AtomicU64 = AtomicU64::new(0);
    let probe = dir.join(format!(
        ".gpu-dra-e2e-probe-{}-{}.tmp",
        std::process::id(),
        PROBES.fetch_add(1, Ordering::Relaxed)
    ));
    fs::write(&probe, b"")
        .map_err(|e| format!("cannot write CDI specs in {}: {e}", dir.display()))?;
    fs::remove_file(&probe).map_err(|e| format!("remove {}: {e}", probe.display()))
}
