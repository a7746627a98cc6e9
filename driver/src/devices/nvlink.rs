//! NVLink domains: the sets of the node's GPUs that can reach each other
//! over NVLink, directly or through NVSwitches. A GPU without active links,
//! or whose links reach no other GPU of the node, is a domain of its own.
//!
//! What joins two GPUs:
//! - a direct link (bridge): a link whose far end has the other GPU's bus id;
//! - switches: GPUs with switch links in the same fabric (cluster UUID and
//!   clique id of NVML's GPU fabric info), else the pairs NVML's P2P status
//!   over NVLink calls OK.
//!
//! Never the far end of a switch link: NVML reports the same sentinel bus id
//! (`FFFFFFFF:FF:FF.0`) for every one, and a switch of a multi-node fabric
//! may serve GPUs that cannot talk to each other (other partitions or
//! cliques). The domain id is a hash of the members' sorted UUIDs, so it is
//! the same on every restart as long as the topology is.

use std::collections::{BTreeMap, HashMap};

use gpu_nvml::{FabricInfo, GpuInfo, NvLinkRemote};

/// The NVLink domain id of every GPU, in input order.
pub fn nvlink_domains(gpus: &[&GpuInfo]) -> Vec<String> {
    let mut sets = DisjointSets::new(gpus.len());
    let by_bus: HashMap<String, usize> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| (g.pci_bus_id.to_ascii_lowercase(), i))
        .collect();
    let by_uuid: HashMap<&str, usize> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| (g.uuid.as_str(), i))
        .collect();
    let mut cliques: HashMap<&FabricInfo, usize> = HashMap::new();
    for (i, gpu) in gpus.iter().enumerate() {
        // Direct links to another GPU of the node.
        for link in &gpu.nvlinks {
            if link.remote == NvLinkRemote::Switch {
                continue;
            }
            if let Some(&j) = link
                .remote_pci_bus_id
                .as_deref()
                .and_then(|bus| by_bus.get(&bus.to_ascii_lowercase()))
                && j != i
            {
                sets.union(i, j);
            }
        }
        if !gpu.nvlinks.iter().any(|l| l.remote == NvLinkRemote::Switch) {
            continue;
        }
        // Through switches: the fabric, else P2P over NVLink.
        if let Some(fabric) = &gpu.fabric {
            let first = *cliques.entry(fabric).or_insert(i);
            sets.union(first, i);
        }
        // A peer without an active link cannot be reached over NVLink,
        // whatever a stale P2P answer said.
        for peer in &gpu.nvlink_p2p_peers {
            if let Some(&j) = by_uuid.get(peer.as_str())
                && !gpus[j].nvlinks.is_empty()
            {
                sets.union(i, j);
            }
        }
    }
    let mut members: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for (i, gpu) in gpus.iter().enumerate() {
        members.entry(sets.find(i)).or_default().push(&gpu.uuid);
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
    format!("{:016x}", fnv1a(sorted.join("\n").as_bytes()))
}

