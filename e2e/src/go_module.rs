//! A public Go module's source tree, fetched at test time from the Go module
//! proxy with the machine's Go (`go mod download -json <path>@<version>`)
//! into a module cache of its own, and checked against the `h1:` hash the
//! test pins. Tests read other projects' files from it (NVIDIA's demo
//! manifests, [`NVIDIA_DRIVER`]) without the project copying them.
//!
//! ```no_run
//! use gpu_dra_e2e::go_module::NVIDIA_DRIVER;
//! // Skips (with a loud message on stderr) where Go 1.26 or the Go module
//! // proxy is missing; fails instead when GPU_DRA_E2E_REQUIRE_GO_MODULES=1
//! // (CI sets it once it has reached the proxy).
//! let Some(dir) = NVIDIA_DRIVER.download_or_skip("my_test").unwrap() else { return };
//! assert!(dir.join("demo/specs").is_dir());
//! ```
//!
//! The module cache is `gpu-dra-go-modules/` in `$XDG_CACHE_HOME`, else in
//! `~/.cache`, else in the temporary folder: a second run downloads
//! nothing (Go locks its cache, so concurrent test processes are safe).

use std::path::PathBuf;
use std::process::Command;

use crate::grpc_go::{find_go, go_candidates, is_unreachable, user_cache_dir};

/// When set to `1`, [`GoModule::download_or_skip`] fails instead of skipping.
pub const REQUIRE_ENV: &str = "GPU_DRA_E2E_REQUIRE_GO_MODULES";

/// NVIDIA's DRA driver at the release `nvidia-compat.md` describes.
pub const NVIDIA_DRIVER: GoModule = GoModule {
    path: "sigs.k8s.io/dra-driver-nvidia-gpu",
    version: "v0.5.0",
    sum: "h1:CjUBJwemlt4kYy5AN+I7Ce4mMp9V4VKR97EBogSoDus=",
};

/// A Go module at one version, with the hash its files must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoModule {
    /// The module path, e.g. `sigs.k8s.io/dra-driver-nvidia-gpu`.
    pub path: &'static str,
    /// The version, e.g. `v0.5.0`.
    pub version: &'static str,
    /// The `h1:` hash of its files (go.sum's first line for it).
    pub sum: &'static str,
}

/// Errors of [`GoModule::download`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GoModuleError {
    /// No Go here, or the proxy cannot be reached (and the module is not
    /// in the cache): the test cannot run here.
    #[error("{module} cannot be downloaded here: {reason}")]
    Unavailable {
        /// `path@version`.
        module: String,
        /// What is missing, with what to do.
        reason: String,
    },
    /// Go answered, but not with the module: an unknown version, a hash
    /// other than the pinned one, unreadable output, a missing folder.
    #[error("{module}: {message}")]
    Failed {
        /// `path@version`.
        module: String,
        /// What went wrong.
        message: String,
    },
}

impl GoModule {
    /// `path@version`.
    pub fn id(&self) -> String {
        format!("{}@{}", self.path, self.version)
    }

    /// The module's folder in the module cache (read-only), downloaded now
    /// unless it is there already.
    pub fn download(&self) -> Result<PathBuf, GoModuleError> {
        let unavailable = |reason: String| GoModuleError::Unavailable {
            module: self.id(),
            reason,
        };
        let failed = |message: String| GoModuleError::Failed {
            module: self.id(),
            message,
        };
        let go = find_go(&go_candidates()).map_err(unavailable)?;
        let root = cache_root();
        std::fs::create_dir_all(&root)
            .map_err(|e| failed(format!("cannot create {}: {e}", root.display())))?;
        let mut cmd = Command::new(&go.program);
        cmd.args(["mod", "download", "-json", &self.id()])
            // No go.mod there: the module is fetched on its own.
            .current_dir(&root)
            .env("GOMODCACHE", root.join("mod"))
            .env("GOFLAGS", "-mod=mod")
            .env("GO111MODULE", "on")
            .env("GOWORK", "off")
            .env("GOTOOLCHAIN", "local");
        if std::env::var_os("HOME").is_none() {
            // Go wants a build cache and a GOPATH, under $HOME by default.
            cmd.env("GOCACHE", root.join("build"))
                .env("GOPATH", root.join("gopath"));
        }
        let out = cmd
            .output()
            .map_err(|e| unavailable(format!("cannot run {}: {e}", go.program.display())))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let answer = parse_answer(&stdout).map_err(|e| {
            failed(format!(
                "unreadable `go mod download -json` output ({e}; exit {}): {stdout} {stderr}",
                out.status
            ))
        })?;
        if let Some(error) = answer.error.or_else(|| {
            (!out.status.success()).then(|| format!("exit {}: {}", out.status, stderr.trim()))
        }) {
            return Err(if is_unreachable(&error) || is_unreachable(&stderr) {
                unavailable(format!(
                    "the Go module proxy cannot be reached ({error}); let this machine reach \
                     it (GOPROXY), or run `GOMODCACHE={} go mod download {}` where it can",
                    root.join("mod").display(),
                    self.id()
                ))
            } else {
                failed(error)
            });
        }
        if answer.sum.as_deref() != Some(self.sum) {
            return Err(failed(format!(
                "the downloaded files hash to {:?}, not the pinned {}",
                answer.sum, self.sum
            )));
        }
        let dir = answer
            .dir
            .map(PathBuf::from)
            .ok_or_else(|| failed("`go mod download -json` named no Dir".to_owned()))?;
        if !dir.is_dir() {
            return Err(failed(format!("{} is not a folder", dir.display())));
        }
        Ok(dir)
    }

