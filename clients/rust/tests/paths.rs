//! The three paths on servers that forbid what a module-less managed Redis forbids, each with
//! the exact decisions and counts of one fixed sequence: the module (RL.*), the Functions
//! library (FCALL, loaded by an admin with `load_functions`) and the script (EVALSHA, EVAL on
//! NOSCRIPT, never SCRIPT LOAD). Users are made from clients/vectors/permissions.json
//! (`ACL SETUSER app on >pw ~* resetchannels -@all` + the connection rules + a path's rules):
//! the admin, the least-privilege rules of each path, `COMMAND` renamed away, no SCRIPT LOAD,
//! FCALL only, EVALSHA only with the script preloaded. Then misconfigurations: a wrong
//! password, a cluster client on a standalone server, a missing permission; each is raised by
//! `check()` and, at run time, decided by the policy and counted as `misconfigured`. And the
//! module loaded (MODULE LOAD) while limiters run the Functions library or the script: they
//! meet the keys a module-path process converted, and move to the module.

#![cfg(test)]

mod common;

use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use serde_json::Value as Json;

use common::{slow, Server};
use redis_rl_client::{
    load_functions, AsyncLimiter, Error, Limiter, OnError, Options, Path, SlotItem, Source,
    FUNCTIONS_VERSION, LUA_SCRIPT,
};

const PERMISSIONS: &str = include_str!("../../vectors/permissions.json");

/// The rules at `pointer` (a JSON pointer) of permissions.json.
fn rules(pointer: &str) -> Vec<String> {
    let doc: Json = serde_json::from_str(PERMISSIONS).unwrap();
    doc.pointer(pointer)
        .and_then(Json::as_array)
        .unwrap_or_else(|| panic!("permissions.json has no {pointer}"))
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect()
}

/// Creates the user `app` (password `pw`) with the connection rules and `extra`, as the
/// documentation says, and returns a client that logs in as it.
fn user(server: &Server, extra: &[String]) -> redis::Client {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg("app")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("resetchannels")
        .arg("-@all");
    for rule in rules("/connection").iter().chain(extra) {
        cmd.arg(rule);
    }
    let _: () = cmd.query(&mut server.conn()).unwrap();
    redis::Client::open(format!("redis://app:pw@127.0.0.1:{}/", server.port)).unwrap()
}

/// Who the limiter connects as.
#[derive(Clone, Copy, Debug)]
enum Who {
    /// The default user, allowed everything.
    Admin,
    /// The least-privilege rules of the path (`/paths/<path>/decide`).
    Least,
    /// The admin, on a server started with `rename-command COMMAND ""`.
    NoCommand,
    /// `+@all -script|load`, with the script loaded by an admin beforehand.
    NoScriptLoad,
    /// EVALSHA only (`/paths/script_preloaded/decide`), the script preloaded by an admin.
    EvalshaOnly,
}

/// A server for `path` as `who` needs it: the module loaded for the module path, the Functions
/// library loaded (by the admin) for the Functions path, neither for the script.
fn server(path: Path, who: Who) -> Server {
    let mut server = match path {
        Path::Module => Server::start(),
        _ => Server::plain(),
    };
    if let Who::NoCommand = who {
        // Started again as it was (module or not), with COMMAND renamed away.
        server.restart_with(&["--rename-command", "COMMAND", ""]);
        let command = redis::cmd("COMMAND")
            .arg("COUNT")
            .query::<i64>(&mut server.conn());
        assert!(command.is_err(), "COMMAND still answers: {command:?}");
    }
    if path == Path::Functions {
        let version = load_functions(&mut server.conn()).unwrap();
        assert_eq!(version, FUNCTIONS_VERSION);
    }
    if let Who::NoScriptLoad | Who::EvalshaOnly = who {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(LUA_SCRIPT)
            .query(&mut server.conn())
            .unwrap();
    }
    server
}

fn client(server: &Server, path: Path, who: Who) -> redis::Client {
    let name = match path {
        Path::Module => "module",
        Path::Functions => "functions",
        _ => "script",
    };
    match who {
        Who::Admin | Who::NoCommand => server.client(),
        Who::Least => user(server, &rules(&format!("/paths/{name}/decide"))),
        Who::NoScriptLoad => user(server, &["+@all".into(), "-script|load".into()]),
        Who::EvalshaOnly => user(server, &rules("/paths/script_preloaded/decide")),
    }
}

