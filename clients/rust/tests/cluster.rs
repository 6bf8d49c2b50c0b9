//! A real Redis Cluster (three masters, three replicas, the module on every node; the
//! repository's harness in tests/common/cluster.rs): the blocking limiter on a
//! `ClusterClient` and the async one on a `cluster_async::ClusterConnection` route each key
//! to its slot's master, and `acquire_all` works across buckets that share a hash tag.

#[path = "../../../tests/common/mod.rs"]
mod root;

use std::time::Duration;

use redis::cluster::ClusterClient;
use redis_rl_client::{AsyncLimiter, Error, Limit, Limiter, OnError, Options, Source};
use root::cluster::Cluster;

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

/// Keys spread over the slots, so all three masters hold some.
fn keys() -> Vec<String> {
    (0..12).map(|i| format!("user:{i}")).collect()
}

#[test]
fn limiters_work_on_a_cluster() {
    let cluster = Cluster::start();
    let limit = Limit::new(0.001, 2.0).unwrap();
    let limiter = Limiter::new(
        client(&cluster),
        Options::new(OnError::Closed).timeout(Duration::from_secs(2)),
    );
    let keys = keys();
    for key in &keys {
        for remaining in [1, 0] {
            let d = limiter.acquire(key, &limit, 1.0).unwrap();
            assert_eq!(
                (d.allowed, d.remaining, d.source),
                (true, remaining, Source::Redis),
                "{key}"
            );
        }
        assert!(!limiter.acquire(key, &limit, 1.0).unwrap().allowed, "{key}");
    }
    // Each key's state lives on the master of its slot.
    let topology = cluster.topology();
    let mut masters = std::collections::BTreeSet::new();
    for key in &keys {
        let port = topology.owner(cluster.keyslot(key.as_bytes()));
        masters.insert(port);
        let exists: i64 = redis::cmd("EXISTS")
            .arg(key)
            .query(&mut cluster.conn(port))
            .unwrap();
        assert_eq!(exists, 1, "{key} on its master {port}");
    }
    assert_eq!(masters.len(), 3, "the keys cover every master");

    let items = [
        ("{u:42}:s", Limit::new(0.001, 1.0).unwrap(), 1.0),
        ("{u:42}:h", Limit::new(0.001, 5.0).unwrap(), 1.0),
    ];
    assert!(limiter.acquire_all(&items).unwrap().allowed);
    let refused = limiter.acquire_all(&items).unwrap();
    assert_eq!((refused.allowed, refused.refused_index), (false, Some(0)));
    // Without a shared hash tag the keys are in different slots: an error, not an outage.
    let spread = [("a", limit, 1.0), ("b", limit, 1.0)];
    assert!(matches!(limiter.acquire_all(&spread), Err(Error::Redis(_))));
    assert_eq!(limiter.counters().outages, 0);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let connection = client(&cluster)
            .get_async_connection()
            .await
            .expect("async cluster");
        let limiter = AsyncLimiter::new(
            connection,
            Options::new(OnError::Closed).timeout(Duration::from_secs(2)),
        );
        for key in &keys {
            // The blocking limiter emptied these buckets.
            let d = limiter.acquire(key, &limit, 1.0).await.unwrap();
            assert_eq!((d.allowed, d.source), (false, Source::Redis), "{key}");
            assert_eq!(limiter.refund(key, &limit, 1.0).await.unwrap().remaining, 1);
        }
        let refused = limiter.acquire_all(&items).await.unwrap();
        assert_eq!((refused.allowed, refused.refused_index), (false, Some(0)));
    });
}
