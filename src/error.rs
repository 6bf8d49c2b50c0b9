//! The crate's one error enum and its Redis reply texts.
//!
//! Every text starts with its Redis error code and names the argument at fault, so clients can
//! match on it. Texts are static C strings: replying with an error allocates nothing.
//!
//! Caps that a reply names live here too, so the text and the check read the same number.

use std::ffi::CStr;

// The cap as a literal, so `concat!` can spell it into the reply text below.
macro_rules! max_multi_buckets {
    () => {
        1000
    };
}

/// The most buckets (`key rate capacity cost` groups) one `RL.ACQUIRE.MULTI` may name. Chosen
/// from measurements (bench/results.md, "RL.ACQUIRE.MULTI server time"): 1,000 new buckets
/// take about 1 ms of server time on the reference machine, so a call at the cap never stalls
/// other clients for long. Real calls name a handful (per second, per hour, per tenant).
pub const MAX_MULTI_BUCKETS: usize = max_multi_buckets!();

/// [`Error::TooManyBuckets`]'s text, built from the cap's digits at compile time.
const TOO_MANY_BUCKETS: &CStr = match CStr::from_bytes_with_nul(
    concat!(
        "ERR RL.ACQUIRE.MULTI takes at most ",
        max_multi_buckets!(),
        " buckets (key rate capacity cost groups) per call\0"
    )
    .as_bytes(),
) {
    Ok(text) => text,
    // A compile error, never a run-time panic: the text is a constant.
    Err(_) => panic!("the bucket cap's text holds a NUL"),
};

/// [`Error::TooManyTableBuckets`]'s text: the same cap for `RL.HACQUIRE.MULTI`.
const TOO_MANY_TABLE_BUCKETS: &CStr = match CStr::from_bytes_with_nul(
    concat!(
        "ERR RL.HACQUIRE.MULTI takes at most ",
        max_multi_buckets!(),
        " buckets (key field rate capacity cost groups) per call\0"
    )
    .as_bytes(),
) {
    Ok(text) => text,
    // A compile error, never a run-time panic: the text is a constant.
    Err(_) => panic!("the bucket cap's text holds a NUL"),
};

/// Everything a command can answer with instead of a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// `rate` is not a number in range.
    Rate,
    /// `capacity` is not a number in range.
    Capacity,
    /// `capacity / rate` exceeds the longest refill a bucket can hold.
    RefillTime,
    /// `cost` is not a finite number `>= 0`.
    Cost,
    /// `cost` (of `RL.CHARGE`, `RL.HCHARGE`) would leave the bucket short of full for more
    /// than 100 years, or past 2262.
    DebtTooLong,
    /// `max_burst` (of `RL.THROTTLE`) is not an integer in range.
    MaxBurst,
    /// `count_per_period` is not an integer in range.
    CountPerPeriod,
    /// `period` is not an integer in range.
    Period,
    /// `quantity` is not a non-negative integer.
    Quantity,
    /// `count_per_period / period` is outside the supported rates.
    ThrottleRate,
    /// `max_burst + 1` tokens would take more than a century to refill.
    ThrottleRefillTime,
    /// `tokens_per_period` (of `RL.GCRA`) is not an integer in range.
    TokensPerPeriod,
    /// `period` (of `RL.GCRA`) is not a finite number of seconds above 0.
    GcraPeriod,
    /// `RL.GCRA` got an option other than `TOKENS`.
    GcraOption,
    /// `TOKENS` came without its count.
    TokensMissing,
    /// The count after `TOKENS` is not a non-negative integer.
    Tokens,
    /// `tokens_per_period / period` is outside the supported rates.
    GcraRate,
    /// `max_burst + 1` tokens would take more than a century to refill at `RL.GCRA`'s rate.
    GcraRefillTime,
    /// `full_at_ns` (of `RL.SETSTATE`) is not an integer in range.
    FullAt,
    /// `full_at_frac` (of `RL.SETSTATE`) is not an integer in range.
    FullAtFrac,
    /// The key holds a value of another type.
    WrongType,
    /// A Redis API call failed, or a bug was caught before it could reach the server.
    Internal,
    /// A new field of a table that already holds [`crate::table::MAX_BUCKETS`].
    TableFull,
    /// A `tag` of `RL.HSETSTATE` is not 16 bytes.
    Tag,
    /// `RL.ACQUIRE.MULTI` names more buckets than [`MAX_MULTI_BUCKETS`].
    TooManyBuckets,
    /// `RL.HACQUIRE.MULTI` names more buckets than [`MAX_MULTI_BUCKETS`].
    TooManyTableBuckets,
    /// `limit` (of the lease commands) is not an integer from 1 to
    /// [`rl_bucket::MAX_LEASE_LIMIT`].
    LeaseLimit,
    /// `ttl_ms` is not an integer from 1 to [`rl_bucket::MAX_LEASE_TTL_MS`].
    LeaseTtl,
    /// An `id` is not 1 to [`rl_bucket::MAX_LEASE_ID_BYTES`] bytes.
    LeaseId,
    /// `RL.LEASE` got an option other than `ID`.
    LeaseOption,
    /// `ID` came without its id.
    LeaseIdMissing,
    /// `drop_until_us` (of `RL.LEASESETSTATE`) is not an integer in range.
    DropUntil,
    /// `expires_at_us` (of `RL.LEASESETSTATE`) is not an integer in range.
    ExpiresAt,
    /// `RL.LEASESETSTATE` would leave more than [`rl_bucket::MAX_LEASE_LIMIT`] leases.
    TooManyLeases,
    /// `estimate` (of `RL.RESERVE`) is not a number above 0.
    Estimate,
    /// `actual` (of `RL.SETTLE`) is not a number >= 0.
    Actual,
    /// `RL.RESERVE` got an option other than `ID`.
    ReserveOption,
    /// `RL.HRESERVE` got an option other than `ID`.
    HReserveOption,
    /// The bucket already holds [`rl_bucket::MAX_RESERVATIONS`] open reservations, or
    /// `RL.RESVSTATE` names more, or an id twice.
    TooManyReservations,
    /// `expires_at_us` (of `RL.RESVSTATE`) is not an integer in range.
    ReservationExpiresAt,
}

