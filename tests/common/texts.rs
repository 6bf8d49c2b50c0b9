//! The module's error replies, exactly as the tests expect them (src/error.rs holds the
//! module's side). One place, so every command family's tables name the same text.

/// `rate` out of range or not a number (`RL.ACQUIRE`, `RL.PEEK`, `RL.REFUND`, `RL.ACQUIRE.MULTI`).
pub const RATE: &str = "ERR rate must be a number from 0.000001 to 1000000000 (tokens per second)";
/// `capacity` out of range or not a number.
pub const CAPACITY: &str = "ERR capacity must be a number above 0 and at most 1e15 (tokens)";
/// `capacity / rate` beyond a century.
pub const REFILL: &str =
    "ERR capacity / rate must be at most 3153600000 (a full refill within 100 years)";
/// `cost` negative or not a number.
pub const COST: &str = "ERR cost must be a finite number >= 0 (tokens)";
/// `cost` of `RL.CHARGE` / `RL.HCHARGE` past the bound on debt.
pub const DEBT: &str = "ERR cost would leave the bucket in debt for more than 100 years (it must be full again within 3153600000 s, and before 2262)";
/// A key of another type.
pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// `RL.SETSTATE`'s `full_at_ns`.
pub const FULL_AT: &str =
    "ERR full_at_ns must be an integer from 1 to 9223372036854775807 (ns since the Unix epoch)";
/// `RL.SETSTATE`'s `full_at_frac`.
pub const FULL_AT_FRAC: &str =
    "ERR full_at_frac must be an integer from 0 to 9223372036854775807 (units of 2^-63 ns)";

/// `max_burst` of `RL.THROTTLE` and `RL.GCRA`.
pub const MAX_BURST: &str = "ERR max_burst must be an integer from 0 to 999999999999999";
/// `RL.THROTTLE`'s `count_per_period`.
pub const COUNT: &str = "ERR count_per_period must be an integer from 1 to 1000000000";
/// `RL.THROTTLE`'s `period`.
pub const PERIOD: &str = "ERR period must be an integer from 1 to 3153600000 (seconds)";
/// `RL.THROTTLE`'s `quantity`.
pub const QUANTITY: &str = "ERR quantity must be an integer >= 0";
/// `RL.THROTTLE`'s rate out of range.
pub const THROTTLE_RATE: &str =
    "ERR count_per_period / period must be from 0.000001 to 1000000000 per second";
/// `RL.THROTTLE`'s burst beyond a century of refill.
pub const THROTTLE_REFILL: &str = "ERR (max_burst + 1) * period / count_per_period must be at most 3153600000 (a full refill within 100 years)";

/// `RL.GCRA`'s `tokens_per_period`.
pub const TOKENS_PER_PERIOD: &str =
    "ERR tokens_per_period must be an integer from 1 to 1000000000000000";
/// `RL.GCRA`'s `period`.
pub const GCRA_PERIOD: &str = "ERR period must be a finite number of seconds above 0";
/// `RL.GCRA` with an option other than `TOKENS`.
pub const GCRA_OPTION: &str = "ERR unknown option: RL.GCRA takes only TOKENS count after period";
/// `TOKENS` without its count.
pub const TOKENS_MISSING: &str = "ERR TOKENS must be followed by a count";
/// `TOKENS` with a bad count.
pub const TOKENS: &str = "ERR TOKENS count must be an integer >= 0";
/// `RL.GCRA`'s rate out of range.
pub const GCRA_RATE: &str =
    "ERR tokens_per_period / period must be from 0.000001 to 1000000000 per second";
/// `RL.GCRA`'s burst beyond a century of refill.
pub const GCRA_REFILL: &str = "ERR (max_burst + 1) * period / tokens_per_period must be at most 3153600000 (a full refill within 100 years)";

/// `ttl_ms` of `RL.LEASE`, `RL.RESERVE` and `RL.HRESERVE`.
pub const TTL: &str = "ERR ttl_ms must be an integer from 1 to 3153600000000 (ms)";
/// An `id` of a lease or a reservation.
pub const ID: &str = "ERR id must be 1 to 16 bytes";
/// `ID` without its id.
pub const ID_MISSING: &str = "ERR ID must be followed by an id";
/// `estimate` of `RL.RESERVE`, `RL.HRESERVE` and of a record in their state commands.
pub const ESTIMATE: &str = "ERR estimate must be a number above 0 (tokens)";
/// `actual` of `RL.SETTLE` and `RL.HSETTLE`.
pub const ACTUAL: &str = "ERR actual must be a finite number >= 0 (tokens)";
/// A record's `expires_at_us` in `RL.RESVSTATE` and `RL.HRESVSTATE`.
pub const RESERVATION_EXPIRES_AT: &str =
    "ERR expires_at_us must be an integer from 1 to 288230376151711743 (µs since the Unix epoch)";
/// A bucket past its open reservations, or one id twice in a state command.
pub const RESERVATIONS: &str = "ERR a key holds at most 1000 open reservations, each id once";
