//! `idemgate keys`: list, show, resolve and release idempotency records through the admin
//! listener's `/keys` endpoints, for operators.
//!
//! Secrets never travel on the command line, where `ps`, shell history and audit logs show
//! them: the admin token comes from `IDEMGATE_ADMIN_TOKEN`, and the caller's scope (often a
//! credential) from `IDEMGATE_SCOPE_<NAME>` variables or standard input, each sent to the admin
//! listener as a `Scope-<Name>` header. Only `--scope-hash`, a digest, may be a flag.
//!
//! Exit status: 0 done, 1 the admin listener refused or could not be reached, 2 unusable input
//! (flags, environment, files), as for clap's usage errors.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::{Args, Subcommand, ValueEnum};
use http::uri::{Authority, Scheme};
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Serialize, Serializer};
use serde_json::Value;

const TOKEN_VAR: &str = "IDEMGATE_ADMIN_TOKEN";
const SCOPE_VAR_PREFIX: &str = "IDEMGATE_SCOPE_";
/// The admin API's largest page (`limit`).
const PAGE_MAX: usize = 1000;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// One exchange with the admin listener, answer body included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A page of 1000 records is a few hundred KiB; far more means the URL names something else.
const MAX_ANSWER_BYTES: usize = 32 << 20;

const ENV_HELP: &str = "\
Environment:
  IDEMGATE_ADMIN_TOKEN     the admin token (server.admin_token), sent as
                           Authorization: Bearer <token>; required
  IDEMGATE_SCOPE_<NAME>    a scope header of the caller whose key it is, sent as
                           Scope-<Name> (NAME upper-cased, '-' as '_'), e.g.
                           IDEMGATE_SCOPE_AUTHORIZATION='Bearer alice' or
                           IDEMGATE_SCOPE_COOKIE='session=abc'
  SSL_CERT_FILE            CA bundle for an https:// admin URL (default: the system's)

Scope values are credentials: they are read from the environment or, with --scope-stdin,
from standard input (lines 'Name: value'), never from the command line.

Exit status: 0 done, 1 the admin listener refused or could not be reached, 2 unusable input.";

/// The `keys` command line.
#[derive(Args)]
#[command(after_help = ENV_HELP)]
pub struct KeysArgs {
    // Boxed: the flags are large next to the other commands', which would all pay for them.
    #[command(subcommand)]
    action: Box<Action>,
}

#[derive(Subcommand)]
enum Action {
    /// List a route's records in one state, following the pages up to --max records.
    #[command(after_help = ENV_HELP)]
    List(ListArgs),
    /// Show the record of one key.
    #[command(after_help = ENV_HELP)]
    Show(TargetArgs),
    /// Record the answer of an unknown (or executed) key: its retries get that answer.
    #[command(after_help = ENV_HELP)]
    Resolve(ResolveArgs),
    /// Release the record of one key: the next request with the key runs upstream again.
    /// A key a running request holds is refused unless --force.
    #[command(after_help = ENV_HELP)]
    Release(ReleaseArgs),
}

#[derive(Args)]
struct ReleaseArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Release the key even while a request holds it. That request may be running upstream
    /// now, and a retry would then run it a second time beside it: only when you know it is
    /// not running (its gateway is gone, and the upstream never saw it).
    #[arg(long)]
    force: bool,
}

/// Where the admin listener is, and how to print its answers.
#[derive(Args)]
struct AdminArgs {
    /// The admin listener's base URL, e.g. http://127.0.0.1:9090 (http or https).
    #[arg(long, value_name = "URL", value_parser = parse_admin_url)]
    admin: AdminUrl,
    /// Print the admin API's JSON documents (for scripts) instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ListArgs {
    #[command(flatten)]
    admin: AdminArgs,
    /// The idempotent route's name.
    #[arg(long, value_name = "R")]
    route: String,
    /// Which records to list.
    #[arg(long, value_name = "S", value_enum, default_value_t = ListState::Unknown)]
    state: ListState,
    /// Stop after this many records; stderr then says that more exist.
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    max: u32,
    /// Continue a listing where an earlier one stopped (the cursor it printed).
    #[arg(long, value_name = "C")]
    cursor: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum ListState {
    /// Sent upstream without a complete answer: retries get 502 outcome-unknown until the key
    /// is resolved or released.
    Unknown,
    /// Ran upstream; its answer's body was not stored.
    Executed,
}

impl ListState {
    fn as_str(self) -> &'static str {
        match self {
            ListState::Unknown => "unknown",
            ListState::Executed => "executed",
        }
    }
}

