//! The classic Lua token bucket (bench/token_bucket.lua), the baseline the module replaces,
//! loaded with `SCRIPT LOAD` and run with `EVALSHA`.

use redis::Connection;

/// The baseline script, verbatim.
pub const SCRIPT: &str = include_str!("../../bench/token_bucket.lua");

/// Loads the script and returns its SHA1.
pub fn load_script(con: &mut Connection) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SCRIPT)
        .query(con)
        .expect("SCRIPT LOAD")
}

/// One call of the loaded script at the client's clock `now_ms`: `[allowed, floor(tokens)]`.
pub fn lua_acquire(
    con: &mut Connection,
    sha: &str,
    key: &str,
    rate: &str,
    capacity: &str,
    now_ms: i64,
    cost: Option<&str>,
) -> [i64; 2] {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha)
        .arg(1)
        .arg(key)
        .arg(rate)
        .arg(capacity)
        .arg(now_ms);
    if let Some(cost) = cost {
        cmd.arg(cost);
    }
    let reply: Vec<i64> = cmd.query(con).expect("EVALSHA reply");
    reply
        .try_into()
        .expect("the script replies with 2 integers")
}
