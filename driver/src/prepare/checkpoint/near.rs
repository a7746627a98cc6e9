//! Whether damaged text still names something: a name counts as named when
//! the text holds it with at most one byte changed, dropped or added.
//!
//! A damaged byte that falls inside a MIG device UUID or an MPS daemon id
//! leaves a name the node does not have, often one the name patterns no
//! longer find. The node's own names are known and well formed, so the
//! question is turned around: the ledger keeps the damaged text
//! ([`printable`]), and startup recovery asks, for each name on the node,
//! whether the text holds it nearly ([`holds_nearly`]).
//!
//! Hand-written: a general fuzzy-search crate answers a wider question
//! (any edit distance, scoring) at a higher cost; one edit is a few lines.

/// `text` as the ledger keeps it: JSON's whitespace is a space, and every
/// other byte that is not printable ASCII (a control byte, a byte with its
/// high bit set) is one `?`, so the text is as long as the bytes and one
/// damaged byte stays one character; JSON between entries still parses.
pub(super) fn printable(bytes: &[u8]) -> String {
    let ascii: Vec<u8> = bytes
        .iter()
        .map(|&b| match b {
            b' ' | b'\n' | b'\r' | b'\t' => b' ',
            b if b.is_ascii_graphic() => b,
            _ => b'?',
        })
        .collect();
    // Printable ASCII only: always UTF-8.
    String::from_utf8(ascii).unwrap_or_default()
}

/// Whether `text` holds `name` with at most one edit (one byte changed,
/// dropped or added). A name shorter than 8 bytes must be there exactly:
/// one edit from a short name is too easily something else.
pub(crate) fn holds_nearly(text: &str, name: &str) -> bool {
    let (text, name) = (text.as_bytes(), name.as_bytes());
    if name.is_empty() || text.len() + 1 < name.len() {
        return false;
    }
    if name.len() < 8 {
        return occurrences(text, name).next().is_some();
    }
    // One edit leaves one half of the name whole: each place a half is
    // found fixes where the name would start, give or take the edit.
    let mid = name.len() / 2;
    let (first, second) = name.split_at(mid);
    let starts = occurrences(text, first).chain(
        occurrences(text, second)
            .flat_map(|at| {
                // The second half starts `mid` in, one earlier or later after
                // a dropped or added byte before it.
                [
                    at.checked_sub(mid),
                    at.checked_sub(mid + 1),
                    at.checked_sub(mid.saturating_sub(1)),
                ]
            })
            .flatten(),
    );
    for start in starts {
        for len in [name.len() - 1, name.len(), name.len() + 1] {
            if let Some(window) = text.get(start..start + len)
                && within_one_edit(window, name)
            {
                return true;
            }
        }
    }
    false
}

/// Where `needle` starts in `haystack` (std's substring search; overlapping
/// occurrences too). Both are cut from `&str`s at ASCII bytes of the name
/// (its halves): where either is not UTF-8 (a hostile ledger), nothing.
fn occurrences<'a>(haystack: &'a [u8], needle: &'a [u8]) -> impl Iterator<Item = usize> + 'a {
    let both = std::str::from_utf8(haystack)
        .ok()
        .zip(std::str::from_utf8(needle).ok())
        .filter(|(_, n)| !n.is_empty());
    let mut from = 0;
    std::iter::from_fn(move || {
        let (haystack, needle) = both?;
        let at = from + haystack.get(from..)?.find(needle)?;
        // `at` and the end of the needle's first character are boundaries.
        from = at + needle.chars().next().map_or(1, char::len_utf8);
        Some(at)
    })
}

/// Whether `a` and `b` differ by at most one byte changed, dropped or
/// added.
fn within_one_edit(a: &[u8], b: &[u8]) -> bool {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    match long.len() - short.len() {
        0 => short.iter().zip(long).filter(|(x, y)| x != y).count() <= 1,
        1 => {
            let same_head = short.iter().zip(long).take_while(|(x, y)| x == y).count();
            short[same_head..] == long[same_head + 1..]
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = "MIG-0a0b0c0d-1111-4222-8333-444455556666";

    #[test]
    fn every_single_byte_change_drop_or_addition_is_still_found() {
        let text = format!(r#"{{"migUuid": "{NAME}", "x": 1}}"#);
        let at = text.find(NAME).unwrap();
        let mut cases = 0;
        for i in at..at + NAME.len() {
            let bytes = text.as_bytes();
            for b in [b'?', b'"', b'x', b'0'] {
                let mut changed = bytes.to_vec();
                changed[i] = b;
                assert!(holds_nearly(&printable(&changed), NAME), "{i} {b}");
                let mut added = bytes.to_vec();
                added.insert(i, b);
                assert!(holds_nearly(&printable(&added), NAME), "{i} +{b}");
                cases += 2;
            }
            let mut dropped = bytes.to_vec();
            dropped.remove(i);
            assert!(holds_nearly(&printable(&dropped), NAME), "{i} dropped");
            cases += 1;
        }
        assert_eq!(cases, NAME.len() * 9);
        // The name cut off at the end of the text.
        assert!(holds_nearly(&NAME[..NAME.len() - 1], NAME));
    }

    #[test]
    fn two_edits_or_another_name_are_not_found() {
        let two = NAME.replacen("0a0b", "0a1c", 1);
        assert!(!holds_nearly(&two, NAME));
        assert!(!holds_nearly(
            "MIG-ffffffff-1111-4222-8333-444455556666",
            NAME
        ));
        assert!(!holds_nearly("", NAME));
        assert!(!holds_nearly(NAME, ""));
        // Short names only exactly.
        assert!(holds_nearly("a abc-1 b", "abc-1"));
        assert!(!holds_nearly("a abd-1 b", "abc-1"));
    }

    #[test]
    fn damaged_bytes_stay_one_character_each() {
        assert_eq!(printable(b"a\x00b\xffc\"d\n\t"), "a?b?c\"d  ");
        assert_eq!(printable(&[0xe2, 0x82, 0xac]), "???");
    }
}
