//! The store's connections, and where they lead.
//!
//! A fixed number (`store.connections`) of multiplexed, self-reconnecting connections, used in
//! turn; each pipelines every concurrent call instead of holding a connection per call.
//!
//! - One primary: each link is a `ConnectionManager` to it.
//! - Sentinel: the same, to the primary the Sentinels name. A follower task listens to every
//!   Sentinel's `+switch-master` announcement and moves the links to the promoted primary at
//!   once. It must not wait for the old primary to refuse writes: Sentinel demotes it only
//!   when it next looks at it (seconds later, or never while it is cut off), and writes it
//!   takes meanwhile are lost with the demotion. As a fallback for a missed announcement the
//!   follower also checks once a second (and, at most every [`MIN_SPACING`], when a call meets
//!   a read-only or broken node) that its node still calls itself primary, asks the Sentinels
//!   again when it does not, and asks them every [`RESOLVE_ANYWAY`] regardless.
//!
//!   Asking means asking every Sentinel and believing the one with the highest config epoch:
//!   right after a failover the Sentinels that did not run it still name the old primary for a
//!   moment, and the old primary still answers as one, so "the first Sentinel that names a
//!   working primary" (the redis crate's own lookup) can lead the links back to it. For the
//!   same reason an announcement is applied only when it names the primary the links lead to
//!   as the old one. Calls made while no primary is known fail with a store error, and the
//!   route's `on_store_error` applies to them; calls in flight finish on the links they took.
//! - Cluster: each link is a cluster connection that routes every call by its key's slot and
//!   follows MOVED/ASK redirections and topology changes by itself. Every script touches one
//!   key, so each runs on the primary of that key's slot.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use redis::aio::MultiplexedConnection;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, TlsCertificates, Value};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

use super::target::{Address, Auth, Target};
use crate::config::RedisTls;
use crate::store::StoreError;

/// How often the Sentinel follower checks that its primary is still one.
const FOLLOW_CHECK: Duration = Duration::from_secs(1);
/// How often the follower asks the Sentinels even while the primary answers as one.
const RESOLVE_ANYWAY: Duration = Duration::from_secs(10);
/// The least time between two checks woken by failing calls (which, under load, fail by the
/// thousand while a primary is down).
const MIN_SPACING: Duration = Duration::from_millis(250);

/// One multiplexed connection.
#[derive(Clone)]
pub(super) enum Link {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Node(c) => c.req_packed_command(cmd),
            Link::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Node(c) => c.get_db(),
            Link::Cluster(c) => c.get_db(),
        }
    }
}

/// Where the links lead now.
struct Current {
    links: Box<[Link]>,
    /// Servers to subscribe to for settle notifications, tried in turn.
    notify: Vec<redis::Client>,
}

/// The store's links; cheap to clone.
#[derive(Clone)]
pub(super) struct Links {
    current: Arc<ArcSwap<Current>>,
    next: Arc<AtomicUsize>,
    cluster: bool,
    /// Bumped when the links lead somewhere new (a Sentinel failover).
    changed: Arc<watch::Sender<u64>>,
    /// Wakes the Sentinel follower early: a call met a node that is no longer primary.
    trouble: Arc<Notify>,
}

/// Opened links, and for Sentinel the task that keeps them on the primary.
pub(super) struct Opened {
    pub links: Links,
    pub follower: Option<Follower>,
}

impl Links {
    /// Links to `target`, made lazily: this succeeds while Redis is down. `password` (from
    /// `password_env`) replaces the URL's.
    pub fn open(
        target: Target,
        tls: &RedisTls,
        password: Option<&str>,
        count: usize,
        timeout: Duration,
    ) -> Result<Opened, StoreError> {
        let count = count.max(1);
        let certs = if target.tls() { certificates(tls)? } else { None };
        let (current, cluster, follower) = match target {
            Target::Single(mut info) => {
                if let Some(password) = password {
                    let settings = info.redis_settings().clone().set_password(password);
                    info = info.set_redis_settings(settings);
                }
                (node_links(client_for(info, certs)?, count, timeout)?, false, None)
            }
            Target::Sentinel { sentinels, master, tls, auth } => {
                let auth = with_password(auth, password);
                let scheme = if tls { "rediss" } else { "redis" };
                let sentinels = sentinels
                    .iter()
                    .map(|a| node_client(&format!("{scheme}://{a}"), &Auth::default(), certs.clone()))
                    .collect::<Result<Vec<_>, _>>()?;
                let access = NodeAccess { scheme, auth, certs };
                let asking = vec![None; sentinels.len()];
                let follower =
                    Follower { sentinels, asking, access, master, count, timeout, following: None, known_epoch: 0 };
                (Current { links: Box::new([]), notify: Vec::new() }, false, Some(follower))
            }
            Target::Cluster { seeds, tls, auth } => {
                (cluster_links(&seeds, tls, &with_password(auth, password), certs, count, timeout)?, true, None)
            }
        };
        let links = Links {
            current: Arc::new(ArcSwap::from_pointee(current)),
            next: Arc::new(AtomicUsize::new(0)),
            cluster,
            changed: Arc::new(watch::channel(0).0),
            trouble: Arc::new(Notify::new()),
        };
        Ok(Opened { links, follower })
    }