/// One key of one route, and the caller whose key it is.
#[derive(Args)]
struct TargetArgs {
    #[command(flatten)]
    admin: AdminArgs,
    /// The idempotent route's name.
    #[arg(long, value_name = "R")]
    route: String,
    /// The idempotency key, as the client's header carried it (a key that is not a token is
    /// quoted there: --key '"a b"').
    #[arg(long, value_name = "K")]
    key: String,
    #[command(flatten)]
    scope: ScopeArgs,
}

#[derive(Args)]
struct ScopeArgs {
    /// Read the caller's scope headers from standard input, one 'Name: value' a line
    /// (blank lines and lines starting with # are skipped), in addition to IDEMGATE_SCOPE_*.
    #[arg(long)]
    scope_stdin: bool,
    /// The caller's scope as its digest (64 hex digits) instead of its headers.
    #[arg(long, value_name = "HEX", value_parser = parse_scope_hash, conflicts_with = "scope_stdin")]
    scope_hash: Option<String>,
}

#[derive(Args)]
struct ResolveArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// The status code retries get.
    #[arg(long, value_name = "CODE", value_parser = clap::value_parser!(u16).range(200..=599))]
    status: u16,
    /// A header of the answer, 'Name: value'; repeat for more (a repeated name keeps every value).
    #[arg(long = "header", value_name = "NAME: VALUE", value_parser = parse_answer_header)]
    headers: Vec<(String, String)>,
    /// The answer's body, UTF-8 text (default: empty).
    #[arg(long, value_name = "TEXT", group = "answer_body")]
    body: Option<String>,
    /// Read the answer's body from a file ('-': standard input); it must be UTF-8 text.
    #[arg(long, value_name = "PATH", group = "answer_body")]
    body_file: Option<PathBuf>,
}

/// Why a command failed, which decides its exit status.
#[derive(Debug)]
enum Failure {
    /// What the operator gave cannot be used (flags, environment, input): exit 2.
    Usage(String),
    /// The admin listener refused, answered nonsense, or could not be reached: exit 1.
    Failed(String),
}

/// Runs `idemgate keys ...` and prints its outcome.
pub fn run(args: KeysArgs) -> ExitCode {
    match execute(*args.action) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("idemgate keys: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Failed(message)) => {
            eprintln!("idemgate keys: {message}");
            ExitCode::FAILURE
        }
    }
}

fn execute(action: Action) -> Result<(), Failure> {
    // Everything local (token, scope, body) is read and checked before the first request, so
    // that bad input never leaves half a job done.
    let token = admin_token()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Failed(format!("cannot start the runtime: {e}")))?;
    match action {
        Action::List(args) => {
            let client = AdminClient::new(&args.admin.admin, token)?;
            runtime.block_on(list(&client, &args))
        }
        Action::Show(args) => {
            let scope = caller_scope(&args.scope)?;
            let client = AdminClient::new(&args.admin.admin, token)?;
            runtime.block_on(show(&client, &args, &scope))
        }
        Action::Resolve(args) => {
            let body = resolve_body(&args)?;
            let scope = caller_scope(&args.target.scope)?;
            let client = AdminClient::new(&args.target.admin.admin, token)?;
            runtime.block_on(resolve(&client, &args, &scope, &body))
        }
        Action::Release(args) => {
            let scope = caller_scope(&args.target.scope)?;
            let client = AdminClient::new(&args.target.admin.admin, token)?;
            runtime.block_on(release(&client, &args, &scope))
        }
    }
}

// ---- The four commands ----

async fn list(client: &AdminClient, args: &ListArgs) -> Result<(), Failure> {
    let state = args.state.as_str();
    let listing = fetch_records(client, args).await?;
    if let Some(resume) = &listing.more {
        let how = match resume {
            Some(c) => format!("; continue with --cursor {}", shell_quote(c)),
            None => "; list again with a larger --max".to_owned(),
        };
        eprintln!("idemgate keys: stopped after --max {} records; more exist{how}", args.max);
    }
    if args.admin.json {
        let first = listing.first_page.unwrap_or(Value::Null);
        let doc = serde_json::json!({
            "route": first.get("route").cloned().unwrap_or_else(|| Value::from(args.route.as_str())),
            "state": first.get("state").cloned().unwrap_or_else(|| Value::from(state)),
            "records": listing.records,
            "next_cursor": listing.more.flatten(),
        });
        return emit(&format!("{doc}\n"));
    }
    if listing.records.is_empty() {
        return emit(&format!("no records in state {state} on route {}\n", printable(&args.route)));
    }
    emit(&records_table(&listing.records))
}

