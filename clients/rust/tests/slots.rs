//! `acquire_across_slots` on one real server, with the module and without it (the Lua
//! path): keys of different slots are one all-or-nothing call there, never taken and refunded
//! one by one, and shadow items are reported without refusing. Its cluster behaviour (slot by
//! slot, refunds) is in `tests/cluster.rs`, on real clusters.

#![cfg(test)]

mod common;

use common::info::calls;
use common::{slow, Server};
use redis_rl_client::{
    key_slot, AsyncLimiter, Limit, Limiter, OnError, Options, SlotItem, SlotOutcome, Source,
};

/// Two keys in different slots ("b" in 3300, "a" in 15495).
const LOW: &str = "b";
const HIGH: &str = "a";

fn one() -> Limit {
    Limit::new(0.001, 1.0).unwrap()
}

fn checks(server: &Server, source: Source, multi_command: &str) {
    assert!(key_slot(LOW.as_bytes()) < key_slot(HIGH.as_bytes()));
    let limiter = Limiter::new(server.client(), Options::new(OnError::Closed));
    let items = [
        SlotItem::new(LOW, slow(), 1.0),
        SlotItem::new(HIGH, one(), 1.0),
    ];
    let d = limiter.acquire_across_slots(&items).unwrap();
    assert!(d.allowed);
    assert_eq!(d.sources, [source]);
    assert!(matches!(
        d.outcomes[..],
        [SlotOutcome::Taken(_), SlotOutcome::Taken(_)]
    ));
    // HIGH is empty now: the call is refused, and LOW was never taken, so nothing is refunded.
    let d = limiter.acquire_across_slots(&items).unwrap();
    assert!(!d.allowed);
    assert!(d.retry_after_ms > 0);
    match d.outcomes[..] {
        [SlotOutcome::NotTaken(Some(low)), SlotOutcome::Refused(Some(high))] => {
            assert_eq!((low.allowed, low.remaining), (true, 3));
            assert!(!high.allowed);
        }
        ref other => panic!("{other:?}"),
    }
    let mut con = server.conn();
    assert_eq!(calls(&mut con, multi_command), Some(2), "one call each");
    assert_eq!(
        calls(&mut con, "rl.refund"),
        None,
        "no refunds on one server"
    );
    assert_eq!(limiter.peek(LOW, &slow(), 1.0).unwrap().remaining, 4);

    // A shadow item that refuses is reported and left out: the rest is taken.
    let items = [
        SlotItem::new(LOW, slow(), 1.0),
        SlotItem::new(HIGH, one(), 1.0).shadow(),
    ];
    let d = limiter.acquire_across_slots(&items).unwrap();
    assert!(d.allowed, "{d:?}");
    assert!(matches!(
        d.outcomes[..],
        [SlotOutcome::Taken(_), SlotOutcome::ShadowRefused(Some(_))]
    ));
    assert_eq!(limiter.peek(LOW, &slow(), 1.0).unwrap().remaining, 3);

    // The async limiter is the same plan awaited.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let limiter =
            AsyncLimiter::connect(server.client(), Options::new(OnError::Closed)).unwrap();
        let items = [
            SlotItem::new(LOW, slow(), 1.0),
            SlotItem::new(HIGH, one(), 1.0),
        ];
        let d = limiter.acquire_across_slots(&items).await.unwrap();
        assert!(!d.allowed);
        assert_eq!(limiter.peek(LOW, &slow(), 1.0).await.unwrap().remaining, 3);
    });
}

#[test]
fn on_one_server_keys_of_several_slots_are_one_module_call() {
    let server = Server::start();
    checks(&server, Source::Redis, "rl.acquire.multi");
}

#[test]
fn on_one_server_without_the_module_they_are_one_script_call() {
    let server = Server::plain();
    checks(&server, Source::Lua, "evalsha");
}

#[test]
fn no_items_or_a_bad_cost_is_refused_before_redis() {
    // No server: the check comes before any connection.
    let limiter = Limiter::new(
        redis::Client::open("redis://127.0.0.1:1/").unwrap(),
        Options::new(OnError::Open),
    );
    assert!(limiter.acquire_across_slots(&[]).is_err());
    let bad = [SlotItem::new(LOW, slow(), -1.0)];
    assert!(limiter.acquire_across_slots(&bad).is_err());
    assert_eq!(limiter.counters().outages, 0);
}
