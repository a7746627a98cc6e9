//! The on-disk format of the checkpoint: encoding, decoding with per-entry
//! verification, and the version dispatch.
//!
//! Version 1 is one JSON document:
//! `{"version": 1, "bootId": "...", "entries": {"<uid>": {"checksum": "<8 hex>", "entry": {...}}}}`.
//! The checksum is the CRC-32 (IEEE) of the claim UID, a zero byte and the
//! canonical serialisation of `entry` (compact JSON, object keys sorted at
//! every level), so a flipped byte in an entry or in its key is detected and
//! quarantines that entry alone; the header (`version`, `bootId`) carries no
//! checksum: damage there makes the file unusable or looks like a reboot.
//!
//! A damaged byte that breaks the JSON (a quote, a comma, a brace) makes
//! the whole document unusable, but not its entries: [`salvage`] finds each
//! entry by its key, parses its value on its own and verifies it as above,
//! so only the entry the byte fell in is lost, and only when the header
//! still reads as version 1 of this boot. An entry whose key no longer
//! reads as one (a damaged quote, a byte of `"<uid>": {"checksum"`) is not
//! found at all: its text then reads as the tail of the entry before, whose
//! value still parses on its own (it stops at its closing brace) and
//! verifies. So what verified is never taken as all a piece of text holds:
//! what is lost either way, the text outside the values that verified
//! included, is named in the ledger of lost claims (`super::lost`).
//!
//! Unknown fields (in the header and in entries) are ignored: a newer plugin
//! of the same format version may add informational fields, and the
//! checksum, computed over the stored JSON rather than over the decoded
//! record, still verifies. A field whose loss would leak hardware state on a
//! downgrade must come with a version bump instead, and a file of a newer
//! version stops the plugin (see [`super::Error::NewerVersion`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

use super::{ClaimEntry, ClaimUid};

/// The format version this plugin writes.
pub const CURRENT_VERSION: u64 = 1;
/// The largest checkpoint file the plugin reads (64 MiB; a node with
/// thousands of claims stays far below it).
pub const MAX_FILE_BYTES: u64 = 64 << 20;
/// The longest claim UID accepted (Kubernetes UIDs are 36 characters).
const MAX_UID_LEN: usize = 256;

/// An entry that failed verification.
#[derive(Debug)]
pub(super) struct Quarantined {
    /// The key it was stored under.
    pub uid: String,
    /// Why it was rejected.
    pub reason: String,
    /// The stored JSON, for humans.
    pub raw: Value,
}

/// The outcome of decoding a checkpoint file.
#[derive(Debug)]
pub(super) enum Decoded {
    /// The header is fine; good entries decoded, bad ones set apart.
    Usable {
        /// The boot id the file belongs to.
        boot_id: String,
        /// Verified entries.
        claims: BTreeMap<ClaimUid, ClaimEntry>,
        /// Entries that failed verification.
        quarantined: Vec<Quarantined>,
    },
    /// The file as a whole cannot be used (not JSON, bad header).
    Unusable(String),
    /// The file has a version newer than [`CURRENT_VERSION`].
    Newer(u64),
}

/// Encodes `checkpoint` as a version-[`CURRENT_VERSION`] document (the
/// store assembles the same bytes from entries it keeps encoded).
#[cfg(test)]
pub(super) fn encode(checkpoint: &super::Checkpoint) -> Result<Vec<u8>, serde_json::Error> {
    let fragments = checkpoint
        .claims
        .iter()
        .map(|(uid, entry)| Ok((uid, encode_entry(uid, entry)?)))
        .collect::<Result<Vec<_>, serde_json::Error>>()?;
    assemble(
        &checkpoint.boot_id,
        fragments
            .iter()
            .map(|(uid, bytes)| (*uid, bytes.as_slice())),
    )
}

