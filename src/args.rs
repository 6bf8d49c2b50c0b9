//! Argument parsing and validation: one function per command, each error naming its argument.
//!
//! Works on raw bytes, so non-UTF-8 input is an ordinary parse error. Nothing here touches a
//! key; handlers parse everything first.

use std::cell::RefCell;

use rl_bucket::{
    Cost, Decimal, Limit, LimitError, State, MAX_CAPACITY, MAX_FULL_AT_FRAC, MAX_FULL_AT_NS,
    MAX_REFILL_S,
};

use crate::error::Error;

/// `RL.ACQUIRE key rate capacity [cost]`, past the key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Acquire {
    /// The validated rate and capacity.
    pub limit: Limit,
    /// Tokens to take; 1 when omitted.
    pub cost: Cost,
}

/// Parses `rate capacity [cost]`, each from its text as an exact decimal (never through a
/// double); `rate` may also be `N/S`, N tokens every S seconds (`100/60`). See
/// [`Limit::parse`] for the grammar.
///
/// # Errors
/// [`Error::Rate`], [`Error::Capacity`] or [`Error::Cost`], for the first argument at fault.
pub fn acquire(rate: &[u8], capacity: &[u8], cost: Option<&[u8]>) -> Result<Acquire, Error> {
    // `Limit::parse` checks the rate before reading the capacity, so the first bad argument
    // is named.
    let limit = Limit::parse(rate, capacity).map_err(|e| match e {
        LimitError::Rate => Error::Rate,
        LimitError::Capacity => Error::Capacity,
        LimitError::RefillTime => Error::RefillTime,
    })?;
    let cost = match cost {
        None => Cost::ONE,
        Some(bytes) => Cost::parse(bytes).ok_or(Error::Cost)?,
    };
    Ok(Acquire { limit, cost })
}

/// How many distinct `rate capacity [cost]` texts [`Memo`] remembers.
const MEMO_ENTRIES: usize = 8;
/// The longest `rate`, `capacity` and `cost` texts, together, that [`Memo`] remembers; longer
/// ones are parsed every time.
const MEMO_TEXT_BYTES: usize = 48;

/// The last few `rate capacity [cost]` texts [`acquire`] accepted, with what they parsed to.
///
/// An application sends the same few limits on every call, and parsing them exactly (decimal
/// digits, range checks, the u128 gcd that puts `T` in lowest terms) was over a third of the
/// instructions of a denied `RL.ACQUIRE`. Parsing is a pure function of the bytes, so a text
/// seen before gives the same [`Acquire`] without it. Only accepted texts are kept: an error
/// is always worked out, and named, afresh.
#[derive(Debug)]
pub struct Memo {
    entries: [Option<MemoEntry>; MEMO_ENTRIES],
    /// The entry the next new text replaces (round robin).
    next: usize,
}

#[derive(Clone, Copy, Debug)]
struct MemoEntry {
    /// `rate`, `capacity` and `cost` back to back; the lengths say where each ends.
    text: [u8; MEMO_TEXT_BYTES],
    rate_len: usize,
    capacity_len: usize,
    /// `None` when the cost was omitted, which differs from an empty cost text.
    cost_len: Option<usize>,
    parsed: Acquire,
}

impl MemoEntry {
    fn holds(&self, rate: &[u8], capacity: &[u8], cost: Option<&[u8]>) -> bool {
        let total = self.rate_len + self.capacity_len + self.cost_len.unwrap_or(0);
        self.rate_len == rate.len()
            && self.capacity_len == capacity.len()
            && self.cost_len == cost.map(<[u8]>::len)
            && self.text.get(..total).is_some_and(|text| {
                let (r, rest) = text.split_at(rate.len());
                let (c, k) = rest.split_at(capacity.len());
                r == rate && c == capacity && k == cost.unwrap_or_default()
            })
    }
}

impl Memo {
    /// An empty memo; `const` so it can be a thread-local without lazy set-up.
    pub const fn new() -> Self {
        Self {
            entries: [None; MEMO_ENTRIES],
            next: 0,
        }
    }

