//! CEL text from a parsed expression, for hints: the corrected selector is
//! the parsed tree with some nodes replaced, written back as CEL. Macro
//! expansions other than `cel.bind` cannot be written back (the parser
//! turned them into comprehensions); callers then fall back to showing the
//! corrected fragment only.

use std::collections::HashMap;
use std::fmt::Write as _;

use cel::common::ast::{CallExpr, EntryExpr, Expr, IdedExpr, LiteralValue, operators};

/// Replacements by node id.
pub(crate) type Fixes = HashMap<u64, IdedExpr>;

/// A node made up for a hint (id 0 is never a parsed node's).
pub(crate) fn node(expr: Expr) -> IdedExpr {
    IdedExpr { id: 0, expr }
}

/// `target.name(args)`, or `name(args)` without a target.
pub(crate) fn call(target: Option<IdedExpr>, name: &str, args: Vec<IdedExpr>) -> IdedExpr {
    node(Expr::Call(CallExpr {
        func_name: name.to_owned(),
        target: target.map(Box::new),
        args,
    }))
}

/// A string literal node.
pub(crate) fn string(s: &str) -> IdedExpr {
    node(Expr::Literal(LiteralValue::String(s.to_owned().into())))
}

/// An int literal node.
pub(crate) fn int(i: i64) -> IdedExpr {
    node(Expr::Literal(LiteralValue::Int(i.into())))
}

/// `e` as CEL text, or `None` if it holds a macro expansion.
pub(crate) fn unparse(e: &IdedExpr) -> Option<String> {
    unparse_with(e, &Fixes::new())
}

/// `e` with the nodes in `fixes` replaced, as CEL text.
pub(crate) fn unparse_with(e: &IdedExpr, fixes: &Fixes) -> Option<String> {
    let mut out = String::new();
    Writer {
        fixes,
        active: Vec::new(),
    }
    .write(e, 0, &mut out)?;
    Some(out)
}

/// A string literal in single quotes (double quotes if it has a single
/// quote and no double quote), escaped.
pub(crate) fn quote(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

// Precedence levels, loosest first.
const TERNARY: u8 = 1;
const OR: u8 = 2;
const AND: u8 = 3;
const RELATION: u8 = 4;
const ADDITION: u8 = 5;
const MULTIPLICATION: u8 = 6;
const UNARY: u8 = 7;
const MEMBER: u8 = 8;

fn binary(name: &str) -> Option<(&'static str, u8)> {
    Some(match name {
        operators::LOGICAL_OR => ("||", OR),
        operators::LOGICAL_AND => ("&&", AND),
        operators::EQUALS => ("==", RELATION),
        operators::NOT_EQUALS => ("!=", RELATION),
        operators::LESS => ("<", RELATION),
        operators::LESS_EQUALS => ("<=", RELATION),
        operators::GREATER => (">", RELATION),
        operators::GREATER_EQUALS => (">=", RELATION),
        operators::IN => ("in", RELATION),
        operators::ADD => ("+", ADDITION),
        operators::SUBSTRACT => ("-", ADDITION),
        operators::MULTIPLY => ("*", MULTIPLICATION),
        operators::DIVIDE => ("/", MULTIPLICATION),
        operators::MODULO => ("%", MULTIPLICATION),
        _ => return None,
    })
}

struct Writer<'a> {
    fixes: &'a Fixes,
    /// Fixes being written (not applied again inside themselves).
    active: Vec<u64>,
}

