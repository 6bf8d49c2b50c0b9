//! Bucket tables (`Limiter::table`, `AsyncLimiter::table`) against real servers: the shared
//! vectors (`clients/vectors/table.json`: the shard hash and table sequences) on the module's
//! tables and on the Lua fallback, the keys each path writes, the failure policy during an
//! outage, and the deny cache counted with INFO commandstats.

#![cfg(test)]

mod common;

use std::time::{Duration, Instant};

use common::{limiter, options, Server};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis_rl_client::{
    shard_of, AsyncLimiter, Error, Limit, Limiter, OnError, Options, Path, Source, TableOptions,
    MAX_BUCKETS_PER_TABLE,
};
use serde_json::Value as Json;

fn vectors() -> Json {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../vectors/table.json");
    let doc: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(doc["format"], 1);
    doc
}

fn slow() -> Limit {
    Limit::new(0.001, 2.0).unwrap()
}

#[test]
fn fields_map_to_the_shards_and_keys_of_the_vectors() {
    let doc = vectors();
    let cases = doc["shards"].as_array().unwrap();
    assert!(cases.len() > 100);
    // A table needs a limiter, but naming touches no server: nothing listens on port 1.
    let limiter = Limiter::new(
        redis::Client::open("redis://127.0.0.1:1/").unwrap(),
        options(OnError::Closed),
    );
    for case in cases {
        let field = case["field"].as_str().unwrap();
        let shards = u32::try_from(case["shards"].as_u64().unwrap()).unwrap();
        let shard = u32::try_from(case["shard"].as_u64().unwrap()).unwrap();
        assert_eq!(shard_of(field, shards), shard, "{case}");
        let table = limiter.table("api", shards).unwrap();
        assert_eq!(
            table.key(shard),
            case["table_key"].as_str().unwrap(),
            "{case}"
        );
        assert_eq!(
            table.fallback_key(field),
            case["fallback_key"].as_str().unwrap(),
            "{case}"
        );
    }
}

#[test]
fn bad_tables_are_refused_where_they_are_written() {
    let limiter = Limiter::new(
        redis::Client::open("redis://127.0.0.1:1/").unwrap(),
        options(OnError::Closed),
    );
    for (name, shards, text) in [
        ("a{b}", 1, "name must not contain"),
        ("a}", 1, "name must not contain"),
        ("", 1, "name must be"),
        ("t", 0, "shards must be"),
        ("t", 16385, "shards must be"),
    ] {
        match limiter.table(name, shards) {
            Err(Error::Invalid(e)) => assert!(e.contains(text), "{name} {shards}: {e}"),
            Err(e) => panic!("{name} {shards}: {e}"),
            Ok(_) => panic!("{name} {shards}: accepted"),
        }
    }
}

/// Runs the vectors' sequences on `limiter`'s tables: allowed, remaining, -1, delete and len
/// exactly; the waits within the time the sequence has taken.
fn run_sequences(limiter: &Limiter, what: &str) {
    for seq in vectors()["sequences"].as_array().unwrap() {
        let name = seq["name"].as_str().unwrap();
        let shards = u32::try_from(seq["shards"].as_u64().unwrap()).unwrap();
        let table = limiter
            .table(seq["table"].as_str().unwrap(), shards)
            .unwrap();
        let number = |v: &Json| v.as_str().unwrap().parse::<f64>().unwrap();
        let limit = Limit::new(number(&seq["rate"]), number(&seq["capacity"])).unwrap();
        let started = Instant::now();
        for (i, step) in seq["steps"].as_array().unwrap().iter().enumerate() {
            let at = format!("{what}: {name} step {i} {step}");
            let expect = &step["expect"];
            let int = |v: &Json| v.as_i64().unwrap();
            match step["op"].as_str().unwrap() {
                "delete" => {
                    let fields: Vec<&str> = step["fields"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|f| f.as_str().unwrap())
                        .collect();
                    assert_eq!(table.delete(&fields).unwrap() as i64, int(expect), "{at}");
                }
                "len" => assert_eq!(table.len().unwrap() as i64, int(expect), "{at}"),
                op => {
                    let field = step["field"].as_str().unwrap();
                    let cost = number(&step["cost"]);
                    let e: Vec<i64> = expect.as_array().unwrap().iter().map(int).collect();
                    let took_ms = || started.elapsed().as_millis() as i64 + 1;
                    if op == "refund" {
                        let r = table.refund(field, &limit, cost).unwrap();
                        let took_ms = took_ms();
                        assert_eq!(r.remaining as i64, e[0], "{at}");
                        assert!((r.reset_after_ms - e[1]).abs() <= took_ms, "{at}: {r:?}");
                        continue;
                    }
                    let d = if op == "acquire" {
                        table.acquire(field, &limit, cost).unwrap()
                    } else {
                        table.peek(field, &limit, cost).unwrap()
                    };
                    let took_ms = took_ms();
                    assert_eq!((d.allowed, d.remaining as i64), (e[0] == 1, e[1]), "{at}");
                    assert_eq!(d.retry_after_ms < 0, e[2] < 0, "{at}");
                    assert!((d.retry_after_ms - e[2]).abs() <= took_ms, "{at}: {d:?}");
                    assert!((d.reset_after_ms - e[3]).abs() <= took_ms, "{at}: {d:?}");
                }
            }
        }
    }
}

