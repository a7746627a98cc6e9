//! The admission webhook's handler (`gpu_dra_controller::webhook::Reviewer::
//! review_json`): the body of an HTTP request in, a verdict or a 400
//! rejection out, with the selector compiler and opaque config validation
//! behind it.
//!
//! Checked beyond "no panic": a verdict carries a response for the
//! request's UID that serializes, its warnings and denial message stay
//! within the documented bounds, and a rejection is one bounded line.

#![no_main]

use std::sync::{Arc, LazyLock};

use gpu_dra_analysis::validate::{StaticClasses, Validator};
use gpu_dra_controller::webhook::Reviewer;
use gpu_dra_controller::webhook::review::{
    MAX_MESSAGE_BYTES, MAX_WARNING_CHARS, MAX_WARNINGS_TOTAL_CHARS,
};
use libfuzzer_sys::fuzz_target;

/// The longest rejection message: the handler's own private bound, 512
/// characters, the `…` of its truncation included (corpus file
/// crash-rejection-513-chars: it was one over).
const MAX_REJECTION_CHARS: usize = 512;

/// One reviewer for the run, with the shipped `gpu.nvidia.com` class and a
/// MIG class, as the controller resolves class names.
static REVIEWER: LazyLock<Reviewer> = LazyLock::new(|| {
    let classes = StaticClasses::new([
        serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression":
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}
        }),
        serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "mig.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression":
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}}],
              "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"}}}]}
        }),
    ]);
    Reviewer::new(Validator::new("gpu.nvidia.com"), Arc::new(classes))
});

fuzz_target!(|data: &[u8]| {
    match REVIEWER.review_json(data) {
        Ok(verdict) => {
            let response = verdict.response().expect("a verdict has a response");
            let sent: serde_json::Value =
                serde_json::from_slice(data).expect("a reviewed body is JSON");
            let uid = sent["request"]["uid"].as_str().unwrap_or_default();
            assert_eq!(response.uid, uid, "the response answers another request");
            let warnings = response.warnings.clone().unwrap_or_default();
            let mut total = 0;
            for w in &warnings {
                let n = w.chars().count();
                assert!(n <= MAX_WARNING_CHARS, "a warning of {n} characters");
                total += n;
            }
            assert!(
                total <= MAX_WARNINGS_TOTAL_CHARS,
                "warnings of {total} characters"
            );
            assert!(
                response.result.message.len() <= MAX_MESSAGE_BYTES,
                "a denial message of {} bytes",
                response.result.message.len()
            );
            serde_json::to_vec(&verdict.review).expect("the answer serializes");
        }
        Err(rejection) => {
            let n = rejection.message.chars().count();
            assert!(n <= MAX_REJECTION_CHARS, "a rejection of {n} characters");
            assert!(
                !rejection.message.contains('\n'),
                "a rejection of several lines"
            );
        }
    }
});
