//! `RedisCluster`: a private local Redis Cluster (primaries, optional replicas) on free
//! loopback ports, joined with `redis-cli --cluster create`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::pki::TlsFiles;
use super::process::spawn_tied;
use super::redis::{Reach, RedisServer, connect, free_port, info_field, replica_linked, wait_for};

/// A Redis Cluster on loopback, every node with its own data and cluster bus ports.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    primaries: usize,
    /// The CA file when the nodes speak TLS only, for redis-cli.
    ca: Option<std::path::PathBuf>,
    reach: Reach,
}

impl RedisCluster {
    /// Starts `primaries * (1 + replicas_per_primary)` nodes, joins them with
    /// `redis-cli --cluster create`, and returns once every node reports all 16384 slots served
    /// and the cluster ok, and every replica is linked to its primary. Redis Cluster needs at
    /// least 3 primaries.
    pub fn start(primaries: usize, replicas_per_primary: usize) -> RedisCluster {
        RedisCluster::start_with(primaries, replicas_per_primary, None)
    }

    /// [`start`] with TLS only: clients, replication and the cluster bus all use TLS, and
    /// the nodes announce their TLS ports.
    pub fn start_tls(primaries: usize, replicas_per_primary: usize, files: &TlsFiles) -> RedisCluster {
        RedisCluster::start_with(primaries, replicas_per_primary, Some(files))
    }

