//! Model-based test of the store: a reference model of the states of a key, with time moved
//! explicitly, runs thousands of generated operation sequences against the memory store and
//! against the Lua scripts on a private `redis-server`, and every result must match the model.
//!
//! The model is the state of a key as docs/architecture.md draws it ("The state of a key"),
//! one record per key, with exact times (ms), which the drawing leaves out:
//!
//! - a claim that acquires (absent, released, or a lapsed lease taken over) sets the lease
//!   deadline to now + lease and the expiry to now + max(ttl, lease); a claim of a released
//!   record or a takeover counts attempt + 1; a live lease answers InFlight{deadline - now};
//! - the fingerprint is compared first: any record but a released one answers Mismatch to
//!   another fingerprint;
//! - renew sets the deadline to now + lease, and the expiry to now + ttl when less than a lease
//!   is left of it; settle expires the record now + retention; release expires it now + ttl,
//!   with attempt - 1 when the request was not sent (absent when that leaves attempt 0); purge
//!   keeps the expiry, and leaves a live lease alone unless forced (Refused{deadline - now});
//! - a record whose expiry is <= now is absent.
//!
//! Renew, settle and release by anyone but the current owner are `Lost` and write nothing;
//! the owner may still settle after its own deadline as long as nobody took over, and a settle
//! it sends again (its first reply lost) finds its own outcome and is `Done`.
//!
//! Time: the memory store reads tokio's clock, which is paused and advanced exactly. Redis
//! keeps its own clock, which cannot be paused; see [`SHIFT`] for how the test moves it and
//! why the small amount of real time that passes during a case cannot change any result.

use crate::support;

use std::cell::RefCell;
use std::fmt::Write as _;
use std::time::{Duration, Instant as RealInstant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use idemgate::policy::fingerprint::Fingerprint;
use idemgate::store::{
    Claim, EntryState, Final, Granted, Lifecycle, MemoryStore, Operator, OwnerToken, Purged, RecordKey, Records,
    RedisStore, Renewal, Sent, Settled, State, StoredResponse, Terms,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use support::redis::RedisServer;

// ---- parameters ------------------------------------------------------------------------

/// Lease, open-claim ttl and retention, in ms. Every duration and every advance is a whole
/// number of seconds (the Redis drift argument at [`SHIFT`] depends on it), and the advances
/// hit each of them exactly, so the `deadline == now` and `expiry == now` ties are exercised;
/// 50 s and 55 s bring an open claim to (and below) one lease before its ttl, where renew
/// raises the ttl. The ttl is above the lease, as the gateway always passes
/// (`max(lease, retention)`); a ttl below the lease is raised to the lease by both stores,
/// which `MemoryStore`'s unit tests cover.
const LEASE_MS: u64 = 10_000;
const TTL_MS: u64 = 60_000;
const RETENTION_MS: u64 = 30_000;
const ADVANCES_MS: [u64; 11] = [0, 1_000, 4_000, 9_000, 10_000, 11_000, 30_000, 50_000, 55_000, 60_000, 120_000];

const LEASE: Duration = Duration::from_millis(LEASE_MS);
const TTL: Duration = Duration::from_millis(TTL_MS);
const RETENTION: Duration = Duration::from_millis(RETENTION_MS);

const KEYS: usize = 3;
const FINGERPRINTS: u8 = 2;
const RESPONSES: usize = 3;
/// Lease handles are picked as `index % held`; a few more indices than usual handles.
const LEASE_INDICES: usize = 8;

/// How far behind the model a duration reported by Redis may be: the real time a case takes.
const DRIFT_MS: u64 = 500;

const MEMORY_CASES: u32 = 4_000;
const REDIS_CASES: u32 = 2_000;

// ---- operations ------------------------------------------------------------------------

/// One step of a generated sequence. `lease` picks a held lease handle (`index % held`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Claim {
        key: usize,
        fp: u8,
    },
    Renew {
        lease: usize,
    },
    Settle {
        lease: usize,
        end: End,
    },
    /// The last lease settled sends a settle again (its first reply was lost, say).
    SettleAgain {
        end: End,
    },
    Release {
        lease: usize,
        sent: bool,
    },
    Get {
        key: usize,
    },
    Purge {
        key: usize,
        force: bool,
    },
    Advance {
        ms: u64,
    },
}

/// How a settle ends a claim: a stored response, an executed head, or unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Response(usize),
    Executed(usize),
    Unknown,
}

fn end() -> impl Strategy<Value = End> {
    prop_oneof![
        3 => (0..RESPONSES).prop_map(End::Response),
        1 => (0..RESPONSES).prop_map(End::Executed),
        1 => Just(End::Unknown),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..KEYS, 0..FINGERPRINTS).prop_map(|(key, fp)| Op::Claim { key, fp }),
        2 => (0..LEASE_INDICES).prop_map(|lease| Op::Renew { lease }),
        2 => (0..LEASE_INDICES, end()).prop_map(|(lease, end)| Op::Settle { lease, end }),
        1 => end().prop_map(|end| Op::SettleAgain { end }),
        1 => (0..LEASE_INDICES, any::<bool>()).prop_map(|(lease, sent)| Op::Release { lease, sent }),
        2 => (0..KEYS).prop_map(|key| Op::Get { key }),
        1 => (0..KEYS, any::<bool>()).prop_map(|(key, force)| Op::Purge { key, force }),
        3 => prop::sample::select(&ADVANCES_MS[..]).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..=40)
}

/// What the model says an operation returns (durations in ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Acquired {
        attempt: u32,
    },
    Replayed {
        response: usize,
    },
    ExecutedReplay {
        response: usize,
    },
    UnknownRefused {
        attempt: u32,
    },
    InFlight {
        lease_left_ms: u64,
    },
    Mismatch,
    Renewed,
    Done,
    Lost,
    /// Renew/complete/release with no lease handle held: nothing is called.
    NoLease,
    Absent,
    InProgress {
        attempt: u32,
        lease_left_ms: u64,
        expires_in_ms: u64,
    },
    Completed {
        attempt: u32,
        response: usize,
        expires_in_ms: u64,
    },
    ExecutedEntry {
        attempt: u32,
        response: usize,
        expires_in_ms: u64,
    },
    UnknownEntry {
        attempt: u32,
        expires_in_ms: u64,
    },
    ReleasedEntry {
        attempt: u32,
        expires_in_ms: u64,
    },
    Purged(Purged),
    Advanced,
}