impl Writer<'_> {
    /// Writes `e`, in parentheses if it binds more loosely than `min`.
    fn write(&mut self, e: &IdedExpr, min: u8, out: &mut String) -> Option<()> {
        if e.id != 0
            && !self.active.contains(&e.id)
            && let Some(fix) = self.fixes.get(&e.id)
        {
            self.active.push(e.id);
            let written = self.write(fix, min, out);
            self.active.pop();
            return written;
        }
        let level = level(e);
        if level < min {
            out.push('(');
            self.write_bare(e, out)?;
            out.push(')');
            Some(())
        } else {
            self.write_bare(e, out)
        }
    }

    fn write_bare(&mut self, e: &IdedExpr, out: &mut String) -> Option<()> {
        match &e.expr {
            Expr::Ident(name) => out.push_str(name),
            Expr::Literal(literal) => write_literal(literal, out),
            Expr::Select(select) => {
                if select.test {
                    out.push_str("has(");
                    self.write(&select.operand, MEMBER, out)?;
                    out.push('.');
                    out.push_str(&select.field);
                    out.push(')');
                } else {
                    self.write(&select.operand, MEMBER, out)?;
                    out.push('.');
                    out.push_str(&select.field);
                }
            }
            Expr::List(list) => {
                out.push('[');
                for (i, element) in list.elements.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    if list.optional_indices.contains(&i) {
                        out.push('?');
                    }
                    self.write(element, 0, out)?;
                }
                out.push(']');
            }
            Expr::Map(map) => {
                out.push('{');
                for (i, entry) in map.entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    let EntryExpr::MapEntry(entry) = &entry.expr else {
                        return None;
                    };
                    if entry.optional {
                        out.push('?');
                    }
                    self.write(&entry.key, 0, out)?;
                    out.push_str(": ");
                    self.write(&entry.value, 0, out)?;
                }
                out.push('}');
            }
            Expr::Call(call) => self.write_call(call, out)?,
            Expr::Comprehension(c) => {
                // only cel.bind(var, init, body) can be written back
                let is_bind = matches!(&c.iter_range.expr, Expr::List(l) if l.elements.is_empty())
                    && c.iter_var == "#unused";
                if !is_bind {
                    return None;
                }
                out.push_str("cel.bind(");
                out.push_str(&c.accu_var);
                out.push_str(", ");
                self.write(&c.accu_init, 0, out)?;
                out.push_str(", ");
                self.write(&c.result, 0, out)?;
                out.push(')');
            }
            Expr::Struct(_) | Expr::Unspecified => return None,
        }
        Some(())
    }

    fn write_call(&mut self, call: &CallExpr, out: &mut String) -> Option<()> {
        let name = call.func_name.as_str();
        if let (Some((op, level)), None, [left, right]) =
            (binary(name), &call.target, call.args.as_slice())
        {
            self.write(left, level, out)?;
            out.push(' ');
            out.push_str(op);
            out.push(' ');
            return self.write(right, level + 1, out);
        }
        match (name, call.target.as_deref(), call.args.as_slice()) {
            (operators::LOGICAL_NOT, None, [operand]) => {
                out.push('!');
                self.write(operand, UNARY, out)
            }
            (operators::NEGATE, None, [operand]) => {
                out.push('-');
                self.write(operand, UNARY, out)
            }
            (operators::CONDITIONAL, None, [condition, then, otherwise]) => {
                self.write(condition, OR, out)?;
                out.push_str(" ? ");
                self.write(then, OR, out)?;
                out.push_str(" : ");
                self.write(otherwise, TERNARY, out)
            }
            (operators::INDEX | operators::OPT_INDEX, None, [operand, index]) => {
                self.write(operand, MEMBER, out)?;
                out.push_str(if name == operators::INDEX { "[" } else { "[?" });
                self.write(index, 0, out)?;
                out.push(']');
                Some(())
            }
            (operators::OPT_SELECT, None, [operand, field]) => {
                let Expr::Literal(LiteralValue::String(field)) = &field.expr else {
                    return None;
                };
                self.write(operand, MEMBER, out)?;
                out.push_str(".?");
                out.push_str(field.inner());
                Some(())
            }
            _ if name.starts_with(['_', '@', '!', '-']) => None,
            (_, target, args) => {
                if let Some(target) = target {
                    self.write(target, MEMBER, out)?;
                    out.push('.');
                }
                out.push_str(name);
                out.push('(');
                for (i, arg) in args.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    self.write(arg, 0, out)?;
                }
                out.push(')');
                Some(())
            }
        }
    }
}

