//! The Rust client's tests share this: the real-server harness of the repository (the
//! dev-only crate `rl-testkit`, re-exported whole: `Server::start()` with the module,
//! `Server::plain()` without it, `kill()` and `restart()` for an outage on the same port), the
//! limiter set-ups the tests use, and a test logger that keeps each thread's records apart,
//! so tests running in parallel can each count the warnings their own limiter logged (or, on
//! a thread that asks for them, the info records too).

#![allow(dead_code)]

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Mutex, Once};
use std::thread::ThreadId;
use std::time::Duration;

pub use rl_testkit::*;

use redis_rl_client::{Limit, Limiter, OnError, Options};

/// Slow enough that no refill can happen while a test runs, even on a loaded machine.
pub fn slow() -> Limit {
    Limit::new(0.001, 5.0).expect("limit")
}

/// A limiter with a deadline generous enough for a loaded machine (tests that time out set
/// their own).
pub fn limiter(server: &Server, options: Options) -> Limiter {
    Limiter::new(server.client(), options.timeout(Duration::from_millis(500)))
}

pub fn options(on_error: OnError) -> Options {
    Options::new(on_error)
}

// The test logger -----------------------------------------------------------------------

struct ThreadLog;

static RECORDS: Mutex<Option<HashMap<ThreadId, Vec<String>>>> = Mutex::new(None);
static INSTALL: Once = Once::new();

thread_local! {
    /// The least severe level this thread's records are kept at.
    static LEVEL: Cell<log::Level> = const { Cell::new(log::Level::Warn) };
}

impl log::Log for ThreadLog {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= LEVEL.with(Cell::get)
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            let mut records = RECORDS.lock().unwrap_or_else(|p| p.into_inner());
            records
                .get_or_insert_with(HashMap::new)
                .entry(std::thread::current().id())
                .or_default()
                .push(record.args().to_string());
        }
    }

    fn flush(&self) {}
}

/// Starts capturing warnings (once per process).
pub fn capture_logs() {
    INSTALL.call_once(|| {
        log::set_logger(&ThreadLog).expect("one logger");
        log::set_max_level(log::LevelFilter::Info);
    });
}

/// Starts capturing this thread's records at `level` and above (info too, for `Info`).
pub fn capture_logs_at(level: log::Level) {
    capture_logs();
    LEVEL.with(|l| l.set(level));
}

/// The warnings this thread logged since the last call.
pub fn take_logs() -> Vec<String> {
    let mut records = RECORDS.lock().unwrap_or_else(|p| p.into_inner());
    records
        .get_or_insert_with(HashMap::new)
        .remove(&std::thread::current().id())
        .unwrap_or_default()
}
