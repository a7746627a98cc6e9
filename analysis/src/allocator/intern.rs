//! The leaf the allocator's indexes share: the ids values are interned to
//! (a pool's columns, the memo's keys) with their two reserved values, and
//! the fast hasher of its maps. It uses nothing of the allocator, so the
//! snapshot (which interns) and the selectors (whose memo is keyed by the
//! ids) both build on it without depending on each other.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A column id not computed yet.
pub(crate) const UNKNOWN_ID: u32 = u32::MAX;

/// The id every value gets once `u32` ids run out (never in practice):
/// values with it must not share memoised results.
pub(crate) const OVERFLOW_ID: u32 = UNKNOWN_ID - 1;

/// A fast, non-cryptographic hasher for the memo and the allocator's
/// indexes. Keys come from ResourceSlices, which drivers publish; a crafted
/// collision can only slow a simulation down.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap` with [`FastHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;
