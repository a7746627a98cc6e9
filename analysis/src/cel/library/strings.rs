//! The strings extension (cel-go `ext.Strings`, version 2, as Kubernetes
//! enables it): `charAt`, `indexOf`, `lastIndexOf`, `lowerAscii`,
//! `upperAscii`, `replace`, `split`, `substring`, `trim`, `join`, `format`
//! and `strings.quote`. Indexes count code points.

use std::fmt::Write as _;

use cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelString, CelUInt, INT_TYPE, Kind, LIST_TYPE, STRING_TYPE,
};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use super::{Out, int, int_arg, list_arg, list_items, string, string_arg};
use crate::cel::cost::{self, bytes_cost, charge};
use crate::cel::values::{CelQuantity, CelSemver};

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let member = |env: &mut Env, name: &str, id: &str, args: Vec<cel::common::types::Type>, f| {
        env.add_member_overload(name, id, STRING_TYPE, args, f)
    };
    member(env, "charAt", "string_char_at_int", vec![INT_TYPE], char_at)?;
    member(
        env,
        "indexOf",
        "string_index_of_string",
        vec![STRING_TYPE],
        index_of,
    )?;
    member(
        env,
        "indexOf",
        "string_index_of_string_int",
        vec![STRING_TYPE, INT_TYPE],
        index_of,
    )?;
    member(
        env,
        "lastIndexOf",
        "string_last_index_of_string",
        vec![STRING_TYPE],
        last_index_of,
    )?;
    member(
        env,
        "lastIndexOf",
        "string_last_index_of_string_int",
        vec![STRING_TYPE, INT_TYPE],
        last_index_of,
    )?;
    member(env, "lowerAscii", "string_lower_ascii", vec![], lower_ascii)?;
    member(env, "upperAscii", "string_upper_ascii", vec![], upper_ascii)?;
    member(
        env,
        "replace",
        "string_replace_string_string",
        vec![STRING_TYPE, STRING_TYPE],
        replace,
    )?;
    member(
        env,
        "replace",
        "string_replace_string_string_int",
        vec![STRING_TYPE, STRING_TYPE, INT_TYPE],
        replace,
    )?;
    member(
        env,
        "split",
        "string_split_string",
        vec![STRING_TYPE],
        split,
    )?;
    member(
        env,
        "split",
        "string_split_string_int",
        vec![STRING_TYPE, INT_TYPE],
        split,
    )?;
    member(
        env,
        "substring",
        "string_substring_int",
        vec![INT_TYPE],
        substring,
    )?;
    member(
        env,
        "substring",
        "string_substring_int_int",
        vec![INT_TYPE, INT_TYPE],
        substring,
    )?;
    member(env, "trim", "string_trim", vec![], trim)?;
    member(env, "format", "string_format_list", vec![LIST_TYPE], format)?;
    env.add_member_overload("join", "list_join", LIST_TYPE, vec![], join)?;
    env.add_member_overload(
        "join",
        "list_join_string",
        LIST_TYPE,
        vec![STRING_TYPE],
        join,
    )?;
    env.add_overload("strings.quote", "strings_quote", vec![STRING_TYPE], quote)?;
    Ok(())
}

fn out_of_range(function: &str, index: i64) -> ExecutionError {
    ExecutionError::function_error(function, format!("index out of range: {index}"))
}

/// The byte offset of code point `index` (`s.len()` for the end).
fn byte_offset(s: &str, index: usize) -> Option<usize> {
    s.char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(s.len()))
        .nth(index)
}

fn char_at<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "charAt")?;
    let i = int_arg(&args, 1, "charAt")?;
    charge(bytes_cost(s.len()))?;
    let index = usize::try_from(i).map_err(|_| out_of_range("charAt", i))?;
    let mut chars = s.chars();
    match byte_offset(s, index) {
        Some(_) => string(chars.nth(index).map(String::from).unwrap_or_default()),
        None => Err(out_of_range("charAt", i)),
    }
}

