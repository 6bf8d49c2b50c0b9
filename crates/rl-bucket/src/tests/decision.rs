//! [`Decision`]'s millisecond views: rounded up, so that waiting that long is enough.

use super::*;

#[test]
fn millisecond_views_round_up() {
    use Outcome::{Allowed, Denied, Impossible};
    // (outcome, retry_after_ns, reset_after_ns) → (retry_after_ms, reset_after_ms)
    let rows: Vec<(Outcome, u64, u64, i64, i64)> = vec![
        // Allowed and full: both zero.
        (Allowed, 0, 0, 0, 0),
        // Allowed is always retry 0; reset of 1 ns is 1 ms.
        (Allowed, 0, 1, 0, 1),
        // A 1 ns wait is a 1 ms wait, never 0.
        (Denied, 1, 1, 1, 1),
        // Whole ms stay as they are; one ns more is one ms more.
        (Denied, MS, MS, 1, 1),
        (Denied, MS + 1, MS + 1, 2, 2),
        // Impossible is -1 whatever the ns field says.
        (Impossible, 0, 5 * MS, -1, 5),
        // The largest reset fits an i64 of ms.
        (
            Denied,
            u64::MAX,
            u64::MAX,
            18_446_744_073_710,
            18_446_744_073_710,
        ),
    ];
    for (i, (outcome, retry_ns, reset_ns, retry_ms, reset_ms)) in rows.into_iter().enumerate() {
        let d = Decision {
            outcome,
            remaining: 0,
            balance: 0,
            retry_after_ns: retry_ns,
            reset_after_ns: reset_ns,
        };
        assert_eq!(d.retry_after_ms(), retry_ms, "row {i} retry");
        assert_eq!(d.reset_after_ms(), reset_ms, "row {i} reset");
    }
}
