//! The ledger upstream: an order service in miniature whose own records are the ground truth.
//!
//! Every request that reaches it is counted per key (`arrivals`). A successful request inserts
//! a row under `UNIQUE(key)`, as a real service's database would; a second request with the
//! same key and body is the backstop at work: it gets the original answer back with
//! `Idempotency-Backstop: hit` and is counted as a caught duplicate; another body gets 422.
//! Faults are injected per key: a delay, 5xx answers for the first arrivals, or a dropped
//! connection. A request with `X-Answer-Bytes: N` gets an answer padded to N bytes. The
//! `Idempotency-Attempt` of every arrival is kept, so that a second run can be told apart:
//! attempt 2 took over a claim whose lease passed, attempt 1 again found no record at all.
//!
//! Answers can also be lost ([`LostAnswers`]), by a seeded draw per key and arrival: the
//! connection is dropped before executing or after executing, or the request is held past the
//! gateway's timeout while its execution goes on, detached from the connection, and records
//! at the end. Every arrival that executes is counted per key ([`Ledger::runs`]), whatever the
//! backstop then answers. A `GET` is the lookup: the row of (caller, key), the caller being
//! the `Authorization` the request carried, answered 200 with the original answer, else 404.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// How the ledger answers.
#[derive(Clone, Default)]
pub struct Faults {
    /// Delay before answering, for the first arrival of a key.
    pub first_delay: Duration,
    /// Delay before answering, for later arrivals of a key.
    pub later_delay: Duration,
    /// Extra random delay, up to this much, for every arrival.
    pub jitter: Duration,
    /// The first this-many arrivals of each key answer 503 and write nothing.
    pub fail_first: u32,
    /// Answers lost on the way back, if any.
    pub lost: Option<LostAnswers>,
    /// How long a lookup takes.
    pub lookup_delay: Duration,
}

/// Answers lost by a seeded draw per (key, arrival): the same seed and keys strike the same
/// arrivals, whatever order they come in.
#[derive(Clone, Copy, Debug)]
pub struct LostAnswers {
    pub seed: u64,
    /// Out of 100 arrivals, how many drop the connection before executing.
    pub drop_before: u32,
    /// Out of 100 arrivals, how many execute and then drop the connection.
    pub drop_after: u32,
    /// Out of 100 arrivals, how many are held for `hold_for` while they execute.
    pub hold: u32,
    /// How long a held request takes; it records at the end, connection or not.
    pub hold_for: Duration,
    /// Only a key's first this-many arrivals can be struck.
    pub first_arrivals: u32,
}

/// What befell an arrival.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strike {
    DropBefore,
    DropAfter,
    Hold,
}

impl LostAnswers {
    fn strike(&self, key: &str, arrival: u32) -> Option<Strike> {
        if arrival > self.first_arrivals {
            return None;
        }
        let mut h = self.seed ^ u64::from(arrival).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for b in key.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
        }
        // splitmix64's finaliser
        h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let roll = ((h ^ (h >> 31)) % 100) as u32;
        if roll < self.drop_before {
            Some(Strike::DropBefore)
        } else if roll < self.drop_before + self.drop_after {
            Some(Strike::DropAfter)
        } else if roll < self.drop_before + self.drop_after + self.hold {
            Some(Strike::Hold)
        } else {
            None
        }
    }
}

/// One arrival of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Its `Idempotency-Attempt` (0 when it had none).
    pub attempt: u32,
    /// Whether the upstream executed it (a backstop hit counts: it ran into the constraint).
    pub executed: bool,
    pub strike: Option<Strike>,
}

#[derive(Default)]
struct State {
    faults: Faults,
    arrivals: HashMap<String, u32>,
    attempts: HashMap<String, Vec<u32>>,
    runs: HashMap<String, Vec<Run>>,
    /// key -> (caller, body, answer)
    rows: HashMap<String, (String, Bytes, Bytes)>,
    backstop_hits: u32,
    lookups: u32,
    lookups_running: HashMap<String, u32>,
    overlapping_lookups: u32,
}

