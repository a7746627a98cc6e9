//! "Did you mean": the closest known name to a misspelt one, by edit
//! distance (case differences count as half an edit, so `productname`
//! finds `productName` before anything else).

/// Names longer than this are not compared (they are no typo of a short
/// identifier, and the comparison is quadratic).
const MAX_LEN: usize = 64;

/// Edit distance in half-edits: insertion, deletion, substitution and
/// transposition of neighbours cost 2, a change of case only 1.
pub(crate) fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // three rows of the Damerau-Levenshtein (optimal string alignment) table
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut previous: Vec<usize> = (0..=b.len()).map(|j| 2 * j).collect();
    let mut current: Vec<usize> = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        current[0] = 2 * i;
        for j in 1..=b.len() {
            let substitution = if a[i - 1] == b[j - 1] {
                0
            } else if a[i - 1].eq_ignore_ascii_case(&b[j - 1]) {
                1
            } else {
                2
            };
            let mut best = (previous[j - 1] + substitution)
                .min(previous[j] + 2)
                .min(current[j - 1] + 2);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(before[j - 2] + 2);
            }
            current[j] = best;
        }
        std::mem::swap(&mut before, &mut previous);
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

/// The candidate closest to `name`, if close enough to be a plausible typo:
/// at most two edits, and fewer than a third of the name's length.
pub(crate) fn closest<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    if name.is_empty() || name.len() > MAX_LEN {
        return None;
    }
    let limit = (2 * 2).min((2 * name.chars().count()).div_ceil(3).max(1));
    candidates
        .into_iter()
        .filter(|c| *c != name && c.len() <= MAX_LEN)
        .map(|c| (distance(name, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances_count_half_edits_for_case() {
        assert_eq!(distance("memory", "memory"), 0);
        assert_eq!(distance("memry", "memory"), 2);
        assert_eq!(distance("productname", "productName"), 1);
        assert_eq!(
            distance("mmeory", "memory"),
            2,
            "a transposition is one edit"
        );
        assert_eq!(distance("", "abc"), 6);
        assert_eq!(distance("abc", ""), 6);
    }

    #[test]
    fn closest_finds_plausible_typos_only() {
        let names = ["memory", "multiprocessors", "uuid", "type"];
        assert_eq!(closest("memry", names), Some("memory"));
        assert_eq!(closest("Memory", names), Some("memory"));
        assert_eq!(closest("uid", names), Some("uuid"));
        assert_eq!(closest("color", names), None);
        assert_eq!(closest("memory", names), None, "not a typo of itself");
        assert_eq!(closest("", names), None);
        assert_eq!(closest(&"m".repeat(10_000), names), None);
    }
}
