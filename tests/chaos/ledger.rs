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

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

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
}

#[derive(Default)]
struct State {
    faults: Faults,
    arrivals: HashMap<String, u32>,
    attempts: HashMap<String, Vec<u32>>,
    rows: HashMap<String, (Bytes, Bytes)>,
    backstop_hits: u32,
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
        let addr = crate::support::serve_http(Arc::clone(&state), answer).await;
        Self { addr, state }
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

async fn answer(state: Arc<Mutex<State>>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let key = req.headers().get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let number = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u32>().ok());
    let attempt = number("idempotency-attempt").unwrap_or(0);
    let pad = number("x-answer-bytes").unwrap_or(0) as usize;
    let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    enum Outcome {
        Fail,
        Created(Bytes),
        Backstop(Bytes),
        Conflict,
    }
    let (outcome, delay) = {
        let mut s = state.lock().unwrap();
        let n = {
            let a = s.arrivals.entry(key.clone()).or_default();
            *a += 1;
            *a
        };
        s.attempts.entry(key.clone()).or_default().push(attempt);
        let f = s.faults.clone();
        let jitter = if f.jitter.is_zero() { Duration::ZERO } else { f.jitter.mul_f64(rand::random::<f64>()) };
        let delay = if n == 1 { f.first_delay } else { f.later_delay } + jitter;
        let outcome = if n <= f.fail_first {
            Outcome::Fail
        } else if let Some((stored_body, answer)) = s.rows.get(&key).cloned() {
            if stored_body == body {
                s.backstop_hits += 1;
                Outcome::Backstop(answer)
            } else {
                Outcome::Conflict
            }
        } else {
            let order_id = s.rows.len() + 1;
            let answer = match pad {
                0 => format!(r#"{{"order_id":{order_id},"key":{key:?}}}"#),
                _ => format!(r#"{{"order_id":{order_id},"key":{key:?},"pad":"{}"}}"#, "x".repeat(pad)),
            };
            let answer = Bytes::from(answer);
            s.rows.insert(key.clone(), (body, answer.clone()));
            Outcome::Created(answer)
        };
        (outcome, delay)
    };
    tokio::time::sleep(delay).await;
    let r = Response::builder().header("content-type", "application/json");
    Ok(match outcome {
        Outcome::Fail => r.status(503).body(Full::new(Bytes::from_static(b"{\"error\":\"try later\"}"))),
        Outcome::Created(answer) => r.status(201).body(Full::new(answer)),
        Outcome::Backstop(answer) => r.status(201).header("idempotency-backstop", "hit").body(Full::new(answer)),
        Outcome::Conflict => r.status(422).body(Full::new(Bytes::from_static(b"{\"error\":\"key reused\"}"))),
    }
    .unwrap())
}
