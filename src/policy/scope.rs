//! Scope: whose key is this?
//!
//! Two callers who both pick the key `"1"` must never share a record, or one of them would be
//! answered with the other's order. The scope comes from authentication, never from the
//! body: one source or a list of them (`header:Authorization`, `cookie:session`,
//! `header:Stripe-Account`), hashed together, never stored or logged in clear.
//!
//! The hazard is a request that carries none of it. Pooling every such request into one
//! anonymous scope hands one cookie-authenticated user another's stored order, so a keyed
//! request missing any source is refused by default (`on_missing_scope = "reject"`);
//! `"anonymous"` is for upstreams that accept anonymous calls and treat them all alike.
//!
//! Only what cannot change the caller's identity is normalised: surrounding whitespace, and
//! the case of the scheme in `Authorization` (`bearer x` is `Bearer x`, RFC 9110 §11.1). A
//! refreshed token is a new scope: put a stable identity header, set by the auth layer, first.

use http::{HeaderMap, HeaderName, header};
use sha2::{Digest, Sha256};

/// Where one part of a caller's identity is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// A request header's value (`header:NAME`).
    Header(HeaderName),
    /// A cookie's value (`cookie:NAME`).
    Cookie(String),
}

/// One part of a caller's identity: a field, required or optional (`header:NAME?`).
///
/// An optional part is for an identity that is sometimes narrower: `header:Stripe-Account?`
/// after `header:Authorization` is a platform acting on a connected account when present, and
/// on its own account when absent. Absent, it hashes as absent: a scope of its own, equal to
/// no value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// What is read.
    pub field: Field,
    /// Whether a request may lack it.
    pub optional: bool,
}

impl Source {
    /// A required part.
    pub fn required(field: Field) -> Self {
        Self { field, optional: false }
    }

    /// The config spelling, for errors and the policy (`header:stripe-account?`).
    pub fn describe(&self) -> String {
        let mark = if self.optional { "?" } else { "" };
        match &self.field {
            Field::Header(name) => format!("header:{name}{mark}"),
            Field::Cookie(name) => format!("cookie:{name}{mark}"),
        }
    }

    /// The request header this source reads.
    pub fn header(&self) -> HeaderName {
        match &self.field {
            Field::Header(name) => name.clone(),
            Field::Cookie(_) => header::COOKIE,
        }
    }
}

/// Where a route takes the caller's identity from (`scope` in `gateway.toml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeSource {
    /// Every caller shares one key space (`scope = "global"`).
    Global,
    /// The caller is identified by these sources together, in this order.
    Caller(Vec<Source>),
}

/// What a keyed request that lacks a scope source gets (`on_missing_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingScope {
    /// 400 `scope-missing`; nothing is forwarded. The default.
    Reject,
    /// The missing source counts as "absent": such callers share records.
    Anonymous,
}

impl MissingScope {
    /// Parses `"reject"` or `"anonymous"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "reject" => Ok(Self::Reject),
            "anonymous" => Ok(Self::Anonymous),
            other => Err(format!("{other:?} is neither \"reject\" nor \"anonymous\"")),
        }
    }
}

impl ScopeSource {
    /// Parses the config syntax: `"global"`, or one or more of `"header:NAME"` and
    /// `"cookie:NAME"`, each optional with a trailing `?`; at least one is required.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, String> {
        match entries {
            [] => Err("is empty; name at least one source, or \"global\"".into()),
            [one] if one.as_ref() == "global" => Ok(Self::Global),
            many => {
                let mut sources: Vec<Source> = Vec::with_capacity(many.len());
                for entry in many {
                    let source = parse_source(entry.as_ref())?;
                    if sources.iter().any(|s| s.field == source.field) {
                        return Err(format!("{:?} is listed twice", entry.as_ref()));
                    }
                    sources.push(source);
                }
                // Without a required part, a request with no credential at all would have a
                // scope (every part absent) that all such requests share.
                if sources.iter().all(|s| s.optional) {
                    return Err("needs at least one required part (without \"?\"), or \"global\"".into());
                }
                Ok(Self::Caller(sources))
            }
        }
    }

    /// The sources, empty for `global`.
    pub fn sources(&self) -> &[Source] {
        match self {
            Self::Global => &[],
            Self::Caller(sources) => sources,
        }
    }
}

