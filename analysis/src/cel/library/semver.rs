//! Kubernetes' semver library (`k8s.io/apiserver/pkg/cel/library/semverlib.go`):
//! `semver`, `isSemver` and the methods of `Semver` values.

use std::cmp::Ordering;

use cel::common::types::{BOOL_TYPE, STRING_TYPE};
use cel::common::value::CowVal;
use cel::{DeclarationError, Env, ExecutionError};

use super::{Out, bool_arg, boolean, int, ordering, semver_arg, string_arg};
use crate::cel::cost::{bytes_cost, charge};
use crate::cel::values::{CelSemver, SEMVER_TYPE};

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let s = || SEMVER_TYPE.to_owned();
    env.add_overload("semver", "string_to_semver", vec![STRING_TYPE], semver_fn)?;
    env.add_overload(
        "semver",
        "string_bool_to_semver",
        vec![STRING_TYPE, BOOL_TYPE],
        semver_fn,
    )?;
    env.add_overload("isSemver", "is_semver_string", vec![STRING_TYPE], is_semver)?;
    env.add_overload(
        "isSemver",
        "is_semver_string_bool",
        vec![STRING_TYPE, BOOL_TYPE],
        is_semver,
    )?;
    env.add_member_overload("major", "semver_major", s(), vec![], semver_major)?;
    env.add_member_overload("minor", "semver_minor", s(), vec![], semver_minor)?;
    env.add_member_overload("patch", "semver_patch", s(), vec![], semver_patch)?;
    env.add_member_overload(
        "compareTo",
        "semver_compare_to",
        s(),
        vec![s()],
        semver_compare,
    )?;
    env.add_member_overload(
        "isGreaterThan",
        "semver_greater",
        s(),
        vec![s()],
        semver_greater,
    )?;
    env.add_member_overload("isLessThan", "semver_less", s(), vec![s()], semver_less)?;
    Ok(())
}

/// Why a text is not a semantic version (the end of the CEL error
/// `invalid semantic version "...": ...`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum VersionError {
    /// Normalised: more than major, minor and patch.
    #[error("{text:?} has more than three version numbers")]
    TooManyNumbers {
        /// The text without its leading `v`.
        text: String,
    },
    /// Normalised: a part of the core version that is not a number.
    #[error("{part:?} is not a version number")]
    NotANumber {
        /// The part.
        part: String,
    },
    /// Not SemVer 2.0.0, as the `semver` crate reads it.
    #[error(transparent)]
    Semver(#[from] semver::Error),
}

/// Parses a SemVer 2.0.0 version. With `normalize`, as Kubernetes does: a
/// leading `v` is dropped, missing minor and patch numbers are zero, and
/// leading zeros are removed (`v1.02` is `1.2.0`).
pub(crate) fn parse_semver(text: &str, normalize: bool) -> Result<semver::Version, VersionError> {
    if !normalize {
        return Ok(semver::Version::parse(text)?);
    }
    let text = text.strip_prefix('v').unwrap_or(text);
    let split = text.find(['-', '+']).unwrap_or(text.len());
    let (core, rest) = text.split_at(split);
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() > 3 {
        return Err(VersionError::TooManyNumbers {
            text: text.to_owned(),
        });
    }
    let mut numbers = Vec::with_capacity(3);
    for part in &parts {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return Err(VersionError::NotANumber {
                part: (*part).to_owned(),
            });
        }
        let trimmed = part.trim_start_matches('0');
        numbers.push(if trimmed.is_empty() { "0" } else { trimmed });
    }
    while numbers.len() < 3 {
        numbers.push("0");
    }
    Ok(semver::Version::parse(&format!(
        "{}{rest}",
        numbers.join(".")
    ))?)
}

fn semver_from_args(
    args: &[CowVal<'_, '_>],
    function: &str,
) -> Result<semver::Version, ExecutionError> {
    let text = string_arg(args, 0, function)?;
    let normalize = if args.len() > 1 {
        bool_arg(args, 1, function)?
    } else {
        false
    };
    charge(bytes_cost(text.len()))?;
    parse_semver(text, normalize).map_err(|e| {
        ExecutionError::function_error(function, format!("invalid semantic version {text:?}: {e}"))
    })
}

fn semver_fn<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    semver_from_args(&args, "semver").map(|v| CowVal::owned(CelSemver(v)))
}

fn is_semver<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    // a wrong argument type is still an error, a bad version is `false`
    string_arg(&args, 0, "isSemver")?;
    boolean(semver_from_args(&args, "isSemver").is_ok())
}

fn version_number<'b, 'v>(n: u64, function: &str) -> Out<'b, 'v> {
    i64::try_from(n)
        .map_err(|_| ExecutionError::function_error(function, "version number overflows int64"))
        .and_then(int)
}

fn semver_major<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    version_number(semver_arg(&args, 0, "major")?.0.major, "major")
}

fn semver_minor<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    version_number(semver_arg(&args, 0, "minor")?.0.minor, "minor")
}

fn semver_patch<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    version_number(semver_arg(&args, 0, "patch")?.0.patch, "patch")
}

fn semver_compare<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let (a, b) = (
        semver_arg(&args, 0, "compareTo")?,
        semver_arg(&args, 1, "compareTo")?,
    );
    int(ordering(a.compare(b)))
}

fn semver_greater<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let (a, b) = (
        semver_arg(&args, 0, "isGreaterThan")?,
        semver_arg(&args, 1, "isGreaterThan")?,
    );
    boolean(a.compare(b) == Ordering::Greater)
}

fn semver_less<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let (a, b) = (
        semver_arg(&args, 0, "isLessThan")?,
        semver_arg(&args, 1, "isLessThan")?,
    );
    boolean(a.compare(b) == Ordering::Less)
}
