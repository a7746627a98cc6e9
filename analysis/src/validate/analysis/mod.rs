//! The analysis of one compiled selector: a type pass over the parsed tree
//! ([`types`]: names against the schema and the type of every node, with
//! [`operators`] and [`functions`] checking what is applied to them) and a
//! pass per device kind ([`kinds`]: reads that fail at scheduling time,
//! whether the selector can be true). Findings are collected as
//! [`Pending`] and written out at the end, when every fix is known, so that
//! each hint shows the selector with all corrections applied.

mod functions;
mod kinds;
mod operators;
mod refs;
mod types;

use std::collections::{HashMap, HashSet};

use cel::common::ast::IdedExpr;

use super::unparse::{Fixes, unparse_with};
use super::{Check, DeviceSet, Diagnostic, Finding, Severity};
use crate::cel::{Compiler, Selector};
use refs::Ref;

/// Most findings reported for one selector (a 10 KiB expression could
/// otherwise produce thousands).
const MAX_FINDINGS: usize = 20;

/// What the analysis of one selector found.
pub(crate) struct Outcome {
    /// Findings, paths empty.
    pub diagnostics: Vec<Diagnostic>,
    /// The devices of `reach` for which the selector can be true.
    pub matches: DeviceSet,
    /// Whether it tests `device.driver` against this driver or reads this
    /// driver's domain: what makes a DeviceClass ours.
    pub mentions_driver: bool,
}

/// The hint of a pending finding.
enum Hint {
    None,
    /// Fixed text.
    Text(String),
    /// The whole selector with every fix applied; if that cannot be
    /// written (macros), the replacement of this node.
    Corrected(u64),
    /// `<guard> && (<selector>)`.
    Guard(String),
}

/// A finding before the hints are written.
struct Pending {
    check: Check,
    severity: Severity,
    /// Character offset to point at.
    offset: Option<usize>,
    message: String,
    hint: Hint,
}

/// The state of the analysis of one selector.
pub(crate) struct Analysis<'a> {
    driver: &'a str,
    compiler: &'a Compiler,
    selector: &'a Selector,
    pending: Vec<Pending>,
    fixes: Fixes,
    /// Nodes whose problem the type pass reported (the per-kind pass
    /// treats them as failing, silently).
    flagged: HashSet<u64>,
    /// Reads of the device by node id.
    refs: HashMap<u64, Ref>,
    /// Variables of enclosing comprehensions and their types.
    scope: Vec<(String, types::Ty)>,
    /// Literal arguments checked by evaluation so far.
    literal_checks: usize,
    /// `type == '<value>'` comparisons with a value this driver never
    /// publishes: (node, message).
    impossible_types: Vec<(u64, String)>,
    mentions_driver: bool,
}

/// Analyses a compiled selector evaluated on the devices of `reach`.
pub(crate) fn analyze(
    compiler: &Compiler,
    driver: &str,
    selector: &Selector,
    reach: DeviceSet,
) -> Outcome {
    let mut analysis = Analysis {
        driver,
        compiler,
        selector,
        pending: Vec::new(),
        fixes: Fixes::new(),
        flagged: HashSet::new(),
        refs: HashMap::new(),
        scope: Vec::new(),
        literal_checks: 0,
        impossible_types: Vec::new(),
        mentions_driver: false,
    };
    let root = selector.parsed();
    analysis.type_pass(root);
    let matches = analysis.kind_pass(root, reach);
    let mentions_driver = analysis.mentions_driver;
    Outcome {
        diagnostics: analysis.finish(),
        matches,
        mentions_driver,
    }
}

impl Analysis<'_> {
    /// Records a finding pointing at node `e` (at its field name for a
    /// field selection).
    fn report(
        &mut self,
        check: Check,
        severity: Severity,
        e: &IdedExpr,
        message: String,
        hint: Hint,
    ) {
        let shift = match &e.expr {
            cel::common::ast::Expr::Select(s) if !s.test => 1,
            _ => 0,
        };
        let offset = self.selector.offset(e.id).map(|o| o + shift);
        self.pending.push(Pending {
            check,
            severity,
            offset,
            message,
            hint,
        });
    }

    /// An error at `e`, with `fix` replacing `e` in the corrected selector.
    fn error_with_fix(&mut self, check: Check, e: &IdedExpr, message: String, fix: IdedExpr) {
        self.fixes.insert(e.id, fix);
        self.flagged.insert(e.id);
        self.report(check, Severity::Error, e, message, Hint::Corrected(e.id));
    }

    /// An error at `e` without a fix.
    fn error(&mut self, check: Check, e: &IdedExpr, message: String, hint: Option<String>) {
        self.flagged.insert(e.id);
        let hint = hint.map_or(Hint::None, Hint::Text);
        self.report(check, Severity::Error, e, message, hint);
    }

    /// The text of `e` for messages, with the fixes known so far applied
    /// (so that an operand already corrected reads as corrected).
    fn text(&self, e: &IdedExpr) -> String {
        unparse_with(e, &self.fixes).unwrap_or_else(|| "this expression".to_owned())
    }

    /// The findings, with positions, snippets and hints.
    fn finish(self) -> Vec<Diagnostic> {
        let source = self.selector.expression();
        let corrected = if self.fixes.is_empty() {
            None
        } else {
            unparse_with(self.selector.parsed(), &self.fixes)
        };
        let total = self.pending.len();
        let mut out: Vec<Diagnostic> = Vec::new();
        for pending in self.pending {
            if out.len() == MAX_FINDINGS {
                break;
            }
            let message = match pending.offset {
                Some(offset) => {
                    let (position, snippet) = self.selector.locate(offset);
                    format!("{position}: {}{snippet}", pending.message)
                }
                None => pending.message,
            };
            let hint = match pending.hint {
                Hint::None => None,
                Hint::Text(text) => Some(text),
                Hint::Corrected(id) => corrected.clone().or_else(|| {
                    self.fixes
                        .get(&id)
                        .and_then(|fix| unparse_with(fix, &self.fixes))
                }),
                Hint::Guard(guard) => Some(format!("{guard} && ({source})")),
            };
            let diagnostic = Diagnostic {
                check: pending.check,
                severity: pending.severity,
                finding: Finding {
                    path: String::new(),
                    message,
                    hint,
                },
            };
            if !out.contains(&diagnostic) {
                out.push(diagnostic);
            }
        }
        if total > MAX_FINDINGS {
            out.push(Diagnostic {
                check: Check::Limit,
                severity: Severity::Warning,
                finding: Finding {
                    path: String::new(),
                    message: format!(
                        "{} more findings in this selector are not shown",
                        total - MAX_FINDINGS
                    ),
                    hint: None,
                },
            });
        }
        out
    }
}
