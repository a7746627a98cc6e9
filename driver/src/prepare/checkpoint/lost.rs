//! Claims whose checkpoint entries were lost, and what the lost text still
//! names: the ledger (`checkpoint.lost.json`).
//!
//! An entry is lost when it is quarantined, when the whole file is moved
//! aside, or when the file reads as an earlier boot's (a damaged boot id
//! reads so too). Kubelet still counts such a claim as prepared: it does not
//! prepare it again while its pods run, and it unprepares it when they are
//! done. So what the entry had set up must stay for the running pods, not
//! be swept at the start. The ledger keeps, per claim UID, the MIG devices
//! and MPS daemons its text names (found by pattern, so a damaged entry, or
//! a file that is no longer JSON, still gives them up) and, when the entry
//! still decodes, the compute modes and time slices it set. The claim's CDI
//! spec is named by its UID.
//!
//! Every name in a damaged file outside the entries that verified is kept
//! ([`from_file`]): the text is cut at each entry key, and a key whose entry
//! did not verify gets its piece; a verified entry owns only what its own
//! value names, and the rest (the text of an entry whose key was damaged
//! reads as the tail of the entry before it; text before the first key) is
//! kept under [`UNATTRIBUTED`], a key that is no claim's UID. A damaged byte
//! inside a name leaves one the node does not have: each lost claim also
//! keeps its damaged text until startup recovery has looked in it for the
//! names on the node, one byte off at most ([`LostClaim::holds_nearly`]).
//! A file over the size limit is not read whole: every name in it (up to
//! [`MAX_SCAN_BYTES`]) is kept unattributed.
//!
//! The ledger is written (atomically) before the checkpoint is rewritten
//! without the lost entries, so a crash in between loses nothing. Startup
//! recovery keeps what the ledger names and forgets names of things that
//! are gone (after a real reboot: all of them); an unprepare of a claim the
//! checkpoint does not know releases what the ledger names for it. The
//! unattributed names are no claim's to release: a MIG device among them
//! stays until it is gone (a reboot) or the ledger is removed by hand; an
//! MPS daemon among them goes at the unprepare of the claim its id names
//! ([`is_daemon_of`]: the plugin builds a daemon's id from its claim's UID,
//! so the id says whose it is however damaged the text around it).
//!
//! The text is trusted no further than needed: a name is only ever used to
//! keep or release a thing that exists on the node under that exact name.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ClaimEntry, ClaimUid, DeviceKind};
use super::{format, near};

/// File name of the ledger inside the plugin's state directory.
pub const LOST_FILE_NAME: &str = "checkpoint.lost.json";
/// The ledger key of names found in damaged checkpoint text that no claim
/// can be said to own (see [`from_file`]). It holds a space: never an entry
/// key of a checkpoint (a key is found without whitespace) nor a
/// Kubernetes UID, so no claim's unprepare can release it.
pub const UNATTRIBUTED: &str = "unattributed names";
/// The largest ledger file read (256 MiB): it holds the damaged text of a
/// checkpoint (at most [`format::MAX_FILE_BYTES`], each byte one
/// character, at most two once escaped in JSON) until startup recovery has
/// looked in it, and the names, which come from that text.
pub const MAX_LEDGER_BYTES: u64 = 4 * format::MAX_FILE_BYTES;
/// The ledger's format version.
const LEDGER_VERSION: u64 = 1;

/// What the text of one lost entry names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LostClaim {
    /// Where the entry was lost, for humans.
    pub source: String,
    /// When it was lost.
    #[serde(default)]
    pub lost_at_unix_seconds: u64,
    /// MIG device UUIDs (`MIG-...`).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub mig_uuids: BTreeSet<String>,
    /// MPS daemon ids.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub mps_daemons: BTreeSet<String>,
    /// Compute modes it set: GPU UUID to the mode to restore (only from an
    /// entry that still decodes).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub compute_modes: BTreeMap<String, String>,
    /// GPUs whose time slice it set (likewise).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub time_slices: BTreeSet<String>,
    /// The lost text itself ([`near::printable`]), until startup recovery
    /// has looked in it for the names of MIG devices and MPS daemons on
    /// the node ([`LostClaim::holds_nearly`]): a damaged byte inside a name
    /// leaves one the patterns miss or the node does not have.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub damaged_text: String,
}

