//! [`refund`] (and [`peek`] before it) against the exact model, at rates that do not divide
//! 1e9: what comes back, the reply, and whether the key is written or deleted.

use super::*;

#[test]
fn peek_and_refund_against_the_model() {
    // (rate, capacity, costs taken first, peek cost, refund): at rates that do not divide.
    let rows: [(f64, f64, &[f64], f64, f64); 4] = [
        (3.0, 3.0, &[1.0, 1.0], 2.0, 1.0),
        (7.0, 7.0, &[7.0], 1.0, 3.0),
        (0.3, 5.0, &[2.0, 2.0], 0.0, 10.0), // refund more than taken: capped, key deleted
        (333_333.0, 100.0, &[99.0], 2.0, 0.0),
    ];
    for (rate, capacity, takes, peek_cost, back) in rows {
        let lim = limit(rate, capacity);
        let mut m = model::Model::new(rate, capacity);
        let mut st = None;
        for &c in takes {
            let (d, new) = acquire(&lim, st, NOW_US, cost(c));
            assert_matches(&d, &m.acquire(NOW_US, c), &format!("take, rate {rate}"));
            st = new.or(st);
        }
        let later = NOW_US + 1234;
        let d = peek(&lim, st, later, cost(peek_cost));
        assert_matches(&d, &m.peek(later, peek_cost), &format!("peek, rate {rate}"));
        // A refund of `back` is the model's bucket with `back × T` less debt, capped at full.
        let (d, change) = refund(&lim, st, later, cost(back));
        let mut refunded = m.clone();
        refunded.refund(later, back);
        assert_matches(
            &d,
            &refunded.peek(later, 0.0),
            &format!("refund, rate {rate}"),
        );
        let full = refunded.is_full(later);
        assert_eq!(
            change == Change::Delete,
            full && back > 0.0,
            "deletes iff full, rate {rate}"
        );
        if let Change::Set(new) = change {
            assert!(!full, "a full bucket is deleted, not written");
            assert_matches(
                &peek(&lim, Some(new), later, Cost::ONE),
                &refunded.peek(later, 1.0),
                &format!("state after refund, rate {rate}"),
            );
        }
    }
}
