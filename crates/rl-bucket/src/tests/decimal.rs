//! [`Decimal::parse`]: the plain decimal grammar, exactly, and everything it refuses.

use super::*;

#[test]
fn decimals_parse_exactly_in_the_plain_grammar() {
    // (text, Some((digits, exp10)) for digits × 10^exp10, or None for not a decimal).
    type Row = (&'static [u8], Option<(u128, i32)>);
    let rows: &[Row] = &[
        (b"0.5", Some((5, -1))),      // fraction
        (b"100", Some((1, 2))),       // integer, stored without trailing zeros
        (b"2.5e3", Some((25, 2))),    // exponent
        (b"1E2", Some((1, 2))),       // upper-case exponent
        (b"1e+2", Some((1, 2))),      // signed exponent
        (b"1e-2", Some((1, -2))),     // negative exponent
        (b"007", Some((7, 0))),       // leading zeros
        (b".5", Some((5, -1))),       // no leading digit
        (b"5.", Some((5, 0))),        // no trailing digit
        (b"+2", Some((2, 0))),        // a plus sign
        (b"0.1", Some((1, -1))),      // exactly a tenth, not the double
        (b"0", Some((0, 0))),         // zero
        (b"-0", Some((0, 0))),        // minus zero is zero, as it was
        (b"0.000e7", Some((0, 0))),   // zero in any spelling
        (b"1e300", Some((1, 300))),   // huge: ranges refuse it later
        (b"1e-300", Some((1, -300))), // tiny: ranges refuse it later
        (
            b"99999999999999999999999999999999999999",
            Some((u128::pow(10, 38) - 1, 0)),
        ), // 38 digits
        (
            b"1000000000000000000000000000000000000000000",
            Some((1, 42)),
        ), // zeros do not count
        (
            b"0.00000000000000000000000000000000000000000001",
            Some((1, -44)),
        ),
        (b"999999999999999999999999999999999999999", None), // 39 significant digits
        (b"1e999999999", Some((1, 999_999_999))),           // the largest exponent
        (b"1e-999999999", Some((1, -999_999_999))),
        (b"1e1000000000", None), // beyond it: refused, not clamped
        (b"10e999999999", None),
        (b"0.1e-999999999", None),
        (b"1e99999999999999999999999", None),
        (b"0e99999999999999999999999", Some((0, 0))), // zero in any spelling
        (b"-1", None),                                // negative
        (b"", None),                                  // empty
        (b".", None),                                 // a point alone
        (b"e5", None),                                // an exponent alone
        (b"1e", None),                                // an exponent without digits
        (b" 1", None),                                // leading space
        (b"1 ", None),                                // trailing space
        (b"1x", None),                                // trailing junk
        (b"nan", None),                               // NaN spelled out
        (b"inf", None),                               // infinity spelled out
        (b"0x10", None),                              // hex
        (b"1,5", None),                               // locale comma
        (b"1..2", None),                              // two points
        (b"+-1", None),                               // two signs
        (b"1/2", None),  // a fraction is a rate's form, not a decimal's
        (b"\xff", None), // not UTF-8
    ];
    for (text, want) in rows {
        let got = Decimal::parse(text).map(|d| (d.digits(), d.exp10()));
        assert_eq!(got, *want, "{:?}", String::from_utf8_lossy(text));
    }
}

#[test]
fn powers_of_ten_are_every_one_that_fits_128_bits() {
    for n in 0..=40u32 {
        assert_eq!(crate::decimal::pow10(n), 10u128.checked_pow(n), "10^{n}");
    }
}
