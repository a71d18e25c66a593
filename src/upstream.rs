//! Upstream: the pooled client that talks to one named service.
//!
//! Upstreams are `http://` or `https://` (rustls; system roots, or the CA bundle named by
//! `ca_file`). HTTP/2 is negotiated by ALPN over TLS; cleartext upstreams speak HTTP/1.1.
//! The request sent upstream is the client's, minus hop-by-hop headers, with the
//! `X-Forwarded-*` headers set and `Idempotency-Key` left untouched so that the upstream's
//! own UNIQUE constraint can do its work.

use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri, Version, request};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use thiserror::Error;

use crate::body::Body;
use crate::config::UpstreamConfig;
use crate::forwarded::{self, Peer};
use crate::store::Sent;

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
    /// Whether the request may have reached the upstream. Only a connection that was never
    /// made proves it did not: once bytes were written, a reset, a timeout or a broken answer
    /// leaves the outcome unknown.
    pub fn sent(&self) -> Sent {
        match self {
            Self::Unreachable { .. } => Sent::No,
            Self::Timeout { .. } | Self::Failed { .. } => Sent::Maybe,
        }
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

/// One upstream service.
pub struct Upstream {
    name: String,
    scheme: Scheme,
    authority: Authority,
    /// Path prefix of the base URL without its trailing slash ("" for none).
    base_path: String,
    timeout: Duration,
    client: Client<HttpsConnector<HttpConnector>, Body>,
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
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(60)).build(connector);
        Ok(Self { name: config.name.clone(), scheme, authority, base_path, timeout: config.timeout, client })
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
        parts.authority = Some(self.authority.clone());
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

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn tls_config(config: &UpstreamConfig) -> Result<rustls::ClientConfig, UpstreamSetupError> {
    let tls_err = |detail: String| UpstreamSetupError::Tls { upstream: config.name.clone(), detail };
    let mut roots = rustls::RootCertStore::empty();
    match &config.ca_file {
        Some(path) => {
            let ca_err = |detail: String| UpstreamSetupError::CaFile { upstream: config.name.clone(), detail };
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| ca_err(format!("cannot read {}: {e}", path.display())))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ca_err(format!("{}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(ca_err(format!("{} holds no PEM certificates", path.display())));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| ca_err(e.to_string()))?;
            }
        }
        None if config.url.scheme() == Some(&Scheme::HTTPS) => {
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
            if roots.is_empty() {
                return Err(tls_err("no system CA certificates found; set ca_file".into()));
            }
        }
        // Cleartext upstream: the TLS half of the connector is never used.
        None => {}
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
