//! Real Redis Clusters. With the module on every node (three masters, three replicas: the
//! repository's harness, rl-testkit's cluster), the blocking limiter on a
//! `ClusterClient` and the async one on a `cluster_async::ClusterConnection` route each key
//! to its slot's master, and `acquire_all` works across buckets that share a hash tag. On a
//! cluster of plain servers (three masters, no module: a managed service), the Lua path does
//! the same, each master caching the script from the EVAL its first NOSCRIPT brought, and the
//! Functions library loaded on every master by one `load_functions` call is used instead of
//! it. A single-node client on a cluster is a misconfiguration, told by `check()`.

#![cfg(test)]

use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis_rl_client::{
    key_slot, load_functions, load_functions_async, shard_of, AsyncLimiter, Error, Limit, Limiter,
    OnError, Options, Path, SlotItem, SlotOutcome, Source, FUNCTIONS_VERSION,
};
use rl_testkit::cluster::{cli_binary, start_cluster_node, Cluster};
use rl_testkit::Server;

fn client(cluster: &Cluster) -> ClusterClient {
    cluster_client(cluster.nodes.iter().map(|n| n.port))
}

fn cluster_client(ports: impl Iterator<Item = u16>) -> ClusterClient {
    let urls: Vec<String> = ports
        .map(|port| format!("redis://127.0.0.1:{port}/"))
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

/// Keys of two slots, the lower first: taken slot by slot, and the lower slot's take refunded
/// when the higher refuses, so a refused call costs nothing.
fn across_slots(limiter: &Limiter<ClusterClient>, source: Source, cluster: &ClusterClient) {
    let (low, high) = ("{b}:across", "{a}:across");
    assert!(key_slot(low.as_bytes()) < key_slot(high.as_bytes()));
    let five = Limit::new(0.001, 5.0).unwrap();
    let one = Limit::new(0.001, 1.0).unwrap();
    let items = [SlotItem::new(low, five, 1.0), SlotItem::new(high, one, 1.0)];
    let d = limiter.acquire_across_slots(&items).unwrap();
    assert!(d.allowed, "{d:?}");
    // The first call learnt the cluster from CROSSSLOT, then asked each slot.
    assert_eq!(d.sources, [source, source]);
    let d = limiter.acquire_across_slots(&items).unwrap();
    assert!(!d.allowed);
    assert!(
        matches!(
            d.outcomes[..],
            [
                SlotOutcome::NotTaken(Some(_)),
                SlotOutcome::Refused(Some(_))
            ]
        ),
        "{d:?}"
    );
    assert_eq!(limiter.peek(low, &five, 1.0).unwrap().remaining, 4);
    // A shadow item refusing in the higher slot keeps the lower slot's take.
    let items = [
        SlotItem::new(low, five, 1.0),
        SlotItem::new(high, one, 1.0).shadow(),
    ];
    let d = limiter.acquire_across_slots(&items).unwrap();
    assert!(d.allowed, "{d:?}");
    assert_eq!(limiter.peek(low, &five, 1.0).unwrap().remaining, 3);
    // A later slot's error (a key of another type) gives the lower slot's take back too.
    let wrong = "{a}:wrongtype";
    let _: () = redis::cmd("SET")
        .arg(wrong)
        .arg("x")
        .query(&mut cluster.get_connection().unwrap())
        .unwrap();
    let items = [
        SlotItem::new(low, five, 1.0),
        SlotItem::new(wrong, one, 1.0),
    ];
    assert!(matches!(
        limiter.acquire_across_slots(&items),
        Err(Error::Redis(_))
    ));
    assert_eq!(limiter.peek(low, &five, 1.0).unwrap().remaining, 3);
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
    across_slots(&limiter, Source::Redis, &client(&cluster));

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
        // The async limiter takes across slots too: the higher slot is empty, so the lower
        // slot's take is refunded.
        let five = Limit::new(0.001, 5.0).unwrap();
        let across = [
            SlotItem::new("{b}:across", five, 1.0),
            SlotItem::new("{a}:across", Limit::new(0.001, 1.0).unwrap(), 1.0),
        ];
        assert!(!limiter.acquire_across_slots(&across).await.unwrap().allowed);
        let low = limiter.peek("{b}:across", &five, 1.0).await.unwrap();
        assert_eq!(low.remaining, 3);
    });
}