// ---- the model -------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Record {
    InProgress {
        fp: u8,
        attempt: u32,
        owner: u64,
        deadline: u64,
        expires: u64,
    },
    /// `by`: the owner whose settle wrote it.
    Completed {
        fp: u8,
        attempt: u32,
        response: usize,
        expires: u64,
        by: u64,
    },
    Executed {
        fp: u8,
        attempt: u32,
        response: usize,
        expires: u64,
        by: u64,
    },
    Unknown {
        fp: u8,
        attempt: u32,
        expires: u64,
        by: u64,
    },
    Released {
        attempt: u32,
        expires: u64,
    },
}

impl Record {
    fn expires(&self) -> u64 {
        match self {
            Record::InProgress { expires, .. }
            | Record::Completed { expires, .. }
            | Record::Executed { expires, .. }
            | Record::Unknown { expires, .. }
            | Record::Released { expires, .. } => *expires,
        }
    }

    fn attempt(&self) -> u32 {
        match self {
            Record::InProgress { attempt, .. }
            | Record::Completed { attempt, .. }
            | Record::Executed { attempt, .. }
            | Record::Unknown { attempt, .. }
            | Record::Released { attempt, .. } => *attempt,
        }
    }

    /// The fingerprint a claim is compared with; a released record has none.
    fn fp(&self) -> Option<u8> {
        match self {
            Record::InProgress { fp, .. }
            | Record::Completed { fp, .. }
            | Record::Executed { fp, .. }
            | Record::Unknown { fp, .. } => Some(*fp),
            Record::Released { .. } => None,
        }
    }
}

/// How often interesting transitions happened, to show (and check) what the generator reaches.
#[derive(Debug, Default)]
struct Stats {
    cases: u64,
    ops: u64,
    acquired: u64,
    takeovers: u64,
    takeovers_at_exact_deadline: u64,
    in_flight: u64,
    replays: u64,
    mismatches: u64,
    stale_owner_lost: u64,
    owner_acted_after_own_deadline: u64,
    renew_raised_ttl: u64,
    open_claims_expired: u64,
    open_claims_expired_exactly: u64,
    completed_expired: u64,
    completed_expired_exactly: u64,
    released_claimed: u64,
    released_not_sent_gone: u64,
    executed_replays: u64,
    unknown_refused: u64,
    purged: u64,
    purges_refused: u64,
    settled_again: u64,
    redis_renew_ties: u64,
    redis_renew_ties_raised: u64,
}

#[derive(Default)]
struct Model {
    now: u64,
    next_owner: u64,
    records: [Option<Record>; KEYS],
}

impl Model {
    /// Returns the outcome and, when acquired, the model's name for the new owner.
    fn claim(&mut self, key: usize, fp: u8, stats: &mut Stats) -> (Outcome, Option<u64>) {
        let now = self.now;
        self.next_owner += 1;
        let owner = self.next_owner;
        let fresh = |attempt| Record::InProgress {
            fp,
            attempt,
            owner,
            deadline: now + LEASE_MS,
            expires: now + TTL_MS.max(LEASE_MS),
        };
        let record = &mut self.records[key];
        let outcome = match record {
            None => {
                *record = Some(fresh(1));
                Outcome::Acquired { attempt: 1 }
            }
            Some(Record::Released { attempt, .. }) => {
                stats.released_claimed += 1;
                let attempt = *attempt + 1;
                *record = Some(fresh(attempt));
                Outcome::Acquired { attempt }
            }
            Some(r) if r.fp() != Some(fp) => Outcome::Mismatch,
            Some(Record::Completed { response, .. }) => Outcome::Replayed { response: *response },
            Some(Record::Executed { response, .. }) => {
                stats.executed_replays += 1;
                Outcome::ExecutedReplay { response: *response }
            }
            Some(Record::Unknown { attempt, .. }) => {
                stats.unknown_refused += 1;
                Outcome::UnknownRefused { attempt: *attempt }
            }
            Some(Record::InProgress { deadline, .. }) if *deadline > now => {
                Outcome::InFlight { lease_left_ms: *deadline - now }
            }
            Some(Record::InProgress { attempt, deadline, .. }) => {
                stats.takeovers += 1;
                stats.takeovers_at_exact_deadline += u64::from(*deadline == now);
                let attempt = *attempt + 1;
                *record = Some(fresh(attempt));
                Outcome::Acquired { attempt }
            }
        };
        match outcome {
            Outcome::Acquired { .. } => stats.acquired += 1,
            Outcome::Mismatch => stats.mismatches += 1,
            Outcome::Replayed { .. } => stats.replays += 1,
            Outcome::InFlight { .. } => stats.in_flight += 1,
            _ => {}
        }
        (outcome, matches!(outcome, Outcome::Acquired { .. }).then_some(owner))
    }

    /// The open claim of `key` if `owner` holds it.
    fn owned(&mut self, key: usize, owner: u64, stats: &mut Stats) -> Option<&mut Record> {
        let now = self.now;
        let record = self.records[key].as_mut()?;
        let Record::InProgress { owner: holder, deadline, .. } = record else { return None };
        if *holder != owner {
            stats.stale_owner_lost += 1;
            return None;
        }
        stats.owner_acted_after_own_deadline += u64::from(*deadline <= now);
        Some(record)
    }

    /// Whether a renew by `owner` meets the one tie real time can decide on Redis (see [`SHIFT`]).
    fn renew_is_tie(&self, key: usize, owner: u64) -> bool {
        matches!(&self.records[key], Some(Record::InProgress { owner: o, expires, .. })
            if *o == owner && *expires - self.now == LEASE_MS)
    }

    fn renew(&mut self, key: usize, owner: u64, stats: &mut Stats) -> Outcome {
        let now = self.now;
        let Some(Record::InProgress { deadline, expires, .. }) = self.owned(key, owner, stats) else {
            return Outcome::Lost;
        };
        *deadline = now + LEASE_MS;
        if *expires - now < LEASE_MS {
            stats.renew_raised_ttl += 1;
            *expires = now + TTL_MS.max(LEASE_MS);
        }
        Outcome::Renewed
    }