fn level(e: &IdedExpr) -> u8 {
    match &e.expr {
        Expr::Call(call) if call.target.is_none() => match call.func_name.as_str() {
            operators::CONDITIONAL => TERNARY,
            operators::LOGICAL_NOT | operators::NEGATE => UNARY,
            name => binary(name).map_or(MEMBER, |(_, level)| level),
        },
        Expr::Literal(LiteralValue::Int(i)) if *i.inner() < 0 => UNARY,
        Expr::Literal(LiteralValue::Double(d)) if d.inner().is_sign_negative() => UNARY,
        _ => MEMBER,
    }
}

fn write_literal(literal: &LiteralValue, out: &mut String) {
    match literal {
        LiteralValue::Boolean(b) => out.push_str(if *b.inner() { "true" } else { "false" }),
        LiteralValue::Int(i) => {
            let _ = write!(out, "{}", i.inner());
        }
        LiteralValue::UInt(u) => {
            let _ = write!(out, "{}u", u.inner());
        }
        LiteralValue::Double(d) => {
            let d = *d.inner();
            if d.is_finite() {
                let _ = write!(out, "{d:?}");
            } else if d.is_nan() {
                out.push_str("double('NaN')");
            } else if d > 0.0 {
                out.push_str("double('Infinity')");
            } else {
                out.push_str("double('-Infinity')");
            }
        }
        LiteralValue::Null => out.push_str("null"),
        LiteralValue::String(s) => out.push_str(&quote(s.inner())),
        LiteralValue::Bytes(b) => {
            out.push_str("b'");
            for byte in b.inner() {
                let _ = write!(out, "\\x{byte:02x}");
            }
            out.push('\'');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cel::Compiler;

    fn round_trip(source: &str) -> String {
        let compiler = Compiler::new();
        let selector = compiler.compile(source).expect("compiles");
        unparse(selector.parsed()).expect("can be written back")
    }

    #[test]
    fn writes_back_what_it_parsed() {
        for source in [
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
            "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('40Gi'))",
            "has(device.attributes['gpu.nvidia.com'].uuid) || !(1 + 2 * 3 > -4)",
            "device.attributes['gpu.nvidia.com'].?profile.orValue('') in ['1g.10gb', '2g.20gb']",
            "(1 + 2) * 3 == 9 ? 'a' : 'b'",
            "cel.bind(x, device.attributes['gpu.nvidia.com'], x.type == 'gpu')",
            "{'a': 1u, 'b': 2.5}['a'] == 1u",
            "strings.quote('it\\'s') == \"'it\\\\'s'\"",
        ] {
            let once = round_trip(source);
            assert_eq!(round_trip(&once), once, "{source}");
        }
        assert_eq!(round_trip("(1 + 2) * 3 == 9"), "(1 + 2) * 3 == 9");
        assert_eq!(round_trip("1 - (2 - 3) == 0"), "1 - (2 - 3) == 0");
        assert_eq!(
            round_trip("device.attributes[\"gpu.nvidia.com\"].?x.orValue(1) >= 2"),
            "device.attributes['gpu.nvidia.com'].?x.orValue(1) >= 2"
        );
    }

    #[test]
    fn macros_other_than_bind_cannot_be_written_back() {
        let compiler = Compiler::new();
        let selector = compiler.compile("[1, 2].all(x, x > 0)").unwrap();
        assert_eq!(unparse(selector.parsed()), None);
    }

    #[test]
    fn fixes_replace_nodes_and_can_nest() {
        let compiler = Compiler::new();
        let selector = compiler.compile("device.driver == 'a'").unwrap();
        let Expr::Call(root) = &selector.parsed().expr else {
            panic!("a call")
        };
        let mut fixes = Fixes::new();
        // replace the literal, and the whole comparison by one that embeds
        // the original left side
        fixes.insert(root.args[1].id, string("b"));
        fixes.insert(
            selector.parsed().id,
            call(
                None,
                operators::LOGICAL_NOT,
                vec![selector.parsed().clone()],
            ),
        );
        assert_eq!(
            unparse_with(selector.parsed(), &fixes).as_deref(),
            Some("!(device.driver == 'b')")
        );
    }

    #[test]
    fn quotes_escape() {
        assert_eq!(quote("a'b"), "\"a'b\"");
        assert_eq!(quote("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(quote("x\\y\n"), "'x\\\\y\\n'");
    }
}