/// One stored entry, `{"checksum": ..., "entry": {...}}`, pretty-printed
/// as it stands in the document (inside `entries`, so every line after the
/// first indented by four more spaces). An entry's fragment depends on its
/// UID and content alone: the store keeps the fragments of unchanged
/// entries from one write to the next, so a write serialises and checksums
/// only what changed.
pub(super) fn encode_entry(
    uid: &ClaimUid,
    entry: &ClaimEntry,
) -> Result<Vec<u8>, serde_json::Error> {
    let value = serde_json::to_value(entry)?;
    let mut stored = Map::new();
    stored.insert("checksum".into(), checksum(&uid.0, &value).into());
    stored.insert("entry".into(), value);
    let flat = serde_json::to_vec_pretty(&Value::Object(stored))?;
    // A JSON string holds no raw newline (it is escaped), so every newline
    // is between tokens: indenting after each one nests the whole object.
    let mut nested = Vec::with_capacity(flat.len() + flat.len() / 4);
    for &byte in &flat {
        nested.push(byte);
        if byte == b'\n' {
            nested.extend_from_slice(ENTRY_INDENT);
        }
    }
    Ok(nested)
}

/// The indentation of an entry's lines in the document.
const ENTRY_INDENT: &[u8] = b"    ";

/// The document around entry fragments ([`encode_entry`]) given in UID
/// order: the same bytes as pretty-printing the whole document as one JSON
/// value (keys sorted, two-space indentation), written by hand because the
/// fragments are already serialised.
pub(super) fn assemble<'a>(
    boot_id: &str,
    entries: impl Iterator<Item = (&'a ClaimUid, &'a [u8])>,
) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::with_capacity(4096);
    out.extend_from_slice(b"{\n  \"bootId\": ");
    serde_json::to_writer(&mut out, boot_id)?;
    out.extend_from_slice(b",\n  \"entries\": {");
    let mut any = false;
    for (uid, fragment) in entries {
        out.extend_from_slice(if any {
            b",\n".as_slice()
        } else {
            b"\n".as_slice()
        });
        out.extend_from_slice(ENTRY_INDENT);
        serde_json::to_writer(&mut out, &uid.0)?;
        out.extend_from_slice(b": ");
        out.extend_from_slice(fragment);
        any = true;
    }
    if any {
        out.extend_from_slice(b"\n  ");
    }
    out.extend_from_slice(b"},\n  \"version\": ");
    out.extend_from_slice(CURRENT_VERSION.to_string().as_bytes());
    out.extend_from_slice(b"\n}\n");
    Ok(out)
}

static VERSION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#""version"\s*:\s*([0-9]+)"#).expect("valid pattern"));
static BOOT_ID: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#""bootId"\s*:\s*"([^"\\]{1,128})""#).expect("valid pattern"));

/// `text` without its header fields (`"bootId": "..."`, `"version": 1`):
/// what is left of the text before the first entry key can only be entry
/// text (of an entry whose key was damaged) or the document's punctuation.
pub(super) fn without_header(text: &str) -> String {
    let text = BOOT_ID.replace_all(text, "");
    VERSION.replace_all(&text, "").into_owned()
}

/// One entry key found in a checkpoint's text.
pub(super) struct KeyAt<'a> {
    /// Where the key starts.
    pub at: usize,
    /// The claim UID.
    pub uid: &'a str,
    /// Where the stored value (`{"checksum": ...}`) starts.
    pub value_at: usize,
}