    /// On Redis, after a renew at the tie: Redis raised the record ttl (`raised`) or not.
    fn settle_renew_tie(&mut self, key: usize, raised: bool) {
        if raised && let Some(Record::InProgress { expires, .. }) = &mut self.records[key] {
            *expires = self.now + TTL_MS.max(LEASE_MS);
        }
    }

    fn settle(&mut self, key: usize, owner: u64, end: End, stats: &mut Stats) -> Outcome {
        let now = self.now;
        // The same settle sent again by the owner that wrote the record: done already.
        let again = match (&self.records[key], end) {
            (Some(Record::Completed { by, .. }), End::Response(_))
            | (Some(Record::Executed { by, .. }), End::Executed(_))
            | (Some(Record::Unknown { by, .. }), End::Unknown) => *by == owner,
            _ => false,
        };
        if again {
            stats.settled_again += 1;
            // The repeat is a write too: its retention starts again (so that replicas can be
            // asked to acknowledge it).
            if let Some(
                Record::Completed { expires, .. } | Record::Executed { expires, .. } | Record::Unknown { expires, .. },
            ) = &mut self.records[key]
            {
                *expires = now + RETENTION_MS;
            }
            return Outcome::Done;
        }
        let Some(&mut Record::InProgress { fp, attempt, .. }) = self.owned(key, owner, stats) else {
            return Outcome::Lost;
        };
        let expires = now + RETENTION_MS;
        self.records[key] = Some(match end {
            End::Response(response) => Record::Completed { fp, attempt, response, expires, by: owner },
            End::Executed(response) => Record::Executed { fp, attempt, response, expires, by: owner },
            End::Unknown => Record::Unknown { fp, attempt, expires, by: owner },
        });
        Outcome::Done
    }

    fn release(&mut self, key: usize, owner: u64, sent: bool, stats: &mut Stats) -> Outcome {
        let now = self.now;
        let Some(&mut Record::InProgress { attempt, .. }) = self.owned(key, owner, stats) else {
            return Outcome::Lost;
        };
        let attempt = if sent { attempt } else { attempt - 1 };
        if attempt == 0 {
            stats.released_not_sent_gone += 1;
            self.records[key] = None;
        } else {
            self.records[key] = Some(Record::Released { attempt, expires: now + TTL_MS.max(LEASE_MS) });
        }
        Outcome::Done
    }

    fn get(&self, key: usize) -> Outcome {
        let now = self.now;
        match &self.records[key] {
            None => Outcome::Absent,
            Some(Record::InProgress { attempt, deadline, expires, .. }) => Outcome::InProgress {
                attempt: *attempt,
                lease_left_ms: deadline.saturating_sub(now),
                expires_in_ms: expires - now,
            },
            Some(Record::Completed { attempt, response, expires, .. }) => {
                Outcome::Completed { attempt: *attempt, response: *response, expires_in_ms: expires - now }
            }
            Some(Record::Executed { attempt, response, expires, .. }) => {
                Outcome::ExecutedEntry { attempt: *attempt, response: *response, expires_in_ms: expires - now }
            }
            Some(Record::Unknown { attempt, expires, .. }) => {
                Outcome::UnknownEntry { attempt: *attempt, expires_in_ms: expires - now }
            }
            Some(Record::Released { attempt, expires }) => {
                Outcome::ReleasedEntry { attempt: *attempt, expires_in_ms: expires - now }
            }
        }
    }

    fn purge(&mut self, key: usize, force: bool, stats: &mut Stats) -> Outcome {
        let Some(record) = &self.records[key] else { return Outcome::Purged(Purged::Nothing) };
        let was = match record {
            Record::InProgress { deadline, .. } if !force && *deadline > self.now => {
                stats.purges_refused += 1;
                return Outcome::Purged(Purged::Refused { lease_left: Duration::from_millis(deadline - self.now) });
            }
            Record::InProgress { .. } => State::InProgress,
            Record::Completed { .. } => State::Completed,
            Record::Executed { .. } => State::Executed,
            Record::Unknown { .. } => State::Unknown,
            Record::Released { .. } => return Outcome::Purged(Purged::Nothing),
        };
        stats.purged += 1;
        self.records[key] = Some(Record::Released { attempt: record.attempt(), expires: record.expires() });
        Outcome::Purged(Purged::Released { was })
    }

    fn advance(&mut self, ms: u64, stats: &mut Stats) -> Outcome {
        self.now += ms;
        for record in &mut self.records {
            let Some(r) = record else { continue };
            if r.expires() <= self.now {
                let exactly = u64::from(r.expires() == self.now);
                match r {
                    Record::InProgress { .. } => {
                        stats.open_claims_expired += 1;
                        stats.open_claims_expired_exactly += exactly;
                    }
                    _ => {
                        stats.completed_expired += 1;
                        stats.completed_expired_exactly += exactly;
                    }
                }
                *record = None;
            }
        }
        Outcome::Advanced
    }
}

// ---- time on each backend --------------------------------------------------------------