fn source_of(path: Path) -> Source {
    match path {
        Path::Module => Source::Redis,
        Path::Functions => Source::Functions,
        _ => Source::Lua,
    }
}

fn options() -> Options {
    Options::new(OnError::Open).timeout(Duration::from_secs(2))
}

/// One fixed sequence with its exact replies, all from `source`: 12 decisions.
fn sequence(limiter: &Limiter, source: Source, what: &str) {
    let limit = slow();
    for remaining in [4, 3, 2, 1, 0] {
        let d = limiter.acquire("seq", &limit, 1.0).unwrap();
        assert_eq!(
            (d.allowed, d.remaining, d.source),
            (true, remaining, source),
            "{what}"
        );
    }
    let d = limiter.acquire("seq", &limit, 1.0).unwrap();
    assert_eq!((d.allowed, d.source), (false, source), "{what}");
    assert!(d.retry_after_ms > 0, "{what}");
    let d = limiter.peek("seq", &limit, 0.0).unwrap();
    assert_eq!(
        (d.allowed, d.remaining, d.source),
        (true, 0, source),
        "{what}"
    );
    let r = limiter.refund("seq", &limit, 2.0).unwrap();
    assert_eq!((r.remaining, r.source), (2, source), "{what}");
    let c = limiter.charge("seq", &limit, 1.0).unwrap();
    assert_eq!((c.balance, c.source), (1, source), "{what}");
    let items = [("{m}a", limit, 5.0), ("{m}b", limit, 1.0)];
    let all = limiter.acquire_all(&items).unwrap();
    assert_eq!((all.allowed, all.source), (true, source), "{what}");
    let all = limiter.acquire_all(&items).unwrap();
    assert_eq!(
        (all.allowed, all.refused_index, all.source),
        (false, Some(0), source),
        "{what}"
    );
    let table = limiter.table("tbl", 4).unwrap();
    let d = table.acquire("203.0.113.7", &limit, 1.0).unwrap();
    assert_eq!(
        (d.allowed, d.remaining, d.source),
        (true, 4, source),
        "{what}"
    );
}

/// Each way of reaching `path` gives the sequence's exact replies and counts, and reaches the
/// server only through that path's commands.
fn each_user_on(path: Path, users: &[Who]) {
    for &who in users {
        let what = format!("{path:?} as {who:?}");
        let server = server(path, who);
        let limiter = Limiter::new(client(&server, path, who), options());
        assert_eq!(limiter.check().unwrap(), Some(path), "{what}");
        sequence(&limiter, source_of(path), &what);
        let counters = limiter.counters();
        let answered = match path {
            Path::Module => counters.redis,
            Path::Functions => counters.functions,
            _ => counters.lua,
        };
        assert_eq!(answered, 12, "{what}: {counters:?}");
        assert_eq!(
            (
                counters.redis + counters.functions + counters.lua,
                counters.without_redis(),
                counters.outages,
                counters.misconfigured
            ),
            (12, 0, 0, 0),
            "{what}: {counters:?}"
        );
        // Only the admin's preload, never the limiter.
        let preloaded = u64::from(matches!(who, Who::NoScriptLoad | Who::EvalshaOnly));
        assert_eq!(
            server.calls("script|load"),
            preloaded,
            "{what}: no SCRIPT LOAD"
        );
        let scripts = server.calls("evalsha") + server.calls("eval");
        let functions = server.calls("fcall") + server.calls("fcall_ro");
        match path {
            Path::Module => assert_eq!((scripts, functions), (0, 0), "{what}"),
            // The peeks of check(): FCALL_RO of rl_version and rl_peek.
            Path::Functions => assert_eq!(scripts, 0, "{what}"),
            _ => assert!(scripts >= 12, "{what}"),
        }
        // The async limiter, the same way.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let limiter = AsyncLimiter::connect(client(&server, path, who), options()).unwrap();
            assert_eq!(limiter.check().await.unwrap(), Some(path), "{what}");
            for remaining in [4, 3, 2, 1, 0] {
                let d = limiter.acquire("async", &slow(), 1.0).await.unwrap();
                assert_eq!(
                    (d.allowed, d.remaining, d.source),
                    (true, remaining, source_of(path)),
                    "{what}"
                );
            }
            let counters = limiter.counters();
            assert_eq!(
                (counters.without_redis(), counters.misconfigured),
                (0, 0),
                "{what}"
            );
        });
    }
}

