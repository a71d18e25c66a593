//! Upstream: the pooled client that talks to one named service.
//!
//! Upstreams are `http://` or `https://` (rustls; system roots, or the CA bundle named by
//! `ca_file`). HTTP/2 is negotiated by ALPN over TLS; cleartext upstreams speak HTTP/1.1.
//! The request sent upstream is the client's, minus hop-by-hop headers, with the
//! `X-Forwarded-*` headers set and `Idempotency-Key` left untouched so that the upstream's
//! own UNIQUE constraint can do its work.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri, Version, request};
use hyper::body::Incoming;
use hyper_rustls::MaybeHttpsStream;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use hyper_util::rt::TokioIo;
use thiserror::Error;

use crate::body::Body;
use crate::config::UpstreamConfig;
use crate::forwarded::{self, Peer};
use crate::outbound::{self, Roots, TlsSetupError, error_chain};

/// Why an exchange with the upstream failed.
#[derive(Debug, Error)]
pub enum UpstreamError {
    /// No connection could be made (refused, DNS, TLS handshake).
    #[error("upstream {upstream} unreachable: {detail}")]
    Unreachable {
        /// Upstream name.
        upstream: String,
        /// The underlying error.
        detail: String,
    },
    /// The upstream did not answer within its timeout.
    #[error("upstream {upstream} did not answer within {timeout:?}")]
    Timeout {
        /// Upstream name.
        upstream: String,
        /// The configured timeout.
        timeout: Duration,
    },
    /// The connection broke or the upstream sent something that is not HTTP.
    #[error("upstream {upstream} failed: {detail}")]
    Failed {
        /// Upstream name.
        upstream: String,
        /// The underlying error.
        detail: String,
    },
}

impl UpstreamError {
    /// Whether the request certainly never reached the upstream. Only a connection that was
    /// never made proves it: once bytes were written, a reset, a timeout or a broken answer
    /// leaves the outcome unknown.
    pub fn never_sent(&self) -> bool {
        matches!(self, Self::Unreachable { .. })
    }
}

/// Why an upstream could not be set up at start.
#[derive(Debug, Error)]
pub enum UpstreamSetupError {
    /// The CA bundle could not be read.
    #[error("upstreams.{upstream}.ca_file: {detail}")]
    CaFile {
        /// Upstream name.
        upstream: String,
        /// What went wrong.
        detail: String,
    },
    /// TLS could not be configured.
    #[error("upstreams.{upstream}: TLS setup failed: {detail}")]
    Tls {
        /// Upstream name.
        upstream: String,
        /// What went wrong.
        detail: String,
    },
}

/// The authority every request to a cleartext upstream carries on its way into the pooled
/// client: the pool's key, not an address.
///
/// Why: hyper-util's pool hashes the authority byte by byte three times per request (figures in
/// docs/performance.md), and each `Upstream` has a client of its own, so one letter tells as
/// much apart. Hazard: the key must never reach the wire: [`Dial`] connects to the real
/// address, `Host` is set from the real authority, and HTTP/1 goes out in origin form.
/// Upstreams over TLS keep their real authority (their certificate's name, HTTP/2's
/// `:authority`).
const POOL_KEY: Authority = Authority::from_static("u");

/// One upstream service.
pub struct Upstream {
    name: String,
    scheme: Scheme,
    /// The upstream's address, as configured.
    authority: Authority,
    /// What the request's URI carries: the real authority over TLS, [`POOL_KEY`] in cleartext.
    key: Authority,
    /// The `Host` header of a cleartext upstream (`host`, or `host:port` for a port other
    /// than 80), as the pooled client would have derived it; `None` over TLS, where the
    /// client sets it for HTTP/1 and HTTP/2 carries `:authority` instead.
    host: Option<HeaderValue>,
    /// Path prefix of the base URL without its trailing slash ("" for none).
    base_path: String,
    timeout: Duration,
    client: Client<Dial, Body>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream").field("name", &self.name).field("authority", &self.authority).finish()
    }
}

