//! The schema of `gateway.toml`, exactly as written by the operator.
//!
//! Unknown keys are errors: a misspelt `leas = "5s"` must fail loudly instead of silently
//! running with the default lease. `source.rs` collects them all (rather than serde stopping
//! at the first), so the tables here do not deny them themselves. Values are checked further
//! in `validate/`, which turns this schema into the runtime [`Config`](super::Config).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::units::{HumanDuration, HumanSize};

/// The whole file.
#[derive(Debug, Deserialize)]
pub struct File {
    /// Listeners and process-wide settings.
    pub server: ServerSection,
    /// Where idempotency records live.
    pub store: StoreSection,
    /// Named upstream services that routes forward to.
    #[serde(default)]
    pub upstreams: BTreeMap<String, UpstreamSection>,
    /// Routes, matched on method and path.
    #[serde(default)]
    pub routes: Vec<RouteSection>,
    /// The gateway's errors in the API's own shape; problem+json when absent.
    #[serde(default)]
    pub errors: Option<ErrorsSection>,
    /// Traces exported over OTLP; off when absent.
    #[serde(default)]
    pub telemetry: Option<TelemetrySection>,
}

/// `[telemetry]`
#[derive(Debug, Default, Deserialize)]
pub struct TelemetrySection {
    /// The OTLP/HTTP collector, e.g. `"http://otel-collector:4318"`; spans go to its `/v1/traces`.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the spans.
    pub service_name: Option<String>,
    /// The share of requests traced when the client's own sampling decision is not believed.
    pub sample_ratio: Option<f64>,
    /// An environment variable holding a header for the collector, `Name: value` (an auth
    /// token kept out of the file).
    pub headers_env: Option<String>,
    /// A CA bundle for an `https://` collector signed by a private CA.
    pub ca_file: Option<PathBuf>,
}

/// `[errors]` and `[routes.errors]`: a content type and a body template, and per problem type
/// (`[errors.key-reused]`, ...) its own status, body and headers.
#[derive(Debug, Default)]
pub struct ErrorsSection {
    /// `application/json` (or `application/*+json`) or `text/plain`.
    pub content_type: Option<String>,
    /// The body template for every problem type without one of its own.
    pub body: Option<String>,
    /// `[errors.TYPE]`, by problem type.
    pub types: BTreeMap<String, ErrorTypeSection>,
}

/// `[errors.TYPE]`
#[derive(Debug, Default, Deserialize)]
pub struct ErrorTypeSection {
    /// The status instead of the gateway's.
    pub status: Option<i64>,
    /// The body template instead of the section's.
    pub body: Option<String>,
    /// Headers added to the answer, e.g. `{ "Stripe-Should-Retry" = "false" }`.
    pub headers: Option<BTreeMap<String, String>>,
}

// By hand: the section's own keys sit beside its `[errors.TYPE]` tables, which any other key
// names. (serde's `flatten` would hide misspelt keys inside those tables.)
impl<'de> Deserialize<'de> for ErrorsSection {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ErrorsSection;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a table with content_type, body and [errors.TYPE] tables")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ErrorsSection, A::Error> {
                let mut out = ErrorsSection::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "content_type" => out.content_type = Some(map.next_value()?),
                        "body" => out.body = Some(map.next_value()?),
                        _ => {
                            let section = map.next_value::<ErrorTypeSection>()?;
                            out.types.insert(key, section);
                        }
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(V)
    }
}

