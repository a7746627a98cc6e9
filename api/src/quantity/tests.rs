use super::*;

const GI: i128 = 1 << 30;
const N: i128 = 1_000_000_000;

fn nanos(s: &str) -> i128 {
    Quantity::parse(s)
        .unwrap_or_else(|e| panic!("{s}: {e}"))
        .nanos()
}

#[test]
fn parses_every_suffix_exactly() {
    let cases: &[(&str, i128)] = &[
        ("0", 0),
        ("1", N),
        ("+1", N),
        ("-1", -N),
        ("1n", 1),
        ("1u", 1_000),
        ("1m", 1_000_000),
        ("1k", 1_000 * N),
        ("1M", 1_000_000 * N),
        ("1G", 1_000_000_000 * N),
        ("1T", 1_000_000_000_000 * N),
        ("1P", 1_000_000_000_000_000 * N),
        ("1E", 1_000_000_000_000_000_000 * N),
        ("1Ki", 1024 * N),
        ("1Mi", (1 << 20) * N),
        ("1Gi", GI * N),
        ("1Ti", (1 << 40) * N),
        ("1Pi", (1 << 50) * N),
        ("1Ei", (1 << 60) * N),
        ("1e3", 1_000 * N),
        ("1E3", 1_000 * N),
        ("1e+3", 1_000 * N),
        ("1e-3", 1_000_000),
        ("129e6", 129_000_000 * N),
        ("1.5Gi", 3 * (GI / 2) * N),
        ("0.1Ki", 102_400_000_000),
        (".5", N / 2),
        ("5.", 5 * N),
        ("007", 7 * N),
        ("1.000000000", N),
        ("-0", 0),
        ("0e999999999999", 0),
    ];
    for (text, expected) in cases {
        assert_eq!(nanos(text), *expected, "{text}");
    }
}

#[test]
fn finer_than_nano_rounds_up_away_from_zero() {
    assert_eq!(nanos("0.1n"), 1);
    assert_eq!(nanos("1.0000000001"), N + 1);
    assert_eq!(nanos("-0.1n"), -1);
    assert_eq!(nanos("1e-30"), 1);
    assert_eq!(nanos("1e-999999999999999"), 1);
    // exactly representable: no rounding
    assert_eq!(nanos("1.5n"), 2);
    assert_eq!(nanos("1.000000001"), N + 1);
    // 1n of a binary suffix is exact in nanos (1024) .. 1e-12Ki = 1.024e-9
    assert_eq!(nanos("0.000000000001Ki"), 2);
}

#[test]
fn rejects_garbage_with_the_reason() {
    for (text, fragment) in [
        ("", "empty"),
        ("-", "no digits"),
        ("+", "no digits"),
        (".", "no digits"),
        ("Gi", "no digits"),
        ("1Gb", "unknown suffix"),
        ("1K", "unknown suffix"),
        ("1 Gi", "unknown suffix"),
        (" 1", "no digits"),
        ("1e", "unknown suffix"),
        ("1e+", "unknown suffix"),
        ("1e1.5", "unknown suffix"),
        ("1Ki5", "unknown suffix"),
        ("1.2.3", "unknown suffix"),
        ("--1", "no digits"),
        ("0x10", "unknown suffix"),
        ("1_000", "unknown suffix"),
        ("١", "no digits"),
    ] {
        let err = Quantity::parse(text).expect_err(text).to_string();
        assert!(err.contains(fragment), "{text:?}: {err}");
    }
}

#[test]
fn rejects_out_of_range_and_overlong() {
    for text in [
        "1e30",
        "1e1000",
        "999999999999999999999999999999999Ei",
        "1e100000000",
    ] {
        assert!(
            matches!(Quantity::parse(text), Err(QuantityError::OutOfRange { .. })),
            "{text}"
        );
    }
    let long = "1".repeat(MAX_QUANTITY_LEN + 1);
    assert_eq!(
        Quantity::parse(&long),
        Err(QuantityError::TooLong {
            len: MAX_QUANTITY_LEN + 1,
            max: MAX_QUANTITY_LEN
        })
    );
    // the largest accepted magnitude is still exact
    assert_eq!(nanos("1e28"), 10i128.pow(37));
}

#[test]
fn compares_values_across_units() {
    let q = |s: &str| Quantity::parse(s).unwrap();
    assert_eq!(q("1Gi"), q("1024Mi"));
    assert_eq!(q("1Gi"), q("1073741824"));
    assert_eq!(q("1k"), q("1e3"));
    assert!(q("1Gi") > q("1000Mi"));
    assert!(q("1G") < q("1Gi"));
    assert!(q("-1") < q("1m"));
    assert_eq!(q("500m").signum(), 1);
    assert_eq!(q("-500m").signum(), -1);
    assert_eq!(q("0Gi").signum(), 0);
}

