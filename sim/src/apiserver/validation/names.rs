//! Name formats of the Kubernetes API (DNS-1123 labels and subdomains, C identifiers, qualified
//! names, label values, semantic versions, quantities), each returning the messages the API server
//! reports for a bad value.

/// Maximum length of a DNS-1123 label.
pub(crate) const DNS1123_LABEL_MAX: usize = 63;
/// Maximum length of a DNS-1123 subdomain.
pub(crate) const DNS1123_SUBDOMAIN_MAX: usize = 253;
/// Maximum length of a label value and of the name part of a qualified name.
pub(crate) const LABEL_VALUE_MAX: usize = 63;

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const C_IDENTIFIER_MSG: &str = "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex used for validation is '[A-Za-z_][A-Za-z0-9_]*')";
const QUALIFIED_NAME_PART_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const QUALIFIED_NAME_MSG: &str = "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

fn max_len_msg(max: usize) -> String {
    format!("must be no more than {max} bytes")
}

fn is_label_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'
}

fn is_dns_label_shape(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && b.iter().all(|&c| is_label_char(c)) && b[0] != b'-' && b[b.len() - 1] != b'-'
}

/// Messages for a string that is not a DNS-1123 label (empty when valid).
pub(crate) fn dns1123_label(s: &str) -> Vec<String> {
    let mut msgs = Vec::new();
    if s.len() > DNS1123_LABEL_MAX {
        msgs.push(max_len_msg(DNS1123_LABEL_MAX));
    }
    if !is_dns_label_shape(s) {
        msgs.push(DNS1123_LABEL_MSG.to_owned());
    }
    msgs
}

/// Messages for a string that is not a DNS-1123 subdomain (empty when valid).
pub(crate) fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut msgs = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        msgs.push(max_len_msg(DNS1123_SUBDOMAIN_MAX));
    }
    if !s.split('.').all(is_dns_label_shape) {
        msgs.push(DNS1123_SUBDOMAIN_MSG.to_owned());
    }
    msgs
}

/// Messages for a string that is not a C identifier (empty when valid). The length limit is
/// the caller's.
pub(crate) fn c_identifier(s: &str) -> Vec<String> {
    let b = s.as_bytes();
    let valid = !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
    if valid {
        Vec::new()
    } else {
        vec![C_IDENTIFIER_MSG.to_owned()]
    }
}

fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

/// Messages for a string that is not a qualified name (label keys, annotation keys, taint keys):
/// an optional DNS subdomain prefix and `/`, then a name of at most 63 characters.
pub(crate) fn qualified_name(s: &str) -> Vec<String> {
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                return vec!["prefix part must be non-empty".to_owned()];
            }
            let mut msgs: Vec<String> = dns1123_subdomain(prefix)
                .into_iter()
                .map(|m| format!("prefix part {m}"))
                .collect();
            msgs.extend(qualified_name_part(name));
            return msgs;
        }
        _ => return vec![QUALIFIED_NAME_MSG.to_owned()],
    };
    qualified_name_part(name)
}

fn qualified_name_part(name: &str) -> Vec<String> {
    let mut msgs = Vec::new();
    if name.is_empty() {
        msgs.push("name part must be non-empty".to_owned());
    } else if name.len() > LABEL_VALUE_MAX {
        msgs.push(format!("name part {}", max_len_msg(LABEL_VALUE_MAX)));
    }
    if !is_qualified_name_part(name) {
        msgs.push(QUALIFIED_NAME_PART_MSG.to_owned());
    }
    msgs
}

/// Messages for a string that is not a label value (empty when valid; the empty string is valid).
pub(crate) fn label_value(s: &str) -> Vec<String> {
    let mut msgs = Vec::new();
    if s.len() > LABEL_VALUE_MAX {
        msgs.push(max_len_msg(LABEL_VALUE_MAX));
    }
    if !s.is_empty() && !is_qualified_name_part(s) {
        msgs.push(LABEL_VALUE_MSG.to_owned());
    }
    msgs
}

fn is_numeric_identifier(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
}

