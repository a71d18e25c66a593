//! The store's connections, and where they lead.
//!
//! A fixed number (`store.connections`) of multiplexed, self-reconnecting connections, used in
//! turn; each pipelines every concurrent call instead of holding a connection per call.
//!
//! - One primary: each link is a `ConnectionManager` to it.
//! - Sentinel: the same, to the primary the Sentinels name. The links start out leading nowhere;
//!   a follower task (`sentinel`) leads them to the primary, and to the promoted one at once on
//!   a failover. Calls made while no primary is known fail with a store error, and the route's
//!   `on_store_error` applies to them; calls in flight finish on the links they took.
//! - Cluster: each link is a cluster connection that routes every call by its key's slot and
//!   learns topology changes by itself; redirections (MOVED, ASK) are followed by the store,
//!   not by the cluster client, for the reason [`Nodes`] gives. Every script touches one key,
//!   so each runs on the primary of that key's slot.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::{IntoConnectionInfo, TlsCertificates};
use tokio::sync::futures::Notified;
use tokio::sync::{Notify, watch};

use super::link::{Link, unavailable};
use super::replicas::{Exclusive, Held};
use crate::config::{Address, Auth, RedisTarget as Target, RedisTls};
use crate::store::error::StoreError;

/// Where the links lead now.
pub(super) struct Current {
    links: Box<[Link]>,
    /// Servers to subscribe to for settle notifications, tried in turn.
    notify: Vec<redis::Client>,
    /// Connections one call holds at a time, for writes that wait for replicas; `None` while
    /// Sentinel has not named a primary.
    exclusive: Option<Arc<Exclusive>>,
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
    /// A Cluster's nodes, reached directly for the calls it redirects with ASK.
    nodes: Option<Arc<Nodes>>,
    /// Where `store.url` says the store is, without credentials (see `describe`).
    configured: Arc<str>,
    /// The primary is the one the Sentinels name, followed through failovers.
    followed: bool,
}

/// Direct connections to a Cluster's nodes, made when a call is first redirected to one.
///
/// The hazard they exist for: the cluster client's own ASK handling sends `ASKING` and the
/// redirected command as two requests on a connection that other calls share; under load,
/// another command comes between them and takes the one-time permission, the redirected
/// command bounces back (MOVED), and the client, refreshing its slots on every bounce, ends
/// up answering no call at all, also after the migration (reproduced with 50 writes into one
/// migrating slot: 2 went through, and every later call timed out). So the cluster client
/// makes no retries, and the store follows redirections itself (`RedisStore::query`).
pub(super) struct Nodes {
    access: NodeAccess,
    timeout: Duration,
    connections: std::sync::Mutex<std::collections::HashMap<String, MultiplexedConnection>>,
}

/// Opened links, and for Sentinel what the task that keeps them on the primary starts from
/// (`sentinel::Follower`).
pub(super) struct Opened {
    pub links: Links,
    pub sentinels: Option<Sentinels>,
}