impl LostClaim {
    fn new(source: &str, now: u64) -> Self {
        Self {
            source: source.to_owned(),
            lost_at_unix_seconds: now,
            ..Self::default()
        }
    }

    /// Adds what `other` names (a claim lost twice: from the ledger and
    /// again now).
    pub(super) fn merge(&mut self, other: Self) {
        if !other.source.is_empty() && !self.source.contains(&other.source) {
            self.source = if self.source.is_empty() {
                other.source
            } else {
                format!("{}; {}", self.source, other.source)
            };
        }
        self.lost_at_unix_seconds = self.lost_at_unix_seconds.max(other.lost_at_unix_seconds);
        self.mig_uuids.extend(other.mig_uuids);
        self.mps_daemons.extend(other.mps_daemons);
        for (gpu, previous) in other.compute_modes {
            self.compute_modes.entry(gpu).or_insert(previous);
        }
        self.time_slices.extend(other.time_slices);
        if !other.damaged_text.is_empty() && !self.damaged_text.contains(&other.damaged_text) {
            if !self.damaged_text.is_empty() {
                self.damaged_text.push('\n');
            }
            self.damaged_text.push_str(&other.damaged_text);
        }
    }

    /// Whether its damaged text holds `name`, one byte changed, dropped or
    /// added at most (see [`near`]).
    pub fn holds_nearly(&self, name: &str) -> bool {
        near::holds_nearly(&self.damaged_text, name)
    }

    /// Adds what a decoded entry records.
    fn add_entry(&mut self, entry: &ClaimEntry) {
        for record in entry.devices.iter().filter(|r| !r.admin) {
            let gpu = match &record.kind {
                DeviceKind::Gpu { uuid, .. } | DeviceKind::Vfio { uuid, .. } => uuid,
                DeviceKind::Mig {
                    parent_uuid,
                    mig_uuid,
                    ..
                } => {
                    self.mig_uuids.extend(mig_uuid.clone());
                    parent_uuid
                }
            };
            if let Some(daemon) = &record.sharing.mps_daemon {
                self.mps_daemons.insert(daemon.id.clone());
            }
            if let Some(change) = &record.sharing.compute_mode {
                self.compute_modes
                    .entry(gpu.clone())
                    .or_insert_with(|| change.previous.clone());
            }
            if record
                .sharing
                .time_slice_interval
                .as_deref()
                .is_some_and(|i| i != "Default")
            {
                self.time_slices.insert(gpu.clone());
            }
        }
    }

    /// Adds the names found in `text` by pattern.
    fn add_names(&mut self, text: &str) {
        self.mig_uuids
            .extend(MIG_UUID.find_iter(text).map(|m| m.as_str().to_owned()));
        self.mps_daemons
            .extend(DAEMON_ID.captures_iter(text).map(|c| c[1].to_owned()));
    }

    /// Whether it names nothing that could still exist (its CDI spec
    /// aside).
    pub fn names_nothing(&self) -> bool {
        self.mig_uuids.is_empty() && self.mps_daemons.is_empty()
    }
}

/// A MIG device UUID, in either of NVIDIA's forms (`MIG-<uuid>`, and the
/// older `MIG-GPU-<uuid>/<gi>/<ci>`).
static MIG_UUID: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"MIG-(?:GPU-)?[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}(?:/[0-9]{1,3}/[0-9]{1,3})?")
        .expect("valid pattern")
});
/// An MPS daemon record's id (`"id"` is no other record's field name).
static DAEMON_ID: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#""id"\s*:\s*"([A-Za-z0-9][A-Za-z0-9._-]{0,127})""#).expect("valid pattern")
});
/// What a quarantined entry, stored as `raw` under `uid`, names.
pub(super) fn from_stored(raw: &Value, source: &str, now: u64) -> LostClaim {
    let mut lost = LostClaim::new(source, now);
    lost.add_names(&raw.to_string());
    if let Some(entry) = raw
        .get("entry")
        .and_then(|e| serde_json::from_value::<ClaimEntry>(e.clone()).ok())
    {
        lost.add_entry(&entry);
    }
    lost
}