#[test]
fn the_module_path_for_each_user() {
    each_user_on(
        Path::Module,
        &[Who::Admin, Who::Least, Who::NoCommand, Who::NoScriptLoad],
    );
}

/// `Least` is FCALL only: the Functions rules hold no EVAL or EVALSHA.
#[test]
fn the_functions_path_for_each_user() {
    assert!(!rules("/paths/functions/decide")
        .iter()
        .any(|r| r.contains("eval")));
    each_user_on(
        Path::Functions,
        &[Who::Admin, Who::Least, Who::NoCommand, Who::NoScriptLoad],
    );
}

#[test]
fn the_script_path_for_each_user() {
    each_user_on(
        Path::Lua,
        &[
            Who::Admin,
            Who::Least,
            Who::NoCommand,
            Who::NoScriptLoad,
            Who::EvalshaOnly,
        ],
    );
}

#[test]
fn the_loaded_library_is_the_version_this_client_needs() {
    let server = Server::plain();
    assert_eq!(
        load_functions(&mut server.conn()).unwrap(),
        FUNCTIONS_VERSION
    );
    // Loading it again replaces it.
    assert_eq!(
        load_functions(&mut server.conn()).unwrap(),
        FUNCTIONS_VERSION
    );
    let version: i64 = redis::cmd("FCALL_RO")
        .arg("rl_version")
        .arg(0)
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(version, FUNCTIONS_VERSION);
    // An admin with only the documented rules can load it.
    let admin = user(&server, &rules("/admin/load_functions"));
    assert_eq!(
        load_functions(&mut admin.get_connection().unwrap()).unwrap(),
        FUNCTIONS_VERSION
    );
    // Without them: a misconfiguration naming the rules.
    let nobody = user(&server, &[]);
    match load_functions(&mut nobody.get_connection().unwrap()) {
        Err(Error::Misconfigured(cause)) => assert!(cause.contains("+function|load"), "{cause}"),
        other => panic!("{other:?}"),
    }
}

/// A library deleted while in use: the next call finds the script, without an error.
#[test]
fn a_library_flushed_falls_back_to_the_script() {
    let server = server(Path::Functions, Who::Admin);
    let limiter = Limiter::new(server.client(), options());
    let d = limiter.acquire("k", &slow(), 1.0).unwrap();
    assert_eq!((d.remaining, d.source), (4, Source::Functions));
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut server.conn())
        .unwrap();
    let d = limiter.acquire("k", &slow(), 1.0).unwrap();
    assert_eq!((d.remaining, d.source), (3, Source::Lua));
    assert_eq!(limiter.path(), Some(Path::Lua));
}

// Misconfigurations ------------------------------------------------------------------------

/// `check()` fails with a cause containing `want`; then calls are decided by the `Open`
/// policy, counted as misconfigured, with no outage.
fn misconfigured_sync<K: redis_rl_client::Connect>(limiter: Limiter<K>, want: &str) {
    common::capture_logs();
    let cause = match limiter.check() {
        Err(Error::Misconfigured(cause)) => cause,
        other => panic!("expected a misconfiguration ({want}), got {other:?}"),
    };
    assert!(cause.contains(want), "{cause}");
    common::take_logs();
    for _ in 0..3 {
        let d = limiter.acquire("k", &slow(), 1.0).unwrap();
        assert_eq!((d.allowed, d.source), (true, Source::Open));
    }
    // Logged with its cause, once for the three calls (at most once every 10 s per cause).
    let logs = common::take_logs();
    let logged: Vec<&String> = logs.iter().filter(|l| l.contains(&cause)).collect();
    assert_eq!(logged.len(), 1, "{logs:?}");
    assert!(logged[0].contains("misconfigured"), "{logs:?}");
    let counters = limiter.counters();
    assert_eq!(
        (counters.misconfigured, counters.open, counters.outages),
        (3, 0, 0),
        "{counters:?}"
    );
}

