//! Checking one selector expression: compiled with the shared compiler
//! (whose errors, with line, column and caret, are passed through as
//! findings), then analysed against the schema.

use std::fmt::Write as _;

use super::analysis;
use super::suggest::closest;
use super::{Check, DeviceSet, Diagnostic, Finding, SelectorAnalysis, Severity, Validator};
use crate::cel::{CompileError, Position, caret_snippet};

/// Names from other languages and libraries, and what CEL calls them.
const ALIASES: &[(&str, &str)] = &[
    ("lower", "lowerAscii"),
    ("lowercase", "lowerAscii"),
    ("toLower", "lowerAscii"),
    ("toLowerCase", "lowerAscii"),
    ("upper", "upperAscii"),
    ("uppercase", "upperAscii"),
    ("toUpper", "upperAscii"),
    ("toUpperCase", "upperAscii"),
    ("len", "size"),
    ("length", "size"),
    ("match", "matches"),
    ("regex", "matches"),
    ("greaterThan", "isGreaterThan"),
    ("lessThan", "isLessThan"),
    ("version", "semver"),
    ("includes", "contains"),
    ("hasPrefix", "startsWith"),
    ("hasSuffix", "endsWith"),
];

/// A checked selector and whether it concerns the driver.
pub(crate) struct Checked {
    pub analysis: SelectorAnalysis,
    /// See [`analysis::Outcome::mentions_driver`]; for an expression that
    /// does not compile, whether it names the driver in quotes.
    pub mentions_driver: bool,
}

/// [`Validator::check_selector`].
pub(crate) fn check(validator: &Validator, expression: &str, reach: DeviceSet) -> SelectorAnalysis {
    check_detailed(validator, expression, reach).analysis
}

/// Compiles and analyses `expression`.
pub(crate) fn check_detailed(validator: &Validator, expression: &str, reach: DeviceSet) -> Checked {
    let driver = validator.driver();
    match validator.compiler().compile(expression) {
        Ok(selector) => {
            let outcome = analysis::analyze(validator.compiler(), driver, &selector, reach);
            Checked {
                analysis: SelectorAnalysis {
                    diagnostics: outcome.diagnostics,
                    matches: outcome.matches,
                },
                mentions_driver: outcome.mentions_driver,
            }
        }
        Err(error) => Checked {
            analysis: SelectorAnalysis {
                diagnostics: vec![compile_diagnostic(expression, &error)],
                matches: reach,
            },
            mentions_driver: expression.contains(&format!("'{driver}'"))
                || expression.contains(&format!("\"{driver}\"")),
        },
    }
}

/// The finding for a compile error.
fn compile_diagnostic(expression: &str, error: &CompileError) -> Diagnostic {
    let (check, message, hint) = match error {
        CompileError::Syntax { errors, .. } => syntax(expression, errors),
        CompileError::UndeclaredVariable { name, position, .. } => {
            let hint = closest(name, ["device"])
                .and_then(|best| replace_at(expression, *position, name, best));
            (
                Check::Undeclared,
                format!(
                    "{position}: undeclared reference to `{name}`: the only variable is `device`{}",
                    snippet(expression, *position)
                ),
                hint,
            )
        }
        CompileError::UndeclaredFunction { name, position, .. } => {
            let best = ALIASES
                .iter()
                .find(|(alias, _)| alias == name)
                .map(|(_, f)| *f)
                .or_else(|| closest(name, crate::cel::function_names()));
            let mut message = format!("{position}: undeclared function `{name}`");
            if let Some(best) = best {
                let _ = write!(message, "; did you mean `{best}`?");
            }
            message.push_str(&snippet(expression, *position));
            let hint = best.and_then(|best| replace_at(expression, *position, name, best));
            (Check::Undeclared, message, hint)
        }
        CompileError::Unsupported { what, position, .. } => (
            Check::Unsupported,
            format!(
                "{position}: {what} is not supported in device selectors{}",
                snippet(expression, *position)
            ),
            None,
        ),
        CompileError::TooLong { .. }
        | CompileError::TooDeep { .. }
        | CompileError::CostTooHigh { .. } => (Check::Limit, error.to_string(), None),
        _ => (Check::Internal, error.to_string(), None),
    };
    Diagnostic {
        check,
        severity: Severity::Error,
        finding: Finding {
            path: String::new(),
            message,
            hint,
        },
    }
}

fn syntax(expression: &str, errors: &[(Position, String)]) -> (Check, String, Option<String>) {
    let Some((first, first_message)) = errors.first() else {
        return (Check::Syntax, "syntax error".to_owned(), None);
    };
    let clean = |m: &str| m.strip_prefix("Syntax error: ").unwrap_or(m).to_owned();
    let mut message = format!(
        "{first}: syntax error: {}{}",
        clean(first_message),
        snippet(expression, *first)
    );
    for (position, more) in errors.iter().skip(1).take(4) {
        let _ = write!(message, "\n{position}: {}", clean(more));
    }
    // `=` where `==` was meant
    let offset = char_offset(expression, *first);
    let hint = offset.and_then(|offset| {
        let chars: Vec<char> = expression.chars().collect();
        let at = |i: usize| chars.get(i).copied();
        (at(offset) == Some('=')
            && at(offset + 1) != Some('=')
            && offset > 0
            && !matches!(at(offset - 1), Some('=' | '!' | '<' | '>')))
        .then(|| {
            message.push_str("\n(`=` is not an operator in CEL: compare with `==`)");
            let mut fixed: String = chars[..offset].iter().collect();
            fixed.push_str("==");
            fixed.extend(&chars[offset + 1..]);
            fixed
        })
    });
    (Check::Syntax, message, hint)
}

/// The character offset of a 1-based line and column.
fn char_offset(expression: &str, position: Position) -> Option<usize> {
    let mut offset = 0;
    for (i, line) in expression.split('\n').enumerate() {
        if i + 1 == position.line {
            return (position.column >= 1 && position.column - 1 <= line.chars().count())
                .then(|| offset + position.column - 1);
        }
        offset += line.chars().count() + 1;
    }
    None
}

/// The expression with `old` at (or just before) `position` replaced by
/// `new`.
fn replace_at(expression: &str, position: Position, old: &str, new: &str) -> Option<String> {
    let offset = char_offset(expression, position)?;
    let chars: Vec<char> = expression.chars().collect();
    let old_chars: Vec<char> = old.chars().collect();
    let start = if chars[offset..].starts_with(&old_chars) {
        offset
    } else if chars[..offset].ends_with(&old_chars) {
        offset - old_chars.len()
    } else {
        return None;
    };
    let mut fixed: String = chars[..start].iter().collect();
    fixed.push_str(new);
    fixed.extend(&chars[start + old_chars.len()..]);
    Some(fixed)
}

/// The line of `position` with a caret under its column.
fn snippet(expression: &str, position: Position) -> String {
    let line = expression
        .split('\n')
        .nth(position.line.saturating_sub(1))
        .unwrap_or("");
    caret_snippet(line, position.column)
}