/// What `list` gathered from the pages.
struct Listing {
    /// The first page as answered, for its route and state.
    first_page: Option<Value>,
    records: Vec<Value>,
    /// `None` when the listing is complete; else where to continue (`Some(None)`: from the start).
    more: Option<Option<String>>,
}

/// Follows `next_cursor` from `--cursor` (or the start) until the end or `--max` records.
async fn fetch_records(client: &AdminClient, args: &ListArgs) -> Result<Listing, Failure> {
    let max = args.max as usize;
    let mut listing = Listing { first_page: None, records: Vec::new(), more: None };
    let mut cursor = args.cursor.clone();
    loop {
        let remaining = max - listing.records.len();
        // Asking for no more than is still wanted keeps every record fetched a record shown.
        let limit = remaining.min(PAGE_MAX).to_string();
        let mut pairs = vec![("route", args.route.as_str()), ("state", args.state.as_str())];
        if let Some(c) = &cursor {
            pairs.push(("cursor", c.as_str()));
        }
        pairs.push(("limit", limit.as_str()));
        let page = client.call(Method::GET, &encode_query(&pairs), &CallerScope::none(), None).await?.document()?;
        let Some(page_records) = page.get("records").and_then(Value::as_array) else {
            return Err(Failure::Failed("the admin listener's answer to GET /keys has no \"records\" list".into()));
        };
        let next = match page.get("next_cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => Some(c.clone()),
            Some(_) => return Err(Failure::Failed("the admin listener's next_cursor is not a string".into())),
        };
        if page_records.len() > remaining {
            // A page longer than asked for: its next cursor points past records never shown,
            // so continuing starts this page again (some repeat, none are skipped).
            listing.records.extend(page_records.iter().take(remaining).cloned());
            listing.more = Some(cursor);
            listing.first_page.get_or_insert(page);
            return Ok(listing);
        }
        listing.records.extend(page_records.iter().cloned());
        listing.first_page.get_or_insert(page);
        // The same cursor again would page forever.
        if next.is_some() && next == cursor {
            return Err(Failure::Failed("the admin listener returned the cursor it was given; stopping".into()));
        }
        match next {
            None => return Ok(listing),
            Some(next) if listing.records.len() >= max => {
                listing.more = Some(Some(next));
                return Ok(listing);
            }
            Some(next) => cursor = Some(next),
        }
    }
}

async fn show(client: &AdminClient, args: &TargetArgs, scope: &CallerScope) -> Result<(), Failure> {
    let answer = client.call(Method::GET, &target_query(args, scope), scope, None).await?;
    // 404 with {"state": "absent"} is an answer, not an error: there is no record of the key.
    let doc = if answer.status == StatusCode::NOT_FOUND && is_absent(&answer.body) {
        serde_json::json!({ "state": "absent" })
    } else {
        answer.document()?
    };
    if args.admin.json {
        return emit(&format!("{doc}\n"));
    }
    emit(&record_details(args, &doc))
}

async fn resolve(client: &AdminClient, args: &ResolveArgs, scope: &CallerScope, body: &str) -> Result<(), Failure> {
    let target = &args.target;
    let headers = answer_headers(&args.headers);
    let resolution = Resolution { status: args.status, headers: HeaderList(&headers), body };
    let payload =
        serde_json::to_vec(&resolution).map_err(|e| Failure::Failed(format!("cannot encode the resolution: {e}")))?;
    // The admin listener reads it with the same rules; said here, nothing is sent. (The
    // route's own replay_headers and exclude_headers are known only to the gateway.)
    if let Err(e) = idemgate::operator::parse_answer(&payload, &Default::default()) {
        return Err(Failure::Usage(format!("{e}; nothing was sent")));
    }
    let doc = client.call(Method::PUT, &target_query(target, scope), scope, Some(payload)).await?.document()?;
    if target.admin.json {
        emit(&format!("{doc}\n"))?;
    }
    if doc.get("resolved") != Some(&Value::Bool(true)) {
        return Err(Failure::Failed(format!("the admin listener did not resolve the key: {doc}")));
    }
    if !target.admin.json {
        let was = doc.get("was").and_then(Value::as_str).unwrap_or("-");
        emit(&format!("resolved (was {}): retries now get {}\n", printable(was), args.status))?;
    }
    Ok(())
}

