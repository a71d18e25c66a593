//! `/keys`: the operator API over HTTP. The rules are `operator::Keys`'s; here, the query
//! read, the caller's record named, the answer of a `PUT` read within its deadline, and each
//! outcome mapped to its status and document.

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use serde_json::json;

use super::respond::{json_response, problem};
use crate::body::{Body, BodyError};
use crate::config::AuditRetention;
use crate::gateway::Gateway;
use crate::host;
use crate::operator::audit::Actor;
use crate::operator::{Keys, Refusal, wire};
use crate::policy::scope::{MissingScope, Scope};
use crate::runtime::IdempotentRoute;
use crate::store::{Cursor, RecordKey, State, StoreError, StoredResponse};

/// The longest page of `GET /keys?state=...`.
pub(super) const MAX_LIMIT: usize = 1000;
/// Largest body of `PUT /keys`.
pub(super) const MAX_RESOLVE_BODY: usize = 16 * 1024 * 1024;

/// The query of a `/keys` call.
#[derive(Default)]
pub(super) struct KeysQuery {
    route: Option<String>,
    key: Option<String>,
    scope: Option<String>,
    scope_hash: Option<String>,
    host: Option<String>,
    state: Option<String>,
    cursor: Option<String>,
    limit: Option<String>,
    force: Option<String>,
    include: Option<String>,
}

/// The parameters `/keys` takes, as its refusals list them (`scope` is read only to be refused
/// in words of its own).
const PARAMETERS: [&str; 9] = ["route", "key", "scope_hash", "host", "state", "cursor", "limit", "force", "include"];

impl KeysQuery {
    /// Reads a query, refusing what could be read two ways: a parameter named twice (the
    /// last one used to win, so `force=false&force=true` forced a release), one given empty
    /// where it needs a value, and one `/keys` does not take (a misspelt `scope_hash` named
    /// another caller's record without a word). Names are compared decoded, as they are read:
    /// `ro%75te` is `route`. The error names the parameter, bounded and escaped.
    fn parse(query: &str) -> Result<Self, String> {
        let mut q = Self::default();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            let slot = match &*k {
                "route" => &mut q.route,
                "key" => &mut q.key,
                "scope" => &mut q.scope,
                "scope_hash" => &mut q.scope_hash,
                "host" => &mut q.host,
                "state" => &mut q.state,
                "cursor" => &mut q.cursor,
                "limit" => &mut q.limit,
                "force" => &mut q.force,
                "include" => &mut q.include,
                other => {
                    let other: String = other.chars().take(64).collect();
                    return Err(format!(
                        "{other:?} is not a parameter of /keys, which takes {}. Nothing changed.",
                        PARAMETERS.join(", ")
                    ));
                }
            };
            if slot.is_some() {
                let times = form_urlencoded::parse(query.as_bytes()).filter(|(name, _)| *name == k).count();
                return Err(format!(
                    "{k} is given {times} times: give each parameter once; the gateway never picks one of \
                     several values. Nothing changed."
                ));
            }
            // An empty cursor is the start of a listing, as it has always been (a script's first
            // call with an empty variable); the scope is refused in every form, by its own words.
            if v.is_empty() && !matches!(&*k, "cursor" | "scope") {
                return Err(format!("{k} is given empty: it needs a value, or leave it out. Nothing changed."));
            }
            *slot = Some(v.into_owned());
        }
        Ok(q)
    }
}

/// What a change to keys asked for by `method` with `query` is called in the audit trail,
/// before the query is read in full (a call refused for its role).
pub(super) fn action_of(method: &Method, query: &str) -> &'static str {
    if *method != Method::DELETE {
        return "resolve";
    }
    let forced = form_urlencoded::parse(query.as_bytes()).any(|(k, v)| k == "force" && v == "true");
    if forced { "forced-release" } else { "release" }
}

/// The idempotent route a `/keys` query names, when the configuration has one by that name
/// (never the caller's text otherwise: it goes to the audit trail).
pub(super) fn route_named(gw: &Gateway, query: &str) -> Option<String> {
    let (_, name) = form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "route")?;
    gw.idempotent_route(&name).map(|route| route.name.clone())
}

