//! The admin listener's client: one `/keys` call over http or https within a deadline, and
//! its answer, judged by status (a problem document becomes the failure it describes).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idemgate::config::Config;
use idemgate::operator::wire;
use idemgate::outbound::{self, Roots, TlsSetupError, error_chain};
use serde_json::Value;

use super::failure::Failure;
use super::input::{CallerScope, TOKEN_VAR, admin_token, bearer};
use super::render::{printable, snippet};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// One exchange with the admin listener, answer body included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A page of 1000 records is a few hundred KiB; far more means the URL names something else.
const MAX_ANSWER_BYTES: usize = 32 << 20;

/// `route=R&key=K[&scope_hash=H][&host=H]`, percent-encoded: keys may hold any printable
/// character.
pub(super) fn target_query(route: &str, key: &str, scope: &CallerScope) -> String {
    let mut pairs = vec![("route", route), ("key", key)];
    if let Some(hash) = &scope.hash {
        pairs.push(("scope_hash", hash));
    }
    if let Some(host) = &scope.host {
        pairs.push(("host", host));
    }
    encode_query(&pairs)
}

pub(super) fn encode_query(pairs: &[(&str, &str)]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        query.append_pair(name, value);
    }
    query.finish()
}

pub(super) fn is_absent(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body)
        .is_ok_and(|doc| doc.get("state").and_then(Value::as_str) == Some(wire::ABSENT))
}

#[derive(Clone)]
pub(crate) struct AdminUrl {
    pub(super) scheme: Scheme,
    pub(super) authority: Authority,
    /// Without the trailing slash: `""`, or a prefix when a proxy serves the listener under one.
    pub(super) base_path: String,
}

impl std::fmt::Display for AdminUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.base_path)
    }
}

pub(crate) fn parse_admin_url(s: &str) -> Result<AdminUrl, String> {
    let uri: Uri = s.parse().map_err(|e| format!("not a URL: {e}"))?;
    let scheme = match uri.scheme_str() {
        Some("http") => Scheme::HTTP,
        Some("https") => Scheme::HTTPS,
        _ => return Err("expected an http:// or https:// URL, e.g. http://127.0.0.1:9090".into()),
    };
    let authority = uri.authority().cloned().ok_or("the URL has no host")?;
    if authority.as_str().contains('@') {
        return Err(format!("no credentials in the URL: the token comes from {TOKEN_VAR}"));
    }
    if uri.query().is_some() {
        return Err("expected a base URL, without a query".into());
    }
    Ok(AdminUrl { scheme, authority, base_path: uri.path().trim_end_matches('/').to_owned() })
}

pub(crate) struct AdminClient {
    pub(super) url: AdminUrl,
    /// None for the endpoints anyone who reaches the listener may read (`/metrics`).
    pub(super) token: Option<HeaderValue>,
    pub(super) client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// The client's TLS: the system's roots (or `SSL_CERT_FILE`) for an https:// URL, none else.
fn tls_config(https: bool) -> Result<rustls::ClientConfig, Failure> {
    outbound::tls_config(if https { Roots::System } else { Roots::None }).map_err(|e| match e {
        TlsSetupError::NoSystemRoots => {
            Failure::Usage("no CA certificates found for https; set SSL_CERT_FILE to a bundle".into())
        }
        TlsSetupError::CaFile(detail) | TlsSetupError::Protocol(detail) => {
            Failure::Failed(format!("TLS setup: {detail}"))
        }
    })
}

/// The admin listener's answer, before its status is judged.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) body: Bytes,
}

impl AdminClient {
    pub(super) fn new(url: &AdminUrl, token: HeaderValue) -> Result<Self, Failure> {
        Self::with_token(url, Some(token))
    }

    /// A client for the endpoints that need no token (`/metrics`).
    pub(crate) fn anonymous(url: &AdminUrl) -> Result<Self, Failure> {
        Self::with_token(url, None)
    }

    fn with_token(url: &AdminUrl, token: Option<HeaderValue>) -> Result<Self, Failure> {
        let mut http = HttpConnector::new();
        // The connector is handed https:// URIs too; the TLS layer above it takes those.
        http.enforce_http(false);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(url.scheme == Scheme::HTTPS)?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self { url: url.clone(), token, client })
    }

    pub(super) async fn call(
        &self,
        method: Method,
        query: &str,
        scope: &CallerScope,
        json_body: Option<Vec<u8>>,
    ) -> Result<Answer, Failure> {
        let mut request = self.request(method, &format!("/keys?{query}"))?;
        request = request.header(header::ACCEPT, "application/json, application/problem+json");
        for (name, value) in &scope.headers {
            request = request.header(name, value);
        }
        if json_body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        self.fetch(request, Bytes::from(json_body.unwrap_or_default()), "/keys").await
    }

    /// `GET path` (a path of the listener's, such as `/metrics`).
    pub(crate) async fn get(&self, path: &str) -> Result<Answer, Failure> {
        let request = self.request(Method::GET, path)?;
        self.fetch(request, Bytes::new(), path).await
    }

    fn request(&self, method: Method, path_and_query: &str) -> Result<http::request::Builder, Failure> {
        let uri = Uri::builder()
            .scheme(self.url.scheme.clone())
            .authority(self.url.authority.clone())
            .path_and_query(format!("{}{path_and_query}", self.url.base_path))
            .build()
            .map_err(|e| Failure::Usage(format!("cannot build the request URL: {e}")))?;
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(token) = &self.token {
            request = request.header(header::AUTHORIZATION, token.clone());
        }
        Ok(request)
    }

    /// One exchange, answer body included, within [`REQUEST_TIMEOUT`]; `what` names it in errors.
    async fn fetch(&self, request: http::request::Builder, body: Bytes, what: &str) -> Result<Answer, Failure> {
        let request =
            request.body(Full::new(body)).map_err(|e| Failure::Usage(format!("cannot build the request: {e}")))?;
        let method = request.method().clone();
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| {
                Failure::Failed(format!("cannot reach the admin listener at {}: {}", self.url, error_chain(&e)))
            })?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES).collect().await.map_err(|e| {
                Failure::Failed(format!("reading the admin listener's answer ({status}): {}", error_chain(e.as_ref())))
            })?;
            Ok(Answer { status, body: body.to_bytes() })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange).await.map_err(|_| {
            Failure::Failed(format!(
                "the admin listener at {} did not answer {method} {what} within {}s",
                self.url,
                REQUEST_TIMEOUT.as_secs()
            ))
        })?
    }
}

