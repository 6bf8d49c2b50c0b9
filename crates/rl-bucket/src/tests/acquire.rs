//! [`acquire`] and [`peek`] by hand-worked tables: every field of one call's reply, sequences
//! where each call's state feeds the next, extreme limits, and the replies the bug reports and
//! redis-cell pinned down.

use super::*;
use Outcome::{Allowed, Denied};

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

/// A regression: a denial promised a retry whose take could not be stored (past 2262),
/// and the retry was then answered "impossible". The minimal reproduction, with the rate now
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

// ---------------------------------------------------------------------------------------------
// Replies that bug reports and redis-cell pinned down.
// ---------------------------------------------------------------------------------------------

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