impl Error {
    /// The reply text, code first.
    pub fn text(self) -> &'static CStr {
        match self {
            Error::Rate => c"ERR rate must be a number from 0.000001 to 1000000000 (tokens per second)",
            Error::Capacity => c"ERR capacity must be a number above 0 and at most 1e15 (tokens)",
            Error::RefillTime => {
                c"ERR capacity / rate must be at most 3153600000 (a full refill within 100 years)"
            }
            Error::Cost => c"ERR cost must be a finite number >= 0 (tokens)",
            Error::DebtTooLong => {
                c"ERR cost would leave the bucket in debt for more than 100 years (it must be full again within 3153600000 s, and before 2262)"
            }
            Error::MaxBurst => c"ERR max_burst must be an integer from 0 to 999999999999999",
            Error::CountPerPeriod => {
                c"ERR count_per_period must be an integer from 1 to 1000000000"
            }
            Error::Period => c"ERR period must be an integer from 1 to 3153600000 (seconds)",
            Error::Quantity => c"ERR quantity must be an integer >= 0",
            Error::ThrottleRate => {
                c"ERR count_per_period / period must be from 0.000001 to 1000000000 per second"
            }
            Error::ThrottleRefillTime => {
                c"ERR (max_burst + 1) * period / count_per_period must be at most 3153600000 (a full refill within 100 years)"
            }
            Error::TokensPerPeriod => {
                c"ERR tokens_per_period must be an integer from 1 to 1000000000000000"
            }
            Error::GcraPeriod => c"ERR period must be a finite number of seconds above 0",
            Error::GcraOption => c"ERR unknown option: RL.GCRA takes only TOKENS count after period",
            Error::TokensMissing => c"ERR TOKENS must be followed by a count",
            Error::Tokens => c"ERR TOKENS count must be an integer >= 0",
            Error::GcraRate => {
                c"ERR tokens_per_period / period must be from 0.000001 to 1000000000 per second"
            }
            Error::GcraRefillTime => {
                c"ERR (max_burst + 1) * period / tokens_per_period must be at most 3153600000 (a full refill within 100 years)"
            }
            Error::FullAt => c"ERR full_at_ns must be an integer from 1 to 9223372036854775807 (ns since the Unix epoch)",
            Error::FullAtFrac => c"ERR full_at_frac must be an integer from 0 to 9223372036854775807 (units of 2^-63 ns)",
            Error::WrongType => c"WRONGTYPE Operation against a key holding the wrong kind of value",
            Error::Internal => c"ERR rl internal error, see the server log",
            Error::TableFull => {
                c"ERR the table at this key holds 100000000 buckets, the most one key may; spread the fields over more keys"
            }
            Error::Tag => c"ERR tag must be 16 bytes (a field's tag, as RL.HSETSTATE replicates it)",
            Error::TooManyBuckets => TOO_MANY_BUCKETS,
            Error::TooManyTableBuckets => TOO_MANY_TABLE_BUCKETS,
            Error::LeaseLimit => c"ERR limit must be an integer from 1 to 10000 (leases)",
            Error::LeaseTtl => c"ERR ttl_ms must be an integer from 1 to 3153600000000 (ms)",
            Error::LeaseId => c"ERR id must be 1 to 16 bytes",
            Error::LeaseOption => c"ERR unknown option: RL.LEASE takes only ID id after ttl_ms",
            Error::LeaseIdMissing => c"ERR ID must be followed by an id",
            Error::DropUntil => c"ERR drop_until_us must be an integer from 0 to 288230376151711743 (µs since the Unix epoch)",
            Error::ExpiresAt => c"ERR expires_at_us must be an integer from 0 to 288230376151711743 (µs since the Unix epoch; 0 removes the lease)",
            Error::TooManyLeases => c"ERR a key holds at most 10000 leases",
            Error::Estimate => c"ERR estimate must be a number above 0 (tokens)",
            Error::Actual => c"ERR actual must be a finite number >= 0 (tokens)",
            Error::ReserveOption => c"ERR unknown option: RL.RESERVE takes only ID id after ttl_ms",
            Error::HReserveOption => {
                c"ERR unknown option: RL.HRESERVE takes only ID id after ttl_ms"
            }
            Error::TooManyReservations => c"ERR a key holds at most 1000 open reservations, each id once",
            Error::ReservationExpiresAt => c"ERR expires_at_us must be an integer from 1 to 288230376151711743 (µs since the Unix epoch)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_cap_text_names_the_cap() {
        let text = Error::TableFull.text().to_string_lossy().into_owned();
        let cap = crate::table::MAX_BUCKETS.to_string();
        assert!(text.contains(&format!(" holds {cap} buckets")), "{text}");
    }

