//! `idemgate keys`: list, show, resolve and release idempotency records through the admin
//! listener's `/keys` endpoints, for operators. The flags are `args`; what is read locally
//! before the first request (the token, the caller's scope, an answer) is `input`; the admin
//! listener's client is `client`; tables and lines for people are `render`.
//!
//! Secrets never travel on the command line, where `ps`, shell history and audit logs show
//! them: the admin token comes from `IDEMGATE_ADMIN_TOKEN`, and the caller's scope (often a
//! credential) from `IDEMGATE_SCOPE_<NAME>` variables or standard input, each sent to the admin
//! listener as a `Scope-<Name>` header. Only `--scope-hash`, a digest, may be a flag.
//!
//! Exit status: 0 done, 1 the admin listener refused or could not be reached, 2 unusable input
//! (flags, environment, files), as for clap's usage errors.

mod args;
pub(crate) mod client;
pub(crate) mod failure;
mod input;
mod render;

use std::process::ExitCode;

use http::{Method, StatusCode};
use idemgate::operator::wire;
use serde_json::Value;

pub use self::args::KeysArgs;
use self::args::{Action, ListArgs, ReleaseArgs, ResolveArgs, TargetArgs};
use self::client::{AdminClient, admin_target, encode_query, is_absent, target_query};
use self::failure::Failure;
use self::input::{CallerScope, HeaderList, Resolution, answer_headers, caller_scope, resolve_body};
use self::render::{emit, printable, record_details, records_table, shell_quote};

/// The admin API's largest page (`limit`).
const PAGE_MAX: usize = 1000;

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
    // Everything local (listener, token, scope, body) is read and checked before the first
    // request, so that bad input never leaves half a job done.
    let admin = action.admin();
    let (url, token) = admin_target(admin.target.admin.as_ref(), admin.target.config.as_deref())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Failed(format!("cannot start the runtime: {e}")))?;
    match action {
        Action::List(args) => {
            let client = AdminClient::new(&url, token)?;
            runtime.block_on(list(&client, &args))
        }
        Action::Show(args) => {
            let scope =
                caller_scope(args.scope.scope_stdin, args.scope.scope_hash.as_deref())?.on(args.scope.host.as_deref());
            let client = AdminClient::new(&url, token)?;
            runtime.block_on(show(&client, &args, &scope))
        }
        Action::Resolve(args) => {
            let body = resolve_body(args.body.as_deref(), args.body_file.as_deref(), args.target.scope.scope_stdin)?;
            let scope = caller_scope(args.target.scope.scope_stdin, args.target.scope.scope_hash.as_deref())?.on(args
                .target
                .scope
                .host
                .as_deref());
            let client = AdminClient::new(&url, token)?;
            runtime.block_on(resolve(&client, &args, &scope, &body))
        }
        Action::Release(args) => {
            let scope = caller_scope(args.target.scope.scope_stdin, args.target.scope.scope_hash.as_deref())?.on(args
                .target
                .scope
                .host
                .as_deref());
            let client = AdminClient::new(&url, token)?;
            runtime.block_on(release(&client, &args, &scope))
        }
    }
}

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

/// The route's scope as `GET /routes` gives it (`header:authorization`) and the
/// `IDEMGATE_SCOPE_*` variables that send it (none for keys shared by every caller); `None`
/// when the listener cannot tell.
async fn scope_variables(client: &AdminClient, route: &str) -> Option<(String, Vec<String>)> {
    let routes = client.get("/routes").await.ok()?.document().ok()?;
    let route = routes.as_array()?.iter().find(|r| r.get("name").and_then(Value::as_str) == Some(route))?;
    let sources: Vec<&str> =
        route.get("idempotency")?.get("scope")?.as_array()?.iter().filter_map(Value::as_str).collect();
    let mut vars: Vec<String> = sources
        .iter()
        .filter_map(|source| match source.trim_end_matches('?').split_once(':')? {
            ("header", name) => Some(wire::scope_variable(name)),
            ("cookie", _) => Some(wire::scope_variable("cookie")),
            _ => None,
        })
        .map(|var| printable(&var))
        .collect();
    vars.dedup();
    Some((printable(&sources.join(", ")), vars))
}

async fn show(client: &AdminClient, args: &TargetArgs, scope: &CallerScope) -> Result<(), Failure> {
    let answer = client.call(Method::GET, &target_query(&args.route, &args.key, scope), scope, None).await?;
    // 404 with {"state": "absent"} is an answer, not an error: there is no record of the key.
    let doc = if answer.status == StatusCode::NOT_FOUND && is_absent(&answer.body) {
        if scope.headers.is_empty() && scope.hash.is_none() {
            // The anonymous caller's key, on a route that admits callers without a scope: the
            // key may well be another caller's.
            match scope_variables(client, &args.route).await {
                Some((sources, vars)) if !vars.is_empty() => eprintln!(
                    "idemgate keys: no record for this key without a caller's scope; route {} keeps keys per \
                     caller ({sources}): pass the caller's scope ({}, --scope-stdin or --scope-hash)",
                    printable(&args.route),
                    vars.join(" and ")
                ),
                // Keys shared by every caller: absent is absent.
                Some(_) => {}
                None => eprintln!(
                    "idemgate keys: no record for this key without a caller's scope; if route {} keeps keys per \
                     caller, pass the caller's scope (IDEMGATE_SCOPE_<NAME>, --scope-stdin or --scope-hash)",
                    printable(&args.route)
                ),
            }
        }
        serde_json::json!({ "state": wire::ABSENT })
    } else {
        answer.document()?
    };
    if args.admin.json {
        return emit(&format!("{doc}\n"));
    }
    emit(&record_details(&args.route, &args.key, &doc))
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
    let doc = client
        .call(Method::PUT, &target_query(&target.route, &target.key, scope), scope, Some(payload))
        .await?
        .document()?;
    if target.admin.json {
        emit(&format!("{doc}\n"))?;
    }
    match serde_json::from_value::<wire::Resolved>(doc.clone()) {
        Ok(wire::Resolved { resolved: true, was }) if !target.admin.json => {
            emit(&format!("resolved (was {was}): retries now get {}\n", args.status))
        }
        Ok(wire::Resolved { resolved: true, .. }) => Ok(()),
        _ => Err(Failure::Failed(format!("the admin listener did not resolve the key: {doc}"))),
    }
}

async fn release(client: &AdminClient, args: &ReleaseArgs, scope: &CallerScope) -> Result<(), Failure> {
    let mut query = target_query(&args.target.route, &args.target.key, scope);
    if args.force {
        query.push_str("&force=true");
    }
    let doc = client.call(Method::DELETE, &query, scope, None).await?.document()?;
    if args.target.admin.json {
        return emit(&format!("{doc}\n"));
    }
    let released: wire::Released = serde_json::from_value(doc.clone())
        .map_err(|e| Failure::Failed(format!("the admin listener's answer to DELETE /keys is not one: {e}: {doc}")))?;
    let line = match released {
        wire::Released { released: true, was: Some(was) } => {
            format!("released (was {was}): the next request with this key runs upstream\n")
        }
        wire::Released { released: true, was: None } => {
            "released: the next request with this key runs upstream\n".to_owned()
        }
        wire::Released { released: false, was: Some(was) } => format!("not released (was {was})\n"),
        wire::Released { released: false, was: None } => "not released: no record of this key\n".to_owned(),
    };
    emit(&line)
}
