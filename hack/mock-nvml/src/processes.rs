//! Processes on a GPU, as `nvmlDeviceGetComputeRunningProcesses_v3` and
//! `nvmlDeviceGetGraphicsRunningProcesses_v3` report them: the profile's
//! `processes:` list of a GPU (present at start) and the `processes` /
//! `graphics-processes` control commands, which replace one list.
//!
//! Both inputs are checked here, pure: a pid is never 0, appears once per
//! list, and a list holds at most [`MAX_PROCESSES`].

use serde::{Deserialize, Serialize};

/// The most processes one list (compute or graphics) of a GPU may hold.
pub const MAX_PROCESSES: usize = 64;

/// The largest memory figure, in MiB, whose byte count fits NVML's
/// `unsigned long long` (and is never `NVML_VALUE_NOT_AVAILABLE`).
pub const MAX_USED_MIB: u64 = u64::MAX >> 20;

/// `NVML_VALUE_NOT_AVAILABLE` as `usedGpuMemory` carries it.
pub const NOT_AVAILABLE: u64 = u64::MAX;

/// One process with a context on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Process {
    /// Its pid (never 0).
    pub pid: u32,
    /// GPU memory it uses, in MiB; `None`: not available.
    pub used_mib: Option<u64>,
}

impl Process {
    /// `usedGpuMemory` in bytes, or [`NOT_AVAILABLE`].
    pub fn used_bytes(&self) -> u64 {
        self.used_mib.map_or(NOT_AVAILABLE, |m| m << 20)
    }
}

/// One entry of a GPU's `processes:` in a profile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProcessSpec {
    /// The pid (not 0).
    pub pid: u32,
    /// GPU memory used, in MiB; absent: not available.
    #[serde(default)]
    pub used_mib: Option<u64>,
    /// A graphics context (listed by `…GraphicsRunningProcesses`); default
    /// a compute context.
    #[serde(default)]
    pub graphics: bool,
}

/// Checks one list: pids not 0 and unique, memory in range, at most
/// [`MAX_PROCESSES`]. `what` names the list in the message.
pub fn check(what: &str, list: &[Process]) -> Result<(), String> {
    if list.len() > MAX_PROCESSES {
        return Err(format!(
            "{what}: {} processes, at most {MAX_PROCESSES}",
            list.len()
        ));
    }
    for (i, p) in list.iter().enumerate() {
        if p.pid == 0 {
            return Err(format!("{what}: pid 0 is not a process"));
        }
        if list[..i].iter().any(|q| q.pid == p.pid) {
            return Err(format!("{what}: pid {} is listed twice", p.pid));
        }
        if let Some(mib) = p.used_mib.filter(|m| *m > MAX_USED_MIB) {
            return Err(format!(
                "{what}: pid {}: {mib} MiB is out of range (0 to {MAX_USED_MIB})",
                p.pid
            ));
        }
    }
    Ok(())
}

/// The compute and the graphics list of a profile's `processes:`, checked.
pub fn from_specs(specs: &[ProcessSpec]) -> Result<(Vec<Process>, Vec<Process>), String> {
    let pick = |graphics: bool| -> Vec<Process> {
        specs
            .iter()
            .filter(|s| s.graphics == graphics)
            .map(|s| Process {
                pid: s.pid,
                used_mib: s.used_mib,
            })
            .collect()
    };
    let (compute, graphics) = (pick(false), pick(true));
    check("processes (compute)", &compute)?;
    check("processes (graphics)", &graphics)?;
    Ok((compute, graphics))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: u32, used_mib: Option<u64>) -> Process {
        Process { pid, used_mib }
    }

    #[test]
    fn bytes_and_not_available() {
        assert_eq!(p(1, Some(512)).used_bytes(), 512 << 20);
        assert_eq!(p(1, None).used_bytes(), NOT_AVAILABLE);
        assert_eq!(p(1, Some(MAX_USED_MIB)).used_bytes(), u64::MAX - 0xF_FFFF);
        assert_eq!(
            NOT_AVAILABLE,
            nvml_wrapper_sys::bindings::NVML_VALUE_NOT_AVAILABLE as u64
        );
    }

    #[test]
    fn lists_are_checked() {
        assert_eq!(check("x", &[p(1, None), p(2, Some(0))]), Ok(()));
        assert_eq!(check("x", &[]), Ok(()));
        for (list, expect) in [
            (vec![p(0, None)], "x: pid 0 is not a process"),
            (vec![p(7, None), p(7, Some(1))], "x: pid 7 is listed twice"),
            (
                vec![p(7, Some(MAX_USED_MIB + 1))],
                "x: pid 7: 17592186044416 MiB is out of range (0 to 17592186044415)",
            ),
            (
                (1..=65).map(|pid| p(pid, None)).collect(),
                "x: 65 processes, at most 64",
            ),
        ] {
            assert_eq!(check("x", &list).unwrap_err(), expect);
        }
        let full: Vec<Process> = (1..=64).map(|pid| p(pid, None)).collect();
        assert_eq!(check("x", &full), Ok(()));
    }

    #[test]
    fn specs_split_into_compute_and_graphics() {
        let specs = [
            ProcessSpec {
                pid: 10,
                used_mib: Some(100),
                graphics: false,
            },
            ProcessSpec {
                pid: 10,
                used_mib: None,
                graphics: true,
            },
            ProcessSpec {
                pid: 11,
                used_mib: None,
                graphics: false,
            },
        ];
        let (compute, graphics) = from_specs(&specs).unwrap();
        assert_eq!(compute, vec![p(10, Some(100)), p(11, None)]);
        assert_eq!(graphics, vec![p(10, None)]);
        let twice = [specs[0].clone(), specs[0].clone()];
        assert_eq!(
            from_specs(&twice).unwrap_err(),
            "processes (compute): pid 10 is listed twice"
        );
    }
}
