//! A real Redis Cluster per test: six servers from the [`Server`] harness (module loaded, temp
//! dirs, killed on drop) joined by `redis-cli --cluster create --cluster-replicas 1` into three
//! masters with one replica each.
//!
//! Ports: a node's cluster bus listens on its port + 10000, so a port is only taken when both
//! are free. They are drawn from 10000-22767, so neither the port nor its bus port falls in
//! Linux's ephemeral range (32768 and up) where `free_port` and outgoing connections live; the
//! ports this process has handed out are never handed out again, so parallel tests do not
//! collide.
//!
//! The topology is read from `CLUSTER NODES` and key slots from `CLUSTER KEYSLOT`: nothing
//! here computes CRC16 itself.

use std::collections::hash_map::RandomState;
use std::collections::BTreeSet;
use std::hash::BuildHasher;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Condvar, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::Connection;

use crate::{server_binary, Server};

/// Nodes per cluster: three masters, each with one replica.
pub const NODES: usize = 6;
/// How long creating the cluster, a failover or a slot move may take to settle.
/// A deadline, not a wait: generous, because a loaded machine can be slow to gossip.
pub const SETTLE_DEADLINE: Duration = Duration::from_secs(60);
/// Every slot of a cluster.
pub const SLOTS: u16 = 16384;

/// The cluster settings each node starts with (on top of the harness's own: module, `--save ""`,
/// temp dir, log file). No test kills a node and waits for the cluster to notice (the failover
/// is a coordinated `CLUSTER FAILOVER`), so the node timeout only has to be long enough that a
/// node starved of CPU on a loaded machine is never marked failing: with 2 s, a stall of 2 s
/// flagged it, turned the cluster's state to `fail` and failed the test. A full sync to a new
/// replica starts at once instead of after Redis 7.0's default 5 s delay.
const NODE_ARGS: &[&str] = &[
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "20000",
    "--appendonly",
    "no",
    "--repl-diskless-sync-delay",
    "0",
];

/// Ports this process has handed out.
static TAKEN_PORTS: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
/// The range ports are drawn from; each bus port (port + 10000) stays below 32768.
const PORT_LOW: u16 = 10000;
const PORT_HIGH: u16 = 22767;
const BUS_OFFSET: u16 = 10000;

/// A port `p` where `p` and `p + 10000` can both be bound now, never handed out before in this
/// process.
pub fn free_cluster_port() -> u16 {
    let random = RandomState::new();
    let span = u64::from(PORT_HIGH - PORT_LOW + 1);
    let bindable = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
    let mut taken = TAKEN_PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let port = (0..10_000u64)
        .map(|attempt| PORT_LOW + (random.hash_one(attempt) % span) as u16)
        .find(|&p| !taken.contains(&p) && bindable(p) && bindable(p + BUS_OFFSET))
        .unwrap_or_else(|| panic!("no free port pair in {PORT_LOW}-{PORT_HIGH}"));
    taken.insert(port);
    port
}

/// The client binary that creates the cluster: `REDIS_CLI`; else, for a Valkey server,
/// `valkey-cli` beside it or on PATH if there is one; else `redis-cli` (which drives Valkey too).
pub fn cli_binary() -> String {
    if let Ok(cli) = std::env::var("REDIS_CLI") {
        return cli;
    }
    let server = server_binary();
    let server_path = Path::new(&server);
    let is_valkey = server_path
        .file_name()
        .is_some_and(|name| name.to_string_lossy().contains("valkey"));
    if is_valkey {
        if let Some(beside) = server_path.parent().map(|dir| dir.join("valkey-cli")) {
            if beside.is_file() {
                return beside.display().to_string();
            }
        }
        let on_path = Command::new("valkey-cli")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if on_path {
            return "valkey-cli".into();
        }
    }
    "redis-cli".into()
}

/// One node as one `CLUSTER NODES` line describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node ID.
    pub id: String,
    /// The client port.
    pub port: u16,
    /// Whether it is a master (else a replica).
    pub master: bool,
    /// For a replica, its master's ID.
    pub master_id: Option<String>,
    /// The slot ranges it serves, inclusive (masters only).
    pub slots: Vec<(u16, u16)>,
    /// Whether the line flags the node as failing, unreachable or still joining.
    pub unhealthy: bool,
}

/// The cluster as one node sees it, nodes sorted by port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub nodes: Vec<NodeInfo>,
}

