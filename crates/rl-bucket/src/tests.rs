//! Unit tests for the pure token bucket: tables for the exact replies, a long run for drift,
//! and properties for the invariants.
//!
//! Time is injected: every test picks its own `now_us`, so nothing here reads a clock or
//! depends on how fast it runs. Expected values are worked out by hand from the model
//! (`tokens(now) = capacity - max(0, full_at - now) / T`, `T = 1e9 / rate` ns), never copied
//! from the implementation.

use super::*;
use crate::ticks::MAX_TICKS_PER_NS;
use proptest::prelude::*;
use Outcome::{Allowed, Denied};

/// A realistic instant: 2023-11-14T22:13:20Z, in µs.
const NOW_US: u64 = 1_700_000_000_000_000;
const NOW_NS: u64 = NOW_US * 1_000;
const MS: u64 = 1_000_000; // ns
const S: u64 = 1_000_000_000; // ns
const S_US: u64 = 1_000_000; // µs

fn limit(rate_per_s: f64, capacity: f64) -> Limit {
    Limit::new(rate_per_s, capacity).unwrap()
}

fn cost(tokens: f64) -> Cost {
    Cost::new(tokens).unwrap()
}

fn state(full_at_ns: u64) -> State {
    State::from_full_at_ns(full_at_ns).unwrap()
}

// ---------------------------------------------------------------------------------------------
// One call: every field of the reply.
// ---------------------------------------------------------------------------------------------

/// A call's inputs. `full_at_ns: None` is a missing key.
struct Call {
    rate: f64,
    capacity: f64,
    full_at_ns: Option<u64>,
    now_us: u64,
    cost: f64,
}

/// A call's expected reply. `writes` is the new `full_at_ns`, `None` when nothing is written.
struct Reply {
    outcome: Outcome,
    remaining: u64,
    retry: (u64, i64), // (ns, ms view)
    reset: (u64, i64), // (ns, ms view)
    writes: Option<u64>,
}

fn call(rate: f64, capacity: f64, full_at_ns: Option<u64>, now_us: u64, cost: f64) -> Call {
    Call {
        rate,
        capacity,
        full_at_ns,
        now_us,
        cost,
    }
}

fn reply(
    outcome: Outcome,
    remaining: u64,
    retry: (u64, i64),
    reset: (u64, i64),
    writes: Option<u64>,
) -> Reply {
    Reply {
        outcome,
        remaining,
        retry,
        reset,
        writes,
    }
}

#[test]
fn acquire_replies_exactly() {
    use Outcome::{Allowed, Denied, Impossible};
    // At 5/s a token is T = 200 ms; at 1/s, T = 1 s.
    let rows: Vec<(Call, Reply)> = vec![
        // A missing key is a full bucket: 10 - 1 = 9 left, full again one token (200 ms) later.
        (
            call(5.0, 10.0, None, NOW_US, 1.0),
            reply(Allowed, 9, (0, 0), (200 * MS, 200), Some(NOW_NS + 200 * MS)),
        ),
        // A full_at long past is the same full bucket; the take counts from now, not from it.
        (
            call(5.0, 10.0, Some(NOW_NS - 5 * S), NOW_US, 1.0),
            reply(Allowed, 9, (0, 0), (200 * MS, 200), Some(NOW_NS + 200 * MS)),
        ),
        // full_at == now is exactly full.
        (
            call(5.0, 10.0, Some(NOW_NS), NOW_US, 1.0),
            reply(Allowed, 9, (0, 0), (200 * MS, 200), Some(NOW_NS + 200 * MS)),
        ),
        // Cost 0 on a full bucket: allowed, takes nothing, nothing to write.
        (
            call(5.0, 10.0, None, NOW_US, 0.0),
            reply(Allowed, 10, (0, 0), (0, 0), None),
        ),
        // Cost 0 on a bucket 1 s (5 tokens) short: reports 5, still writes nothing.
        (
            call(5.0, 10.0, Some(NOW_NS + S), NOW_US, 0.0),
            reply(Allowed, 5, (0, 0), (S, 1000), None),
        ),
        // 5 tokens short, take 1: full_at moves by exactly one T.
        (
            call(5.0, 10.0, Some(NOW_NS + S), NOW_US, 1.0),
            reply(
                Allowed,
                4,
                (0, 0),
                (1200 * MS, 1200),
                Some(NOW_NS + 1200 * MS),
            ),
        ),
        // Empty (2 s = 10 tokens short): denied, nothing written, next token in 200 ms.
        (
            call(5.0, 10.0, Some(NOW_NS + 2 * S), NOW_US, 1.0),
            reply(Denied, 0, (200 * MS, 200), (2 * S, 2000), None),
        ),
        // Half a token held: the whole token is 100 ms away.
        (
            call(5.0, 10.0, Some(NOW_NS + 1900 * MS), NOW_US, 1.0),
            reply(Denied, 0, (100 * MS, 100), (1900 * MS, 1900), None),
        ),
        // 1 ns past a whole ms: both ms views round UP, so a client waiting that long gets in.
        (
            call(5.0, 10.0, Some(NOW_NS + 1900 * MS + 1), NOW_US, 1.0),
            reply(Denied, 0, (100 * MS + 1, 101), (1900 * MS + 1, 1901), None),
        ),
        // 1 ns short of full: remaining rounds DOWN to 9, reset rounds up to 1 ms.
        (
            call(5.0, 10.0, Some(NOW_NS + 1), NOW_US, 0.0),
            reply(Allowed, 9, (0, 0), (1, 1), None),
        ),
        // Cost above capacity can never succeed: Impossible, retry -1, nothing written, and
        // remaining still reports the bucket.
        (
            call(5.0, 10.0, None, NOW_US, 11.0),
            reply(Impossible, 10, (0, -1), (0, 0), None),
        ),
        // ... on an empty bucket too: -1, not a wait, even though cost is only 0.5 over.
        (
            call(5.0, 10.0, Some(NOW_NS + 2 * S), NOW_US, 10.5),
            reply(Impossible, 0, (0, -1), (2 * S, 2000), None),
        ),
        // Cost equal to capacity on a full bucket is allowed and empties it.
        (
            call(5.0, 10.0, None, NOW_US, 10.0),
            reply(Allowed, 0, (0, 0), (2 * S, 2000), Some(NOW_NS + 2 * S)),
        ),
        // ... but only when completely full: 1 ns short, it is denied for 1 ns (1 ms rounded up).
        (
            call(5.0, 10.0, Some(NOW_NS + 1), NOW_US, 10.0),
            reply(Denied, 9, (1, 1), (1, 1), None),
        ),
        // Capacity lowered from 100 to 10 while 50 tokens (10 s at 5/s) were out: the debt is
        // kept, so 0 remain and the first token is back once the debt is under 9 tokens (1.8 s).
        (
            call(5.0, 10.0, Some(NOW_NS + 10 * S), NOW_US, 1.0),
            reply(Denied, 0, (8200 * MS, 8200), (10 * S, 10_000), None),
        ),
        // full_at far beyond now + capacity × T (a clock stepped back 1000 s): 0, denied, and
        // the retry is the real wait, not capped at one refill of the bucket.
        (
            call(5.0, 10.0, Some(NOW_NS + 1000 * S), NOW_US, 1.0),
            reply(
                Denied,
                0,
                (998_200 * MS, 998_200),
                (1000 * S, 1_000_000),
                None,
            ),
        ),
        // full_at at the last representable instant (2262): the token would come back in
        // time, but taking it then would store an instant past 2262, so a retry could only be
        // answered "impossible". Impossible now, not a promise that fails later; no overflow.
        (
            call(5.0, 10.0, Some(MAX_FULL_AT_NS), NOW_US, 1.0),
            reply(
                Impossible,
                0,
                (0, -1),
                (7_523_372_036_854_775_807, 7_523_372_036_855),
                None,
            ),
        ),
        // One token (2e8 ns) before that instant, the take at the retry still fits: denied,
        // with the wait until one token of the 10 is back (debt - 9 × 2e8 ns).
        (
            call(5.0, 10.0, Some(MAX_FULL_AT_NS - 200 * MS), NOW_US, 1.0),
            reply(
                Denied,
                0,
                (7_523_372_034_854_775_807, 7_523_372_034_855),
                (7_523_372_036_654_775_807, 7_523_372_036_655),
                None,
            ),
        ),
        // Capacity 2.5 at 1/s: a full bucket shows 2 whole tokens; taking 1 leaves 1.5, shown as 1.
        (
            call(1.0, 2.5, None, NOW_US, 1.0),
            reply(Allowed, 1, (0, 0), (S, 1000), Some(NOW_NS + S)),
        ),
        // Capacity 2.5, 1.5 held: taking 1 leaves 0.5, shown as 0 but not an empty bucket.
        (
            call(1.0, 2.5, Some(NOW_NS + S), NOW_US, 1.0),
            reply(Allowed, 0, (0, 0), (2 * S, 2000), Some(NOW_NS + 2 * S)),
        ),
        // Capacity 2.5, 0.5 held: a whole token is half a second away ...
        (
            call(1.0, 2.5, Some(NOW_NS + 2 * S), NOW_US, 1.0),
            reply(Denied, 0, (500 * MS, 500), (2 * S, 2000), None),
        ),
        // ... but the half token it holds can be taken now.
        (
            call(1.0, 2.5, Some(NOW_NS + 2 * S), NOW_US, 0.5),
            reply(
                Allowed,
                0,
                (0, 0),
                (2500 * MS, 2500),
                Some(NOW_NS + 2500 * MS),
            ),
        ),
        // Capacity 2.5, full: the whole 2.5 can be taken at once.
        (
            call(1.0, 2.5, None, NOW_US, 2.5),
            reply(
                Allowed,
                0,
                (0, 0),
                (2500 * MS, 2500),
                Some(NOW_NS + 2500 * MS),
            ),
        ),
        // Capacity 2.5: cost 2.6 can never fit.
        (
            call(1.0, 2.5, None, NOW_US, 2.6),
            reply(Impossible, 2, (0, -1), (0, 0), None),
        ),
        // Cost 0.5 from a full bucket of 10 at 1/s: 9.5 left, shown as 9, full in 500 ms.
        (
            call(1.0, 10.0, None, NOW_US, 0.5),
            reply(Allowed, 9, (0, 0), (500 * MS, 500), Some(NOW_NS + 500 * MS)),
        ),
        // Slowest rate, largest capacity it accepts (3153 tokens: a century of refill). The
        // decimal 0.000001 is one token per 1e15 ns exactly: a whole-ns state, no fraction.
        // (0.2.0 took the double just below it: 1e15 + 0.045… ns, a state with a fraction.)
        (
            call(1e-6, 3153.0, None, NOW_US, 1.0),
            reply(
                Allowed,
                3152,
                (0, 0),
                (1_000_000_000_000_000, 1_000_000_000),
                Some(NOW_NS + 1_000_000_000_000_000),
            ),
        ),
        // Fastest rate (1 token per ns), capacity 1: the take refills in 1 ns ...
        (
            call(1e9, 1.0, None, NOW_US, 1.0),
            reply(Allowed, 0, (0, 0), (1, 1), Some(NOW_NS + 1)),
        ),
        // ... so 1 ns short of full is denied for 1 ns, reported as 1 ms.
        (
            call(1e9, 1.0, Some(NOW_NS + 1), NOW_US, 1.0),
            reply(Denied, 0, (1, 1), (1, 1), None),
        ),
        // Fastest rate, largest capacity: emptying it refills in 1e15 ns.
        (
            call(1e9, 1e15, None, NOW_US, 1e15),
            reply(
                Allowed,
                0,
                (0, 0),
                (1_000_000_000_000_000, 1_000_000_000),
                Some(NOW_NS + 1_000_000_000_000_000),
            ),
        ),
        // A take whose full_at would pass 2262 cannot be stored: Impossible, state untouched.
        // (now is 1_807 ns before MAX_FULL_AT_NS; the take needs 1 s.)
        (
            call(1.0, 10.0, None, MAX_FULL_AT_NS / 1000 - 1, 1.0),
            reply(Impossible, 10, (0, -1), (0, 0), None),
        ),
        // A now_us so large that now_ns saturates: no panic, nothing written.
        (
            call(1.0, 10.0, None, u64::MAX, 1.0),
            reply(Impossible, 10, (0, -1), (0, 0), None),
        ),
        // The smallest state (1 ns after the epoch) is simply a full bucket today.
        (
            call(1.0, 10.0, Some(1), NOW_US, 1.0),
            reply(Allowed, 9, (0, 0), (S, 1000), Some(NOW_NS + S)),
        ),
    ];

    for (i, (c, want)) in rows.iter().enumerate() {
        let lim = limit(c.rate, c.capacity);
        let before = c.full_at_ns.map(state);
        let (got, new_state) = acquire(&lim, before, c.now_us, cost(c.cost));
        let at = format!(
            "row {i} (rate {}, capacity {}, cost {})",
            c.rate, c.capacity, c.cost
        );
        assert_eq!(got.outcome, want.outcome, "outcome, {at}");
        assert_eq!(got.allowed(), want.outcome == Allowed, "allowed(), {at}");
        assert_eq!(got.remaining, want.remaining, "remaining, {at}");
        assert_eq!(got.retry_after_ns, want.retry.0, "retry_after_ns, {at}");
        assert_eq!(got.retry_after_ms(), want.retry.1, "retry_after_ms, {at}");
        assert_eq!(got.reset_after_ns, want.reset.0, "reset_after_ns, {at}");
        assert_eq!(got.reset_after_ms(), want.reset.1, "reset_after_ms, {at}");
        assert_eq!(
            new_state.map(State::full_at_ns),
            want.writes,
            "new state, {at}"
        );
    }
}