/// FNV-1a, 64 bits: a hash fixed by its definition (unlike std's hasher),
/// for names that must stay the same across builds and versions.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Union-find over the GPUs.
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
        while self.parent[x] != x {
            self.parent[x] = self.parent[self.parent[x]];
            x = self.parent[x];
        }
        x
    }

    fn union(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.find(a), self.find(b));
        // The smaller index wins, so a domain's root is its first GPU.
        let (lo, hi) = if ra < rb { (ra, rb) } else { (rb, ra) };
        self.parent[hi] = lo;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::fixtures::{HOPPER, gpu};
    use gpu_nvml::NvLinkInfo;

    const SENTINEL: &str = "ffffffff:ff:ff.0";

    /// GPU `index` (bus `0000:<index+1>:00.0`) with these links.
    fn with_links(index: u32, links: Vec<NvLinkInfo>) -> GpuInfo {
        let mut g = gpu(index, HOPPER, None, &[]).info;
        g.nvlinks = links;
        g
    }

    fn bridge(to: u32, n: u32) -> Vec<NvLinkInfo> {
        (0..n)
            .map(|link| NvLinkInfo {
                link,
                remote: NvLinkRemote::Gpu,
                remote_pci_bus_id: Some(format!("0000:{:02x}:00.0", to + 1)),
            })
            .collect()
    }

    fn switch_links(n: u32) -> Vec<NvLinkInfo> {
        (0..n)
            .map(|link| NvLinkInfo {
                link,
                remote: NvLinkRemote::Switch,
                remote_pci_bus_id: None,
            })
            .collect()
    }

    fn fabric(clique_id: u32) -> FabricInfo {
        FabricInfo {
            cluster_uuid: "09b319a2-e553-400e-b9ab-1ff0bd7d7daf".into(),
            clique_id,
        }
    }

    fn domains(gpus: &[GpuInfo]) -> Vec<String> {
        nvlink_domains(&gpus.iter().collect::<Vec<_>>())
    }

    fn uuids(gpus: &[GpuInfo], members: &[usize]) -> String {
        domain_id(
            &members
                .iter()
                .map(|&i| gpus[i].uuid.as_str())
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn bridged_pairs_form_two_domains() {
        let gpus = [
            with_links(0, bridge(1, 4)),
            with_links(1, bridge(0, 4)),
            with_links(2, bridge(3, 4)),
            with_links(3, bridge(2, 4)),
        ];
        let d = domains(&gpus);
        assert_eq!(d[0], d[1]);
        assert_eq!(d[2], d[3]);
        assert_ne!(d[1], d[2]);
        assert_eq!(d[0], uuids(&gpus, &[1, 0]));
    }

    /// The HGX shape without fabric: every link to a switch, the sentinel as
    /// the far end, P2P over NVLink OK between every pair.
    #[test]
    fn switch_attached_gpus_are_joined_by_p2p_never_by_the_sentinel() {
        let mut gpus: Vec<GpuInfo> = (0..8).map(|i| with_links(i, switch_links(18))).collect();
        let all: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
        for g in &mut gpus {
            g.nvlink_p2p_peers = all.iter().filter(|u| **u != g.uuid).cloned().collect();
        }
        let d = domains(&gpus);
        assert!(d.iter().all(|x| *x == d[0]));
        assert_eq!(d[0], uuids(&gpus, &[0, 1, 2, 3, 4, 5, 6, 7]));

        // The same links with no P2P and no fabric: nothing joins them,
        // although every link reports the same (sentinel) far end.
        let mut alone: Vec<GpuInfo> = (0..4).map(|i| with_links(i, switch_links(18))).collect();
        for g in &mut alone {
            for l in &mut g.nvlinks {
                l.remote_pci_bus_id = Some(SENTINEL.into());
                l.remote = NvLinkRemote::Unknown;
            }
        }
        let d = domains(&alone);
        for (i, g) in alone.iter().enumerate() {
            assert_eq!(d[i], domain_id(&[g.uuid.as_str()]), "GPU {i}");
        }

        // A GPU whose links are all down is nobody's peer, even where the
        // others' P2P answers still name it.
        gpus[7].nvlinks.clear();
        gpus[7].nvlink_p2p_peers.clear();
        let d = domains(&gpus);
        assert!(d[..7].iter().all(|x| *x == d[0]));
        assert_eq!(d[7], domain_id(&[gpus[7].uuid.as_str()]));
    }

    #[test]
    fn fabric_cliques_join_switch_attached_gpus_and_two_cliques_stay_apart() {
        let mut gpus: Vec<GpuInfo> = (0..4).map(|i| with_links(i, switch_links(18))).collect();
        gpus[0].fabric = Some(fabric(1));
        gpus[1].fabric = Some(fabric(1));
        gpus[2].fabric = Some(fabric(2));
        gpus[3].fabric = Some(fabric(2));
        let d = domains(&gpus);
        assert_eq!(d[0], d[1]);
        assert_eq!(d[2], d[3]);
        assert_ne!(d[0], d[2]);
        // Another cluster with the same clique id is another fabric.
        gpus[3].fabric = Some(FabricInfo {
            cluster_uuid: "00000000-0000-0000-0000-000000000001".into(),
            clique_id: 2,
        });
        let d = domains(&gpus);
        assert_ne!(d[2], d[3]);
        // A fabric member without active switch links reaches nobody.
        gpus[1].nvlinks.clear();
        let d = domains(&gpus);
        assert_ne!(d[0], d[1]);
    }

    #[test]
    fn bridges_and_switches_mix() {
        // GPUs 0+1 bridged; 2, 3, 4 on switches joined by P2P; 1 and 2 also
        // bridged, which joins the two groups; 5 on a switch with no peer.
        let mut gpus = vec![
            with_links(0, bridge(1, 2)),
            with_links(1, [bridge(0, 2), bridge(2, 1)].concat()),
            with_links(2, [switch_links(4), bridge(1, 1)].concat()),
            with_links(3, switch_links(4)),
            with_links(4, switch_links(4)),
            with_links(5, switch_links(4)),
        ];
        let p2p = |gpus: &[GpuInfo], of: &[usize]| -> Vec<String> {
            of.iter().map(|&i| gpus[i].uuid.clone()).collect()
        };
        gpus[2].nvlink_p2p_peers = p2p(&gpus, &[3, 4]);
        gpus[3].nvlink_p2p_peers = p2p(&gpus, &[2, 4]);
        gpus[4].nvlink_p2p_peers = p2p(&gpus, &[2, 3]);
        let d = domains(&gpus);
        assert!(d[..5].iter().all(|x| *x == d[0]), "{d:?}");
        assert_eq!(d[5], domain_id(&[gpus[5].uuid.as_str()]));
        // Without the 1-2 bridge the groups fall apart.
        gpus[1].nvlinks.truncate(2);
        gpus[2].nvlinks.truncate(4);
        let d = domains(&gpus);
        assert_eq!(d[0], d[1]);
        assert_eq!(d[2], d[3]);
        assert_eq!(d[3], d[4]);
        assert_ne!(d[1], d[2]);
    }

    #[test]
    fn hostile_link_data_joins_nothing_it_should_not() {
        let mut gpus = vec![
            with_links(0, bridge(9, 2)),
            with_links(1, Vec::new()),
            with_links(2, switch_links(2)),
        ];
        // A link to the GPU itself, a bus id in another spelling of no GPU,
        // a switch link that claims GPU 1's bus id, P2P peers that are not
        // GPUs of the node or the GPU itself.
        gpus[0].nvlinks.push(NvLinkInfo {
            link: 5,
            remote: NvLinkRemote::Gpu,
            remote_pci_bus_id: Some("0000:01:00.0".into()),
        });
        gpus[0].nvlinks.push(NvLinkInfo {
            link: 6,
            remote: NvLinkRemote::Unknown,
            remote_pci_bus_id: Some(SENTINEL.into()),
        });
        gpus[2].nvlinks.push(NvLinkInfo {
            link: 7,
            remote: NvLinkRemote::Switch,
            remote_pci_bus_id: Some("0000:02:00.0".into()),
        });
        gpus[2].nvlink_p2p_peers = vec!["GPU-nobody".into(), gpus[2].uuid.clone(), String::new()];
        let d = domains(&gpus);
        for (i, g) in gpus.iter().enumerate() {
            assert_eq!(d[i], domain_id(&[g.uuid.as_str()]), "GPU {i}");
        }
        // An Unknown far end with a node GPU's bus id (upper case) joins it.
        gpus[1].nvlinks.push(NvLinkInfo {
            link: 0,
            remote: NvLinkRemote::Unknown,
            remote_pci_bus_id: Some("0000:03:00.0".to_uppercase()),
        });
        let d = domains(&gpus);
        assert_eq!(d[1], d[2]);
        assert_ne!(d[0], d[1]);
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
}