/// `[server]`
#[derive(Debug, Deserialize)]
pub struct ServerSection {
    /// Address the proxy listens on, e.g. `"0.0.0.0:8080"`.
    pub listen: String,
    /// Address of the admin listener (`/healthz`, `/readyz`, `/metrics`); none when absent.
    pub admin_listen: Option<String>,
    /// Bearer token that guards the admin key inspect/purge endpoints; they are off without it.
    pub admin_token: Option<String>,
    /// Name of an environment variable holding the admin token (instead of `admin_token`).
    pub admin_token_env: Option<String>,
    /// Named admin tokens, each with its role (`[[server.admin_tokens]]`).
    pub admin_tokens: Option<Vec<AdminTokenSection>>,
    /// Entries the audit trail keeps; the oldest go first.
    pub audit_max_entries: Option<u64>,
    /// Age past which audit entries go.
    pub audit_max_age: Option<HumanDuration>,
    /// How long in-flight exchanges may run on after SIGTERM before their keys are released.
    pub shutdown_grace: Option<HumanDuration>,
    /// Prefix of the `type` URI of problem+json error responses; the error's slug is appended.
    pub problem_base: Option<String>,
    /// Threads that serve requests; the number of CPUs when absent.
    pub worker_threads: Option<usize>,
    /// A request head (and, on a new connection, its first byte) must arrive within this.
    pub header_read_timeout: Option<HumanDuration>,
    /// An idempotent route's whole request body must arrive within this (408 after it).
    pub body_read_timeout: Option<HumanDuration>,
    /// A keep-alive connection with no request for this long is closed.
    pub idle_timeout: Option<HumanDuration>,
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: Option<usize>,
    /// Connections the admin listener serves at once; further ones wait in its backlog.
    pub admin_max_connections: Option<usize>,
    /// Largest request head (431 above it).
    pub max_header_bytes: Option<HumanSize>,
    /// Upstream exchanges of idempotent routes running at once (503 above it).
    pub max_exchanges: Option<usize>,
    /// The same, per client connection.
    pub max_exchanges_per_connection: Option<usize>,
    /// Requests a client may abandon (reset) on one connection before it is closed (GOAWAY).
    pub max_reset_streams: Option<usize>,
    /// HTTP/2 keep-alive ping interval; `"0s"` sends none.
    pub h2_keepalive_interval: Option<HumanDuration>,
    /// Peers (IPs or CIDR blocks) whose Forwarded / X-Forwarded-* / X-Real-IP are believed.
    pub trusted_proxies: Option<Vec<String>>,
    /// `"pretty"` (text) or `"json"` (one object per line); `--log-format` overrides it.
    pub log_format: Option<String>,
    /// Serve the proxy listener over TLS.
    pub tls: Option<TlsSection>,
    /// Serve the admin listener over TLS.
    pub admin_tls: Option<AdminTlsSection>,
}

/// `[server.admin_tls]`
#[derive(Debug, Deserialize)]
pub struct AdminTlsSection {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
}

/// `[[server.admin_tokens]]`: one operator's (or one tool's) token. The secret is never in
/// the file: it is read from the environment or from a file of its own.
#[derive(Debug, Deserialize)]
pub struct AdminTokenSection {
    /// Who holds it, as the audit trail names them.
    pub name: String,
    /// `"read"` or `"operate"`.
    pub role: String,
    /// Name of an environment variable holding the token.
    pub token_env: Option<String>,
    /// A file holding the token (trailing whitespace ignored), e.g. a mounted secret.
    pub token_file: Option<PathBuf>,
}

/// `[server.tls]`
#[derive(Debug, Deserialize)]
pub struct TlsSection {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
    /// Certificates for named hosts, chosen by the name a client sends (SNI); `cert` and
    /// `key` above serve every other name, and clients that send none.
    pub certs: Option<Vec<HostCertSection>>,
}

/// `[[server.tls.certs]]`
#[derive(Debug, Deserialize)]
pub struct HostCertSection {
    /// The hosts whose name selects this certificate: `"api.example.com"`, `"*.example.com"`.
    pub hosts: Vec<String>,
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
}

/// `[store]`
#[derive(Debug, Deserialize)]
pub struct StoreSection {
    /// `"redis"` (shared by any number of gateways) or `"memory"` (one instance, development).
    pub backend: String,
    /// Redis URL, `redis://[user:password@]host:port[/db]`; required for the redis backend.
    pub url: Option<String>,
    /// Maximum time for one store call; slower calls count as the store being down.
    pub timeout: Option<HumanDuration>,
    /// Multiplexed Redis connections; each carries any number of concurrent calls.
    pub connections: Option<usize>,
    /// Prefix of every Redis key (and of the notification channel) this gateway writes.
    pub key_prefix: Option<String>,
    /// `rediss://`: PEM CA bundle replacing the system roots.
    pub ca_file: Option<PathBuf>,
    /// `rediss://`: PEM client certificate, for mutual TLS (with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// `rediss://`: PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Name of an environment variable holding the Redis password (overrides one in the URL).
    pub password_env: Option<String>,
    /// Replicas that must hold a claim before its request is forwarded, and an answer before
    /// it is replied (Redis `WAIT`); 0: none waited for.
    pub replica_acks: Option<u32>,
    /// How long to wait for `replica_acks` replicas to acknowledge a write.
    pub replica_ack_timeout: Option<HumanDuration>,
    /// Memory backend: maximum number of records kept.
    pub max_entries: Option<usize>,
    /// Memory backend: maximum bytes of stored responses kept.
    pub max_bytes: Option<HumanSize>,
}