#[test]
fn doc_example_first_call_leaves_nine_and_resets_in_200_ms() {
    let (decision, new_state) = acquire(&limit(5.0, 10.0), None, 1_000_000, Cost::ONE);
    assert!(decision.allowed());
    assert_eq!(decision.remaining, 9);
    assert_eq!(decision.retry_after_ms(), 0);
    assert_eq!(decision.reset_after_ms(), 200);
    assert_eq!(
        new_state.map(State::full_at_ns),
        Some(1_000_000_000 + 200 * MS)
    );
}

// ---------------------------------------------------------------------------------------------
// Sequences: the state returned by one call is the input of the next.
// ---------------------------------------------------------------------------------------------

/// One call in a sequence and what it must decide and report.
struct Step {
    at_us: u64,
    cost: f64,
    outcome: Outcome,
    remaining: u64,
}

fn step(at_us: u64, cost: f64, outcome: Outcome, remaining: u64) -> Step {
    Step {
        at_us,
        cost,
        outcome,
        remaining,
    }
}

#[test]
fn sequences_burst_refill_and_clock_steps() {
    use Outcome::{Allowed, Denied};
    let t = NOW_US;
    // All at 1 token/s with a capacity of 3, starting from a missing key.
    let scenarios: Vec<(&str, Vec<Step>)> = vec![
        // Burst then deny: three calls at one instant drain it, the fourth is denied.
        (
            "burst then deny",
            vec![
                step(t, 1.0, Allowed, 2),
                step(t, 1.0, Allowed, 1),
                step(t, 1.0, Allowed, 0),
                step(t, 1.0, Denied, 0),
            ],
        ),
        // Refill after time: a token is back exactly 1 s after the burst, not 1 µs sooner,
        // and only one.
        (
            "refill after 1 s",
            vec![
                step(t, 3.0, Allowed, 0),
                step(t + S_US - 1, 1.0, Denied, 0),
                step(t + S_US, 1.0, Allowed, 0),
                step(t + S_US, 1.0, Denied, 0),
            ],
        ),
        // Refill stops at capacity: after 100 s idle the bucket holds 3, not 100.
        (
            "refill caps at capacity",
            vec![
                step(t, 3.0, Allowed, 0),
                step(t + 100 * S_US, 0.0, Allowed, 3),
                step(t + 100 * S_US, 3.0, Allowed, 0),
                step(t + 100 * S_US, 1.0, Denied, 0),
            ],
        ),
        // Partial refill: 2.5 s after draining, 2.5 tokens are back (2 whole); taking 2 leaves
        // half a token, which is not enough for 1 until another 0.5 s has passed.
        (
            "partial refill",
            vec![
                step(t, 3.0, Allowed, 0),
                step(t + 2_500_000, 0.0, Allowed, 2),
                step(t + 2_500_000, 2.0, Allowed, 0),
                step(t + 2_500_000, 1.0, Denied, 0),
                step(t + 2_999_999, 1.0, Denied, 0),
                step(t + 3_000_000, 1.0, Allowed, 0),
            ],
        ),
        // A clock stepping back 1 s never adds tokens: remaining falls from 2 to 1, a cost of
        // 2 that would fit at the later time is denied, and after a take at the later time,
        // the earlier time sees an empty bucket.
        (
            "clock steps back",
            vec![
                step(t, 3.0, Allowed, 0),
                step(t + 2 * S_US, 0.0, Allowed, 2),
                step(t + S_US, 0.0, Allowed, 1),
                step(t + S_US, 2.0, Denied, 1),
                step(t + 2 * S_US, 2.0, Allowed, 0),
                step(t + S_US, 1.0, Denied, 0),
                // Back at t the bucket owes 5 s, more than its whole capacity (3 s): even
                // cost 0 ("am I limited?") is denied.
                step(t, 0.0, Denied, 0),
            ],
        ),
        // A take at a later time is charged from the stored full_at, so stepping back after it
        // finds the bucket emptier, not fuller: at t+10 s it holds 3 and gives one (2 left);
        // back at t it is 11 s short of full, 0 remain and 1 is denied; the next token is
        // there at t+9 s (2 s short), not before.
        (
            "take then step back 10 s",
            vec![
                step(t + 10 * S_US, 1.0, Allowed, 2),
                // 11 s short of full is more than the capacity (3 s): cost 0 is denied too.
                step(t, 0.0, Denied, 0),
                step(t, 1.0, Denied, 0),
                step(t + 8_999_999, 1.0, Denied, 0),
                step(t + 9 * S_US, 1.0, Allowed, 0),
            ],
        ),
    ];

    let lim = limit(1.0, 3.0);
    for (name, steps) in &scenarios {
        let mut current: Option<State> = None;
        for (i, s) in steps.iter().enumerate() {
            let (d, new_state) = acquire(&lim, current, s.at_us, cost(s.cost));
            assert_eq!(d.outcome, s.outcome, "{name}: step {i} outcome");
            assert_eq!(d.remaining, s.remaining, "{name}: step {i} remaining");
            assert_eq!(
                new_state.is_some(),
                s.outcome == Allowed && s.cost > 0.0,
                "{name}: step {i} writes only when it takes something"
            );
            current = new_state.or(current);
        }
    }
}