async fn release(client: &AdminClient, args: &ReleaseArgs, scope: &CallerScope) -> Result<(), Failure> {
    let mut query = target_query(&args.target, scope);
    if args.force {
        query.push_str("&force=true");
    }
    let doc = client.call(Method::DELETE, &query, scope, None).await?.document()?;
    if args.target.admin.json {
        return emit(&format!("{doc}\n"));
    }
    let was = doc.get("was").and_then(Value::as_str).map(printable);
    let line = match (doc.get("released").and_then(Value::as_bool), was) {
        (Some(true), Some(was)) => format!("released (was {was}): the next request with this key runs upstream\n"),
        (Some(true), None) => "released: the next request with this key runs upstream\n".to_owned(),
        (_, Some(was)) => format!("not released (was {was})\n"),
        (_, None) => "not released: no record of this key\n".to_owned(),
    };
    emit(&line)
}

/// `route=R&key=K[&scope_hash=H]`, percent-encoded: keys may hold any printable character.
fn target_query(args: &TargetArgs, scope: &CallerScope) -> String {
    let mut pairs = vec![("route", args.route.as_str()), ("key", args.key.as_str())];
    if let Some(hash) = &scope.hash {
        pairs.push(("scope_hash", hash));
    }
    encode_query(&pairs)
}

fn encode_query(pairs: &[(&str, &str)]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        query.append_pair(name, value);
    }
    query.finish()
}

fn is_absent(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body).is_ok_and(|doc| doc.get("state").and_then(Value::as_str) == Some("absent"))
}

// ---- Local input: token, scope, resolution ----

fn admin_token() -> Result<HeaderValue, Failure> {
    let missing = || {
        Failure::Usage(format!(
            "set {TOKEN_VAR} to the admin token (server.admin_token); it is never taken from the command line"
        ))
    };
    let token = std::env::var_os(TOKEN_VAR).ok_or_else(missing)?;
    let token = token.into_string().map_err(|_| Failure::Usage(format!("{TOKEN_VAR} is not UTF-8")))?;
    // A token read with `$(cat file)` or from a secret mount often ends in a newline.
    let token = token.trim();
    if token.is_empty() {
        return Err(missing());
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| Failure::Usage(format!("{TOKEN_VAR} holds characters a header cannot carry")))?;
    value.set_sensitive(true);
    Ok(value)
}

/// The caller whose key it is, as the admin listener takes it: `Scope-<Name>` headers, or the
/// scope's digest as `scope_hash`.
struct CallerScope {
    headers: Vec<(HeaderName, HeaderValue)>,
    hash: Option<String>,
}

impl CallerScope {
    fn none() -> Self {
        Self { headers: Vec::new(), hash: None }
    }
}

fn caller_scope(args: &ScopeArgs) -> Result<CallerScope, Failure> {
    let mut headers = scope_from_env()?;
    if let Some(hash) = &args.scope_hash {
        // The admin listener prefers scope_hash anyway: credentials it would not use stay home.
        if !headers.is_empty() {
            eprintln!("idemgate keys: --scope-hash given: the {SCOPE_VAR_PREFIX}* variables are not sent");
        }
        return Ok(CallerScope { headers: Vec::new(), hash: Some(hash.clone()) });
    }
    if args.scope_stdin {
        if std::io::stdin().is_terminal() {
            eprintln!(
                "idemgate keys: reading scope headers ('Name: value' lines) from standard input; end with Ctrl-D"
            );
        }
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| Failure::Usage(format!("--scope-stdin: cannot read standard input as UTF-8 text: {e}")))?;
        headers.extend(parse_scope_lines(&text).map_err(Failure::Usage)?);
    }
    Ok(CallerScope { headers, hash: None })
}

