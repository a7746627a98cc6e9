//! Opaque device configs (`resource.nvidia.com/v1beta1` `GpuConfig`,
//! `MigDeviceConfig`: sharing, time-slicing, MPS), decoded from the raw
//! bytes of a RawExtension as the webhook and the plugin decode them.
//!
//! Checked beyond "no panic": the byte and the value decoders agree, and a
//! config that decodes and validates is serialized to JSON that decodes and
//! validates to the same config (the webhook's verdict holds for the
//! plugin).

#![no_main]

use gpu_dra_api::config::{
    DeviceConfig, decode, decode_bytes, decode_bytes_validated, decode_validated,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let from_bytes = decode_bytes(data);
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let from_value = decode(&value);
        // The byte decoder also sees duplicate fields, which a parsed value
        // has lost: it may refuse what the value decoder accepts, never the
        // other way round, and both agree on what they both accept.
        if let Ok(config) = &from_bytes {
            assert_eq!(
                from_value.as_ref().ok(),
                Some(config),
                "decode and decode_bytes disagree"
            );
        }
        let _ = decode_validated(&value);
    }
    let Ok(mut config) = from_bytes else {
        return;
    };
    let _ = (config.kind(), config.device_kind());
    config.normalize();
    let valid = config.validate().is_ok();
    assert_eq!(valid, decode_bytes_validated(data).is_ok());
    if !valid {
        return;
    }
    let json = serde_json::to_vec(&config).expect("a config serializes");
    let again: DeviceConfig = decode_bytes_validated(&json).unwrap_or_else(|e| {
        panic!(
            "a valid config does not decode from its own JSON {}: {e}",
            String::from_utf8_lossy(&json)
        )
    });
    assert_eq!(again, config, "a valid config changes through its JSON");
});