/// `[upstreams.NAME]`
#[derive(Debug, Deserialize)]
pub struct UpstreamSection {
    /// Base URL, `http://host:port` or `https://host:port`, optionally with a path prefix.
    pub url: Option<String>,
    /// Several instances of one service, each a base URL like `url` (instead of `url`).
    pub urls: Option<Vec<String>>,
    /// Look `url`'s host name up again this often; each address it resolves to is an
    /// instance.
    pub resolve_every: Option<HumanDuration>,
    /// Connect failures running that leave an instance out of the balance.
    pub eject_after: Option<u32>,
    /// Exchanges running that broke before any answer (reset, closed) that leave an instance
    /// out of the balance; 0: never.
    pub eject_after_broken: Option<u32>,
    /// 502, 503 and 504 answers running that leave an instance out of the balance; 0: never.
    pub eject_after_gateway_errors: Option<u32>,
    /// How long an instance is left out the first time; doubled while it keeps failing.
    pub eject_for: Option<HumanDuration>,
    /// Maximum time for the upstream to answer (for idempotent routes: the whole response).
    pub timeout: Option<HumanDuration>,
    /// Maximum time to establish a connection.
    pub connect_timeout: Option<HumanDuration>,
    /// PEM file of CA certificates to trust for `https://` instead of the system roots.
    pub ca_file: Option<PathBuf>,
}

/// `[[routes]]`
#[derive(Debug, Deserialize)]
pub struct RouteSection {
    /// Unique name; appears in metrics and logs, and is part of every record's identity.
    pub name: String,
    /// Hosts this route serves (`"api.example.com"`, `"*.example.com"`); every host when absent.
    pub hosts: Option<Vec<String>>,
    /// HTTP methods this route matches; all methods when absent.
    pub methods: Option<Vec<String>>,
    /// Path pattern: exact (`/orders`), with parameters (`/orders/{id}`) or a tail (`/api/{*rest}`).
    pub path: String,
    /// Name of an `[upstreams.NAME]` table.
    pub upstream: String,
    /// Makes the route idempotent; without it the route is a streaming pass-through proxy.
    pub idempotency: Option<IdempotencySection>,
    /// This route's errors in the API's own shape, over `[errors]`.
    pub errors: Option<ErrorsSection>,
}