/// Totals over all keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub arrivals: u32,
    pub rows: u32,
    pub backstop_hits: u32,
}

pub struct Ledger {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl Ledger {
    pub async fn start(faults: Faults) -> Self {
        let state = Arc::new(Mutex::new(State { faults, ..State::default() }));
        let addr = serve(Arc::clone(&state)).await;
        Self { addr, state }
    }

    /// Every arrival of `key`, in order.
    pub fn runs(&self, key: &str) -> Vec<Run> {
        self.state.lock().unwrap().runs.get(key).cloned().unwrap_or_default()
    }

    /// Keys executed more than once, with how often.
    pub fn keys_executed_over(&self, max: u32) -> Vec<(String, u32)> {
        let s = self.state.lock().unwrap();
        let executed = |runs: &Vec<Run>| runs.iter().filter(|r| r.executed).count() as u32;
        s.runs.iter().map(|(k, runs)| (k.clone(), executed(runs))).filter(|(_, n)| *n > max).collect()
    }

    /// The answer recorded for `key`, once its execution has ended.
    pub fn answer(&self, key: &str) -> Option<Bytes> {
        self.state.lock().unwrap().rows.get(key).map(|(_, _, answer)| answer.clone())
    }

    /// Arrivals struck by `strike`.
    pub fn strikes(&self, strike: Strike) -> u32 {
        let s = self.state.lock().unwrap();
        s.runs.values().flatten().filter(|r| r.strike == Some(strike)).count() as u32
    }

    /// Lookups answered, and how many of them ran while another lookup of the same key did.
    pub fn lookups(&self) -> (u32, u32) {
        let s = self.state.lock().unwrap();
        (s.lookups, s.overlapping_lookups)
    }

    pub fn arrivals(&self, key: &str) -> u32 {
        self.state.lock().unwrap().arrivals.get(key).copied().unwrap_or(0)
    }

    pub fn totals(&self) -> Totals {
        let s = self.state.lock().unwrap();
        Totals { arrivals: s.arrivals.values().sum(), rows: s.rows.len() as u32, backstop_hits: s.backstop_hits }
    }

    /// The `Idempotency-Attempt` of each arrival of `key`, in order (0 when it had none).
    pub fn attempts(&self, key: &str) -> Vec<u32> {
        self.state.lock().unwrap().attempts.get(key).cloned().unwrap_or_default()
    }

