//! Kubernetes resource quantities (`resource.Quantity`): one exact parser,
//! shared by the opaque config API (MPS memory limits) and the CEL
//! environment (`quantity()`, device capacities).
//!
//! The grammar is the one of `k8s.io/apimachinery/pkg/api/resource`:
//!
//! ```text
//! <quantity>        ::= <signedNumber><suffix>
//! <signedNumber>    ::= <number> | <plusminus><number>
//! <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
//! <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
//! <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
//! <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
//! <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>
//! ```
//!
//! Values are kept exactly, as an integer count of nano-units (10^-9), the
//! finest precision Kubernetes keeps: like Kubernetes, a more precise value
//! is rounded up, away from zero (`0.1n` is `1n`). The arithmetic is integer
//! only (a small big-integer during parsing), so `0.1Ki` is exactly `102.4`.
//!
//! Deliberate limits, each reported with its own error: the text is at most
//! [`MAX_QUANTITY_LEN`] characters, and the magnitude must fit in an `i128`
//! count of nano-units (about 1.7e29, far above the largest binary suffix,
//! `Ei`). Kubernetes accepts the degenerate strings `"-"`, `"+"` and `"."` as
//! zero; they are rejected here.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// The longest quantity text accepted, in bytes.
pub const MAX_QUANTITY_LEN: usize = 256;

/// Nano-units per unit.
const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// Why a quantity string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The text is empty.
    #[error("quantity is empty")]
    Empty,
    /// The text is longer than [`MAX_QUANTITY_LEN`].
    #[error("quantity is too long: {len} characters, at most {max} are accepted")]
    TooLong {
        /// Length of the rejected text.
        len: usize,
        /// The limit, [`MAX_QUANTITY_LEN`].
        max: usize,
    },
    /// The text does not follow the Kubernetes quantity grammar.
    #[error(
        "invalid quantity {input:?}: {reason} (expected a number with an optional suffix, e.g. 512Mi, 1.5G, 100m or 1e9)"
    )]
    Syntax {
        /// The rejected text.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The value is too large to be represented exactly.
    #[error("quantity {input:?} is out of range: its magnitude must stay below 1e29")]
    OutOfRange {
        /// The rejected text.
        input: String,
    },
}

/// How a quantity was written; it only matters for the canonical text form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantityFormat {
    /// Decimal SI suffixes (`m`, `k`, `M`, ...) or none.
    DecimalSI,
    /// Binary SI suffixes (`Ki`, `Mi`, ...).
    BinarySI,
    /// A decimal exponent (`1e9`).
    DecimalExponent,
}

/// An exact Kubernetes quantity.
///
/// Equality and ordering compare values, whatever the suffix:
/// `1Gi == 1024Mi == 1073741824`.
#[derive(Debug, Clone, Copy)]
pub struct Quantity {
    nanos: i128,
    format: QuantityFormat,
}

impl Quantity {
    /// Parses Kubernetes quantity text.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        parse(text)
    }

    /// A quantity of `value` whole units, in decimal format.
    pub fn from_units(value: i64) -> Self {
        Self {
            nanos: i128::from(value) * NANOS_PER_UNIT,
            format: QuantityFormat::DecimalSI,
        }
    }

    /// A quantity of `nanos` nano-units, in decimal format.
    pub const fn from_nanos(nanos: i128) -> Self {
        Self {
            nanos,
            format: QuantityFormat::DecimalSI,
        }
    }

    /// The exact value in nano-units (10^-9).
    pub const fn nanos(&self) -> i128 {
        self.nanos
    }

    /// How the quantity was written.
    pub const fn format(&self) -> QuantityFormat {
        self.format
    }

    /// -1, 0 or 1.
    pub fn signum(&self) -> i8 {
        match self.nanos.cmp(&0) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        }
    }

    /// Whether the value is a whole number of units.
    pub fn is_whole(&self) -> bool {
        self.nanos % NANOS_PER_UNIT == 0
    }

    /// The value rounded to a whole number of units, away from zero, as
    /// Kubernetes' `Quantity.Value()` does (`1.2` is `2`, `-1.2` is `-2`).
    pub fn ceil_units(&self) -> i128 {
        let whole = self.nanos / NANOS_PER_UNIT;
        let rest = self.nanos % NANOS_PER_UNIT;
        match rest.cmp(&0) {
            Ordering::Greater => whole + 1,
            Ordering::Less => whole - 1,
            Ordering::Equal => whole,
        }
    }

    /// The value as an `i64`, if it is a whole number that fits.
    pub fn as_i64_exact(&self) -> Option<i64> {
        if self.is_whole() {
            i64::try_from(self.nanos / NANOS_PER_UNIT).ok()
        } else {
            None
        }
    }

    /// The value as the nearest `f64` (approximate).
    pub fn as_f64(&self) -> f64 {
        let whole = (self.nanos / NANOS_PER_UNIT) as f64;
        let frac = (self.nanos % NANOS_PER_UNIT) as f64 / 1e9;
        whole + frac
    }

    /// `self + other`, or `None` if the result is out of range.
    pub fn checked_add(&self, other: &Self) -> Option<Self> {
        self.nanos.checked_add(other.nanos).map(|nanos| Self {
            nanos,
            format: self.format,
        })
    }

    /// `self - other`, or `None` if the result is out of range.
    pub fn checked_sub(&self, other: &Self) -> Option<Self> {
        self.nanos.checked_sub(other.nanos).map(|nanos| Self {
            nanos,
            format: self.format,
        })
    }

    /// The canonical text, as Kubernetes serializes quantities: the largest
    /// suffix of the quantity's format that keeps the number whole, e.g.
    /// `1536Mi`, `1500M`, `500m`, `1e3`.
    pub fn canonical(&self) -> String {
        canonical(self.nanos, self.format)
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl std::hash::Hash for Quantity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.nanos.hash(state);
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s)
    }
}