#[test]
fn a_wrong_password_is_a_misconfiguration() {
    let server = Server::start();
    let _ = user(&server, &rules("/paths/module/decide"));
    let wrong =
        redis::Client::open(format!("redis://app:nope@127.0.0.1:{}/", server.port)).unwrap();
    misconfigured_sync(Limiter::new(wrong.clone(), options()), "authentication");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let limiter = AsyncLimiter::connect(wrong, options()).unwrap();
        match limiter.check().await {
            Err(Error::Misconfigured(cause)) => {
                assert!(cause.contains("authentication"), "{cause}")
            }
            other => panic!("{other:?}"),
        }
        let d = limiter.acquire("k", &slow(), 1.0).await.unwrap();
        assert_eq!((d.allowed, d.source), (true, Source::Open));
        let counters = limiter.counters();
        assert_eq!((counters.misconfigured, counters.outages), (1, 0));
    });
}

#[test]
fn a_cluster_client_on_a_standalone_server_is_a_misconfiguration() {
    let server = Server::start();
    let client = ClusterClient::builder([server.url()])
        .connection_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    misconfigured_sync(Limiter::new(client, options()), "standalone");
}

#[test]
fn a_missing_permission_is_a_misconfiguration_naming_the_command_and_the_rule() {
    // The functions rules on a server without the library: EVALSHA and EVAL are refused.
    let server = Server::plain();
    let client = user(&server, &rules("/paths/functions/decide"));
    misconfigured_sync(
        Limiter::new(client, options()),
        "may not run 'evalsha' (nor 'eval'); add the ACL rules \"+evalsha +eval",
    );
    // A command the script runs inside the server (no TIME): named where the server names it.
    let server = Server::plain();
    let mut least = rules("/paths/script/decide");
    least.retain(|r| r != "+time");
    let limiter = Limiter::new(user(&server, &least), options());
    misconfigured_sync(limiter, "NOPERM");
    // The module's commands refused: found as refused, and the next path tried.
    let server = Server::start();
    let client = user(&server, &rules("/paths/script/decide"));
    let limiter = Limiter::new(client, options());
    assert_eq!(limiter.check().unwrap(), Some(Path::Lua));
}

// The module loaded while a limiter runs the fallback --------------------------------------

/// A server without the module that can load it at run time (MODULE LOAD), with the
/// Functions library loaded for `Path::Functions`.
fn loaded_later(path: Path) -> Server {
    let mut server = Server::plain();
    server.restart_with(&["--enable-module-command", "yes"]);
    if path == Path::Functions {
        assert_eq!(
            load_functions(&mut server.conn()).unwrap(),
            FUNCTIONS_VERSION
        );
    }
    server
}

/// Lets the server's clock pass the millisecond of the last fallback write. On Redis 7.0 the
/// module reads the time in whole milliseconds and the fallback in microseconds (TIME): within
/// the millisecond of a fallback write, the module sees the bucket up to 1 ms emptier
/// (stricter, never laxer), which at a whole count of tokens is one less.
fn next_millisecond() {
    std::thread::sleep(Duration::from_millis(2));
}

/// The calls of the Functions library and of the script that reached the server.
fn fallback_calls(server: &Server) -> u64 {
    ["fcall", "fcall_ro", "evalsha", "eval"]
        .iter()
        .map(|name| server.calls(name))
        .sum()
}

/// The error of a call that must fail with WRONGTYPE, as text.
fn wrongtype<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match result {
        Err(Error::Redis(e)) => {
            let text = e.to_string();
            assert!(text.contains("WRONGTYPE"), "{text}");
            text
        }
        other => panic!("expected WRONGTYPE, got {other:?}"),
    }
}

