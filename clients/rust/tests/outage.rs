//! Outages against real servers: the server is killed mid-run, each policy decides (and is
//! counted, and logged once), the server restarts on the same port, and decisions go back to
//! Redis. Also a stopped (SIGSTOP) server that times out, and OOM / READONLY replies.

#![cfg(test)]

mod common;

use std::time::{Duration, Instant};

use common::{capture_logs, limiter, options, slow, take_logs, Server};
use redis_rl_client::{Decision, Limit, OnError, Source};

/// Up, then down for 6 calls, then up again. Returns the decisions while down.
fn outage(on_error: OnError, module: bool, instances: u32) -> Vec<Decision> {
    capture_logs();
    let mut server = Server::new(module);
    let limiter = limiter(
        &server,
        options(on_error)
            .instances(instances)
            .probe_interval(Duration::ZERO),
    );
    let up = if module { Source::Redis } else { Source::Lua };
    assert_eq!(limiter.acquire("warm", &slow(), 1.0).unwrap().source, up);
    take_logs();
    server.kill();
    let limit = Limit::new(0.001, 4.0).unwrap();
    let down: Vec<Decision> = (0..6)
        .map(|_| limiter.acquire("k", &limit, 1.0).unwrap())
        .collect();
    let logs = take_logs();
    assert_eq!(logs.len(), 1, "once per outage, not per call: {logs:?}");
    assert!(
        logs[0].contains(&format!("on_error={on_error:?}")),
        "{logs:?}"
    );
    let counters = limiter.counters();
    let by_policy = match on_error {
        OnError::Open => counters.open,
        OnError::Closed => counters.closed,
        OnError::Local => counters.local,
    };
    assert_eq!(by_policy, 6);
    assert_eq!(counters.without_redis(), 6);
    assert_eq!(counters.outages, 1);
    server.restart();
    let back = limiter.acquire("k", &limit, 1.0).unwrap();
    let logs = take_logs();
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert!(
        logs[0].contains("answers again") && logs[0].contains("6 decisions"),
        "{logs:?}"
    );
    assert_eq!(back.source, up);
    // The restarted server has no data: the bucket there is full.
    assert_eq!(back.remaining, 3);
    assert_eq!(limiter.counters().without_redis(), 6);
    down
}

#[test]
fn open_allows_while_redis_is_down() {
    let down = outage(OnError::Open, true, 1);
    assert!(down.iter().all(|d| d.allowed && d.source == Source::Open));
    // The policy knows the limit, not what is left: no "0 left, full now".
    assert_eq!(
        down[0].headers(),
        vec![("X-RateLimit-Limit", down[0].limit.capacity_text())]
    );
}

#[test]
fn closed_denies_while_redis_is_down() {
    let down = outage(OnError::Closed, true, 1);
    assert!(down
        .iter()
        .all(|d| !d.allowed && d.source == Source::Closed));
    assert_eq!(
        down[0].headers(),
        vec![
            ("X-RateLimit-Limit", down[0].limit.capacity_text()),
            ("Retry-After", "1".to_string()),
        ]
    );
}

#[test]
fn local_decides_with_a_share_of_the_limit() {
    // Capacity 4 over 2 instances: 2 tokens locally, then denials.
    let down = outage(OnError::Local, true, 2);
    let allowed: Vec<bool> = down.iter().map(|d| d.allowed).collect();
    assert_eq!(allowed, [true, true, false, false, false, false]);
    assert!(down.iter().all(|d| d.source == Source::Local));
    // 0.0005/s locally: 2000 s for the next token.
    assert!(
        down[2].retry_after_ms > 1_990_000 && down[2].retry_after_ms <= 2_000_000,
        "{:?}",
        down[2]
    );
}

#[test]
fn local_policy_on_the_lua_path() {
    let down = outage(OnError::Local, false, 4);
    let allowed: Vec<bool> = down.iter().map(|d| d.allowed).collect();
    assert_eq!(allowed, [true, false, false, false, false, false]);
}

#[test]
fn between_probes_the_policy_decides_without_trying_redis() {
    let mut server = Server::start();
    let limiter = limiter(
        &server,
        options(OnError::Open).probe_interval(Duration::from_secs(60)),
    );
    limiter.acquire("k", &slow(), 1.0).unwrap();
    server.kill();
    assert_eq!(
        limiter.acquire("k", &slow(), 1.0).unwrap().source,
        Source::Open
    );
    server.restart();
    // Redis is back, but the next probe is a minute away.
    assert_eq!(
        limiter.acquire("k", &slow(), 1.0).unwrap().source,
        Source::Open
    );
    assert_eq!(limiter.counters().open, 2);
}

#[test]
fn a_stopped_server_times_out_into_the_policy() {
    let server = Server::start();
    let limiter = redis_rl_client::Limiter::new(
        server.client(),
        options(OnError::Open)
            .timeout(Duration::from_millis(100))
            .probe_interval(Duration::ZERO),
    );
    assert_eq!(
        limiter.acquire("k", &slow(), 1.0).unwrap().source,
        Source::Redis
    );
    let pid = server.pid().expect("running").to_string();
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .args([name, &pid])
            .status()
            .unwrap();
        assert!(status.success());
    };
    signal("-STOP"); // accepts nothing, answers nothing
    let started = Instant::now();
    let d = limiter.acquire("k", &slow(), 1.0).unwrap();
    let took = started.elapsed();
    signal("-CONT");
    assert_eq!(d.source, Source::Open);
    // The deadline held (generously bounded on a loaded machine).
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while limiter.acquire("k", &slow(), 1.0).unwrap().source != Source::Redis {
        assert!(Instant::now() < deadline, "never back to Redis");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn oom_and_readonly_replies_apply_the_policy() {
    for module in [true, false] {
        let server = Server::new(module);
        let limiter = limiter(
            &server,
            options(OnError::Closed).probe_interval(Duration::ZERO),
        );
        let mut admin = server.conn();
        let config = |admin: &mut redis::Connection, name: &str, value: &str| {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg(name)
                .arg(value)
                .query(admin)
                .unwrap();
        };
        assert!(limiter.acquire("k", &slow(), 1.0).unwrap().allowed);
        config(&mut admin, "maxmemory-policy", "noeviction");
        config(&mut admin, "maxmemory", "1");
        assert_eq!(
            limiter.acquire("k2", &slow(), 1.0).unwrap().source,
            Source::Closed,
            "OOM, module={module}"
        );
        config(&mut admin, "maxmemory", "0");
        assert_ne!(
            limiter.acquire("k2", &slow(), 1.0).unwrap().source,
            Source::Closed
        );
        // A replica of a master that is not there: read-only.
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(1)
            .query(&mut admin)
            .unwrap();
        assert_eq!(
            limiter.acquire("k3", &slow(), 1.0).unwrap().source,
            Source::Closed,
            "READONLY, module={module}"
        );
        assert_eq!(limiter.counters().outages, 2);
    }
}