/// `IDEMGATE_SCOPE_<NAME>=value` → `Scope-<Name>: value`, in the variables' name order.
fn scope_from_env() -> Result<Vec<(HeaderName, HeaderValue)>, Failure> {
    let mut vars: Vec<(String, std::ffi::OsString)> = std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value)))
        .filter(|(name, _)| name.starts_with(SCOPE_VAR_PREFIX))
        .collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let mut headers = Vec::new();
    for (var, value) in vars {
        // `VAR= idemgate ...` is how scripts switch a variable off: empty means unset.
        if value.is_empty() {
            continue;
        }
        let name = var[SCOPE_VAR_PREFIX.len()..].replace('_', "-");
        let value = value.into_string().map_err(|_| Failure::Usage(format!("{var} is not UTF-8")))?;
        // Error messages name the variable, never its value: it is a credential.
        let header = scope_header(&name, &value).map_err(|e| Failure::Usage(format!("{var}: {e}")))?;
        headers.push(header);
    }
    Ok(headers)
}

/// Lines `Name: value`; blank lines and `#` comments are skipped.
fn parse_scope_lines(text: &str) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut headers = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = || format!("--scope-stdin, line {}", index + 1);
        let Some((name, value)) = line.split_once(':') else {
            return Err(format!("{}: expected 'Name: value'", at()));
        };
        headers.push(scope_header(name.trim(), value.trim()).map_err(|e| format!("{}: {e}", at()))?);
    }
    Ok(headers)
}

fn scope_header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    if name.is_empty() {
        return Err("no header name".into());
    }
    let header = HeaderName::from_bytes(format!("scope-{name}").as_bytes())
        .map_err(|_| format!("{name:?} is not a header name"))?;
    let mut value = HeaderValue::from_str(value).map_err(|_| "the value holds characters a header cannot carry")?;
    value.set_sensitive(true);
    Ok((header, value))
}

fn parse_scope_hash(s: &str) -> Result<String, String> {
    if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(s.to_ascii_lowercase())
    } else {
        Err("expected 64 hex digits (the scope's SHA-256)".into())
    }
}

fn parse_answer_header(s: &str) -> Result<(String, String), String> {
    let (name, value) = s.split_once(':').ok_or("expected 'Name: value'")?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("{:?} is not a header name", name.trim()))?;
    if let Some(why) = idemgate::operator::refused_header(&name) {
        return Err(format!("the header {name} cannot be part of a stored answer: {why}"));
    }
    let value = value.trim();
    HeaderValue::from_str(value).map_err(|_| format!("the value of {name} holds characters a header cannot carry"))?;
    Ok((name.as_str().to_owned(), value.to_owned()))
}

/// The answer's headers by name, in the order first given. A JSON object holds each name once,
/// so a repeated one (Link, Vary) gathers its values, which the document carries as a list.
fn answer_headers(headers: &[(String, String)]) -> Vec<(String, Vec<String>)> {
    let mut grouped: Vec<(String, Vec<String>)> = Vec::new();
    for (name, value) in headers {
        match grouped.iter_mut().find(|(seen, _)| seen == name) {
            Some((_, values)) => values.push(value.clone()),
            None => grouped.push((name.clone(), vec![value.clone()])),
        }
    }
    grouped
}

/// The answer's body as text: the resolution document carries it as a JSON string.
fn resolve_body(args: &ResolveArgs) -> Result<String, Failure> {
    let Some(path) = &args.body_file else {
        return Ok(args.body.clone().unwrap_or_default());
    };
    let from_stdin = path.as_os_str() == "-";
    if from_stdin && args.target.scope.scope_stdin {
        return Err(Failure::Usage(
            "--body-file - and --scope-stdin both read standard input; put the body in a file or use --body".into(),
        ));
    }
    let mut bytes = Vec::new();
    let read = if from_stdin {
        std::io::stdin().read_to_end(&mut bytes).map(drop)
    } else {
        std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut bytes)).map(drop)
    };
    let shown = path.display();
    read.map_err(|e| Failure::Usage(format!("--body-file {shown}: {e}")))?;
    String::from_utf8(bytes).map_err(|e| {
        Failure::Usage(format!(
            "--body-file {shown}: not UTF-8 text (byte {}); the resolution carries the body as a JSON string",
            e.utf8_error().valid_up_to()
        ))
    })
}