/// Moves the Redis side of a case `ARGV[1]` ms into the future, deterministically.
///
/// Why this is the passage of time for the store: the only instant a record has is the key's
/// expiry, set relative to the present (SET PX, PEXPIRE) and read relative to it (PTTL). The
/// lease ends at a mark on that same clock (the lease lives while PTTL > mark, see the store's
/// `layout.rs`); no field holds a time. So the store only ever sees `expiry - now`, and
/// lowering the expiry by `ms` changes it, and the lease left, exactly as `now` growing by
/// `ms` would: every later call runs as if `ms` had passed. The shift is exact: it uses
/// PEXPIRETIME/PEXPIREAT (absolute), not PTTL/PEXPIRE, so no real time leaks in between the
/// read and the write. Expiry by the passage of time is the key's removal: a key whose shifted
/// expiry is at or before the present is deleted, as the memory store and the model drop a
/// record whose expiry is <= now. This relies on the record layout on purpose (no time in a
/// field): the test knows it so that it can run the real commands and scripts with time under
/// its control. PEXPIRETIME needs Redis 7.0 or later.
///
/// Why the little real time that passes during a case cannot change a result. Every duration
/// (lease, ttl, retention) and every advance is a whole number of seconds, so every instant
/// the model compares with its present (a deadline, an expiry) is m ms away with m a multiple
/// of 1000. Redis sees m - r, where r >= 0 is the real time in whole ms since the command that
/// wrote the instant ran (key expiry is kept in ms); a case takes a few ms of
/// real time, and the argument needs r < DRIFT_MS (500):
/// - lease live (claim.lua: `PTTL - mark > 0`, the lease left m - r): m >= 1000 gives
///   m - r > 500 > 0, live on both sides; m <= 0 gives m - r <= 0, passed on both. That
///   includes the exact tie m = 0 (an advance lands on the deadline), which the model, the
///   memory store and the script all treat as passed (`deadline > now` is live): Redis sees
///   -r <= 0, passed whatever r is.
/// - record alive: between advances no key nears its expiry by real time (a key that survived
///   the last shift has m >= 1000, so m - r > 0); expiry happens only in this script, which
///   decides on m' = m - ms: m' <= 0 gives m' - r <= 0, deleted; m' >= 1000 gives m' - r > 0,
///   kept; the tie m' = 0 is deleted, as in the model.
/// - durations Redis reports (InFlight and Entry lease_left, Entry expires_in) are m - r
///   (lease_left clamped at 0, exactly 0 when m <= 0): the test accepts m - 500 <= d <= m,
///   which no other model value (a multiple of 1000 away) could satisfy.
/// - the one comparison this does NOT settle: renew.lua raises the record ttl when
///   `PTTL < lease`, a time left against a duration. At the tie m == lease (e.g. a 60 s ttl,
///   50 s of advances, then a renew) the model and the memory store say 10000 < 10000 is
///   false, while Redis compares 10000 - r < 10000, true as soon as one real ms has passed
///   since the ttl was set. Both outcomes are correct there (the record then lives exactly as
///   long as the lease, or longer), so on Redis the test reads the record's PTTL right after
///   such a renew, checks that it is one of the two outcomes, and lets the model follow.
const SHIFT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ms = tonumber(ARGV[1])
for _, key in ipairs(KEYS) do
  local at = redis.call('PEXPIRETIME', key)
  if at == -1 then
    return redis.error_reply('record without expiry: ' .. key)
  end
  if at >= 0 then
    if at - ms <= now then
      redis.call('DEL', key)
    else
      redis.call('PEXPIREAT', key, at - ms)
    end
  end
end
return 0
";

/// The Redis side: a plain connection to the same server, for the shift and the tie reads.
struct RedisClock {
    conn: RefCell<::redis::Connection>,
    shift: ::redis::Script,
}

impl RedisClock {
    fn new(server: &RedisServer) -> Self {
        Self { conn: RefCell::new(server.connection()), shift: ::redis::Script::new(SHIFT) }
    }
}

enum Clock<'a> {
    /// tokio's paused clock, read by the memory store: exact.
    Paused,
    /// Redis's own clock, moved by [`SHIFT`]: durations within [`DRIFT_MS`].
    Redis(&'a RedisClock),
}

impl Clock<'_> {
    /// Whether `actual` is what the model's `model_ms` looks like on this backend.
    fn matches(&self, model_ms: u64, actual: Duration) -> bool {
        match self {
            Clock::Paused => actual == Duration::from_millis(model_ms),
            Clock::Redis(_) => {
                let actual = actual.as_millis();
                u128::from(model_ms.saturating_sub(DRIFT_MS)) <= actual && actual <= u128::from(model_ms)
            }
        }
    }

    async fn advance(&self, ms: u64, keys: &[RecordKey]) -> Result<(), String> {
        match self {
            Clock::Paused => {
                tokio::time::advance(Duration::from_millis(ms)).await;
                Ok(())
            }
            Clock::Redis(redis) => {
                let mut invocation = redis.shift.prepare_invoke();
                for key in keys {
                    invocation.key(key.as_str());
                }
                invocation.arg(ms);
                invocation.invoke::<i64>(&mut *redis.conn.borrow_mut()).map(drop).map_err(|e| format!("shift: {e}"))
            }
        }
    }

    /// After a renew at the tie (see [`SHIFT`]): whether Redis raised the record ttl. `None`
    /// when the record's ttl is neither of the two correct outcomes.
    fn renew_tie_raised(&self, key: &RecordKey) -> Result<Option<bool>, String> {
        let Clock::Redis(redis) = self else { return Ok(Some(false)) };
        let pttl: i64 =
            ::redis::cmd("PTTL").arg(key.as_str()).query(&mut *redis.conn.borrow_mut()).map_err(|e| e.to_string())?;
        let within = |model_ms: u64| self.matches(model_ms, Duration::from_millis(pttl.max(0) as u64));
        Ok(if within(TTL_MS.max(LEASE_MS)) {
            Some(true)
        } else if within(LEASE_MS) {
            Some(false)
        } else {
            None
        })
    }

    fn cleanup(&self, keys: &[RecordKey]) {
        if let Clock::Redis(redis) = self {
            let mut del = ::redis::cmd("DEL");
            for key in keys {
                del.arg(key.as_str());
            }
            let _: Result<i64, _> = del.query(&mut *redis.conn.borrow_mut());
        }
    }
}

// ---- fixtures --------------------------------------------------------------------------

fn fingerprint(fp: u8) -> Fingerprint {
    Fingerprint::from_bytes([fp + 1; 32])
}

/// Fresh record keys; `prefix` keeps cases sharing one Redis apart.
fn record_keys(prefix: &str) -> [RecordKey; KEYS] {
    std::array::from_fn(|n| support::record_key(prefix, &format!("key-{n}")))
}

/// Distinct responses: statuses, repeated and opaque header values, binary bodies.
fn responses() -> [StoredResponse; RESPONSES] {
    let mut json = HeaderMap::new();
    json.insert("content-type", HeaderValue::from_static("application/json"));
    json.append("x-multi", HeaderValue::from_static("1"));
    json.append("x-multi", HeaderValue::from_static("2"));
    let mut opaque = HeaderMap::new();
    opaque.insert("x-bytes", HeaderValue::from_bytes(b"\xffopaque\x80").unwrap());
    opaque.insert("content-type", HeaderValue::from_static("application/octet-stream"));
    [
        StoredResponse {
            status: StatusCode::CREATED,
            headers: json,
            body: Bytes::from_static(b"{\"order_id\":7}\x00\xff\r\n").into(),
        },
        StoredResponse {
            status: StatusCode::OK,
            headers: opaque,
            body: Bytes::from((0..=255u8).collect::<Vec<_>>()).into(),
        },
        StoredResponse {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            headers: HeaderMap::new(),
            body: Bytes::new().into(),
        },
    ]
}

