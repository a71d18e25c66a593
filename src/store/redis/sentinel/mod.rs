//! Following a Sentinel failover: keeping the links (`links`) on the primary.
//!
//! After a failover the old primary goes on taking writes until Sentinel demotes it, which
//! Sentinel does only when it next looks at it (seconds later, or never while it is cut off);
//! writes it takes meanwhile are lost with the demotion. So the links must not wait for the
//! old primary to refuse writes: a follower task listens to every Sentinel's `+switch-master`
//! announcement and moves the links to the promoted primary at once. As a fallback for a
//! missed announcement the follower also checks once a second (and, at most every
//! [`MIN_SPACING`](schedule::MIN_SPACING), when a call meets a read-only or broken node) that its node still calls
//! itself primary, asks the Sentinels again when it does not, and asks them every
//! [`RESOLVE_ANYWAY`] regardless.
//!
//! The checks never keep an announcement waiting. The next check is a deadline that the
//! follower waits for while it listens (`schedule`), not a sleep during which an announcement
//! would sit unread; and a check under way is dropped for an announcement that arrives
//! meanwhile. A check is slowest exactly when a failover is near: a primary that died or was
//! cut off answers `ROLE` only with the store timeout, and the promotion would wait for it.
//!
//! Asking means asking every Sentinel and believing the one with the highest config epoch:
//! right after a failover the Sentinels that did not run it still name the old primary for a
//! moment, and the old primary still answers as one, so "the first Sentinel that names a
//! working primary" (the redis crate's own lookup) can lead the links back to it. For the
//! same reason an announcement is applied only when it names the primary the links lead to
//! as the old one.
//!
//! While there is no primary to follow (no Sentinel names one, as they all deem it down
//! until they promote the replica; or the one named does not answer as a primary), every
//! check asks again, up to four times a second while calls fail. The log tells such a
//! stretch once (`episode`): a warning when it begins (and when the other of the two
//! conditions first shows in it), debug lines while it lasts, and one info line, with how
//! long it lasted and how many asks found nothing, once a primary that answers is followed
//! again.

mod announcements;
mod episode;
mod schedule;

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{RedisResult, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use self::announcements::{Listeners, Switch, listen};
use self::episode::{Episode, Lack};
use self::schedule::Schedule;
use super::links::{Links, NodeAccess, Sentinels, node_links};
use crate::config::Address;

/// How often the follower asks the Sentinels even while the primary answers as one.
const RESOLVE_ANYWAY: Duration = Duration::from_secs(10);

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
    /// When an ask last found a primary; `None` until one does, and after one that did not.
    asked: Option<Instant>,
    /// The stretch without a primary to follow, for the log.
    episode: Episode,
}

/// What a check found.
enum Checked {
    /// The links lead to a primary that answers as one: the one the Sentinels name, or, when
    /// they were not asked, the one the links led to already.
    Following,
    /// The Sentinels named an older primary than the one the links follow (see [`stale`]);
    /// the links stay.
    Stale,
    /// There is no primary to follow.
    Lacking(Lack),
}

/// What woke the follower.
enum Woke {
    Announced(Switch),
    Checked(Checked),
}

impl Follower {
    /// A follower of `sentinels` that follows no primary yet.
    pub fn new(sentinels: Sentinels) -> Self {
        let Sentinels { clients: sentinels, access, master, count, timeout } = sentinels;
        let asking = vec![None; sentinels.len()];
        Self {
            sentinels,
            asking,
            access,
            master,
            count,
            timeout,
            following: None,
            known_epoch: 0,
            asked: None,
            episode: Episode::default(),
        }
    }

