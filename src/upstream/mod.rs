//! Upstream: the pooled clients that talk to one named service, over one or several
//! instances.
//!
//! Each instance has a pool of its own; a request goes to one of them, chosen by
//! [`balance`] (least outstanding requests over two random choices, instances that keep
//! failing left out for a while: see [`health`]). A request that was never sent — no connection
//! could be made (or none yet when its deadline passed: see [`dial`]), or an HTTP/2 stream
//! the instance refused or never processed (RFC 9113 §8.7) — may go to another instance when
//! its body is buffered ([`Upstream::send_buffered`]); one that was sent never does: its
//! outcome is unknown, and the idempotent path's rules for that apply, whatever the instance.
//! hyper-util's pool, below, retries on the same instance a request whose reused connection
//! closed before the request was written to it; that one was never sent either.
//!
//! With `resolve_every`, the instances are the addresses `url`'s host name resolves to, looked
//! up again in the background ([`resolve`]); each request is balanced over the instances of
//! the moment.
//!
//! Upstreams are `http://` or `https://` (rustls; system roots, or the CA bundle named by
//! `ca_file`). HTTP/2 is negotiated by ALPN over TLS; cleartext upstreams speak HTTP/1.1.
//! The request sent upstream is the client's, minus hop-by-hop headers, with the
//! `X-Forwarded-*` headers set and `Idempotency-Key` left untouched so that the upstream's
//! own UNIQUE constraint can do its work.
//!
//! The files, each with one job:
//! - this one: the [`Upstream`], built from its configuration, and how a request is sent to
//!   its instances ([`Upstream::send`], [`Upstream::send_buffered`]);
//! - [`prepare`]: how a request is addressed: its URI, `Host`, the `X-Forwarded-*` headers;
//! - [`set`]: the instances a request is balanced over, fixed or resolved;
//! - [`instance`]: one instance, its address and its pool, and how one is built;
//! - [`balance`]: which instance a request goes to; [`health`]: what an instance's exchanges
//!   say about it;
//! - [`dial`]: the connector below each instance's pool, bounded by the request's deadline;
//! - [`resolve`]: a host name looked up again into instances;
//! - [`tls`]: the TLS configuration of the pools; [`error`]: why an exchange or a setup failed.

mod balance;
pub use self::balance::Standing;
mod dial;
mod error;
mod health;
mod instance;
mod prepare;
mod resolve;
mod set;
mod tls;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use http::uri::Scheme;
use http::{Request, Response, request};
use hyper::body::Incoming;
use tokio::time::Instant;

use self::error::{Failure, ours};
pub use self::error::{UpstreamError, UpstreamSetupError};
use self::instance::{Instance, Template};
use self::prepare::{POOL_KEY, Target};
use self::resolve::Resolved;
use self::set::{Members, Set};
use self::tls::tls_config;
use crate::body::{self, Body};
use crate::config::UpstreamConfig;
use crate::forwarded::Peer;
use crate::metrics::Instances;
use crate::outbound::error_chain;

/// One upstream service.
pub struct Upstream {
    name: String,
    /// Where its requests go, whichever instance sends them.
    target: Target,
    timeout: Duration,
    members: Members,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.set();
        let instances: Vec<&str> = set.iter().map(|i| i.label.as_str()).collect();
        f.debug_struct("Upstream").field("name", &self.name).field("instances", &instances).finish()
    }
}

impl Upstream {
    /// Builds the clients for one configured upstream, a pool per instance; with several
    /// instances (or a name resolved again), each counted in `metrics` (when given). A
    /// resolved upstream starts with one instance on its name, looked up at each connection,
    /// until [`Upstream::start_resolving`] has looked it up.
    pub fn new(config: &UpstreamConfig, metrics: Option<&Arc<Instances>>) -> Result<Self, UpstreamSetupError> {
        let first = config.urls.first().ok_or_else(|| UpstreamSetupError::Tls {
            upstream: config.name.clone(),
            detail: "no URL (validation should have caught this)".into(),
        })?;
        let scheme = first.scheme().cloned().unwrap_or(Scheme::HTTP);
        let base_path = first.path().trim_end_matches('/').to_owned();
        let template = Template {
            upstream: config.name.clone(),
            scheme: scheme.clone(),
            tls: tls_config(config)?,
            connect_timeout: config.connect_timeout,
            ejection: config.ejection,
            outliers: config.urls.len() > 1 || config.resolve_every.is_some(),
        };
        let mut instances = Vec::with_capacity(config.urls.len());
        for url in &config.urls {
            let authority = url.authority().cloned().ok_or_else(|| UpstreamSetupError::Tls {
                upstream: config.name.clone(),
                detail: format!("{url} has no host"),
            })?;
            let counted = metrics
                .filter(|_| config.urls.len() > 1 || config.resolve_every.is_some())
                .map(|families| families.instance(&config.name, authority.as_str()));
            instances.push(Arc::new(template.instance(authority, None, counted)));
        }
        let key = instances.first().map_or(POOL_KEY, |i| i.key.clone());
        let members = match (config.resolve_every, instances.first()) {
            (Some(every), Some(first)) => {
                let resolved = Resolved::new(template, Arc::clone(first), every, metrics.cloned());
                Members::Resolved(Arc::new(resolved))
            }
            _ => Members::Fixed(instances),
        };
        let target = Target { scheme, base_path, key };
        Ok(Self { name: config.name.clone(), target, timeout: config.timeout, members })
    }

    /// Starts looking the host name up again in the background, for an upstream with
    /// `resolve_every` (once; nothing otherwise). The lookups stop when the upstream is
    /// dropped. Must run inside the gateway's tokio runtime.
    pub fn start_resolving(&self) {
        if let Members::Resolved(resolved) = &self.members {
            resolve::start(resolved);
        }
    }