pub(super) async fn keys(
    gw: &Gateway,
    actor: &Actor,
    retention: AuditRetention,
    request: Request<Incoming>,
) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let bad = |detail: &str| problem(gw, StatusCode::BAD_REQUEST, "admin-bad-request", "Bad request", detail);
    let query = match KeysQuery::parse(parts.uri.query().unwrap_or("")) {
        Ok(query) => query,
        Err(detail) => return bad(&detail),
    };
    let Some(route_name) = &query.route else {
        return bad("Give route as a query parameter, and key (one record) or state (a list).");
    };
    let Some(route) = gw.idempotent_route(route_name) else {
        return bad(&unknown_route(gw, route_name));
    };
    let keys = Keys::new(gw.runtime(), route, actor, retention);
    let reading = parts.method == Method::GET || parts.method == Method::HEAD;
    if reading && query.key.is_none() && query.state.is_some() {
        return list(gw, &keys, &query).await;
    }
    let record = match record_of(route, &query, &parts.headers, gw) {
        Ok(record) => record,
        Err(detail) => return bad(&detail),
    };
    match parts.method {
        Method::DELETE => {
            let force = match query.force.as_deref() {
                None | Some("false") => false,
                Some("true") => true,
                Some(_) => return bad("force must be true or false."),
            };
            match keys.release(&record, force).await {
                Ok(released) => json_response(StatusCode::OK, &released),
                Err(refusal) => refused(gw, refusal),
            }
        }
        Method::PUT => {
            let answer = match read_answer(gw, route, &parts.headers, body).await {
                Ok(answer) => answer,
                Err(refused) => {
                    keys.refused_answer(&record, refused.status().as_u16()).await;
                    return refused;
                }
            };
            match keys.resolve(&record, &answer).await {
                Ok(resolved) => json_response(StatusCode::OK, &resolved),
                Err(refusal) => refused(gw, refusal),
            }
        }
        _ => {
            let with_answer = match query.include.as_deref() {
                None => false,
                Some("answer") => true,
                Some(_) => return bad("include takes one value, answer."),
            };
            match keys.inspect(&record).await {
                Ok(None) => json_response(StatusCode::NOT_FOUND, &json!({ "state": wire::ABSENT })),
                Ok(Some(found)) => {
                    let mut doc = json!(wire::Record::from(&found));
                    if with_answer && let (Some(answer), Some(fields)) = (&found.answer, doc.as_object_mut()) {
                        let preview = super::answer::body_preview_allowed(route, actor);
                        fields.insert("answer".to_owned(), super::answer::document(answer, preview));
                    }
                    json_response(StatusCode::OK, &doc)
                }
                Err(e) => store_failed(gw, e),
            }
        }
    }
}

/// What an operator who named no idempotent route is told: the names there are. (The admin
/// API is behind its token, and route names are the operator's own configuration.)
fn unknown_route(gw: &Gateway, asked: &str) -> String {
    // Echoed bounded: the query is the caller's input.
    let asked: String = asked.chars().take(64).collect();
    let names: Vec<String> =
        gw.route_configs().iter().filter(|r| r.idempotency.is_some()).map(|r| format!("{:?}", r.name)).collect();
    if names.is_empty() {
        format!("No idempotent route is named {asked:?}: this gateway has none.")
    } else {
        format!("No idempotent route is named {asked:?}; the idempotent routes are {}.", names.join(", "))
    }
}

/// The answer to an operator's change that was not made.
pub(super) fn refused(gw: &Gateway, refusal: Refusal) -> Response<Body> {
    let (detail, title, state) = match refusal {
        Refusal::Running { lease_left } => (
            format!(
                "A request holds this key and may be running upstream now (its lease ends within {}s): \
                 released, a retry would run it a second time beside it. Nothing changed. Wait for it to \
                 settle, or release it with force=true only if you know it is not running.",
                lease_left.as_secs_f64().ceil()
            ),
            "Not releasable",
            State::InProgress.name(),
        ),
        Refusal::NotHeld { state } => {
            let state = state.map_or(wire::ABSENT, State::name);
            let detail =
                format!("The record is {state}: only an unknown or executed record can be resolved. Nothing changed.");
            (detail, "Not resolvable", state)
        }
        Refusal::Store(e) => return store_failed(gw, e),
    };
    let mut r = problem(gw, StatusCode::CONFLICT, "admin-conflict", title, &detail);
    r.headers_mut().insert("x-record-state", HeaderValue::from_static(state));
    r
}