impl Topology {
    /// Parses `CLUSTER NODES` output.
    pub fn parse(text: &str) -> Topology {
        let mut nodes: Vec<NodeInfo> = text
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                assert!(fields.len() >= 8, "CLUSTER NODES line: {line:?}");
                // ip:port@cport[,hostname]
                let address = fields[1].split('@').next().unwrap_or_default();
                let port = address
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or_else(|| panic!("no port in {line:?}"));
                let flags: Vec<&str> = fields[2].split(',').collect();
                let master = flags.contains(&"master");
                let unhealthy = flags
                    .iter()
                    .any(|f| matches!(*f, "fail" | "fail?" | "handshake" | "noaddr"))
                    || fields[7] != "connected";
                let slots = fields[8..]
                    .iter()
                    // "[slot->-id]" / "[slot-<-id]" mark a slot being migrated: not owned.
                    .filter(|s| !s.starts_with('['))
                    .map(|s| {
                        let parse = |n: &str| n.parse::<u16>().expect("slot number");
                        match s.split_once('-') {
                            Some((a, b)) => (parse(a), parse(b)),
                            None => (parse(s), parse(s)),
                        }
                    })
                    .collect();
                NodeInfo {
                    id: fields[0].to_string(),
                    port,
                    master,
                    master_id: (fields[3] != "-").then(|| fields[3].to_string()),
                    slots,
                    unhealthy,
                }
            })
            .collect();
        nodes.sort_by_key(|n| n.port);
        Topology { nodes }
    }

    /// The master nodes, by port.
    pub fn masters(&self) -> Vec<&NodeInfo> {
        self.nodes.iter().filter(|n| n.master).collect()
    }

    /// The node on `port`.
    pub fn node(&self, port: u16) -> &NodeInfo {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port} in {self:#?}"))
    }

    /// The port of the master serving `slot`.
    pub fn owner(&self, slot: u16) -> u16 {
        self.masters()
            .into_iter()
            .find(|m| m.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .unwrap_or_else(|| panic!("nobody serves slot {slot} in {self:#?}"))
            .port
    }

    /// The port of the (one) replica of the master on `master_port`.
    pub fn replica_of(&self, master_port: u16) -> u16 {
        let id = &self.node(master_port).id;
        let replicas: Vec<u16> = self
            .nodes
            .iter()
            .filter(|n| !n.master && n.master_id.as_ref() == Some(id))
            .map(|n| n.port)
            .collect();
        assert_eq!(
            replicas.len(),
            1,
            "master {master_port} has replicas {replicas:?}"
        );
        replicas[0]
    }

    /// Why this is not yet a healthy three-shard cluster with one replica per master and
    /// every slot served, or `None` if it is.
    fn problem(&self) -> Option<String> {
        if self.nodes.len() != NODES {
            return Some(format!("{} nodes known", self.nodes.len()));
        }
        if let Some(n) = self.nodes.iter().find(|n| n.unhealthy) {
            return Some(format!("node {} is not healthy", n.port));
        }
        let masters = self.masters();
        if masters.len() != NODES / 2 {
            return Some(format!("{} masters", masters.len()));
        }
        let served: u32 = masters
            .iter()
            .flat_map(|m| &m.slots)
            .map(|&(a, b)| u32::from(b - a) + 1)
            .sum();
        if served != u32::from(SLOTS) {
            return Some(format!("{served} slots served"));
        }
        for m in &masters {
            let replicas = self
                .nodes
                .iter()
                .filter(|n| !n.master && n.master_id.as_ref() == Some(&m.id))
                .count();
            if replicas != 1 {
                return Some(format!("master {} has {replicas} replicas", m.port));
            }
        }
        None
    }
}

/// At most this many clusters run at once in one test binary: cargo runs as many tests at
/// once as the machine has CPUs, and five clusters of six nodes on a small machine starve
/// each other. Others wait in [`Cluster::start`].
const MAX_RUNNING_CLUSTERS: usize = 2;
static RUNNING_CLUSTERS: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// A place among the [`MAX_RUNNING_CLUSTERS`], given back on drop.
struct Permit;

impl Permit {
    fn acquire() -> Permit {
        let (count, freed) = &RUNNING_CLUSTERS;
        let mut running = count.lock().unwrap_or_else(|e| e.into_inner());
        while *running >= MAX_RUNNING_CLUSTERS {
            running = freed.wait(running).unwrap_or_else(|e| e.into_inner());
        }
        *running += 1;
        Permit
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let (count, freed) = &RUNNING_CLUSTERS;
        let mut running = count.lock().unwrap_or_else(|e| e.into_inner());
        *running = running.saturating_sub(1);
        freed.notify_one();
    }
}

/// A running six-node cluster; every node is killed when it drops.
pub struct Cluster {
    /// The nodes in the order they were created (the first three started as masters).
    pub nodes: Vec<Server>,
    /// Declared after `nodes`, so it is given back once they are killed.
    _permit: Permit,
}

impl Cluster {
    /// Starts six nodes, creates the cluster with `redis-cli --cluster create`, and waits
    /// until it is settled (see [`Cluster::wait_settled`]).
    pub fn start() -> Cluster {
        let permit = Permit::acquire();
        let nodes: Vec<Server> = (0..NODES).map(|_| start_node()).collect();
        let cluster = Cluster {
            nodes,
            _permit: permit,
        };
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let cli = cli_binary();
        let output = Command::new(&cli)
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {cli}: {e}"));
        assert!(
            output.status.success(),
            "{cli} --cluster create failed ({}):\n{}{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            cluster.logs()
        );
        cluster.wait_settled();
        cluster
    }

