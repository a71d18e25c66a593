//! A small HTTP client for tests.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The Authorization value test requests carry unless a test says otherwise.
pub const DEFAULT_AUTH: &str = "Bearer tester";

#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub fn is_replay(&self) -> bool {
        self.header("idempotent-replay") == Some("true")
    }

    /// The problem+json `type` anchor, e.g. `key-missing`.
    pub fn problem(&self) -> String {
        assert_eq!(self.header("content-type"), Some("application/problem+json"), "{self:?}");
        let doc = self.json();
        doc["type"].as_str().unwrap().rsplit('#').next().unwrap().to_owned()
    }
}

#[derive(Clone)]
pub struct Client {
    addr: SocketAddr,
    base: String,
    inner: HyperClient<HttpConnector, Full<Bytes>>,
}

impl Client {
    pub fn new(addr: SocketAddr) -> Self {
        Self { addr, base: format!("http://{addr}"), inner: HyperClient::builder(TokioExecutor::new()).build_http() }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client that speaks HTTP/2 with prior knowledge (h2c).
    pub fn h2(addr: SocketAddr) -> Self {
        Self {
            addr,
            base: format!("http://{addr}"),
            inner: HyperClient::builder(TokioExecutor::new()).http2_only(true).build_http(),
        }
    }

    pub async fn send(&self, method: Method, path: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Reply {
        self.try_send(method, path, headers, body).await.unwrap_or_else(|e| panic!("request failed: {e}"))
    }

    /// Like `send`, but a failed exchange (refused, reset, closed) is an `Err`, not a panic.
    pub async fn try_send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Reply, String> {
        let mut b = Request::builder().method(method).uri(format!("{}{path}", self.base));
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let resp = self.inner.request(b.body(Full::new(body.into())).unwrap()).await.map_err(|e| format!("{e:?}"))?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.map_err(|e| format!("{e:?}"))?.to_bytes();
        Ok(Reply { status: parts.status, headers: parts.headers, body })
    }

    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.send(Method::GET, path, headers, Bytes::new()).await
    }

    /// POST a JSON body with an Idempotency-Key (raw header value) if given, as the caller
    /// [`DEFAULT_AUTH`] (idempotent routes refuse keyed requests without a scope).
    pub async fn post_json(&self, path: &str, key: Option<&str>, body: &str) -> Reply {
        self.post_json_as(path, key, Some(DEFAULT_AUTH), body).await
    }

    /// POST a JSON body as the caller authenticated by `auth` (none: no Authorization).
    pub async fn post_json_as(&self, path: &str, key: Option<&str>, auth: Option<&str>, body: &str) -> Reply {
        let mut headers = vec![("content-type", "application/json")];
        if let Some(k) = key {
            headers.push(("idempotency-key", k));
        }
        if let Some(a) = auth {
            headers.push(("authorization", a));
        }
        self.send(Method::POST, path, &headers, body.to_owned()).await
    }
}
