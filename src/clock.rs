//! The one place that reads the server's clock.
//!
//! Redis 7.2+ and Valkey export `RedisModule_CachedMicroseconds`: the time the current command
//! started, so every call inside one MULTI, script or function sees the same instant. Older
//! servers (Redis 7.0) only have `RedisModule_Milliseconds`. Which one exists is probed through
//! the function pointer the server filled in at load, never through a version number.

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
    u64::try_from(now).unwrap_or(0)
}