    /// The next link in turn; an error while Sentinel has not named a primary yet.
    pub fn pick(&self) -> Result<Link, StoreError> {
        let current = self.current.load();
        if current.links.is_empty() {
            return Err(StoreError::Unavailable("the Sentinels have not named a primary yet".into()));
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % current.links.len();
        Ok(current.links[i].clone())
    }

    /// Whether the links lead to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The servers to subscribe to for notifications, in the order to try them.
    pub fn notify_clients(&self) -> Vec<redis::Client> {
        self.current.load().notify.clone()
    }

    /// Changes whenever the links lead somewhere new.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Reports that a call met a node that is read-only or gone, so that a Sentinel follower
    /// checks at once instead of at its next tick.
    pub fn report_trouble(&self) {
        self.trouble.notify_one();
    }

    fn replace(&self, current: Current) {
        self.current.store(Arc::new(current));
        self.changed.send_modify(|generation| *generation += 1);
    }
}

fn node_links(client: redis::Client, count: usize, timeout: Duration) -> Result<Current, StoreError> {
    // A broken connection is re-established on the next call; retries inside one call are
    // few and short so that an unreachable Redis surfaces as an error within the timeout
    // (and the route's on_store_error applies) instead of a long hang. The deadline of a
    // call is set once, by the store's `query`; the connection timeout here bounds a
    // reconnection, which also runs outside any call.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None)
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(timeout);
    let links = (0..count)
        .map(|_| ConnectionManager::new_lazy_with_config(client.clone(), config.clone()).map(Link::Node))
        .collect::<Result<Vec<_>, _>>()
        .map_err(unavailable)?;
    Ok(Current { links: links.into(), notify: vec![client] })
}

fn cluster_links(
    seeds: &[Address],
    tls: bool,
    auth: &Auth,
    certs: Option<TlsCertificates>,
    count: usize,
    timeout: Duration,
) -> Result<Current, StoreError> {
    let scheme = if tls { "rediss" } else { "redis" };
    let urls: Vec<String> = seeds.iter().map(|a| format!("{scheme}://{a}")).collect();
    let mut builder = ClusterClientBuilder::new(urls.iter().map(String::as_str)).connection_timeout(timeout);
    if let Some(user) = &auth.username {
        builder = builder.username(user);
    }
    if let Some(password) = &auth.password {
        builder = builder.password(password);
    }
    if let Some(certs) = certs.clone() {
        builder = builder.certs(certs);
    }
    let client = builder.build().map_err(unavailable)?;
    // Pending connections: the cluster's nodes are found in the background, and the first
    // calls fail with a store error until they are.
    let config = redis::cluster::ClusterConfig::new().set_connection_timeout(timeout);
    let links = (0..count).map(|_| Link::Cluster(client.get_pending_async_connection_with_config(config.clone())));
    // A PUBLISH on any cluster node reaches the subscribers of every node (over the cluster
    // bus), so one subscription to any seed hears the whole cluster.
    let notify = urls.iter().map(|url| node_client(url, auth, certs.clone())).collect::<Result<Vec<_>, _>>()?;
    Ok(Current { links: links.collect(), notify })
}

fn node_client(url: &str, auth: &Auth, certs: Option<TlsCertificates>) -> Result<redis::Client, StoreError> {
    let info = url.into_connection_info().map_err(unavailable)?;
    let mut settings = info.redis_settings().clone();
    if let Some(user) = &auth.username {
        settings = settings.set_username(user);
    }
    if let Some(password) = &auth.password {
        settings = settings.set_password(password);
    }
    client_for(info.set_redis_settings(settings), certs)
}

/// A client for `info`, over TLS with `certs` when given (else the system roots, for TLS URLs).
fn client_for(info: redis::ConnectionInfo, certs: Option<TlsCertificates>) -> Result<redis::Client, StoreError> {
    match certs {
        Some(certs) => redis::Client::build_with_tls(info, certs),
        None => redis::Client::open(info),
    }
    .map_err(unavailable)
}

fn with_password(auth: Auth, password: Option<&str>) -> Auth {
    match password {
        Some(p) => Auth { password: Some(p.to_owned()), ..auth },
        None => auth,
    }
}

/// The `[store]` TLS files as the redis crate takes them; `None` for the system roots.
fn certificates(tls: &RedisTls) -> Result<Option<TlsCertificates>, StoreError> {
    if tls.ca_file.is_none() && tls.client.is_none() {
        return Ok(None);
    }
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| StoreError::Unavailable(format!("cannot read {}: {e}", path.display())))
    };
    let client_tls = match &tls.client {
        Some((cert, key)) => Some(redis::ClientTlsConfig { client_cert: read(cert)?, client_key: read(key)? }),
        None => None,
    };
    let root_cert = tls.ca_file.as_deref().map(read).transpose()?;
    Ok(Some(TlsCertificates { client_tls, root_cert }))
}