fn parse_source(entry: &str) -> Result<Source, String> {
    if entry == "global" {
        return Err("\"global\" cannot be combined with other sources".into());
    }
    let (text, optional) = match entry.trim_end().strip_suffix('?') {
        Some(text) => (text, true),
        None => (entry, false),
    };
    let field = parse_field(text).map_err(|e| {
        if optional { format!("{e} (a trailing \"?\" makes a part optional: \"header:NAME?\")") } else { e }
    })?;
    Ok(Source { field, optional })
}

fn parse_field(text: &str) -> Result<Field, String> {
    if let Some(name) = text.strip_prefix("header:") {
        return HeaderName::from_bytes(name.trim().as_bytes())
            .map(Field::Header)
            .map_err(|_| format!("{name:?} is not a valid header name"));
    }
    if let Some(name) = text.strip_prefix("cookie:") {
        let name = name.trim();
        let valid =
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b));
        return if valid {
            Ok(Field::Cookie(name.to_owned()))
        } else {
            Err(format!("{name:?} is not a valid cookie name"))
        };
    }
    Err(format!("{text:?} is none of \"global\", \"header:NAME\", \"cookie:NAME\" (\"?\" after one: optional)"))
}

/// The caller's key space, as a fixed-size digest so that credentials never reach the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scope([u8; 32]);

impl Scope {
    /// The digest that goes into the record's key name.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// This caller's key space on one host, for a route that serves several: the same key
    /// and caller on `a.example.com` and on `b.example.com` are two records, so one tenant is
    /// never answered with another's stored response.
    pub fn within_host(&self, host: &str) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"idemgate-scope-host-v1\0");
        hasher.update((host.len() as u64).to_be_bytes());
        hasher.update(host.as_bytes());
        hasher.update(self.0);
        Self(hasher.finalize().into())
    }

    /// Reads the hex form (`Scope::to_hex`), as the admin API takes it.
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(text, &mut out).ok()?;
        Some(Self(out))
    }

    /// The digest in hex, for the admin API.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// A keyed request lacks a scope source and the route rejects such requests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the request has no {missing} to scope its idempotency key by")]
pub struct ScopeMissing {
    /// The source, as configured (`header:Authorization`).
    pub missing: String,
}

/// Derives the scope of a request. Each source contributes its values in order, each
/// length-prefixed; a header or cookie given several times contributes every value.
pub fn derive(scope: &ScopeSource, missing: MissingScope, headers: &HeaderMap) -> Result<Scope, ScopeMissing> {
    let mut hasher = Sha256::new();
    hasher.update(b"idemgate-scope-v2\0");
    let sources = match scope {
        ScopeSource::Global => {
            hasher.update(b"global");
            return Ok(Scope(hasher.finalize().into()));
        }
        ScopeSource::Caller(sources) => sources,
    };
    for source in sources {
        let values = values_of(source, headers);
        if values.is_empty() {
            // An optional part, or a required one on an anonymous route: absent is a value of
            // its own, never equal to a present one (which hashes "present" first).
            if !source.optional && missing == MissingScope::Reject {
                return Err(ScopeMissing { missing: source.describe() });
            }
            hasher.update(b"absent\0");
            continue;
        }
        hasher.update(b"present\0");
        hasher.update((values.len() as u64).to_be_bytes());
        for value in values {
            hasher.update((value.len() as u64).to_be_bytes());
            hasher.update(&value);
        }
    }
    Ok(Scope(hasher.finalize().into()))
}

/// Copies the request's scope sources, as it sent them, into `to`: each named header, and the
/// named cookies as one `Cookie: NAME=value; ...` (no other cookie). Nothing for `global`.
/// For a request the gateway makes on the caller's behalf (a lookup), so that the upstream
/// sees the same caller.
pub fn copy_sources(scope: &ScopeSource, from: &HeaderMap, to: &mut HeaderMap) {
    let mut cookies: Vec<u8> = Vec::new();
    for source in scope.sources() {
        match &source.field {
            Field::Header(name) => {
                for value in from.get_all(name) {
                    to.append(name.clone(), value.clone());
                }
            }
            Field::Cookie(wanted) => {
                for value in values_of(source, from) {
                    if !cookies.is_empty() {
                        cookies.extend_from_slice(b"; ");
                    }
                    cookies.extend_from_slice(wanted.as_bytes());
                    cookies.push(b'=');
                    cookies.extend_from_slice(&value);
                }
            }
        }
    }
    // Values read from a valid header, joined with "; ": a valid header again.
    if let Ok(value) = http::HeaderValue::from_bytes(&cookies)
        && !cookies.is_empty()
    {
        to.insert(header::COOKIE, value);
    }
}

