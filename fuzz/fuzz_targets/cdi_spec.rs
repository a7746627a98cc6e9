//! The CDI side of the plugin (`gpu_kubelet_plugin::prepare::cdi`): spec
//! files as the plugin writes them and a runtime reads them back (strict
//! JSON: unknown fields refused), and the kernel's text files the device
//! node lookup reads (`/proc/driver/nvidia/capabilities/.../access`,
//! `/proc/devices`).
//!
//! Checked beyond "no panic": a spec that reads is written through
//! `SpecDir` (atomic write, listing) and reads back unchanged, and its
//! minimum `cdiVersion` does not change through the round trip.

#![no_main]

use std::sync::LazyLock;

use gpu_kubelet_plugin::prepare::cdi::nodes::{parse_cap_minor, parse_cap_mode, parse_char_major};
use gpu_kubelet_plugin::prepare::cdi::{Spec, SpecDir, min_version};
use libfuzzer_sys::fuzz_target;

/// A CDI root for the whole run (tmpfs when there is one).
static ROOT: LazyLock<tempfile::TempDir> = LazyLock::new(|| {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::Builder::new().prefix("fuzz-cdi").tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("a temp dir")
});

const UID: &str = "0b5c9a3e-1d2f-4e6a-8b7c-9d0e1f2a3b4c";

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_cap_minor(text);
        let _ = parse_cap_mode(text);
        let _ = parse_char_major(text, "nvidia-caps");
    }
    let Ok(spec) = serde_json::from_slice::<Spec>(data) else {
        return;
    };
    let version = min_version(&spec);
    let dir = SpecDir::nvidia(ROOT.path());
    let path = dir
        .write(UID, &spec)
        .unwrap_or_else(|e| panic!("writing a spec that read: {e}"));
    let bytes = std::fs::read(&path).expect("the written spec");
    let back: Spec = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "a written spec does not read back: {e}: {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    assert_eq!(back, spec, "a spec changes through a write");
    assert_eq!(min_version(&back), version);
    assert_eq!(
        dir.list().expect("the CDI root lists"),
        vec![UID.to_owned()]
    );
    assert!(dir.remove(UID).expect("the spec is removed"));
});
