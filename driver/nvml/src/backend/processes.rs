//! The processes on one GPU: NVML's compute and graphics process lists
//! (`nvmlDeviceGet{Compute,Graphics}RunningProcesses_v3`), merged by pid.
//!
//! NOT_SUPPORTED (or a library without the functions) is
//! [`Error::NotSupported`] and a GPU off the bus [`Error::GpuLost`], so the
//! caller can tell "unknown" and "lost" from a failed query.

use std::collections::BTreeMap;

use nvml_wrapper::Device;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;

use super::call;
use crate::{Error, GpuProcess, Result};

/// The processes on GPU `index`, compute and graphics merged, by pid.
pub(super) fn processes(device: &Device<'_>, index: u32) -> Result<Vec<GpuProcess>> {
    let compute = device
        .running_compute_processes()
        .map_err(error("nvmlDeviceGetComputeRunningProcesses_v3", index))?;
    let graphics = device
        .running_graphics_processes()
        .map_err(error("nvmlDeviceGetGraphicsRunningProcesses_v3", index))?;
    Ok(merge(&compute, &graphics))
}

/// Maps an NVML error of a process query: NOT_SUPPORTED and a missing
/// symbol to [`Error::NotSupported`], GPU_IS_LOST to [`Error::GpuLost`].
pub(super) fn error(name: &'static str, gpu: u32) -> impl FnOnce(NvmlError) -> Error {
    move |e| match e {
        NvmlError::NotSupported
        | NvmlError::FailedToLoadSymbol(_)
        | NvmlError::FunctionNotFound => Error::NotSupported {
            call: name,
            gpu: Some(gpu),
        },
        NvmlError::GpuLost => Error::GpuLost { call: name, gpu },
        other => call(name, gpu)(other),
    }
}

/// One entry per pid, ordered by pid: a process in both lists has both
/// contexts; its memory is the larger figure NVML knows.
fn merge(compute: &[ProcessInfo], graphics: &[ProcessInfo]) -> Vec<GpuProcess> {
    let mut by_pid: BTreeMap<u32, GpuProcess> = BTreeMap::new();
    for (list, is_graphics) in [(compute, false), (graphics, true)] {
        for p in list {
            let used = match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(bytes),
                UsedGpuMemory::Unavailable => None,
            };
            let entry = by_pid.entry(p.pid).or_insert(GpuProcess {
                pid: p.pid,
                used_memory_bytes: None,
                compute: false,
                graphics: false,
            });
            entry.used_memory_bytes = entry.used_memory_bytes.max(used);
            if is_graphics {
                entry.graphics = true;
            } else {
                entry.compute = true;
            }
        }
    }
    by_pid.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(pid: u32, used: Option<u64>) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: used.map_or(UsedGpuMemory::Unavailable, UsedGpuMemory::Used),
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn lists_merge_by_pid() {
        let merged = merge(
            &[info(30, Some(10)), info(10, None), info(20, Some(5))],
            &[info(20, Some(7)), info(40, None), info(10, None)],
        );
        let p = |pid, used_memory_bytes, compute, graphics| GpuProcess {
            pid,
            used_memory_bytes,
            compute,
            graphics,
        };
        assert_eq!(
            merged,
            vec![
                p(10, None, true, true),
                p(20, Some(7), true, true),
                p(30, Some(10), true, false),
                p(40, None, false, true),
            ]
        );
        assert!(merge(&[], &[]).is_empty());
    }

    #[test]
    fn errors_keep_not_supported_and_lost_apart() {
        let e = error("f", 3)(NvmlError::NotSupported);
        assert!(
            matches!(
                e,
                Error::NotSupported {
                    call: "f",
                    gpu: Some(3)
                }
            ),
            "{e}"
        );
        assert_eq!(e.to_string(), "NVML f is not supported on GPU 3");
        let e = error("f", 3)(NvmlError::FunctionNotFound);
        assert!(matches!(e, Error::NotSupported { .. }), "{e}");
        let e = error("f", 3)(NvmlError::GpuLost);
        assert!(matches!(e, Error::GpuLost { call: "f", gpu: 3 }), "{e}");
        assert_eq!(e.to_string(), "NVML f failed on GPU 3: the GPU is lost");
        let e = error("f", 3)(NvmlError::NoPermission);
        assert!(matches!(e, Error::Call { gpu: Some(3), .. }), "{e}");
    }
}