    /// [`acquire`], answered from memory when these exact texts were accepted recently.
    ///
    /// # Errors
    /// As [`acquire`].
    pub fn acquire(
        &mut self,
        rate: &[u8],
        capacity: &[u8],
        cost: Option<&[u8]>,
    ) -> Result<Acquire, Error> {
        if let Some(entry) = self
            .entries
            .iter()
            .flatten()
            .find(|entry| entry.holds(rate, capacity, cost))
        {
            return Ok(entry.parsed);
        }
        let parsed = acquire(rate, capacity, cost)?;
        self.remember(rate, capacity, cost, parsed);
        Ok(parsed)
    }

    fn remember(&mut self, rate: &[u8], capacity: &[u8], cost: Option<&[u8]>, parsed: Acquire) {
        let mut text = [0u8; MEMO_TEXT_BYTES];
        let mut end = 0usize;
        for part in [rate, capacity, cost.unwrap_or_default()] {
            let Some(slot) = end
                .checked_add(part.len())
                .and_then(|stop| text.get_mut(end..stop))
            else {
                return; // too long to keep: parsed afresh each time
            };
            slot.copy_from_slice(part);
            end += part.len();
        }
        if let Some(entry) = self.entries.get_mut(self.next) {
            *entry = Some(MemoEntry {
                text,
                rate_len: rate.len(),
                capacity_len: capacity.len(),
                cost_len: cost.map(<[u8]>::len),
                parsed,
            });
        }
        self.next = (self.next + 1) % MEMO_ENTRIES;
    }
}

thread_local! {
    /// Commands run on the server's main thread, so this is one memo, never contended.
    static LIMITS: RefCell<Memo> = const { RefCell::new(Memo::new()) };
}

/// [`acquire`] through the memo of recently accepted limits that every command parsing
/// `rate capacity [cost]` shares (`RL.ACQUIRE` and its kin, `RL.RESERVE`, `RL.SETTLE`).
///
/// # Errors
/// As [`acquire`].
pub fn acquire_memo(rate: &[u8], capacity: &[u8], cost: Option<&[u8]>) -> Result<Acquire, Error> {
    LIMITS.with(|memo| match memo.try_borrow_mut() {
        Ok(mut memo) => memo.acquire(rate, capacity, cost),
        // Only re-entry could hold it (a module command called from inside a parse, which
        // never happens); parse without the memo rather than fail.
        Err(_) => acquire(rate, capacity, cost),
    })
}

impl Default for Memo {
    fn default() -> Self {
        Self::new()
    }
}

/// `RL.THROTTLE key max_burst count_per_period period [quantity]`, past the key: redis-cell's
/// arguments, as a token bucket of `max_burst + 1` tokens refilling `count_per_period` every
/// `period` seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Throttle {
    /// The equivalent bucket.
    pub limit: Limit,
    /// Tokens to take (`quantity`, default 1).
    pub cost: Cost,
    /// `max_burst + 1`, the "limit" redis-cell reports.
    pub total: u64,
}

/// Parses `max_burst count_per_period period [quantity]`: non-negative integers, as
/// redis-cell takes them.
///
/// # Errors
/// [`Error::MaxBurst`], [`Error::CountPerPeriod`], [`Error::Period`], [`Error::Quantity`],
/// or [`Error::ThrottleRate`] when `count_per_period / period` is outside the supported rates.
pub fn throttle(
    max_burst: &[u8],
    count_per_period: &[u8],
    period: &[u8],
    quantity: Option<&[u8]>,
) -> Result<Throttle, Error> {
    let max_burst = integer(max_burst)
        .filter(|&n| n < MAX_CAPACITY as u64)
        .ok_or(Error::MaxBurst)?;
    let count = integer(count_per_period)
        .filter(|n| (1..=1_000_000_000).contains(n))
        .ok_or(Error::CountPerPeriod)?;
    let period_s = integer(period)
        .filter(|n| (1..=MAX_REFILL_S as u64).contains(n))
        .ok_or(Error::Period)?;
    let cost = match quantity {
        None => Cost::ONE,
        Some(bytes) => integer(bytes)
            .map(|n| Cost::from_decimal(Decimal::from_int(n.into())))
            .ok_or(Error::Quantity)?,
    };
    let total = max_burst + 1;
    // Exactly `count` tokens every `period` seconds: T = period × 1e9 / count ns, not the
    // double nearest to count / period (which for "3 per 10 s" refills 2 tokens in 10 s).
    let period_ns = period_s.saturating_mul(1_000_000_000);
    let limit = Limit::per_period(count, period_ns, total as f64).map_err(|e| match e {
        LimitError::Rate => Error::ThrottleRate,
        LimitError::Capacity => Error::MaxBurst,
        LimitError::RefillTime => Error::ThrottleRefillTime,
    })?;
    Ok(Throttle { limit, cost, total })
}