#[test]
fn integer_views() {
    let q = |s: &str| Quantity::parse(s).unwrap();
    assert_eq!(q("1.2").ceil_units(), 2);
    assert_eq!(q("-1.2").ceil_units(), -2);
    assert_eq!(q("1Ki").ceil_units(), 1024);
    assert_eq!(q("1Ki").as_i64_exact(), Some(1024));
    assert_eq!(q("1.5").as_i64_exact(), None);
    assert_eq!(q("8Ei").as_i64_exact(), None, "2^63 overflows i64");
    assert_eq!(q("7Ei").as_i64_exact(), Some(7 << 60));
    assert!((q("1.5Ki").as_f64() - 1536.0).abs() < f64::EPSILON);
    assert!((q("-2.5m").as_f64() + 0.0025).abs() < 1e-12);
}

#[test]
fn arithmetic_is_exact_and_checked() {
    let q = |s: &str| Quantity::parse(s).unwrap();
    assert_eq!(q("1Gi").checked_add(&q("1Gi")), Some(q("2Gi")));
    assert_eq!(q("1").checked_sub(&q("1m")), Some(q("999m")));
    let big = Quantity::from_nanos(i128::MAX);
    assert_eq!(big.checked_add(&q("1n")), None);
    assert_eq!(Quantity::from_nanos(i128::MIN).checked_sub(&q("1n")), None);
}

#[test]
fn canonical_text_round_trips() {
    for (text, canonical) in [
        ("1536Mi", "1536Mi"),
        ("1.5Gi", "1536Mi"),
        ("1024Ki", "1Mi"),
        ("512Ki", "512Ki"),
        ("100Ki", "100Ki"),
        ("0.5Ki", "512"),
        ("1.5G", "1500M"),
        ("0.5", "500m"),
        ("1000", "1k"),
        ("-1000", "-1k"),
        ("1e3", "1e3"),
        ("1.5e3", "1500"),
        ("0", "0"),
        ("0Gi", "0"),
        ("1n", "1n"),
        ("2000E", "2000E"),
        ("1e21", "1e21"),
        ("5000000000000000000000", "5000E"),
    ] {
        let q = Quantity::parse(text).unwrap();
        assert_eq!(q.canonical(), canonical, "{text}");
        assert_eq!(Quantity::parse(canonical).unwrap(), q, "{canonical}");
    }
}

#[test]
fn serde_trims_surrounding_whitespace_like_kubernetes_but_parse_stays_strict() {
    let ten = Quantity::parse("10Gi").unwrap();
    for text in [
        "\" 10Gi \"",
        "\"10Gi   \"",
        "\"\u{a0}10Gi\u{3000}\"",
        "\"\u{85}10Gi\"",
    ] {
        let q: Quantity = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(q, ten, "{text}");
    }
    let q: Quantity = serde_json::from_value(serde_json::json!(" 1.5Gi ")).unwrap();
    assert_eq!(q, Quantity::parse("1536Mi").unwrap());
    // Go trims the raw JSON text: an escaped tab or newline is not trimmed there
    for text in ["\"\\t10Gi\"", "\"10Gi\\n\"", "\"10 Gi\"", "\"   \""] {
        assert!(serde_json::from_str::<Quantity>(text).is_err(), "{text}");
    }
    let err = serde_json::from_str::<Quantity>("\"  \"").unwrap_err();
    assert!(err.to_string().contains("quantity is empty"), "{err}");
    // the parser itself (CEL's quantity()) does not trim
    for text in [" 10Gi", "10Gi ", "\u{a0}10Gi"] {
        assert!(Quantity::parse(text).is_err(), "{text:?}");
    }
}

#[test]
fn serde_accepts_strings_and_bare_numbers() {
    let q: Quantity = serde_json::from_str("\"10Gi\"").unwrap();
    assert_eq!(q, Quantity::parse("10Gi").unwrap());
    let q: Quantity = serde_json::from_str("1073741824").unwrap();
    assert_eq!(q, Quantity::parse("1Gi").unwrap());
    let q: Quantity = serde_json::from_str("-3").unwrap();
    assert_eq!(q.ceil_units(), -3);
    let q: Quantity = serde_json::from_str("0.5").unwrap();
    assert_eq!(q, Quantity::parse("500m").unwrap());
    let q: Quantity = serde_json::from_str("1e9").unwrap();
    assert_eq!(q, Quantity::parse("1G").unwrap());
    let err = serde_json::from_str::<Quantity>("1e308").unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    for bad in ["true", "null", "[1]", "{}", "\"ten\""] {
        assert!(serde_json::from_str::<Quantity>(bad).is_err(), "{bad}");
    }
    assert_eq!(
        serde_json::to_string(&Quantity::parse("1.5Gi").unwrap()).unwrap(),
        "\"1536Mi\""
    );
}
