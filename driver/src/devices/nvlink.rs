//! NVLink domains: the connected components of the graph whose nodes are the
//! node's GPUs and the devices at the far end of their active NVLinks (peer
//! GPUs through bridges, or NVSwitches), restricted to GPUs. GPUs in one
//! domain can talk over NVLink; a GPU without active links is a domain of its
//! own. The domain id is a hash of the members' sorted UUIDs, so it is the same
//! on every restart as long as the topology is.

use std::collections::{BTreeMap, HashMap};

use gpu_nvml::NvLinkInfo;

/// The NVLink domain id of every GPU, in input order. Each input is (UUID,
/// PCI bus id, active links).
pub fn nvlink_domains(gpus: &[(&str, &str, &[NvLinkInfo])]) -> Vec<String> {
    let mut sets = DisjointSets::new(gpus.len());
    let by_bus: HashMap<String, usize> = gpus
        .iter()
        .enumerate()
        .map(|(i, (_, bus, _))| (bus.to_ascii_lowercase(), i))
        .collect();
    // Far ends that are not GPUs of this node (NVSwitches, or GPUs that were
    // left out): extra nodes of the graph, numbered after the GPUs.
    let mut others: HashMap<String, usize> = HashMap::new();
    for (i, (_, _, links)) in gpus.iter().enumerate() {
        for link in *links {
            let remote = link.remote_pci_bus_id.to_ascii_lowercase();
            let node = if let Some(&j) = by_bus.get(&remote) {
                j
            } else {
                let next = gpus.len() + others.len();
                *others.entry(remote).or_insert(next)
            };
            sets.union(i, node);
        }
    }
    let mut members: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for (i, (uuid, _, _)) in gpus.iter().enumerate() {
        members.entry(sets.find(i)).or_default().push(uuid);
    }
    let ids: HashMap<usize, String> = members
        .into_iter()
        .map(|(root, uuids)| (root, domain_id(&uuids)))
        .collect();
    (0..gpus.len())
        .map(|i| ids[&sets.find(i)].clone())
        .collect()
}

/// The id of the NVLink domain made of the GPUs with these UUIDs (any order):
/// 16 hex digits of the 64-bit FNV-1a hash of the sorted UUIDs joined by
/// newlines. FNV-1a is fixed by its definition, unlike std's hasher, so the id
/// never changes between builds.
pub fn domain_id(uuids: &[&str]) -> String {
    let mut sorted: Vec<&str> = uuids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, uuid) in sorted.iter().enumerate() {
        if i > 0 {
            hash = fnv_step(hash, b'\n');
        }
        for &b in uuid.as_bytes() {
            hash = fnv_step(hash, b);
        }
    }
    format!("{hash:016x}")
}

fn fnv_step(hash: u64, byte: u8) -> u64 {
    (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
}

/// Union-find over a growing set of nodes.
struct DisjointSets {
    parent: Vec<usize>,
}

impl DisjointSets {
    fn new(n: usize) -> Self {
        Self {
            parent: (0..n).collect(),
        }
    }

    fn find(&mut self, mut x: usize) -> usize {
        self.grow(x);
        while self.parent[x] != x {
            self.parent[x] = self.parent[self.parent[x]];
            x = self.parent[x];
        }
        x
    }

    fn union(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.find(a), self.find(b));
        // The smaller index wins, so GPUs (numbered first) stay roots.
        let (lo, hi) = if ra < rb { (ra, rb) } else { (rb, ra) };
        self.parent[hi] = lo;
    }

    fn grow(&mut self, x: usize) {
        while self.parent.len() <= x {
            let n = self.parent.len();
            self.parent.push(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(remote: &str) -> NvLinkInfo {
        NvLinkInfo {
            link: 0,
            remote_pci_bus_id: remote.to_owned(),
        }
    }

    #[test]
    fn bridged_pairs_form_two_domains() {
        let l0 = vec![link("0000:02:00.0"), link("0000:02:00.0")];
        let l1 = vec![link("0000:01:00.0")];
        let l2 = vec![link("0000:04:00.0")];
        let l3 = vec![link("0000:03:00.0")];
        let gpus = [
            ("GPU-a", "0000:01:00.0", l0.as_slice()),
            ("GPU-b", "0000:02:00.0", l1.as_slice()),
            ("GPU-c", "0000:03:00.0", l2.as_slice()),
            ("GPU-d", "0000:04:00.0", l3.as_slice()),
        ];
        let d = nvlink_domains(&gpus);
        assert_eq!(d[0], d[1]);
        assert_eq!(d[2], d[3]);
        assert_ne!(d[1], d[2]);
        assert_eq!(d[0], domain_id(&["GPU-b", "GPU-a"]));
    }

    #[test]
    fn switches_join_every_gpu_and_unlinked_gpus_stand_alone() {
        let sw = vec![link("0000:F0:00.0"), link("0000:f1:00.0")];
        let sw2 = vec![link("0000:f1:00.0")];
        let none: Vec<NvLinkInfo> = vec![];
        let gpus = [
            ("GPU-a", "0000:01:00.0", sw.as_slice()),
            ("GPU-b", "0000:02:00.0", sw2.as_slice()),
            ("GPU-c", "0000:03:00.0", none.as_slice()),
            ("GPU-d", "0000:04:00.0", none.as_slice()),
        ];
        let d = nvlink_domains(&gpus);
        assert_eq!(d[0], d[1]);
        assert_ne!(d[2], d[3]);
        assert_ne!(d[0], d[2]);
        assert_eq!(d[2], domain_id(&["GPU-c"]));
    }

    #[test]
    fn domain_ids_are_stable_and_order_independent() {
        // Fixed value: the id must never change between releases.
        assert_eq!(domain_id(&["GPU-a"]), domain_id(&["GPU-a", "GPU-a"]));
        assert_eq!(domain_id(&["x", "y"]), domain_id(&["y", "x"]));
        assert_ne!(domain_id(&["x", "y"]), domain_id(&["xy"]));
        // FNV-1a 64 of the empty input is its offset basis.
        assert_eq!(domain_id(&[]), "cbf29ce484222325");
        // FNV-1a 64 of "a" (published test vector).
        assert_eq!(domain_id(&["a"]), "af63dc4c8601ec8c");
    }

    #[test]
    fn a_link_to_a_missing_gpu_joins_nothing() {
        let to_gone = vec![link("0000:09:00.0")];
        let none: Vec<NvLinkInfo> = vec![];
        let gpus = [
            ("GPU-a", "0000:01:00.0", to_gone.as_slice()),
            ("GPU-b", "0000:02:00.0", none.as_slice()),
        ];
        let d = nvlink_domains(&gpus);
        assert_ne!(d[0], d[1]);
        assert_eq!(d[0], domain_id(&["GPU-a"]));
    }
}