/// The record a `/keys` call names: the route, the key, and the caller (see the module docs).
pub(super) fn record_of(
    route: &IdempotentRoute,
    query: &KeysQuery,
    headers: &HeaderMap,
    gw: &Gateway,
) -> Result<RecordKey, String> {
    let policy = &route.policy;
    let Some(key_value) = &query.key else { return Err("Give key as a query parameter.".into()) };
    let Ok(key_header) = HeaderValue::from_str(key_value) else {
        return Err("The key holds characters a header cannot carry.".into());
    };
    let key = match policy.key(&HeaderMap::from_iter([(policy.header.clone(), key_header)])) {
        Ok(Some(k)) => k,
        Ok(None) => return Err("Give a key.".into()),
        Err(e) => return Err(e.to_string()),
    };
    if query.scope.is_some() {
        return Err("The scope does not go in the URL, where proxies and shells log it: send the caller's \
            scope headers as Scope-NAME headers (Scope-Authorization: Bearer ...), or give scope_hash."
            .into());
    }
    let scope = match &query.scope_hash {
        // The digest `GET /keys` lists: on a route that keeps keys per host, it holds the host.
        Some(hash) => Scope::from_hex(hash).ok_or("scope_hash must be 64 hex digits.")?,
        None => {
            let host = on_host(route, query.host.as_deref())?;
            // The caller's scope sources, each sent as `Scope-NAME` (`Scope-Authorization`,
            // `Scope-Cookie`). Without them: the scope of a global route or the anonymous one.
            let mut caller = HeaderMap::new();
            for source in policy.scope.sources() {
                let name = source.header();
                let Ok(admin_name) = HeaderName::from_bytes(format!("scope-{name}").as_bytes()) else { continue };
                for value in headers.get_all(&admin_name) {
                    caller.append(name.clone(), value.clone());
                }
            }
            // A route that refuses callers without their scope holds no record without one:
            // looking up the anonymous scope would answer "absent" for a key that is stuck.
            let host = host.as_deref();
            if policy.on_missing_scope == MissingScope::Reject
                && policy.scope(&caller, host, MissingScope::Reject).is_err()
            {
                return Err(per_caller(route));
            }
            policy.scope(&caller, host, MissingScope::Anonymous).map_err(|e| e.to_string())?
        }
    };
    Ok(gw.runtime().record_key(&route.policy.identity.name, &scope, &key))
}

/// The host a `/keys` call names (`host=`), normalised: required on a route that keeps keys
/// per host, refused on one that does not (it would name no other record).
fn on_host(route: &IdempotentRoute, given: Option<&str>) -> Result<Option<String>, String> {
    match (route.policy.identity.needs_host(), given) {
        (true, Some(host)) => match host::normalize(host) {
            Some(host) => Ok(Some(host.into_owned())),
            None => Err(format!("host={host:?} is not a host name or address.")),
        },
        (true, None) => Err(format!(
            "Route {:?} serves several hosts and keeps keys per host: a key has no record without its host. \
             Give host= (idemgate keys: --host), or scope_hash.",
            route.name
        )),
        (false, Some(_)) => {
            Err(format!("Route {:?} keeps one key space for all the hosts it serves: leave host out.", route.name))
        }
        (false, None) => Ok(None),
    }
}

/// What an operator who gave no (or not all of the) caller's scope on a per-caller route is
/// told: that the route keeps keys per caller, which sources it reads, and how to pass them.
fn per_caller(route: &IdempotentRoute) -> String {
    let sources = route.policy.scope.sources();
    let named: Vec<String> = sources.iter().map(|s| s.describe()).collect();
    // Two cookies are one Cookie header.
    let mut headers: Vec<String> = sources.iter().map(|s| s.header().to_string()).collect();
    headers.dedup();
    let sent: Vec<String> = headers.iter().map(|h| format!("Scope-{h}")).collect();
    let vars: Vec<String> = headers.iter().map(|h| wire::scope_variable(h.as_str())).collect();
    let (header_s, variable_s) = if headers.len() == 1 { ("header", "variable") } else { ("headers", "variables") };
    format!(
        "Route {:?} keeps keys per caller (scope: {}): a key has no record without its caller. Send the \
         caller's {} {header_s} as {}, or give scope_hash (idemgate keys: the {} {variable_s}, \
         --scope-stdin, or --scope-hash).",
        route.name,
        named.join(", "),
        headers.join(", "),
        sent.join(", "),
        vars.join(" and ")
    )
}

/// `GET /keys?route=R&state=unknown|executed[&cursor=C][&limit=N]`: one page of the route's
/// records in that state, oldest first. Each entry of the index is checked against its record
/// (the index is best-effort): one that moved on is dropped from the index and not listed.
pub(super) async fn list(gw: &Gateway, keys: &Keys<'_>, query: &KeysQuery) -> Response<Body> {
    let bad = |detail: &str| problem(gw, StatusCode::BAD_REQUEST, "admin-bad-request", "Bad request", detail);
    let Some(held) = query.state.as_deref().and_then(State::parse).filter(|state| state.is_held()) else {
        return bad("state must be unknown or executed: the states that need an operator.");
    };
    let limit = match query.limit.as_deref().map(str::parse::<usize>) {
        None => 100,
        Some(Ok(n)) if (1..=MAX_LIMIT).contains(&n) => n,
        Some(_) => return bad(&format!("limit must be between 1 and {MAX_LIMIT}.")),
    };
    let cursor = match query.cursor.as_deref().filter(|c| !c.is_empty()) {
        None => None,
        Some(text) => match Cursor::decode(text) {
            Some(cursor) => Some(cursor),
            None => return bad("cursor is not one this endpoint handed out."),
        },
    };
    match keys.list(held, cursor, limit).await {
        Ok(page) => json_response(StatusCode::OK, &page),
        Err(e) => store_failed(gw, e),
    }
}