#[test]
fn a_fallback_limiter_moves_to_the_module_loaded_later() {
    common::capture_logs_at(log::Level::Info);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let limit = slow();
    for path in [Path::Functions, Path::Lua] {
        let what = format!("{path:?}");
        let server = loaded_later(path);
        let started = Instant::now();
        // Limiters that chose the fallback before the module came: two blocking, one async.
        let old = Limiter::new(server.client(), options());
        assert_eq!(old.check().unwrap(), Some(path), "{what}");
        let d = old.acquire("k", &limit, 1.0).unwrap();
        assert_eq!(
            (d.allowed, d.remaining, d.source),
            (true, 4, source_of(path)),
            "{what}"
        );
        let other = Limiter::new(server.client(), options());
        assert_eq!(
            other.acquire("{s}a", &limit, 1.0).unwrap().source,
            source_of(path)
        );
        let old_async = runtime.block_on(async {
            let limiter = AsyncLimiter::connect(server.client(), options()).unwrap();
            assert_eq!(limiter.check().await.unwrap(), Some(path), "{what}");
            let x = limiter.acquire("{t}x", &limit, 1.0).await.unwrap();
            let y = limiter.acquire("{t}y", &limit, 2.0).await.unwrap();
            assert_eq!((x.remaining, y.remaining), (4, 3), "{what}");
            limiter
        });
        // A key of another type, without the module: the fallback's WRONGTYPE, as before.
        let _: () = redis::cmd("SET")
            .arg("plain")
            .arg("x")
            .query(&mut server.conn())
            .unwrap();
        let text = wrongtype(old.acquire("plain", &limit, 1.0));
        assert!(text.contains("script"), "{what}: {text}");
        assert_eq!(old.path(), Some(path), "{what}");

        let _: () = redis::cmd("MODULE")
            .arg("LOAD")
            .arg(common::module_path().display().to_string())
            .query(&mut server.conn())
            .unwrap();
        next_millisecond();
        // A process started now takes the module and converts the buckets.
        let new = Limiter::new(server.client(), options());
        assert_eq!(new.check().unwrap(), Some(Path::Module), "{what}");
        for (key, remaining) in [("k", 3), ("{s}a", 3), ("{t}x", 3)] {
            let d = new.acquire(key, &limit, 1.0).unwrap();
            assert_eq!(
                (d.allowed, d.remaining, d.source),
                (true, remaining, Source::Redis),
                "{what}: {key}"
            );
            let kind: String = redis::cmd("TYPE")
                .arg(key)
                .query(&mut server.conn())
                .unwrap();
            assert_eq!(kind, "rl-bucket", "{what}: {key}");
        }

        // The old limiter's fallback meets the converted key, finds the module, and the module
        // answers this call: no error.
        let (fallback, module) = (fallback_calls(&server), server.calls("rl.acquire"));
        common::take_logs();
        let d = old.acquire("k", &limit, 1.0).unwrap();
        let elapsed_ms = i64::try_from(started.elapsed().as_millis()).unwrap();
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after_ms, d.source),
            (true, 2, 0, Source::Redis),
            "{what}"
        );
        // Three takes of 1000 s each since the first: full 3000 s after it, to the ms.
        assert!(d.reset_after_ms <= 3_000_000, "{what}: {d:?}");
        assert!(
            d.reset_after_ms >= 3_000_000 - elapsed_ms - 1,
            "{what}: {d:?}"
        );
        assert_eq!(old.path(), Some(Path::Module), "{what}");
        let logs = common::take_logs();
        let fallback_name = match path {
            Path::Functions => "the Functions library",
            _ => "the script",
        };
        assert_eq!(
            logs,
            [format!(
                "redis-rl: {fallback_name} met a key of another type (WRONGTYPE) and the \
                 module answers: using the module path"
            )],
            "{what}"
        );
        let d = old.acquire("k", &limit, 1.0).unwrap();
        assert_eq!(
            (d.allowed, d.remaining, d.source),
            (true, 1, Source::Redis),
            "{what}"
        );
        // One fallback call met WRONGTYPE, then one module call per take.
        assert_eq!(fallback_calls(&server), fallback + 1, "{what}");
        assert_eq!(server.calls("rl.acquire"), module + 2, "{what}");
        // A key of another type still raises WRONGTYPE, now the module's, with one call.
        let text = wrongtype(old.acquire("plain", &limit, 1.0));
        assert!(!text.contains("script"), "{what}: {text}");
        assert_eq!(server.calls("rl.acquire"), module + 3, "{what}");
        // A table on the module path: its buckets start full.
        let d = old
            .table("tbl", 4)
            .unwrap()
            .acquire("f", &limit, 1.0)
            .unwrap();
        assert_eq!((d.remaining, d.source), (4, Source::Redis), "{what}");
        let counters = old.counters();
        assert_eq!(
            (
                counters.redis,
                counters.functions + counters.lua,
                counters.without_redis(),
                counters.outages,
                counters.misconfigured
            ),
            (3, 1, 0, 0, 0),
            "{what}: {counters:?}"
        );

        // All or nothing across slots, on a limiter still on the fallback: rl_multi meets the
        // converted key, and RL.ACQUIRE.MULTI answers.
        let multi = server.calls("rl.acquire.multi");
        let across = other
            .acquire_across_slots(&[
                SlotItem::new("{s}a", limit, 1.0),
                SlotItem::new("{s}b", limit, 1.0),
            ])
            .unwrap();
        let remaining: Vec<u64> = across
            .outcomes
            .iter()
            .filter_map(|o| o.decision().map(|d| d.remaining))
            .collect();
        assert_eq!(
            (across.allowed, remaining, across.sources.clone()),
            (true, vec![2, 4], vec![Source::Redis]),
            "{what}"
        );
        assert_eq!(server.calls("rl.acquire.multi"), multi + 1, "{what}");
        assert_eq!(other.path(), Some(Path::Module), "{what}");

        // The async limiter: all or nothing over a converted bucket and one the fallback
        // wrote, which the module takes over.
        runtime.block_on(async {
            let all = old_async
                .acquire_all(&[("{t}x", limit, 1.0), ("{t}y", limit, 1.0)])
                .await
                .unwrap();
            let remaining: Vec<u64> = all.decisions.iter().map(|d| d.remaining).collect();
            assert_eq!(
                (all.allowed, remaining, all.source),
                (true, vec![2, 2], Source::Redis),
                "{what}"
            );
            assert_eq!(old_async.path(), Some(Path::Module), "{what}");
            let counters = old_async.counters();
            assert_eq!(
                (counters.without_redis(), counters.misconfigured),
                (0, 0),
                "{what}"
            );
        });
        let text: String = redis::cmd("GET")
            .arg("plain")
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(text, "x", "{what}");
    }
}

