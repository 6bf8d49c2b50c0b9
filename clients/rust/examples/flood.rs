//! The Rust side of `make bench-clients`: floods one denied key through the blocking limiter
//! and prints each call's latency in µs as a JSON array, like clients/node/bench/flood.mjs.
//!
//!     cargo run --release -p redis-rl-client --example flood -- PORT KEY CALLS DENY_CACHE(0|1)
//!
//! One token at 0.001/s is taken, the next call is denied by Redis (retry_after about
//! 1000 s), then CALLS more calls are timed. Nothing is asserted but that none is allowed.

use std::time::{Duration, Instant};

use redis_rl_client::{Limit, Limiter, OnError, Options};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [port, key, calls, deny_cache] = args.as_slice() else {
        return Err("usage: flood PORT KEY CALLS DENY_CACHE(0|1)".into());
    };
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let options = Options::new(OnError::Closed)
        .deny_cache(deny_cache == "1")
        .timeout(Duration::from_secs(1));
    let limiter = Limiter::new(client, options);
    let limit = Limit::new(0.001, 1.0)?;
    limiter.acquire(key, &limit, 1.0)?;
    limiter.acquire(key, &limit, 1.0)?;
    let calls: usize = calls.parse()?;
    let mut times_us = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        let d = limiter.acquire(key, &limit, 1.0)?;
        times_us.push(started.elapsed().as_secs_f64() * 1e6);
        if d.allowed {
            return Err("bench: a flooded call was allowed".into());
        }
    }
    let text: Vec<String> = times_us.iter().map(|t| format!("{t:.3}")).collect();
    println!("[{}]", text.join(","));
    Ok(())
}