/// What a verified entry of a file set aside (an earlier boot's) names.
pub(super) fn from_entry(entry: &ClaimEntry, source: &str, now: u64) -> LostClaim {
    let mut lost = LostClaim::new(source, now);
    lost.add_entry(entry);
    lost
}

/// How often each name occurs in some text (MIG device UUIDs and MPS
/// daemon ids, found by pattern).
#[derive(Default)]
struct Counted {
    mig: BTreeMap<String, usize>,
    daemons: BTreeMap<String, usize>,
}

impl Counted {
    fn add(&mut self, text: &str) {
        for m in MIG_UUID.find_iter(text) {
            *self.mig.entry(m.as_str().to_owned()).or_default() += 1;
        }
        for c in DAEMON_ID.captures_iter(text) {
            *self.daemons.entry(c[1].to_owned()).or_default() += 1;
        }
    }

    /// Takes away the occurrences in `owned` (what a verified entry's own
    /// text holds), each once.
    fn subtract(&mut self, owned: &Counted) {
        for (mine, theirs) in [
            (&mut self.mig, &owned.mig),
            (&mut self.daemons, &owned.daemons),
        ] {
            for (name, n) in theirs {
                if let Some(count) = mine.get_mut(name) {
                    *count = count.saturating_sub(*n);
                }
            }
            mine.retain(|_, count| *count > 0);
        }
    }

    /// Adds every name counted to `claim`.
    fn into_claim(self, claim: &mut LostClaim) {
        claim.mig_uuids.extend(self.mig.into_keys());
        claim.mps_daemons.extend(self.daemons.into_keys());
    }
}

/// The names a verified entry's own text holds, counted as in the file.
fn counted_entry(entry: &ClaimEntry) -> Counted {
    let mut counted = Counted::default();
    // The compact form names the same strings as the stored pretty one.
    if let Ok(text) = serde_json::to_string(entry) {
        counted.add(&text);
    }
    counted
}

/// What the text of a checkpoint file names outside the entries that
/// verified (`verified`: the entries loaded from it), by claim UID.
///
/// The text is cut at each entry key (found by pattern, so in text that
/// is no longer JSON too): the piece from a key to the next is the key's.
/// A key whose entry did not verify (damaged, quarantined, a key twice, or
/// every key of a file set aside whole) gets every name in its piece, and
/// the piece itself as its damaged text. A verified entry owns only what
/// its own value names: the names its piece holds beyond that (the text of
/// an entry whose key was damaged reads as the tail of the entry before
/// it) go to [`UNATTRIBUTED`], as do names before the first key, and so
/// does the text outside its value. Where the file still parses, the
/// entries under keys that did not verify add what they record (modes,
/// time slices). `damaged`: the file is known to be (it is not JSON).
pub(super) fn from_file(
    bytes: &[u8],
    damaged: bool,
    verified: &BTreeMap<ClaimUid, ClaimEntry>,
    source: &str,
    now: u64,
) -> BTreeMap<ClaimUid, LostClaim> {
    // One character per byte: offsets are the file's, and a damaged byte
    // stays one character for the near match.
    let text = near::printable(bytes);
    let keys: Vec<(usize, &str, usize)> = format::entry_keys(&text)
        .into_iter()
        .map(|k| (k.at, k.uid, k.value_at))
        .collect();
    // The text outside the entries is kept only from a file known to be
    // damaged, or with a key that did not verify or was there twice.
    let mut damaged = damaged
        || keys.len() != verified.len()
        || keys
            .iter()
            .any(|(_, uid, _)| !verified.contains_key(&ClaimUid::from(*uid)));
    let mut unattributed = Counted::default();
    let mut unattributed_text = String::new();
    let head = &text[..keys.first().map_or(text.len(), |(at, _, _)| *at)];
    unattributed.add(head);
    unattributed_text.push_str(&format::without_header(head));
    let mut pieces: BTreeMap<&str, (Counted, String)> = BTreeMap::new();
    for (i, (start, uid, value_at)) in keys.iter().enumerate() {
        let end = keys.get(i + 1).map_or(text.len(), |(next, _, _)| *next);
        let piece = pieces.entry(uid).or_default();
        piece.0.add(&text[*start..end]);
        if verified.contains_key(&ClaimUid::from(*uid)) {
            unattributed_text.push_str(&outside_value(&text[*value_at..end]));
        } else {
            piece.1.push_str(&text[*start..end]);
        }
    }
    let mut lost: BTreeMap<ClaimUid, LostClaim> = BTreeMap::new();
    for (uid, (mut counted, piece)) in pieces {
        if let Some(entry) = verified.get(&ClaimUid::from(uid)) {
            // Owned once, however often its key is in the text.
            counted.subtract(&counted_entry(entry));
            damaged |= !counted.mig.is_empty() || !counted.daemons.is_empty();
            for (name, n) in counted.mig {
                *unattributed.mig.entry(name).or_default() += n;
            }
            for (name, n) in counted.daemons {
                *unattributed.daemons.entry(name).or_default() += n;
            }
        } else {
            let claim = lost
                .entry(ClaimUid::from(uid))
                .or_insert_with(|| LostClaim::new(source, now));
            counted.into_claim(claim);
            claim.damaged_text = piece;
        }
    }
    if let Ok(doc) = serde_json::from_slice::<Value>(bytes)
        && let Some(Value::Object(entries)) = doc.get("entries")
    {
        for (uid, raw) in entries {
            let uid = ClaimUid(uid.clone());
            if verified.contains_key(&uid) {
                continue;
            }
            lost.entry(uid)
                .or_insert_with(|| LostClaim::new(source, now))
                .merge(from_stored(raw, source, now));
        }
    }
    let mut names = LostClaim::new(source, now);
    unattributed.into_claim(&mut names);
    if damaged && may_hold_a_name(&unattributed_text) {
        names.damaged_text = unattributed_text;
    }
    if !names.names_nothing() || !names.damaged_text.is_empty() {
        lost.insert(ClaimUid::from(UNATTRIBUTED), names);
    }
    lost
}