    pub async fn run(mut self, links: Links) {
        let (announced, mut announcements) = mpsc::channel(16);
        let _listeners = Listeners(
            self.sentinels
                .iter()
                .map(|sentinel| tokio::spawn(listen(sentinel.clone(), self.master.clone(), announced.clone())))
                .collect(),
        );
        let mut schedule = Schedule::new(Instant::now());
        loop {
            // Announcements first, at every wait: an announcement waiting behind a check or
            // its spacing would leave the links on the old primary meanwhile.
            let woke = tokio::select! {
                biased;
                Some(switch) = announcements.recv() => Woke::Announced(switch),
                () = tokio::time::sleep_until(schedule.next()) => {
                    let began = Instant::now();
                    tokio::select! {
                        biased;
                        // The check is dropped for it (see `check` for why that is safe).
                        Some(switch) = announcements.recv() => Woke::Announced(switch),
                        checked = self.check(&links) => {
                            schedule.checked(began, Instant::now());
                            Woke::Checked(checked)
                        }
                    }
                }
                () = links.trouble_reported(), if schedule.hears_trouble() => {
                    schedule.trouble();
                    continue;
                }
            };
            match woke {
                Woke::Announced(switch) => {
                    if !self.follow_announced(&links, switch).await {
                        // Stale, or not (yet) usable: let the Sentinels decide, at once.
                        self.asked = None;
                        schedule.check_now(Instant::now());
                    }
                }
                Woke::Checked(Checked::Following) => self.followed(),
                Woke::Checked(Checked::Stale) => {}
                Woke::Checked(Checked::Lacking(lack)) => self.lacked(lack),
            }
        }
    }

    /// Checks that the node the links lead to answers as a primary, and asks the Sentinels
    /// when it does not, until an ask finds a primary, and every [`RESOLVE_ANYWAY`].
    ///
    /// The run loop drops it for an announcement, at any await. That is safe only while it
    /// (and what it calls) changes the follower and the links where no await follows: what
    /// it did stands, and the rest is not done. Keep it so.
    async fn check(&mut self, links: &Links) -> Checked {
        let due = self.asked.is_none_or(|at| at.elapsed() >= RESOLVE_ANYWAY);
        let role = if due { None } else { Some(self.primary_role(links).await) };
        if let Some(Ok(())) = role {
            return Checked::Following;
        }
        let checked = self.ask(links, role).await;
        self.asked = match checked {
            Checked::Lacking(_) => None,
            Checked::Following | Checked::Stale => Some(Instant::now()),
        };
        checked
    }

    /// Follows a `+switch-master` announcement that names the primary the links lead to as
    /// the old one; false when the Sentinels should be asked instead: it names another old
    /// primary (stale), or the new one does not answer as a primary (yet).
    async fn follow_announced(&mut self, links: &Links, switch: Switch) -> bool {
        if self.following.as_ref() == Some(&switch.new) {
            return true; // Every Sentinel announces the same switch.
        }
        if self.following.as_ref().is_some_and(|f| *f != switch.old) {
            return false;
        }
        match self.move_to(links, switch.new.clone()).await {
            Ok(()) => {
                // The Sentinels' own word, as good as an ask; and an ask right now would find
                // nothing: for a moment after a switch they name no primary (the old one is
                // down, the new one `disconnected` until they connect to it).
                self.asked = Some(Instant::now());
                self.followed();
                true
            }
            Err(error) => {
                // Not part of the episode: the ask that follows at once says what it finds.
                tracing::debug!(master = %self.master, primary = %switch.new, error, "cannot follow the announced primary yet; asking the Sentinels");
                false
            }
        }
    }

