//! Kubernetes resource quantities (`gpu_dra_api::quantity::Quantity`), as
//! device capacities, MPS memory limits and CEL's `quantity()` read them.
//!
//! Checked beyond "no panic": a parsed quantity's canonical text parses
//! back to the same value (what the plugin publishes is what it read), and
//! from then on to the same text; `Deserialize` takes what `parse` takes, to
//! the same value; the arithmetic the allocator does (`checked_add`,
//! `checked_sub`, `ceil_units`) never panics.

#![no_main]

use gpu_dra_api::config::mps_memory_limit;
use gpu_dra_api::quantity::Quantity;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Two quantities when the input holds a separator: the arithmetic gets
    // two independent operands.
    let (left, right) = text.split_once('|').unwrap_or((text, "1"));
    let parsed = Quantity::parse(left);
    let via_serde = serde_json::from_value::<Quantity>(serde_json::Value::String(left.to_owned()));
    let Ok(q) = parsed else {
        return;
    };
    // Deserialize also trims spaces around the text (as Kubernetes trims
    // the raw JSON), so it accepts more; what parse takes, it takes alike.
    assert_eq!(
        via_serde.ok(),
        Some(q),
        "Deserialize disagrees with parse on {left:?}"
    );
    let canonical = q.canonical();
    let back = Quantity::parse(&canonical)
        .unwrap_or_else(|e| panic!("canonical {canonical:?} of {left:?} does not parse: {e}"));
    assert_eq!(
        back, q,
        "canonical {canonical:?} of {left:?} changes the value"
    );
    // Not necessarily the same text at once: a binary quantity that is no
    // multiple of 1024 is written without a suffix, which reads back as a
    // decimal one ("399669999999969999562.5Ki" -> "409262079999969279552000"
    // -> "409262079999969279552k"), as in Kubernetes; the text settles then.
    let settled = back.canonical();
    let again = Quantity::parse(&settled).expect("a canonical text parses");
    assert_eq!(
        again, q,
        "canonical {settled:?} of {left:?} changes the value"
    );
    assert_eq!(
        again.canonical(),
        settled,
        "canonical text of {left:?} does not settle"
    );
    let _ = (
        q.signum(),
        q.is_whole(),
        q.ceil_units(),
        q.as_i64_exact(),
        q.as_f64(),
    );
    let _ = mps_memory_limit(&q);
    if let Ok(r) = Quantity::parse(right) {
        if let Some(sum) = q.checked_add(&r) {
            assert_eq!(
                sum.checked_sub(&r),
                Some(q),
                "{left:?} + {right:?} - {right:?}"
            );
            let _ = sum.canonical();
        }
        let _ = q.checked_sub(&r);
        let _ = q.cmp(&r);
    }
});
