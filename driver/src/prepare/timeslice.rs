//! The CUDA time-slice of a GPU, set with
//! `<driver-root>/usr/bin/nvidia-smi compute-policy -i <uuid> --set-timeslice <0-3>`
//! (NVML documents no call for it). The preparer sets compute mode `DEFAULT`
//! through the GPU backend first, and sets the interval back to `Default`
//! on unprepare when a claim changed it.
//!
//! `nvidia-smi` runs from the driver root with a clean environment
//! (`PATH`, and `LD_LIBRARY_PATH` for a driver root other than `/`) and a
//! bounded wait; its output is part of every error, since `nvidia-smi`
//! prints most of its errors on stdout.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gpu_dra_api::config::v1beta1::TimeSliceInterval;

use super::cdi::HostRoot;
use super::mps::exec::{self, RunError, driver_env};

/// `nvidia-smi`, relative to the driver root.
pub const NVIDIA_SMI: &str = "usr/bin/nvidia-smi";
/// How long `nvidia-smi` may run (it can be slow on a busy node, not this slow).
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Errors of setting the time-slice.
#[derive(Debug, thiserror::Error)]
pub enum TimeSliceError {
    /// The UUID is not a GPU UUID (time-slicing applies to whole GPUs only).
    #[error("cannot set the time-slice of {uuid:?}: {reason}")]
    InvalidUuid {
        /// The UUID given.
        uuid: String,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// `nvidia-smi` is not in the driver root.
    #[error("{path} not found: check --driver-root (time-slicing needs nvidia-smi)")]
    Missing {
        /// Where it was looked for (plugin side).
        path: PathBuf,
    },
    /// `nvidia-smi` could not be started.
    #[error("cannot run {path}: {source}")]
    Spawn {
        /// The program.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `nvidia-smi` ran and failed.
    #[error(
        "nvidia-smi compute-policy --set-timeslice {value} on GPU {uuid} failed ({status}): {output}"
    )]
    Failed {
        /// The GPU.
        uuid: String,
        /// The value (0 to 3).
        value: u8,
        /// Its exit status.
        status: String,
        /// What it printed.
        output: String,
    },
    /// `nvidia-smi` did not finish in time and was killed.
    #[error(
        "nvidia-smi compute-policy on GPU {uuid} did not finish within {timeout_s} s and was killed"
    )]
    TimedOut {
        /// The GPU.
        uuid: String,
        /// The timeout.
        timeout_s: u64,
    },
}

/// Checks a whole-GPU UUID: `GPU-` then 1 to 64 hex digits and dashes.
fn validate_gpu_uuid(uuid: &str) -> Result<(), &'static str> {
    let body = uuid
        .strip_prefix("GPU-")
        .ok_or("not a GPU UUID (GPU-...); time-slicing applies to whole GPUs, not MIG devices")?;
    if body.is_empty()
        || body.len() > 64
        || !body.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
    {
        return Err("a GPU UUID has 1 to 64 hex digits and dashes after GPU-");
    }
    Ok(())
}

/// Sets the time-slice interval of GPU `uuid`.
pub fn set_timeslice(
    driver_root: &HostRoot,
    uuid: &str,
    interval: TimeSliceInterval,
) -> Result<(), TimeSliceError> {
    set_timeslice_within(driver_root, uuid, interval, TIMEOUT)
}