/// The text of a verified entry's piece (from its value on) that is not
/// its value: what follows the value's end, and any field of the value
/// besides `checksum` and `entry` (a value whose closing brace was lost
/// takes in the text after it). All of it when the value does not parse.
fn outside_value(piece: &str) -> String {
    let mut values = serde_json::Deserializer::from_str(piece).into_iter::<Value>();
    let Some(Ok(value)) = values.next() else {
        return piece.to_owned();
    };
    let mut outside = piece[values.byte_offset()..].to_owned();
    if let Value::Object(fields) = value {
        for (name, field) in fields {
            if name != "checksum" && name != "entry" {
                outside.push(' ');
                outside.push_str(&field.to_string());
            }
        }
    }
    outside
}

/// Whether `text` has a run of name characters long enough to be part of
/// a MIG device UUID or an MPS daemon id with one byte damaged.
fn may_hold_a_name(text: &str) -> bool {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_'))
        .any(|run| run.len() >= 8)
}

/// What a file too large to be read whole names, all of it
/// [`UNATTRIBUTED`]: read in pieces (the last bytes of each read again
/// with the next, so a name across a boundary is found), up to
/// [`MAX_SCAN_BYTES`]. Memory stays at one piece.
pub(super) fn from_large_file(path: &Path, source: &str, now: u64) -> io::Result<LostClaim> {
    /// Bytes read at a time.
    const PIECE: usize = 1 << 20;
    /// Bytes read again with the next piece: longer than any name.
    const OVERLAP: usize = 512;
    let mut claim = LostClaim::new(source, now);
    let mut file = File::open(path)?.take(MAX_SCAN_BYTES);
    let mut buf = vec![0u8; PIECE + OVERLAP];
    let mut kept = 0;
    loop {
        let n = file.read(&mut buf[kept..])?;
        if n == 0 {
            break;
        }
        let end = kept + n;
        claim.add_names(&String::from_utf8_lossy(&buf[..end]));
        kept = OVERLAP.min(end);
        buf.copy_within(end - kept..end, 0);
    }
    Ok(claim)
}

/// The most of a file over the checkpoint's size limit that is scanned
/// for names (1 GiB): a file this plugin wrote is far below the limit, so
/// such a file is damage, and what it names past this is not kept.
pub const MAX_SCAN_BYTES: u64 = 1 << 30;