/// The reply of `args` on the node at `port`, if it answers.
fn ask(port: u16, args: &[&str]) -> Option<String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut con = client
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()?;
    let mut cmd = redis::cmd(args.first()?);
    for arg in args.iter().skip(1) {
        cmd.arg(*arg);
    }
    cmd.query::<String>(&mut con).ok()
}

/// Three plain masters joined by `redis-cli --cluster create`, every slot served.
fn plain_cluster() -> Vec<Server> {
    let deadline = Instant::now() + Duration::from_secs(30);
    // Each node answers PING when started (the harness waits for it).
    let nodes: Vec<Server> = (0..3).map(|_| start_cluster_node(false)).collect();
    let output = Command::new(cli_binary())
        .args(["--cluster", "create"])
        .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    for node in &nodes {
        while !ask(node.port, &["CLUSTER", "INFO"])
            .is_some_and(|info| info.contains("cluster_state:ok"))
        {
            assert!(
                Instant::now() < deadline,
                "cluster never settled on {}",
                node.port
            );
            sleep(Duration::from_millis(50));
        }
    }
    nodes
}

#[test]
fn the_lua_path_works_on_a_cluster_without_the_module() {
    let nodes = plain_cluster();
    let ports = || nodes.iter().map(|n| n.port);
    let limit = Limit::new(0.001, 2.0).unwrap();
    let limiter = Limiter::new(
        cluster_client(ports()),
        Options::new(OnError::Closed).timeout(Duration::from_secs(2)),
    );
    let keys = keys();
    for key in &keys {
        for remaining in [1, 0] {
            let d = limiter.acquire(key, &limit, 1.0).unwrap();
            assert_eq!(
                (d.allowed, d.remaining, d.source),
                (true, remaining, Source::Lua),
                "{key}"
            );
        }
        assert!(!limiter.acquire(key, &limit, 1.0).unwrap().allowed, "{key}");
    }
    // The keys live on every master; each got the script by EVAL once its EVALSHA met
    // NOSCRIPT, never by SCRIPT LOAD.
    for port in ports() {
        let stats = ask(port, &["INFO", "commandstats"]).unwrap_or_default();
        let calls = |name: &str| -> u64 {
            stats
                .lines()
                .find_map(|line| line.strip_prefix(&format!("cmdstat_{name}:calls=")))
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        assert_eq!(calls("script|load"), 0, "node {port}: {stats}");
        assert!(calls("eval") >= 1, "node {port}: {stats}");
        assert!(
            calls("evalsha") > 0,
            "node {port} decided some of the buckets"
        );
    }
    let items = [
        ("{u:42}:s", Limit::new(0.001, 1.0).unwrap(), 1.0),
        ("{u:42}:h", Limit::new(0.001, 5.0).unwrap(), 1.0),
    ];
    assert!(limiter.acquire_all(&items).unwrap().allowed);
    let refused = limiter.acquire_all(&items).unwrap();
    assert_eq!(
        (refused.allowed, refused.refused_index, refused.source),
        (false, Some(0), Source::Lua)
    );
    across_slots(&limiter, Source::Lua, &cluster_client(ports()));

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let connection = cluster_client(ports())
            .get_async_connection()
            .await
            .expect("async cluster");
        let limiter = AsyncLimiter::new(
            connection,
            Options::new(OnError::Closed).timeout(Duration::from_secs(2)),
        );
        for key in &keys {
            let d = limiter.acquire(key, &limit, 1.0).await.unwrap();
            assert_eq!((d.allowed, d.source), (false, Source::Lua), "{key}");
            assert_eq!(limiter.refund(key, &limit, 1.0).await.unwrap().remaining, 1);
        }
    });
}

