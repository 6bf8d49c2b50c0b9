//! The packaged redis-rl-client as a user builds it: `dist/check.sh` unpacks the `.crate`
//! files of `cargo package` (this crate and rl-bucket) into a clean directory outside the
//! repository, builds this program against them, and runs it against a real server with the
//! module (`module`) and a plain one (`lua`). Not part of the crate (`exclude` in
//! Cargo.toml): it only ever builds against the unpacked package.
//!
//! Usage: `dist-check REDIS_URL module|lua PATH_TO_clients/lua/rl.lua`

use std::error::Error;
use std::time::Duration;

use redis_rl_client::{
    AsyncLimiter, Limit, Limiter, OnError, Options, SlotItem, Source, LUA_SCRIPT,
};

/// Fails the run with `what` unless `ok`.
fn check(ok: bool, what: String) -> Result<(), Box<dyn Error>> {
    if ok {
        Ok(())
    } else {
        Err(what.into())
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, path, script] = args.as_slice() else {
        return Err("usage: dist-check REDIS_URL module|lua PATH_TO_rl.lua".into());
    };
    let up = match path.as_str() {
        "module" => Source::Redis,
        "lua" => Source::Lua,
        other => return Err(format!("the path must be module or lua, not {other}").into()),
    };
    check(
        LUA_SCRIPT == std::fs::read_to_string(script)?,
        "the packaged rl.lua differs from clients/lua/rl.lua".into(),
    )?;
    // 3 an hour, burst 3: nothing refills while this runs.
    let limit = Limit::per(3, Duration::from_secs(3600))?;
    let client = redis::Client::open(url.as_str())?;
    let limiter = Limiter::new(client.clone(), Options::new(OnError::Closed));
    let mut got = Vec::new();
    for _ in 0..4 {
        let d = limiter.acquire("dist:k", &limit, 1.0)?;
        got.push((d.allowed, d.remaining, d.source));
    }
    let want = [(true, 2, up), (true, 1, up), (true, 0, up), (false, 0, up)];
    check(got == want, format!("acquire: {got:?}, not {want:?}"))?;
    // Charged 5 with a burst of 3: two tokens in debt.
    let c = limiter.charge("dist:c", &limit, 5.0)?;
    check(
        (c.balance, c.source) == (-2, up),
        format!("charge: {c:?}"),
    )?;
    let table = limiter.table("dist:t", 4)?;
    let d = table.acquire("field", &limit, 1.0)?;
    check((d.allowed, d.source) == (true, up), format!("table: {d:?}"))?;
    let across = limiter.acquire_across_slots(&[
        SlotItem::new("dist:a", limit, 1.0),
        SlotItem::new("dist:b", limit, 1.0),
    ])?;
    check(across.allowed, format!("across slots: {across:?}"))?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let limiter = AsyncLimiter::connect(client, Options::new(OnError::Closed))?;
        let d = limiter.acquire("dist:k", &limit, 1.0).await?;
        check(
            (d.allowed, d.source) == (false, up),
            format!("async acquire: {d:?}"),
        )
    })?;
    println!("dist-check: the packaged client works on the {path} path");
    Ok(())
}
