//! Identifiers NVML hands out: GPU and MIG UUIDs (checked and derived),
//! serial numbers. Derived values are deterministic so that a replayed
//! sequence of operations yields the same identifiers.

/// 64-bit FNV-1a, seeded.
fn fnv1a(seed: u64, parts: &[&[u8]]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64 ^ seed;
    for part in parts {
        for byte in *part {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        // separator, so ("ab", "c") and ("a", "bc") differ
        hash ^= 0xff;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

fn is_uuid_body(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn is_gpu_uuid(text: &str) -> bool {
    text.strip_prefix("GPU-").is_some_and(is_uuid_body)
}

/// `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn is_mig_uuid(text: &str) -> bool {
    text.strip_prefix("MIG-").is_some_and(is_uuid_body)
}

/// The UUID of a new MIG device: a name-based (version 5 layout) UUID derived
/// from the parent GPU, the GI/CI ids and a per-GPU creation counter, so a
/// re-created instance gets a new UUID, as on the hardware.
pub fn mig_uuid(parent: &str, gi: u32, ci: u32, counter: u64) -> String {
    let parts: [&[u8]; 4] = [
        parent.as_bytes(),
        &gi.to_le_bytes(),
        &ci.to_le_bytes(),
        &counter.to_le_bytes(),
    ];
    let hi = fnv1a(0x4d49_4721, &parts);
    let lo = fnv1a(0x5555_7569_6421, &parts);
    let hi = (hi & !0xf000) | 0x5000; // version 5
    let lo = (lo & !(0b11 << 62)) | (0b10 << 62); // RFC 4122 variant
    format!(
        "MIG-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

/// A short digest of file contents, to notice that a profile changed.
pub fn digest(bytes: &[u8]) -> String {
    format!("{:016x}{:016x}", fnv1a(1, &[bytes]), fnv1a(2, &[bytes]))
}

/// A 13-digit board serial number derived from the GPU UUID.
pub fn serial_for(uuid: &str) -> String {
    format!(
        "1{:012}",
        fnv1a(0x5e71, &[uuid.as_bytes()]) % 1_000_000_000_000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_uuid_shapes() {
        assert!(is_gpu_uuid("GPU-4f0c1e2a-8b3d-4c5e-9f60-718293a4b5c6"));
        assert!(!is_gpu_uuid("GPU-4f0c1e2a-8b3d-4c5e-9f60-718293a4b5c"));
        assert!(!is_gpu_uuid("MIG-4f0c1e2a-8b3d-4c5e-9f60-718293a4b5c6"));
        assert!(!is_gpu_uuid("GPU-4f0c1e2a_8b3d-4c5e-9f60-718293a4b5c6"));
        assert!(!is_gpu_uuid("GPU-zf0c1e2a-8b3d-4c5e-9f60-718293a4b5c6"));
        assert!(is_mig_uuid("MIG-ea8d189c-bcdb-519a-a97e-8a2e7848bc1c"));
    }

    #[test]
    fn mig_uuids_are_well_formed_deterministic_and_distinct() {
        let parent = "GPU-4f0c1e2a-8b3d-4c5e-9f60-718293a4b5c6";
        let a = mig_uuid(parent, 1, 0, 0);
        assert!(is_mig_uuid(&a), "{a}");
        assert_eq!(&a[18..19], "5", "version nibble in {a}");
        assert_eq!(a, mig_uuid(parent, 1, 0, 0));
        assert_ne!(a, mig_uuid(parent, 1, 0, 1));
        assert_ne!(a, mig_uuid(parent, 2, 0, 0));
        assert_ne!(
            a,
            mig_uuid("GPU-00000000-0000-0000-0000-000000000000", 1, 0, 0)
        );
    }

    #[test]
    fn serials_have_thirteen_digits() {
        let s = serial_for("GPU-4f0c1e2a-8b3d-4c5e-9f60-718293a4b5c6");
        assert_eq!(s.len(), 13);
        assert!(s.chars().all(|c| c.is_ascii_digit()));
    }
}
