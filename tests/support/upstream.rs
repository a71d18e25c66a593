//! A counting test upstream: records every request that reaches it and answers as told.
//!
//! Its response body names the execution number, so a replay can be told from a second
//! execution, and it sets a cookie, so tests can check that cookies are not replayed.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// How the upstream answers.
#[derive(Debug, Clone)]
pub struct Behavior {
    /// Delay before answering.
    pub delay: Duration,
    /// Statuses to answer with, one per request; `default_status` once empty.
    pub statuses: VecDeque<u16>,
    pub default_status: u16,
    /// Extra bytes of padding in the body.
    pub padding: usize,
}

impl Default for Behavior {
    fn default() -> Self {
        Self { delay: Duration::ZERO, statuses: VecDeque::new(), default_status: 201, padding: 0 }
    }
}

#[derive(Default)]
struct State {
    seen: Mutex<Vec<Seen>>,
    behavior: Mutex<Behavior>,
}

pub struct TestUpstream {
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl TestUpstream {
    pub async fn start() -> Self {
        Self::with(Behavior::default()).await
    }

    pub async fn with(behavior: Behavior) -> Self {
        let state = Arc::new(State { seen: Mutex::default(), behavior: Mutex::new(behavior) });
        let addr = super::serve_http(Arc::clone(&state), answer).await;
        Self { addr, state }
    }

    /// One that answers on `listener`, from now on.
    pub fn on(listener: tokio::net::TcpListener) -> Self {
        let state = Arc::new(State { seen: Mutex::default(), behavior: Mutex::new(Behavior::default()) });
        let addr = super::serve_http_on(listener, Arc::clone(&state), answer);
        Self { addr, state }
    }

    pub fn set(&self, f: impl FnOnce(&mut Behavior)) {
        f(&mut self.state.behavior.lock().unwrap());
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// Number of requests received.
    pub fn executions(&self) -> usize {
        self.state.seen.lock().unwrap().len()
    }

    /// Requests received per raw Idempotency-Key header value.
    pub fn executions_by_key(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for s in self.state.seen.lock().unwrap().iter() {
            let k = s.headers.get("idempotency-key").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
            *out.entry(k).or_default() += 1;
        }
        out
    }
}

async fn answer(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let execution = {
        let mut seen = state.seen.lock().unwrap();
        seen.push(Seen {
            method: parts.method.to_string(),
            path: parts.uri.path_and_query().map(|p| p.to_string()).unwrap_or_default(),
            headers: parts.headers.clone(),
            body: body.clone(),
        });
        seen.len()
    };
    let (delay, status, padding) = {
        let mut b = state.behavior.lock().unwrap();
        let status = b.statuses.pop_front().unwrap_or(b.default_status);
        (b.delay, status, b.padding)
    };
    tokio::time::sleep(delay).await;
    let key = parts.headers.get("idempotency-key").map(|v| v.to_str().unwrap_or("?").to_owned());
    let doc = serde_json::json!({
        "execution": execution,
        "key": key,
        "body_len": body.len(),
        "padding": "p".repeat(padding),
    });
    let response = Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("set-cookie", format!("session=s{execution}"))
        .header("x-execution", execution.to_string())
        .body(Full::new(Bytes::from(doc.to_string())))
        .unwrap();
    Ok(response)
}