    /// Takes the addresses `before` (the upstream of the configuration a reload replaces)
    /// resolved its name to, when both resolve the same name: the new upstream starts at those
    /// addresses instead of at the name. Nothing otherwise.
    pub fn carry_over(&self, before: &Upstream) {
        if let (Members::Resolved(now), Members::Resolved(then)) = (&self.members, &before.members)
            && self.target.scheme == before.target.scheme
        {
            now.carry_over(then);
        }
    }

    fn set(&self) -> Set<'_> {
        match &self.members {
            Members::Fixed(list) => Set::Fixed(list),
            Members::Resolved(resolved) => Set::Resolved(resolved.current()),
        }
    }

    /// Each instance's address (as its metrics label it) and standing now.
    pub fn standings(&self) -> Vec<(String, Standing)> {
        let now = tokio::time::Instant::now();
        self.set().iter().map(|i| (i.label.clone(), i.health.load.standing(now))).collect()
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The deadline of one exchange.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Turns the client's request head into the upstream's: target path, headers. The
    /// instance, chosen when it is sent, adds its own address and `Host`.
    pub fn prepare(&self, parts: &mut request::Parts, peer: &Peer) {
        self.target.rewrite(parts, peer);
    }

    /// Sends a prepared request to one instance and waits for the response head, until
    /// `deadline` (which the caller may go on using for the body). A streamed body cannot be
    /// sent twice, so a request that could not be sent fails here.
    pub async fn send(&self, request: Request<Body>, deadline: Instant) -> Result<Response<Incoming>, UpstreamError> {
        let set = self.set();
        self.within(deadline, self.send_to(&set[self.pick(&set, &[])], request)).await
    }

    /// `sending`, until `deadline`. Any dial it starts ends by then too, and first (see
    /// [`dial`]): a request still waiting for a connection at the deadline fails as never
    /// sent ([`UpstreamError::Unreachable`]); one past that point, as timed out.
    ///
    /// Not an `async fn`: one would keep `sending` beside the copy it awaits, twice the
    /// request's future in every future above it (each copied whole as it is made).
    fn within<T>(
        &self,
        deadline: Instant,
        sending: impl Future<Output = Result<T, UpstreamError>>,
    ) -> impl Future<Output = Result<T, UpstreamError>> {
        let timed = tokio::time::timeout_at(deadline, dial::by(deadline, sending));
        futures_util::FutureExt::map(timed, move |done| done.unwrap_or_else(|_| Err(self.timed_out())))
    }

    async fn send_to(&self, instance: &Instance, request: Request<Body>) -> Result<Response<Incoming>, UpstreamError> {
        match instance.send(request).await {
            Ok(response) => {
                instance.health.answered(response.status());
                Ok(response)
            }
            Err(failure) => Err(self.failed(instance, failure)),
        }
    }

    /// Sends a prepared request whose body is whole, until `deadline`: a request no instance
    /// was sent (no connection, a refused stream) goes to another while time is left, once to
    /// each at most; one that was sent is never sent again.
    pub async fn send_buffered(
        &self,
        request: Request<Bytes>,
        deadline: Instant,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let set = self.set();
        // One instance: nowhere else to go, and no copy of the head to keep.
        if set.len() == 1 {
            return self.within(deadline, self.send_to(&set[0], request.map(body::full))).await;
        }
        self.within(deadline, self.send_elsewhere(&set, request, deadline)).await
    }

    async fn send_elsewhere(
        &self,
        set: &[Arc<Instance>],
        request: Request<Bytes>,
        deadline: Instant,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let (parts, body) = request.into_parts();
        let mut tried: Vec<usize> = Vec::new();
        loop {
            let index = self.pick(set, &tried);
            let instance = &set[index];
            tried.push(index);
            let mut again = Request::new(body::full(body.clone()));
            *again.method_mut() = parts.method.clone();
            *again.uri_mut() = parts.uri.clone();
            *again.version_mut() = parts.version;
            *again.headers_mut() = parts.headers.clone();
            match instance.send(again).await {
                Ok(response) => {
                    instance.health.answered(response.status());
                    return Ok(response);
                }
                // Hazard: with no time left, another instance could take the request on a kept
                // connection at once and be cut off unanswered: never sent would become unknown.
                Err(failure @ (Failure::Connect(_) | Failure::Refused(_)))
                    if tried.len() < set.len() && Instant::now() < deadline =>
                {
                    let error = self.failed(instance, failure);
                    tracing::debug!(upstream = %self.name, instance = %instance.label, error = %error, "never sent; trying another instance");
                }
                Err(failure) => return Err(self.failed(instance, failure)),
            }
        }
    }

    /// The index in `set` of an instance for the next request, leaving out `tried`.
    fn pick(&self, set: &[Arc<Instance>], tried: &[usize]) -> usize {
        if set.len() == 1 {
            return 0;
        }
        let load = |i: usize| &*set[i].health.load;
        let now = Instant::now();
        balance::pick(set.len(), load, tried, now, &mut |n| rand::random_range(0..n)).unwrap_or(0)
    }

    /// The error of a failed exchange, noted against its instance's health (a connect
    /// failure was, by the connector).
    fn failed(&self, instance: &Instance, failure: Failure) -> UpstreamError {
        let upstream = self.name.clone();
        match failure {
            Failure::Connect(e) => UpstreamError::Unreachable { upstream, detail: error_chain(&e) },
            // The instance answered at the protocol level: it is up.
            Failure::Refused(e) => {
                instance.health.refused();
                UpstreamError::Unreachable { upstream, detail: error_chain(&e) }
            }
            Failure::Sent(e) => {
                instance.health.broke(ours(&e));
                UpstreamError::Failed { upstream, detail: error_chain(&e) }
            }
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