    /// The node on `port`.
    pub fn node(&self, port: u16) -> &Server {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// A plain (non-cluster) connection to the node on `port`.
    pub fn conn(&self, port: u16) -> Connection {
        self.node(port).conn()
    }

    /// A cluster client connection that knows every node.
    pub fn client(&self) -> ClusterConnection {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}/", n.port))
            .collect();
        ClusterClient::builder(urls)
            .retries(20)
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(10))
            .build()
            .expect("cluster client")
            .get_connection()
            .expect("connect the cluster client")
    }

    /// The cluster as the node on `port` sees it.
    pub fn topology_from(&self, port: u16) -> Topology {
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut self.conn(port))
            .expect("CLUSTER NODES");
        Topology::parse(&text)
    }

    /// The settled topology (as the first node sees it).
    pub fn topology(&self) -> Topology {
        self.topology_from(self.nodes[0].port)
    }

    /// `CLUSTER KEYSLOT key`, asked of any node.
    pub fn keyslot(&self, key: &[u8]) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.conn(self.nodes[0].port))
            .expect("CLUSTER KEYSLOT")
    }

    /// `prefix` + a number, the first such key whose slot the master on `master_port` serves.
    pub fn key_served_by(&self, topology: &Topology, master_port: u16, prefix: &str) -> String {
        (0..10_000)
            .map(|n| format!("{prefix}{n}"))
            .find(|key| topology.owner(self.keyslot(key.as_bytes())) == master_port)
            .unwrap_or_else(|| panic!("no key {prefix}<n> is served by {master_port}"))
    }

    /// `CLUSTER MYID` of the node on `port`.
    pub fn node_id(&self, port: u16) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.conn(port))
            .expect("CLUSTER MYID")
    }

    /// Waits until the cluster is settled, and returns its topology. Settled means: every node
    /// says `cluster_state:ok`; every node sees the same three masters, each with one replica,
    /// serving all slots, and no node flagged as failing; every node's own role agrees; and
    /// every replica's link to its master is up with no sync in progress.
    pub fn wait_settled(&self) -> Topology {
        let deadline = Instant::now() + SETTLE_DEADLINE;
        let mut last_problem = String::new();
        while Instant::now() < deadline {
            match self.settled() {
                Ok(topology) => return topology,
                Err(problem) => last_problem = problem,
            }
            sleep(Duration::from_millis(50));
        }
        panic!(
            "the cluster did not settle within {SETTLE_DEADLINE:?}: {last_problem}\n{}",
            self.logs()
        );
    }

    fn settled(&self) -> Result<Topology, String> {
        let mut agreed: Option<Topology> = None;
        for node in &self.nodes {
            let port = node.port;
            let mut con = node
                .try_conn()
                .map_err(|e| format!("node {port}: connect: {e}"))?;
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut con)
                .map_err(|e| format!("node {port}: CLUSTER INFO: {e}"))?;
            if !info.contains("cluster_state:ok") {
                return Err(format!("node {port}: cluster_state is not ok"));
            }
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut con)
                .map_err(|e| format!("node {port}: CLUSTER NODES: {e}"))?;
            let topology = Topology::parse(&nodes);
            if let Some(problem) = topology.problem() {
                return Err(format!("node {port} sees: {problem}"));
            }
            match &agreed {
                None => agreed = Some(topology.clone()),
                Some(first) if *first != topology => {
                    return Err(format!("node {port} sees another topology"));
                }
                Some(_) => {}
            }
            let replication: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut con)
                .map_err(|e| format!("node {port}: INFO: {e}"))?;
            let is_master = topology.node(port).master;
            if replication.contains("role:master") != is_master {
                return Err(format!(
                    "node {port}: its role is not yet what the cluster says"
                ));
            }
            let synced = replication.contains("master_link_status:up")
                && replication.contains("master_sync_in_progress:0");
            if !is_master && !synced {
                return Err(format!("replica {port}: link not up or still syncing"));
            }
        }
        agreed.ok_or_else(|| "no nodes".to_string())
    }

    /// Every node's log, for failure messages.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- node {} log:\n{}", n.port, n.log()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Starts one cluster-enabled node with the module on a port pair of its own, retrying on
/// another pair if the server cannot bind (someone took a port between the check and the start).
fn start_node() -> Server {
    start_cluster_node(true)
}

/// Starts one cluster-enabled node, with the module or without it (a plain server, for a
/// cluster of the kind a managed service offers), not yet joined to any cluster.
pub fn start_cluster_node(module: bool) -> Server {
    let mut last_log = String::new();
    for _ in 0..5 {
        let mut server = Server::unstarted(NODE_ARGS, &[]);
        server.module = module;
        server.port = free_cluster_port();
        if server.spawn().is_ok() {
            return server;
        }
        last_log = server.log();
    }
    panic!("a cluster node did not start; last log:\n{last_log}");
}