/// The body of `PUT /keys`: `{"status": 201, "headers": {...}, "body": "..."}`, in that order.
#[derive(Serialize)]
struct Resolution<'a> {
    status: u16,
    headers: HeaderList<'a>,
    body: &'a str,
}

/// Headers as a JSON object in the order given: `"name": "value"`, or `"name": ["v1", "v2"]`
/// for a name given more than once.
struct HeaderList<'a>(&'a [(String, Vec<String>)]);

impl Serialize for HeaderList<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(untagged)]
        enum OneOrMany<'v> {
            One(&'v str),
            Many(&'v [String]),
        }
        serializer.collect_map(self.0.iter().map(|(name, values)| match values.as_slice() {
            [one] => (name, OneOrMany::One(one)),
            many => (name, OneOrMany::Many(many)),
        }))
    }
}

// ---- The admin listener ----

#[derive(Clone)]
struct AdminUrl {
    scheme: Scheme,
    authority: Authority,
    /// Without the trailing slash: `""`, or a prefix when a proxy serves the listener under one.
    base_path: String,
}

impl std::fmt::Display for AdminUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.base_path)
    }
}

fn parse_admin_url(s: &str) -> Result<AdminUrl, String> {
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

struct AdminClient {
    url: AdminUrl,
    token: HeaderValue,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// The admin listener's answer, before its status is judged.
struct Answer {
    status: StatusCode,
    body: Bytes,
}

impl AdminClient {
    fn new(url: &AdminUrl, token: HeaderValue) -> Result<Self, Failure> {
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

    async fn call(
        &self,
        method: Method,
        query: &str,
        scope: &CallerScope,
        json_body: Option<Vec<u8>>,
    ) -> Result<Answer, Failure> {
        let uri = Uri::builder()
            .scheme(self.url.scheme.clone())
            .authority(self.url.authority.clone())
            .path_and_query(format!("{}/keys?{query}", self.url.base_path))
            .build()
            .map_err(|e| Failure::Usage(format!("cannot build the request URL: {e}")))?;
        let mut request = Request::builder()
            .method(method.clone())
            .uri(uri)
            .header(header::AUTHORIZATION, self.token.clone())
            .header(header::ACCEPT, "application/json, application/problem+json");
        for (name, value) in &scope.headers {
            request = request.header(name, value);
        }
        if json_body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(json_body.unwrap_or_default())))
            .map_err(|e| Failure::Usage(format!("cannot build the request: {e}")))?;
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
                "the admin listener at {} did not answer {method} /keys within {}s",
                self.url,
                REQUEST_TIMEOUT.as_secs()
            ))
        })?
    }
}