/// The Sentinels of a primary, and how to make links to the primaries they name.
pub(super) struct Sentinels {
    pub clients: Vec<redis::Client>,
    pub access: NodeAccess,
    pub master: String,
    pub count: usize,
    pub timeout: Duration,
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
        let configured: Arc<str> = target.describe().into();
        let certs = if target.tls() { certificates(tls)? } else { None };
        let (current, cluster, sentinels) = match target {
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
                let sentinels = Sentinels { clients: sentinels, access, master, count, timeout };
                (Current { links: Box::new([]), notify: Vec::new(), exclusive: None }, false, Some(sentinels))
            }
            Target::Cluster { seeds, tls, auth } => {
                let auth = with_password(auth, password);
                let current = cluster_links(&seeds, tls, &auth, certs.clone(), count, timeout)?;
                let scheme = if tls { "rediss" } else { "redis" };
                let access = NodeAccess { scheme, auth, certs };
                let nodes = Nodes { access, timeout, connections: Default::default() };
                return Ok(Opened {
                    links: Links::new(current, true, Some(Arc::new(nodes)), configured, false),
                    sentinels: None,
                });
            }
        };
        let followed = sentinels.is_some();
        Ok(Opened { links: Links::new(current, cluster, None, configured, followed), sentinels })
    }

    fn new(current: Current, cluster: bool, nodes: Option<Arc<Nodes>>, configured: Arc<str>, followed: bool) -> Self {
        Links {
            current: Arc::new(ArcSwap::from_pointee(current)),
            next: Arc::new(AtomicUsize::new(0)),
            cluster,
            changed: Arc::new(watch::channel(0).0),
            trouble: Arc::new(Notify::new()),
            nodes,
            configured,
            followed,
        }
    }

    /// Where the store is, for a log line: the configured addresses, and behind Sentinels the
    /// primary they named last. Never credentials.
    pub fn describe(&self) -> String {
        if self.cluster {
            return self.configured.to_string();
        }
        match self.current.load().notify.first() {
            Some(primary) if self.followed => {
                format!("{}, primary {}", self.configured, primary.get_connection_info().addr())
            }
            _ => self.configured.to_string(),
        }
    }

    /// A direct connection to the Cluster node at `address` (`host:port`, as a redirection
    /// names it), with that address.
    pub async fn node(&self, address: &str) -> Result<(String, MultiplexedConnection), StoreError> {
        let nodes = self.nodes.as_ref().ok_or_else(|| StoreError::Migrating("ASK outside a Cluster".into()))?;
        let parsed = parse_address(address)?;
        let key = address.to_owned();
        let known = nodes.connections.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key).cloned();
        if let Some(conn) = known {
            return Ok((key, conn));
        }
        let client = nodes.access.client(&parsed)?;
        let config = redis::AsyncConnectionConfig::new().set_connection_timeout(Some(nodes.timeout));
        let conn = client.get_multiplexed_async_connection_with_config(&config).await.map_err(unavailable)?;
        nodes.connections.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key.clone(), conn.clone());
        Ok((key, conn))
    }

    /// Drops the direct connection to a node that broke; the next redirection makes another.
    pub fn forget_node(&self, address: &str) {
        if let Some(nodes) = &self.nodes {
            nodes.connections.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(address);
        }
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

    /// A connection of its own for one call, to where the links lead now (see `replicas`); an
    /// error while Sentinel has not named a primary yet.
    pub async fn exclusive(&self) -> Result<Held, StoreError> {
        let pool = self.current.load().exclusive.clone();
        match pool {
            Some(pool) => pool.take().await,
            None => Err(StoreError::Unavailable("the Sentinels have not named a primary yet".into())),
        }
    }

    /// A new connection to the Cluster node at `address`, for one call that must not share it
    /// (a write that waits for replicas, redirected by ASK); closed when dropped.
    pub async fn node_alone(&self, address: &str) -> Result<MultiplexedConnection, StoreError> {
        let nodes = self.nodes.as_ref().ok_or_else(|| StoreError::Migrating("ASK outside a Cluster".into()))?;
        let client = nodes.access.client(&parse_address(address)?)?;
        let config = redis::AsyncConnectionConfig::new().set_connection_timeout(Some(nodes.timeout));
        client.get_multiplexed_async_connection_with_config(&config).await.map_err(unavailable)
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

    /// Completes when a call reports trouble (`report_trouble`), or at once if one did since
    /// the last time.
    pub fn trouble_reported(&self) -> Notified<'_> {
        self.trouble.notified()
    }

    /// Leads the links to `current`, and says so to `changes`.
    pub fn replace(&self, current: Current) {
        self.current.store(Arc::new(current));
        self.changed.send_modify(|generation| *generation += 1);
    }
}

pub(super) fn node_links(client: redis::Client, count: usize, timeout: Duration) -> Result<Current, StoreError> {
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
    let exclusive = Some(Exclusive::node(client.clone(), timeout));
    Ok(Current { links: links.into(), notify: vec![client], exclusive })
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
    // No retries of its own: the store follows MOVED and ASK itself (see `Nodes`), and waits
    // out TRYAGAIN and CLUSTERDOWN by its own policies.
    let mut builder = ClusterClientBuilder::new(urls.iter().map(String::as_str)).connection_timeout(timeout).retries(0);
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
    let links: Box<[Link]> = links.collect();
    let exclusive = Some(Exclusive::cluster(client, timeout));
    // A PUBLISH on any cluster node reaches the subscribers of every node (over the cluster
    // bus), so one subscription to any seed hears the whole cluster.
    let notify = urls.iter().map(|url| node_client(url, auth, certs.clone())).collect::<Result<Vec<_>, _>>()?;
    Ok(Current { links, notify, exclusive })
}

/// A redirection's `host:port` (an IPv6 host in brackets).
fn parse_address(address: &str) -> Result<Address, StoreError> {
    address
        .rsplit_once(':')
        .and_then(|(host, port)| {
            Some(Address { host: host.trim_matches(['[', ']']).to_owned(), port: port.parse().ok()? })
        })
        .ok_or_else(|| StoreError::Protocol(format!("a redirection to {address:?}")))
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

/// How to reach a Redis node by address: scheme, credentials, TLS files.
pub(super) struct NodeAccess {
    scheme: &'static str,
    auth: Auth,
    certs: Option<TlsCertificates>,
}

impl NodeAccess {
    /// A client for the node at `address`.
    pub fn client(&self, address: &Address) -> Result<redis::Client, StoreError> {
        let url = format!("{}://{address}", self.scheme);
        node_client(&url, &self.auth, self.certs.clone())
    }
}
