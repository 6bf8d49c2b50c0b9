//! Bucket tables on a real Redis Cluster with the module on every node (three masters, three
//! replicas: the repository's harness, rl-testkit's cluster): a table's shards `name:{i}`
//! land on the masters of their slots, every master holds some of a 16-shard table, and the
//! blocking and async limiters decide, count and delete across them.

#![cfg(test)]

use std::collections::BTreeSet;
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis_rl_client::{shard_of, AsyncLimiter, Limit, Limiter, OnError, Options, Source};
use rl_testkit::cluster::Cluster;

fn client(cluster: &Cluster) -> ClusterClient {
    let urls: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://127.0.0.1:{}/", n.port))
        .collect();
    ClusterClient::builder(urls)
        .connection_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .expect("cluster client")
}

#[test]
fn a_tables_shards_spread_over_the_masters() {
    let cluster = Cluster::start();
    let limit = Limit::new(0.001, 2.0).unwrap();
    let options = || Options::new(OnError::Closed).timeout(Duration::from_secs(2));
    let limiter = Limiter::new(client(&cluster), options());
    let table = limiter.table("ip", 16).unwrap();
    let fields: Vec<String> = (0..64).map(|n| format!("203.0.113.{n}")).collect();
    for field in &fields {
        for remaining in [1, 0] {
            let d = table.acquire(field, &limit, 1.0).unwrap();
            assert_eq!(
                (d.allowed, d.remaining, d.source),
                (true, remaining, Source::Redis)
            );
        }
        assert!(
            !table.acquire(field, &limit, 1.0).unwrap().allowed,
            "{field}"
        );
    }
    assert_eq!(table.len().unwrap(), 64);
    // Each shard lives on the master of its slot, and all three masters hold some.
    let topology = cluster.topology();
    let shards: BTreeSet<u32> = fields.iter().map(|f| shard_of(f, 16)).collect();
    let mut masters = BTreeSet::new();
    for shard in &shards {
        let key = table.key(*shard);
        let port = topology.owner(cluster.keyslot(key.as_bytes()));
        masters.insert(port);
        let live: i64 = redis::cmd("RL.HLEN")
            .arg(&key)
            .query(&mut cluster.conn(port))
            .unwrap();
        assert!(live > 0, "{key} on its master {port}");
    }
    assert_eq!(masters.len(), 3, "16 shards cover every master");
    let some: Vec<&str> = fields.iter().take(10).map(String::as_str).collect();
    assert_eq!(table.delete(&some).unwrap(), 10);
    assert_eq!(table.len().unwrap(), 54);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let connection = client(&cluster).get_async_connection().await.unwrap();
        let limiter = AsyncLimiter::new(connection, options());
        let table = limiter.table("ip", 16).unwrap();
        for (n, field) in fields.iter().enumerate() {
            // The blocking limiter emptied these buckets, and deleted the first ten.
            let d = table.acquire(field, &limit, 1.0).await.unwrap();
            assert_eq!((d.allowed, d.source), (n < 10, Source::Redis), "{field}");
        }
        assert_eq!(table.len().await.unwrap(), 64);
        let all: Vec<&str> = fields.iter().map(String::as_str).collect();
        assert_eq!(table.delete(&all).await.unwrap(), 64);
        assert_eq!(table.len().await.unwrap(), 0);
    });
}
