//! The packaged redis-rl-client as a user builds it: `dist/check.sh` unpacks the `.crate`
//! files of `cargo package` (this crate and rl-bucket) into a clean directory outside the
//! repository, builds this program against them, and runs it against a real server with the
//! module (`module`) and plain ones (`lua`; `functions`, where it loads the packaged Functions
//! library first, as an admin would). Not part of the crate (`exclude` in Cargo.toml): it
//! only ever builds against the unpacked package.
//!
//! Usage: `dist-check REDIS_URL module|lua|functions PATH_TO_clients/lua/rl.lua`

use std::error::Error;
use std::time::Duration;

use redis_rl_client::{
    load_functions, AsyncLimiter, Limit, Limiter, OnError, Options, Path, SlotItem, Source,
    FUNCTIONS_LIBRARY, FUNCTIONS_VERSION, LUA_SCRIPT,
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
        return Err("usage: dist-check REDIS_URL module|lua|functions PATH_TO_rl.lua".into());
    };
    let (up, want_path) = match path.as_str() {
        "module" => (Source::Redis, Path::Module),
        "lua" => (Source::Lua, Path::Lua),
        "functions" => (Source::Functions, Path::Functions),
        other => {
            return Err(format!("the path must be module, lua or functions, not {other}").into())
        }
    };
    check(
        LUA_SCRIPT == std::fs::read_to_string(script)?,
        "the packaged rl.lua differs from clients/lua/rl.lua".into(),
    )?;
    let library = std::path::Path::new(script).with_file_name("rl_functions.lua");
    check(
        FUNCTIONS_LIBRARY == std::fs::read_to_string(library)?,
        "the packaged rl_functions.lua differs from clients/lua/rl_functions.lua".into(),
    )?;
    // 3 an hour, burst 3: nothing refills while this runs.
    let limit = Limit::per(3, Duration::from_secs(3600))?;
    let client = redis::Client::open(url.as_str())?;
    if want_path == Path::Functions {
        let version = load_functions(&mut client.get_connection()?)?;
        check(version == FUNCTIONS_VERSION, format!("loaded version {version}"))?;
    }
    let limiter = Limiter::new(client.clone(), Options::new(OnError::Closed));
    let found = limiter.check()?;
    check(found == Some(want_path), format!("check: {found:?}"))?;
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