    /// Moves the links to `primary`, which they do not lead to, once it answers as primary;
    /// what it answered instead, or why it did not.
    async fn move_to(&mut self, links: &Links, primary: Address) -> Result<(), String> {
        let client = self.access.client(&primary).map_err(|e| format!("cannot make a client for it: {e}"))?;
        let role = tokio::time::timeout(self.timeout, async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("ROLE").query_async::<Value>(&mut conn).await
        });
        as_primary(role.await.ok(), self.timeout)?;
        let current = node_links(client, self.count, self.timeout).map_err(|e| format!("cannot link to it: {e}"))?;
        if self.following.is_some() {
            tracing::warn!(master = %self.master, primary = %primary, "following a Sentinel failover");
        } else {
            tracing::info!(master = %self.master, primary = %primary, "the Sentinels named the primary");
        }
        links.replace(current);
        self.following = Some(primary);
        Ok(())
    }

    /// Whether the node the links lead to answers `ROLE` as a primary; if not, why.
    async fn primary_role(&self, links: &Links) -> Result<(), String> {
        let mut link = links.pick().map_err(|e| e.to_string())?;
        let role = tokio::time::timeout(self.timeout, redis::cmd("ROLE").query_async::<Value>(&mut link)).await;
        as_primary(role.ok(), self.timeout)
    }

    /// Asks every Sentinel for the primary, believes the highest config epoch, and leads the
    /// links there. `role` is what the node the links lead to answered to `ROLE` just before,
    /// if it was asked.
    async fn ask(&mut self, links: &Links, role: Option<Result<(), String>>) -> Checked {
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
        let failures: Vec<String> = answers.iter().filter_map(|a| a.as_ref().err().cloned()).collect();
        let Some((epoch, primary)) = believe(answers.into_iter().map(|a| a.ok().flatten()).collect()) else {
            return Checked::Lacking(Lack::Unnamed { failures });
        };
        if stale(self.following.as_ref(), self.known_epoch, epoch, &primary) {
            // The Sentinel that ran the latest failover did not answer (slow, or cut off), and
            // the others have not heard of it yet: they name the old primary, which still
            // answers as one until it is demoted. Going back there would lose writes.
            return Checked::Stale;
        }
        let followed = if self.following.as_ref() == Some(&primary) {
            // Named again: the links stay where they are, if it still answers as a primary.
            match role {
                Some(role) => role,
                None => self.primary_role(links).await,
            }
        } else {
            self.move_to(links, primary.clone()).await
        };
        match followed {
            Ok(()) => {
                self.known_epoch = self.known_epoch.max(epoch);
                Checked::Following
            }
            Err(error) => Checked::Lacking(Lack::Unanswering { primary, error }),
        }
    }

    /// Notes a check that found no primary to follow: a warning when it begins an episode (or
    /// is the first of its kind in one), a debug line while the episode lasts.
    fn lacked(&mut self, lack: Lack) {
        let warn = self.episode.lacked(&lack, Instant::now());
        let master = &self.master;
        match lack {
            Lack::Unnamed { failures } if warn => {
                tracing::warn!(master = %master, failures = ?failures, "no Sentinel named a primary");
            }
            Lack::Unnamed { failures } => {
                tracing::debug!(master = %master, failures = ?failures, "no Sentinel named a primary");
            }
            Lack::Unanswering { primary, error } if warn => {
                tracing::warn!(master = %master, primary = %primary, error, "the named primary does not answer as one");
            }
            Lack::Unanswering { primary, error } => {
                tracing::debug!(master = %master, primary = %primary, error, "the named primary does not answer as one");
            }
        }
    }

    /// Ends the episode without a primary, if one is open: one line, with how long it lasted.
    fn followed(&mut self) {
        let Some((lasted, asks)) = self.episode.ended(Instant::now()) else { return };
        let primary = self.following.as_ref().map(ToString::to_string).unwrap_or_default();
        tracing::info!(master = %self.master, primary = %primary, lasted = %format_args!("{:.1}s", lasted.as_secs_f64()), asks, "the Sentinels named a primary again");
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

/// Whether a `ROLE` reply (`None`: none within `timeout`) is a primary's; if not, what it was.
fn as_primary(role: Option<RedisResult<Value>>, timeout: Duration) -> Result<(), String> {
    let role = match role {
        Some(Ok(role)) => role,
        Some(Err(e)) => return Err(e.to_string()),
        None => return Err(format!("no answer within {timeout:?}")),
    };
    match role_name(&role) {
        Some(b"master") => Ok(()),
        Some(name) => Err(format!("it answers ROLE as {}", String::from_utf8_lossy(name))),
        None => Err(format!("it answers ROLE with {role:?}")),
    }
}

/// The role a `ROLE` reply names: `master`, `slave` or `sentinel`.
fn role_name(role: &Value) -> Option<&[u8]> {
    match role {
        Value::Array(items) => match items.first() {
            Some(Value::BulkString(name)) => Some(name),
            _ => None,
        },
        _ => None,
    }
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
    fn only_a_primary_role_answers_as_one() {
        let role = |name: &str| Some(Ok(Value::Array(vec![Value::BulkString(name.into())])));
        let second = Duration::from_secs(1);
        assert_eq!(as_primary(role("master"), second), Ok(()));
        assert_eq!(as_primary(role("slave"), second), Err("it answers ROLE as slave".into()));
        assert_eq!(as_primary(None, second), Err("no answer within 1s".into()));
        let refused = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(as_primary(Some(Err(refused)), second).is_err());
        assert!(as_primary(Some(Ok(Value::Nil)), second).is_err());
    }
}