impl Upstream {
    /// Builds the client for one configured upstream.
    pub fn new(config: &UpstreamConfig) -> Result<Self, UpstreamSetupError> {
        let scheme = config.url.scheme().cloned().unwrap_or(Scheme::HTTP);
        let authority = config.url.authority().cloned().ok_or_else(|| UpstreamSetupError::Tls {
            upstream: config.name.clone(),
            detail: "the URL has no host".into(),
        })?;
        let base_path = config.url.path().trim_end_matches('/').to_owned();

        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(config.connect_timeout));
        let tls = tls_config(config)?;
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let (dial, key, host) = if scheme == Scheme::HTTPS {
            (Dial { connector, address: None }, authority.clone(), None)
        } else {
            let address =
                Uri::builder().scheme(scheme.clone()).authority(authority.clone()).path_and_query("/").build();
            let host = HeaderValue::from_str(&host_header(&authority));
            match (address, host) {
                (Ok(address), Ok(host)) => (Dial { connector, address: Some(address) }, POOL_KEY, Some(host)),
                // Both come from a parsed URL's authority, so neither fails; if one did, the
                // real authority in the URI still works, only without the cheaper key.
                _ => (Dial { connector, address: None }, authority.clone(), None),
            }
        };
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(60)).build(dial);
        Ok(Self { name: config.name.clone(), scheme, authority, key, host, base_path, timeout: config.timeout, client })
    }

    /// The deadline of one exchange.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Turns the client's request head into the upstream's: target URI, headers.
    pub fn prepare(&self, parts: &mut request::Parts, peer: &Peer) {
        // Host names the upstream; the client's Host travels as X-Forwarded-Host.
        let original_host: Option<HeaderValue> = parts
            .headers
            .remove(http::header::HOST)
            .or_else(|| parts.uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()));
        parts.uri = self.target(&parts.uri);
        if let Some(host) = &self.host {
            parts.headers.insert(http::header::HOST, host.clone());
        }
        // The connection to the upstream is ours: HTTP/1.1 framing, or h2 if ALPN agrees,
        // whatever the client spoke to us.
        parts.version = Version::HTTP_11;
        // Hop-by-hop headers go in the same scan.
        forwarded::apply(&mut parts.headers, peer, original_host.as_ref());
    }

    fn target(&self, original: &Uri) -> Uri {
        let path_and_query = match original.path_and_query() {
            // The common case: no prefix, and the client's path-and-query is reused as parsed.
            Some(pq) if self.base_path.is_empty() => Some(pq.clone()),
            pq => {
                let joined = format!("{}{}", self.base_path, pq.map_or("/", PathAndQuery::as_str));
                // A valid path-and-query: the prefix comes from a parsed URL, the rest from one.
                joined.parse().ok().or_else(|| pq.cloned())
            }
        };
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.key.clone());
        parts.path_and_query = path_and_query;
        Uri::from_parts(parts).unwrap_or_else(|_| original.clone())
    }

    /// Sends a prepared request and waits for the response head. It sets no deadline of its
    /// own: the caller bounds the exchange by [`Upstream::timeout`], once.
    pub async fn send(&self, request: Request<Body>) -> Result<Response<Incoming>, UpstreamError> {
        match self.client.request(request).await {
            Ok(response) => Ok(response),
            Err(e) if e.is_connect() => {
                Err(UpstreamError::Unreachable { upstream: self.name.clone(), detail: error_chain(&e) })
            }
            Err(e) => Err(UpstreamError::Failed { upstream: self.name.clone(), detail: error_chain(&e) }),
        }
    }

    /// The error for an exchange that ran past the timeout.
    pub fn timed_out(&self) -> UpstreamError {
        UpstreamError::Timeout { upstream: self.name.clone(), timeout: self.timeout }
    }

    /// The error for a response whose body broke off.
    pub fn body_failed(&self, e: &hyper::Error) -> UpstreamError {
        UpstreamError::Failed { upstream: self.name.clone(), detail: error_chain(e) }
    }
}

/// The `Host` of a request to `authority`, as hyper-util's client writes it: the port only
/// when it is not the cleartext default.
fn host_header(authority: &Authority) -> String {
    match authority.port_u16() {
        Some(port) if port != 80 => format!("{}:{port}", authority.host()),
        _ => authority.host().to_owned(),
    }
}

/// The pooled client's connector: connects to the upstream's real address, whatever
/// authority the request's URI carries (see [`POOL_KEY`]).
#[derive(Clone)]
struct Dial {
    connector: HttpsConnector<HttpConnector>,
    /// The cleartext upstream's address; `None`: the URI's own (TLS upstreams).
    address: Option<Uri>,
}

type DialFuture =
    Pin<Box<dyn Future<Output = Result<MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>, BoxError>> + Send>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for Dial {
    type Response = MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>;
    type Error = BoxError;
    type Future = DialFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.connector.poll_ready(cx)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let dst = self.address.clone().unwrap_or(dst);
        self.connector.call(dst)
    }
}

/// The TLS configuration of `config`'s pool: its `ca_file`, else the system's roots for an
/// https upstream, else none.
fn tls_config(config: &UpstreamConfig) -> Result<rustls::ClientConfig, UpstreamSetupError> {
    let roots = match &config.ca_file {
        Some(path) => Roots::PemFile(path),
        None if config.url.scheme() == Some(&Scheme::HTTPS) => Roots::System,
        None => Roots::None,
    };
    outbound::tls_config(roots).map_err(|e| {
        let upstream = config.name.clone();
        match e {
            TlsSetupError::CaFile(detail) => UpstreamSetupError::CaFile { upstream, detail },
            TlsSetupError::NoSystemRoots => {
                UpstreamSetupError::Tls { upstream, detail: "no system CA certificates found; set ca_file".into() }
            }
            TlsSetupError::Protocol(detail) => UpstreamSetupError::Tls { upstream, detail },
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_header_is_the_authority_without_the_default_port() {
        let host = |a: &'static str| host_header(&Authority::from_static(a));
        assert_eq!(host("127.0.0.1:8080"), "127.0.0.1:8080");
        assert_eq!(host("orders.internal:80"), "orders.internal");
        assert_eq!(host("orders.internal"), "orders.internal");
        assert_eq!(host("[::1]:9000"), "[::1]:9000");
    }
}
