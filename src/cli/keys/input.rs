//! What `idemgate keys` reads locally before its first request, and checks, so that bad input
//! never leaves half a job done: the admin token, the caller's scope (both credentials, never
//! echoed), and the answer of a resolve.

use std::io::{IsTerminal, Read};
use std::path::Path;

use http::{HeaderName, HeaderValue};
use serde::{Serialize, Serializer};

use super::failure::Failure;

/// The variable holding the admin token.
pub(super) const TOKEN_VAR: &str = "IDEMGATE_ADMIN_TOKEN";
/// The prefix of the variables holding the caller's scope headers.
const SCOPE_VAR_PREFIX: &str = "IDEMGATE_SCOPE_";

/// `Bearer <token>`, marked sensitive; `what` names the token's source in an error.
pub(super) fn bearer(token: &str, what: &str) -> Result<HeaderValue, Failure> {
    // A token read with `$(cat file)` or from a secret mount often ends in a newline.
    let token = token.trim();
    let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| Failure::Usage(format!("{what} holds characters a header cannot carry")))?;
    value.set_sensitive(true);
    Ok(value)
}

/// `IDEMGATE_ADMIN_TOKEN`, as a bearer token.
pub(super) fn admin_token() -> Result<HeaderValue, Failure> {
    let missing = || {
        Failure::Usage(format!(
            "set {TOKEN_VAR} to the admin token (server.admin_token); it is never taken from the command line"
        ))
    };
    let token = std::env::var_os(TOKEN_VAR).ok_or_else(missing)?;
    let token = token.into_string().map_err(|_| Failure::Usage(format!("{TOKEN_VAR} is not UTF-8")))?;
    if token.trim().is_empty() {
        return Err(missing());
    }
    bearer(&token, TOKEN_VAR)
}

/// The caller whose key it is, as the admin listener takes it: `Scope-<Name>` headers, or the
/// scope's digest as `scope_hash`.
pub(super) struct CallerScope {
    pub(super) headers: Vec<(HeaderName, HeaderValue)>,
    pub(super) hash: Option<String>,
    /// The host, on a route that keeps keys per host.
    pub(super) host: Option<String>,
}

impl CallerScope {
    pub(super) fn none() -> Self {
        Self { headers: Vec::new(), hash: None, host: None }
    }

    /// The same caller on `host`.
    pub(super) fn on(mut self, host: Option<&str>) -> Self {
        self.host = host.map(str::to_owned);
        self
    }
}

/// The caller whose key it is: the scope's digest when given, else the scope headers from
/// the environment and (`from_stdin`) standard input.
pub(super) fn caller_scope(from_stdin: bool, scope_hash: Option<&str>) -> Result<CallerScope, Failure> {
    let mut headers = scope_from_env()?;
    if let Some(hash) = scope_hash {
        // The admin listener prefers scope_hash anyway: credentials it would not use stay home.
        if !headers.is_empty() {
            eprintln!("idemgate keys: --scope-hash given: the {SCOPE_VAR_PREFIX}* variables are not sent");
        }
        return Ok(CallerScope { headers: Vec::new(), hash: Some(hash.to_owned()), host: None });
    }
    if from_stdin {
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
    Ok(CallerScope { headers, hash: None, host: None })
}

/// `IDEMGATE_SCOPE_<NAME>=value` → `Scope-<Name>: value`, in the variables' name order.
pub(super) fn scope_from_env() -> Result<Vec<(HeaderName, HeaderValue)>, Failure> {
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
pub(super) fn parse_scope_lines(text: &str) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
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

pub(super) fn scope_header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    if name.is_empty() {
        return Err("no header name".into());
    }
    let header = HeaderName::from_bytes(format!("scope-{name}").as_bytes())
        .map_err(|_| format!("{name:?} is not a header name"))?;
    let mut value = HeaderValue::from_str(value).map_err(|_| "the value holds characters a header cannot carry")?;
    value.set_sensitive(true);
    Ok((header, value))
}

pub(super) fn parse_scope_hash(s: &str) -> Result<String, String> {
    if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(s.to_ascii_lowercase())
    } else {
        Err("expected 64 hex digits (the scope's SHA-256)".into())
    }
}

pub(super) fn parse_answer_header(s: &str) -> Result<(String, String), String> {
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
pub(super) fn answer_headers(headers: &[(String, String)]) -> Vec<(String, Vec<String>)> {
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
pub(super) fn resolve_body(body: Option<&str>, body_file: Option<&Path>, scope_stdin: bool) -> Result<String, Failure> {
    let Some(path) = body_file else {
        return Ok(body.unwrap_or_default().to_owned());
    };
    let from_stdin = path.as_os_str() == "-";
    if from_stdin && scope_stdin {
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
pub(super) struct Resolution<'a> {
    pub(super) status: u16,
    pub(super) headers: HeaderList<'a>,
    pub(super) body: &'a str,
}

/// Headers as a JSON object in the order given: `"name": "value"`, or `"name": ["v1", "v2"]`
/// for a name given more than once.
pub(super) struct HeaderList<'a>(pub(super) &'a [(String, Vec<String>)]);

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_lines_skip_comments_and_never_echo_values() {
        let headers = parse_scope_lines("# who\n\nAuthorization: Bearer bob\r\n  Cookie:  a=b \n").unwrap();
        let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["scope-authorization", "scope-cookie"]);
        assert_eq!(headers[1].1, "a=b");
        let err = parse_scope_lines("Bearer secret-token\n").unwrap_err();
        assert!(err.contains("line 1") && !err.contains("secret"), "{err}");
    }
}
