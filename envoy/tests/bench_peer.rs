//! `make bench-envoy` driving a rate-limit service it did not start: a second redis-rl-envoy,
//! on its own Redis, given by `PEER_GRPC` (with `PEER_PID` and `PEER_REDIS`), benched beside
//! the one the bench starts for a short round. The results must hold the peer's rows with
//! figures, and the Redis bytes per limited user of both.

#![cfg(test)]

use rl_testkit as common;
mod support;

use std::process::Command;

use support::Service;

/// The row of `table_heading`'s table whose second column is `name`.
fn row<'a>(results: &'a str, table_heading: &str, name: &str) -> Vec<&'a str> {
    let section = results
        .split(table_heading)
        .nth(1)
        .unwrap_or_else(|| panic!("no {table_heading:?} in the results:\n{results}"));
    let line = section
        .lines()
        .find(|l| {
            l.split('|').nth(2).is_some_and(|c| c.trim() == name)
                || l.split('|').nth(1).is_some_and(|c| c.trim() == name)
        })
        .unwrap_or_else(|| panic!("no row for {name} under {table_heading:?}:\n{results}"));
    line.split('|').map(str::trim).collect()
}

/// One short run of the bench (one concurrency, 0.2 s rounds, no Lua path or Envoy) with
/// `env`: the results it wrote.
fn run_bench(dir: &std::path::Path, env: &[(&str, &str)], peer: &Service) -> String {
    let out = dir.join("envoy.md");
    let ran = Command::new(env!("CARGO_BIN_EXE_envoy-bench"))
        .arg("--out")
        .arg(&out)
        .env("MODULE", common::module_path())
        .env("SERVICE", env!("CARGO_BIN_EXE_redis-rl-envoy"))
        .env("SECONDS_PER_ROUND", "0.2")
        .env("STREAMS", "4")
        .env("SKIP_LUA", "1")
        .env("SKIP_ENVOY", "1")
        .env("MEMORY_USERS", "300")
        .env("LIMITADOR_BIN", "")
        .env("LIMITADOR_SKIP", "not in this test")
        .envs(env.iter().copied())
        .output()
        .expect("run envoy-bench");
    assert!(
        ran.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&ran.stderr),
        peer.log()
    );
    std::fs::read_to_string(&out).expect("the results")
}

fn number(cell: &str) -> f64 {
    cell.parse()
        .unwrap_or_else(|_| panic!("{cell:?} is not a figure"))
}

#[test]
fn the_bench_drives_a_service_it_did_not_start() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let bench = env!("CARGO_BIN_EXE_envoy-bench");
    // The config the peer must hold, as the bench writes it for a team's service.
    let config = tmp.path().join("config");
    let wrote = Command::new(bench)
        .arg("--write-config")
        .arg(&config)
        .output()
        .expect("envoy-bench --write-config");
    assert!(wrote.status.success(), "{wrote:?}");
    let files: Vec<(String, String)> = std::fs::read_dir(&config)
        .expect("config dir")
        .map(|e| {
            let path = e.expect("entry").path();
            let name = path
                .file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned();
            (name, std::fs::read_to_string(&path).expect("read"))
        })
        .collect();
    assert_eq!(files.len(), 3, "{files:?}");
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();

    let peer_redis = common::Server::start();
    let peer = Service::start(&format!("127.0.0.1:{}", peer_redis.port), &files, &[]);
    let grpc = format!("127.0.0.1:{}", peer.grpc_port);
    let pid = peer.pid().expect("running").to_string();
    let peer_redis_addr = format!("127.0.0.1:{}", peer_redis.port);
    let results = run_bench(
        tmp.path(),
        &[
            ("PEER_GRPC", &grpc),
            ("PEER_NAME", "second redis-rl-envoy"),
            ("PEER_PID", &pid),
            ("PEER_REDIS", &peer_redis_addr),
        ],
        &peer,
    );

    // The peer's row: decisions/s, p50, its CPU and its Redis's, all figures.
    let r = row(&results, "## Against peers", "second redis-rl-envoy");
    assert_eq!(r.get(1).copied(), Some("4"), "{r:?}");
    for cell in r.get(3..8).expect("seven columns") {
        assert!(number(cell) > 0.0, "{r:?}");
    }
    // Its calls reached it: the round's decisions counted on the peer's own Prometheus page,
    // at least as many as the row's decisions/s over its 0.2 s rounds would make.
    let hits = peer
        .metric(r#"ratelimit_service_rate_limit_total_hits{domain="edge",key1="user",key2=""}"#);
    assert!(
        hits as f64 >= number(r[3]) * 0.2,
        "{hits} hits on the peer for {r:?}"
    );
    // limitador is skipped with the reason.
    assert!(
        results.contains("limitador-server | skipped: not in this test"),
        "{results}"
    );

    // Redis bytes per limited user, for the service the bench started and for the peer.
    for name in ["redis-rl-envoy", "second redis-rl-envoy"] {
        let m = row(&results, "## Redis bytes per limited user", name);
        assert_eq!(m.get(2).copied(), Some("300"), "{m:?}");
        let per_user = number(m.get(4).expect("bytes per user"));
        assert!(
            (20.0..2000.0).contains(&per_user),
            "{name}: {per_user} bytes per user"
        );
    }
    // The peer's Redis holds its users' counters, not the bench's Redis.
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{}/", peer_redis.port))
        .expect("client")
        .get_connection()
        .expect("connection");
    let keys: i64 = redis::cmd("DBSIZE").query(&mut c).expect("DBSIZE");
    assert!(keys >= 300, "the peer's Redis holds {keys} keys");

    // Again at once, given only by address: the probe passes (its user is this run's), and
    // what cannot be measured says n/a, with the reason.
    let results = run_bench(tmp.path(), &[("PEER_GRPC", &grpc)], &peer);
    let name = format!("the service at {grpc}");
    let r = row(&results, "## Against peers", &name);
    assert!(number(r[3]) > 0.0 && number(r[4]) > 0.0, "{r:?}");
    assert_eq!((r[6], r[7]), ("n/a", "n/a"), "{r:?}");
    assert!(
        results.contains(&format!("{name}'s service CPU is n/a: PEER_PID")),
        "{results}"
    );
    assert!(
        results.contains(&format!(
            "{name}'s Redis CPU and Redis bytes per limited user are n/a: PEER_REDIS"
        )),
        "{results}"
    );
    let m = row(&results, "## Redis bytes per limited user", &name);
    assert!(m[4].starts_with("n/a"), "{m:?}");
}