/// The head of a response, as an executed record keeps it: status and headers, no body.
fn head(r: &StoredResponse) -> StoredResponse {
    StoredResponse { status: r.status, headers: r.headers.clone(), body: Bytes::new().into() }
}

// ---- the interpreter -------------------------------------------------------------------

/// A lease handle of the sequence: the real lease and the model's name for its owner.
struct Held {
    key: usize,
    owner: u64,
    lease: Granted,
}

/// Runs `ops` against `store` and the model; fails at the first difference. Returns the
/// model's outcomes.
async fn run_case<S: Lifecycle + Operator + Records>(
    store: &S,
    clock: &Clock<'_>,
    keys: &[RecordKey; KEYS],
    ops: &[Op],
    stats: &mut Stats,
) -> Result<Vec<Outcome>, TestCaseError> {
    let started = RealInstant::now();
    let responses = responses();
    let mut model = Model::default();
    let mut held: Vec<Held> = Vec::new();
    // The last lease settled, kept so that it can send its settle again.
    let mut last_settled: Option<Held> = None;
    let mut trace: Vec<Outcome> = Vec::new();
    stats.cases += 1;

    let fail = |i: usize, trace: &[Outcome], what: String| {
        let mut msg = String::new();
        for (j, (op, outcome)) in ops.iter().zip(trace).enumerate() {
            let _ = writeln!(msg, "  #{j:<2} {op:?} -> {outcome:?}");
        }
        let _ = writeln!(msg, "  #{i:<2} {:?}: {what}", ops[i]);
        if let Clock::Redis(_) = clock {
            let _ = write!(
                msg,
                "  (the case ran {:?} of real time; Redis durations are compared within {DRIFT_MS}ms)",
                started.elapsed()
            );
        }
        TestCaseError::fail(format!("the store diverged from the model:\n{msg}"))
    };
    let store_error =
        |i: usize, trace: &[Outcome], e: idemgate::store::StoreError| fail(i, trace, format!("store error: {e}"));

    for (i, &op) in ops.iter().enumerate() {
        stats.ops += 1;
        let outcome = match op {
            Op::Claim { key, fp } => {
                let (expected, owner) = model.claim(key, fp, stats);
                let actual = store
                    .claim(&keys[key], &fingerprint(fp), OwnerToken::generate(), Terms { lease: LEASE, ttl: TTL })
                    .await
                    .map_err(|e| store_error(i, &trace, e))?;
                let same = match (&expected, &actual) {
                    (Outcome::Acquired { attempt }, Claim::Acquired(lease)) => {
                        lease.attempt() == *attempt && lease.key() == &keys[key] && lease.duration() == LEASE
                    }
                    (Outcome::Replayed { response }, Claim::Completed(r)) => *r == responses[*response],
                    (Outcome::ExecutedReplay { response }, Claim::Executed(r)) => *r == head(&responses[*response]),
                    (Outcome::UnknownRefused { attempt }, Claim::Unknown { attempt: a }) => attempt == a,
                    (Outcome::InFlight { lease_left_ms }, Claim::InFlight { lease_left }) => {
                        clock.matches(*lease_left_ms, *lease_left)
                    }
                    (Outcome::Mismatch, Claim::Mismatch) => true,
                    _ => false,
                };
                if !same {
                    return Err(fail(i, &trace, format!("model {expected:?}, store {actual:?}")));
                }
                if let (Claim::Acquired(lease), Some(owner)) = (actual, owner) {
                    held.push(Held { key, owner, lease });
                }
                expected
            }
            Op::Renew { lease } if !held.is_empty() => {
                let h = &held[lease % held.len()];
                let tie = matches!(clock, Clock::Redis(_)) && model.renew_is_tie(h.key, h.owner);
                let expected = model.renew(h.key, h.owner, stats);
                let actual = store.renew(&h.lease).await.map_err(|e| store_error(i, &trace, e))?;
                let want = if expected == Outcome::Renewed { Renewal::Renewed } else { Renewal::Lost };
                if actual != want {
                    return Err(fail(i, &trace, format!("model {expected:?}, store {actual:?}")));
                }
                if tie {
                    stats.redis_renew_ties += 1;
                    match clock.renew_tie_raised(&keys[h.key]).map_err(|e| fail(i, &trace, e))? {
                        Some(raised) => {
                            stats.redis_renew_ties_raised += u64::from(raised);
                            model.settle_renew_tie(h.key, raised);
                        }
                        None => {
                            return Err(fail(i, &trace, "renew at the ttl/lease tie left neither outcome".into()));
                        }
                    }
                }
                expected
            }
            Op::Settle { lease, end } if !held.is_empty() => {
                let h = held.remove(lease % held.len());
                let expected = model.settle(h.key, h.owner, end, stats);
                let executed;
                let outcome = match end {
                    End::Response(r) => Final::Response(&responses[r]),
                    End::Executed(r) => {
                        executed = head(&responses[r]);
                        Final::Executed(&executed)
                    }
                    End::Unknown => Final::Unknown { trusted_in: Duration::ZERO },
                };
                let actual = store.settle(&h.lease, outcome, RETENTION).await.map_err(|e| store_error(i, &trace, e))?;
                settled(expected, actual).map_err(|what| fail(i, &trace, what))?;
                last_settled = Some(h);
                expected
            }
            Op::SettleAgain { end } if last_settled.is_some() => {
                let Some(h) = &last_settled else { unreachable!() };
                let expected = model.settle(h.key, h.owner, end, stats);
                let executed;
                let outcome = match end {
                    End::Response(r) => Final::Response(&responses[r]),
                    End::Executed(r) => {
                        executed = head(&responses[r]);
                        Final::Executed(&executed)
                    }
                    End::Unknown => Final::Unknown { trusted_in: Duration::ZERO },
                };
                let actual = store.settle(&h.lease, outcome, RETENTION).await.map_err(|e| store_error(i, &trace, e))?;
                settled(expected, actual).map_err(|what| fail(i, &trace, what))?;
                expected
            }
            Op::Release { lease, sent } if !held.is_empty() => {
                let Held { key, owner, lease } = held.remove(lease % held.len());
                let expected = model.release(key, owner, sent, stats);
                let (record, token, ttl) = lease.into_lease().into_release();
                let sent_as = if sent { Sent::Maybe } else { Sent::No };
                let actual =
                    store.release(&record, token, sent_as, ttl).await.map_err(|e| store_error(i, &trace, e))?;
                settled(expected, actual).map_err(|what| fail(i, &trace, what))?;
                expected
            }
            Op::Renew { .. } | Op::Settle { .. } | Op::SettleAgain { .. } | Op::Release { .. } => Outcome::NoLease,
            Op::Get { key } => {
                let expected = model.get(key);
                let actual = store.get(&keys[key]).await.map_err(|e| store_error(i, &trace, e))?;
                let same = match (&expected, &actual) {
                    (Outcome::Absent, None) => true,
                    (_, None) => false,
                    (expected, Some(entry)) => {
                        let (attempt, expires_in_ms) = match *expected {
                            Outcome::InProgress { attempt, expires_in_ms, .. }
                            | Outcome::Completed { attempt, expires_in_ms, .. }
                            | Outcome::ExecutedEntry { attempt, expires_in_ms, .. }
                            | Outcome::UnknownEntry { attempt, expires_in_ms }
                            | Outcome::ReleasedEntry { attempt, expires_in_ms } => (attempt, expires_in_ms),
                            _ => (0, 0),
                        };
                        let state = match (expected, &entry.state) {
                            (Outcome::InProgress { lease_left_ms, .. }, EntryState::InProgress { lease_left }) => {
                                clock.matches(*lease_left_ms, *lease_left)
                            }
                            (Outcome::Completed { response, .. }, EntryState::Completed { status, body_len }) => {
                                let r = &responses[*response];
                                *status == r.status.as_u16() && *body_len == r.body.len()
                            }
                            (Outcome::ExecutedEntry { response, .. }, EntryState::Executed { status }) => {
                                *status == responses[*response].status.as_u16()
                            }
                            (Outcome::UnknownEntry { .. }, EntryState::Unknown { .. })
                            | (Outcome::ReleasedEntry { .. }, EntryState::Released) => true,
                            _ => false,
                        };
                        state && entry.attempt == attempt && clock.matches(expires_in_ms, entry.expires_in)
                    }
                };
                if !same {
                    return Err(fail(i, &trace, format!("model {expected:?}, store {actual:?}")));
                }
                expected
            }
            Op::Purge { key, force } => {
                let expected = model.purge(key, force, stats);
                let actual = store.purge(&keys[key], force).await.map_err(|e| store_error(i, &trace, e))?;
                let agrees = match (expected, actual) {
                    (Outcome::Purged(Purged::Refused { lease_left: model }), Purged::Refused { lease_left }) => {
                        clock.matches(u64::try_from(model.as_millis()).unwrap_or(u64::MAX), lease_left)
                    }
                    (expected, actual) => expected == Outcome::Purged(actual),
                };
                if !agrees {
                    return Err(fail(i, &trace, format!("model {expected:?}, store purged: {actual:?}")));
                }
                expected
            }
            Op::Advance { ms } => {
                clock.advance(ms, keys).await.map_err(|e| fail(i, &trace, e))?;
                model.advance(ms, stats)
            }
        };
        trace.push(outcome);
    }
    clock.cleanup(keys);
    Ok(trace)
}