#[test]
fn module_tables_give_the_vectors_replies() {
    let server = Server::start();
    let limiter = limiter(&server, options(OnError::Closed));
    run_sequences(&limiter, "module");
    assert_eq!(limiter.path(), Some(Path::Module));
    assert_eq!(limiter.counters().lua, 0);
}

#[test]
fn the_lua_fallback_gives_the_vectors_replies() {
    let server = Server::plain();
    let limiter = limiter(&server, options(OnError::Closed));
    run_sequences(&limiter, "lua");
    assert_eq!(limiter.path(), Some(Path::Lua));
    assert_eq!(limiter.counters().redis, 0);
}

fn keys(server: &Server) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.conn())
        .unwrap();
    keys.sort();
    keys
}

#[test]
fn expected_buckets_spread_the_fields_over_that_many_keys() {
    let server = Server::start();
    let limiter = limiter(&server, options(OnError::Closed));
    let sized = TableOptions::new().expected_buckets(3 * MAX_BUCKETS_PER_TABLE);
    let table = limiter.table_with("sized", sized).unwrap();
    assert_eq!(table.shards(), 3);
    for n in 0..60 {
        let field = format!("user:{n}");
        assert!(table.acquire(&field, &slow(), 1.0).unwrap().allowed);
    }
    assert_eq!(keys(&server), ["sized:{0}", "sized:{1}", "sized:{2}"]);
    assert_eq!(table.len().unwrap(), 60);
}

#[test]
fn too_few_shards_for_the_expected_buckets_warn_and_are_kept() {
    common::capture_logs();
    common::take_logs();
    let expected = 3 * MAX_BUCKETS_PER_TABLE + 1;
    let both = TableOptions::new().shards(2).expected_buckets(expected);
    assert_eq!(both.shard_count("big").unwrap(), 2);
    let logs = common::take_logs();
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert!(
        logs[0].contains(&format!(
            "\"big\": 2 shards for {expected} expected buckets"
        )),
        "{logs:?}"
    );
    assert!(
        logs[0].contains("4 shards would keep each under it"),
        "{logs:?}"
    );
    let enough = TableOptions::new()
        .shards(4)
        .expected_buckets(4 * MAX_BUCKETS_PER_TABLE);
    assert_eq!(enough.shard_count("t").unwrap(), 4);
    assert!(common::take_logs().is_empty());
}

#[test]
fn the_module_keeps_one_key_per_shard() {
    let server = Server::start();
    let limiter = limiter(&server, options(OnError::Closed));
    let table = limiter.table("api", 4).unwrap();
    let fields: Vec<String> = (0..40).map(|n| format!("user:{n}")).collect();
    for field in &fields {
        assert_eq!(
            table.acquire(field, &slow(), 1.0).unwrap().source,
            Source::Redis
        );
    }
    let mut expected: Vec<String> = fields.iter().map(|f| table.key(shard_of(f, 4))).collect();
    expected.sort();
    expected.dedup();
    assert_eq!(keys(&server), expected);
    for key in &expected {
        let kind: String = redis::cmd("TYPE")
            .arg(key)
            .query(&mut server.conn())
            .unwrap();
        assert!(
            !["hash", "string", "none"].contains(&kind.as_str()),
            "{kind}"
        );
    }
    assert_eq!(table.len().unwrap(), 40);
}