/// The operator's answer in a `PUT /keys` body (see [`crate::operator`]), read whole within
/// the body timeout; the refusal when it is not one.
pub(super) async fn read_answer(
    gw: &Gateway,
    route: &IdempotentRoute,
    headers: &HeaderMap,
    body: Incoming,
) -> Result<StoredResponse, Response<Body>> {
    let limit = route.settings.body_read_timeout;
    let bytes = match crate::body::read_bounded(headers, body, MAX_RESOLVE_BODY, limit).await {
        Ok(bytes) => bytes,
        // The rest may still arrive: the connection cannot carry another request.
        Err(BodyError::Timeout { limit }) => {
            let detail = format!("The body did not arrive within {}s; nothing changed.", limit.as_secs_f64());
            let mut r = problem(gw, StatusCode::REQUEST_TIMEOUT, "admin-body-timeout", "Body too slow", &detail);
            r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            return Err(r);
        }
        Err(e) => return Err(bad_request(gw, &format!("Cannot read the body: {e}."))),
    };
    crate::operator::parse_answer(&bytes, &route.policy.stored_headers)
        .map_err(|e| bad_request(gw, &format!("{}. Nothing changed.", capitalise(&e.to_string()))))
}

pub(super) fn bad_request(gw: &Gateway, detail: &str) -> Response<Body> {
    problem(gw, StatusCode::BAD_REQUEST, "admin-bad-request", "Bad request", detail)
}

pub(super) fn capitalise(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |c| c.to_uppercase().chain(chars).collect())
}

pub(super) fn store_failed(gw: &Gateway, e: StoreError) -> Response<Body> {
    if let StoreError::Rejected(why) = &e {
        // The store answers: it is the command, not the store (logged by the store's health).
        let detail = format!("The store refused the command: {why}. Nothing changed.");
        return problem(
            gw,
            StatusCode::INTERNAL_SERVER_ERROR,
            "admin-store-refused",
            "Store refused the command",
            &detail,
        );
    }
    tracing::debug!(error = %e, "admin: store unavailable");
    problem(
        gw,
        StatusCode::SERVICE_UNAVAILABLE,
        "store-unavailable",
        "Idempotency store unavailable",
        "The store did not answer.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_that_reads_two_ways_is_refused_naming_the_parameter() {
        let refused = |query: &str| KeysQuery::parse(query).err().unwrap_or_else(|| panic!("{query} was taken"));
        assert!(refused("route=a&key=k&force=false&force=true").starts_with("force is given 2 times"));
        assert!(refused("route=a&ro%75te=b").starts_with("route is given 2 times"), "decoded names compare");
        assert!(refused("route=a&route=a").starts_with("route is given 2 times"), "even with one value");
        for empty in ["route=", "route=a&key=", "route=a&key=k&force", "route=a&state=", "route=a&limit="] {
            let name = empty.rsplit('&').next().unwrap_or_default().trim_end_matches('=');
            assert!(refused(empty).starts_with(&format!("{name} is given empty")), "{empty}");
        }
        let unknown = refused("route=a&key=k&scope-hash=00");
        assert!(unknown.starts_with("\"scope-hash\" is not a parameter of /keys, which takes route, key"), "{unknown}");
        let hostile = refused(&format!("{}=1", "%1B".repeat(100)));
        assert!(!hostile.contains('\u{1b}') && hostile.matches("\\u{1b}").count() == 64, "{hostile}");
    }

    #[test]
    fn a_query_that_reads_one_way_is_taken() {
        let q = KeysQuery::parse("route=a&key=k&scope_hash=00&host=h&force=true").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((q.route.as_deref(), q.key.as_deref(), q.force.as_deref()), (Some("a"), Some("k"), Some("true")));
        let q = KeysQuery::parse("route=a&state=unknown&cursor=&limit=5").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(q.cursor.as_deref(), Some(""), "an empty cursor starts the listing, as before");
        let q = KeysQuery::parse("route=a&key=k&scope=").unwrap_or_else(|e| panic!("{e}"));
        assert!(q.scope.is_some(), "refused later, in its own words");
        assert!(KeysQuery::parse("").is_ok_and(|q| q.route.is_none()));
    }
}