/// The largest `tokens_per_period`: like a capacity, an integer every `f64` holds exactly.
const MAX_TOKENS_PER_PERIOD: u64 = MAX_CAPACITY as u64;

/// Parses `max_burst tokens_per_period period [TOKENS count]`, the arguments of the `GCRA`
/// of the Redis 8.8 milestones (compiled out before 8.8 GA), into the same bucket as
/// [`throttle`]: `max_burst + 1` tokens refilling `tokens_per_period` every `period` seconds. Unlike `RL.THROTTLE`, `period` is a decimal
/// (`0.5`, `60`, `1e-3`), and the cost is an option: `option` is its name and count as given.
///
/// # Errors
/// In argument order: [`Error::MaxBurst`], [`Error::TokensPerPeriod`], [`Error::GcraPeriod`],
/// [`Error::GcraOption`] for a name other than `TOKENS` (any case), [`Error::TokensMissing`],
/// [`Error::Tokens`]; then [`Error::GcraRate`] or [`Error::GcraRefillTime`] for what the
/// arguments make together.
pub fn gcra(
    max_burst: &[u8],
    tokens_per_period: &[u8],
    period: &[u8],
    option: Option<(&[u8], Option<&[u8]>)>,
) -> Result<Throttle, Error> {
    let max_burst = integer(max_burst)
        .filter(|&n| n < MAX_CAPACITY as u64)
        .ok_or(Error::MaxBurst)?;
    let tokens = integer(tokens_per_period)
        .filter(|n| (1..=MAX_TOKENS_PER_PERIOD).contains(n))
        .ok_or(Error::TokensPerPeriod)?;
    // Exact, never a double: the rate `tokens / period` is checked on these values, so a
    // period too long or too short for any rate is refused rather than saturated or rounded.
    let period_s = Decimal::parse(period)
        .filter(|s| !s.is_zero())
        .ok_or(Error::GcraPeriod)?;
    let cost = match option {
        None => Cost::ONE,
        Some((name, count)) => {
            if !name.eq_ignore_ascii_case(b"TOKENS") {
                return Err(Error::GcraOption);
            }
            let count = count.ok_or(Error::TokensMissing)?;
            // A count too large for any bucket is valid: a request that can never succeed.
            integer(count)
                .map(|n| Cost::from_decimal(Decimal::from_int(n.into())))
                .ok_or(Error::Tokens)?
        }
    };
    let total = max_burst + 1;
    // T = period / tokens exactly: "0.1" is 1e8 ns, 3 per 299.99 s is exact, and 1 per
    // 1.4e-9 s is 1.4 ns a token, not 1 ns.
    let limit = Limit::from_decimals(
        Decimal::from_int(u128::from(tokens)),
        period_s,
        Decimal::from_int(u128::from(total)),
    )
    .map_err(|e| match e {
        LimitError::Rate => Error::GcraRate,
        LimitError::Capacity => Error::MaxBurst,
        LimitError::RefillTime => Error::GcraRefillTime,
    })?;
    Ok(Throttle { limit, cost, total })
}

/// A plain non-negative decimal integer, saturating at `u64::MAX`: callers range-check it,
/// and a huge `quantity` is a request that can never succeed, not a malformed one.
pub(crate) fn integer(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(bytes.iter().fold(0u64, |acc, &b| {
        acc.saturating_mul(10).saturating_add(u64::from(b - b'0'))
    }))
}