#[test]
fn the_lua_path_keeps_one_hash_per_field_under_the_shards_tag() {
    let server = Server::plain();
    let limiter = limiter(&server, options(OnError::Closed));
    let table = limiter.table("api", 4).unwrap();
    for field in ["a", "b", "c"] {
        assert_eq!(
            table.acquire(field, &slow(), 1.0).unwrap().source,
            Source::Lua
        );
    }
    let mut expected: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|f| format!("api:{{{}}}:{f}", shard_of(f, 4)))
        .collect();
    expected.sort();
    assert_eq!(keys(&server), expected);
    for key in &expected {
        let kind: String = redis::cmd("TYPE")
            .arg(key)
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(kind, "string");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query(&mut server.conn())
            .unwrap();
        assert!(ttl > 0);
    }
    // A name with glob characters counts only its own keys, and keys SCAN's pattern also
    // matches but no shard below 4 owns do not count.
    let other = limiter.table("a*", 4).unwrap();
    other.acquire("x", &slow(), 1.0).unwrap();
    for stray in ["api:{x}:f", "api:{07}:f", "api:{4}:f", "api:{}:f"] {
        let _: () = redis::cmd("SET")
            .arg(stray)
            .arg(1)
            .query(&mut server.conn())
            .unwrap();
    }
    assert_eq!((table.len().unwrap(), other.len().unwrap()), (3, 1));
}

#[test]
fn wrong_type_is_an_error_not_a_policy_decision() {
    let server = Server::start();
    let limiter = limiter(&server, options(OnError::Open));
    let _: () = redis::cmd("SET")
        .arg("t:{0}")
        .arg("x")
        .query(&mut server.conn())
        .unwrap();
    let table = limiter.table("t", 1).unwrap();
    match table.acquire("f", &slow(), 1.0) {
        Err(Error::Redis(e)) => assert!(e.to_string().contains("WRONGTYPE"), "{e}"),
        other => panic!("{other:?}"),
    }
}

/// Up, then down for 6 calls on one field, then up again. Returns the decisions while down.
fn outage(on_error: OnError, module: bool, instances: u32) -> Vec<(bool, Source)> {
    let mut server = Server::new(module);
    let limiter = limiter(
        &server,
        options(on_error)
            .instances(instances)
            .probe_interval(Duration::ZERO),
    );
    let table = limiter.table("t", 3).unwrap();
    let up = if module { Source::Redis } else { Source::Lua };
    assert_eq!(table.acquire("warm", &slow(), 1.0).unwrap().source, up);
    server.kill();
    let limit = Limit::new(0.001, 4.0).unwrap();
    let down: Vec<(bool, Source)> = (0..6)
        .map(|_| table.acquire("f", &limit, 1.0).unwrap())
        .map(|d| (d.allowed, d.source))
        .collect();
    // Not decisions: they fail rather than pretend.
    assert!(matches!(table.delete(&["f"]), Err(Error::Redis(_))));
    assert!(matches!(table.len(), Err(Error::Redis(_))));
    assert_eq!(limiter.counters().without_redis(), 6);
    assert_eq!(limiter.counters().outages, 1);
    if on_error == OnError::Local {
        // Local buckets are per table and field.
        assert!(table.acquire("g", &limit, 1.0).unwrap().allowed);
        assert!(
            limiter
                .table("u", 3)
                .unwrap()
                .acquire("f", &limit, 1.0)
                .unwrap()
                .allowed
        );
    }
    server.restart();
    let back = table.acquire("f", &limit, 1.0).unwrap();
    assert_eq!((back.source, back.remaining), (up, 3)); // the restarted server is empty
    down
}

#[test]
fn open_allows_while_redis_is_down() {
    assert_eq!(
        outage(OnError::Open, true, 1),
        vec![(true, Source::Open); 6]
    );
}

#[test]
fn closed_denies_while_redis_is_down() {
    assert_eq!(
        outage(OnError::Closed, true, 1),
        vec![(false, Source::Closed); 6]
    );
}

#[test]
fn local_decides_each_field_with_a_share_of_the_limit() {
    let allowed: Vec<bool> = outage(OnError::Local, true, 2)
        .iter()
        .map(|d| d.0)
        .collect();
    assert_eq!(allowed, [true, true, false, false, false, false]);
}

#[test]
fn local_policy_on_the_lua_path() {
    let down = outage(OnError::Local, false, 4);
    assert_eq!(down[0], (true, Source::Local));
    assert!(down[1..].iter().all(|d| *d == (false, Source::Local)));
}