fn is_alnum_hyphen(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Whether `s` is a semantic version (semver.org 2.0.0): `MAJOR.MINOR.PATCH[-pre][+build]`
/// without leading zeros in numeric identifiers.
pub(crate) fn is_semver(s: &str) -> bool {
    let (rest, build) = match s.split_once('+') {
        Some((rest, build)) => (rest, Some(build)),
        None => (s, None),
    };
    if let Some(build) = build
        && !build.split('.').all(is_alnum_hyphen)
    {
        return false;
    }
    let (core, pre) = match rest.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (rest, None),
    };
    if let Some(pre) = pre {
        let pre_ok = pre.split('.').all(|id| {
            is_alnum_hyphen(id)
                && (!id.bytes().all(|b| b.is_ascii_digit()) || is_numeric_identifier(id))
        });
        if !pre_ok {
            return false;
        }
    }
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| is_numeric_identifier(p))
}

/// Whether `s` is a Kubernetes resource quantity (`100`, `1.5Gi`, `200m`, `1e3`, `-2k`).
pub(crate) fn is_quantity(s: &str) -> bool {
    let rest = s.strip_prefix(['+', '-']).unwrap_or(s);
    let number_len = rest
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, suffix) = rest.split_at(number_len);
    let digits = number.bytes().filter(u8::is_ascii_digit).count();
    if digits == 0 || number.bytes().filter(|b| *b == b'.').count() > 1 {
        return false;
    }
    match suffix {
        "" | "m" | "k" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
            true
        }
        _ => {
            let Some(exp) = suffix.strip_prefix(['e', 'E']) else {
                return false;
            };
            let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            !exp.is_empty() && exp.bytes().all(|b| b.is_ascii_digit())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains() {
        assert!(dns1123_label("gpu-0").is_empty());
        assert!(!dns1123_label("GPU-0").is_empty());
        assert!(!dns1123_label("-a").is_empty());
        assert!(!dns1123_label("a.b").is_empty());
        assert_eq!(
            dns1123_label(&"a".repeat(64)),
            ["must be no more than 63 bytes"]
        );
        assert!(dns1123_subdomain("gpu.nvidia.com").is_empty());
        assert!(!dns1123_subdomain("gpu..nvidia").is_empty());
        assert!(!dns1123_subdomain("").is_empty());
        assert_eq!(
            dns1123_subdomain(&"a".repeat(254)),
            ["must be no more than 253 bytes"]
        );
        assert_eq!(dns1123_subdomain(&"A".repeat(254)).len(), 2);
    }

    #[test]
    fn c_identifiers_and_qualified_names() {
        assert!(c_identifier("productName").is_empty());
        assert!(c_identifier("_x9").is_empty());
        assert!(!c_identifier("9x").is_empty());
        assert!(!c_identifier("a-b").is_empty());
        assert!(qualified_name("example.com/taint").is_empty());
        assert!(qualified_name("my.name").is_empty());
        assert!(!qualified_name("a/b/c").is_empty());
        assert!(!qualified_name("/b").is_empty());
        assert!(!qualified_name("Example_.com/b").is_empty());
        assert_eq!(
            qualified_name(""),
            ["name part must be non-empty", QUALIFIED_NAME_PART_MSG]
        );
    }

    #[test]
    fn label_values() {
        assert!(label_value("").is_empty());
        assert!(label_value("My_value.1").is_empty());
        assert!(!label_value("-1").is_empty());
        assert!(!label_value(&"x".repeat(64)).is_empty());
    }

    #[test]
    fn semantic_versions() {
        for ok in [
            "1.2.3",
            "0.0.0",
            "550.54.15",
            "1.0.0-rc.1",
            "1.0.0-0a",
            "1.0.0+build.01",
        ] {
            assert!(is_semver(ok), "{ok}");
        }
        for bad in [
            "1.2", "01.2.3", "1.2.3-01", "1.2.3-", "1.2.3+", "v1.2.3", "1.2.3.4", "",
        ] {
            assert!(!is_semver(bad), "{bad}");
        }
    }

    #[test]
    fn quantities() {
        for ok in [
            "1", "80Gi", "1.5", ".5", "5.", "200m", "-2k", "1e3", "1E-3", "+7Mi",
        ] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["", "Gi", "1.2.3", "1GB", "1e", "abc", "1 Gi", "--1"] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }
}
