//! The key's life in Redis: a claim (one native `SET NX GET PX` where it can be, else the
//! claim script), renewals, the settle (large answers through a side key), the release, and
//! the lookups of unknown outcomes; each one round trip.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use redis::{Cmd, RedisWrite, ToRedisArgs};

use super::engine::{ASIDE_FROM, POLL_SUBSCRIBED, POLL_UNSUBSCRIBED, RedisStore};
use super::journal::Wrote;
use super::layout::{self, Record};
use super::replicas::Written;
use super::round_trip::ms;
use super::round_trip::{Reply, protocol};
use super::transport::Ack;
use crate::policy::fingerprint::Fingerprint;
use crate::store::error::{Result, StoreError};
use crate::store::lifecycle::{Claim, Final, Granted, Lease, Renewal, Sent, Settled, Terms};
use crate::store::lookups::{Lookup, LookupEnd, LookupEnded};
use crate::store::names::{OwnerToken, RecordKey};
use crate::store::record::StoredResponse;
use crate::store::roles::{Lifecycle, Lookups};
use crate::store::state::State;
use crate::store::waiters::Watch;

impl RedisStore {
    /// Settles a claim whose response is large, without copying the response inside Redis.
    ///
    /// Passed to the settle script as an argument, a response is copied into a Lua string and
    /// again by `APPEND` into the record: for 1 MiB, 1.7 ms of Redis's time, most of it page
    /// faults on fresh allocations. Here it goes, in the same round trip, to a side key of its
    /// own with a native `SET` (which keeps a large argument's buffer as the value), behind
    /// room for the record's header; the script writes the header into that room
    /// (`SETRANGE`, in place) and renames the side key over the record, or deletes it when
    /// the claim is no longer this owner's. The side key shares the record's hash slot (its
    /// hash tag is the record's whole name, which has no braces), and lives no longer than
    /// the claim if the script never runs.
    async fn settle_aside(
        &self,
        lease: &Lease,
        state: State,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Settled> {
        // `PREFIX:aside:{RECORD}`: under the prefix like every key, and in the record's slot.
        let side = format!("{}:aside:{{{}}}", self.prefix, lease.key.as_str());
        let pipe = |verb: &str, script: &str| {
            let mut pipe = redis::pipe();
            // Sized for the response up front: grown as it is written, the command's buffer
            // would be copied on every doubling (a whole body's copy more for 64 KiB).
            let mut set = Cmd::with_capacity(5, side.len() + layout::HEADER + response.encoded_len() + 32);
            set.arg("SET").arg(&side).arg(Aside(response)).arg("PX").arg(ms(lease.terms.ttl.max(lease.terms.lease)));
            pipe.add_command(set).ignore();
            pipe.cmd(verb).arg(script).arg(2).arg(lease.key.as_str()).arg(&side);
            pipe.arg(&lease.owner.as_bytes()[..])
                .arg(&[state.letter()][..])
                .arg("")
                .arg(ms(retention))
                .arg(&self.channel);
            pipe
        };
        let settle = &self.scripts.settle;
        let eval = || pipe("EVAL", settle.code).into();
        let (reply, ack) =
            self.transport.write(pipe("EVALSHA", settle.script.get_hash()).into(), Some(&eval), self.wait()).await?;
        let (reply,): (i64,) = redis::from_redis_value(reply).map_err(|e| protocol(&e.to_string()))?;
        self.settled_relied_on(&lease.key, written(state), reply, ack, lease.terms.lease)
    }

    /// The settle script with the response as its argument, on the record's one key.
    async fn settle_in_place(
        &self,
        lease: &Lease,
        state: State,
        response: Option<&StoredResponse>,
        retention: Duration,
    ) -> Result<Settled> {
        let extra = response.map_or(0, StoredResponse::encoded_len);
        let args = |cmd: &mut Cmd| {
            cmd.arg(&lease.owner.as_bytes()[..]).arg(&[state.letter()][..]);
            match response {
                Some(r) => cmd.arg(Encoded(r)),
                None => cmd.arg(""),
            };
            cmd.arg(ms(retention)).arg(&self.channel);
        };
        let (reply, ack) =
            self.transport.eval_write(&self.scripts.settle, &[lease.key.as_str()], extra, args, self.wait()).await?;
        self.settled_relied_on(&lease.key, written(state), Reply::integer(reply)?, ack, lease.terms.lease)
    }

    /// The `WAIT` behind each write the promise rests on, and its timeout; `None` without
    /// `replica_acks`.
    fn wait(&self) -> Option<(&Cmd, Duration)> {
        self.replicas.wait().map(|wait| (wait, self.replicas.timeout()))
    }

    /// After a write the client's answer rests on (an answer, an unknown mark, a release, a
    /// lookup's end): counts what the replicas said; too few in time, the client is answered
    /// all the same (the request ran) and the gateway goes on waiting for them, for up to
    /// `keep` more (see `replicas`). A write that did not happen (`Lost`) leaves nothing to
    /// wait for.
    fn relied_on(&self, write: Written, done: bool, ack: Option<Ack>, keep: Duration) {
        let Some(Ack { got, held, took }) = ack else { return };
        if !done {
            return;
        }
        if self.replicas.record(write, got, took) {
            held.give_back();
        } else {
            self.replicas.keep_waiting(write, held, got, tokio::time::Instant::now() + keep, self.describe());
        }
    }

    /// A settle's or a release's reply on `key`, relied on as [`relied_on`](Self::relied_on)
    /// says, and noted for the data-loss alarm.
    fn settled_relied_on(
        &self,
        key: &RecordKey,
        write: Written,
        reply: i64,
        ack: Option<Ack>,
        keep: Duration,
    ) -> Result<Settled> {
        let result = settled(reply)?;
        if result == Settled::Done {
            self.journal.note(Wrote::End, key);
        }
        self.relied_on(write, result == Settled::Done, ack, keep);
        Ok(result)
    }

    /// A claim just made on `key` is relied on only once enough replicas hold it; too few in
    /// time, the claim is refused with a store error, and the caller gives it back (as any
    /// claim whose outcome it cannot trust) without forwarding anything.
    ///
    /// The claim itself went as any call, on the shared connections: most claims find a
    /// record (replays, duplicates) and must not wait for replicas, nor stall behind a `WAIT`
    /// (whose count, on a connection that ran one before, can include Redis's own request for
    /// acknowledgements, so that even a call that wrote nothing would wait for a frozen
    /// replica). So a claim that was made is covered afterwards: its expiry is written again
    /// (to the same claim ttl, a moment later: the lease mark moves by that moment) with a
    /// `WAIT` behind it, on a connection of its own. Replication is one stream, in order, so
    /// replicas that acknowledge that write hold the claim before it; and a connection that
    /// reconnected in between carries the write too. A record gone by then (`PEXPIRE` answers
    /// 0) was lost before anything was sent.
    async fn claim_replicated(&self, key: &RecordKey, ttl_ms: u64) -> Result<()> {
        let Some(wait) = self.wait() else { return Ok(()) };
        let mut touch = redis::cmd("PEXPIRE");
        touch.arg(key.as_str()).arg(ttl_ms);
        let (reply, ack) = self.transport.write(touch.into(), None, Some(wait)).await?;
        let Some(Ack { got, held, took }) = ack else { return Ok(()) };
        if Reply::integer(reply)? != 1 {
            return Err(StoreError::Unavailable("the claim was gone before its replicas acknowledged it".into()));
        }
        if self.replicas.record(Written::claim, got, took) {
            held.give_back();
            return Ok(());
        }
        self.replicas.claim_refused(got, &self.describe());
        Err(StoreError::Unreplicated { wanted: self.replicas.count(), got, within: self.replicas.timeout() })
    }
}

/// What a settle in `state` writes, for the replicas' metrics.
fn written(state: State) -> Written {
    match state {
        State::Unknown => Written::unknown,
        _ => Written::answer,
    }
}

impl Lifecycle for RedisStore {
    async fn claim(&self, key: &RecordKey, fp: &Fingerprint, owner: OwnerToken, terms: Terms) -> Result<Claim> {
        let Terms { lease, ttl } = terms;
        // The common cases in one native command: an absent key is claimed, a settled one
        // answered from the reply. A claim in progress or a released tombstone needs a
        // compare-and-set (register a waiter, take over, count the attempt): the script.
        // The lease began no earlier than this: counted from it, never from the reply.
        let sent = tokio::time::Instant::now();
        let (lease_ms, ttl_ms) = (ms(lease), ms(ttl.max(lease)));
        let mut set = redis::cmd("SET");
        set.arg(key.as_str()).arg(layout::claim(1, ttl_ms, lease_ms, fp, &owner));
        set.arg("NX").arg("GET").arg("PX").arg(ttl_ms);
        let existing: Option<Vec<u8>> = self.transport.query(set, None).await?;
        let Some(existing) = existing else {
            if self.replicas.wait().is_some() {
                // Boxed: only with replica_acks; inline, its state would swell every claim's.
                Box::pin(self.claim_replicated(key, ttl_ms)).await?;
            }
            self.journal.note(Wrote::Claim, key);
            return Ok(Claim::Acquired(Granted::new(Lease::new(key.clone(), owner, terms, sent), 1)));
        };
        let record = Record::parse(Bytes::from(existing))?;
        // The same order as claim.lua: a tombstone is claimable whatever the request; then the
        // fp, then the state.
        match record.state {
            State::Released => {}
            _ if !record.fingerprint_is(fp) => return Ok(Claim::Mismatch),
            State::Completed => return Ok(Claim::Completed(decode(record.response())?)),
            State::Executed => return Ok(Claim::Executed(decode(record.response())?)),
            State::Unknown => return Ok(Claim::Unknown { attempt: record.attempt }),
            State::InProgress => {}
        }
        let args = |cmd: &mut Cmd| {
            cmd.arg(&fp.as_bytes()[..]).arg(&owner.as_bytes()[..]).arg(lease_ms).arg(ttl_ms);
        };
        let reply = self.transport.eval_sized(&self.scripts.claim, &[key.as_str()], 0, args).await?;
        let mut items = Reply::array(reply)?;
        match items.tag()?.as_slice() {
            b"acquired" => {
                if self.replicas.wait().is_some() {
                    // Boxed: only with replica_acks; inline, its state would swell every claim's.
                    Box::pin(self.claim_replicated(key, ttl_ms)).await?;
                }
                self.journal.note(Wrote::Claim, key);
                Ok(Claim::Acquired(Granted::new(Lease::new(key.clone(), owner, terms, sent), items.attempt()?)))
            }
            b"completed" => Ok(Claim::Completed(items.response()?)),
            b"executed" => Ok(Claim::Executed(items.response()?)),
            b"unknown" => Ok(Claim::Unknown { attempt: items.attempt()? }),
            b"inflight" => Ok(Claim::InFlight { lease_left: Duration::from_millis(items.int()?.max(0) as u64) }),
            b"mismatch" => Ok(Claim::Mismatch),
            other => Err(protocol(&format!("unknown claim reply {:?}", String::from_utf8_lossy(other)))),
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        let reply = self
            .transport
            .eval(&self.scripts.renew, lease.key.as_str(), |cmd| {
                cmd.arg(&lease.owner.as_bytes()[..])
                    .arg(ms(lease.terms.lease))
                    .arg(ms(lease.terms.ttl.max(lease.terms.lease)));
            })
            .await?;
        match Reply::integer(reply)? {
            1 => Ok(Renewal::Renewed),
            _ => Ok(Renewal::Lost),
        }
    }

    async fn settle(&self, lease: &Lease, outcome: Final<'_>, retention: Duration) -> Result<Settled> {
        let state = outcome.state();
        let response = match outcome {
            Final::Response(r) | Final::Executed(r) => Some(r),
            Final::Unknown { trusted_in } => {
                let trusted_ms = u64::try_from(trusted_in.as_millis()).unwrap_or(u64::MAX);
                let tail = layout::unknown_tail(ms(retention), trusted_ms, &lease.owner);
                let args = |cmd: &mut Cmd| {
                    cmd.arg(&lease.owner.as_bytes()[..])
                        .arg(&[state.letter()][..])
                        .arg(&tail)
                        .arg(ms(retention))
                        .arg(&self.channel);
                };
                let key = [lease.key.as_str()];
                let (reply, ack) = self.transport.eval_write(&self.scripts.settle, &key, 0, args, self.wait()).await?;
                return self.settled_relied_on(
                    &lease.key,
                    Written::unknown,
                    Reply::integer(reply)?,
                    ack,
                    lease.terms.lease,
                );
            }
        };
        if let Some(large) = response.filter(|r| r.body.len() >= ASIDE_FROM) {
            // Held until Redis has answered: the copies the command makes live as long.
            let _room = self.transport.room(large.encoded_len()).await?;
            match self.settle_aside(lease, state, large, retention).await {
                // While its slot migrates, the record may still be on the source node and the
                // side key land on the target (ASK), or the two keys be split between them
                // (TRYAGAIN): the two-key settle cannot work until the migration ends, which
                // may take longer than the lease. The one-key settle, with the body as an
                // argument, follows the redirection like any one-key call. (The side key, if
                // it was written, expires with the claim.)
                Err(StoreError::Migrating(e)) => {
                    tracing::debug!(key = lease.key.short(), error = %e, "large settle met a slot migration; settling in one key");
                    // Had the two-key try landed after all, this one finds the record
                    // settled by this owner and says so.
                    return self.settle_in_place(lease, state, response, retention).await;
                }
                other => return other,
            }
        }
        self.settle_in_place(lease, state, response, retention).await
    }

    async fn release(&self, key: &RecordKey, owner: OwnerToken, sent: Sent, ttl: Duration) -> Result<Settled> {
        let sent = match sent {
            Sent::Maybe => "1",
            Sent::No => "0",
        };
        let args = |cmd: &mut Cmd| {
            cmd.arg(&owner.as_bytes()[..]).arg(sent).arg(ms(ttl)).arg(&self.channel);
        };
        let (reply, ack) =
            self.transport.eval_write(&self.scripts.release, &[key.as_str()], 0, args, self.wait()).await?;
        self.settled_relied_on(key, Written::release, Reply::integer(reply)?, ack, ttl)
    }

    async fn ping(&self) -> Result<()> {
        if !self.transport.links.is_cluster() {
            let _: String = self.transport.query(redis::cmd("PING"), None).await?;
            return Ok(());
        }
        // A PING would go to every primary and fail while any one is down, although the
        // other shards serve their keys (and the routes' on_store_error handles the rest):
        // a Cluster is ready when one node says the cluster is.
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("INFO");
        let info: String = self.transport.query(cmd, None).await?;
        match info.lines().any(|line| line.trim() == "cluster_state:ok") {
            true => Ok(()),
            false => Err(StoreError::Unavailable("the Redis Cluster reports cluster_state:fail".into())),
        }
    }

    fn watch(&self, key: &RecordKey) -> Watch {
        let poll = if self.subscribed.load(Ordering::Acquire) { POLL_SUBSCRIBED } else { POLL_UNSUBSCRIBED };
        self.waiters.watch(key.as_str(), Some(poll))
    }
}

impl Lookups for RedisStore {
    async fn lookup(&self, key: &RecordKey, fp: &Fingerprint, token: OwnerToken, lease: Duration) -> Result<Lookup> {
        let reply = self.transport.eval(&self.scripts.lookup, key.as_str(), |cmd| {
            cmd.arg("begin").arg(&fp.as_bytes()[..]).arg(&token.as_bytes()[..]).arg(ms(lease));
        });
        let mut items = Reply::array(reply.await?)?;
        match items.tag()?.as_slice() {
            b"started" => Ok(Lookup::Started { attempt: items.attempt()? }),
            b"busy" => Ok(Lookup::Busy { left: Duration::from_millis(items.int()?.max(0) as u64) }),
            b"moved" => Ok(Lookup::Moved),
            other => Err(protocol(&format!("unknown lookup reply {:?}", String::from_utf8_lossy(other)))),
        }
    }