#[test]
fn clock_stepping_back_never_adds_tokens() {
    // At 5/s (T = 200 ms), capacity 10: each level probed with cost 0 at t and at t - 1 s.
    let lim = limit(5.0, 10.0);
    let rows: Vec<(Option<u64>, u64, u64)> = vec![
        // A missing key is full at any time.
        (None, 10, 10),
        // Exactly full at t: 1 s (5 tokens) short a second earlier.
        (Some(NOW_NS), 10, 5),
        // Half a token short at t (9.5): 5.5 short (4.5) a second earlier.
        (Some(NOW_NS + 100 * MS), 9, 4),
        // Half empty at t: empty a second earlier.
        (Some(NOW_NS + S), 5, 0),
        // 1 ns of refill short of a token at t: 0 either way.
        (Some(NOW_NS + 2 * S - 1), 0, 0),
        // Empty at t.
        (Some(NOW_NS + 2 * S), 0, 0),
        // Far beyond empty.
        (Some(NOW_NS + 60 * S), 0, 0),
        // Full since t - 1 s + 1 ns: at t - 1 s it is 1 ns short, so 9 whole tokens.
        (Some(NOW_NS - S + 1), 10, 9),
    ];
    let back_us = NOW_US - S_US;
    for (level, at_t, at_back) in rows {
        let st = level.map(state);
        let (now_probe, _) = acquire(&lim, st, NOW_US, Cost::new(0.0).unwrap());
        let (back_probe, _) = acquire(&lim, st, back_us, Cost::new(0.0).unwrap());
        assert_eq!(now_probe.remaining, at_t, "level {level:?} at t");
        assert_eq!(back_probe.remaining, at_back, "level {level:?} at t - 1 s");
        for c in [0.5, 1.0, 2.0, 4.5, 9.5, 10.0] {
            let (later, written) = acquire(&lim, st, NOW_US, cost(c));
            let (earlier, _) = acquire(&lim, st, back_us, cost(c));
            assert!(
                !earlier.allowed() || later.allowed(),
                "level {level:?} cost {c}: allowed after the step back but not before"
            );
            // A take at t, then a call at t - 1 s: no more than the take left.
            if let Some(w) = written {
                let (back, _) = acquire(&lim, Some(w), back_us, Cost::new(0.0).unwrap());
                assert!(
                    back.remaining <= later.remaining,
                    "level {level:?} cost {c}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Validated inputs.
// ---------------------------------------------------------------------------------------------

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
fn rates_parse_as_exact_decimals_and_fractions() {
    // (rate text, T as (ticks_per_token, ticks_per_ns)), all with a capacity of 1.
    let rows: &[(&str, (u128, u64))] = &[
        ("10", (100_000_000, 1)),                 // 0.1 s a token
        ("0.1", (10_000_000_000, 1)),             // one token per 10 s exactly, whole ns
        ("0.01", (100_000_000_000, 1)),           // whole ns: the inline 8-byte state
        ("0.000001", (1_000_000_000_000_000, 1)), // the slowest rate, whole ns
        ("1e-6", (1_000_000_000_000_000, 1)),
        ("1000000000", (1, 1)),       // the fastest rate
        ("3", (1_000_000_000, 3)),    // 1e9 / 3 ns: a fraction of a ns
        ("0.3", (10_000_000_000, 3)), // 3 per 10 s exactly
        ("100/60", (600_000_000, 1)), // 100 a minute: 0.6 s a token
        ("5/1", (200_000_000, 1)),
        ("3/10", (10_000_000_000, 3)),
        ("7/3", (3_000_000_000, 7)),
        ("1/3600", (3_600_000_000_000, 1)),        // one an hour
        ("2.5/0.5", (200_000_000, 1)),             // both decimals: 5/s
        ("1/1e-9", (1, 1)),                        // the fastest rate, as a fraction
        ("1/1000000", (1_000_000_000_000_000, 1)), // the slowest rate, as a fraction
        ("+2", (500_000_000, 1)),
        // 19 significant digits whose exact T still fits the finest tick: exact.
        (
            "1.000000000000000001",
            (10u128.pow(27), 1_000_000_000_000_000_001),
        ),
    ];
    for &(rate, want) in rows {
        let limit =
            Limit::parse(rate.as_bytes(), b"1").unwrap_or_else(|e| panic!("rate {rate}: {e:?}"));
        assert_eq!(limit.ns_per_token(), want, "rate {rate}");
        let model = model::Model::parse(rate, "1").ns_per_token();
        let (p, q) = want;
        assert_eq!(
            model,
            num_rational::BigRational::new(p.into(), q.into()),
            "rate {rate} against the model"
        );
    }
}

/// 0.1.0 and 0.2.0 took a rate as its double's exact value and stored the instants it made
/// (rounded up to 2^-63 ns). Read under the decimal rate, such an instant is re-expressed in
/// the decimal's ticks, rounded up: never earlier (never laxer), and less than one tick
/// (plus the 2^-63 ns of the stored rounding) later.
#[test]
fn states_written_under_the_double_read_at_most_one_tick_stricter() {
    use num_rational::BigRational;
    let two63 = BigRational::new(1.into(), num_bigint::BigInt::from(1u64) << 63);
    for rate in [
        0.1,
        0.3,
        0.000001,
        0.001,
        0.01,
        3.0,
        7.0,
        1e-5,
        123.456,
        0.0003208400192360113,
    ] {
        let decimal = Limit::new(rate, 1e6f64.min(rate * MAX_REFILL_S).floor()).unwrap();
        let (_, q) = decimal.ns_per_token();
        let tick = BigRational::new(1.into(), q.into());
        let t_double = BigRational::from_integer(1_000_000_000.into()) / model::exact_double(rate);
        for takes in [1u64, 7, 1000] {
            // What the old code stored: the exact instant, its fraction rounded up.
            let old = BigRational::from_integer(NOW_NS.into())
                + BigRational::from_integer(takes.into()) * &t_double;
            let ns = old.floor();
            let frac = ((&old - &ns) * BigRational::from_integer((1u64 << 63).into())).ceil();
            let st = State::from_parts(
                ns.to_integer().try_into().unwrap(),
                frac.to_integer().try_into().unwrap(),
            )
            .unwrap();
            let read = BigRational::new(st.ticks(q).into(), q.into());
            assert!(read >= old, "rate {rate}, {takes} takes: read earlier");
            assert!(
                read < &old + &tick + &two63,
                "rate {rate}, {takes} takes: a tick or more later"
            );
        }
    }
}

#[test]
fn huge_decimals_count_through_their_ratio() {
    // 10/s from two decimals near the exponent limit (too large for the model to build).
    let limit = Limit::parse(b"1e999999999/1e999999998", b"1").unwrap();
    assert_eq!(limit.ns_per_token(), (100_000_000, 1));
    let limit = Limit::parse(b"3e-999999999/1e-999999998", b"1").unwrap();
    assert_eq!(limit.ns_per_token(), (10_000_000_000, 3)); // 0.3/s
}

#[test]
fn rates_and_capacities_out_of_range_name_their_argument() {
    use LimitError::{Capacity, Rate, RefillTime};
    let rows: &[(&str, &str, LimitError)] = &[
        ("0.0000009", "1", Rate),                      // below 1e-6/s
        ("0.00000099999999999999999999", "1", Rate),   // just below, past a double's digits
        ("1000000001", "1", Rate),                     // above 1e9/s
        ("1000000000.0000000000000000001", "1", Rate), // just above, exactly
        ("1/1000001", "1", Rate),                      // below, as a fraction
        ("1000000001/1", "1", Rate),                   // above, as a fraction
        ("1/0.0000000009", "1", Rate),
        ("0", "1", Rate),
        ("0/1", "1", Rate),
        ("1/0", "1", Rate),
        ("1/", "1", Rate),
        ("/1", "1", Rate),
        ("1/2/3", "1", Rate),
        ("1 /2", "1", Rate),
        ("-1/-2", "1", Rate),
        // A huge N over a huge S: the ratio counts, so exponents are never clamped.
        ("1e999999999/1e999999989", "1", Rate), // 1e10 per second
        ("1e2000000000/1e2000000000", "1", Rate), // beyond the exponent limit: not decimals
        ("inf", "1", Rate),
        ("x", "x", Rate), // the first bad argument is named
        ("0", "x", Rate),
        ("1", "0", Capacity),
        ("1", "-1", Capacity),
        ("1", "1000000000000000.1", Capacity),
        ("1", "x", Capacity),
        ("1", "3153600001", RefillTime),  // a century and a second
        ("1/60", "52560001", RefillTime), // 1 a minute: a century is 52,560,000 tokens
        ("0.000001", "3154", RefillTime),
    ];
    for &(rate, capacity, want) in rows {
        assert_eq!(
            Limit::parse(rate.as_bytes(), capacity.as_bytes()),
            Err(want),
            "rate {rate} capacity {capacity}"
        );
    }
    // The ends of every range are included.
    for (rate, capacity) in [
        ("0.000001", "3153.6"),
        ("1/60", "52560000"),
        ("1000000000", "1000000000000000"),
        ("1", "3153600000"),
        ("1", "0.000000000000000000000000000001"),
    ] {
        assert!(
            Limit::parse(rate.as_bytes(), capacity.as_bytes()).is_ok(),
            "rate {rate} capacity {capacity}"
        );
    }
}

#[test]
fn rates_finer_than_the_finest_tick_round_toward_the_slower_rate() {
    use num_rational::BigRational;
    // Their exact T needs a denominator above 2^62; the rate's decimals are cut to 18
    // significant digits (tokens down, period up), which only makes the limit stricter, and
    // by less than a part in 1e17.
    for rate in [
        "1.000000000000000000000001", // 25 digits: T's denominator is 10^24 + 1
        "3.141592653589793238462643383279", // 31 digits
        "1/3.000000000000000000000001", // the period rounds up
        "7.000000000000000000000003/1.00000000000000000000007",
        "0.0000010000000000000000000000001", // just above the slowest rate: stays in range
    ] {
        let limit = Limit::parse(rate.as_bytes(), b"1").unwrap();
        let (p, q) = limit.ns_per_token();
        assert!(q <= MAX_TICKS_PER_NS, "rate {rate}");
        let got = BigRational::new(p.into(), q.into());
        let exact = model::Model::parse(rate, "1").ns_per_token();
        assert!(got >= exact, "rate {rate}: T {got} is laxer than {exact}");
        let bound = &exact / BigRational::from_integer(100_000_000_000_000_000u64.into());
        assert!(&got - &exact < bound, "rate {rate}: T {got} vs {exact}");
        assert!(got <= BigRational::from_integer(1_000_000_000_000_000u64.into()));
    }
}

#[test]
fn limit_new_accepts_only_the_documented_ranges() {
    use LimitError::{Capacity, Rate, RefillTime};
    let rows: Vec<(f64, f64, Result<(), LimitError>)> = vec![
        // The doc example.
        (5.0, 10.0, Ok(())),
        // Both ends of the rate range are included.
        (1e-6, 1.0, Ok(())),
        (1e9, 1.0, Ok(())),
        // The largest capacity is included (at a rate that refills it within 100 years).
        (1e6, 1e15, Ok(())),
        // A full refill of exactly 100 years is included; a longer one is not.
        (1.0, 3_153_600_000.0, Ok(())),
        (1.0, 3_153_600_001.0, Err(RefillTime)),
        (1e-6, 1e15, Err(RefillTime)),
        // Any positive capacity, however small.
        (1.0, f64::MIN_POSITIVE, Ok(())),
        // Fractional capacity.
        (1.0, 2.5, Ok(())),
        // Rate: not a number, infinite, zero, negative, just out of range.
        (f64::NAN, 10.0, Err(Rate)),
        (f64::INFINITY, 10.0, Err(Rate)),
        (f64::NEG_INFINITY, 10.0, Err(Rate)),
        (0.0, 10.0, Err(Rate)),
        (-0.0, 10.0, Err(Rate)),
        (-5.0, 10.0, Err(Rate)),
        // Just below 1e-6/s.
        (9.999_999e-7, 10.0, Err(Rate)),
        // Just above 1e9/s.
        (1.000_000_1e9, 10.0, Err(Rate)),
        // Capacity: not a number, infinite, zero, negative, just above 1e15.
        (5.0, f64::NAN, Err(Capacity)),
        (5.0, f64::INFINITY, Err(Capacity)),
        (5.0, f64::NEG_INFINITY, Err(Capacity)),
        (5.0, 0.0, Err(Capacity)),
        (5.0, -0.0, Err(Capacity)),
        (5.0, -1.0, Err(Capacity)),
        (5.0, 1.000_000_1e15, Err(Capacity)),
    ];
    for (rate, capacity, want) in rows {
        let got = Limit::new(rate, capacity);
        assert_eq!(got.map(|_| ()), want, "Limit::new({rate}, {capacity})");
        if let Ok(l) = got {
            assert_eq!((l.rate_per_s(), l.capacity()), (rate, capacity));
        }
    }
    // Both halves wrong is still an error (which one is reported is not specified).
    assert!(Limit::new(f64::NAN, f64::NAN).is_err());
    assert!(Limit::new(f64::INFINITY, f64::INFINITY).is_err());
}

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

#[test]
fn state_range_and_expiry_rounding() {
    let rows: Vec<(u64, Option<u64>)> = vec![
        // Zero is not a state (it cannot live in a non-null pointer).
        (0, None),
        // 1 ns is the smallest state; it expires at the first ms.
        (1, Some(1)),
        // Just under, at, and just over a whole ms: expiry rounds up.
        (999_999, Some(1)),
        (1_000_000, Some(1)),
        (1_000_001, Some(2)),
        // A realistic instant.
        (NOW_NS, Some(NOW_NS / MS)),
        (NOW_NS + 1, Some(NOW_NS / MS + 1)),
        // The last representable instant (i64::MAX ns) rounds up too.
        (MAX_FULL_AT_NS, Some(9_223_372_036_855)),
        // Past it: not a state this code writes.
        (MAX_FULL_AT_NS + 1, None),
        (u64::MAX, None),
    ];
    for (full_at_ns, expire_at_ms) in rows {
        let got = State::from_full_at_ns(full_at_ns);
        assert_eq!(
            got.map(State::expire_at_ms),
            expire_at_ms,
            "full_at_ns {full_at_ns}"
        );
        if let Some(s) = got {
            assert_eq!(s.full_at_ns(), full_at_ns);
        }
    }
}

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
            retry_after_ns: retry_ns,
            reset_after_ns: reset_ns,
        };
        assert_eq!(d.retry_after_ms(), retry_ms, "row {i} retry");
        assert_eq!(d.reset_after_ms(), reset_ms, "row {i} reset");
    }
}

// ---------------------------------------------------------------------------------------------
// Extreme limits.
// ---------------------------------------------------------------------------------------------

#[test]
fn extreme_limits_never_panic_and_keep_the_invariants() {
    let limits = [
        (1e-6, 3153.0),
        (1e-6, 1.0),
        (1e-6, 1e-9),
        (1e9, 1.0),
        (1e9, 1e15),
        (1e9, 0.5),
        (1.0, 3_153_600_000.0),
        (3.0, 7.0),
    ];
    let nows = [
        0,
        1,
        NOW_US,
        MAX_FULL_AT_NS / 1000,
        u64::MAX / 1000,
        u64::MAX,
    ];
    for (rate, capacity) in limits {
        let lim = limit(rate, capacity);
        let costs = [
            0.0,
            f64::MIN_POSITIVE,
            1e-9,
            0.5,
            1.0,
            capacity / 2.0,
            capacity,
            capacity * 2.0,
            1e300,
        ];
        for now_us in nows {
            let now_ns = now_us.saturating_mul(1000);
            let full_ats = [
                None,
                Some(1),
                Some(now_ns),
                Some(now_ns.saturating_add(1)),
                Some(now_ns.saturating_add(S)),
                Some(MAX_FULL_AT_NS),
            ];
            for full_at in full_ats {
                let st = full_at.map(|ns| state(ns.clamp(1, MAX_FULL_AT_NS)));
                for c in costs {
                    let at =
                        format!("rate {rate} capacity {capacity} now_us {now_us} {st:?} cost {c}");
                    let (d, new_state) = acquire(&lim, st, now_us, cost(c));
                    assert!(
                        d.remaining as f64 <= capacity.floor(),
                        "remaining above capacity, {at}"
                    );
                    assert_eq!(
                        d.retry_after_ms() == -1,
                        d.outcome == Outcome::Impossible,
                        "{at}"
                    );
                    match d.outcome {
                        Outcome::Allowed if c > 0.0 => {
                            let new = new_state.expect("an allowed take writes");
                            let new_full_at = new.full_at_ns();
                            let old = st.map_or((0, 0), |s| (s.full_at_ns(), s.full_at_frac()));
                            assert!(
                                (new_full_at, new.full_at_frac()) > old.max((now_ns, 0)),
                                "take moved full_at, {at}"
                            );
                            let frac = new_state.map_or(0, State::full_at_frac);
                            assert_eq!(
                                d.reset_after_ns,
                                new_full_at + u64::from(frac > 0) - now_ns,
                                "{at}"
                            );
                        }
                        Outcome::Allowed => assert_eq!(new_state, None, "cost 0 writes, {at}"),
                        Outcome::Denied => {
                            assert_eq!(new_state, None, "denial writes, {at}");
                            assert!(d.retry_after_ns > 0, "denied with no wait, {at}");
                            assert!(d.retry_after_ns <= d.reset_after_ns, "{at}");
                            // The promise: the same request after retry_after_ms is allowed.
                            let wait_us = d.retry_after_ms().unsigned_abs() * 1000;
                            let (later, _) = acquire(&lim, st, now_us + wait_us, cost(c));
                            assert_eq!(later.outcome, Outcome::Allowed, "retry broke, {at}");
                        }
                        Outcome::Impossible => {
                            assert_eq!(new_state, None, "impossible writes, {at}");
                            // The other direction: "impossible" within capacity is only
                            // right when the take truly cannot be stored.
                            assert!(
                                c > capacity || take_cannot_be_stored(&lim, st, now_us, c),
                                "wrongly impossible, {at}"
                            );
                        }
                    }

                    if c > capacity {
                        assert_eq!(d.outcome, Outcome::Impossible, "cost above capacity, {at}");
                    }
                }
            }
        }
    }
}

/// Issue 14, section 5: a denial promised a retry whose take could not be stored (past 2262),
/// and the retry was then answered "impossible". The issue's minimal case, with the rate now
/// the exact decimal (the take at the retry still overshoots 2262 by about 90 s).
#[test]
fn a_denial_never_promises_a_take_that_cannot_be_stored() {
    let lim = Limit::parse(b"0.0003208400192360113", b"926102").unwrap();
    let st = Some(state(6_962_815_599_086_584_832));
    let (now_us, c) = (1_602_655_139_564_614, 725_277.0);
    assert!(take_cannot_be_stored(&lim, st, now_us, c));
    let (d, writes) = acquire(&lim, st, now_us, cost(c));
    assert_eq!(
        (d.outcome, d.retry_after_ms(), writes),
        (Outcome::Impossible, -1, None)
    );
    assert_eq!(peek(&lim, st, now_us, cost(c)).outcome, Outcome::Impossible);
    // The same bucket with room for the take: an ordinary denial, and its promise holds.
    let (p, q) = lim.ns_per_token();
    let take_ns = (725_277 * p).div_ceil(u128::from(q)) as u64;
    let st = Some(state(MAX_FULL_AT_NS - take_ns - 1));
    let (d, _) = acquire(&lim, st, now_us, cost(c));
    assert_eq!(d.outcome, Outcome::Denied);
    let at_us = now_us + d.retry_after_ns.div_ceil(1000);
    let (later, writes) = acquire(&lim, st, at_us, cost(c));
    assert_eq!(later.outcome, Outcome::Allowed);
    assert!(writes.unwrap().full_at_ns() <= MAX_FULL_AT_NS);
}

#[test]
fn cost_equal_to_capacity_empties_a_full_bucket() {
    // (rate, capacity): the whole burst is taken at once, and refills in capacity × T.
    let rows: Vec<(f64, f64, u64)> = vec![
        // The doc example's limit: 10 tokens at 5/s refill in 2 s.
        (5.0, 10.0, 2 * S),
        // Fastest rate, one token: 1 ns.
        (1e9, 1.0, 1),
        // Fastest rate, largest capacity: 1e15 ns (11.6 days).
        (1e9, 1e15, 1_000_000_000_000_000),
        // Slowest rate, one token: 1e15 ns exactly (the decimal 0.000001, not the double
        // just below it, which 0.2.0 took and which refilled in 1e15 + 0.045… ns).
        (1e-6, 1.0, 1_000_000_000_000_000),
        // Slowest rate, 1000 tokens: 1e18 ns (31.7 years), still representable.
        (1e-6, 1000.0, 1_000_000_000_000_000_000),
        // Fractional capacity at 1/s: 2.5 s.
        (1.0, 2.5, 2500 * MS),
    ];
    for (rate, capacity, refill_ns) in rows {
        let (d, new_state) = acquire(&limit(rate, capacity), None, NOW_US, cost(capacity));
        let at = format!("rate {rate} capacity {capacity}");
        assert_eq!(d.outcome, Outcome::Allowed, "{at}");
        assert_eq!(d.remaining, 0, "{at}");
        assert_eq!(d.reset_after_ns, refill_ns, "{at}");
        // The whole nanoseconds of the state, plus its fraction, round up to the reset.
        let st = new_state.unwrap();
        assert_eq!(
            st.full_at_ns() + u64::from(st.full_at_frac() > 0),
            NOW_NS + refill_ns,
            "{at}"
        );
    }
}

/// A full refill must fit in the state (which ends in 2262), or a full bucket would report
/// tokens it cannot hand out. `Limit::new` therefore caps `capacity / rate` at 100 years, and
/// at that cap a full bucket's `remaining` is takeable in one request.
#[test]
fn refills_longer_than_a_century_are_rejected_and_the_longest_is_takeable() {
    for (rate, capacity) in [(1e-6, 1e15), (1e-6, 1e4), (1.0, 1e15)] {
        assert_eq!(
            Limit::new(rate, capacity),
            Err(LimitError::RefillTime),
            "{rate} {capacity}"
        );
    }
    for (rate, capacity) in [(1e-6, 3153.0), (1.0, 3_153_600_000.0), (1e6, 1e15)] {
        let lim = limit(rate, capacity);
        let (probe, _) = acquire(&lim, None, NOW_US, Cost::new(0.0).unwrap());
        assert_eq!(probe.remaining as f64, capacity.floor());
        let (d, _) = acquire(&lim, None, NOW_US, cost(probe.remaining as f64));
        assert_eq!(
            d.outcome,
            Outcome::Allowed,
            "rate {rate} capacity {capacity}: {d:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// No drift: a saturated caller over a million calls gets exactly the model's count.
// ---------------------------------------------------------------------------------------------

/// A rate as an exact fraction of tokens per second, so the model needs no floats.
#[derive(Clone, Copy, Debug)]
struct Rate {
    num: u64,
    den: u64,
}

impl Rate {
    fn per_s(self) -> f64 {
        self.num as f64 / self.den as f64
    }

    /// `floor(rate × ns / 1e9)`: whole tokens refilled in `ns`.
    fn tokens_in(self, ns: u64) -> u64 {
        let t = u128::from(ns) * u128::from(self.num) / (u128::from(self.den) * u128::from(S));
        u64::try_from(t).unwrap()
    }

    /// `floor(1e9 / rate)`: the token interval in whole ns.
    fn interval_ns(self) -> u64 {
        S * self.den / self.num
    }
}

/// How the injected clock advances between calls. Every step is at most one token interval,
/// so the caller never skips a refilled token, and on average well under it, so it stays
/// saturated after draining the burst.
#[derive(Clone, Copy, Debug)]
enum Clock {
    /// Call `i` is at `start + floor(i × interval × num / den)`, truncated to µs: below one
    /// µs per token this makes several calls per µs tick.
    Fraction(u64, u64),
    /// Steps drawn uniformly from `0..=interval` µs (xorshift, fixed seed).
    Random(u64),
}

struct Run {
    allowed: u64,
    calls: u64,
    first_us: u64,
    last_us: u64,
}

fn drive(
    rate: Rate,
    capacity: u64,
    cost_tokens: u64,
    start_us: u64,
    calls: u64,
    clock: Clock,
) -> Run {
    let lim = limit(rate.per_s(), capacity as f64);
    let c = cost(cost_tokens as f64);
    let interval_ns = rate.interval_ns();
    let max_step_us = interval_ns / 1000;
    assert!(
        max_step_us >= 1,
        "the µs clock cannot follow a rate above 1e6/s"
    );
    let mut current: Option<State> = None;
    let mut allowed = 0;
    let mut now_us = start_us;
    let mut rng = match clock {
        Clock::Random(seed) => seed | 1,
        Clock::Fraction(..) => 0,
    };
    for i in 0..calls {
        now_us = match clock {
            Clock::Fraction(num, den) => {
                let ns =
                    u128::from(i) * u128::from(interval_ns) * u128::from(num) / u128::from(den);
                start_us + u64::try_from(ns / 1000).unwrap()
            }
            Clock::Random(_) if i == 0 => start_us,
            Clock::Random(_) => {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                now_us + rng % (max_step_us + 1)
            }
        };
        let (d, new_state) = acquire(&lim, current, now_us, c);
        if d.allowed() {
            allowed += 1;
        }
        current = new_state.or(current);
    }
    Run {
        allowed,
        calls,
        first_us: start_us,
        last_us: now_us,
    }
}

/// Rates whose token interval is a whole number of ns.
const EXACT_RATES: [Rate; 10] = [
    Rate { num: 1, den: 1000 }, // 0.001/s: one token per 1000 s
    Rate { num: 1, den: 100 },  // 0.01/s
    Rate { num: 1, den: 2 },    // 0.5/s
    Rate { num: 1, den: 1 },    // 1/s
    Rate { num: 8, den: 1 },    // 8/s: 125 ms
    Rate { num: 10, den: 1 },   // 10/s
    Rate { num: 1000, den: 1 }, // 1000/s: the rate ms-precision limiters get wrong
    Rate { num: 3125, den: 1 }, // 3125/s: 320 µs
    Rate {
        num: 100_000,
        den: 1,
    }, // 100k/s: 10 µs
    Rate {
        num: 1_000_000,
        den: 1,
    }, // 1e6/s: 1 µs, several calls per tick
];

const ODD_START_US: u64 = NOW_US + 123_457;

fn assert_exact(rate: Rate, capacity: u64, cost_tokens: u64, run: &Run, what: &str) {
    let elapsed_ns = (run.last_us - run.first_us) * 1000;
    let model = capacity + elapsed_ns / rate.interval_ns();
    assert_eq!(
        model,
        capacity + rate.tokens_in(elapsed_ns),
        "interval is exact"
    );
    // A saturated caller asking for `cost` each time gets floor(model / cost) takes.
    assert_eq!(
        run.allowed,
        model / cost_tokens,
        "{what}: rate {rate:?}, {} calls",
        run.calls
    );
    assert!(
        run.allowed < run.calls,
        "{what}: the caller was never denied, so never saturated"
    );
}

#[test]
fn no_drift_over_a_million_calls_one_third_interval_steps() {
    for rate in EXACT_RATES {
        let run = drive(rate, 3, 1, NOW_US, 1_000_000, Clock::Fraction(1, 3));
        assert_exact(rate, 3, 1, &run, "steps of T/3");
    }
}

#[test]
fn no_drift_over_a_million_calls_random_steps_odd_start() {
    for (i, rate) in EXACT_RATES.into_iter().enumerate() {
        let run = drive(
            rate,
            5,
            1,
            ODD_START_US,
            1_000_000,
            Clock::Random(0x9e37_79b9 + i as u64),
        );
        assert_exact(rate, 5, 1, &run, "random steps up to T");
    }
}

#[test]
fn no_drift_near_saturation_and_with_integer_costs() {
    for rate in EXACT_RATES {
        // Steps of 0.9 T drain the burst slowly and leave the caller one call from a token.
        let run = drive(rate, 2, 1, ODD_START_US, 200_000, Clock::Fraction(9, 10));
        assert_exact(rate, 2, 1, &run, "steps of 0.9 T");
        // Integer costs are exact too: cost 3 from a capacity of 7.
        let run = drive(rate, 7, 3, NOW_US, 200_000, Clock::Fraction(1, 5));
        assert_exact(rate, 7, 3, &run, "cost 3, steps of T/5");
    }
}

/// The classic bucket, "tokens and last update", in integers: with `T = p / q` ns (from the
/// exact double, reduced by `BigRational`), a token is `p` units and a nanosecond refills `q`
/// units. Independent of `acquire`'s GCRA form and its ticks; forward time only.
struct Classic {
    p: i128,
    q: i128,
    capacity_units: i128,
    tokens_units: i128,
    last_ns: i128,
}

impl Classic {
    fn new(model_ns_per_token: num_rational::BigRational, capacity: u64) -> Self {
        use num_traits::ToPrimitive;
        let p = model_ns_per_token.numer().to_i128().unwrap();
        let q = model_ns_per_token.denom().to_i128().unwrap();
        let capacity_units = i128::from(capacity) * p;
        Self {
            p,
            q,
            capacity_units,
            tokens_units: capacity_units,
            last_ns: 0,
        }
    }

    /// (allowed, remaining) for a take of `cost` at `now_ns`.
    fn take(&mut self, now_ns: i128, cost: u64) -> (bool, u64) {
        if self.last_ns != 0 {
            let refill = (now_ns - self.last_ns) * self.q;
            self.tokens_units = (self.tokens_units + refill).min(self.capacity_units);
        }
        self.last_ns = now_ns;
        let need = i128::from(cost) * self.p;
        let allowed = self.tokens_units >= need;
        if allowed {
            self.tokens_units -= need;
        }
        (allowed, u64::try_from(self.tokens_units / self.p).unwrap())
    }
}

#[test]
fn no_drift_over_a_million_calls_at_rates_that_do_not_divide_1e9() {
    // (rate, capacity, cost, µs between calls): each caller asks faster than the refill, so
    // it is saturated and every call's answer depends on the exact remainder.
    let rows: [(f64, u64, u64, u64); 6] = [
        (3.0, 4, 1, 111_111),   // T = 333_333_333.3… ns: three calls per token
        (7.0, 7, 1, 47_619),    // T = 142_857_142.8… ns
        (0.3, 3, 1, 1_111_111), // 0.3 is the double 5404319552844595 / 2^54
        (333_333.0, 10, 1, 1),  // T = 3000.003 ns: several calls per µs tick
        (3e8, 4500, 1500, 2),   // bytes per second: 1500 B packets, T = 3.3… ns
        (6000.0, 6001, 7, 1),   // redis-cell's 6000/s, integer cost 7
    ];
    for (rate, capacity, cost_tokens, step_us) in rows {
        let lim = limit(rate, capacity as f64);
        let mut classic = Classic::new(model::Model::new(rate, 1.0).ns_per_token(), capacity);
        let mut current = None;
        let (mut allowed, mut model_allowed) = (0u64, 0u64);
        for i in 0..1_000_000u64 {
            let now_us = ODD_START_US + i * step_us;
            let (d, new_state) = acquire(&lim, current, now_us, cost(cost_tokens as f64));
            current = new_state.or(current);
            let (ok, remaining) = classic.take(i128::from(now_us) * 1000, cost_tokens);
            assert_eq!(
                (d.allowed(), d.remaining),
                (ok, remaining),
                "rate {rate}, call {i}"
            );
            allowed += u64::from(d.allowed());
            model_allowed += u64::from(ok);
        }
        assert_eq!(allowed, model_allowed, "rate {rate}");
        assert!(allowed < 1_000_000, "rate {rate}: never saturated");
    }
}

/// Compares one call with the model, every field.
fn assert_matches(d: &Decision, want: &model::Reply, at: &str) {
    let outcome = match want.allowed {
        None => Outcome::Impossible,
        Some(true) => Outcome::Allowed,
        Some(false) => Outcome::Denied,
    };
    assert_eq!(d.outcome, outcome, "outcome, {at}");
    assert_eq!(d.remaining, want.remaining, "remaining, {at}");
    assert_eq!(
        d.retry_after_ns, want.retry_after_ns,
        "retry_after_ns, {at}"
    );
    assert_eq!(
        d.reset_after_ns, want.reset_after_ns,
        "reset_after_ns, {at}"
    );
}

#[test]
fn the_issue_transcripts_hold_in_the_math() {
    // A fresh bucket of 7 at 7/s: one take leaves 6 (it reported 5).
    let (d, st) = acquire(&limit(7.0, 7.0), None, NOW_US, Cost::ONE);
    assert_eq!(
        (d.outcome, d.remaining, d.reset_after_ms()),
        (Allowed, 6, 143)
    );
    // A burst of 3 at 3/s in one instant gets 3 (it got 2).
    let lim = limit(3.0, 3.0);
    let mut current = st.and(None);
    for want_remaining in [2, 1, 0] {
        let (d, st) = acquire(&lim, current, NOW_US, Cost::ONE);
        assert_eq!((d.outcome, d.remaining), (Allowed, want_remaining));
        current = st;
    }
    let (d, _) = acquire(&lim, current, NOW_US, Cost::ONE);
    assert_eq!(
        (d.outcome, d.retry_after_ms(), d.reset_after_ms()),
        (Denied, 334, 1000)
    );
    // RL.THROTTLE t 2 3 10: 3 tokens, 3 per 10 s; redis-cell answers remaining 2, reset 4 s.
    let (d, _) = acquire(
        &Limit::per_period(3, 10 * S, 3.0).unwrap(),
        None,
        NOW_US,
        Cost::ONE,
    );
    assert_eq!((d.remaining, d.reset_after_ns.div_ceil(S)), (2, 4));
    // RL.THROTTLE a 6000 6000 1: 6001 tokens, one taken, 6000 remain (it said 5999).
    let (d, _) = acquire(
        &Limit::per_period(6000, S, 6001.0).unwrap(),
        None,
        NOW_US,
        Cost::ONE,
    );
    assert_eq!(d.remaining, 6000);
}

#[test]
fn three_per_ten_seconds_refills_three_in_ten_seconds() {
    // As a period, "3/10", or the decimal 0.3: exactly 3 tokens in 10 s, and 2 just before.
    // (0.2.0 took 0.3 as its double, just below 3/10, and refilled 2 in 10 s.)
    let limits = [
        Limit::per_period(3, 10 * S, 3.0).unwrap(),
        Limit::parse(b"3/10", b"3").unwrap(),
        Limit::parse(b"0.3", b"3").unwrap(),
        limit(0.3, 3.0),
    ];
    for lim in limits {
        let (_, st) = acquire(&lim, None, NOW_US, cost(3.0));
        assert_eq!(peek(&lim, st, NOW_US + 10 * S_US, Cost::ONE).remaining, 3);
        assert_eq!(
            peek(&lim, st, NOW_US + 10 * S_US - 1, Cost::ONE).remaining,
            2
        );
    }
}

#[test]
fn zero_cost_after_a_limit_shrank_is_denied_until_the_debt_fits() {
    // Drained at capacity 10 and 1/s, then asked at capacity 4: it owes 10 s, 6 s past full.
    let (_, st) = acquire(&limit(1.0, 10.0), None, NOW_US, cost(10.0));
    let small = limit(1.0, 4.0);
    let d = peek(&small, st, NOW_US, cost(0.0));
    assert_eq!(
        (d.outcome, d.remaining, d.retry_after_ms()),
        (Denied, 0, 6000)
    );
    let (d, writes) = acquire(&small, st, NOW_US, cost(0.0));
    assert_eq!((d.outcome, d.retry_after_ns, writes), (Denied, 6 * S, None));
    // Waiting that long is enough, and 1 µs less is not.
    assert_eq!(
        acquire(&small, st, NOW_US + 6 * S_US, cost(0.0)).0.outcome,
        Allowed
    );
    assert_eq!(
        acquire(&small, st, NOW_US + 6 * S_US - 1, cost(0.0))
            .0
            .outcome,
        Denied
    );
}

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

// ---------------------------------------------------------------------------------------------
// Properties.
// ---------------------------------------------------------------------------------------------

/// The longest full refill the generated limits have: the 100-year cap itself, so states
/// (up to 2.5 refills past 2020–2033) reach past 2262, where a take cannot be stored and a
/// denial must not promise one (`a_denial_never_promises_a_take_that_cannot_be_stored`).
const HORIZON_S: f64 = MAX_REFILL_S;

/// A stored state's exact instant, in ns: `full_at_ns + full_at_frac × 2^-63`.
fn instant(st: State) -> num_rational::BigRational {
    num_rational::BigRational::new(
        (num_bigint::BigInt::from(st.full_at_ns()) << 63) + st.full_at_frac(),
        num_bigint::BigInt::from(1u64) << 63,
    )
}

/// Whether taking `cost` at `now_us`, or after the retry a denial would promise, truly needs
/// an instant at or past `MAX_FULL_AT_NS + 1`, so "impossible" was the right answer for a
/// cost within capacity. Exact, with the slack the bucket may use: 2 ns for the cost and the
/// stored instant each rounded up to a tick, and 1 ms for a retry rounded up to whole ms
/// (which can start the take up to 1 ms after the stored instant).
fn take_cannot_be_stored(lim: &Limit, st: Option<State>, now_us: u64, cost: f64) -> bool {
    use num_rational::BigRational;
    let (p, q) = lim.ns_per_token();
    let t = BigRational::new(p.into(), q.into());
    let now = BigRational::from_integer((u128::from(now_us) * 1000).into());
    let full = st.map_or(now.clone(), instant).max(now);
    let need = full + model::exact(cost) * t;
    // A state is never 0 either: an instant within the epoch's first ns cannot be stored.
    let too_early = need < BigRational::from_integer(1.into());
    too_early
        || need + BigRational::from_integer((2 + MS).into())
            >= BigRational::from_integer((u128::from(MAX_FULL_AT_NS) + 1).into())
}

/// Valid limits: capacity whole, in quarter tokens, or any fraction up to 1e6; rate
/// log-uniform between the slowest the horizon allows and 1e9/s.
fn limits() -> impl Strategy<Value = Limit> {
    let capacity = prop_oneof![
        (1u32..=10).prop_map(f64::from),
        (1u32..=1_000_000).prop_map(f64::from),
        (1u32..=4_000_000).prop_map(|q| f64::from(q) / 4.0),
        1e-3..=1e6f64,
    ];
    capacity.prop_flat_map(|capacity| {
        let slowest = (capacity / HORIZON_S).max(MIN_RATE_PER_S).log10();
        (slowest..=9.0).prop_map(move |e| {
            let rate = 10f64.powf(e).clamp(MIN_RATE_PER_S, MAX_RATE_PER_S);
            limit(rate, capacity)
        })
    })
}

/// Times between 2020 and 2033, in µs.
fn nows() -> impl Strategy<Value = u64> {
    1_577_836_800_000_000u64..=2_000_000_000_000_000
}

/// A state near `now`: missing; full_at anywhere from one full refill before now to 2.5
/// refills after (beyond empty), plus some ns of jitter off the µs grid; or exactly on the
/// edge of holding `k` whole tokens (`(capacity - k) × T` short of full, ± 1 ns), where
/// float rounding in the whole-token count is most likely to be off by one.
fn states(lim: Limit, now_us: u64) -> impl Strategy<Value = Option<State>> {
    let ns_per_token = 1e9 / lim.rate_per_s();
    let full_ns = lim.capacity() * ns_per_token;
    let now_ns = now_us * 1000;
    let whole = lim.capacity().floor() as u64;
    prop_oneof![
        1 => Just(None),
        4 => (-1.0..=2.5f64, -1000i64..=1000).prop_map(move |(f, jitter)| {
            let at = now_ns as f64 + f * full_ns + jitter as f64;
            State::from_full_at_ns(at.max(1.0) as u64)
        }),
        3 => (0..=whole, 0u64..=2).prop_map(move |(k, nudge)| {
            let edge_ns = ((lim.capacity() - k as f64) * ns_per_token).floor() as u64;
            State::from_full_at_ns((now_ns + edge_ns + nudge).saturating_sub(1))
        }),
    ]
}

/// A cost for `lim`: zero, whole, a quarter multiple, any fraction of capacity, capacity
/// itself, or (rarely) above it.
fn costs(lim: Limit) -> impl Strategy<Value = f64> {
    let capacity = lim.capacity();
    let whole_max = capacity.ceil().min(1e6) as u64;
    prop_oneof![
        1 => Just(0.0),
        3 => (1..=whole_max.max(1)).prop_map(|k| k as f64),
        2 => (1..=(whole_max * 4).max(1)).prop_map(|q| q as f64 / 4.0),
        3 => (0.0..=1.0f64).prop_map(move |f| f * capacity),
        1 => Just(capacity),
        1 => (1.0..=2.0f64).prop_map(move |f| f * capacity),
    ]
}

/// A limit, a time, a state near it and a cost.
fn cases() -> impl Strategy<Value = (Limit, u64, Option<State>, f64)> {
    (limits(), nows())
        .prop_flat_map(|(lim, now_us)| (Just(lim), Just(now_us), states(lim, now_us), costs(lim)))
}

proptest! {
    /// The bucket never holds more than capacity, a denial or a cost of 0 writes nothing,
    /// and `remaining` is exact: a request for it succeeds, one for a token more does not.
    #[test]
    fn never_above_capacity_and_remaining_is_takeable((lim, now_us, st, c) in cases()) {
        let (d, new_state) = acquire(&lim, st, now_us, cost(c));
        let capacity = lim.capacity();
        prop_assert!(d.remaining as f64 <= capacity.floor());
        match d.outcome {
            Outcome::Allowed => {
                prop_assert_eq!(new_state.is_some(), c > 0.0);
                // What is left is at most capacity - cost (whole tokens, rounded down).
                prop_assert!(d.remaining as f64 <= (capacity - c).floor());
            }
            Outcome::Denied | Outcome::Impossible => prop_assert_eq!(new_state, None),
        }
        if c > capacity {
            prop_assert_eq!(d.outcome, Outcome::Impossible);
        } else if d.outcome == Outcome::Impossible {
            // Within capacity, only a take that cannot be stored (past 2262) is impossible.
            prop_assert!(take_cannot_be_stored(&lim, st, now_us, c), "wrongly impossible");
        }

        let after = new_state.or(st);
        if d.remaining > 0 {
            let (take, _) = acquire(&lim, after, now_us, cost(d.remaining as f64));
            prop_assert_eq!(take.outcome, Outcome::Allowed, "remaining {} not takeable", d.remaining);
        }
        let (more, _) = acquire(&lim, after, now_us, cost(d.remaining as f64 + 1.0));
        prop_assert!(!more.allowed(), "remaining {} + 1 was takeable too", d.remaining);
    }

    /// A denied request is still denied 1 µs before `retry_after` (rounded up to the µs
    /// clock) and allowed at it, and at the rounded-up ms view.
    #[test]
    fn denied_just_before_retry_after_and_allowed_at_it((lim, now_us, st, c) in cases()) {
        let (d, _) = acquire(&lim, st, now_us, cost(c));
        if d.outcome == Outcome::Denied {
            prop_assert!(d.retry_after_ns > 0);
            prop_assert!(d.retry_after_ms() > 0);
            let wait_us = d.retry_after_ns.div_ceil(1000);
            let (just_before, _) = acquire(&lim, st, now_us + wait_us - 1, cost(c));
            prop_assert_eq!(just_before.outcome, Outcome::Denied, "allowed 1 µs early");
            let (at, _) = acquire(&lim, st, now_us + wait_us, cost(c));
            prop_assert_eq!(at.outcome, Outcome::Allowed);
            let wait_ms = u64::try_from(d.retry_after_ms()).unwrap();
            let (at_ms, _) = acquire(&lim, st, now_us + wait_ms * 1000, cost(c));
            prop_assert_eq!(at_ms.outcome, Outcome::Allowed);
        }
    }

    /// If `a` then `b` both succeed at one instant, `a + b` at once succeeds from the same
    /// state: splitting a request never lets more through.
    #[test]
    fn splitting_a_cost_never_lets_more_through(
        ((lim, now_us, st, a), b_frac) in (cases(), 0.0..=1.0f64)
    ) {
        let b_options = [b_frac * lim.capacity(), (b_frac * lim.capacity() * 4.0).floor() / 4.0];
        for b in b_options {
            let (first, s1) = acquire(&lim, st, now_us, cost(a));
            if !first.allowed() {
                continue;
            }
            let (second, _) = acquire(&lim, s1.or(st), now_us, cost(b));
            if second.allowed() {
                let (whole, _) = acquire(&lim, st, now_us, cost(a + b));
                prop_assert!(
                    whole.allowed(),
                    "{} then {} allowed, {} at once {:?}", a, b, a + b, whole
                );
            }
        }
    }

    /// Over any sequence of calls from a full bucket, the tokens granted by time t never
    /// exceed capacity + rate × (t - t0).
    #[test]
    fn granted_never_exceeds_capacity_plus_refill(
        (lim, calls) in limits().prop_flat_map(|lim| {
            let interval_us = (1e6 / lim.rate_per_s()).min(1e12);
            let step = prop_oneof![
                Just(0.0),
                0.0..=(3.0 * interval_us),
                // Long idle gaps, up to the whole refill (capped at ~116 days so that 64 of
                // them stay well inside the representable range).
                0.0..=(3.0 * interval_us * lim.capacity()).min(1e13),
            ];
            (Just(lim), prop::collection::vec((step, costs(lim)), 1..64))
        }),
        start_us in nows(),
    ) {
        let mut current = None;
        let mut now_us = start_us;
        let mut granted = 0.0f64;
        for (step_us, c) in calls {
            now_us += step_us as u64;
            let (d, new_state) = acquire(&lim, current, now_us, cost(c));
            if d.allowed() {
                granted += c;
            }
            current = new_state.or(current);
            let elapsed_s = (now_us - start_us) as f64 / 1e6;
            let model = lim.capacity() + lim.rate_per_s() * elapsed_s;
            // Float noise only, and only in the direction that lets the limiter pass.
            prop_assert!(
                granted <= model * (1.0 + 1e-9),
                "granted {} > model {} after {} s", granted, model, elapsed_s
            );
        }
    }

    /// A clock that steps back never adds tokens: remaining does not rise, and nothing is
    /// allowed at the earlier time that was denied at the later one. This holds both for a
    /// stored state and for the state a take at the later time just wrote.
    #[test]
    fn a_clock_stepping_back_never_adds_tokens(
        (lim, now_us, st, c) in cases(),
        back_us in prop_oneof![1u64..=1000, 1u64..=1_000_000_000_000],
    ) {
        let earlier_us = now_us - back_us;
        // The level, probed with cost 0, is never higher at the earlier time.
        let (probe_now, _) = acquire(&lim, st, now_us, cost(0.0));
        let (probe_back, _) = acquire(&lim, st, earlier_us, cost(0.0));
        prop_assert!(probe_back.remaining <= probe_now.remaining);
        // Whatever the earlier time allows, the later one allows too.
        let (later, written) = acquire(&lim, st, now_us, cost(c));
        let (earlier, _) = acquire(&lim, st, earlier_us, cost(c));
        prop_assert!(!earlier.allowed() || later.allowed());
        // After a take at the later time, stepping back shows no more than was left.
        if let Some(w) = written {
            let (back, _) = acquire(&lim, Some(w), earlier_us, cost(0.0));
            prop_assert!(back.remaining <= later.remaining);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Properties against the exact model (`model.rs`): every field of every reply.
// ---------------------------------------------------------------------------------------------

/// Rates log-uniform over the whole range, and the awkward ones by name.
fn any_rate() -> impl Strategy<Value = f64> {
    prop_oneof![
        3 => (-6.0..=9.0f64).prop_map(|e| 10f64.powf(e).clamp(MIN_RATE_PER_S, MAX_RATE_PER_S)),
        1 => prop::sample::select(vec![3.0, 7.0, 0.3, 333_333.0, 6000.0, 3e8, 1e-6, 1e9, 0.1]),
    ]
}

/// A rate and an integer capacity it accepts (a full refill within the century).
fn integer_limits() -> impl Strategy<Value = (f64, u64)> {
    (
        any_rate(),
        prop_oneof![1u64..=10, 1u64..=1000, 1u64..=1_000_000],
    )
        .prop_filter_map("refill longer than a century", |(rate, capacity)| {
            Limit::new(rate, capacity as f64)
                .ok()
                .map(|_| (rate, capacity))
        })
}

/// Calls of integer costs (0 to capacity + 1) separated by `0..=max_step_us`.
fn integer_calls(capacity: u64, max_step_us: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    let cost = prop_oneof![1 => Just(0u64), 6 => 1..=capacity.min(4), 2 => 0..=capacity + 1];
    prop::collection::vec((0..=max_step_us, cost), 1..48)
}

/// Drives `acquire` and the model through the same calls, comparing every reply.
fn run_against_model(rate: f64, capacity: u64, start_us: u64, calls: &[(u64, u64)]) {
    let lim = limit(rate, capacity as f64);
    let mut m = model::Model::new(rate, capacity as f64);
    let mut current = None;
    let mut now_us = start_us;
    for (i, &(step_us, c)) in calls.iter().enumerate() {
        now_us += step_us;
        let at = format!(
            "rate {rate}, capacity {capacity}, call {i} at +{} µs, cost {c}",
            now_us - start_us
        );
        let seen = peek(&lim, current, now_us, cost(c as f64));
        assert_matches(&seen, &m.peek(now_us, c as f64), &format!("peek, {at}"));
        let (d, new_state) = acquire(&lim, current, now_us, cost(c as f64));
        assert_matches(&d, &m.acquire(now_us, c as f64), &at);
        assert_eq!(
            new_state.is_some(),
            d.allowed() && c > 0,
            "writes iff it took, {at}"
        );
        current = new_state.or(current);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Points 1 and 4: at one instant, from full, takes are allowed while their sum fits, and
    /// every reply (remaining, retry, reset) is the model's; cost 0 included.
    #[test]
    fn bursts_in_one_instant_match_the_model(
        ((rate, capacity), calls) in integer_limits()
            .prop_flat_map(|(r, c)| (Just((r, c)), integer_calls(c, 0))),
        start_us in nows(),
    ) {
        run_against_model(rate, capacity, start_us, &calls);
    }

    /// Points 2 and 4: at random µs instants, refill is exact and every reply is the model's.
    #[test]
    fn calls_at_random_instants_match_the_model(
        ((rate, capacity), calls) in integer_limits().prop_flat_map(|(r, c)| {
            // Steps up to about two token intervals, so calls see partial refills.
            let max_step_us = ((2e6 / r) as u64).clamp(1, 1_000_000_000_000);
            (Just((r, c)), integer_calls(c, max_step_us))
        }),
        start_us in nows(),
    ) {
        run_against_model(rate, capacity, start_us, &calls);
    }

    /// Point 2, the other half: `retry_after_ms` is enough. The same request, made that many
    /// ms later, is allowed (the model agrees, so this is the bucket's promise to a client).
    #[test]
    fn waiting_retry_after_ms_is_enough(
        ((rate, capacity), calls) in integer_limits()
            .prop_flat_map(|(r, c)| (Just((r, c)), integer_calls(c, 0))),
        start_us in nows(),
    ) {
        let lim = limit(rate, capacity as f64);
        let mut current = None;
        for &(_, c) in &calls {
            let (d, new_state) = acquire(&lim, current, start_us, cost(c as f64));
            if d.outcome == Denied {
                let wait_us = u64::try_from(d.retry_after_ms()).unwrap() * 1000;
                let (later, _) = acquire(&lim, current, start_us + wait_us, cost(c as f64));
                prop_assert!(later.allowed(), "denied again after {} ms", d.retry_after_ms());
            }
            current = new_state.or(current);
        }
    }

    /// Point 4: after the capacity shrank below what the bucket owes, cost 0 is denied for
    /// exactly as long as the model says, and RL.PEEK agrees.
    #[test]
    fn zero_cost_after_a_shrink_matches_the_model(
        ((rate, capacity), taken, smaller, wait_us) in integer_limits()
            .prop_filter("room to shrink", |&(_, c)| c >= 2)
            .prop_flat_map(|(r, c)| {
                let interval_us = ((1e6 / r) as u64).clamp(1, 1_000_000_000_000);
                (Just((r, c)), 1..=c, 1..c, 0..=interval_us * c)
            }),
        start_us in nows(),
    ) {
        let (big, small) = (limit(rate, capacity as f64), limit(rate, smaller as f64));
        let mut m = model::Model::new(rate, capacity as f64);
        m.acquire(start_us, taken as f64);
        let (_, st) = acquire(&big, None, start_us, cost(taken as f64));
        let shrunk = m.relimit(&model::Model::new(rate, smaller as f64));
        let now_us = start_us + wait_us;
        let (d, writes) = acquire(&small, st, now_us, cost(0.0));
        assert_matches(&d, &shrunk.clone().acquire(now_us, 0.0), "acquire cost 0");
        prop_assert_eq!(writes, None);
        assert_matches(&peek(&small, st, now_us, cost(0.0)), &shrunk.peek(now_us, 0.0), "peek cost 0");
    }

    /// Point 5: fractional rates, capacities and costs. Following the same takes, the bucket
    /// never allows what the model refuses, and refuses only within its documented bound:
    /// each take charged under one tick (1/den ns) more, and capacity and cost each rounded
    /// by under a tick.
    #[test]
    fn fractional_values_are_never_laxer_and_within_the_bound(
        rate in prop_oneof![Just(0.5), Just(3.0), Just(0.3), any_rate()],
        capacity_tenths in 1u32..=100_000,
        calls in prop::collection::vec((0u64..=2_000_000, 0u32..=50), 1..48),
        start_us in nows(),
    ) {
        let capacity = f64::from(capacity_tenths) / 10.0;
        let Ok(lim) = Limit::new(rate, capacity) else { return Ok(()) };
        let ticks_per_ns = lim.ns_per_token().1;
        let mut m = model::Model::new(rate, capacity);
        let mut current = None;
        let mut now_us = start_us;
        let mut takes = 0u64;
        for (step_us, tenths) in calls {
            now_us += step_us;
            let c = f64::from(tenths) / 10.0;
            let (d, new_state) = acquire(&lim, current, now_us, cost(c));
            let zero = num_rational::BigRational::from_integer(0.into());
            let model_allows = m.fits_within(now_us, c, &zero);
            if d.allowed() {
                prop_assert!(model_allows, "allowed {} that the model refuses", c);
                if c > 0.0 {
                    m.force_take(now_us, c);
                    takes += 1;
                }
            } else if model_allows {
                let bound = num_rational::BigRational::new(
                    (takes + 2).into(),
                    ticks_per_ns.into(),
                );
                prop_assert!(
                    !m.fits_within(now_us, c, &-bound),
                    "refused {} by more than {} ticks", c, takes + 2
                );
            }
            current = new_state.or(current);
        }
    }

    /// RL.THROTTLE's limits, "count per period seconds", are exact as fractions: bursts and
    /// refills match the model of `period × 1e9 / count` ns per token.
    #[test]
    fn per_period_limits_match_the_model(
        count in prop_oneof![1u64..=10, 1u64..=1_000_000_000],
        period_s in prop_oneof![1u64..=60, 1u64..=3_153_600],
        max_burst in 0u64..=100,
        calls in prop::collection::vec((0u64..=3_000_000, 0u64..=3), 1..32),
        start_us in nows(),
    ) {
        let total = max_burst + 1;
        let Ok(lim) = Limit::per_period(count, period_s * S, total as f64) else { return Ok(()) };
        let mut m = model::Model::per_period(count, period_s * S, total as f64);
        let mut current = None;
        let mut now_us = start_us;
        for (step_us, c) in calls {
            now_us += step_us;
            let (d, new_state) = acquire(&lim, current, now_us, cost(c as f64));
            assert_matches(&d, &m.acquire(now_us, c as f64), &format!("{count} per {period_s} s"));
            current = new_state.or(current);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Decimal and N/S rates, refunds and stored instants, against the exact model.
// ---------------------------------------------------------------------------------------------

/// A rate as a user types it: a decimal with random digits and exponent (`3.7e-4`,
/// `0.0123`, `81`), or `N/S` from pairs that do not divide (100/60, 7/3, 3/10) or random
/// ones, some with decimal parts. Only texts `Limit::parse` accepts with `capacity`.
fn rate_texts() -> impl Strategy<Value = String> {
    prop_oneof![
        // digits × 10^exp: 1 to 17 digits, anywhere from 1e-6 to 1e9.
        (1u64..=99_999_999_999_999_999, -22i32..=9).prop_map(|(m, e)| format!("{m}e{e}")),
        (1u64..=9_999, 0u32..=8).prop_map(|(m, frac)| {
            let scale = 10u64.pow(frac);
            format!("{}.{:0width$}", m / scale, m % scale, width = frac as usize)
        }),
        prop::sample::select(vec![
            "100/60", "7/3", "3/10", "1000/7", "5/3600", "2/3", "1/86400", "0.3", "0.1", "0.01",
            "3", "7", "0.000001", "1/1e-9", "2.5/0.7",
        ])
        .prop_map(String::from),
        (1u64..=1_000_000, 1u64..=100_000).prop_map(|(n, s)| format!("{n}/{s}")),
        (1u64..=1_000, 1u64..=1_000, 0u32..=3).prop_map(|(n, s, k)| format!("{n}/{s}e-{k}")),
    ]
}

/// One operation on a bucket: acquire, peek or refund `cost` after `step_us`.
#[derive(Clone, Copy, Debug)]
enum Op {
    Acquire,
    Peek,
    Refund,
}

fn ops(capacity: u64, max_step_us: u64) -> impl Strategy<Value = Vec<(Op, u64, u64)>> {
    let op = prop_oneof![5 => Just(Op::Acquire), 1 => Just(Op::Peek), 2 => Just(Op::Refund)];
    let cost = prop_oneof![1 => Just(0u64), 6 => 1..=capacity.min(4), 2 => 0..=capacity + 1];
    prop::collection::vec((op, 0..=max_step_us, cost), 1..40)
}

/// Whether `st` (or a missing key) is the model's exact instant: the stored state is at least
/// it and less than 2^-63 ns above it (the fraction is rounded up, never down).
fn holds_the_model_instant(st: Option<State>, m: &model::Model, now_us: u64) -> bool {
    let two63 = num_rational::BigRational::new(1.into(), num_bigint::BigInt::from(1u64) << 63);
    match (st, &m.full_at_ns) {
        (None, _) => m.is_full(now_us),
        (Some(s), Some(exact)) => {
            let got = instant(s);
            &got >= exact && got < exact + two63
        }
        // A state the model has no instant for: only if both are full now.
        (Some(s), None) => {
            instant(s)
                <= num_rational::BigRational::from_integer((u128::from(now_us) * 1000).into())
        }
    }
}

/// Drives the bucket and the model of the same texts through acquires, peeks and refunds:
/// every reply is the model's, and every written state is the model's exact instant.
fn run_text_against_model(rate: &str, capacity: u64, start_us: u64, calls: &[(Op, u64, u64)]) {
    let lim = Limit::parse(rate.as_bytes(), capacity.to_string().as_bytes()).unwrap();
    let mut m = model::Model::parse(rate, &capacity.to_string());
    let mut current = None;
    let mut now_us = start_us;
    for (i, &(op, step_us, c)) in calls.iter().enumerate() {
        now_us += step_us;
        let at = format!(
            "rate {rate}, capacity {capacity}, call {i} {op:?} at +{} µs, cost {c}",
            now_us - start_us
        );
        let cost = Cost::parse(c.to_string().as_bytes()).unwrap();
        match op {
            Op::Peek => assert_matches(
                &peek(&lim, current, now_us, cost),
                &m.peek(now_us, c as f64),
                &at,
            ),
            Op::Acquire => {
                let (d, new_state) = acquire(&lim, current, now_us, cost);
                assert_matches(&d, &m.acquire(now_us, c as f64), &at);
                current = new_state.or(current);
            }
            Op::Refund => {
                let (d, change) = refund(&lim, current, now_us, cost);
                m.refund(now_us, c as f64);
                let after = m.peek(now_us, 0.0);
                assert_eq!(
                    (d.remaining, d.reset_after_ns),
                    (after.remaining, after.reset_after_ns),
                    "refund, {at}"
                );
                match change {
                    Change::Keep => {}
                    Change::Set(s) => current = Some(s),
                    Change::Delete => current = None,
                }
            }
        }
        assert!(
            holds_the_model_instant(current, &m, now_us),
            "state {current:?} vs model {:?}, {at}",
            m.full_at_ns
        );
    }
}

proptest! {
    // Sized so that `cargo test -p rl-bucket` (debug, in `make test`) stays under a minute.
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Decimal and N/S rates: bursts, refill, peeks and refunds match the exact model of the
    /// same texts, and every written state is the model's instant to within 2^-63 ns.
    #[test]
    fn decimal_and_fraction_rates_match_the_model(
        (rate, capacity) in (rate_texts(), prop_oneof![1u64..=10, 1u64..=1000, 1u64..=100_000])
            .prop_filter("rate or refill out of range", |(r, c)| {
                Limit::parse(r.as_bytes(), c.to_string().as_bytes()).is_ok()
            }),
        steps in prop_oneof![Just(0u64), Just(1_000u64), Just(1_000_000u64), Just(3_600_000_000u64)],
        seed_calls in ops(1000, 1),
        start_us in nows(),
    ) {
        // Scale the generated steps so some calls see partial refills at this rate.
        let calls: Vec<_> = seed_calls
            .iter()
            .map(|&(op, step, c)| (op, step * steps, c.min(capacity + 1)))
            .collect();
        run_text_against_model(&rate, capacity, start_us, &calls);
    }

    /// Refunds against the model at any rate: what comes back, the reply, and the stored
    /// instant are the model's (integer counts are exact).
    #[test]
    fn refunds_match_the_model(
        ((rate, capacity), calls) in integer_limits().prop_flat_map(|(r, c)| {
            let max_step_us = ((2e6 / r) as u64).clamp(1, 1_000_000_000_000);
            (Just((r, c)), ops(c, max_step_us))
        }),
        start_us in nows(),
    ) {
        run_text_against_model(&format!("{rate}"), capacity, start_us, &calls);
    }

    /// Per-period limits as RL.GCRA allows them: nanosecond periods and up to 1e15 tokens a
    /// period, bursts up to 1e15, against the model of `period_ns / count` ns per token.
    #[test]
    fn per_period_limits_with_nanosecond_periods_match_the_model(
        count in prop_oneof![1u64..=10, 1u64..=1_000_000_000, 1u64..=1_000_000_000_000_000],
        period_ns in prop_oneof![1u64..=1_000, 1u64..=1_000_000_000, 1u64..=1_000_000_000_000_000_000],
        total in prop_oneof![1u64..=100, 1u64..=1_000_000_000_000_000],
        calls in prop::collection::vec((0u64..=3_000_000, 0u64..=3, 0u64..=4), 1..32),
        start_us in nows(),
    ) {
        let Ok(lim) = Limit::per_period(count, period_ns, total as f64) else { return Ok(()) };
        let mut m = model::Model::per_period(count, period_ns, total as f64);
        let mut current = None;
        let mut now_us = start_us;
        for (step_us, small, scale) in calls {
            now_us += step_us;
            // Small costs, or a large share of the burst.
            let c = if scale == 0 { total } else { small * total.div_ceil(10u64.pow(scale as u32 * 3)).max(1) };
            let at = format!("{count} per {period_ns} ns, burst {total}, cost {c}");
            let (d, new_state) = acquire(&lim, current, now_us, Cost::parse(c.to_string().as_bytes()).unwrap());
            assert_matches(&d, &m.acquire(now_us, c as f64), &at);
            current = new_state.or(current);
            prop_assert!(holds_the_model_instant(current, &m, now_us), "{}", at);
        }
    }
}
