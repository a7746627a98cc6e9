//! Whether a node's published ResourceSlices form a complete pool, as the
//! scheduler judges it: the slices at the pool's highest generation are as
//! many as the `resourceSliceCount` each of them states. One judgement for
//! the benchmark, the demo and the tests that wait for a pool.

use serde_json::Value;

/// A complete pool, as [`complete`] found it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompletePool {
    /// The highest generation: the one the counted slices share.
    pub generation: i64,
    /// Slices at that generation (equal to their `resourceSliceCount`).
    pub slices: usize,
    /// Devices in those slices.
    pub devices: usize,
    /// Other slices: of an older generation, or with none. The scheduler
    /// ignores them; callers that want none left check `stale == 0`.
    pub stale: usize,
}

/// The slices among `items` of `driver`'s pool on `node`.
pub fn of<'a>(
    items: &'a [Value],
    driver: &'a str,
    node: &'a str,
) -> impl Iterator<Item = &'a Value> + 'a {
    items
        .iter()
        .filter(move |s| s["spec"]["driver"] == driver && s["spec"]["nodeName"] == node)
}

/// `Some` when `slices` (one pool's) are complete: every slice at the highest
/// generation present states a `resourceSliceCount` equal to how many they are.
pub fn complete<'a>(slices: impl IntoIterator<Item = &'a Value>) -> Option<CompletePool> {
    let slices: Vec<&Value> = slices.into_iter().collect();
    let generation_of = |s: &Value| s["spec"]["pool"]["generation"].as_i64();
    let generation = slices.iter().filter_map(|s| generation_of(s)).max()?;
    let current: Vec<&Value> = slices
        .iter()
        .copied()
        .filter(|s| generation_of(s) == Some(generation))
        .collect();
    let count = current.len() as u64;
    current
        .iter()
        .all(|s| s["spec"]["pool"]["resourceSliceCount"].as_u64() == Some(count))
        .then(|| CompletePool {
            generation,
            slices: current.len(),
            devices: current
                .iter()
                .map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len))
                .sum(),
            stale: slices.len() - current.len(),
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn slice(generation: i64, count: u64, devices: usize) -> Value {
        let devices: Vec<Value> = (0..devices)
            .map(|i| json!({"name": format!("d{i}")}))
            .collect();
        json!({"spec": {"driver": "d", "nodeName": "n",
            "pool": {"generation": generation, "resourceSliceCount": count},
            "devices": devices}})
    }

    #[test]
    fn all_slices_of_the_highest_generation_make_a_complete_pool() {
        let p = complete(&[slice(3, 2, 1), slice(3, 2, 4)]).unwrap();
        assert_eq!(
            p,
            CompletePool {
                generation: 3,
                slices: 2,
                devices: 5,
                stale: 0
            }
        );
    }

    #[test]
    fn a_missing_slice_or_a_wrong_count_is_incomplete() {
        assert_eq!(complete(&[slice(0, 2, 1)]), None);
        assert_eq!(complete(&[slice(0, 1, 1), slice(0, 1, 1)]), None);
        assert_eq!(complete(&[slice(0, 2, 1), slice(0, 1, 1)]), None);
        assert_eq!(complete(&[]), None);
        // Only the highest generation counts: a full older one does not help.
        assert_eq!(complete(&[slice(0, 1, 1), slice(1, 2, 1)]), None);
    }

    #[test]
    fn older_generations_are_counted_as_stale() {
        let mut no_generation = slice(0, 1, 1);
        no_generation["spec"]["pool"]
            .as_object_mut()
            .unwrap()
            .remove("generation");
        let p = complete(&[slice(0, 1, 1), slice(2, 1, 3), no_generation]).unwrap();
        assert_eq!((p.generation, p.slices, p.devices, p.stale), (2, 1, 3, 2));
    }

    #[test]
    fn of_keeps_the_driver_and_node_slices() {
        let mut other_node = slice(0, 1, 1);
        other_node["spec"]["nodeName"] = json!("m");
        let mut other_driver = slice(0, 1, 1);
        other_driver["spec"]["driver"] = json!("e");
        let items = [slice(0, 1, 2), other_node, other_driver];
        let ours: Vec<&Value> = of(&items, "d", "n").collect();
        assert_eq!(ours, [&items[0]]);
        assert_eq!(complete(of(&items, "d", "n")).map(|p| p.devices), Some(2));
    }
}
