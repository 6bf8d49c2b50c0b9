//! [`Cost`]: which doubles are costs.

use super::*;

#[test]
fn cost_new_accepts_finite_non_negative_only() {
    let rows: Vec<(f64, bool)> = vec![
        // The default cost.
        (1.0, true),
        // Zero is a valid probe.
        (0.0, true),
        // Fractions and huge values are valid costs (huge ones are Impossible later).
        (0.5, true),
        (f64::MIN_POSITIVE, true),
        (1e300, true),
        // Not a number, infinities, negatives, however small.
        (f64::NAN, false),
        (f64::INFINITY, false),
        (f64::NEG_INFINITY, false),
        (-1.0, false),
        (-f64::MIN_POSITIVE, false),
    ];
    for (tokens, valid) in rows {
        let got = Cost::new(tokens);
        assert_eq!(got.is_some(), valid, "Cost::new({tokens})");
        if let Some(c) = got {
            assert_eq!(c.tokens(), tokens);
        }
    }
    assert_eq!(Cost::ONE.tokens(), 1.0);
}
