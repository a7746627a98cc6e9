//! The state file (`MOCK_NVML_STATE`): what a process changed on the fake
//! "hardware" (MIG mode, compute mode, GPU and compute instances), saved after
//! every change (temporary file + rename) and loaded by the next `nvmlInit`,
//! so a restarted process sees what a previous one created. Tests may read it
//! to see the live state.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::profile::ComputeMode;

/// Format version written into every state file.
pub const VERSION: u32 = 1;

/// The whole file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StateFile {
    /// Always [`VERSION`].
    pub version: u32,
    /// One entry per GPU of the profile.
    pub gpus: Vec<GpuState>,
}

/// The mutable state of one GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuState {
    /// The GPU's UUID (the key).
    pub uuid: String,
    /// Current MIG mode.
    pub mig_current: bool,
    /// Pending MIG mode.
    pub mig_pending: bool,
    /// Compute mode.
    pub compute_mode: ComputeMode,
    /// Compute instances created so far (feeds MIG UUID derivation).
    pub mig_created: u64,
    /// GPU instances.
    pub gpu_instances: Vec<GpuInstanceState>,
}

/// A GPU instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuInstanceState {
    /// GPU instance id.
    pub id: u32,
    /// Profile name, e.g. `3g.40gb` (informative).
    pub profile: String,
    /// Profile id, e.g. 9.
    pub profile_id: u32,
    /// Placement start (memory slice).
    pub start: u32,
    /// Placement size (memory slices).
    pub size: u32,
    /// Compute instances.
    pub compute_instances: Vec<ComputeInstanceState>,
}

/// A compute instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ComputeInstanceState {
    /// Compute instance id.
    pub id: u32,
    /// Profile name, e.g. `1c.3g.40gb` (informative).
    pub profile: String,
    /// CI profile id.
    pub profile_id: u32,
    /// Placement start (compute slice).
    pub start: u32,
    /// MIG device UUID.
    pub uuid: String,
}

impl StateFile {
    /// Reads a state file; `None` when it does not exist yet.
    pub fn read(path: &Path) -> Result<Option<StateFile>, Error> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("read state file", path, e)),
        };
        let state: StateFile = serde_json::from_str(&text).map_err(|e| Error::State {
            path: path.to_owned(),
            message: format!("not a state file: {e}"),
        })?;
        if state.version != VERSION {
            return Err(Error::State {
                path: path.to_owned(),
                message: format!("version {} is not {VERSION}", state.version),
            });
        }
        Ok(Some(state))
    }

    /// Writes the file atomically: a temporary file in the same directory,
    /// renamed over the old one. Not fsynced: the file stands for the state
    /// of GPUs, which a real machine loses at a reboot anyway; what it must
    /// survive is a process that dies (crash tests), and a rename is atomic
    /// for every process on the machine without a flush to disk.
    pub fn write(&self, path: &Path) -> Result<(), Error> {
        let mut text = serde_json::to_string_pretty(self).map_err(|e| Error::State {
            path: path.to_owned(),
            message: format!("cannot encode: {e}"),
        })?;
        text.push('\n');
        let file_name = path
            .file_name()
            .map_or_else(|| "state".into(), |n| n.to_string_lossy().into_owned());
        let tmp = path.with_file_name(format!(".{file_name}.{}.tmp", std::process::id()));
        let result = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(text.as_bytes())?;
            drop(file);
            std::fs::rename(&tmp, path)
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::io("write state file", path, e));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StateFile {
        StateFile {
            version: VERSION,
            gpus: vec![GpuState {
                uuid: "GPU-3f98e277-4cbd-47ad-9c90-a9587403e430".into(),
                mig_current: true,
                mig_pending: true,
                compute_mode: ComputeMode::ExclusiveProcess,
                mig_created: 3,
                gpu_instances: vec![GpuInstanceState {
                    id: 2,
                    profile: "3g.40gb".into(),
                    profile_id: 9,
                    start: 4,
                    size: 4,
                    compute_instances: vec![ComputeInstanceState {
                        id: 0,
                        profile: "3g.40gb".into(),
                        profile_id: 2,
                        start: 0,
                        uuid: "MIG-ea8d189c-bcdb-519a-a97e-8a2e7848bc1c".into(),
                    }],
                }],
            }],
        }
    }

    #[test]
    fn round_trips_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert_eq!(StateFile::read(&path).unwrap(), None);
        sample().write(&path).unwrap();
        assert_eq!(StateFile::read(&path).unwrap(), Some(sample()));
        // no temporary file left behind
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.json"]);
    }

    #[test]
    fn corrupt_or_foreign_files_are_rejected_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        for (text, expect) in [
            ("{", "not a state file"),
            (
                "{\"version\": 1, \"gpus\": [], \"extra\": 1}",
                "unknown field `extra`",
            ),
            ("{\"version\": 7, \"gpus\": []}", "version 7 is not 1"),
            ("[]", "not a state file"),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = StateFile::read(&path).unwrap_err().to_string();
            assert!(err.contains(expect), "{text}: {err}");
            assert!(err.contains("state.json"), "{err}");
        }
    }

    #[test]
    fn unwritable_directory_reports_the_failure() {
        let err = sample()
            .write(Path::new("/nonexistent-dir-for-mock-nvml/state.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot write state file"), "{err}");
    }
}
