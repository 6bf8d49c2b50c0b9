//! `INFO` as the tests read it: a section's text, one `name:value` field of it, a
//! command's call count from `INFO commandstats`, and `used_memory`.

use std::str::FromStr;
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis::Connection;

/// `INFO <section>` as text.
pub fn info(con: &mut Connection, section: &str) -> String {
    redis::cmd("INFO").arg(section).query(con).expect("INFO")
}

/// The value of `name:value` in an INFO text, trimmed.
pub fn info_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// A numeric field of `INFO <section>`; panics if it is missing or not a number.
pub fn info_number<T: FromStr>(con: &mut Connection, section: &str, name: &str) -> T {
    let text = info(con, section);
    info_field(&text, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in INFO {section}:\n{text}"))
}

/// `rdb_changes_since_last_save` from `INFO persistence`: the server's dirty counter, what
/// RDB save points and the AOF count as changes.
pub fn rdb_changes(con: &mut Connection) -> i64 {
    info_number(con, "persistence", "rdb_changes_since_last_save")
}

/// `calls=` of `cmdstat_<command>` in `INFO commandstats`, or `None` if the command never ran.
/// The command name matches in any case (module commands keep their registered case).
pub fn calls(con: &mut Connection, command: &str) -> Option<u64> {
    let text = info(con, "commandstats");
    let name = format!("cmdstat_{command}");
    let stats = text.lines().find_map(|line| {
        let (field, value) = line.split_once(':')?;
        field.eq_ignore_ascii_case(&name).then_some(value)
    })?;
    let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
    Some(calls.trim().parse().expect("calls is an integer"))
}

/// `used_memory` from `INFO memory`.
pub fn used_memory(con: &mut Connection) -> i64 {
    info_number(con, "memory", "used_memory")
}

/// Polls until what a load added to `used_memory` above `before` is at most 5% of its
/// `peak`; panics if it is not within `within`.
pub fn wait_reclaimed(con: &mut Connection, before: i64, peak: i64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let added = used_memory(con) - before;
        if added * 20 <= peak {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still {added} of {peak} bytes after {within:?}"
        );
        sleep(Duration::from_millis(20));
    }
}