/// Parses the `full_at_ns [full_at_frac]` of `RL.SETSTATE`: plain decimal integers, no sign,
/// no junk. 0.1.0 wrote the first alone; a state with a fraction of a nanosecond adds the
/// second (units of 2^-63 ns).
///
/// # Errors
/// [`Error::FullAt`] unless `full_at_ns` is an integer in `1..=i64::MAX`;
/// [`Error::FullAtFrac`] unless `full_at_frac` is an integer in `0..=i64::MAX`.
pub fn state(full_at_ns: &[u8], full_at_frac: Option<&[u8]>) -> Result<State, Error> {
    // Leading zeros are allowed; `integer` saturates, and `State` rejects what is past i64::MAX.
    let full_at_ns = integer(full_at_ns)
        .filter(|ns| (1..=MAX_FULL_AT_NS).contains(ns))
        .ok_or(Error::FullAt)?;
    let full_at_frac = match full_at_frac {
        None => 0,
        Some(bytes) => integer(bytes)
            .filter(|&frac| frac <= MAX_FULL_AT_FRAC)
            .ok_or(Error::FullAtFrac)?,
    };
    State::from_parts(full_at_ns, full_at_frac).ok_or(Error::FullAt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_names_the_first_bad_argument() {
        assert_eq!(acquire(b"x", b"x", Some(b"x")).unwrap_err(), Error::Rate);
        assert_eq!(
            acquire(b"1", b"0", Some(b"x")).unwrap_err(),
            Error::Capacity
        );
        assert_eq!(acquire(b"1", b"1", Some(b"-1")).unwrap_err(), Error::Cost);
        // A parseable but out-of-range rate is still the first bad argument.
        assert_eq!(acquire(b"0", b"x", None).unwrap_err(), Error::Rate);
        let ok = acquire(b"5", b"10", None).unwrap();
        assert_eq!(ok.cost, Cost::ONE);
        assert_eq!(ok.limit.capacity(), 10.0);
    }

    /// `rate capacity [cost]`, as typed.
    type Texts<'a> = (&'a [u8], &'a [u8], Option<&'a [u8]>);

    /// Texts that differ only in where one argument ends and the next begins, or in an
    /// omitted versus an empty cost, must never be taken for one another.
    const MEMO_TEXTS: [Texts<'static>; 12] = [
        (b"1", b"10", None),
        (b"11", b"0", None),
        (b"1", b"10", Some(b"")),
        (b"1", b"1", Some(b"0")),
        (b"1", b"10", Some(b"3")),
        (b"3", b"7", Some(b"1")),
        (b"100/60", b"100", None),
        (b"0.1", b"1", Some(b"0.5")),
        (b"x", b"1", None),
        (b"1", b"0", None),
        (b"0.000001", b"1", Some(b"1")),
        (
            b"1e9",
            b"1e15",
            Some(b"99999999999999999999999999999999999999999"),
        ),
    ];

    #[test]
    fn the_memo_answers_as_a_fresh_parse() {
        let mut memo = Memo::new();
        // Twice round, so the second pass reads what the first remembered (and, with more
        // texts than entries, what replaced it).
        for _ in 0..2 {
            for (rate, capacity, cost) in MEMO_TEXTS {
                assert_eq!(
                    memo.acquire(rate, capacity, cost),
                    acquire(rate, capacity, cost),
                    "{:?} {:?} {:?}",
                    rate,
                    capacity,
                    cost
                );
            }
        }
    }

    #[test]
    fn the_memo_keeps_only_accepted_texts_that_fit() {
        let mut memo = Memo::new();
        assert_eq!(memo.acquire(b"x", b"1", None), Err(Error::Rate));
        assert!(memo.entries.iter().all(Option::is_none));
        let long = [b'1'; MEMO_TEXT_BYTES];
        assert_eq!(memo.acquire(b"1", b"1", Some(&long)), Err(Error::Cost));
        let long_rate = b"1.000000000000000000000000000000000000000000000000";
        assert!(long_rate.len() > MEMO_TEXT_BYTES);
        assert!(memo.acquire(long_rate, b"1", None).is_ok());
        assert!(memo.entries.iter().all(Option::is_none));
        assert!(memo.acquire(b"7", b"7", None).is_ok());
        assert_eq!(memo.entries.iter().flatten().count(), 1);
    }

    proptest::proptest! {
        #[test]
        fn the_memo_agrees_with_acquire_on_any_sequence(
            picks in proptest::collection::vec(
                (0..MEMO_TEXTS.len(), "[0-9./e]{0,6}", "[0-9.e]{0,5}", proptest::option::of("[0-9.]{0,4}")),
                1..64,
            )
        ) {
            let mut memo = Memo::new();
            for (i, rate, capacity, cost) in picks {
                // Half from the fixed texts (so entries are hit and replaced), half random.
                let (rate, capacity, cost): Texts = if i % 2 == 0 {
                    MEMO_TEXTS[i]
                } else {
                    (rate.as_bytes(), capacity.as_bytes(), cost.as_deref().map(str::as_bytes))
                };
                proptest::prop_assert_eq!(
                    memo.acquire(rate, capacity, cost),
                    acquire(rate, capacity, cost)
                );
            }
        }
    }

    #[test]
    fn throttle_takes_redis_cell_integers() {
        let t = throttle(b"15", b"30", b"60", None).unwrap();
        assert_eq!(
            (t.total, t.limit.capacity(), t.limit.rate_per_s()),
            (16, 16.0, 0.5)
        );
        assert_eq!(t.cost, Cost::ONE);
        assert_eq!(
            throttle(b"0", b"1", b"1", Some(b"0"))
                .unwrap()
                .cost
                .tokens(),
            0.0
        );
        // A quantity too large for any bucket is valid: a request that can never succeed.
        let huge = throttle(b"1", b"1", b"1", Some(b"100000000000000000000")).unwrap();
        assert!(huge.cost.tokens() > huge.limit.capacity());
        type Row<'a> = (&'a [u8], &'a [u8], &'a [u8], Option<&'a [u8]>, Error);
        let rows: &[Row] = &[
            (b"-1", b"30", b"60", None, Error::MaxBurst), // negative burst
            (b"1.5", b"30", b"60", None, Error::MaxBurst), // not an integer
            (b"1000000000000000", b"1", b"1", None, Error::MaxBurst), // burst + 1 above 1e15
            (b"15", b"0", b"60", None, Error::CountPerPeriod), // no refill
            (b"15", b"x", b"60", None, Error::CountPerPeriod), // junk
            (b"15", b"30", b"0", None, Error::Period),    // zero period
            (b"15", b"30", b"-60", None, Error::Period),  // negative period
            (b"15", b"30", b"60", Some(b"-1"), Error::Quantity), // negative quantity
            (b"15", b"30", b"60", Some(b"\xff"), Error::Quantity), // not UTF-8
            (b"15", b"1", b"3153600000", None, Error::ThrottleRate), // below 1e-6/s
            (b"3153600000", b"1", b"1", None, Error::ThrottleRefillTime), // century+ refill
            (b"99999999999999999999", b"1", b"1", None, Error::MaxBurst), // saturates: too big
        ];
        for (burst, count, period, quantity, want) in rows {
            assert_eq!(
                throttle(burst, count, period, *quantity).unwrap_err(),
                *want
            );
        }
    }

    #[test]
    fn gcra_takes_redis_8_8_arguments() {
        let t = gcra(b"15", b"30", b"60", None).unwrap();
        assert_eq!(
            (t.total, t.limit.capacity(), t.limit.rate_per_s(), t.cost),
            (16, 16.0, 0.5, Cost::ONE)
        );
        // period is a decimal; TOKENS in any case; a count of 0 is a check.
        let t = gcra(b"0", b"1", b"0.5", Some((b"tokens", Some(b"0")))).unwrap();
        assert_eq!((t.limit.rate_per_s(), t.cost.tokens()), (2.0, 0.0));
        assert_eq!(
            gcra(b"0", b"3", b"1e-3", Some((b"ToKeNs", Some(b"7"))))
                .unwrap()
                .cost
                .tokens(),
            7.0
        );
        let huge = gcra(
            b"1",
            b"1",
            b"1",
            Some((b"TOKENS", Some(b"100000000000000000000"))),
        );
        assert!(huge.unwrap().cost.tokens() > 2.0);
        type Row<'a> = (
            &'a [u8],
            &'a [u8],
            &'a [u8],
            Option<(&'a [u8], Option<&'a [u8]>)>,
            Error,
        );
        let rows: &[Row] = &[
            (b"-1", b"30", b"60", None, Error::MaxBurst), // negative burst
            (b"1.5", b"30", b"60", None, Error::MaxBurst), // not an integer
            (b"1000000000000000", b"1", b"1", None, Error::MaxBurst), // burst + 1 above 1e15
            (b"15", b"0", b"60", None, Error::TokensPerPeriod), // no refill
            (b"15", b"1.5", b"60", None, Error::TokensPerPeriod), // not an integer
            (
                b"15",
                b"1000000000000001",
                b"60",
                None,
                Error::TokensPerPeriod,
            ), // above 1e15
            (b"15", b"30", b"0", None, Error::GcraPeriod), // zero period
            (b"15", b"30", b"-1", None, Error::GcraPeriod), // negative period
            (b"15", b"30", b"inf", None, Error::GcraPeriod), // not finite
            (b"15", b"30", b"x", None, Error::GcraPeriod), // junk
            (
                b"15",
                b"30",
                b"60",
                Some((b"COUNT", Some(b"1"))),
                Error::GcraOption,
            ),
            (
                b"15",
                b"30",
                b"60",
                Some((b"NUM_REQUESTS", Some(b"1"))),
                Error::GcraOption,
            ),
            (
                b"15",
                b"30",
                b"60",
                Some((b"TOKENS", None)),
                Error::TokensMissing,
            ),
            (
                b"15",
                b"30",
                b"60",
                Some((b"TOKENS", Some(b"-1"))),
                Error::Tokens,
            ),
            (
                b"15",
                b"30",
                b"60",
                Some((b"TOKENS", Some(b"1.5"))),
                Error::Tokens,
            ),
            (b"15", b"1", b"1000001", None, Error::GcraRate), // just under 1e-6/s
            (b"0", b"1000000000000000", b"1", None, Error::GcraRate), // 1e15/s
            (b"3153600000", b"1", b"1", None, Error::GcraRefillTime), // century+ refill
            // the first bad argument, in order, is named
            (b"-1", b"0", b"0", Some((b"X", None)), Error::MaxBurst),
            (b"1", b"1", b"0", Some((b"X", None)), Error::GcraPeriod),
            (b"1", b"1", b"1", Some((b"X", None)), Error::GcraOption),
        ];
        for (burst, tokens, period, option, want) in rows {
            assert_eq!(gcra(burst, tokens, period, *option).unwrap_err(), *want);
        }
    }

    #[test]
    fn acquire_takes_exact_decimals_and_fractions() {
        // (rate, capacity, cost, T as (ticks_per_token, ticks_per_ns)).
        type Row<'a> = (&'a [u8], &'a [u8], Option<&'a [u8]>, (u128, u64));
        let rows: &[Row] = &[
            (b"0.1", b"1", None, (10_000_000_000, 1)), // 10 s a token, not the double's
            (b"0.01", b"1000", Some(b"400"), (100_000_000_000, 1)), // whole ns: inline state
            (b"100/60", b"100", None, (600_000_000, 1)), // 100 a minute
            (b"3/10", b"3", Some(b"0.5"), (10_000_000_000, 3)),
            (b"7/3", b"7", None, (3_000_000_000, 7)),
            (b"0.000001", b"1", None, (1_000_000_000_000_000, 1)),
        ];
        for &(rate, capacity, cost, want) in rows {
            let a = acquire(rate, capacity, cost).unwrap();
            assert_eq!(
                a.limit.ns_per_token(),
                want,
                "{:?}",
                String::from_utf8_lossy(rate)
            );
        }
        assert_eq!(
            acquire(b"1", b"1", Some(b"0.1")).unwrap().cost,
            Cost::parse(b"0.1").unwrap()
        );
        type Bad<'a> = (&'a [u8], &'a [u8], Option<&'a [u8]>, Error);
        let bad: &[Bad] = &[
            (b"1/0", b"1", None, Error::Rate),
            (b"1/1000001", b"x", None, Error::Rate), // below 1e-6/s, named before capacity
            (b"100/60", b"0", None, Error::Capacity),
            (b"1/60", b"52560001", None, Error::RefillTime), // a century and a minute
            (b"1", b"1", Some(b"1/2"), Error::Cost),         // only a rate may be a fraction
            (b"1", b"1", Some(b"inf"), Error::Cost),
        ];
        for &(rate, capacity, cost, want) in bad {
            assert_eq!(acquire(rate, capacity, cost).unwrap_err(), want);
        }
    }

    /// A regression: the period was `(period_s * 1e9).round() as u64`, which saturated
    /// above about 585 years and rounded sub-nanosecond periods before the rate was checked.
    #[test]
    fn gcra_period_is_exact_and_out_of_range_rates_are_refused() {
        // `RL.GCRA k 0 1000000 1e300`: about 1e-294 tokens/s, far below the slowest rate
        // (was accepted, running at 1e6 per 2^64 - 1 ns).
        assert_eq!(gcra(b"0", b"1000000", b"1e300", None), Err(Error::GcraRate));
        // `RL.GCRA k 0 1000000000000000 100000000000`: 10,000/s exactly, T = 1e5 ns (ran at
        // 2^64 - 1 ns / 1e15, about 54,210/s).
        let t = gcra(b"0", b"1000000000000000", b"100000000000", None).unwrap();
        assert_eq!(t.limit.ns_per_token(), (100_000, 1));
        // `RL.GCRA k 0 1 5e-10`: 2e9/s, above the fastest rate (was accepted at 1e9/s).
        assert_eq!(gcra(b"0", b"1", b"5e-10", None), Err(Error::GcraRate));
        // `RL.GCRA k 0 1 1.4e-9`: 1.4 ns a token exactly (was rounded to 1 ns, 40% looser).
        let t = gcra(b"0", b"1", b"1.4e-9", None).unwrap();
        assert_eq!(t.limit.ns_per_token(), (7, 5));
        // The ends of the range, exactly; a hair past either is refused.
        type End = (&'static [u8], &'static [u8], Result<(u128, u64), Error>);
        let ends: &[End] = &[
            (b"1", b"1e-9", Ok((1, 1))),
            (b"1", b"0.0000000009999999999999", Err(Error::GcraRate)),
            (b"1", b"1000000", Ok((1_000_000_000_000_000, 1))),
            (b"1", b"1000000.000000000000001", Err(Error::GcraRate)),
            (b"1000000000000000", b"1000000", Ok((1, 1))), // 1e15 per 1e6 s is 1e9/s
            (b"3", b"299.99", Ok((299_990_000_000, 3))),   // 3 per 299.99 s: 1/3 ns fractions
            (b"1", b"0.1", Ok((100_000_000, 1))),
        ];
        for &(tokens, period, want) in ends {
            let got = gcra(b"0", tokens, period, None).map(|t| t.limit.ns_per_token());
            let at = String::from_utf8_lossy(period);
            assert_eq!(got, want, "{at}");
        }
    }

    #[test]
    fn set_state_takes_bounded_integers_with_an_optional_fraction() {
        type Good = (&'static [u8], Option<&'static [u8]>, (u64, u64));
        let good: &[Good] = &[
            (b"1", None, (1, 0)),
            (b"9223372036854775807", None, (i64::MAX as u64, 0)),
            (b"00000000000000000001", None, (1, 0)), // leading zeros are still the integer
            (b"5", Some(b"0"), (5, 0)),
            (b"5", Some(b"9223372036854775807"), (5, i64::MAX as u64)),
        ];
        for &(ns, frac, want) in good {
            let got = state(ns, frac).map(|s| (s.full_at_ns(), s.full_at_frac()));
            assert_eq!(got, Ok(want), "{:?} {frac:?}", String::from_utf8_lossy(ns));
        }
        type Bad = (&'static [u8], Option<&'static [u8]>, Error);
        let bad: &[Bad] = &[
            (b"", None, Error::FullAt),
            (b"0", None, Error::FullAt),
            (b"-1", None, Error::FullAt),
            (b"+1", None, Error::FullAt),
            (b"1.0", None, Error::FullAt),
            (b"9223372036854775808", None, Error::FullAt),
            (b"99999999999999999999", None, Error::FullAt),
            (b"1 ", None, Error::FullAt),
            (b"0", Some(b"1"), Error::FullAt),
            (b"5", Some(b""), Error::FullAtFrac),
            (b"5", Some(b"-1"), Error::FullAtFrac),
            (b"5", Some(b"9223372036854775808"), Error::FullAtFrac),
            (b"5", Some(b"1e3"), Error::FullAtFrac),
        ];
        for &(ns, frac, want) in bad {
            assert_eq!(
                state(ns, frac),
                Err(want),
                "{:?} {frac:?}",
                String::from_utf8_lossy(ns)
            );
        }
    }
}
