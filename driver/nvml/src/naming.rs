//! How NVML's numbers become the strings the driver publishes: brand and
//! architecture names as NVIDIA's own DRA driver spells them, normalised PCI
//! bus ids, and canonical MIG profile names (`1g.10gb`, `1g.10gb+me`, ...).
//!
//! Pure functions only, so every rule is unit-tested without a library.

use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper_sys::bindings as sys;

/// The brand string NVIDIA's driver publishes for an NVML brand.
pub fn brand_name(brand: Brand) -> &'static str {
    match brand {
        Brand::Unknown => "Unknown",
        Brand::Quadro => "Quadro",
        Brand::Tesla => "Tesla",
        Brand::NVS => "NVS",
        Brand::GRID => "Grid",
        Brand::GeForce => "GeForce",
        Brand::Titan => "Titan",
        Brand::VApps => "NvidiaVApps",
        Brand::VPC => "NvidiaVPC",
        Brand::VCS => "NvidiaVCS",
        Brand::VWS => "NvidiaVWS",
        // NVML gives both names the same value; the newer one is published.
        Brand::CloudGaming | Brand::VGaming => "NvidiaCloudGaming",
        Brand::QuadroRTX => "QuadroRTX",
        Brand::NvidiaRTX => "NvidiaRTX",
        Brand::Nvidia => "Nvidia",
        Brand::GeForceRTX => "GeForceRTX",
        Brand::TitanRTX => "TitanRTX",
    }
}

/// The architecture string NVIDIA's driver publishes for an NVML architecture.
pub fn architecture_name(arch: &DeviceArchitecture) -> &'static str {
    match arch {
        DeviceArchitecture::Kepler => "Kepler",
        DeviceArchitecture::Maxwell => "Maxwell",
        DeviceArchitecture::Pascal => "Pascal",
        DeviceArchitecture::Volta => "Volta",
        DeviceArchitecture::Turing => "Turing",
        DeviceArchitecture::Ampere => "Ampere",
        DeviceArchitecture::Ada => "Ada Lovelace",
        DeviceArchitecture::Hopper => "Hopper",
        DeviceArchitecture::Blackwell => "Blackwell",
        DeviceArchitecture::Unknown => "Unknown",
    }
}

/// Normalises a PCI bus id as NVML reports it (`00000000:18:00.0`, upper or
/// lower case) to the sysfs spelling: lower case, at least four domain digits,
/// `0000:18:00.0`. Anything that is not `domain:bus:device.function` in hex
/// is rejected with a message naming the input.
pub fn normalize_pci_bus_id(raw: &str) -> Result<String, String> {
    let bad = |why: &str| format!("malformed PCI bus id {raw:?}: {why}");
    let mut parts = raw.split(':');
    let (Some(domain), Some(bus), Some(dev_fn), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("expected domain:bus:device.function"));
    };
    let Some((device, function)) = dev_fn.split_once('.') else {
        return Err(bad("expected device.function"));
    };
    let hex = |s: &str, max_digits: usize, what: &str| -> Result<u32, String> {
        if s.is_empty() || s.len() > max_digits || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(&format!("{what} is not 1 to {max_digits} hex digits")));
        }
        u32::from_str_radix(s, 16).map_err(|e| bad(&e.to_string()))
    };
    let domain = hex(domain, 8, "domain")?;
    let bus = hex(bus, 2, "bus")?;
    let device = hex(device, 2, "device")?;
    let function = hex(function, 1, "function")?;
    if device > 0x1f {
        return Err(bad("device number above 0x1f"));
    }
    if function > 7 {
        return Err(bad("function number above 7"));
    }
    Ok(format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

/// Suffix NVIDIA appends to a MIG profile name for an NVML GPU instance
/// profile enumerant: media extensions (`+me`), all media extensions
/// (`+me.all`), graphics (`+gfx`) or no media extensions (`-me`).
fn profile_suffix(profile_enum: u32) -> &'static str {
    match profile_enum {
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
        | sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 => "+me",
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME
        | sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME => "+me.all",
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX
        | sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX
        | sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX => "+gfx",
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME
        | sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME => "-me",
        _ => "",
    }
}

/// The "GB" figure in a MIG profile name, computed the way nvidia-smi and
/// NVIDIA's driver do: the profile's share of the GPU's memory, rounded up to
/// eighths, times the GPU's memory in whole GiB (rounded up), rounded to the
/// nearest integer. `1g.5gb` on a 40 GB A100 (4864 MiB of 40 GiB) gives 5.
pub fn mig_memory_gb(profile_memory_mib: u64, total_memory_bytes: u64) -> u64 {
    const MIB: u128 = 1 << 20;
    const GIB: u128 = 1 << 30;
    if total_memory_bytes == 0 {
        return profile_memory_mib.div_ceil(1024);
    }
    let total = u128::from(total_memory_bytes);
    let profile = u128::from(profile_memory_mib) * MIB;
    // ceil(profile / total * 8), exactly.
    let eighths = (profile * 8).div_ceil(total);
    let total_gb = total.div_ceil(GIB);
    // round(eighths / 8 * total_gb), halves away from zero.
    let gb = (eighths * total_gb + 4) / 8;
    u64::try_from(gb).unwrap_or(u64::MAX)
}