impl serde::Serialize for Quantity {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.canonical())
    }
}

/// Accepts a string, or, as Kubernetes does, a bare JSON number.
///
/// Like Kubernetes' `Quantity.UnmarshalJSON` (`strings.TrimSpace` before
/// `ParseQuantity`), whitespace around the text of a string is dropped:
/// `" 10Gi "` is `10Gi`. Only here: [`Quantity::parse`] (used by CEL) stays
/// strict. Go trims the raw JSON text, whose escapes are not decoded yet, so
/// a whitespace that JSON can only carry escaped (tab, newline, vertical
/// tab, form feed, carriage return) is kept and rejected, as there.
impl<'de> serde::Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;

        impl serde::de::Visitor<'_> for Visitor {
            type Value = Quantity;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity such as \"512Mi\" or a number")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
                parse(v.trim_matches(|c: char| c.is_whitespace() && !c.is_ascii_control()))
                    .map_err(E::custom)
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity::from_units(v))
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity {
                    nanos: i128::from(v) * NANOS_PER_UNIT,
                    format: QuantityFormat::DecimalSI,
                })
            }

            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
                // `{:?}` writes the shortest text that reads back as `v`, with
                // an exponent for very large or small values ("1e308").
                parse(&format!("{v:?}")).map_err(E::custom)
            }
        }

        deserializer.deserialize_any(Visitor)
    }
}

// ---------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------

fn syntax(input: &str, reason: &'static str) -> QuantityError {
    QuantityError::Syntax {
        input: input.to_owned(),
        reason,
    }
}

/// The suffix: (power of ten, power of two, format).
fn suffix(input: &str, s: &str) -> Result<(i64, u32, QuantityFormat), QuantityError> {
    use QuantityFormat::{BinarySI, DecimalExponent, DecimalSI};
    let decimal = |p: i64| Ok((p, 0, DecimalSI));
    let binary = |p: u32| Ok((0, p, BinarySI));
    match s {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ => {
            let rest = s
                .strip_prefix(['e', 'E'])
                .ok_or_else(|| syntax(input, "unknown suffix"))?;
            let digits = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(syntax(input, "unknown suffix"));
            }
            // Exponents are clamped: anything beyond +-100000 already rounds to
            // zero or overflows, so the exact value does not matter.
            let magnitude = digits
                .trim_start_matches('0')
                .parse::<i64>()
                .unwrap_or(if digits.trim_start_matches('0').is_empty() {
                    0
                } else {
                    i64::MAX
                })
                .min(100_000);
            let exponent = if rest.starts_with('-') {
                -magnitude
            } else {
                magnitude
            };
            Ok((exponent, 0, DecimalExponent))
        }
    }
}