fn settled(expected: Outcome, actual: Settled) -> Result<(), String> {
    let want = if expected == Outcome::Done { Settled::Done } else { Settled::Lost };
    if actual == want { Ok(()) } else { Err(format!("model {expected:?}, store {actual:?}")) }
}

// ---- property tests --------------------------------------------------------------------

fn config(cases: u32) -> Config {
    // PROPTEST_CASES raises the count for a longer soak.
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases);
    // No persistence: a failure prints its minimal sequence and writes nothing into the repo.
    Config { cases, failure_persistence: None, ..Config::default() }
}

/// Runs the property; on failure, panics with the shrunk sequence, one op per line.
fn check(cases: u32, case: impl Fn(&[Op], &mut Stats) -> Result<(), TestCaseError>) -> Stats {
    let stats = RefCell::new(Stats::default());
    let result = TestRunner::new(config(cases)).run(&ops(), |ops| case(&ops, &mut stats.borrow_mut()));
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, ops)) => {
            let fails = |ops: &[Op]| match case(ops, &mut Stats::default()) {
                Err(TestCaseError::Fail(why)) => Some(why.message().to_owned()),
                _ => None,
            };
            let (ops, reason) = shrink_further(ops, reason.message().to_owned(), fails);
            let mut listing = String::new();
            for (i, op) in ops.iter().enumerate() {
                let _ = writeln!(listing, "  #{i:<2} {op:?}");
            }
            panic!("{reason}\nminimal failing sequence ({} ops):\n{listing}", ops.len());
        }
        Err(e) => panic!("{e}"),
    }
    let stats = stats.into_inner();
    eprintln!("{stats:#?}");
    stats
}

/// proptest shrinks a `Vec` in one pass: it deletes elements, then simplifies the rest, and
/// never deletes again. Lease handles are picked by position, so deleting an unrelated claim
/// can change which handle an index picks and make the deletion look necessary until that
/// index is smaller. Greedy rounds of both, until no simpler sequence fails, finish the job.
/// Keys and fingerprints are interchangeable, so the result is finally renamed to number them
/// in order of appearance.
fn shrink_further(mut ops: Vec<Op>, mut reason: String, fails: impl Fn(&[Op]) -> Option<String>) -> (Vec<Op>, String) {
    'round: loop {
        for candidate in simpler(&ops) {
            if let Some(why) = fails(&candidate) {
                (ops, reason) = (candidate, why);
                continue 'round;
            }
        }
        break;
    }
    let renamed = renamed(&ops);
    match fails(&renamed) {
        Some(why) => (renamed, why),
        None => (ops, reason),
    }
}

/// `ops` with keys and fingerprints numbered from 0 in order of first appearance.
fn renamed(ops: &[Op]) -> Vec<Op> {
    fn rename<T: PartialEq>(seen: &mut Vec<T>, value: T) -> usize {
        match seen.iter().position(|v| *v == value) {
            Some(i) => i,
            None => {
                seen.push(value);
                seen.len() - 1
            }
        }
    }
    let (mut keys, mut fps) = (Vec::new(), Vec::new());
    ops.iter()
        .map(|&op| match op {
            Op::Claim { key, fp } => Op::Claim { key: rename(&mut keys, key), fp: rename(&mut fps, fp) as u8 },
            Op::Get { key } => Op::Get { key: rename(&mut keys, key) },
            Op::Purge { key, force } => Op::Purge { key: rename(&mut keys, key), force },
            other => other,
        })
        .collect()
}

