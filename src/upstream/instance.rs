//! One instance of an upstream: its address, its pool, its health; and the template every
//! instance of one upstream is made from, at start or when its name resolves anew.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::dial::Dial;
use super::error::Failure;
use super::health::Health;
use super::prepare::{POOL_KEY, host_header};
use crate::body::Body;
use crate::config::Ejection;
use crate::metrics::InstanceMetrics;

/// What every instance of one upstream is made from.
pub(super) struct Template {
    pub(super) upstream: String,
    pub(super) scheme: Scheme,
    pub(super) tls: rustls::ClientConfig,
    pub(super) connect_timeout: Duration,
    /// When an instance is left out.
    pub(super) ejection: Ejection,
    /// Whether broken exchanges and gateway errors count toward it: on an upstream that may
    /// have several instances, never on the one instance of another.
    pub(super) outliers: bool,
}

/// One instance of an upstream: its address and its pool.
pub(super) struct Instance {
    /// Its address, as configured: what `Host` and TLS name.
    pub(super) authority: Authority,
    /// The address its name resolved to, connected to instead of looking the name up (a
    /// resolved upstream's instances); `None`: the name is looked up at each new connection.
    pub(super) pinned: Option<SocketAddr>,
    /// How logs and metrics name it: the pinned address, else the authority.
    pub(super) label: String,
    /// What the request's URI carries: the real authority over TLS, [`POOL_KEY`] in cleartext.
    pub(super) key: Authority,
    /// The `Host` header of a cleartext upstream (`host`, or `host:port` for a port other
    /// than 80), as the pooled client would have derived it; `None` over TLS, where the
    /// client sets it for HTTP/1 and HTTP/2 carries `:authority` instead.
    pub(super) host: Option<HeaderValue>,
    client: Client<Dial, Body>,
    /// Requests in flight and failures, for the balancer; its series, on an upstream with
    /// several instances. Its connector holds it too.
    pub(super) health: Arc<Health>,
}

impl Template {
    /// An instance at `authority`; at `pinned`, when given, instead of what the name resolves
    /// to at each connection.
    pub(super) fn instance(
        &self,
        authority: Authority,
        pinned: Option<SocketAddr>,
        metrics: Option<InstanceMetrics>,
    ) -> Instance {
        let scheme = &self.scheme;
        let label = pinned.map_or_else(|| authority.to_string(), |address| address.to_string());
        let health = Arc::new(Health::new(&self.upstream, &label, self.ejection, self.outliers, metrics));
        let dial = |address| Dial::new(self.tls.clone(), self.connect_timeout, pinned, address, Arc::clone(&health));
        let (dial, key, host) = if *scheme == Scheme::HTTPS {
            (dial(None), authority.clone(), None)
        } else {
            let address =
                Uri::builder().scheme(scheme.clone()).authority(authority.clone()).path_and_query("/").build();
            let host = HeaderValue::from_str(&host_header(&authority));
            match (address, host) {
                (Ok(address), Ok(host)) => (dial(Some(address)), POOL_KEY, Some(host)),
                // Both come from a parsed URL's authority, so neither fails; if one did, the
                // real authority in the URI still works, only without the cheaper key.
                _ => (dial(None), authority.clone(), None),
            }
        };
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(60)).build(dial);
        Instance { authority, pinned, label, key, host, client, health }
    }
}

impl Instance {
    /// Sends `request` (prepared for the upstream) to this instance: its address, its Host.
    pub(super) async fn send(&self, mut request: Request<Body>) -> Result<Response<Incoming>, Failure> {
        if request.uri().authority() != Some(&self.key) {
            let mut parts = request.uri().clone().into_parts();
            parts.authority = Some(self.key.clone());
            if let Ok(uri) = Uri::from_parts(parts) {
                *request.uri_mut() = uri;
            }
        }
        if let Some(host) = &self.host {
            request.headers_mut().insert(http::header::HOST, host.clone());
        }
        let _in_flight = self.health.load.begin();
        let _counted = self.health.metrics.as_ref().map(|m| {
            m.requests.inc();
            m.in_flight.inc();
            Counted(&m.in_flight)
        });
        self.client.request(request).await.map_err(Failure::of)
    }
}

/// A request counted in an instance's `in_flight` until its answer's head (or its error).
struct Counted<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}