fn index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "indexOf")?;
    let sub = string_arg(&args, 1, "indexOf")?;
    let offset = if args.len() > 2 {
        int_arg(&args, 2, "indexOf")?
    } else {
        0
    };
    charge(bytes_cost(s.len() + sub.len()))?;
    if sub.is_empty() {
        return int(offset);
    }
    if offset < 0 {
        return Err(out_of_range("indexOf", offset));
    }
    let Some(start) = usize::try_from(offset)
        .ok()
        .and_then(|o| byte_offset(s, o))
        .filter(|&b| b < s.len())
    else {
        return int(-1);
    };
    match s[start..].find(sub) {
        Some(found) => int(s[..start + found].chars().count() as i64),
        None => int(-1),
    }
}

fn last_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "lastIndexOf")?;
    let sub = string_arg(&args, 1, "lastIndexOf")?;
    charge(bytes_cost(s.len() + sub.len()))?;
    let len = s.chars().count() as i64;
    let offset = if args.len() > 2 {
        int_arg(&args, 2, "lastIndexOf")?
    } else if sub.is_empty() {
        return int(len);
    } else {
        len - 1
    };
    if sub.is_empty() {
        return int(offset);
    }
    if offset < 0 {
        return Err(out_of_range("lastIndexOf", offset));
    }
    if offset >= len {
        return int(-1);
    }
    let sub_len = sub.chars().count() as i64;
    let last_start = offset.min(len - sub_len);
    if last_start < 0 {
        return int(-1);
    }
    // occurrences must start at or before `last_start`
    let end = byte_offset(s, (last_start + sub_len) as usize).unwrap_or(s.len());
    match s[..end].rfind(sub) {
        Some(found) => int(s[..found].chars().count() as i64),
        None => int(-1),
    }
}

fn lower_ascii<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "lowerAscii")?;
    charge(bytes_cost(s.len()))?;
    string(s.to_ascii_lowercase())
}

fn upper_ascii<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "upperAscii")?;
    charge(bytes_cost(s.len()))?;
    string(s.to_ascii_uppercase())
}

fn replace<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "replace")?;
    let old = string_arg(&args, 1, "replace")?;
    let new = string_arg(&args, 2, "replace")?;
    let limit = if args.len() > 3 {
        usize::try_from(int_arg(&args, 3, "replace")?).ok()
    } else {
        None
    };
    charge(bytes_cost(s.len()))?;
    // the size of the result, charged before it is built
    let occurrences = s.matches(old).count().min(limit.unwrap_or(usize::MAX));
    let result_len = (s.len() as u128 + occurrences as u128 * new.len() as u128)
        .saturating_sub(occurrences as u128 * old.len() as u128);
    charge(bytes_cost(
        usize::try_from(result_len).unwrap_or(usize::MAX),
    ))?;
    string(match limit {
        Some(n) => s.replacen(old, new, n),
        None => s.replace(old, new),
    })
}

fn split<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "split")?;
    let sep = string_arg(&args, 1, "split")?;
    let limit = if args.len() > 2 {
        match usize::try_from(int_arg(&args, 2, "split")?) {
            Ok(0) => return Ok(CowVal::owned(CelList::from(Vec::new()))),
            Ok(n) => Some(n),
            Err(_) => None,
        }
    } else {
        None
    };
    charge(bytes_cost(s.len()))?;
    let parts: Vec<&str> = if sep.is_empty() {
        // as Go's strings.SplitN with an empty separator: one part per
        // code point, the last holding the rest
        let mut parts = Vec::new();
        let mut rest = s;
        while let Some(c) = rest.chars().next() {
            if limit.is_some_and(|n| parts.len() + 1 == n) {
                break;
            }
            parts.push(&rest[..c.len_utf8()]);
            rest = &rest[c.len_utf8()..];
        }
        if !rest.is_empty() {
            parts.push(rest);
        }
        parts
    } else {
        match limit {
            Some(n) => s.splitn(n, sep).collect(),
            None => s.split(sep).collect(),
        }
    };
    charge(parts.len() as u64)?;
    let items: Vec<Box<dyn Val>> = parts
        .into_iter()
        .map(|p| Box::new(CelString::from(p.to_owned())) as Box<dyn Val>)
        .collect();
    Ok(CowVal::owned(CelList::from(items)))
}