/// [`set_timeslice`] with another timeout.
pub fn set_timeslice_within(
    driver_root: &HostRoot,
    uuid: &str,
    interval: TimeSliceInterval,
    timeout: Duration,
) -> Result<(), TimeSliceError> {
    validate_gpu_uuid(uuid).map_err(|reason| TimeSliceError::InvalidUuid {
        uuid: uuid.to_owned(),
        reason,
    })?;
    let path = driver_root.local(Path::new(NVIDIA_SMI));
    if !path.is_file() {
        return Err(TimeSliceError::Missing { path });
    }
    let value = interval.as_int();
    let mut cmd = Command::new(&path);
    driver_env(&mut cmd, &driver_root.path);
    cmd.args(["compute-policy", "-i", uuid, "--set-timeslice"])
        .arg(value.to_string());
    match exec::run(&mut cmd, None, timeout) {
        Ok(ran) if ran.status.success() => {
            tracing::info!(gpu = %uuid, interval = ?interval, value, "time-slice set");
            Ok(())
        }
        Ok(ran) => Err(TimeSliceError::Failed {
            uuid: uuid.to_owned(),
            value,
            status: ran.status.to_string(),
            output: ran.output(),
        }),
        Err(RunError::TimedOut) => Err(TimeSliceError::TimedOut {
            uuid: uuid.to_owned(),
            timeout_s: timeout.as_secs(),
        }),
        Err(RunError::Spawn(source) | RunError::Wait(source)) => {
            Err(TimeSliceError::Spawn { path, source })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use fake_driver_root::{Behaviour, FakeDriverRoot, Options};

    use super::*;

    const GPU: &str = "GPU-9be4bcfc-49b6-4a08-b2e6-cc3ababced20";

    fn root() -> (tempfile::TempDir, FakeDriverRoot) {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeDriverRoot::create_with(
            &dir.path().join("driver"),
            Options {
                gpus: vec![GPU.into()],
                ..Options::default()
            },
        )
        .unwrap();
        (dir, fake)
    }

    #[test]
    fn runs_nvidia_smi_compute_policy_from_the_driver_root() {
        let (_dir, fake) = root();
        let host = HostRoot::same(fake.path());
        for (interval, value) in [
            (TimeSliceInterval::Long, 3),
            (TimeSliceInterval::Short, 1),
            (TimeSliceInterval::Default, 0),
        ] {
            set_timeslice(&host, GPU, interval).unwrap();
            assert_eq!(fake.gpu_state().unwrap().timeslice[GPU], value);
        }
        let calls = fake.nvidia_smi_calls().unwrap();
        assert_eq!(calls.len(), 3);
        assert_eq!(
            calls[0].args,
            ["compute-policy", "-i", GPU, "--set-timeslice", "3"]
        );
        // The plugin's own CUDA environment does not leak into nvidia-smi.
        assert_eq!(calls[0].env("CUDA_VISIBLE_DEVICES"), None);
    }

    #[test]
    fn failures_carry_what_nvidia_smi_printed() {
        let (_dir, fake) = root();
        let host = HostRoot::same(fake.path());
        let err = set_timeslice(&host, "GPU-0000", TimeSliceInterval::Medium).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, TimeSliceError::Failed { value: 2, .. }),
            "{text}"
        );
        assert!(text.contains("No devices were found"), "{text}");
        assert!(text.contains("GPU-0000"), "{text}");

        fake.set_behaviour(&Behaviour {
            nvidia_smi_failure: Some((
                9,
                "Failed to initialize NVML: Driver/library version mismatch".into(),
            )),
            ..Behaviour::default()
        })
        .unwrap();
        let text = set_timeslice(&host, GPU, TimeSliceInterval::Long)
            .unwrap_err()
            .to_string();
        assert!(text.contains("exit status: 9"), "{text}");
        assert!(text.contains("version mismatch"), "{text}");
        assert_eq!(fake.gpu_state().unwrap().timeslice.get(GPU), None);
    }

    #[test]
    fn hostile_uuids_never_reach_nvidia_smi() {
        let (_dir, fake) = root();
        let host = HostRoot::same(fake.path());
        for uuid in [
            "",
            "GPU-",
            "0",
            "MIG-9be4bcfc-49b6-4a08-b2e6-cc3ababced20",
            "GPU-1 --set-timeslice 3",
            "GPU-1\n-c 3",
            "-i",
            "GPU-../../etc",
            &format!("GPU-{}", "a".repeat(65)),
        ] {
            let err = set_timeslice(&host, uuid, TimeSliceInterval::Long).unwrap_err();
            assert!(
                matches!(err, TimeSliceError::InvalidUuid { .. }),
                "{uuid:?}: {err}"
            );
        }
        assert_eq!(fake.nvidia_smi_calls().unwrap(), vec![]);
    }

    #[test]
    fn missing_and_hanging_nvidia_smi() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::same(dir.path());
        let err = set_timeslice(&host, GPU, TimeSliceInterval::Long).unwrap_err();
        assert!(matches!(err, TimeSliceError::Missing { .. }), "{err}");
        assert!(err.to_string().contains("--driver-root"), "{err}");

        let bin = dir.path().join("usr/bin");
        fs::create_dir_all(&bin).unwrap();
        let smi = bin.join("nvidia-smi");
        fs::write(&smi, "#!/bin/sh\nexec sleep 5\n").unwrap();
        fs::set_permissions(&smi, fs::Permissions::from_mode(0o755)).unwrap();
        let err = set_timeslice_within(
            &host,
            GPU,
            TimeSliceInterval::Long,
            Duration::from_millis(100),
        )
        .unwrap_err();
        assert!(matches!(err, TimeSliceError::TimedOut { .. }), "{err}");

        fs::write(&smi, "not a program\n").unwrap();
        fs::set_permissions(&smi, fs::Permissions::from_mode(0o644)).unwrap();
        let err = set_timeslice(&host, GPU, TimeSliceInterval::Long).unwrap_err();
        assert!(matches!(err, TimeSliceError::Spawn { .. }), "{err}");
    }
}