/// Every sequence one step simpler than `ops`: one op fewer, or one field smaller.
fn simpler(ops: &[Op]) -> Vec<Vec<Op>> {
    let mut out = Vec::new();
    for i in 0..ops.len() {
        if ops.len() > 1 {
            let mut shorter = ops.to_vec();
            shorter.remove(i);
            out.push(shorter);
        }
    }
    for (i, &op) in ops.iter().enumerate() {
        let smaller: Vec<Op> = match op {
            Op::Claim { key, fp } => {
                (0..key).map(|key| Op::Claim { key, fp }).chain((0..fp).map(|fp| Op::Claim { key, fp })).collect()
            }
            Op::Renew { lease } => (0..lease).map(|lease| Op::Renew { lease }).collect(),
            Op::Settle { lease, end } => (0..lease)
                .map(|lease| Op::Settle { lease, end })
                .chain(match end {
                    End::Response(r) => (0..r).map(|r| Op::Settle { lease, end: End::Response(r) }).collect::<Vec<_>>(),
                    End::Executed(r) => std::iter::once(End::Response(r))
                        .chain((0..r).map(End::Executed))
                        .map(|end| Op::Settle { lease, end })
                        .collect(),
                    End::Unknown => vec![Op::Settle { lease, end: End::Response(0) }],
                })
                .collect(),
            Op::SettleAgain { end } => match end {
                End::Response(r) => (0..r).map(|r| Op::SettleAgain { end: End::Response(r) }).collect(),
                End::Executed(r) => vec![Op::SettleAgain { end: End::Response(r) }],
                End::Unknown => vec![Op::SettleAgain { end: End::Response(0) }],
            },
            Op::Release { lease, sent } => (0..lease)
                .map(|lease| Op::Release { lease, sent })
                .chain((!sent).then_some(Op::Release { lease, sent: true }))
                .collect(),
            Op::Get { key } => (0..key).map(|key| Op::Get { key }).collect(),
            Op::Purge { key, force } => (0..key)
                .map(|key| Op::Purge { key, force })
                .chain(force.then_some(Op::Purge { key, force: false }))
                .collect(),
            Op::Advance { ms } => ADVANCES_MS.iter().filter(|&&m| m < ms).map(|&ms| Op::Advance { ms }).collect(),
        };
        for op in smaller {
            let mut simpler = ops.to_vec();
            simpler[i] = op;
            out.push(simpler);
        }
    }
    out
}

/// The generator must keep reaching the transitions the model is about.
fn assert_coverage(stats: &Stats) {
    assert!(stats.takeovers_at_exact_deadline > 0, "{stats:?}");
    assert!(stats.stale_owner_lost > 0, "{stats:?}");
    assert!(stats.owner_acted_after_own_deadline > 0, "{stats:?}");
    assert!(stats.renew_raised_ttl > 0, "{stats:?}");
    assert!(stats.open_claims_expired_exactly > 0, "{stats:?}");
    assert!(stats.completed_expired_exactly > 0, "{stats:?}");
    assert!(stats.replays > 0 && stats.mismatches > 0 && stats.in_flight > 0, "{stats:?}");
    assert!(stats.released_claimed > 0 && stats.released_not_sent_gone > 0, "{stats:?}");
    assert!(
        stats.executed_replays > 0
            && stats.unknown_refused > 0
            && stats.purged > 0
            && stats.purges_refused > 0
            && stats.settled_again > 0,
        "{stats:?}"
    );
}

#[test]
fn memory_store_follows_the_model() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    let stats = check(MEMORY_CASES, |ops, stats| {
        let store = MemoryStore::new(10_000, 1 << 30);
        let keys = record_keys(&support::unique("model-mem"));
        rt.block_on(run_case(&store, &Clock::Paused, &keys, ops, stats)).map(drop)
    });
    assert_coverage(&stats);
}

#[test]
fn redis_store_follows_the_model() {
    let server = RedisServer::shared();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store = {
        let _runtime = rt.enter();
        RedisStore::new(&server.url(), 2, Duration::from_secs(2), &support::unique("model")).unwrap()
    };
    let clock = RedisClock::new(server);
    let stats = check(REDIS_CASES, |ops, stats| {
        // Fresh record keys per case (and per shrinking step): cases never see each other.
        let keys = record_keys(&support::unique("model-case"));
        rt.block_on(run_case(&store, &Clock::Redis(&clock), &keys, ops, stats)).map(drop)
    });
    assert_coverage(&stats);
    drop(store);
}

// ---- the model by example ----------------------------------------------------------------