fn substring<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "substring")?;
    let start = int_arg(&args, 1, "substring")?;
    charge(bytes_cost(s.len()))?;
    let len = s.chars().count() as i64;
    let end = if args.len() > 2 {
        int_arg(&args, 2, "substring")?
    } else {
        len
    };
    if args.len() > 2 && start > end {
        return Err(ExecutionError::function_error(
            "substring",
            format!("invalid substring range. start: {start}, end: {end}"),
        ));
    }
    if !(0..=len).contains(&start) {
        return Err(out_of_range("substring", start));
    }
    if !(0..=len).contains(&end) {
        return Err(out_of_range("substring", end));
    }
    let from = byte_offset(s, start as usize).unwrap_or(s.len());
    let to = byte_offset(s, end as usize).unwrap_or(s.len());
    string(s[from..to].to_owned())
}

fn trim<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "trim")?;
    charge(bytes_cost(s.len()))?;
    string(s.trim().to_owned())
}

fn join<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let sep = if args.len() > 1 {
        string_arg(&args, 1, "join")?
    } else {
        ""
    };
    let items = list_arg(&args, 0, "join")?;
    let mut parts = Vec::with_capacity(items.len());
    let mut total = 0usize;
    for item in items {
        let s = item.downcast_ref::<CelString>().ok_or_else(|| {
            ExecutionError::function_error(
                "join",
                format!("invalid input: {} is not a string", item.get_type().name()),
            )
        })?;
        total = total.saturating_add(s.len()).saturating_add(sep.len());
        parts.push(s.inner());
    }
    charge(bytes_cost(total))?;
    string(parts.join(sep))
}

fn quote<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "strings.quote")?;
    charge(bytes_cost(s.len().saturating_mul(2)))?;
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out.push('"');
    string(out)
}

/// `'...'.format([args])`: `%s`, `%d`, `%f`, `%e` (with an optional
/// `.precision`), `%b`, `%o`, `%x`, `%X` and `%%`.
fn format<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let fmt = string_arg(&args, 0, "format")?;
    let values = list_arg(&args, 1, "format")?;
    let mut budget = fmt.len();
    for v in &values {
        budget = budget.saturating_add(
            usize::try_from(cost::size_of(*v, u64::MAX)).unwrap_or(usize::MAX) * 16,
        );
    }
    charge(bytes_cost(budget))?;
    let error = |m: String| ExecutionError::function_error("format", m);
    let mut out = String::with_capacity(fmt.len());
    let mut next = values.iter();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut precision: Option<usize> = None;
        if chars.peek() == Some(&'.') {
            chars.next();
            let mut digits = String::new();
            while let Some(d) = chars.peek().copied().filter(char::is_ascii_digit) {
                digits.push(d);
                chars.next();
            }
            precision = Some(
                digits
                    .parse()
                    .map_err(|_| error("invalid precision".to_owned()))?,
            );
            if precision.is_some_and(|p| p > 64) {
                return Err(error("precision above 64".to_owned()));
            }
        }
        let verb = chars
            .next()
            .ok_or_else(|| error("format ends with '%'".to_owned()))?;
        if verb == '%' {
            out.push('%');
            continue;
        }
        let value = *next
            .next()
            .ok_or_else(|| error(format!("too few arguments for %{verb}")))?;
        format_value(&mut out, verb, precision, value).map_err(error)?;
    }
    if next.next().is_some() {
        return Err(error("too many arguments".to_owned()));
    }
    string(out)
}