#[test]
fn a_tables_fallback_keys_stay_in_their_shards_slot_on_a_plain_cluster() {
    let nodes = plain_cluster();
    let limit = Limit::new(0.001, 1.0).unwrap();
    let limiter = Limiter::new(
        cluster_client(nodes.iter().map(|n| n.port)),
        Options::new(OnError::Closed).timeout(Duration::from_secs(2)),
    );
    let table = limiter.table("ip", 16).unwrap();
    let fields: Vec<String> = (0..32).map(|n| format!("203.0.113.{n}")).collect();
    for field in &fields {
        let d = table.acquire(field, &limit, 1.0).unwrap();
        assert_eq!((d.allowed, d.source), (true, Source::Lua), "{field}");
        assert!(
            !table.acquire(field, &limit, 1.0).unwrap().allowed,
            "{field}"
        );
        // The fallback key shares its table key's hash tag, so its slot.
        let slot = |key: String| -> i64 {
            let client = redis::Client::open(format!("redis://127.0.0.1:{}/", nodes[0].port));
            let mut con = client.unwrap().get_connection().unwrap();
            redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key)
                .query(&mut con)
                .unwrap()
        };
        let fallback = table.fallback_key(field);
        assert!(fallback.starts_with(&table.key(shard_of(field, 16))));
        assert_eq!(slot(fallback), slot(table.key(shard_of(field, 16))));
    }
    // DEL of one shard's fallback keys is one slot's command: no CROSSSLOT.
    let all: Vec<&str> = fields.iter().map(String::as_str).collect();
    assert_eq!(table.delete(&all).unwrap(), 32);
    assert!(table.acquire(&fields[0], &limit, 1.0).unwrap().allowed);
    // Counting needs SCAN on a shard's node, which a cluster connection cannot aim: refused.
    assert!(matches!(table.len(), Err(Error::Invalid(_))));
}

#[test]
fn the_functions_library_is_loaded_on_every_master_and_used() {
    let nodes = plain_cluster();
    let ports = || nodes.iter().map(|n| n.port);
    let mut admin = cluster_client(ports()).get_connection().unwrap();
    assert_eq!(load_functions(&mut admin).unwrap(), FUNCTIONS_VERSION);
    for port in ports() {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
        let version: i64 = redis::cmd("FCALL_RO")
            .arg("rl_version")
            .arg(0)
            .query(&mut client.get_connection().unwrap())
            .unwrap();
        assert_eq!(version, FUNCTIONS_VERSION, "node {port}");
    }
    let limit = Limit::new(0.001, 2.0).unwrap();
    let limiter = Limiter::new(
        cluster_client(ports()),
        Options::new(OnError::Closed).timeout(Duration::from_secs(2)),
    );
    assert_eq!(limiter.check().unwrap(), Some(Path::Functions));
    for key in &keys() {
        for remaining in [1, 0] {
            let d = limiter.acquire(key, &limit, 1.0).unwrap();
            assert_eq!(
                (d.allowed, d.remaining, d.source),
                (true, remaining, Source::Functions),
                "{key}"
            );
        }
    }
    across_slots(&limiter, Source::Functions, &cluster_client(ports()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut connection = cluster_client(ports())
            .get_async_connection()
            .await
            .expect("async cluster");
        assert_eq!(
            load_functions_async(&mut connection).await.unwrap(),
            FUNCTIONS_VERSION
        );
        let limiter = AsyncLimiter::new(
            connection,
            Options::new(OnError::Closed).timeout(Duration::from_secs(2)),
        );
        assert_eq!(limiter.check().await.unwrap(), Some(Path::Functions));
        for key in &keys() {
            let d = limiter.acquire(key, &limit, 1.0).await.unwrap();
            assert_eq!((d.allowed, d.source), (false, Source::Functions), "{key}");
        }
        // Known as a cluster client: SCAN through it could not count every node's keys.
        assert!(limiter.table("ip", 4).unwrap().len().await.is_err());
    });
}

#[test]
fn a_single_node_client_on_a_cluster_is_a_misconfiguration() {
    let nodes = plain_cluster();
    let limiter = Limiter::new(
        nodes[0].client(),
        Options::new(OnError::Open).timeout(Duration::from_secs(2)),
    );
    match limiter.check() {
        Err(Error::Misconfigured(cause)) => {
            assert!(
                cause.contains("single-node client on a Redis Cluster"),
                "{cause}"
            )
        }
        other => panic!("expected a misconfiguration, got {other:?}"),
    }
    // At run time: keys served by another node are decided by the policy, counted apart.
    let limit = Limit::new(0.001, 2.0).unwrap();
    let mut moved = 0;
    for key in &keys() {
        let d = limiter.acquire(key, &limit, 1.0).unwrap();
        if d.source == Source::Open {
            moved += 1;
        }
    }
    let counters = limiter.counters();
    assert!(moved > 0);
    assert_eq!(
        (counters.misconfigured, counters.open, counters.outages),
        (moved, 0, 0)
    );
}