    async fn end_lookup(&self, key: &RecordKey, token: OwnerToken, end: LookupEnd<'_>) -> Result<LookupEnded> {
        let token = &token.as_bytes()[..];
        let args = |cmd: &mut Cmd| {
            match end {
                LookupEnd::Found { response, retention } => {
                    cmd.arg("found").arg(token).arg(Encoded(response)).arg(ms(retention))
                }
                LookupEnd::NotFound { ttl } => cmd.arg("absent").arg(token).arg(ms(ttl)),
                LookupEnd::Failed => cmd.arg("failed").arg(token),
            };
            cmd.arg(&self.channel);
        };
        // A found answer or a released key is what the retry waiting on it relies on; a
        // failed lookup changes nothing a failover could lose.
        let wait = self.wait().filter(|_| !matches!(end, LookupEnd::Failed));
        let (reply, ack) = self.transport.eval_write(&self.scripts.lookup, &[key.as_str()], 0, args, wait).await?;
        let mut items = Reply::array(reply)?;
        let tag = items.tag()?;
        // Kept waited for, if too few replicas answered, as long as a lookup may take.
        self.relied_on(Written::lookup, tag == b"done", ack, self.transport.timeout() * 10);
        match tag.as_slice() {
            b"done" => Ok(LookupEnded::Done),
            b"early" => Ok(LookupEnded::TooEarly { left: Duration::from_millis(items.int()?.max(1) as u64) }),
            b"lost" => Ok(LookupEnded::Lost),
            other => Err(protocol(&format!("unknown lookup reply {:?}", String::from_utf8_lossy(other)))),
        }
    }
}

/// A response as a script argument, encoded straight into the command's buffer: the body is
/// copied once, not into an intermediate record first.
pub(super) struct Encoded<'a>(pub &'a StoredResponse);

/// A response as a side key holds it: room for the record's header, then the response.
struct Aside<'a>(&'a StoredResponse);

impl ToRedisArgs for Aside<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        // The command buffer is memory; writing to it cannot fail.
        let _ = std::io::Write::write_all(&mut arg, &[0; layout::HEADER]);
        let _ = self.0.write_encoded(&mut arg);
    }
}

impl ToRedisArgs for Encoded<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        // The command buffer is memory; writing to it cannot fail.
        let _ = self.0.write_encoded(&mut out.writer_for_next_arg());
    }
}

fn decode(response: Bytes) -> Result<StoredResponse> {
    StoredResponse::decode(response).map_err(|e| protocol(&e.to_string()))
}

pub(super) fn settled(n: i64) -> Result<Settled> {
    Ok(if n == 1 { Settled::Done } else { Settled::Lost })
}
