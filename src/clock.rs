//! The one place that reads the server's clock.
//!
//! Redis 7.2+ and Valkey export `RedisModule_CachedMicroseconds`: the time the current command
//! started, so every call inside one MULTI, script or function sees the same instant. Older
//! servers (Redis 7.0) only have `RedisModule_Milliseconds`. Which one exists is probed through
//! the function pointer the server filled in at load, never through a version number.
//!
//! **The seam, in debug builds only:** `RL_CLOCK_OFFSET_MS` in the server's environment
//! when the module loads shifts the module's clock by that many ms (negative: behind). The
//! integration tests step a server's clock back and forth across a restart, and give a
//! replica a skewed clock before promoting it (`tests/clock.rs`), without touching the
//! machine's clock. A release build reads the server's time only.

use redis_module::raw;

/// Which clock API the server offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `RedisModule_CachedMicroseconds` (Redis 7.2+, Valkey): µs, fixed per command.
    CachedMicroseconds,
    /// `RedisModule_Milliseconds` (Redis 7.0): ms, read live.
    Milliseconds,
}

impl Source {
    /// The API in use, as named in the log and docs.
    pub fn name(self) -> &'static str {
        match self {
            Source::CachedMicroseconds => "RedisModule_CachedMicroseconds",
            Source::Milliseconds => "RedisModule_Milliseconds",
        }
    }
}

/// Probes which clock API the loaded server exports.
pub fn source() -> Source {
    // SAFETY: the API pointers are written once by RedisModule_Init, before any command runs,
    // and only read afterwards.
    if unsafe { raw::RedisModule_CachedMicroseconds }.is_some() {
        Source::CachedMicroseconds
    } else {
        Source::Milliseconds
    }
}

/// The server's time in µs since the Unix epoch, read once per call. 0 if the server
/// offers no clock at all, which only a broken server would do: 0 is "long ago", so the
/// bucket can only look emptier, never fuller.
pub fn now_us() -> u64 {
    // SAFETY: as in `source`; both functions take no arguments and have no preconditions.
    let now = unsafe {
        match (
            raw::RedisModule_CachedMicroseconds,
            raw::RedisModule_Milliseconds,
        ) {
            (Some(cached_us), _) => cached_us(),
            (None, Some(ms)) => ms().saturating_mul(1_000),
            (None, None) => 0,
        }
    };
    u64::try_from(now.saturating_add(offset_us())).unwrap_or(0)
}

/// The seam's offset (µs): `RL_CLOCK_OFFSET_MS` as read at the first call; 0 unset or bad.
#[cfg(debug_assertions)]
fn offset_us() -> i64 {
    static OFFSET_US: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *OFFSET_US.get_or_init(|| {
        std::env::var("RL_CLOCK_OFFSET_MS")
            .ok()
            .and_then(|ms| ms.parse::<i64>().ok())
            .map_or(0, |ms| ms.saturating_mul(1000))
    })
}

/// A release build has no seam.
#[cfg(not(debug_assertions))]
fn offset_us() -> i64 {
    0
}