#[test]
fn the_deny_cache_keeps_a_denied_field_off_the_server() {
    for module in [true, false] {
        let server = Server::new(module);
        let limiter = limiter(&server, options(OnError::Closed).deny_cache(true));
        let table = limiter.table("hot", 4).unwrap();
        let limit = Limit::new(0.001, 1.0).unwrap();
        let up = if module { Source::Redis } else { Source::Lua };
        assert!(table.acquire("f", &limit, 1.0).unwrap().allowed);
        for _ in 0..200 {
            assert!(!table.acquire("f", &limit, 1.0).unwrap().allowed);
        }
        let command = if module { "RL.HACQUIRE" } else { "evalsha" };
        // The Lua path's first EVALSHA follows a SCRIPT LOAD here: no NOSCRIPT retry.
        assert_eq!(server.calls(command), 2, "module={module}");
        assert_eq!(limiter.counters().cache, 199);
        // Keyed by table and field: another field, and the same field of another table, ask.
        assert!(table.acquire("g", &limit, 1.0).unwrap().allowed);
        let cold = limiter.table("cold", 4).unwrap();
        assert!(cold.acquire("f", &limit, 1.0).unwrap().allowed);
        assert_eq!(server.calls(command), 4);
        // delete resets the bucket and clears the entry: the next call asks, and is allowed.
        assert_eq!(table.delete(&["f"]).unwrap(), 1);
        let again = table.acquire("f", &limit, 1.0).unwrap();
        assert_eq!((again.allowed, again.source), (true, up));
        // refund clears it too.
        table.acquire("f", &limit, 1.0).unwrap();
        assert_eq!(
            table.acquire("f", &limit, 1.0).unwrap().source,
            Source::Cache
        );
        assert_eq!(table.refund("f", &limit, 1.0).unwrap().remaining, 1);
        assert_eq!(table.acquire("f", &limit, 1.0).unwrap().source, up);
    }
}

async fn async_limiter(server: &Server, options: Options) -> AsyncLimiter<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_millis(500)))
        .set_number_of_retries(1);
    let manager = server
        .client()
        .get_connection_manager_with_config(config)
        .await
        .unwrap();
    AsyncLimiter::new(manager, options.timeout(Duration::from_millis(500)))
}

#[tokio::test(flavor = "current_thread")]
async fn async_tables_decide_as_the_sync_ones_on_both_paths() {
    for module in [true, false] {
        let server = Server::new(module);
        let limiter = async_limiter(&server, Options::new(OnError::Closed).deny_cache(true)).await;
        let table = limiter.table("t", 4).unwrap();
        let up = if module { Source::Redis } else { Source::Lua };
        let limit = slow();
        let got = [
            table.acquire("a", &limit, 1.0).await.unwrap(),
            table.acquire("a", &limit, 1.0).await.unwrap(),
            table.acquire("a", &limit, 1.0).await.unwrap(),
            table.acquire("a", &limit, 1.0).await.unwrap(),
        ];
        let seen: Vec<(bool, u64, Source)> = got
            .iter()
            .map(|d| (d.allowed, d.remaining, d.source))
            .collect();
        assert_eq!(
            seen,
            [
                (true, 1, up),
                (true, 0, up),
                (false, 0, up),
                (false, 0, Source::Cache)
            ]
        );
        assert!(!table.peek("a", &limit, 1.0).await.unwrap().allowed);
        table.acquire("b", &limit, 2.0).await.unwrap();
        assert_eq!(table.len().await.unwrap(), 2);
        assert_eq!(table.refund("b", &limit, 2.0).await.unwrap().remaining, 2);
        assert_eq!(table.len().await.unwrap(), 1);
        assert_eq!(table.delete(&["a", "b", "a"]).await.unwrap(), 1);
        assert_eq!(table.len().await.unwrap(), 0);
        assert_eq!(table.acquire("a", &limit, 1.0).await.unwrap().source, up);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn async_outage_applies_the_policy_and_delete_fails() {
    let mut server = Server::start();
    let options = Options::new(OnError::Local)
        .instances(2)
        .probe_interval(Duration::ZERO);
    let limiter = async_limiter(&server, options).await;
    let table = limiter.table("t", 2).unwrap();
    assert_eq!(
        table.acquire("warm", &slow(), 1.0).await.unwrap().source,
        Source::Redis
    );
    server.kill();
    let limit = Limit::new(0.001, 4.0).unwrap();
    let mut down = Vec::new();
    for _ in 0..3 {
        let d = table.acquire("f", &limit, 1.0).await.unwrap();
        down.push((d.allowed, d.source));
    }
    assert_eq!(
        down,
        [
            (true, Source::Local),
            (true, Source::Local),
            (false, Source::Local)
        ]
    );
    assert!(table.delete(&["f"]).await.is_err());
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let d = table.acquire("f", &limit, 1.0).await.unwrap();
        if d.source == Source::Redis {
            assert_eq!(d.remaining, 3);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "decisions did not return to Redis"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