/// The normalised values of one source; empty when the request does not carry it (an empty
/// or blank value counts as not carried).
fn values_of(source: &Source, headers: &HeaderMap) -> Vec<Vec<u8>> {
    match &source.field {
        Field::Header(name) => {
            headers.get_all(name).iter().map(|v| normalise(name, v.as_bytes())).filter(|v| !v.is_empty()).collect()
        }
        Field::Cookie(wanted) => headers
            .get_all(header::COOKIE)
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b';'))
            .filter_map(|pair| {
                let pair = pair.trim_ascii();
                let eq = pair.iter().position(|b| *b == b'=')?;
                (pair[..eq].trim_ascii() == wanted.as_bytes()).then(|| pair[eq + 1..].trim_ascii().to_vec())
            })
            .filter(|v| !v.is_empty())
            .collect(),
    }
}

/// Surrounding whitespace goes; for credentials, the scheme's case too.
fn normalise(name: &HeaderName, value: &[u8]) -> Vec<u8> {
    let value = value.trim_ascii();
    if *name != header::AUTHORIZATION && *name != header::PROXY_AUTHORIZATION {
        return value.to_vec();
    }
    match value.iter().position(|b| *b == b' ') {
        Some(space) => {
            let mut out = value[..space].to_ascii_lowercase();
            out.push(b' ');
            out.extend_from_slice(value[space..].trim_ascii());
            out
        }
        None => value.to_ascii_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::test_map as headers;

    fn sources(entries: &[&str]) -> ScopeSource {
        ScopeSource::parse(entries).unwrap()
    }

    fn scope(s: &ScopeSource, pairs: &[(&str, &str)]) -> Result<Scope, ScopeMissing> {
        derive(s, MissingScope::Reject, &headers(pairs))
    }

    #[test]
    fn parses_config_syntax() {
        assert_eq!(ScopeSource::parse(&["global"]), Ok(ScopeSource::Global));
        assert_eq!(
            ScopeSource::parse(&["header:X-User-Id", "cookie:session"]),
            Ok(ScopeSource::Caller(vec![
                Source::required(Field::Header(HeaderName::from_static("x-user-id"))),
                Source::required(Field::Cookie("session".into()))
            ]))
        );
        for bad in [
            &["header:bad header"][..],
            &["user"],
            &["global", "header:a"],
            &[],
            &["cookie:"],
            &["header:a", "header:A"],
            &["header:a?"],
            &["header:a?", "cookie:b?"],
            &["header:a", "header:a?"],
            &["header:?"],
            &["global?"],
        ] {
            assert!(ScopeSource::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn different_callers_get_different_scopes() {
        let s = sources(&["header:Authorization"]);
        let a = scope(&s, &[("authorization", "Bearer alice")]).unwrap();
        assert_ne!(a, scope(&s, &[("authorization", "Bearer bob")]).unwrap());
        assert_eq!(a, scope(&s, &[("authorization", "Bearer alice")]).unwrap());
    }

    #[test]
    fn the_scheme_case_and_surrounding_whitespace_do_not_matter_the_credential_does() {
        let s = sources(&["header:Authorization"]);
        let a = scope(&s, &[("authorization", "Bearer alice")]).unwrap();
        assert_eq!(a, scope(&s, &[("authorization", "bearer alice")]).unwrap());
        assert_eq!(a, scope(&s, &[("authorization", "  BEARER   alice ")]).unwrap());
        assert_ne!(a, scope(&s, &[("authorization", "Bearer ALICE")]).unwrap());
    }

    #[test]
    fn a_missing_source_is_rejected_or_anonymous_as_configured() {
        let s = sources(&["header:Authorization", "header:Stripe-Account"]);
        let err = scope(&s, &[("authorization", "Bearer a")]).unwrap_err();
        assert_eq!(err.missing, "header:stripe-account");
        assert!(scope(&s, &[("authorization", " "), ("stripe-account", "acct_1")]).is_err(), "blank counts as missing");
        let anon = derive(&s, MissingScope::Anonymous, &headers(&[])).unwrap();
        assert_ne!(anon, derive(&ScopeSource::Global, MissingScope::Anonymous, &headers(&[])).unwrap());
        let half = derive(&s, MissingScope::Anonymous, &headers(&[("authorization", "Bearer a")])).unwrap();
        assert_ne!(anon, half);
    }

    #[test]
    fn an_optional_part_absent_is_a_scope_of_its_own() {
        // A platform acting on its own account (no Stripe-Account) or on a connected one.
        let s = sources(&["header:Authorization", "header:Stripe-Account?"]);
        assert_eq!(
            s.sources()[1],
            Source { field: Field::Header(HeaderName::from_static("stripe-account")), optional: true }
        );
        assert_eq!(s.sources()[1].describe(), "header:stripe-account?");
        let own = scope(&s, &[("authorization", "Bearer k")]).expect("an optional part may be absent");
        let connected = scope(&s, &[("authorization", "Bearer k"), ("stripe-account", "acct_1")]).unwrap();
        assert_ne!(own, connected);
        // Absent equals no value, not even an empty or a blank one's neighbours.
        for value in ["absent", "-", "null", "\"\""] {
            assert_ne!(own, scope(&s, &[("authorization", "Bearer k"), ("stripe-account", value)]).unwrap(), "{value}");
        }
        assert_eq!(
            own,
            scope(&s, &[("authorization", "Bearer k"), ("stripe-account", " ")]).unwrap(),
            "blank is absent"
        );
        // Another caller without the part is another scope; the required part is still required.
        assert_ne!(own, scope(&s, &[("authorization", "Bearer j")]).unwrap());
        assert_eq!(scope(&s, &[("stripe-account", "acct_1")]).unwrap_err().missing, "header:authorization");
    }

    #[test]
    fn lists_of_required_parts_keep_the_hashes_records_were_stored_under() {
        // The digests records were stored under before optional parts existed (computed
        // apart from this code, from the hashing rule); a change here renames every record.
        let s = sources(&["header:Authorization", "header:Stripe-Account"]);
        let both = scope(&s, &[("authorization", "Bearer k"), ("stripe-account", "acct_1")]).unwrap();
        assert_eq!(both.to_hex(), PINNED_TWO_PARTS);
        let one = scope(&sources(&["header:Authorization"]), &[("authorization", "Bearer k")]).unwrap();
        assert_eq!(one.to_hex(), PINNED_ONE_PART);
    }

    const PINNED_TWO_PARTS: &str = "cf90433eefc872aa3e79b01600fa34638588a1fbe9c2f747b27fd68174eb4fd8";
    const PINNED_ONE_PART: &str = "51703c0b02a1cfb019d29d2e5ba9beab426da7aac3e0cb76e682c539f4c75ada";

    #[test]
    fn a_list_needs_every_part_to_match() {
        let s = sources(&["header:Authorization", "header:Stripe-Account"]);
        let a = scope(&s, &[("authorization", "Bearer k"), ("stripe-account", "acct_1")]).unwrap();
        assert_ne!(a, scope(&s, &[("authorization", "Bearer k"), ("stripe-account", "acct_2")]).unwrap());
        // Parts cannot shift into each other.
        let t = sources(&["header:a", "header:b"]);
        assert_ne!(scope(&t, &[("a", "xy"), ("b", "z")]).unwrap(), scope(&t, &[("a", "x"), ("b", "yz")]).unwrap());
    }

    #[test]
    fn cookies_are_read_by_name() {
        let s = sources(&["cookie:session"]);
        let a = scope(&s, &[("cookie", "theme=dark; session=abc")]).unwrap();
        assert_eq!(a, scope(&s, &[("cookie", "session=abc;theme=light")]).unwrap());
        assert_eq!(a, scope(&s, &[("cookie", "x=1"), ("cookie", "session=abc")]).unwrap());
        assert_ne!(a, scope(&s, &[("cookie", "session=abd")]).unwrap());
        assert!(scope(&s, &[("cookie", "sessionid=abc")]).is_err());
        assert!(scope(&s, &[]).is_err());
    }

    #[test]
    fn global_ignores_the_caller() {
        let g = ScopeSource::Global;
        assert_eq!(scope(&g, &[("authorization", "a")]).unwrap(), scope(&g, &[]).unwrap());
    }

    #[test]
    fn hex_round_trips() {
        let s = scope(&ScopeSource::Global, &[]).unwrap();
        assert_eq!(Scope::from_hex(&s.to_hex()), Some(s));
        assert_eq!(Scope::from_hex("zz"), None);
    }
}