impl Answer {
    /// The JSON document of a 2xx answer; any other answer is the failure its problem
    /// document describes.
    pub(super) fn document(self) -> Result<Value, Failure> {
        let doc = serde_json::from_slice::<Value>(&self.body);
        if !self.status.is_success() {
            return Err(Failure::Failed(problem_line(self.status, doc.ok().as_ref(), &self.body)));
        }
        doc.map_err(|_| {
            Failure::Failed(format!(
                "the admin listener answered {} with something other than JSON: {}",
                self.status,
                snippet(&self.body)
            ))
        })
    }
}

/// `<status> <title>: <detail>` from a problem+json document, or what can be said without one.
pub(crate) fn problem_line(status: StatusCode, doc: Option<&Value>, body: &[u8]) -> String {
    let field = |name| doc.and_then(|d| d.get(name)).and_then(Value::as_str).map(printable);
    let title = field("title").unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_owned());
    let detail = match (field("detail"), doc) {
        (Some(detail), _) => detail,
        // Not a problem document: show what came, it is all there is to go on.
        (None, None) if !body.is_empty() => snippet(body),
        (None, _) => String::new(),
    };
    if detail.is_empty() {
        format!("{} {title}", status.as_u16())
    } else {
        format!("{} {title}: {detail}", status.as_u16())
    }
}

/// The admin listener to ask and the token to show it: `--admin` with `IDEMGATE_ADMIN_TOKEN`,
/// or both read from the configuration file `--config` names.
pub(super) fn admin_target(
    admin: Option<&AdminUrl>,
    config: Option<&Path>,
) -> Result<(AdminUrl, HeaderValue), Failure> {
    match (admin, config) {
        (Some(url), _) => Ok((url.clone(), admin_token()?)),
        (None, Some(path)) => from_config(path),
        // clap requires one of the two.
        (None, None) => {
            Err(Failure::Usage("give the admin listener's URL (--admin) or a configuration file (--config)".into()))
        }
    }
}

/// The admin listener's URL as the configuration file at `path` names it (`report --config`).
pub(crate) fn admin_url_of(path: &Path) -> Result<AdminUrl, Failure> {
    read_config(path).map(|(_, url)| url)
}

/// The configuration file at `path`, and its admin listener's URL.
fn read_config(path: &Path) -> Result<(Config, AdminUrl), Failure> {
    let config = Config::load(path).map_err(|e| Failure::Usage(e.to_string()))?;
    let file = path.display();
    let Some(listen) = config.server.admin_listen else {
        return Err(Failure::Usage(format!(
            "{file}: server.admin_listen is not set, so the gateway serves no admin listener; set it, or give --admin URL"
        )));
    };
    // A listener on every address is reached on this machine's own.
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    // With [server.admin_tls] the listener speaks only TLS; its certificate must name the
    // address (or SSL_CERT_FILE hold its CA).
    let scheme = if config.server.admin_tls.is_some() { "https" } else { "http" };
    let url = parse_admin_url(&format!("{scheme}://{}", SocketAddr::new(ip, listen.port())))
        .map_err(|e| Failure::Usage(format!("{file}: server.admin_listen: {e}")))?;
    Ok((config, url))
}

/// The admin listener and its token as a configuration file names them.
fn from_config(path: &Path) -> Result<(AdminUrl, HeaderValue), Failure> {
    let (config, url) = read_config(path)?;
    let file = path.display();
    let token = match config.server.admin_token.as_deref() {
        Some(token) => bearer(token, "the file's admin token")?,
        None if std::env::var_os(TOKEN_VAR).is_some() => admin_token()?,
        None => {
            return Err(Failure::Usage(format!(
                "{file} sets neither server.admin_token nor server.admin_token_env, and {TOKEN_VAR} is not set"
            )));
        }
    };
    Ok((url, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_urls() {
        let url = parse_admin_url("https://admin.example:9443/gw/").unwrap();
        assert_eq!(url.to_string(), "https://admin.example:9443/gw");
        assert!(parse_admin_url("127.0.0.1:9090").is_err());
        assert!(parse_admin_url("http://user:pw@host").is_err());
    }
}
