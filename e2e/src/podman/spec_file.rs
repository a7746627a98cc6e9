//! A CDI spec file that exists for as long as its guard: written
//! atomically (temp name ending in `.tmp`, which runtimes ignore, then a
//! rename) under a name unique to the process, removed on drop.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{CDI_DIR, PodmanError};

/// Makes spec file names unique within the process.
static SPECS: AtomicU64 = AtomicU64::new(0);

/// A spec file removed when this guard is dropped.
#[derive(Debug)]
pub struct CdiSpecFile {
    path: PathBuf,
}

impl CdiSpecFile {
    /// Writes `contents` (a CDI spec as JSON, written as given) to
    /// [`CDI_DIR`] as `gpu-dra-e2e-<pid>-<n>.json`.
    pub fn write(contents: &str) -> Result<Self, PodmanError> {
        Self::write_in(Path::new(CDI_DIR), contents)
    }

    /// As [`write`](Self::write), in `dir` (created if missing).
    pub fn write_in(dir: &Path, contents: &str) -> Result<Self, PodmanError> {
        fs::create_dir_all(dir).map_err(|e| PodmanError::io("create", dir, e))?;
        let name = format!(
            "gpu-dra-e2e-{}-{}",
            std::process::id(),
            SPECS.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(format!("{name}.json"));
        let temp = dir.join(format!(".{name}.tmp"));
        let written = fs::write(&temp, contents)
            .map_err(|e| PodmanError::io("write", &temp, e))
            .and_then(|()| {
                fs::rename(&temp, &path).map_err(|e| PodmanError::io("rename", &temp, e))
            });
        if let Err(err) = written {
            // Best effort: the temp file is ours and useless now.
            let _ = fs::remove_file(&temp);
            return Err(err);
        }
        Ok(Self { path })
    }

    /// Takes charge of a spec file written by someone else (the driver's
    /// `SpecDir`, the plugin): it is removed on drop.
    pub fn adopt(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The spec file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for CdiSpecFile {
    fn drop(&mut self) {
        match fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove CDI spec");
            }
        }
    }
}