    #[test]
    fn the_lease_texts_name_their_bounds() {
        let text = |e: Error| e.text().to_string_lossy().into_owned();
        let limit = rl_bucket::MAX_LEASE_LIMIT.to_string();
        assert!(text(Error::LeaseLimit).contains(&format!(" 1 to {limit} ")));
        assert!(text(Error::TooManyLeases).contains(&format!(" at most {limit} ")));
        let ttl = rl_bucket::MAX_LEASE_TTL_MS.to_string();
        assert!(text(Error::LeaseTtl).contains(&format!(" 1 to {ttl} ")));
        let bytes = rl_bucket::MAX_LEASE_ID_BYTES.to_string();
        assert!(text(Error::LeaseId).contains(&format!(" 1 to {bytes} bytes")));
        let at = rl_bucket::MAX_EXPIRES_AT_US.to_string();
        assert!(text(Error::DropUntil).contains(&format!(" 0 to {at} ")));
        assert!(text(Error::ExpiresAt).contains(&format!(" 0 to {at} ")));
        assert!(text(Error::ReservationExpiresAt).contains(&format!(" 1 to {at} ")));
        let cap = rl_bucket::MAX_RESERVATIONS.to_string();
        assert!(text(Error::TooManyReservations).contains(&format!(" at most {cap} ")));
    }

    #[test]
    fn the_bucket_cap_text_names_the_cap() {
        let cap = MAX_MULTI_BUCKETS.to_string();
        for error in [Error::TooManyBuckets, Error::TooManyTableBuckets] {
            let text = error.text().to_string_lossy().into_owned();
            assert!(text.contains(&format!(" at most {cap} buckets ")), "{text}");
        }
    }
}