pub(super) fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// How to reach a Redis node by address: scheme, credentials, TLS files.
struct NodeAccess {
    scheme: &'static str,
    auth: Auth,
    certs: Option<TlsCertificates>,
}

/// Keeps Sentinel links on the primary (see the module docs).
pub(super) struct Follower {
    /// One client per Sentinel: asked for the primary, and heard for `+switch-master`.
    sentinels: Vec<redis::Client>,
    /// A connection to each Sentinel for asking, kept between asks.
    asking: Vec<Option<MultiplexedConnection>>,
    access: NodeAccess,
    master: String,
    count: usize,
    timeout: Duration,
    /// The primary the links lead to now.
    following: Option<Address>,
    /// The highest config epoch a followed answer of the Sentinels had.
    known_epoch: u64,
}

/// A `+switch-master` announcement: the primary moved from `old` to `new`.
struct Switch {
    old: Address,
    new: Address,
}

/// Aborts the announcement listeners when the follower stops.
struct Listeners(Vec<JoinHandle<()>>);

impl Drop for Listeners {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

impl Follower {
    pub async fn run(mut self, links: Links) {
        let (announced, mut announcements) = mpsc::channel(16);
        let _listeners = Listeners(
            self.sentinels
                .iter()
                .map(|sentinel| tokio::spawn(listen(sentinel.clone(), self.master.clone(), announced.clone())))
                .collect(),
        );
        let mut asked: Option<Instant> = None;
        loop {
            let checked = Instant::now();
            let due = asked.is_none_or(|at| at.elapsed() >= RESOLVE_ANYWAY);
            if due || !self.primary_answers(&links).await {
                // Until an ask succeeds, ask again at the next check.
                asked = self.ask(&links).await.then(Instant::now);
            }
            tokio::select! {
                () = tokio::time::sleep(FOLLOW_CHECK) => {}
                () = links.trouble.notified() => tokio::time::sleep_until((checked + MIN_SPACING).into()).await,
                Some(switch) = announcements.recv() => {
                    let from_ours = self.following.as_ref().is_none_or(|f| *f == switch.old);
                    if !from_ours || !self.move_to(&links, switch.new).await {
                        // Stale, or not (yet) usable: let the Sentinels decide.
                        asked = None;
                    }
                }
            }
        }
    }