/// Canonical MIG profile name without the `MIG ` prefix, e.g. `3g.40gb` or
/// `1g.10gb+me`, from the NVML profile enumerant, the profile's slice count
/// and memory, and the GPU's total memory.
pub fn mig_profile_name(
    profile_enum: u32,
    slice_count: u32,
    profile_memory_mib: u64,
    total_memory_bytes: u64,
) -> String {
    format!(
        "{slice_count}g.{}gb{}",
        mig_memory_gb(profile_memory_mib, total_memory_bytes),
        profile_suffix(profile_enum)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    #[test]
    fn bus_ids_are_normalised_to_the_sysfs_spelling() {
        assert_eq!(
            normalize_pci_bus_id("00000000:18:00.0").unwrap(),
            "0000:18:00.0"
        );
        assert_eq!(
            normalize_pci_bus_id("00000000:AB:1F.7").unwrap(),
            "0000:ab:1f.7"
        );
        assert_eq!(
            normalize_pci_bus_id("0000:07:00.0").unwrap(),
            "0000:07:00.0"
        );
        assert_eq!(normalize_pci_bus_id("0001:7:0.1").unwrap(), "0001:07:00.1");
        // Domains above 0xffff (VMD) keep all their digits, like sysfs.
        assert_eq!(
            normalize_pci_bus_id("00010000:01:00.0").unwrap(),
            "10000:01:00.0"
        );
    }

    #[test]
    fn malformed_bus_ids_are_rejected_with_the_input_named() {
        for bad in [
            "",
            "18:00.0",
            "0000:18:00",
            "0000:18:00.0:1",
            "000000000:18:00.0",
            "0000:118:00.0",
            "0000:18:20.0",
            "0000:18:00.8",
            "0000:18:00.00",
            "zzzz:18:00.0",
            "0000:18:+0.0",
            "0000:18:00.0\0",
            "0000: 18:00.0",
        ] {
            let err = normalize_pci_bus_id(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn brand_and_architecture_strings_follow_nvidia() {
        assert_eq!(brand_name(Brand::Nvidia), "Nvidia");
        assert_eq!(brand_name(Brand::Tesla), "Tesla");
        assert_eq!(brand_name(Brand::GRID), "Grid");
        assert_eq!(brand_name(Brand::VGaming), "NvidiaCloudGaming");
        assert_eq!(architecture_name(&DeviceArchitecture::Ada), "Ada Lovelace");
        assert_eq!(architecture_name(&DeviceArchitecture::Hopper), "Hopper");
        assert_eq!(architecture_name(&DeviceArchitecture::Ampere), "Ampere");
    }

    #[test]
    fn mig_names_round_memory_like_nvidia_smi() {
        // A100 40GB: 40 GiB total.
        let a100 = 40 * GIB;
        assert_eq!(mig_profile_name(0, 1, 4864, a100), "1g.5gb");
        assert_eq!(mig_profile_name(1, 2, 9856, a100), "2g.10gb");
        assert_eq!(mig_profile_name(2, 3, 19968, a100), "3g.20gb");
        assert_eq!(mig_profile_name(4, 7, 40192, a100), "7g.40gb");
        assert_eq!(mig_profile_name(7, 1, 4864, a100), "1g.5gb+me");
        // H100 80GB HBM3 reports 81559 MiB, which is not a whole number of GiB.
        let h100 = 81559 * MIB;
        assert_eq!(mig_profile_name(0, 1, 9856, h100), "1g.10gb");
        assert_eq!(mig_profile_name(7, 1, 9856, h100), "1g.10gb+me");
        assert_eq!(mig_profile_name(9, 1, 19968, h100), "1g.20gb");
        assert_eq!(mig_profile_name(4, 7, 80384, h100), "7g.80gb");
        // H200 141GB.
        let h200 = 143_771 * MIB;
        assert_eq!(mig_profile_name(0, 1, 16384, h200), "1g.18gb");
        assert_eq!(mig_profile_name(4, 7, 143_104, h200), "7g.141gb");
    }

    #[test]
    fn mig_name_suffixes_follow_the_profile_enumerant() {
        let gpu = 80 * GIB;
        assert_eq!(mig_profile_name(15, 1, 10240, gpu), "1g.10gb+me.all");
        assert_eq!(mig_profile_name(16, 2, 20480, gpu), "2g.20gb+me.all");
        assert_eq!(mig_profile_name(10, 1, 10240, gpu), "1g.10gb+gfx");
        assert_eq!(mig_profile_name(12, 4, 40960, gpu), "4g.40gb+gfx");
        assert_eq!(mig_profile_name(13, 1, 10240, gpu), "1g.10gb-me");
        assert_eq!(mig_profile_name(8, 2, 20480, gpu), "2g.20gb+me");
    }

    #[test]
    fn mig_memory_survives_degenerate_inputs() {
        assert_eq!(mig_memory_gb(0, 80 * GIB), 0);
        assert_eq!(mig_memory_gb(2048, 0), 2);
        assert_eq!(mig_memory_gb(u64::MAX, 1), u64::MAX);
    }
}