/// A fixed sequence with the model's outcome for each step: takeover at the exact deadline,
/// the stale owner locked out, settling after one's own deadline, renew raising the ttl,
/// retention expiry and open-claim ttl expiry, releases and their attempts, unknown and
/// executed records, and purges. Lease indices refer to the held handles in claim order;
/// settle and release consume theirs.
const EXAMPLE: &[(Op, Outcome)] = &[
    // t = 0: key 0 is claimed; another fingerprint is refused, a duplicate is in flight.
    (Op::Claim { key: 0, fp: 0 }, Outcome::Acquired { attempt: 1 }), // held: [A]
    (Op::Claim { key: 0, fp: 1 }, Outcome::Mismatch),
    (Op::Claim { key: 0, fp: 0 }, Outcome::InFlight { lease_left_ms: 10_000 }),
    (Op::Advance { ms: 4_000 }, Outcome::Advanced), // t = 4 s
    (Op::Renew { lease: 0 }, Outcome::Renewed),     // A's deadline: 14 s
    (Op::Get { key: 0 }, Outcome::InProgress { attempt: 1, lease_left_ms: 10_000, expires_in_ms: 56_000 }),
    // t = 14 s: the lease passes exactly (deadline == now is passed) and is taken over.
    (Op::Advance { ms: 10_000 }, Outcome::Advanced),
    (Op::Get { key: 0 }, Outcome::InProgress { attempt: 1, lease_left_ms: 0, expires_in_ms: 46_000 }),
    (Op::Claim { key: 0, fp: 0 }, Outcome::Acquired { attempt: 2 }), // held: [A, B]
    (Op::Get { key: 0 }, Outcome::InProgress { attempt: 2, lease_left_ms: 10_000, expires_in_ms: 60_000 }),
    // The stale owner A is locked out.
    (Op::Renew { lease: 0 }, Outcome::Lost),
    (Op::Settle { lease: 0, end: End::Response(0) }, Outcome::Lost), // held: [B]
    (Op::Claim { key: 0, fp: 0 }, Outcome::InFlight { lease_left_ms: 10_000 }),
    // t = 25 s: B's own lease has passed, but nobody took over: B may still complete.
    (Op::Advance { ms: 11_000 }, Outcome::Advanced),
    (Op::Settle { lease: 0, end: End::Response(1) }, Outcome::Done), // held: []
    (Op::Claim { key: 0, fp: 0 }, Outcome::Replayed { response: 1 }),
    (Op::Claim { key: 0, fp: 1 }, Outcome::Mismatch),
    (Op::Get { key: 0 }, Outcome::Completed { attempt: 2, response: 1, expires_in_ms: 30_000 }),
    (Op::Renew { lease: 0 }, Outcome::NoLease),
    // t = 55 s: retention passes exactly; the key starts over, with any fingerprint.
    (Op::Advance { ms: 30_000 }, Outcome::Advanced),
    (Op::Get { key: 0 }, Outcome::Absent),
    (Op::Claim { key: 0, fp: 1 }, Outcome::Acquired { attempt: 1 }), // held: [C]
    (Op::Release { lease: 0, sent: true }, Outcome::Done),           // held: []
    (Op::Get { key: 0 }, Outcome::ReleasedEntry { attempt: 1, expires_in_ms: 60_000 }),
    // A released key runs again, with any fingerprint, as the next attempt; an attempt that
    // never reached the upstream gives its number back.
    (Op::Claim { key: 0, fp: 0 }, Outcome::Acquired { attempt: 2 }), // held: [C2]
    (Op::Release { lease: 0, sent: false }, Outcome::Done),
    (Op::Get { key: 0 }, Outcome::ReleasedEntry { attempt: 1, expires_in_ms: 60_000 }),
    (Op::Claim { key: 0, fp: 1 }, Outcome::Acquired { attempt: 2 }), // held: [C3]
    // An unknown outcome refuses its retries until an operator purges it.
    (Op::Settle { lease: 0, end: End::Unknown }, Outcome::Done),
    (Op::Claim { key: 0, fp: 1 }, Outcome::UnknownRefused { attempt: 2 }),
    (Op::Claim { key: 0, fp: 0 }, Outcome::Mismatch),
    (Op::Purge { key: 0, force: false }, Outcome::Purged(Purged::Released { was: State::Unknown })),
    (Op::Get { key: 0 }, Outcome::ReleasedEntry { attempt: 2, expires_in_ms: 30_000 }),
    // Key 1: a claim whose owner vanished expires with the open-claim ttl, exactly.
    (Op::Claim { key: 1, fp: 0 }, Outcome::Acquired { attempt: 1 }), // held: [D]
    (Op::Advance { ms: 60_000 }, Outcome::Advanced),                 // t = 115 s
    (Op::Get { key: 1 }, Outcome::Absent),
    (Op::Settle { lease: 0, end: End::Response(0) }, Outcome::Lost), // held: []
    // An executed record answers with its head.
    (Op::Claim { key: 1, fp: 0 }, Outcome::Acquired { attempt: 1 }), // held: [D2]
    (Op::Settle { lease: 0, end: End::Executed(2) }, Outcome::Done),
    (Op::Claim { key: 1, fp: 0 }, Outcome::ExecutedReplay { response: 2 }),
    // Key 2: renewals keep an open claim; one near the record's end raises its ttl.
    (Op::Claim { key: 2, fp: 0 }, Outcome::Acquired { attempt: 1 }), // held: [E]
    (Op::Advance { ms: 30_000 }, Outcome::Advanced),
    (Op::Advance { ms: 11_000 }, Outcome::Advanced), // 41 s in: lease passed, 19 s of record left
    (Op::Renew { lease: 0 }, Outcome::Renewed),
    (Op::Get { key: 2 }, Outcome::InProgress { attempt: 1, lease_left_ms: 10_000, expires_in_ms: 19_000 }),
    (Op::Advance { ms: 11_000 }, Outcome::Advanced), // 52 s in: 8 s of record left, less than a lease
    (Op::Renew { lease: 0 }, Outcome::Renewed),
    (Op::Get { key: 2 }, Outcome::InProgress { attempt: 1, lease_left_ms: 10_000, expires_in_ms: 60_000 }),
    // A live claim is released only by force; the purged claim is lost to its owner.
    (Op::Purge { key: 2, force: false }, Outcome::Purged(Purged::Refused { lease_left: Duration::from_secs(10) })),
    (Op::Purge { key: 2, force: true }, Outcome::Purged(Purged::Released { was: State::InProgress })),
    (Op::Purge { key: 2, force: false }, Outcome::Purged(Purged::Nothing)),
    (Op::Renew { lease: 0 }, Outcome::Lost),
    (Op::Release { lease: 0, sent: true }, Outcome::Lost),
];

async fn run_example<S: Lifecycle + Operator + Records>(store: &S, clock: &Clock<'_>, prefix: &str) {
    let ops: Vec<Op> = EXAMPLE.iter().map(|(op, _)| *op).collect();
    let trace = match run_case(store, clock, &record_keys(prefix), &ops, &mut Stats::default()).await {
        Ok(trace) => trace,
        Err(e) => panic!("{e}"),
    };
    for (i, ((op, want), got)) in EXAMPLE.iter().zip(&trace).enumerate() {
        assert_eq!(want, got, "the model's outcome of step #{i} {op:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn memory_store_example() {
    run_example(&MemoryStore::new(10_000, 1 << 30), &Clock::Paused, &support::unique("example-mem")).await;
}

#[tokio::test]
async fn redis_store_example() {
    let server = RedisServer::shared();
    let prefix = support::unique("example");
    let store = RedisStore::new(&server.url(), 2, Duration::from_secs(2), &prefix).unwrap();
    run_example(&store, &Clock::Redis(&RedisClock::new(server)), &prefix).await;
}