    /// Keys that arrived more often than `max` times.
    pub fn keys_over(&self, max: u32) -> Vec<(String, u32)> {
        let s = self.state.lock().unwrap();
        s.arrivals.iter().filter(|(_, n)| **n > max).map(|(k, n)| (k.clone(), *n)).collect()
    }
}

/// Serves HTTP/1.1 and h2c on a fresh loopback port. An error from [`answer`] drops the
/// connection without a byte of response.
async fn serve(state: Arc<Mutex<State>>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| answer(Arc::clone(&state), req));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

type Answered = Result<Response<Full<Bytes>>, std::io::Error>;

async fn answer(state: Arc<Mutex<State>>, req: Request<Incoming>) -> Answered {
    let text = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let key = text("idempotency-key");
    let caller = text("authorization");
    if req.method() == Method::GET {
        return Ok(lookup(&state, key, caller).await);
    }
    let number = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u32>().ok());
    let attempt = number("idempotency-attempt").unwrap_or(0);
    let pad = number("x-answer-bytes").unwrap_or(0) as usize;
    let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    enum Outcome {
        Fail,
        Created(Bytes),
        Backstop(Bytes),
        Conflict,
        /// Executing, detached: records when the hold is over.
        Held,
    }
    let (outcome, delay, strike, hold_for) = {
        let mut s = state.lock().unwrap();
        let n = {
            let a = s.arrivals.entry(key.clone()).or_default();
            *a += 1;
            *a
        };
        s.attempts.entry(key.clone()).or_default().push(attempt);
        let f = s.faults.clone();
        let strike = f.lost.and_then(|l| l.strike(&key, n));
        let jitter = if f.jitter.is_zero() { Duration::ZERO } else { f.jitter.mul_f64(rand::random::<f64>()) };
        let delay = if n == 1 { f.first_delay } else { f.later_delay } + jitter;
        let outcome = if n <= f.fail_first || strike == Some(Strike::DropBefore) {
            Outcome::Fail
        } else if let Some((_, stored_body, answer)) = s.rows.get(&key).cloned() {
            if stored_body == body {
                s.backstop_hits += 1;
                Outcome::Backstop(answer)
            } else {
                Outcome::Conflict
            }
        } else if strike == Some(Strike::Hold) {
            Outcome::Held
        } else {
            let answer = order_answer(s.rows.len() + 1, &key, pad);
            s.rows.insert(key.clone(), (caller.clone(), body.clone(), answer.clone()));
            Outcome::Created(answer)
        };
        let executed = matches!(outcome, Outcome::Created(_) | Outcome::Backstop(_) | Outcome::Held);
        s.runs.entry(key.clone()).or_default().push(Run { attempt, executed, strike });
        (outcome, delay, strike, f.lost.map_or(Duration::ZERO, |l| l.hold_for))
    };
    if strike == Some(Strike::DropBefore) {
        return Err(std::io::Error::other("dropped before executing"));
    }
    let outcome = match outcome {
        Outcome::Held => {
            // Detached, as a server that goes on when its client hangs up.
            let work = tokio::spawn(async move {
                tokio::time::sleep(hold_for).await;
                let mut s = state.lock().unwrap();
                if let Some((_, _, answer)) = s.rows.get(&key) {
                    // Ran into the row of an execution that overtook it.
                    let answer = answer.clone();
                    s.backstop_hits += 1;
                    return Outcome::Backstop(answer);
                }
                let answer = order_answer(s.rows.len() + 1, &key, pad);
                s.rows.insert(key, (caller, body, answer.clone()));
                Outcome::Created(answer)
            });
            work.await.unwrap()
        }
        outcome => outcome,
    };
    if strike == Some(Strike::DropAfter) {
        return Err(std::io::Error::other("dropped after executing"));
    }
    tokio::time::sleep(delay).await;
    let r = Response::builder().header("content-type", "application/json");
    Ok(match outcome {
        Outcome::Fail => r.status(503).body(Full::new(Bytes::from_static(b"{\"error\":\"try later\"}"))),
        Outcome::Created(answer) => r.status(201).body(Full::new(answer)),
        Outcome::Backstop(answer) => r.status(201).header("idempotency-backstop", "hit").body(Full::new(answer)),
        Outcome::Conflict => r.status(422).body(Full::new(Bytes::from_static(b"{\"error\":\"key reused\"}"))),
        Outcome::Held => unreachable!("the hold is over"),
    }
    .unwrap())
}

fn order_answer(order_id: usize, key: &str, pad: usize) -> Bytes {
    Bytes::from(match pad {
        0 => format!(r#"{{"order_id":{order_id},"key":{key:?}}}"#),
        _ => format!(r#"{{"order_id":{order_id},"key":{key:?},"pad":"{}"}}"#, "x".repeat(pad)),
    })
}

/// The lookup: the answer recorded for (caller, key), or 404.
async fn lookup(state: &Mutex<State>, key: String, caller: String) -> Response<Full<Bytes>> {
    let delay = {
        let mut s = state.lock().unwrap();
        s.lookups += 1;
        let running = s.lookups_running.entry(key.clone()).or_default();
        *running += 1;
        if *running > 1 {
            s.overlapping_lookups += 1;
        }
        s.faults.lookup_delay
    };
    tokio::time::sleep(delay).await;
    let found = {
        let mut s = state.lock().unwrap();
        *s.lookups_running.get_mut(&key).unwrap() -= 1;
        s.rows.get(&key).filter(|(owner, _, _)| *owner == caller).map(|(_, _, answer)| answer.clone())
    };
    let r = Response::builder().header("content-type", "application/json");
    match found {
        Some(answer) => r.status(200).body(Full::new(answer)),
        None => r.status(404).body(Full::new(Bytes::from_static(b"{\"error\":\"no such order\"}"))),
    }
    .unwrap()
}