fn parse(input: &str) -> Result<Quantity, QuantityError> {
    if input.is_empty() {
        return Err(QuantityError::Empty);
    }
    if input.len() > MAX_QUANTITY_LEN {
        return Err(QuantityError::TooLong {
            len: input.len(),
            max: MAX_QUANTITY_LEN,
        });
    }
    let (negative, body) = match input.as_bytes()[0] {
        b'-' => (true, &input[1..]),
        b'+' => (false, &input[1..]),
        _ => (false, input),
    };
    let int_len = body.bytes().take_while(u8::is_ascii_digit).count();
    let int_part = &body[..int_len];
    let mut rest = &body[int_len..];
    let mut frac_part = "";
    if let Some(after_dot) = rest.strip_prefix('.') {
        let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
        frac_part = &after_dot[..frac_len];
        rest = &after_dot[frac_len..];
    }
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(syntax(input, "no digits"));
    }
    let (pow10, pow2, format) = suffix(input, rest)?;

    // value = digits * 10^(pow10 - frac_len) * 2^pow2, in nano-units.
    let mut n = BigUint::from_decimal(int_part, frac_part);
    if n.is_zero() {
        return Ok(Quantity { nanos: 0, format });
    }
    n.shl(pow2);
    let exponent = pow10 - frac_part.len() as i64 + 9;
    if exponent >= 0 {
        // 10^39 nano-units is already beyond i128.
        if exponent > 39 {
            return Err(QuantityError::OutOfRange {
                input: input.to_owned(),
            });
        }
        for _ in 0..exponent {
            n.mul_add(10, 0);
        }
    } else {
        let mut sticky = false;
        for _ in 0..exponent.unsigned_abs() {
            if n.is_zero() {
                break;
            }
            sticky |= n.div_rem(10) != 0;
        }
        if sticky {
            n.mul_add(1, 1);
        }
    }
    let magnitude = n.to_i128().ok_or_else(|| QuantityError::OutOfRange {
        input: input.to_owned(),
    })?;
    Ok(Quantity {
        nanos: if negative { -magnitude } else { magnitude },
        format,
    })
}

/// Just enough of an unsigned big integer to parse exactly: little-endian
/// base-2^32 limbs.
struct BigUint(Vec<u32>);

impl BigUint {
    fn from_decimal(int_part: &str, frac_part: &str) -> Self {
        let mut n = BigUint(Vec::new());
        for b in int_part.bytes().chain(frac_part.bytes()) {
            n.mul_add(10, u32::from(b - b'0'));
        }
        n
    }

    fn is_zero(&self) -> bool {
        self.0.iter().all(|&l| l == 0)
    }

    fn mul_add(&mut self, mul: u32, add: u32) {
        let mut carry = u64::from(add);
        for limb in &mut self.0 {
            let v = u64::from(*limb) * u64::from(mul) + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        if carry != 0 {
            self.0.push(carry as u32);
        }
    }

    fn shl(&mut self, bits: u32) {
        for _ in 0..bits / 16 {
            self.mul_add(1 << 16, 0);
        }
        let rest = bits % 16;
        if rest != 0 {
            self.mul_add(1 << rest, 0);
        }
    }

    /// Divides in place, returning the remainder.
    fn div_rem(&mut self, div: u32) -> u32 {
        let mut rem = 0u64;
        for limb in self.0.iter_mut().rev() {
            let v = (rem << 32) | u64::from(*limb);
            *limb = (v / u64::from(div)) as u32;
            rem = v % u64::from(div);
        }
        rem as u32
    }

    fn to_i128(&self) -> Option<i128> {
        let mut v: u128 = 0;
        for (i, &limb) in self.0.iter().enumerate() {
            if limb == 0 {
                continue;
            }
            if i >= 4 {
                return None;
            }
            v |= u128::from(limb) << (32 * i);
        }
        i128::try_from(v).ok()
    }
}

// ---------------------------------------------------------------------------
// Canonical text
// ---------------------------------------------------------------------------

fn canonical(nanos: i128, format: QuantityFormat) -> String {
    if nanos == 0 {
        return "0".to_owned();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let abs = nanos.unsigned_abs();
    let units = 1_000_000_000u128;
    if format == QuantityFormat::BinarySI && abs.is_multiple_of(units) && abs / units >= 1024 {
        let mut value = abs / units;
        let mut index = 0;
        const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
        while index < 6 && value.is_multiple_of(1024) {
            value /= 1024;
            index += 1;
        }
        return format!("{sign}{value}{}", SUFFIXES[index]);
    }
    // Decimal: strip trailing zeros in groups of three.
    let mut mantissa = abs;
    let mut exp3: i32 = -3; // nano-units: 10^-9 = 10^(3 * -3)
    while mantissa.is_multiple_of(1000) {
        mantissa /= 1000;
        exp3 += 1;
    }
    if format == QuantityFormat::DecimalExponent {
        return if exp3 == 0 {
            format!("{sign}{mantissa}")
        } else {
            format!("{sign}{mantissa}e{}", exp3 * 3)
        };
    }
    let suffix = match exp3 {
        -3 => "n",
        -2 => "u",
        -1 => "m",
        0 => "",
        1 => "k",
        2 => "M",
        3 => "G",
        4 => "T",
        5 => "P",
        _ => "E",
    };
    // Above exa, keep the exa suffix and the remaining zeros.
    let mut digits = mantissa.to_string();
    for _ in 6..exp3.max(6) {
        digits.push_str("000");
    }
    format!("{sign}{digits}{suffix}")
}

#[cfg(test)]
mod tests;
