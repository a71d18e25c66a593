//! Dial: the connector below each instance's pool. It makes the TCP connection (to the
//! instance's pinned address when it has one) and the TLS handshake above it, whatever
//! authority the request's URI carries (see [`super::POOL_KEY`]).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;

/// The pooled client's connector: connects to the upstream's real address, whatever
/// authority the request's URI carries (see [`super::POOL_KEY`]).
#[derive(Clone)]
pub(super) struct Dial {
    connector: HttpsConnector<Pinned>,
    /// The cleartext upstream's address; `None`: the URI's own (TLS upstreams).
    address: Option<Uri>,
}

type DialFuture =
    Pin<Box<dyn Future<Output = Result<MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>, BoxError>> + Send>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Dial {
    /// A connector over `tls`, each TCP connect bounded by `connect_timeout`; to `pinned`,
    /// when given, instead of what the name resolves to, and to `address` (a cleartext
    /// upstream's), when given, instead of the URI's authority.
    pub(super) fn new(
        tls: rustls::ClientConfig,
        connect_timeout: Duration,
        pinned: Option<SocketAddr>,
        address: Option<Uri>,
    ) -> Self {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        let to = pinned.and_then(|address| {
            Uri::builder().scheme("http").authority(address.to_string()).path_and_query("/").build().ok()
        });
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(Pinned { http, to });
        Self { connector, address }
    }
}

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

/// The TCP connector below TLS: connects to the instance's pinned address when it has one.
/// TLS, above, still takes the name from the URI, so the server name sent and the
/// certificate checked stay the configured host's, whatever address it resolved to.
#[derive(Clone)]
struct Pinned {
    http: HttpConnector,
    /// `http://ADDRESS:PORT/`: only its host and port are read.
    to: Option<Uri>,
}

impl tower_service::Service<Uri> for Pinned {
    type Response = <HttpConnector as tower_service::Service<Uri>>::Response;
    type Error = <HttpConnector as tower_service::Service<Uri>>::Error;
    type Future = <HttpConnector as tower_service::Service<Uri>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let dst = self.to.clone().unwrap_or(dst);
        self.http.call(dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pinned_instance_connects_to_its_address_whatever_name_it_is_asked_for() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let mut pinned = Pinned { http, to: Some(format!("http://{address}/").parse().unwrap()) };
        // A name that resolves nowhere (RFC 6761's .invalid) on another port: only the pinned
        // address can have been connected to.
        let target: Uri = "https://orders.invalid:1/".parse().unwrap();
        let connecting = tower_service::Service::call(&mut pinned, target);
        let (accepted, connected) =
            tokio::time::timeout(Duration::from_secs(5), async { tokio::join!(listener.accept(), connecting) })
                .await
                .expect("no connection within 5 s");
        let (accepted, connected) = (accepted.unwrap().0, connected.unwrap());
        assert_eq!(connected.inner().peer_addr().unwrap(), address);
        assert_eq!(accepted.peer_addr().unwrap(), connected.inner().local_addr().unwrap());
    }
}
