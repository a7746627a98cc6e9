//! Validation of the claim references in a kubelet request, before any of
//! them reaches the preparer. Claim UIDs end up in file names (CDI specs,
//! checkpoints), so they are held to the shape Kubernetes gives them.
//!
//! Rules:
//! - UID: 1 to 128 bytes of `[A-Za-z0-9._-]`, not `.` or `..` (Kubernetes
//!   UIDs are RFC 4122 UUIDs);
//! - prepare only: namespace is a DNS label (at most 63 bytes of `[a-z0-9-]`,
//!   alphanumeric at both ends), name is a DNS subdomain (at most 253 bytes of
//!   `[a-z0-9.-]`, alphanumeric at both ends). Unprepare works from the UID
//!   alone, since the claim may be gone from the API by then.

use crate::prepare::claim::{ClaimError, ClaimRef};

/// Longest accepted claim UID.
pub const MAX_UID: usize = 128;

/// Which operation the claim is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// NodePrepareResources: namespace, name and UID are all needed.
    Prepare,
    /// NodeUnprepareResources: the UID is enough.
    Unprepare,
}

/// Checks one claim reference.
pub fn validate(claim: &ClaimRef, purpose: Purpose) -> Result<(), ClaimError> {
    validate_uid(&claim.uid)?;
    if purpose == Purpose::Prepare {
        if !is_dns_label(&claim.namespace) {
            return Err(ClaimError::Invalid(format!(
                "claim {:?}: namespace {} is not a valid Kubernetes namespace",
                claim.uid,
                shown(&claim.namespace)
            )));
        }
        if !is_dns_subdomain(&claim.name) {
            return Err(ClaimError::Invalid(format!(
                "claim {:?}: name {} is not a valid ResourceClaim name",
                claim.uid,
                shown(&claim.name)
            )));
        }
    }
    Ok(())
}

/// Longest value an error message quotes whole: a longer one (a request
/// near the message size limit) is cut, so that the answer, which carries
/// the message once per claim, stays within the limit too.
const QUOTED_MAX: usize = 256;

/// `value` quoted, cut after [`QUOTED_MAX`] bytes with its length named.
fn shown(value: &str) -> String {
    if value.len() <= QUOTED_MAX {
        return format!("{value:?}");
    }
    let mut end = QUOTED_MAX;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &value[..end], value.len())
}

fn validate_uid(uid: &str) -> Result<(), ClaimError> {
    if uid.is_empty() {
        return Err(ClaimError::Invalid("claim UID is empty".into()));
    }
    if uid.len() > MAX_UID {
        return Err(ClaimError::Invalid(format!(
            "claim UID is {} bytes long; at most {MAX_UID} are allowed",
            uid.len()
        )));
    }
    if uid == "."
        || uid == ".."
        || !uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(ClaimError::Invalid(format!(
            "claim UID {uid:?} contains characters other than letters, digits, '.', '_' and '-'"
        )));
    }
    Ok(())
}

pub use gpu_dra_api::schema::{is_dns_label, is_dns_subdomain};

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(ns: &str, name: &str, uid: &str) -> ClaimRef {
        ClaimRef {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn long_values_are_cut_in_the_message() {
        let long = "é".repeat(10_000);
        let e = validate(&claim(&long, "n", "u"), Purpose::Prepare).unwrap_err();
        let text = e.to_string();
        assert!(text.len() < 400, "{}", text.len());
        assert!(text.contains("(20000 bytes)"), "{text}");
        let e = validate(&claim("ns", &"x".repeat(300), "u"), Purpose::Prepare).unwrap_err();
        assert!(e.to_string().contains("(300 bytes)"), "{e}");
        let e = validate(&claim("Bad", "n", "u"), Purpose::Prepare).unwrap_err();
        assert!(e.to_string().contains("namespace \"Bad\" is not"), "{e}");
    }

    #[test]
    fn real_claims_pass() {
        let c = claim(
            "default",
            "gpu-claim.x-1",
            "6f1b8a3e-2c4d-4e5f-9a0b-1c2d3e4f5a6b",
        );
        validate(&c, Purpose::Prepare).unwrap();
        validate(&c, Purpose::Unprepare).unwrap();
    }

    #[test]
    fn hostile_uids_are_refused() {
        let long = "a".repeat(MAX_UID + 1);
        for uid in [
            "",
            ".",
            "..",
            "../../etc/passwd",
            "a/b",
            "a b",
            "uid\0",
            "ü",
            &long,
        ] {
            let err = validate(&claim("ns", "n", uid), Purpose::Unprepare).unwrap_err();
            assert!(matches!(err, ClaimError::Invalid(_)), "{uid:?}: {err}");
        }
        assert!(validate(&claim("ns", "n", &"a".repeat(MAX_UID)), Purpose::Prepare).is_ok());
    }

    #[test]
    fn prepare_needs_a_valid_namespace_and_name_unprepare_does_not() {
        for (ns, name) in [
            ("", "n"),
            ("ns", ""),
            ("Ns", "n"),
            ("ns", "N"),
            ("-ns", "n"),
            ("ns", "n."),
            ("n/s", "n"),
        ] {
            let c = claim(ns, name, "uid-1");
            let err = validate(&c, Purpose::Prepare).unwrap_err();
            assert!(err.to_string().contains("uid-1"), "{err}");
            validate(&c, Purpose::Unprepare).unwrap();
        }
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_label(&"a".repeat(63)));
        assert!(!is_dns_subdomain(&"a.".repeat(127)));
    }

    #[test]
    fn a_claim_name_with_a_part_past_63_characters_is_valid() {
        // Kubernetes limits a ResourceClaim name to 253 characters in all,
        // not 63 per dot-separated part: such a claim must still prepare.
        let name = format!("{}.b", "a".repeat(100));
        validate(&claim("ns", &name, "uid-1"), Purpose::Prepare).unwrap();
        let too_long = "a".repeat(254);
        validate(&claim("ns", &too_long, "uid-1"), Purpose::Prepare).unwrap_err();
    }
}
