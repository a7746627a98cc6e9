//! PCI addresses: parsing the forms NVML and sysfs use (`0000:18:00.0`,
//! `00000000:18:00.0`, `18:00.0`) and printing them the way each one does.

use std::fmt;

/// A PCI function address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number (0-31).
    pub device: u8,
    /// Function number (0-7).
    pub function: u8,
}

impl PciAddress {
    /// Parses `[domain:]bus:device.function` with hexadecimal fields, any case.
    pub fn parse(text: &str) -> Option<PciAddress> {
        let (head, function) = text.rsplit_once('.')?;
        let mut parts: Vec<&str> = head.split(':').collect();
        let (domain, bus, device) = match parts.len() {
            2 => ("0", parts[0], parts[1]),
            3 => {
                let device = parts.pop()?;
                let bus = parts.pop()?;
                (parts[0], bus, device)
            }
            _ => return None,
        };
        let hex = |s: &str, max_len: usize| -> Option<u32> {
            if s.is_empty() || s.len() > max_len || !s.chars().all(|c| c.is_ascii_hexdigit()) {
                return None;
            }
            u32::from_str_radix(s, 16).ok()
        };
        let domain = hex(domain, 8)?;
        let bus = u8::try_from(hex(bus, 2)?).ok()?;
        let device = u8::try_from(hex(device, 2)?).ok().filter(|d| *d < 32)?;
        let function = u8::try_from(hex(function, 1)?).ok().filter(|f| *f < 8)?;
        Some(PciAddress {
            domain,
            bus,
            device,
            function,
        })
    }

    /// `nvmlPciInfo_t.busId`: `00000000:18:00.0` (8-digit domain, upper case).
    pub fn nvml(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// `nvmlPciInfo_t.busIdLegacy`: `0000:18:00.0`.
    pub fn nvml_legacy(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// The sysfs name: `0000:18:00.0` (lower case).
    pub fn sysfs(&self) -> String {
        format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.sysfs())
    }
}

/// A PCIe root complex name as sysfs shows it: `pci0000:10` (domain, root bus).
pub fn parse_root(text: &str) -> Option<(u32, u8)> {
    let rest = text.strip_prefix("pci")?;
    let (domain, bus) = rest.split_once(':')?;
    if domain.len() != 4 || bus.len() != 2 {
        return None;
    }
    if !domain
        .chars()
        .chain(bus.chars())
        .all(|c| c.is_ascii_hexdigit())
    {
        return None;
    }
    Some((
        u32::from_str_radix(domain, 16).ok()?,
        u8::from_str_radix(bus, 16).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form_nvml_accepts() {
        let a = PciAddress::parse("0000:18:00.0").unwrap();
        assert_eq!(PciAddress::parse("00000000:18:00.0"), Some(a));
        assert_eq!(PciAddress::parse("18:00.0"), Some(a));
        assert_eq!(
            PciAddress::parse("0000:C3:1f.7").unwrap().nvml(),
            "00000000:C3:1F.7"
        );
        assert_eq!(a.nvml_legacy(), "0000:18:00.0");
        assert_eq!(
            PciAddress::parse("0001:AB:00.0").unwrap().sysfs(),
            "0001:ab:00.0"
        );
    }

    #[test]
    fn rejects_malformed_addresses() {
        for bad in [
            "",
            "18:00",
            "0000:18:00.8",
            "0000:18:20.0",
            "0000:118:00.0",
            "zz:00.0",
            "0000:18:00.0.0",
            "000000000:18:00.0",
            "0000::00.0",
            "0000:18:00.",
            " 0000:18:00.0",
        ] {
            assert_eq!(PciAddress::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn parses_root_complex_names() {
        assert_eq!(parse_root("pci0000:10"), Some((0, 0x10)));
        assert_eq!(parse_root("pci0001:ab"), Some((1, 0xab)));
        for bad in [
            "pci0000:1",
            "0000:10",
            "pci00000:10",
            "pcigggg:10",
            "pci0000-10",
        ] {
            assert_eq!(parse_root(bad), None, "{bad:?}");
        }
    }
}