    fn start_with(primaries: usize, replicas_per_primary: usize, tls: Option<&TlsFiles>) -> RedisCluster {
        assert!(primaries >= 3, "redis-cli --cluster create needs at least 3 primaries, not {primaries}");
        let nodes: Vec<RedisServer> = (0..primaries * (1 + replicas_per_primary))
            .map(|_| {
                RedisServer::start_args(tls, |port| {
                    // Explicit: port + 10000, the default, is past 65535 for high ports.
                    let bus = loop {
                        let bus = free_port();
                        if bus != port {
                            break bus;
                        }
                    };
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "2000",
                    ]
                    .iter()
                    .map(|a| a.to_string())
                    .chain(["--cluster-port".to_string(), bus.to_string()])
                    .chain(tls.map(|_| ["--tls-cluster".to_string(), "yes".to_string()]).into_iter().flatten())
                    .collect()
                })
            })
            .collect();
        let cluster = RedisCluster { nodes, primaries, ca: tls.map(|f| f.ca.clone()), reach: Reach::of(tls) };
        cluster.create(replicas_per_primary);
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    fn create(&self, replicas_per_primary: usize) {
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut cmd = Command::new("redis-cli");
        if let Some(ca) = &self.ca {
            cmd.arg("--tls").arg("--cacert").arg(ca);
        }
        cmd.arg("--cluster").arg("create");
        cmd.args(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        cmd.args(["--cluster-replicas", &replicas_per_primary.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(log.reopen().unwrap())
            .stderr(log.reopen().unwrap());
        let mut child = spawn_tied(cmd).expect("redis-cli must be on PATH");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("redis-cli --cluster create timed out: {}", std::fs::read_to_string(log.path()).unwrap());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let output = std::fs::read_to_string(log.path()).unwrap();
        assert!(
            status.success() && output.contains("[OK] All 16384 slots covered"),
            "redis-cli --cluster create failed ({status}): {output}"
        );
    }

    /// `redis+cluster://` (`rediss+cluster://` with TLS) with every current primary's address.
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self.primary_ports().iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("{}+cluster://{}", self.reach.scheme(), addrs.join(","))
    }

    /// Every node's port, primaries and replicas.
    pub fn node_ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The ports of the primaries serving slots now, ascending.
    pub fn primary_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> =
            self.view().iter().filter(|n| n.is_primary() && !n.slots.is_empty()).map(|n| n.port).collect();
        ports.sort_unstable();
        ports
    }

    /// The ports of `primary_port`'s replicas now, ascending.
    pub fn replicas_of(&self, primary_port: u16) -> Vec<u16> {
        let view = self.view();
        let primary =
            view.iter().find(|n| n.port == primary_port).unwrap_or_else(|| panic!("no node on port {primary_port}"));
        let mut ports: Vec<u16> = view.iter().filter(|n| n.primary_id == primary.id).map(|n| n.port).collect();
        ports.sort_unstable();
        ports
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_for_key(&self, key: &str) -> u16 {
        self.query_any(::redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
    }

    /// The port of the primary serving `key`'s slot.
    pub fn node_for_key(&self, key: &str) -> u16 {
        let slot = self.slot_for_key(key);
        self.view()
            .iter()
            .find(|n| n.is_primary() && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .unwrap_or_else(|| panic!("no primary serves slot {slot} (key {key:?})"))
            .port
    }

    /// Keys held by the node on `port`.
    pub fn dbsize(&self, port: u16) -> u64 {
        ::redis::cmd("DBSIZE").query(&mut self.connection(port)).unwrap_or_else(|e| panic!("DBSIZE on {port}: {e}"))
    }

    /// Keys held by all primaries together.
    pub fn dbsize_total(&self) -> u64 {
        self.primary_ports().into_iter().map(|p| self.dbsize(p)).sum()
    }

    /// A plain connection to one node (no redirections followed).
    pub fn connection(&self, port: u16) -> ::redis::Connection {
        connect(&self.reach, port).unwrap_or_else(|e| panic!("cannot connect to cluster node {port}: {e}"))
    }

    /// The node id of the node on `port` (`CLUSTER MYID`).
    pub fn node_id(&self, port: u16) -> String {
        ::redis::cmd("CLUSTER").arg("MYID").query(&mut self.connection(port)).unwrap()
    }

    /// The lowest slot the primary on `port` serves.
    pub fn first_slot(&self, port: u16) -> u16 {
        let view = self.view();
        let node = view.iter().find(|n| n.port == port).unwrap_or_else(|| panic!("no node on port {port}"));
        node.slots.iter().map(|&(a, _)| a).min().unwrap_or_else(|| panic!("node {port} serves no slot"))
    }

    /// Starts moving `slot` from the primary on `from` to the one on `to`, as a resharding
    /// does: the target imports it, the source migrates it. Keys stay where they are until
    /// [`RedisCluster::finish_migration`]; meanwhile the source answers ASK for keys it does not
    /// hold, and TRYAGAIN for a command on several keys that are split between the two.
    pub fn begin_migration(&self, slot: u16, from: u16, to: u16) {
        self.begin_migrations(&[(slot, from, to)]);
    }

    /// [`RedisCluster::begin_migration`] for many slots, each `(slot, from, to)`.
    pub fn begin_migrations(&self, moves: &[(u16, u16, u16)]) {
        let ids: std::collections::HashMap<u16, String> =
            self.primary_ports().into_iter().map(|port| (port, self.node_id(port))).collect();
        for &(slot, from, to) in moves {
            let setslot = |on: u16, state: &str, node: u16| {
                let _: () = ::redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg(state)
                    .arg(&ids[&node])
                    .query(&mut self.connection(on))
                    .unwrap_or_else(|e| panic!("SETSLOT {slot} {state} on {on}: {e}"));
            };
            setslot(to, "IMPORTING", from);
            setslot(from, "MIGRATING", to);
        }
    }

    /// Moves every key of `slot` from `from` to `to` (`MIGRATE`) and gives the slot to `to` on
    /// every primary, ending a [`RedisCluster::begin_migration`].
    pub fn finish_migration(&self, slot: u16, from: u16, to: u16) {
        self.finish_migrations(&[(slot, from, to)]);
    }

    /// [`RedisCluster::finish_migration`] for many slots, each `(slot, from, to)`.
    pub fn finish_migrations(&self, moves: &[(u16, u16, u16)]) {
        let primaries = self.primary_ports();
        let ids: std::collections::HashMap<u16, String> =
            primaries.iter().map(|port| (*port, self.node_id(*port))).collect();
        for &(slot, from, to) in moves {
            let mut source = self.connection(from);
            loop {
                let keys: Vec<Vec<u8>> =
                    ::redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(100).query(&mut source).unwrap();
                if keys.is_empty() {
                    break;
                }
                let _: () = ::redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(to)
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("KEYS")
                    .arg(&keys)
                    .query(&mut source)
                    .unwrap_or_else(|e| panic!("MIGRATE from {from} to {to}: {e}"));
            }
            // The target first (it takes the slot and bumps its epoch), then the source, then
            // the rest, as redis-cli does: a source that let go first would send clients to a
            // target that does not own the slot yet.
            let mut order = vec![to, from];
            order.extend(primaries.iter().copied().filter(|p| *p != to && *p != from));
            for port in &order {
                let _: () = ::redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg("NODE")
                    .arg(&ids[&to])
                    .query(&mut self.connection(*port))
                    .unwrap_or_else(|e| panic!("SETSLOT {slot} NODE on {port}: {e}"));
            }
        }
    }

    /// `FLUSHALL` on one primary: its shard loses every key (its replicas follow).
    pub fn flush_node(&self, port: u16) {
        let _: () = ::redis::cmd("FLUSHALL")
            .query(&mut self.connection(port))
            .unwrap_or_else(|e| panic!("FLUSHALL on {port}: {e}"));
    }

    /// `CLUSTER FAILOVER` on the replica on `replica_port`; returns once it serves its shard's
    /// slots as a primary in every node's view, its old primary is its replica with the link
    /// up, and the cluster is ok everywhere.
    pub fn failover(&self, replica_port: u16) {
        let view = self.view();
        let me =
            view.iter().find(|n| n.port == replica_port).unwrap_or_else(|| panic!("no node on port {replica_port}"));
        assert!(me.flags.iter().any(|f| f == "slave"), "node {replica_port} is not a replica: {:?}", me.flags);
        let old_port = view.iter().find(|n| n.id == me.primary_id).expect("the replica's primary").port;
        let mut sent: Option<Instant> = None;
        wait_for(Duration::from_secs(30), "a cluster failover to complete", || {
            // A manual failover gives up after 5 s; ask again past that.
            if sent.is_none_or(|t| t.elapsed() > Duration::from_secs(6))
                && info_field(&self.reach, replica_port, "replication", "role").as_deref() != Some("master")
            {
                let _: () = ::redis::cmd("CLUSTER")
                    .arg("FAILOVER")
                    .query(&mut self.connection(replica_port))
                    .map_err(|e| format!("CLUSTER FAILOVER: {e}"))?;
                sent = Some(Instant::now());
            }
            for node in &self.nodes {
                let view = nodes_of(&self.reach, node.port)?;
                let new = view.iter().find(|n| n.port == replica_port).ok_or("the new primary is unknown")?;
                let old = view.iter().find(|n| n.port == old_port).ok_or("the old primary is unknown")?;
                if !new.is_primary() || new.slots.is_empty() || old.primary_id != new.id {
                    return Err(format!(
                        "node {} does not see {replica_port} as the primary of {old_port} yet",
                        node.port
                    ));
                }
            }
            replica_linked(&self.reach, old_port, replica_port)
        });
        self.wait_healthy(Duration::from_secs(20));
    }

    /// Kills the node on `port` (SIGKILL: an unplanned failure) and returns once its replica
    /// `replica_port` serves its slots as a primary in the view of every node still up, and
    /// the cluster is ok there.
    pub fn kill_and_wait_promoted(&self, port: u16, replica_port: u16) {
        let node = self.nodes.iter().find(|n| n.addr().port() == port).unwrap_or_else(|| panic!("no node on {port}"));
        node.stop();
        wait_for(Duration::from_secs(30), "the replica to take over", || {
            for node in self.nodes.iter().filter(|n| n.addr().port() != port) {
                let view = nodes_of(&self.reach, node.addr().port())?;
                let new = view.iter().find(|n| n.port == replica_port).ok_or("the replica is unknown")?;
                if !new.is_primary() || new.slots.is_empty() {
                    return Err(format!("node {} does not see {replica_port} as a primary yet", node.addr().port()));
                }
                let info: String = ::redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut connect(&self.reach, node.addr().port()).map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
                if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
                    return Err(format!("the cluster is not ok on {}", node.addr().port()));
                }
            }
            Ok(())
        });
    }

    /// The cluster's layout as the first node that answers sees it.
    fn view(&self) -> Vec<ClusterNode> {
        self.nodes
            .iter()
            .find_map(|n| nodes_of(&self.reach, n.port).ok())
            .expect("no cluster node answers CLUSTER NODES")
    }

    fn query_any<T: ::redis::FromRedisValue>(&self, cmd: &mut ::redis::Cmd) -> T {
        self.nodes
            .iter()
            .find_map(|n| connect(&self.reach, n.port).and_then(|mut c| cmd.query(&mut c)).ok())
            .expect("no cluster node answers")
    }

    /// Waits until every node reports the cluster ok with all slots served, sees all nodes
    /// (`primaries` primaries with slots, the rest replicas, none failing), and every replica
    /// is linked to its primary.
    fn wait_healthy(&self, timeout: Duration) {
        wait_for(timeout, "the cluster to be ok on every node", || {
            for node in &self.nodes {
                let info: String = connect(&self.reach, node.port)
                    .and_then(|mut c| ::redis::cmd("CLUSTER").arg("INFO").query(&mut c))
                    .map_err(|e| format!("CLUSTER INFO on {}: {e}", node.port))?;
                for want in ["cluster_state:ok", "cluster_slots_assigned:16384", "cluster_slots_ok:16384"] {
                    if !info.lines().any(|l| l.trim() == want) {
                        return Err(format!("node {} lacks {want}: {info}", node.port));
                    }
                }
                let view = nodes_of(&self.reach, node.port)?;
                let serving = view.iter().filter(|n| n.is_primary() && !n.slots.is_empty()).count();
                let replicas = view.iter().filter(|n| n.flags.iter().any(|f| f == "slave")).count();
                let failing = view.iter().any(|n| n.flags.iter().any(|f| f.starts_with("fail")));
                if view.len() != self.nodes.len()
                    || serving != self.primaries
                    || replicas != self.nodes.len() - self.primaries
                    || failing
                {
                    return Err(format!(
                        "node {} sees {} nodes, {serving} serving primaries, {replicas} replicas, failing: {failing}",
                        node.port,
                        view.len()
                    ));
                }
                if view
                    .iter()
                    .find(|n| n.flags.iter().any(|f| f == "myself"))
                    .is_some_and(|me| me.flags.iter().any(|f| f == "slave"))
                {
                    let link = info_field(&self.reach, node.port, "replication", "master_link_status");
                    if link.as_deref() != Some("up") {
                        return Err(format!("replica {} has master_link_status {link:?}", node.port));
                    }
                }
            }
            Ok(())
        });
    }
}

/// A line of `CLUSTER NODES`.
#[derive(Debug)]
struct ClusterNode {
    id: String,
    port: u16,
    flags: Vec<String>,
    /// The primary's id for a replica, "-" for a primary.
    primary_id: String,
    /// Served slot ranges, inclusive; slots being migrated are left out.
    slots: Vec<(u16, u16)>,
}

impl ClusterNode {
    fn is_primary(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }
}

/// `CLUSTER NODES` as the node on `port` sees it.
fn nodes_of(reach: &Reach, port: u16) -> Result<Vec<ClusterNode>, String> {
    let text: String = connect(reach, port)
        .and_then(|mut c| ::redis::cmd("CLUSTER").arg("NODES").query(&mut c))
        .map_err(|e| format!("CLUSTER NODES on {port}: {e}"))?;
    text.lines().filter(|l| !l.trim().is_empty()).map(parse_cluster_node).collect()
}

/// `<id> <ip:port@cport[,hostname]> <flags> <primary> <ping> <pong> <epoch> <link> <slot>...`
fn parse_cluster_node(line: &str) -> Result<ClusterNode, String> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let bad = || format!("unexpected CLUSTER NODES line: {line}");
    if f.len() < 8 {
        return Err(bad());
    }
    let addr = f[1].split(['@', ',']).next().ok_or_else(bad)?;
    let port = addr.rsplit(':').next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let mut slots = Vec::new();
    for s in &f[8..] {
        if s.starts_with('[') {
            continue;
        }
        let (a, b) = s.split_once('-').unwrap_or((s, s));
        slots.push((a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?));
    }
    Ok(ClusterNode {
        id: f[0].to_string(),
        port,
        flags: f[2].split(',').map(str::to_string).collect(),
        primary_id: f[3].to_string(),
        slots,
    })
}