    /// Moves the links to `primary` once it answers as primary; false if it does not.
    async fn move_to(&mut self, links: &Links, primary: Address) -> bool {
        if self.following.as_ref() == Some(&primary) {
            return true; // Every Sentinel announces the same switch.
        }
        let url = format!("{}://{primary}", self.access.scheme);
        let client = match node_client(&url, &self.access.auth, self.access.certs.clone()) {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!(master = %self.master, error = %e, "cannot reach the named primary");
                return false;
            }
        };
        let checked = tokio::time::timeout(self.timeout, async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("ROLE").query_async::<Value>(&mut conn).await
        });
        match checked.await {
            Ok(Ok(role)) if is_primary(&role) => {
                self.lead(links, client, primary);
                true
            }
            _ => {
                tracing::warn!(master = %self.master, primary = %primary, "the named primary does not answer as one");
                false
            }
        }
    }

    /// Whether the node the links lead to answers `ROLE` as a primary.
    async fn primary_answers(&self, links: &Links) -> bool {
        let Ok(mut link) = links.pick() else { return false };
        let role = tokio::time::timeout(self.timeout, redis::cmd("ROLE").query_async::<Value>(&mut link)).await;
        matches!(role, Ok(Ok(role)) if is_primary(&role))
    }

    /// Asks every Sentinel for the primary, believes the highest config epoch, and leads the
    /// links there; false when no Sentinel answered or the primary does not answer as one.
    async fn ask(&mut self, links: &Links) -> bool {
        let master = self.master.clone();
        let timeout = self.timeout;
        let asks = self.sentinels.iter().zip(self.asking.iter_mut()).map(|(sentinel, conn)| {
            let master = master.as_str();
            async move {
                let answer = tokio::time::timeout(timeout, async {
                    let mut c = match conn.clone() {
                        Some(c) => c,
                        None => sentinel.get_multiplexed_async_connection().await?,
                    };
                    let fields =
                        redis::cmd("SENTINEL").arg("MASTER").arg(master).query_async::<Vec<String>>(&mut c).await?;
                    Ok::<_, redis::RedisError>((c, fields))
                })
                .await;
                let failed = match answer {
                    Ok(Ok((c, fields))) => {
                        *conn = Some(c);
                        return Ok(named_primary(&fields));
                    }
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => format!("no answer within {timeout:?}"),
                };
                // Broken or slow: connect afresh next time.
                *conn = None;
                Err(format!("{}: {failed}", sentinel.get_connection_info().addr()))
            }
        });
        let answers = futures_util::future::join_all(asks).await;
        // Each Sentinel's failure, so that a wrong CA or address says so in the log.
        let failures: Vec<String> = answers.iter().filter_map(|a| a.as_ref().err().cloned()).collect();
        let Some((epoch, primary)) = believe(answers.into_iter().map(|a| a.ok().flatten()).collect()) else {
            tracing::warn!(master = %self.master, failures = ?failures, "no Sentinel named a primary");
            return false;
        };
        if stale(self.following.as_ref(), self.known_epoch, epoch, &primary) {
            // The Sentinel that ran the latest failover did not answer (slow, or cut off), and
            // the others have not heard of it yet: they name the old primary, which still
            // answers as one until it is demoted. Going back there would lose writes.
            return true;
        }
        let moved = self.move_to(links, primary).await;
        if moved {
            self.known_epoch = self.known_epoch.max(epoch);
        }
        moved
    }

    /// Leads the links to `client`, the primary at `primary`.
    fn lead(&mut self, links: &Links, client: redis::Client, primary: Address) {
        match node_links(client, self.count, self.timeout) {
            Ok(current) => {
                if self.following.is_some() {
                    tracing::warn!(master = %self.master, primary = %primary, "following a Sentinel failover");
                } else {
                    tracing::info!(master = %self.master, primary = %primary, "the Sentinels named the primary");
                }
                links.replace(current);
                self.following = Some(primary);
            }
            Err(e) => tracing::warn!(master = %self.master, error = %e, "cannot connect to the named primary"),
        }
    }
}

/// The primary named with the highest config epoch (the latest failover's); the first such
/// answer on a tie.
fn believe(answers: Vec<Option<(u64, Address)>>) -> Option<(u64, Address)> {
    let mut best: Option<(u64, Address)> = None;
    for (epoch, primary) in answers.into_iter().flatten() {
        if best.as_ref().is_none_or(|(e, _)| epoch > *e) {
            best = Some((epoch, primary));
        }
    }
    best
}

/// Whether the Sentinels' answer (`epoch`, `primary`) is older than what the links follow: it
/// names another primary with no newer config epoch than the last answer followed. (A move on a
/// `+switch-master` leaves `known_epoch` at the epoch before that failover.)
fn stale(following: Option<&Address>, known_epoch: u64, epoch: u64, primary: &Address) -> bool {
    following.is_some_and(|f| f != primary) && epoch <= known_epoch
}

/// The primary and its config epoch from a `SENTINEL MASTER` reply (name/value pairs), unless
/// this Sentinel deems it down.
fn named_primary(fields: &[String]) -> Option<(u64, Address)> {
    let field = |name: &str| fields.chunks(2).find(|pair| pair[0] == name).and_then(|pair| pair.get(1));
    let flags = field("flags")?;
    if flags.split(',').any(|f| f == "s_down" || f == "o_down" || f == "disconnected") {
        return None;
    }
    let epoch = field("config-epoch").and_then(|e| e.parse().ok()).unwrap_or(0);
    let host = field("ip")?.clone();
    let port = field("port")?.parse().ok()?;
    Some((epoch, Address { host, port }))
}

