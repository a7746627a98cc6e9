//! CDI naming rules: vendor, class, device names, qualified device ids, and
//! the claim UIDs and DRA device names this driver builds device names from.
//!
//! Rules (CDI): vendor and class start with a letter, end with a letter or
//! digit and contain only letters, digits, `-`, `_` and `.`; a device name
//! starts and ends with a letter or digit and may also contain `-`, `_`, `.`
//! and `:`. On top of that this driver only accepts claim UIDs made of ASCII
//! letters, digits and `-` (Kubernetes UIDs are UUIDs), so a UID can never
//! smuggle `/`, `..` or a NUL into a file name.

use super::CdiError;

/// Longest vendor (a DNS subdomain).
const MAX_VENDOR: usize = 253;
/// Longest class.
const MAX_CLASS: usize = 63;
/// Longest claim UID accepted (a UUID has 36 characters).
pub const MAX_CLAIM_UID: usize = 64;
/// Longest DRA device name accepted (a DNS label).
pub const MAX_DEVICE: usize = 63;

fn invalid(what: &'static str, value: &str, reason: &'static str) -> CdiError {
    let mut shown: String = value.chars().take(80).collect();
    if value.chars().count() > 80 {
        shown.push('…');
    }
    CdiError::InvalidName {
        what,
        value: shown,
        reason,
    }
}

fn check(
    what: &'static str,
    value: &str,
    max: usize,
    first_letter_only: bool,
    extra: &[char],
) -> Result<(), CdiError> {
    let Some(first) = value.chars().next() else {
        return Err(invalid(what, value, "must not be empty"));
    };
    if value.len() > max {
        return Err(invalid(what, value, "is too long"));
    }
    if first_letter_only && !first.is_ascii_alphabetic() {
        return Err(invalid(what, value, "must start with a letter"));
    }
    if !first.is_ascii_alphanumeric() {
        return Err(invalid(what, value, "must start with a letter or digit"));
    }
    if !value.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(invalid(what, value, "must end with a letter or digit"));
    }
    if !value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
    {
        return Err(invalid(
            what,
            value,
            "contains a character that is not allowed",
        ));
    }
    Ok(())
}

/// Validates a CDI vendor (`k8s.gpu.nvidia.com`).
pub fn validate_vendor(vendor: &str) -> Result<(), CdiError> {
    check("vendor", vendor, MAX_VENDOR, true, &['-', '_', '.'])
}

/// Validates a CDI class (`claim`). Dots are allowed but need spec 0.6.0.
pub fn validate_class(class: &str) -> Result<(), CdiError> {
    check("class", class, MAX_CLASS, true, &['-', '_', '.'])
}

/// Validates a CDI device name.
pub fn validate_device_name(name: &str) -> Result<(), CdiError> {
    check(
        "device name",
        name,
        usize::MAX,
        false,
        &['-', '_', '.', ':'],
    )
}

/// Validates a claim UID as used in spec file names and device names.
pub fn validate_claim_uid(uid: &str) -> Result<(), CdiError> {
    check("claim UID", uid, MAX_CLAIM_UID, false, &['-'])
}

/// Validates a DRA device name (a DNS label: lowercase letters, digits, `-`).
pub fn validate_dra_device(name: &str) -> Result<(), CdiError> {
    check("DRA device name", name, MAX_DEVICE, false, &['-'])?;
    if name.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(invalid("DRA device name", name, "must be lowercase"));
    }
    Ok(())
}

/// The CDI device name of a claim's device: `<claimUID>-<device>`.
pub fn claim_device_name(claim_uid: &str, device: &str) -> Result<String, CdiError> {
    validate_claim_uid(claim_uid)?;
    validate_dra_device(device)?;
    let name = format!("{claim_uid}-{device}");
    validate_device_name(&name)?;
    Ok(name)
}

/// The fully qualified CDI device id `<vendor>/<class>=<name>`.
pub fn qualified_id(vendor: &str, class: &str, name: &str) -> Result<String, CdiError> {
    validate_vendor(vendor)?;
    validate_class(class)?;
    validate_device_name(name)?;
    Ok(format!("{vendor}/{class}={name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(r: Result<impl std::fmt::Debug, CdiError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn nvidia_names_are_accepted() {
        validate_vendor("k8s.gpu.nvidia.com").unwrap();
        validate_class("claim").unwrap();
        let name = claim_device_name(
            "0f8e6a1c-3b9d-4e57-a1c2-9d8f7e6b5a43",
            "gpu-3-mig-1g10gb-19-0",
        )
        .unwrap();
        assert_eq!(
            name,
            "0f8e6a1c-3b9d-4e57-a1c2-9d8f7e6b5a43-gpu-3-mig-1g10gb-19-0"
        );
        assert_eq!(
            qualified_id("k8s.gpu.nvidia.com", "claim", &name).unwrap(),
            format!("k8s.gpu.nvidia.com/claim={name}")
        );
    }

    #[test]
    fn hostile_claim_uids_are_refused_with_the_rule() {
        for (uid, why) in [
            ("", "must not be empty"),
            ("../../etc", "must start with a letter or digit"),
            ("abc/../def", "not allowed"),
            ("abc/def", "not allowed"),
            ("abc..def", "not allowed"),
            ("abc_def", "not allowed"),
            ("abc\0def", "not allowed"),
            ("abc def", "not allowed"),
            ("abc-", "must end with a letter or digit"),
            ("ünïcode", "must start with a letter or digit"),
        ] {
            let msg = reason(validate_claim_uid(uid));
            assert!(msg.contains(why), "{uid:?}: {msg}");
            assert!(msg.contains("claim UID"), "{msg}");
        }
        let long = "a".repeat(MAX_CLAIM_UID + 1);
        let msg = reason(validate_claim_uid(&long));
        assert!(msg.contains("too long"), "{msg}");
        assert!(msg.len() < 200, "the value is truncated in messages: {msg}");
        validate_claim_uid(&"a".repeat(MAX_CLAIM_UID)).unwrap();
    }

    #[test]
    fn bad_vendors_classes_and_devices_are_refused() {
        assert!(reason(validate_vendor("1nvidia.com")).contains("start with a letter"));
        assert!(reason(validate_vendor("nvidia.com.")).contains("end with"));
        assert!(reason(validate_vendor("nvi/dia")).contains("not allowed"));
        assert!(reason(validate_class("")).contains("empty"));
        assert!(reason(validate_class(&"c".repeat(64))).contains("too long"));
        assert!(reason(validate_class("cl=aim")).contains("not allowed"));
        assert!(reason(validate_dra_device("GPU-0")).contains("lowercase"));
        assert!(reason(validate_dra_device("gpu.0")).contains("not allowed"));
        assert!(reason(validate_dra_device(&"g".repeat(64))).contains("too long"));
        assert!(reason(validate_device_name("a=b")).contains("not allowed"));
        validate_device_name("a:b.c_d-0").unwrap();
        assert!(reason(claim_device_name("uid", "gpu/0")).contains("DRA device name"));
        assert!(reason(qualified_id("k8s.gpu.nvidia.com", "claim", "-x")).contains("device name"));
    }
}