/// The entry keys in `text`, in order: each `"<uid>": {"checksum"` (a UID
/// of 1 to 256 bytes without quote, backslash or whitespace; whitespace
/// between the tokens allowed), so they are found in text that is no
/// longer JSON too.
///
/// Hand-written rather than a pattern: each key is found from the literal
/// `"checksum"` backwards, in one pass, where the pattern's capture groups
/// took most of the time of the damage test's thousands of opens.
pub(super) fn entry_keys(text: &str) -> Vec<KeyAt<'_>> {
    const ANCHOR: &str = "\"checksum\"";
    let bytes = text.as_bytes();
    let back_over_space = |mut at: usize| {
        while at > 0 && bytes[at - 1].is_ascii_whitespace() {
            at -= 1;
        }
        at
    };
    let mut keys = Vec::new();
    // Where the last key found ends: keys do not overlap.
    let mut taken = 0;
    for (anchor, _) in text.match_indices(ANCHOR) {
        let brace = back_over_space(anchor);
        if brace == 0 || bytes[brace - 1] != b'{' {
            continue;
        }
        let value_at = brace - 1;
        let colon = back_over_space(value_at);
        if colon == 0 || bytes[colon - 1] != b':' {
            continue;
        }
        let close = back_over_space(colon - 1);
        if close == 0 || bytes[close - 1] != b'"' {
            continue;
        }
        let end = close - 1;
        let mut start = end;
        while start > 0
            && end - start < MAX_UID_LEN
            && !matches!(bytes[start - 1], b'"' | b'\\')
            && !bytes[start - 1].is_ascii_whitespace()
        {
            start -= 1;
        }
        if start == end || start == 0 || bytes[start - 1] != b'"' || start - 1 < taken {
            continue;
        }
        keys.push(KeyAt {
            at: start - 1,
            uid: &text[start..end],
            value_at,
        });
        taken = anchor + ANCHOR.len();
    }
    keys
}

/// What could be taken from a version-1 file that is no longer JSON as a
/// whole (one damaged byte between entries, or in one of them).
#[derive(Debug)]
pub(super) struct Salvaged {
    /// The boot id the file names.
    pub boot_id: String,
    /// Entries whose stored value still parses and verifies.
    pub claims: BTreeMap<ClaimUid, ClaimEntry>,
    /// Entries whose value parses but does not verify.
    pub quarantined: Vec<Quarantined>,
    /// Entry keys whose value no longer parses.
    pub damaged: Vec<String>,
}

/// Takes every entry that still verifies out of the text of an unusable
/// file: each entry's value is parsed on its own, from its key on, and
/// verified by its checksum as in a whole file, so an entry taken is
/// exactly as written. Only for a file that names version 1 (and no other)
/// and one boot id: anything else is `None`, and nothing is taken.
pub(super) fn salvage(bytes: &[u8]) -> Option<Salvaged> {
    let text = String::from_utf8_lossy(bytes);
    let mut versions = VERSION.captures_iter(&text).map(|c| c[1].to_owned());
    if versions.next().as_deref() != Some("1") || versions.next().is_some() {
        return None;
    }
    let mut boot_ids = BOOT_ID.captures_iter(&text).map(|c| c[1].to_owned());
    let boot_id = boot_ids.next()?;
    if boot_ids.next().is_some() {
        return None;
    }
    let mut salvaged = Salvaged {
        boot_id,
        claims: BTreeMap::new(),
        quarantined: Vec::new(),
        damaged: Vec::new(),
    };
    let mut found: Vec<(&str, Value)> = Vec::new();
    for key in entry_keys(&text) {
        let mut values =
            serde_json::Deserializer::from_str(&text[key.value_at..]).into_iter::<Value>();
        match values.next() {
            Some(Ok(raw)) => found.push((key.uid, raw)),
            _ => salvaged.damaged.push(key.uid.to_owned()),
        }
    }
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(found.len());
    for (uid, _) in &found {
        *seen.entry(uid).or_default() += 1;
    }
    for (uid, raw) in &found {
        // A key twice is no file this plugin wrote: neither is trusted
        // (counted once: a hostile file may hold many keys).
        let decoded = if seen[uid] > 1 {
            Err("the key is in the file twice".to_owned())
        } else {
            decode_entry(uid, raw)
        };
        match decoded {
            Ok(entry) => {
                salvaged.claims.insert(ClaimUid::from(*uid), entry);
            }
            Err(reason) => salvaged.quarantined.push(Quarantined {
                uid: (*uid).to_owned(),
                reason,
                raw: raw.clone(),
            }),
        }
    }
    Some(salvaged)
}

