//! For the tests that run the `gpu-dra` binary against the stand-in API
//! server: whether the binary is there, the CLI's captured test data, and
//! a started server with its runtime.

use std::path::{Path, PathBuf};

use gpu_dra_sim::apiserver::{ServerOptions, TestApiServer};
use serde_json::Value;

/// Set to `1` to make a missing `gpu-dra` binary a failure.
pub const REQUIRE_ENV: &str = "GPU_DRA_E2E_REQUIRE_GPU_DRA_BIN";

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A file under `cli/tests/data`.
pub fn data(name: &str) -> PathBuf {
    repo().join("cli/tests/data").join(name)
}

/// Whether the `gpu-dra` binary is there (else a loud skip naming `test`,
/// or a panic when [`REQUIRE_ENV`] is `1`).
pub fn have_gpu_dra(test: &str) -> bool {
    match gpu_dra_e2e::bins::gpu_dra() {
        Ok(_) => true,
        Err(e) => gpu_dra_e2e::skip_unless_required::<(), _>(test, REQUIRE_ENV, e)
            .unwrap_or_else(|e| panic!("{e}"))
            .is_some(),
    }
}

/// Every object of a YAML `List` file.
pub fn list_items(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap();
    let list: Value = yaml_serde::from_str(&text).unwrap();
    list["items"].as_array().unwrap().clone()
}

/// A started test API server (default options) and the one-worker runtime
/// that serves it, for tests that are not async themselves.
pub fn api_server() -> (tokio::runtime::Runtime, TestApiServer) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = runtime
        .block_on(TestApiServer::start(ServerOptions::default()))
        .unwrap();
    (runtime, server)
}
