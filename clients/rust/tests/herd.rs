//! Many callers at once while the server forgets the script or changes roles: 200 concurrent
//! callers through a SCRIPT FLUSH every 200 ms, and through a failover (the replica they use
//! promoted), on the script and Functions paths. No call returns an error: a NOSCRIPT costs
//! that call one EVAL, and a replica's READONLY is decided by the policy until it is primary.

#![cfg(test)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Server;
use redis_rl_client::{load_functions, AsyncLimiter, Limit, OnError, Options, Source};

const CALLERS: usize = 200;

/// A limit no caller can exhaust: every decision is an allow, so only its source matters.
fn roomy() -> Limit {
    Limit::new(1_000_000.0, 1_000_000.0).unwrap()
}

/// Runs `CALLERS` tasks calling `acquire` until `stop`; returns each decision's source.
async fn callers(
    limiter: Arc<AsyncLimiter<redis::aio::ConnectionManager>>,
    stop: Arc<AtomicBool>,
) -> Vec<Source> {
    let mut tasks = Vec::new();
    for i in 0..CALLERS {
        let limiter = limiter.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut sources = Vec::new();
            let key = format!("herd:{i}");
            while !stop.load(Ordering::Relaxed) {
                match limiter.acquire(&key, &roomy(), 1.0).await {
                    Ok(d) => sources.push(d.source),
                    Err(e) => panic!("caller {i}: {e}"),
                }
            }
            sources
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all
}

fn options() -> Options {
    // A deadline long enough that 200 callers on a loaded machine never miss it.
    Options::new(OnError::Closed).timeout(Duration::from_secs(10))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_callers_see_no_error_through_repeated_script_flushes() {
    const FLUSHES: u64 = 10;
    let server = Server::plain();
    let limiter = Arc::new(AsyncLimiter::connect(server.client(), options()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let running = tokio::spawn(callers(limiter.clone(), stop.clone()));
    let mut admin = server.conn();
    for _ in 0..FLUSHES {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _: () = tokio::task::block_in_place(|| {
            redis::cmd("SCRIPT").arg("FLUSH").query(&mut admin).unwrap()
        });
    }
    stop.store(true, Ordering::Relaxed);
    let sources = running.await.unwrap();
    assert!(sources.len() >= CALLERS, "{} calls", sources.len());
    assert!(sources.iter().all(|s| *s == Source::Lua));
    let counters = limiter.counters();
    assert_eq!(
        (counters.lua, counters.without_redis(), counters.outages),
        (sources.len() as u64, 0, 0)
    );
    // At least one EVAL after the first call and after each flush the callers ran past, at
    // most one per caller for each; never SCRIPT LOAD.
    let evals = server.calls("eval");
    assert!(evals >= FLUSHES, "{evals}");
    assert!(evals <= CALLERS as u64 * (FLUSHES + 1), "{evals}");
    assert_eq!(server.calls("script|load"), 0);
}

/// A plain replica of `primary`, synced.
fn replica_of(primary: &Server) -> Server {
    let mut replica = Server::plain();
    let port = primary.port.to_string();
    replica.restart_with(&["--replicaof", "127.0.0.1", &port]);
    wait_for(&replica, "master_link_status:up");
    replica
}

/// Waits until `INFO replication` of `server` holds `text`.
fn wait_for(server: &Server, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut server.conn())
            .unwrap();
        if info.contains(text) {
            return;
        }
        assert!(Instant::now() < deadline, "never {text}:\n{info}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Callers on the replica: the policy decides while it is read-only, the path once it is
/// promoted (the script goes as EVAL there, not cached yet; the library was replicated).
async fn through_a_failover(functions: bool) {
    let primary = Server::plain();
    if functions {
        load_functions(&mut primary.conn()).unwrap();
    }
    let replica = replica_of(&primary);
    let limiter = Arc::new(
        AsyncLimiter::connect(
            replica.client(),
            options().probe_interval(Duration::from_millis(20)),
        )
        .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let running = tokio::spawn(callers(limiter.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| {
        let _: () = redis::cmd("FAILOVER").query(&mut primary.conn()).unwrap();
        wait_for(&replica, "role:master");
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let sources = running.await.unwrap();
    let answered = if functions {
        Source::Functions
    } else {
        Source::Lua
    };
    assert!(sources
        .iter()
        .all(|s| *s == answered || *s == Source::Closed));
    // After the promotion the path answers again.
    let d = limiter.acquire("after", &roomy(), 1.0).await.unwrap();
    assert_eq!(d.source, answered);
    let counters = limiter.counters();
    assert!(
        counters.closed > 0,
        "the replica's READONLY went to the policy"
    );
    assert_eq!(counters.misconfigured, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_callers_see_no_error_through_a_failover_on_the_script_path() {
    through_a_failover(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_callers_see_no_error_through_a_failover_on_the_functions_path() {
    through_a_failover(true).await;
}