/// Whether a `ROLE` reply is a primary's.
fn is_primary(role: &Value) -> bool {
    matches!(role, Value::Array(items) if matches!(items.first(), Some(Value::BulkString(r)) if r == b"master"))
}

/// Listens to one Sentinel's `+switch-master` announcements (`NAME OLD_IP OLD_PORT NEW_IP
/// NEW_PORT`) and passes on those of `master`.
async fn listen(sentinel: redis::Client, master: String, announced: mpsc::Sender<Switch>) {
    let mut backoff = Duration::from_millis(100);
    let mut warned = false;
    loop {
        let opened = tokio::time::timeout(Duration::from_secs(5), async {
            let mut pubsub = sentinel.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await.map(|()| pubsub)
        });
        match opened.await {
            Ok(Ok(pubsub)) => {
                backoff = Duration::from_millis(100);
                warned = false;
                let mut messages = pubsub.into_on_message();
                while let Some(message) = futures_util::StreamExt::next(&mut messages).await {
                    let Ok(text) = std::str::from_utf8(message.get_payload_bytes()) else { continue };
                    if let Some(switch) = parse_switch(text, &master) {
                        let _ = announced.send(switch).await;
                    }
                }
            }
            // Said once per outage: the follower's own checks cover the gap.
            failed if !warned => {
                warned = true;
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_owned(),
                };
                tracing::warn!(sentinel = %sentinel.get_connection_info().addr(), error, "cannot hear this Sentinel's failover announcements");
            }
            _ => {}
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

fn parse_switch(text: &str, master: &str) -> Option<Switch> {
    let fields: Vec<&str> = text.split(' ').collect();
    let [name, old_host, old_port, new_host, new_port] = fields[..] else { return None };
    if name != master {
        return None;
    }
    Some(Switch {
        old: Address { host: old_host.to_owned(), port: old_port.parse().ok()? },
        new: Address { host: new_host.to_owned(), port: new_port.parse().ok()? },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_sentinel_names_its_primary_with_its_epoch_unless_it_deems_it_down() {
        let reply =
            |flags| strings(&["name", "m", "ip", "10.0.0.2", "port", "6380", "flags", flags, "config-epoch", "7"]);
        let named = named_primary(&reply("master")).unwrap();
        assert_eq!(named, (7, Address { host: "10.0.0.2".into(), port: 6380 }));
        assert_eq!(named_primary(&reply("master,s_down")), None);
        assert_eq!(named_primary(&strings(&["name", "m"])), None);
    }

    #[test]
    fn the_latest_failover_wins_over_sentinels_that_have_not_heard_of_it() {
        let (a, b) = (Address { host: "a".into(), port: 1 }, Address { host: "b".into(), port: 2 });
        // The first Sentinel still names the old primary, which still answers as one.
        let answers = vec![Some((5, a.clone())), None, Some((6, b.clone())), Some((5, a.clone()))];
        assert_eq!(believe(answers), Some((6, b.clone())));
        let c = Address { host: "c".into(), port: 3 };
        assert_eq!(believe(vec![Some((5, a.clone())), Some((5, c))]), Some((5, a.clone())));
        assert_eq!(believe(vec![None, None]), None);
        // Followed b on its announcement (epoch 5 known before it): the leader is silent and
        // the rest still name a at epoch 5. Stale; a later failover (epoch 7) is not.
        assert!(stale(Some(&b), 5, 5, &a));
        assert!(!stale(Some(&b), 5, 7, &a));
        assert!(!stale(Some(&b), 5, 6, &b));
        assert!(!stale(None, 0, 5, &a));
    }

    #[test]
    fn switch_announcements_of_other_masters_are_ignored() {
        let switch = parse_switch("orders 10.0.0.1 6379 10.0.0.2 6380", "orders").unwrap();
        assert_eq!(switch.old, Address { host: "10.0.0.1".into(), port: 6379 });
        assert_eq!(switch.new, Address { host: "10.0.0.2".into(), port: 6380 });
        assert!(parse_switch("billing 10.0.0.1 6379 10.0.0.2 6380", "orders").is_none());
        assert!(parse_switch("orders 10.0.0.1 6379", "orders").is_none());
    }
}