impl Answer {
    /// The JSON document of a 2xx answer; any other answer is the failure its problem
    /// document describes.
    fn document(self) -> Result<Value, Failure> {
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
fn problem_line(status: StatusCode, doc: Option<&Value>, body: &[u8]) -> String {
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

fn tls_config(https: bool) -> Result<rustls::ClientConfig, Failure> {
    let mut roots = rustls::RootCertStore::empty();
    // Only an https:// URL needs roots; reading the system's store is not free.
    if https {
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        if roots.is_empty() {
            return Err(Failure::Usage("no CA certificates found for https; set SSL_CERT_FILE to a bundle".into()));
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Failure::Failed(format!("TLS setup: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// An error and its causes, which hyper keeps apart: "client error (Connect): tcp connect
/// error: Connection refused (os error 111)".
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

// ---- Output ----

/// Writes to stdout; a reader that went away (`| head`) is not an error.
fn emit(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Failure::Failed(format!("writing stdout: {e}"))),
        _ => Ok(()),
    }
}

fn records_table(records: &[Value]) -> String {
    let header = ["KEY", "STATE", "ATTEMPT", "SINCE", "METHOD", "PATH", "SCOPE"];
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            let text = |name: &str| r.get(name).map_or_else(|| "-".to_owned(), json_text);
            vec![
                text("key"),
                text("state"),
                text("attempt"),
                r.get("since_ms").and_then(Value::as_u64).map_or_else(|| "-".to_owned(), human_duration),
                text("method"),
                text("path"),
                r.get("scope_hash")
                    .and_then(Value::as_str)
                    .map_or_else(|| "-".to_owned(), |h| h.chars().take(12).collect()),
            ]
        })
        .collect();
    table(&header, &rows)
}

/// One key's record as `field value` lines, the durations made readable.
fn record_details(args: &TargetArgs, doc: &Value) -> String {
    let mut rows = vec![vec!["route".to_owned(), printable(&args.route)], vec!["key".to_owned(), printable(&args.key)]];
    let Some(fields) = doc.as_object() else {
        rows.push(vec!["record".to_owned(), json_text(doc)]);
        return table(&[], &rows);
    };
    // The known fields first, in the order people read them; whatever else the API adds after.
    let known = [
        ("state", "state"),
        ("attempt", "attempt"),
        ("status", "status"),
        ("body_bytes", "body bytes"),
        ("lease_left_ms", "lease left"),
        ("expires_in_ms", "expires in"),
        ("lookup_in_flight", "lookup in flight"),
    ];
    for (name, label) in known {
        let Some(value) = fields.get(name) else { continue };
        let text = match value.as_u64() {
            Some(ms) if name.ends_with("_ms") => human_duration(ms),
            _ => json_text(value),
        };
        rows.push(vec![label.to_owned(), text]);
    }
    for (name, value) in fields.iter().filter(|(name, _)| !known.iter().any(|(k, _)| k == name)) {
        rows.push(vec![printable(name), json_text(value)]);
    }
    table(&[], &rows)
}

/// Columns padded to their widest cell, two spaces apart; no header row when `header` is empty.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    let all: Vec<&Vec<String>> = std::iter::once(&header).filter(|h| !h.is_empty()).chain(rows).collect();
    let columns = all.iter().map(|r| r.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| all.iter().filter_map(|r| r.get(c)).map(|cell| cell.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in all {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            let pad = widths[c].saturating_sub(cell.chars().count());
            line.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A JSON value as a table cell: strings without quotes, the rest as JSON.
fn json_text(value: &Value) -> String {
    match value {
        Value::String(s) => printable(s),
        Value::Bool(true) => "yes".to_owned(),
        Value::Bool(false) => "no".to_owned(),
        Value::Null => "-".to_owned(),
        other => printable(&other.to_string()),
    }
}

/// The text with control characters escaped: a key is client input, and a terminal would
/// obey the escape sequences in it.
fn printable(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// The start of a body that is not the expected JSON, for the error message.
fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let cut: String = text.chars().take(200).collect();
    let more = if cut.len() < text.len() { "..." } else { "" };
    format!("{}{more}", printable(&cut))
}

/// Milliseconds as the two largest units: 850ms, 12s, 3m12s, 2h5m, 1d3h.
fn human_duration(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    let units = [(s / 86_400, "d"), (s / 3600 % 24, "h"), (s / 60 % 60, "m"), (s % 60, "s")];
    let first = units.iter().position(|(n, _)| *n > 0).unwrap_or(3);
    let mut text = format!("{}{}", units[first].0, units[first].1);
    if let Some((n, unit)) = units.get(first + 1).filter(|(n, _)| *n > 0) {
        text.push_str(&format!("{n}{unit}"));
    }
    text
}

/// A value to paste into a shell: single-quoted unless it is plainly safe.
fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:/=+".contains(c)) {
        return s.to_owned();
    }
    format!("'{}'", printable(s).replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_two_units() {
        assert_eq!(human_duration(850), "850ms");
        assert_eq!(human_duration(12_000), "12s");
        assert_eq!(human_duration(192_000), "3m12s");
        assert_eq!(human_duration(3_600_000), "1h");
        assert_eq!(human_duration(90_061_000), "1d1h");
    }

    #[test]
    fn scope_lines_skip_comments_and_never_echo_values() {
        let headers = parse_scope_lines("# who\n\nAuthorization: Bearer bob\r\n  Cookie:  a=b \n").unwrap();
        let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["scope-authorization", "scope-cookie"]);
        assert_eq!(headers[1].1, "a=b");
        let err = parse_scope_lines("Bearer secret-token\n").unwrap_err();
        assert!(err.contains("line 1") && !err.contains("secret"), "{err}");
    }

    #[test]
    fn admin_urls() {
        let url = parse_admin_url("https://admin.example:9443/gw/").unwrap();
        assert_eq!(url.to_string(), "https://admin.example:9443/gw");
        assert!(parse_admin_url("127.0.0.1:9090").is_err());
        assert!(parse_admin_url("http://user:pw@host").is_err());
    }
}