/// Decodes a checkpoint file, converting older versions forward.
pub(super) fn decode(bytes: &[u8]) -> Decoded {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Decoded::Unusable("the file is empty".into());
    }
    let doc: Value = match serde_json::from_slice(bytes) {
        Ok(doc) => doc,
        Err(e) => return Decoded::Unusable(format!("not valid JSON: {e}")),
    };
    let Value::Object(mut doc) = doc else {
        return Decoded::Unusable("the top level is not a JSON object".into());
    };
    let version = match doc.get("version") {
        None => return Decoded::Unusable("no \"version\" field".into()),
        Some(v) => match v.as_u64() {
            Some(version) => version,
            None => {
                return Decoded::Unusable(format!(
                    "\"version\" is {v}, not a non-negative integer"
                ));
            }
        },
    };
    match version {
        1 => decode_v1(&mut doc),
        0 => Decoded::Unusable("version 0 was never written by any plugin".into()),
        newer => Decoded::Newer(newer),
    }
}

/// Decodes the body of a version-1 document.
fn decode_v1(doc: &mut Map<String, Value>) -> Decoded {
    let boot_id = match doc.get("bootId") {
        Some(Value::String(id)) if !id.is_empty() => id.clone(),
        Some(other) => {
            return Decoded::Unusable(format!("\"bootId\" is {other}, not a non-empty string"));
        }
        None => return Decoded::Unusable("no \"bootId\" field".into()),
    };
    let entries = match doc.remove("entries") {
        Some(Value::Object(entries)) => entries,
        Some(other) => {
            return Decoded::Unusable(format!(
                "\"entries\" is a {}, not an object",
                type_name(&other)
            ));
        }
        None => return Decoded::Unusable("no \"entries\" field".into()),
    };
    let mut claims = BTreeMap::new();
    let mut quarantined = Vec::new();
    for (uid, raw) in entries {
        match decode_entry(&uid, &raw) {
            Ok(entry) => {
                claims.insert(ClaimUid(uid), entry);
            }
            Err(reason) => quarantined.push(Quarantined { uid, reason, raw }),
        }
    }
    Decoded::Usable {
        boot_id,
        claims,
        quarantined,
    }
}

/// Verifies and decodes one stored entry.
fn decode_entry(uid: &str, raw: &Value) -> Result<ClaimEntry, String> {
    if uid.is_empty() || uid.len() > MAX_UID_LEN {
        return Err(format!(
            "claim UID is {} bytes long, outside 1..={MAX_UID_LEN}",
            uid.len()
        ));
    }
    let Value::Object(stored) = raw else {
        return Err(format!(
            "stored entry is a {}, not an object",
            type_name(raw)
        ));
    };
    let Some(Value::String(stored_sum)) = stored.get("checksum") else {
        return Err("no \"checksum\" string".into());
    };
    let Some(entry) = stored.get("entry") else {
        return Err("no \"entry\" field".into());
    };
    let computed = checksum(uid, entry);
    if *stored_sum != computed {
        return Err(format!(
            "checksum mismatch: stored {stored_sum}, computed {computed}"
        ));
    }
    serde_path_to_error::deserialize(entry.clone()).map_err(|e| {
        let path = e.path().to_string();
        format!(
            "checksum matches but the entry does not decode at {path}: {}",
            e.inner()
        )
    })
}

/// The checksum of one entry stored under `uid`.
pub(super) fn checksum(uid: &str, entry: &Value) -> String {
    let mut bytes = Vec::with_capacity(512);
    bytes.extend_from_slice(uid.as_bytes());
    bytes.push(0);
    canonical(entry, &mut bytes);
    format!("{:08x}", crc32fast::hash(&bytes))
}

/// Appends the canonical form of `value`: compact JSON with the keys of
/// every object sorted, independent of how the map type orders them.
fn canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(Value::from(key.as_str()).to_string().as_bytes());
                out.push(b':');
                canonical(&map[key], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(item, out);
            }
            out.push(b']');
        }
        scalar => out.extend_from_slice(scalar.to_string().as_bytes()),
    }
}

/// A JSON type's name, for messages.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}
