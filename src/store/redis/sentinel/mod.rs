//! Following a Sentinel failover: keeping the links (`links`) on the primary.
//!
//! After a failover the old primary goes on taking writes until Sentinel demotes it, which
//! Sentinel does only when it next looks at it (seconds later, or never while it is cut off);
//! writes it takes meanwhile are lost with the demotion. So the links must not wait for the
//! old primary to refuse writes: a follower task listens to every Sentinel's `+switch-master`
//! announcement and moves the links to the promoted primary at once. As a fallback for a
//! missed announcement the follower also checks once a second (and, at most every
//! [`MIN_SPACING`], when a call meets a read-only or broken node) that its node still calls
//! itself primary, asks the Sentinels again when it does not, and asks them every
//! [`RESOLVE_ANYWAY`] regardless.
//!
//! Asking means asking every Sentinel and believing the one with the highest config epoch:
//! right after a failover the Sentinels that did not run it still name the old primary for a
//! moment, and the old primary still answers as one, so "the first Sentinel that names a
//! working primary" (the redis crate's own lookup) can lead the links back to it. For the
//! same reason an announcement is applied only when it names the primary the links lead to
//! as the old one.

use std::time::{Duration, Instant};

use redis::Value;
use redis::aio::MultiplexedConnection;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::links::{Links, NodeAccess, Sentinels, node_links};
use crate::config::Address;

/// How often the Sentinel follower checks that its primary is still one.
const FOLLOW_CHECK: Duration = Duration::from_secs(1);
/// How often the follower asks the Sentinels even while the primary answers as one.
const RESOLVE_ANYWAY: Duration = Duration::from_secs(10);
/// The least time between two checks woken by failing calls (which, under load, fail by the
/// thousand while a primary is down).
const MIN_SPACING: Duration = Duration::from_millis(250);

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
    /// A follower of `sentinels` that follows no primary yet.
    pub fn new(sentinels: Sentinels) -> Self {
        let Sentinels { clients: sentinels, access, master, count, timeout } = sentinels;
        let asking = vec![None; sentinels.len()];
        Self { sentinels, asking, access, master, count, timeout, following: None, known_epoch: 0 }
    }

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
                () = links.trouble_reported() => tokio::time::sleep_until((checked + MIN_SPACING).into()).await,
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
        let client = match self.access.client(&primary) {
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
