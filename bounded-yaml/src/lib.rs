//! YAML read with its limits checked while reading, for every YAML input
//! of the project (the CLI's manifests, machine profiles, the API server
//! stand-in's apply bodies):
//!
//! - **size**: the caller's byte limit, checked before anything is read;
//! - **depth**: [`MAX_DEPTH`] nested collections, the limit `yaml_serde`
//!   enforces too, but found by a linear pre-scan ([`depth`]) that stops at
//!   the crossing, so a refused input costs what was read up to it;
//! - **alias expansion**: a document may expand (aliases replayed) to at
//!   most [`max_nodes`] nodes, counted while deserializing ([`budget`]).
//!
//! `yaml_serde` is still the parser; this crate only refuses early.

use serde::de::{DeserializeOwned, DeserializeSeed as _};

mod budget;
pub mod depth;

/// Deepest nesting of collections accepted: `yaml_serde`'s own recursion
/// limit, which this crate enforces before the library scans the text.
pub const MAX_DEPTH: usize = 128;

/// Nodes an input may produce beyond what its text could hold without
/// aliases: the room left for alias expansion.
pub const ALIAS_ALLOWANCE: usize = 100_000;

/// Most nodes (collections, keys, scalars) a document of `len` bytes may
/// produce, aliases expanded: twice its bytes (no document without aliases
/// has more nodes, `a:` being three in two bytes) plus [`ALIAS_ALLOWANCE`].
pub fn max_nodes(len: usize) -> usize {
    len.saturating_mul(2).saturating_add(ALIAS_ALLOWANCE)
}

/// Why a YAML input was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input is larger than allowed.
    #[error("{len} bytes, more than the {limit} bytes allowed")]
    TooLarge {
        /// Its size.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// Collections nest deeper than [`MAX_DEPTH`].
    #[error(
        "collections nested deeper than {MAX_DEPTH} levels at line {} column {}",
        at.line,
        at.column
    )]
    TooDeep {
        /// Where the limit was crossed.
        at: depth::Crossing,
    },
    /// What the YAML library refused (syntax, types, its own limits, or
    /// the node budget, with its position).
    #[error("{0}")]
    Yaml(#[from] yaml_serde::Error),
}

impl Error {
    /// 1-based line and column of the error, when known.
    pub fn location(&self) -> Option<(usize, usize)> {
        match self {
            Error::TooLarge { .. } => None,
            Error::TooDeep { at } => Some((at.line, at.column)),
            Error::Yaml(e) => e.location().map(|l| (l.line(), l.column())),
        }
    }
}

/// The size and depth checks, without parsing: what every reader here
/// does first.
pub fn check(text: &str, max_bytes: usize) -> Result<(), Error> {
    if text.len() > max_bytes {
        return Err(Error::TooLarge {
            len: text.len(),
            limit: max_bytes,
        });
    }
    depth::scan(text, MAX_DEPTH).map_err(|at| Error::TooDeep { at })
}

/// One YAML document as a JSON value, checked ([`check`]) and with the
/// node budget ([`max_nodes`]). Gives what
/// `yaml_serde::from_str::<serde_json::Value>` gives for every input within
/// the limits.
pub fn to_value(text: &str, max_bytes: usize) -> Result<serde_json::Value, Error> {
    check(text, max_bytes)?;
    let budget = budget::Budget::new(max_nodes(text.len()));
    Ok(budget::ToValue(&budget).deserialize(yaml_serde::Deserializer::from_str(text))?)
}

/// One YAML document deserialized as `T`, checked ([`check`]) and with the
/// node budget ([`max_nodes`]), counted in a first pass that keeps nothing
/// (a typed deserialization has no place to count in). Errors are
/// `yaml_serde`'s own, with their positions.
pub fn from_str<T: DeserializeOwned>(text: &str, max_bytes: usize) -> Result<T, Error> {
    check(text, max_bytes)?;
    let budget = budget::Budget::new(max_nodes(text.len()));
    budget::Count(&budget).deserialize(yaml_serde::Deserializer::from_str(text))?;
    Ok(yaml_serde::from_str(text)?)
}

#[cfg(test)]
mod tests;