/// Without the module a key of another type raises WRONGTYPE on every call, on either
/// fallback, and the policy never decides it.
#[test]
fn a_plain_key_on_the_fallback_still_raises_wrongtype() {
    for path in [Path::Functions, Path::Lua] {
        let server = loaded_later(path);
        let limiter = Limiter::new(server.client(), options());
        assert_eq!(limiter.check().unwrap(), Some(path));
        let mut conn = server.conn();
        let _: () = redis::cmd("SET")
            .arg("plain")
            .arg("x")
            .query(&mut conn)
            .unwrap();
        let _: () = redis::cmd("RPUSH")
            .arg("queue")
            .arg("x")
            .query(&mut conn)
            .unwrap();
        for key in ["plain", "queue"] {
            for _ in 0..2 {
                let text = wrongtype(limiter.acquire(key, &slow(), 1.0));
                assert!(text.contains("script"), "{path:?}: {text}");
            }
        }
        assert_eq!(limiter.path(), Some(path));
        let counters = limiter.counters();
        assert_eq!(
            (counters.open, counters.outages, counters.misconfigured),
            (0, 0, 0),
            "{path:?}: {counters:?}"
        );
    }
}

/// The module is there but this user may not run it: the fallback's WRONGTYPE, as it came.
#[test]
fn a_user_without_the_module_rules_keeps_the_fallback_and_its_wrongtype() {
    for (path, name) in [(Path::Functions, "functions"), (Path::Lua, "script")] {
        let server = Server::start();
        if path == Path::Functions {
            load_functions(&mut server.conn()).unwrap();
        }
        let client = user(&server, &rules(&format!("/paths/{name}/decide")));
        let limiter = Limiter::new(client, options());
        assert_eq!(limiter.check().unwrap(), Some(path));
        assert_eq!(limiter.acquire("k", &slow(), 1.0).unwrap().remaining, 4);
        next_millisecond();
        // A user allowed the module converts the bucket.
        let reply: Vec<i64> = redis::cmd("RL.ACQUIRE")
            .arg("k")
            .arg("0.001")
            .arg("5")
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(reply.get(1), Some(&3));
        let text = wrongtype(limiter.acquire("k", &slow(), 1.0));
        assert!(text.contains("script"), "{path:?}: {text}");
        assert_eq!(limiter.path(), Some(path));
        let counters = limiter.counters();
        assert_eq!(
            (counters.open, counters.outages, counters.misconfigured),
            (0, 0, 0),
            "{path:?}: {counters:?}"
        );
    }
}