/// `[routes.idempotency]`
#[derive(Debug, Default, Deserialize)]
pub struct IdempotencySection {
    /// `"enforce"` (the default) or `"observe"`: forward everything as a pass-through route
    /// would, and count what enforcing would have done.
    pub mode: Option<String>,
    /// Reject requests without a key (400) instead of passing them through.
    pub required: Option<bool>,
    /// Name of the key header.
    pub header: Option<String>,
    /// Longest accepted key, in characters.
    pub max_key_len: Option<usize>,
    /// Whose keys these are: `"global"`, or one or a list of `"header:NAME"` and
    /// `"cookie:NAME"` (their values, hashed together).
    pub scope: Option<OneOrMany>,
    /// A keyed request missing a scope source: `"reject"` (400) or `"anonymous"`.
    pub on_missing_scope: Option<String>,
    /// JSON Pointers (RFC 6901) of body fields left out of the fingerprint.
    pub ignore: Option<Vec<String>>,
    /// Request headers included in the fingerprint.
    pub fingerprint_headers: Option<Vec<String>>,
    /// How long a claim is held without renewal before another request may take it over.
    pub lease: Option<HumanDuration>,
    /// Renew the lease while the upstream call runs.
    pub renew: Option<bool>,
    /// How long a duplicate waits for the first request to finish before getting 409.
    pub wait: Option<HumanDuration>,
    /// How long a completed response is kept for replay.
    pub retention: Option<HumanDuration>,
    /// Upstream statuses that are stored and replayed: `"2xx"`-style classes or exact codes;
    /// `"!429"` or `"!5xx"` takes a code or class out again.
    pub store_statuses: Option<Vec<StatusEntry>>,
    /// Largest request body accepted (413 above it).
    pub max_request_body: Option<HumanSize>,
    /// Largest response body stored; a larger response is delivered, and recorded as executed
    /// without its body (a retry gets `response-not-stored`).
    pub max_stored_body: Option<HumanSize>,
    /// Extra response headers never stored (Set-Cookie, WWW-Authenticate, Proxy-* and
    /// hop-by-hop headers are never stored in any case).
    pub exclude_headers: Option<Vec<String>>,
    /// When set, the only response headers stored for replay.
    pub replay_headers: Option<Vec<String>>,
    /// `"fail-closed"` (503, nothing forwarded) or `"fail-open"` (forward, store nothing).
    pub on_store_error: Option<String>,
    /// Header added to replayed responses.
    pub replay_header: Option<String>,
    /// Whether operate tokens may see the start of a stored body through the admin API and
    /// the console (off: bodies carry customers' data).
    pub admin_body_preview: Option<bool>,
    /// Sent upstream, but no complete answer: `"hold"` the key (retries get 502
    /// outcome-unknown) or `"release"` it (retries run again).
    pub on_unknown_outcome: Option<String>,
    /// Header carrying the execution attempt to the upstream; `""` sends none.
    pub attempt_header: Option<String>,
    /// New keys allowed per caller: `"100/s"`, `"6000/m"`, `"50/10s"`; no limit when absent.
    pub max_new_keys: Option<String>,
    /// Ask the upstream what became of a request whose outcome is unknown.
    pub reconcile: Option<ReconcileSection>,
    /// The identity the route's records were made under, pinned across a change.
    pub identity: Option<IdentitySection>,
}

/// `[routes.idempotency.identity]`: what names the route's records, when it is not what the
/// route's own name and hosts would give.
#[derive(Debug, Default, Deserialize)]
pub struct IdentitySection {
    /// The route name the records were made under (a renamed route keeps its records).
    pub name: Option<String>,
    /// The host that keeps the names it had when it was the route's one host; every other
    /// host's records are kept apart.
    pub host: Option<String>,
    /// `true`: every host's records apart, even on a route that serves one.
    pub per_host: Option<bool>,
    /// The fingerprint settings the records in retention were made under.
    pub previous_fingerprint: Option<PreviousFingerprintSection>,
}

/// `[routes.idempotency.identity.previous_fingerprint]`: `ignore` and `fingerprint_headers`
/// as they were.
#[derive(Debug, Default, Deserialize)]
pub struct PreviousFingerprintSection {
    /// JSON Pointers left out of the fingerprint then.
    pub ignore: Option<Vec<String>>,
    /// Request headers included in the fingerprint then.
    pub fingerprint_headers: Option<Vec<String>>,
}

/// `[routes.idempotency.reconcile]`
#[derive(Debug, Default, Deserialize)]
pub struct ReconcileSection {
    /// The lookup's path, with `{key}` where the key goes (path or query).
    pub path: Option<String>,
    /// The lookup's method.
    pub method: Option<String>,
    /// Statuses whose answer is the request's answer.
    pub found: Option<Vec<StatusEntry>>,
    /// Statuses that say the request never ran.
    pub not_found: Option<Vec<StatusEntry>>,
    /// Ask by itself this long after an unknown outcome; `"off"`: only when a retry meets it.
    pub after: Option<String>,
    /// How long past the upstream's timeout "not found" becomes proof.
    pub release_after: Option<HumanDuration>,
    /// Replay a found answer with this status instead of the lookup's.
    pub answer_status: Option<i64>,
}

/// A value written as one string or as a list of strings.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// `"header:Authorization"`
    One(String),
    /// `["header:Authorization", "header:Stripe-Account"]`
    Many(Vec<String>),
}

impl OneOrMany {
    /// The entries, in order.
    pub fn entries(&self) -> Vec<&str> {
        match self {
            Self::One(one) => vec![one.as_str()],
            Self::Many(many) => many.iter().map(String::as_str).collect(),
        }
    }
}

/// One entry of `store_statuses`: `201` or `"201"` or `"2xx"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StatusEntry {
    /// An exact status code.
    Code(i64),
    /// A class such as `"2xx"`, or a code written as a string.
    Text(String),
}