fn format_value(
    out: &mut String,
    verb: char,
    precision: Option<usize>,
    v: &dyn Val,
) -> Result<(), String> {
    let int_value = v
        .downcast_ref::<CelInt>()
        .map(|i| i128::from(*i.inner()))
        .or_else(|| v.downcast_ref::<CelUInt>().map(|u| i128::from(*u.inner())));
    let float_value = v
        .downcast_ref::<CelDouble>()
        .map(|d| *d.inner())
        .or_else(|| int_value.map(|i| i as f64));
    let type_name = v.get_type().name().to_owned();
    let unsupported = || format!("%{verb} does not format a {type_name}");
    match verb {
        's' => display(out, v),
        'd' => write!(out, "{}", int_value.ok_or_else(unsupported)?).map_err(|e| e.to_string()),
        'f' => write!(
            out,
            "{:.*}",
            precision.unwrap_or(6),
            float_value.ok_or_else(unsupported)?
        )
        .map_err(|e| e.to_string()),
        'e' => {
            // Go's form: a signed exponent of at least two digits (1.5e+03)
            let text = format!(
                "{:.*e}",
                precision.unwrap_or(6),
                float_value.ok_or_else(unsupported)?
            );
            let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
            let (sign, digits) = exponent
                .strip_prefix('-')
                .map_or(("+", exponent), |d| ("-", d));
            write!(out, "{mantissa}e{sign}{digits:0>2}").map_err(|e| e.to_string())
        }
        'b' | 'o' | 'x' | 'X' => {
            if let Some(s) = v
                .downcast_ref::<CelString>()
                .filter(|_| matches!(verb, 'x' | 'X'))
            {
                for b in s.bytes() {
                    let _ = if verb == 'x' {
                        write!(out, "{b:02x}")
                    } else {
                        write!(out, "{b:02X}")
                    };
                }
                return Ok(());
            }
            let i = int_value.ok_or_else(unsupported)?;
            let sign = if i < 0 { "-" } else { "" };
            let a = i.unsigned_abs();
            match verb {
                'b' => write!(out, "{sign}{a:b}"),
                'o' => write!(out, "{sign}{a:o}"),
                'x' => write!(out, "{sign}{a:x}"),
                _ => write!(out, "{sign}{a:X}"),
            }
            .map_err(|e| e.to_string())
        }
        other => Err(format!("unknown verb %{other}")),
    }
}

/// `%s` text of a value.
fn display(out: &mut String, v: &dyn Val) -> Result<(), String> {
    if let Some(s) = v.downcast_ref::<CelString>() {
        out.push_str(s.inner());
    } else if let Some(i) = v.downcast_ref::<CelInt>() {
        let _ = write!(out, "{}", i.inner());
    } else if let Some(u) = v.downcast_ref::<CelUInt>() {
        let _ = write!(out, "{}", u.inner());
    } else if let Some(d) = v.downcast_ref::<CelDouble>() {
        let _ = write!(out, "{}", d.inner());
    } else if let Some(b) = v.downcast_ref::<CelBool>() {
        let _ = write!(out, "{}", b.inner());
    } else if let Some(q) = v.downcast_ref::<CelQuantity>() {
        let _ = write!(out, "{}", q.0);
    } else if let Some(s) = v.downcast_ref::<CelSemver>() {
        let _ = write!(out, "{}", s.0);
    } else if v.get_type().kind() == Kind::NullType {
        out.push_str("null");
    } else if v.get_type().kind() == Kind::List {
        out.push('[');
        for (i, item) in list_items(v, "format", 1)
            .map_err(|e| e.to_string())?
            .into_iter()
            .enumerate()
        {
            if i > 0 {
                out.push_str(", ");
            }
            display(out, item)?;
        }
        out.push(']');
    } else {
        return Err(format!("%s does not format a {}", v.get_type().name()));
    }
    Ok(())
}