    /// For tests: `Ok(Some(dir))` when downloaded; `Ok(None)` after a loud
    /// skip message on stderr naming `test` and what is missing; the error
    /// instead of a skip when [`REQUIRE_ENV`] is `1`. A
    /// [`GoModuleError::Failed`] is always an error.
    pub fn download_or_skip(&self, test: &str) -> Result<Option<PathBuf>, GoModuleError> {
        match self.download() {
            Ok(dir) => Ok(Some(dir)),
            Err(err @ GoModuleError::Unavailable { .. }) => {
                crate::skip_unless_required(test, REQUIRE_ENV, err)
            }
            Err(err) => Err(err),
        }
    }
}

/// The fields of `go mod download -json`'s answer that are used.
#[derive(Debug, Default, PartialEq, Eq)]
struct Answer {
    /// The module's folder in the module cache (`Dir`).
    dir: Option<String>,
    /// The `h1:` hash of its files (`Sum`).
    sum: Option<String>,
    /// Why it could not be downloaded (`Error`).
    error: Option<String>,
}

/// Go's answer for the one module asked for (an empty answer is a default
/// one: Go printed nothing, its exit status says why).
fn parse_answer(stdout: &str) -> Result<Answer, String> {
    if stdout.trim().is_empty() {
        return Ok(Answer::default());
    }
    let value: serde_json::Value = serde_json::from_str(stdout).map_err(|e| e.to_string())?;
    if !value.is_object() {
        return Err(format!("not a JSON object: {value}"));
    }
    let field = |name: &str| match value.get(name) {
        None => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("{name} is not a string: {other}")),
    };
    Ok(Answer {
        dir: field("Dir")?,
        sum: field("Sum")?,
        error: field("Error")?,
    })
}

/// The module cache's parent: `gpu-dra-go-modules` in `$XDG_CACHE_HOME`,
/// else in `~/.cache`, else in the temporary folder.
fn cache_root() -> PathBuf {
    user_cache_dir().join("gpu-dra-go-modules")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_answers_parse() {
        let ok = parse_answer(
            r#"{"Path": "m", "Version": "v1.0.0", "Dir": "/c/m@v1.0.0", "Sum": "h1:x=", "GoModSum": "h1:y="}"#,
        )
        .unwrap();
        assert_eq!(ok.dir.as_deref(), Some("/c/m@v1.0.0"));
        assert_eq!(ok.sum.as_deref(), Some("h1:x="));
        assert_eq!(ok.error, None);

        let refused = parse_answer(
            r#"{"Path": "m", "Version": "v1.0.0", "Error": "m@v1.0.0: module lookup disabled by GOPROXY=off"}"#,
        )
        .unwrap();
        assert!(is_unreachable(refused.error.as_deref().unwrap()));
        assert_eq!(parse_answer(" \n").unwrap(), Answer::default());
        assert!(parse_answer("go: not json").is_err());
        assert!(parse_answer("[1]").is_err());
        assert!(parse_answer(r#"{"Dir": 7}"#).unwrap_err().contains("Dir"));
    }
}