/// Whether `id` is the id of an MPS daemon this plugin starts for claim
/// `uid` (`claim-<uid>-<n>`, see [`daemon_id`]): the id itself says which
/// claim it serves, however damaged the text it was found in.
pub fn is_daemon_of(id: &str, uid: &ClaimUid) -> bool {
    !uid.0.is_empty()
        && id
            .strip_prefix("claim-")
            .and_then(|rest| rest.strip_prefix(uid.0.as_str()))
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The id of the `n`-th MPS daemon the plugin starts for claim `uid`.
pub fn daemon_id(uid: &ClaimUid, n: usize) -> String {
    format!("claim-{}-{n}", uid.0)
}

/// The ledger file's content.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Ledger {
    version: u64,
    #[serde(default)]
    claims: BTreeMap<ClaimUid, LostClaim>,
}

/// Decodes the ledger file; the error says why it cannot be used.
pub(super) fn decode_ledger(bytes: &[u8]) -> Result<BTreeMap<ClaimUid, LostClaim>, String> {
    let ledger: Ledger = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if ledger.version != LEDGER_VERSION {
        return Err(format!(
            "version {} (this plugin reads version {LEDGER_VERSION})",
            ledger.version
        ));
    }
    Ok(ledger.claims)
}

/// Encodes the ledger file.
pub(super) fn encode_ledger(
    claims: &BTreeMap<ClaimUid, LostClaim>,
) -> Result<Vec<u8>, serde_json::Error> {
    #[derive(Serialize)]
    struct LedgerRef<'a> {
        version: u64,
        claims: &'a BTreeMap<ClaimUid, LostClaim>,
    }
    serde_json::to_vec_pretty(&LedgerRef {
        version: LEDGER_VERSION,
        claims,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIG_A: &str = "MIG-aaaaaaaa-0000-4000-8000-000000000001";
    const MIG_B: &str = "MIG-bbbbbbbb-0000-4000-8000-000000000002";

    fn stored(uid: &str, body: &str) -> String {
        format!(r#"    "{uid}": {{"checksum": "00000000", "entry": {body}}}"#)
    }

    #[test]
    fn names_belong_to_the_entry_key_before_them_even_in_broken_json() {
        let text = format!(
            "{{\n  \"bootId\": \"b\",\n  \"entries\": {{\n{},\n{}\n  }},\n  \"vers",
            stored(
                "uid-a",
                &format!(
                    r#"{{"devices": [{{"kind": {{"migUuid": "{MIG_A}"}}, "sharing": {{"mpsDaemon": {{"id": "claim-uid-a-0"}}}}}}]"#
                )
            ),
            // Damaged: a quote is gone, and the file is no longer JSON.
            stored(
                "uid-b",
                &format!(
                    r#"{{"devices": [{{"kind": {{"migUuid": "{MIG_B}}}, "sharing": {{"mpsDaemon": {{"id": "shared-gpu3"}}}}"#
                )
            ),
        );
        assert!(serde_json::from_str::<Value>(&text).is_err());
        let lost = from_file(text.as_bytes(), true, &BTreeMap::new(), "moved aside", 7);
        assert_eq!(lost.len(), 2, "{lost:?}");
        let a = &lost[&ClaimUid::from("uid-a")];
        assert_eq!(a.mig_uuids, BTreeSet::from([MIG_A.to_owned()]));
        assert_eq!(a.mps_daemons, BTreeSet::from(["claim-uid-a-0".to_owned()]));
        assert_eq!(
            (a.source.as_str(), a.lost_at_unix_seconds),
            ("moved aside", 7)
        );
        let b = &lost[&ClaimUid::from("uid-b")];
        assert_eq!(b.mig_uuids, BTreeSet::from([MIG_B.to_owned()]));
        assert_eq!(b.mps_daemons, BTreeSet::from(["shared-gpu3".to_owned()]));
    }

    #[test]
    fn a_decodable_entry_adds_its_modes_and_time_slices_and_skips_admin_devices() {
        let entry = serde_json::json!({
            "state": "PrepareCompleted", "namespace": "ns", "name": "n",
            "devices": [
                {"kind": {"type": "gpu", "uuid": "GPU-1", "minor": 1}, "pool": "p", "device": "gpu-1",
                 "sharing": {"timeSliceInterval": "Long",
                             "computeMode": {"set": "ExclusiveProcess", "previous": "Default"},
                             "mpsDaemon": {"id": "claim-x-0"}}},
                {"kind": {"type": "gpu", "uuid": "GPU-2", "minor": 2}, "pool": "p", "device": "gpu-2",
                 "admin": true, "sharing": {"timeSliceInterval": "Long"}},
                {"kind": {"type": "gpu", "uuid": "GPU-3", "minor": 3}, "pool": "p", "device": "gpu-3",
                 "sharing": {"timeSliceInterval": "Default"}},
                {"kind": {"type": "mig", "parentUuid": "GPU-4", "parentMinor": 4, "profileId": 9,
                          "placementStart": 0, "placementSize": 1, "migUuid": MIG_A, "created": false},
                 "pool": "p", "device": "gpu-4-mig"}
            ]
        });
        let lost = from_stored(
            &serde_json::json!({"checksum": "bad", "entry": entry}),
            "quarantined",
            1,
        );
        assert_eq!(
            lost.compute_modes,
            BTreeMap::from([("GPU-1".to_owned(), "Default".to_owned())])
        );
        assert_eq!(lost.time_slices, BTreeSet::from(["GPU-1".to_owned()]));
        assert_eq!(lost.mps_daemons, BTreeSet::from(["claim-x-0".to_owned()]));
        // Found, not created: MIG devices are only released with dynamic
        // MIG, where every device of a claim was created for it.
        assert_eq!(lost.mig_uuids, BTreeSet::from([MIG_A.to_owned()]));
    }

    #[test]
    fn hostile_text_yields_only_well_formed_names() {
        let hostile = format!(
            r#""x": {{"checksum": "", "id": "../../etc", "id": "-rf", "id": "{}", "mig": "MIG-zzzzzzzz-0000-4000-8000-000000000001"}}"#,
            "a".repeat(300)
        );
        let lost = from_file(hostile.as_bytes(), true, &BTreeMap::new(), "s", 0);
        let x = &lost[&ClaimUid::from("x")];
        assert!(x.names_nothing(), "{x:?}");
        // Binary garbage and an empty file name nothing.
        assert!(from_file(&[0xff, 0x00, b'"', 0x80], true, &BTreeMap::new(), "s", 0).is_empty());
        assert!(from_file(b"", true, &BTreeMap::new(), "s", 0).is_empty());
    }

    #[test]
    fn the_ledger_round_trips_and_refuses_other_versions_and_shapes() {
        let mut claim = LostClaim::new("quarantined: checksum mismatch", 5);
        claim.mig_uuids.insert(MIG_A.into());
        claim.compute_modes.insert("GPU-1".into(), "Default".into());
        let claims = BTreeMap::from([(ClaimUid::from("uid-a"), claim)]);
        let bytes = encode_ledger(&claims).unwrap();
        assert_eq!(decode_ledger(&bytes).unwrap(), claims);
        for (bad, reason) in [
            (r#"{"version": 2, "claims": {}}"#, "version 2"),
            (r#"{"claims": {}}"#, "missing field `version`"),
            (r#"{"version": 1, "claims": []}"#, "invalid type"),
            (
                r#"{"version": 1, "claims": {"u": {"migUuids": 3}}}"#,
                "invalid type",
            ),
            ("not json", "expected"),
        ] {
            let got = decode_ledger(bad.as_bytes());
            assert!(
                matches!(&got, Err(e) if e.contains(reason)),
                "{bad}: {got:?}"
            );
        }
    }

    #[test]
    fn merging_keeps_every_name_and_the_first_mode_to_restore() {
        let mut first = LostClaim::new("quarantined", 1);
        first.compute_modes.insert("GPU-1".into(), "Default".into());
        first.mig_uuids.insert(MIG_A.into());
        let mut again = LostClaim::new("moved aside", 9);
        again
            .compute_modes
            .insert("GPU-1".into(), "ExclusiveProcess".into());
        again.mig_uuids.insert(MIG_B.into());
        first.merge(again);
        assert_eq!(first.source, "quarantined; moved aside");
        assert_eq!(first.lost_at_unix_seconds, 9);
        assert_eq!(first.compute_modes["GPU-1"], "Default");
        assert_eq!(first.mig_uuids.len(), 2);
    }
}
