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
//! The ledger is written (atomically) before the checkpoint is rewritten
//! without the lost entries, so a crash in between loses nothing. Startup
//! recovery keeps what the ledger names and forgets names of things that
//! are gone (after a real reboot: all of them); an unprepare of a claim the
//! checkpoint does not know releases what the ledger names for it.
//!
//! The text is trusted no further than needed: a name is only ever used to
//! keep or release a thing that exists on the node under that exact name.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::format;
use super::{ClaimEntry, ClaimUid, DeviceKind};

/// File name of the ledger inside the plugin's state directory.
pub const LOST_FILE_NAME: &str = "checkpoint.lost.json";
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
    }

    /// Adds what a decoded entry records.
    fn add_entry(&mut self, entry: &ClaimEntry) {
        for record in entry.devices.iter().filter(|r| !r.admin) {
            let gpu = match &record.kind {
                DeviceKind::Gpu { uuid, .. } => uuid,
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

/// What the entries of an unusable checkpoint file name, by claim UID.
/// Names are found by pattern and belong to the entry key before them, so
/// text that is no longer JSON gives them up too; where the file still
/// parses, entries that decode add what they record.
pub(super) fn from_file(bytes: &[u8], source: &str, now: u64) -> BTreeMap<ClaimUid, LostClaim> {
    let text = String::from_utf8_lossy(bytes);
    let keys: Vec<(usize, &str)> = format::entry_keys(&text)
        .into_iter()
        .map(|k| (k.at, k.uid))
        .collect();
    let mut lost: BTreeMap<ClaimUid, LostClaim> = BTreeMap::new();
    for (i, (start, uid)) in keys.iter().enumerate() {
        let end = keys.get(i + 1).map_or(text.len(), |(next, _)| *next);
        lost.entry(ClaimUid::from(*uid))
            .or_insert_with(|| LostClaim::new(source, now))
            .add_names(&text[*start..end]);
    }
    if let Ok(doc) = serde_json::from_slice::<Value>(bytes)
        && let Some(Value::Object(entries)) = doc.get("entries")
    {
        for (uid, raw) in entries {
            lost.entry(ClaimUid(uid.clone()))
                .or_insert_with(|| LostClaim::new(source, now))
                .merge(from_stored(raw, source, now));
        }
    }
    lost
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
        let lost = from_file(text.as_bytes(), "moved aside", 7);
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
        let lost = from_file(hostile.as_bytes(), "s", 0);
        let x = &lost[&ClaimUid::from("x")];
        assert!(x.names_nothing(), "{x:?}");
        // Binary garbage and an empty file name nothing.
        assert!(from_file(&[0xff, 0x00, b'"', 0x80], "s", 0).is_empty());
        assert!(from_file(b"", "s", 0).is_empty());
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
