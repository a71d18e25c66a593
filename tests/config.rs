//! Configuration: the shipped file is valid, every bad value is named with its key, and
//! `idemgate check` exits non-zero with the file, key and reason.

use std::process::Command;
use std::time::Duration;

use idemgate::config::{Config, ConfigError, StoreBackendConfig};
use idemgate::policy::UnknownOutcomePolicy;
use idemgate::policy::scope::{Field, MissingScope, ScopeSource, Source};

const MINIMAL: &str = r#"
[server]
listen = "127.0.0.1:8080"

[store]
backend = "memory"

[upstreams.app]
url = "http://127.0.0.1:3000"

[[routes]]
name = "create"
methods = ["POST"]
path = "/orders"
upstream = "app"

[routes.idempotency]
"#;

fn issues_of(text: &str) -> Vec<(String, String)> {
    match Config::from_toml(text, "test.toml") {
        Err(ConfigError::Invalid { file, issues }) => {
            assert_eq!(file, "test.toml");
            issues.into_iter().map(|i| (i.key, i.reason)).collect()
        }
        other => panic!("expected validation issues, got {other:?}"),
    }
}

fn assert_issue(text: &str, key: &str, reason_part: &str) {
    let issues = issues_of(text);
    assert!(
        issues.iter().any(|(k, r)| k == key && r.contains(reason_part)),
        "no issue {key}: ...{reason_part}... in {issues:#?}"
    );
}

#[test]
fn the_shipped_gateway_toml_is_valid() {
    let config = Config::load(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.toml"))).unwrap();
    let route = config.route("create-order").unwrap();
    let policy = route.idempotency.as_ref().unwrap();
    assert_eq!(policy.lease, Duration::from_secs(10));
    assert_eq!(policy.retention, Duration::from_secs(24 * 3600));
    assert_eq!(policy.max_request_body, 1 << 20);
    assert!(matches!(config.store.backend, StoreBackendConfig::Redis { .. }));
}

#[test]
fn defaults_apply_to_an_empty_idempotency_table() {
    let config = Config::from_toml(MINIMAL, "t").unwrap();
    let p = config.routes[0].idempotency.as_ref().unwrap();
    assert!(p.required);
    assert_eq!(p.header.as_str(), "idempotency-key");
    assert_eq!(p.max_key_len, 255);
    assert_eq!(p.wait, Duration::from_secs(5));
    assert_eq!(p.lease, Duration::from_secs(10));
    assert_eq!(p.max_stored_body, 1 << 20);
    assert_eq!(p.replay_header.as_str(), "idempotent-replay");
    // What began executing is stored: 2xx, 3xx, 4xx except "not processed" and "try again".
    for (code, stored) in [
        (201, true),
        (303, true),
        (404, true),
        (400, false),
        (408, false),
        (409, false),
        (422, false),
        (425, false),
        (429, false),
        (502, false),
    ] {
        assert_eq!(p.store_statuses.contains(http::StatusCode::from_u16(code).unwrap()), stored, "{code}");
    }
    assert_eq!(p.on_missing_scope, MissingScope::Reject);
    assert_eq!(p.on_unknown_outcome, UnknownOutcomePolicy::Hold);
    assert_eq!(p.attempt_header.as_ref().map(|h| h.as_str()), Some("idempotency-attempt"));
}

#[test]
fn unknown_keys_are_errors_naming_file_key_and_line() {
    let text = MINIMAL.replace("[routes.idempotency]", "[routes.idempotency]\nleas = \"5s\"");
    let err = Config::from_toml(&text, "gw.toml").unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("gw.toml:18: routes[0] (\"create\").idempotency.leas: unknown key"), "{msg}");
}

#[test]
fn check_reports_every_problem_at_once_each_with_its_line() {
    // An unknown key no longer hides the others: unknown keys in two sections, a wrongly typed
    // value in a third, and a bad value in a fourth, all in one report, in file order.
    let text = MINIMAL
        .replace("listen = \"127.0.0.1:8080\"", "listen = \"127.0.0.1:8080\"\nlisten_backlog = 5")
        .replace("backend = \"memory\"", "backend = \"memory\"\nmax_entries = \"many\"")
        .replace("[routes.idempotency]", "[routes.idempotency]\nleas = \"5s\"");
    let issues = match Config::from_toml(&text, "gw.toml") {
        Err(ConfigError::Invalid { issues, .. }) => issues,
        other => panic!("{other:?}"),
    };
    let found: Vec<(&str, Option<usize>)> = issues.iter().map(|i| (i.key.as_str(), i.line)).collect();
    assert_eq!(
        found,
        [("server.listen_backlog", Some(4)), ("store.max_entries", Some(8)), ("routes[0].idempotency.leas", Some(20))],
        "{issues:#?}"
    );
    // Sections that read fine are validated too, so a bad value shows up beside unknown keys.
    let text = MINIMAL
        .replace("[routes.idempotency]", "[routes.idempotency]\nleas = \"5s\"\nmax_key_len = 0")
        .replace("path = \"/orders\"", "path = \"/pay/{id\"");
    let msg = Config::from_toml(&text, "gw.toml").unwrap_err().to_string();
    for line in [
        "gw.toml: 3 problems",
        "gw.toml:14: routes[0] (\"create\").path: invalid path pattern \"/pay/{id\": segment \"{id\"",
        "gw.toml:18: routes[0] (\"create\").idempotency.leas: unknown key",
        "gw.toml:19: routes[0] (\"create\").idempotency.max_key_len: must be between 1 and",
    ] {
        assert!(msg.contains(line), "missing {line:?} in\n{msg}");
    }
}

#[test]
fn wrongly_typed_values_name_their_key() {
    let text = MINIMAL.replace("[routes.idempotency]", "[routes.idempotency]\nlease = 30");
    let msg = Config::from_toml(&text, "gw.toml").unwrap_err().to_string();
    assert!(msg.contains("routes[0] (\"create\").idempotency.lease") && msg.contains("duration"), "{msg}");
    let text = MINIMAL.replace("[routes.idempotency]", "[routes.idempotency]\nmax_request_body = \"a lot\"");
    let msg = Config::from_toml(&text, "gw.toml").unwrap_err().to_string();
    assert!(
        msg.contains("routes[0] (\"create\").idempotency.max_request_body")
            && msg.contains("is not a size: expected a size such as 64KiB or 1MiB"),
        "{msg}"
    );
}

#[test]
fn toml_syntax_errors_are_reported_with_their_position() {
    let msg = Config::from_toml("[server\nlisten = 1", "gw.toml").unwrap_err().to_string();
    assert!(msg.starts_with("gw.toml:1:"), "{msg}");
}

#[test]
fn every_bad_value_is_reported_at_once() {
    let text = r#"
[server]
listen = "localhost"
admin_listen = "127.0.0.1:99999"
admin_token = "short"
worker_threads = 0

[store]
backend = "redis"
timeout = "0s"

[upstreams.app]
url = "ftp://files.example"

[[routes]]
name = "bad name"
methods = ["post", "BREW COFFEE"]
path = "/orders"
upstream = "nowhere"

[routes.idempotency]
header = "Bad Header"
max_key_len = 0
scope = "user"
ignore = ["client_ts"]
fingerprint_headers = ["ok-header", "not ok"]
lease = "0s"
retention = "0s"
store_statuses = ["2xx", "7xx", 99]
max_request_body = "0B"
max_stored_body = "2GiB"
exclude_headers = ["x:y"]
on_store_error = "fail-maybe"
replay_header = ""
"#;
    let issues = issues_of(text);
    for (key, part) in [
        ("server.listen", "not an IP address with a port"),
        ("server.admin_listen", "not an IP address with a port"),
        ("server.admin_token", "at least 16"),
        ("server.worker_threads", "between 1 and 1024"),
        ("store.url", "required for the redis backend"),
        ("store.timeout", "longer than 0"),
        ("upstreams.app.url", "http:// or https://"),
        ("routes[0].name", "A-Z a-z 0-9"),
        ("routes[0].upstream", "not defined under [upstreams]"),
        ("routes[0].methods", "\"post\" is not an HTTP method in upper case"),
        ("routes[0].methods", "\"BREW COFFEE\""),
        ("routes[0].idempotency.header", "not a valid header name"),
        ("routes[0].idempotency.max_key_len", "between 1 and"),
        ("routes[0].idempotency.scope", "none of \"global\", \"header:NAME\", \"cookie:NAME\""),
        ("routes[0].idempotency.ignore", "must start with '/'"),
        ("routes[0].idempotency.fingerprint_headers", "\"not ok\""),
        ("routes[0].idempotency.lease", "longer than 0"),
        ("routes[0].idempotency.retention", "longer than 0"),
        ("routes[0].idempotency.store_statuses", "\"7xx\""),
        ("routes[0].idempotency.store_statuses", "\"99\""),
        ("routes[0].idempotency.max_request_body", "larger than 0"),
        ("routes[0].idempotency.max_stored_body", "at most 1GiB"),
        ("routes[0].idempotency.exclude_headers", "\"x:y\""),
        ("routes[0].idempotency.on_store_error", "\"fail-maybe\""),
        ("routes[0].idempotency.replay_header", "not a valid header name"),
    ] {
        assert!(issues.iter().any(|(k, r)| k == key && r.contains(part)), "missing {key}: {part} in {issues:#?}");
    }
}

#[test]
fn scope_takes_one_source_or_a_list_and_statuses_take_exclusions() {
    let text = MINIMAL.replace(
        "[routes.idempotency]",
        "[routes.idempotency]\nscope = [\"header:Authorization\", \"cookie:session\"]\non_missing_scope = \"anonymous\"\nstore_statuses = [\"2xx\", \"!204\"]\non_unknown_outcome = \"release\"\nattempt_header = \"\"",
    );
    let config = Config::from_toml(&text, "t").unwrap();
    let p = config.routes[0].idempotency.as_ref().unwrap();
    assert_eq!(
        p.scope,
        ScopeSource::Caller(vec![
            Source::required(Field::Header(http::header::AUTHORIZATION)),
            Source::required(Field::Cookie("session".into()))
        ])
    );
    assert_eq!(p.on_missing_scope, MissingScope::Anonymous);
    assert!(
        p.store_statuses.contains(http::StatusCode::OK) && !p.store_statuses.contains(http::StatusCode::NO_CONTENT)
    );
    assert_eq!(p.on_unknown_outcome, UnknownOutcomePolicy::Release);
    assert_eq!(p.attempt_header, None, "an empty attempt_header sends none");
    for (line, key, reason) in [
        ("scope = [\"global\", \"header:X\"]", "scope", "cannot be combined"),
        ("scope = []", "scope", "is empty"),
        ("on_missing_scope = \"pool\"", "on_missing_scope", "neither \"reject\" nor \"anonymous\""),
        ("on_unknown_outcome = \"retry\"", "on_unknown_outcome", "neither \"hold\" nor \"release\""),
        ("store_statuses = [\"!6xx\"]", "store_statuses", "\"6xx\""),
        ("attempt_header = \"bad header\"", "attempt_header", "not a valid header name"),
    ] {
        let text = MINIMAL.replace("[routes.idempotency]", &format!("[routes.idempotency]\n{line}"));
        assert_issue(&text, &format!("routes[0].idempotency.{key}"), reason);
    }
}

#[test]
fn backend_specific_keys_are_checked_against_the_backend() {
    let text = MINIMAL.replace("backend = \"memory\"", "backend = \"memory\"\nurl = \"redis://x\"\nconnections = 3");
    assert_issue(&text, "store.url", "redis backend only");
    assert_issue(&text, "store.connections", "redis backend only");
    let text =
        MINIMAL.replace("backend = \"memory\"", "backend = \"redis\"\nurl = \"redis://127.0.0.1\"\nmax_entries = 5");
    assert_issue(&text, "store.max_entries", "memory backend only");
    let text = MINIMAL.replace("backend = \"memory\"", "backend = \"redis\"\nurl = \"http://127.0.0.1\"");
    assert_issue(&text, "store.url", "not a usable Redis URL");
    let redis = |url: &str, extra: &str| {
        MINIMAL.replace("backend = \"memory\"", &format!("backend = \"redis\"\nurl = \"{url}\"\n{extra}"))
    };
    for url in [
        "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster",
        "rediss+sentinel://127.0.0.1:26379/mymaster",
        "redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
        "rediss+cluster://u:p@[::1]:7000",
    ] {
        assert!(Config::from_toml(&redis(url, ""), "test.toml").is_ok(), "{url} was refused");
    }
    for (url, reason) in [
        ("redis+sentinel://127.0.0.1:26379", "names its master"),
        ("redis+cluster://127.0.0.1:7000/1", "no path"),
        ("redis+cluster://127.0.0.1:70000", "bad port"),
    ] {
        assert_issue(&redis(url, ""), "store.url", reason);
    }
    // A hash tag in the prefix would put every record in one slot of the cluster.
    assert_issue(&redis("redis+cluster://127.0.0.1:7000", "key_prefix = \"{idem}\""), "store.key_prefix", "one shard");
    assert_issue(&redis("redis+sentinel://s:1/m", "ca_file = \"/etc/hostname\""), "store.ca_file", "TLS URLs only");
    let text = MINIMAL.replace("backend = \"memory\"", "backend = \"etcd\"");
    assert_issue(&text, "store.backend", "neither \"redis\" nor \"memory\"");
}

#[test]
fn route_tables_that_cannot_work_are_rejected() {
    let second = |extra: &str| format!("{MINIMAL}\n[[routes]]\n{extra}\nupstream = \"app\"\n");
    assert_issue(&second("name = \"create\"\npath = \"/x\""), "routes[1].name", "used by an earlier route");
    assert_issue(
        &second("name = \"dup\"\nmethods = [\"POST\"]\npath = \"/orders\""),
        "routes[1].path",
        "both match POST /orders",
    );
    let conflict = format!(
        "{MINIMAL}\n[[routes]]\nname = \"a\"\npath = \"/o/{{id}}\"\nupstream = \"app\"\n[[routes]]\nname = \"b\"\npath = \"/o/{{oid}}\"\nupstream = \"app\"\n"
    );
    assert_issue(&conflict, "routes[2].path", "invalid path pattern");
    assert_issue(&second("name = \"rel\"\npath = \"orders\""), "routes[1].path", "must start with '/'");
    let no_routes = MINIMAL.split("[[routes]]").next().unwrap();
    assert_issue(no_routes, "routes", "no [[routes]]");
    assert_issue(&MINIMAL.replace("methods = [\"POST\"]", "methods = []"), "routes[0].methods", "is empty");
}

#[test]
fn hosts_are_checked_and_each_mistake_explained() {
    let hosts = |list: &str| MINIMAL.replace("methods = [\"POST\"]", &format!("hosts = {list}\nmethods = [\"POST\"]"));
    assert_issue(&hosts("[]"), "routes[0].hosts", "is empty; leave it out to serve every host");
    assert_issue(&hosts("[\"*\"]"), "routes[0].hosts", "every host: leave `hosts` out");
    assert_issue(&hosts("[\"api.example.com:443\"]"), "routes[0].hosts", "has a port");
    assert_issue(&hosts("[\"https://api.example.com\"]"), "routes[0].hosts", "is a URL");
    assert_issue(&hosts("[\"api.*.com\"]"), "routes[0].hosts", "a whole first label");
    assert_issue(&hosts("[\"*.com\"]"), "routes[0].hosts", "top-level domain");
    assert_issue(&hosts("[\"a b\"]"), "routes[0].hosts", "not a host name");
    assert_issue(&hosts("[\"API.example.com\", \"api.example.com.\"]"), "routes[0].hosts", "listed twice");
    // Two routes for one method and path overlap only on a host they share.
    let two = |a: &str, b: &str| {
        format!(
            "{}\n[[routes]]\nname = \"second\"\nhosts = {b}\nmethods = [\"POST\"]\npath = \"/orders\"\nupstream = \"app\"\n",
            hosts(a)
        )
    };
    assert!(Config::from_toml(&two("[\"a.example.com\"]", "[\"b.example.com\"]"), "t").is_ok());
    assert!(Config::from_toml(&two("[\"*.example.com\"]", "[\"a.example.com\"]"), "t").is_ok());
    assert_issue(&two("[\"a.example.com\"]", "[\"A.example.com\"]"), "routes[1].path", "on host a.example.com");
    // The record's identity: per host on several hosts or a wildcard, as before on one.
    let per_host = |list: &str| {
        let config = Config::from_toml(&hosts(list), "t").unwrap();
        config.routes[0].idempotency.as_ref().unwrap().identity.needs_host()
    };
    assert!(!per_host("[\"api.example.com\"]"));
    assert!(per_host("[\"api.example.com\", \"eu.example.com\"]"));
    assert!(per_host("[\"*.example.com\"]"));
    let config = Config::from_toml(MINIMAL, "t").unwrap();
    assert!(!config.routes[0].idempotency.as_ref().unwrap().identity.needs_host());
}

#[test]
fn instance_urls_and_ejection_are_checked_and_each_mistake_explained() {
    let with = |lines: &str| MINIMAL.replace("url = \"http://127.0.0.1:3000\"", lines);
    let config = Config::from_toml(&with("urls = [\"http://10.0.0.5:3000\", \"http://10.0.0.6:3000/\"]"), "t").unwrap();
    assert_eq!(config.upstreams[0].urls.len(), 2);
    let ejection = config.upstreams[0].ejection;
    assert_eq!((ejection.after, ejection.after_broken, ejection.after_gateway_errors), (3, 5, 5));
    let off = "url = \"http://a:1\"\neject_after_broken = 0\neject_after_gateway_errors = 1000";
    let ejection = Config::from_toml(&with(off), "t").unwrap().upstreams[0].ejection;
    assert_eq!((ejection.after_broken, ejection.after_gateway_errors), (0, 1000));
    assert_issue(&with("urls = []"), "upstreams.app.urls", "is empty");
    assert_issue(
        &with("url = \"http://a:1\"\nurls = [\"http://b:1\"]"),
        "upstreams.app.urls",
        "give url (one instance) or urls (several), not both",
    );
    assert_issue(&with(""), "upstreams.app.url", "is required (or urls, for several instances)");
    assert_issue(&with("urls = [\"http://a:1\", \"https://b:1\"]"), "upstreams.app.urls", "one scheme");
    assert_issue(&with("urls = [\"http://a:1/v1\", \"http://b:1/v2\"]"), "upstreams.app.urls", "same path prefix");
    assert_issue(&with("urls = [\"http://a:1\", \"http://a:1\"]"), "upstreams.app.urls", "listed twice");
    assert_issue(
        &with("urls = [\"http://a:80\", \"http://A\"]"),
        "upstreams.app.urls",
        "listed twice (as http://a:80/)",
    );
    assert_issue(&with("urls = [\"https://a\", \"https://a:443/\"]"), "upstreams.app.urls", "listed twice");
    let url = "upstreams.app.url";
    assert_issue(&with("url = \"http://user:pw@a:1\""), url, "carries credentials");
    assert_issue(&with("url = \"http://a:0\""), url, "from 1 to 65535");
    assert_issue(&with("url = \"http://a:99999\""), url, "from 1 to 65535");
    assert_issue(&with("url = \"http://a:1/v1#top\""), url, "query or a fragment");
    assert_issue(&with("url = \"http://a:1/v1?x=1\""), url, "query or a fragment");
    assert_issue(&with("urls = [\"ftp://a:1\"]"), "upstreams.app.urls", "must start with http:// or https://");
    let many: Vec<String> = (0..65).map(|i| format!("\"http://10.0.0.{i}:3000\"")).collect();
    assert_issue(&with(&format!("urls = [{}]", many.join(", "))), "upstreams.app.urls", "at most 64");
    let url = "url = \"http://a:1\"";
    assert_issue(&with(&format!("{url}\neject_after = 0")), "upstreams.app.eject_after", "between 1 and 1000");
    assert_issue(&with(&format!("{url}\neject_for = \"1h\"")), "upstreams.app.eject_for", "at most");
    let broken = "upstreams.app.eject_after_broken";
    assert_issue(
        &with(&format!("{url}\neject_after_broken = 1001")),
        broken,
        "between 1 and 1000 broken exchanges, or 0",
    );
    let gateway = "upstreams.app.eject_after_gateway_errors";
    assert_issue(
        &with(&format!("{url}\neject_after_gateway_errors = 5000")),
        gateway,
        "502, 503 or 504, or 0 for never",
    );
}

#[test]
fn resolve_every_needs_one_url_on_a_name_and_a_sane_interval() {
    let with = |lines: &str| MINIMAL.replace("url = \"http://127.0.0.1:3000\"", lines);
    let config =
        Config::from_toml(&with("url = \"http://orders.internal:3000\"\nresolve_every = \"10s\""), "t").unwrap();
    assert_eq!(config.upstreams[0].resolve_every, Some(std::time::Duration::from_secs(10)));
    assert_eq!(Config::from_toml(MINIMAL, "t").unwrap().upstreams[0].resolve_every, None);
    let field = "upstreams.app.resolve_every";
    assert_issue(
        &with("urls = [\"http://a:1\", \"http://b:1\"]\nresolve_every = \"10s\""),
        field,
        "with urls, each instance is listed instead",
    );
    assert_issue(&with("url = \"http://10.0.0.5:3000\"\nresolve_every = \"10s\""), field, "10.0.0.5 is an address");
    assert_issue(&with("url = \"https://[::1]:3000\"\nresolve_every = \"10s\""), field, "is an address");
    assert_issue(&with("url = \"http://orders:3000\"\nresolve_every = \"100ms\""), field, "between 1s and 3600s");
    assert_issue(&with("url = \"http://orders:3000\"\nresolve_every = \"2h\""), field, "between 1s and 3600s");
    assert_issue(&with("url = \"http://orders:3000\"\nresolve_every = \"often\""), field, "");
}

#[test]
fn upstream_urls_and_ca_files_are_checked() {
    let with = |url: &str| MINIMAL.replace("url = \"http://127.0.0.1:3000\"", &format!("url = \"{url}\""));
    assert_issue(&with("http://127.0.0.1:3000/?x=1"), "upstreams.app.url", "must not have a query");
    assert_issue(&with("127.0.0.1:3000"), "upstreams.app.url", "http:// or https://");
    let ca = MINIMAL.replace(
        "url = \"http://127.0.0.1:3000\"",
        "url = \"https://api.internal\"\nca_file = \"/nonexistent/ca.pem\"",
    );
    assert_issue(&ca, "upstreams.app.ca_file", "cannot read /nonexistent/ca.pem");
    let plain_ca = MINIMAL.replace("url = \"http://127.0.0.1:3000\"", "url = \"http://x\"\nca_file = \"/etc/hosts\"");
    assert_issue(&plain_ca, "upstreams.app.ca_file", "https:// upstreams only");
}

fn check(config_text: &str) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, config_text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_idemgate")).args(["check", "--config"]).arg(&path).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `idemgate check --config FILE` allowed `nofile` descriptors: (success, stdout, stderr).
fn check_limited(path: &std::path::Path, nofile: u64) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idemgate"));
    command.args(["check", "--config"]).arg(path);
    crate::support::gateway_proc::limit_nofile(&mut command, nofile);
    let out = command.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The shipped files leave the caps to their defaults, which are fitted to the descriptor
/// limit (20,000 here, where they would need 20,130): `check` does not warn about them. A cap
/// the file sets and the limit cannot hold is warned about, on its line.
#[test]
fn check_warns_about_descriptors_only_for_caps_the_file_sets() {
    let hard = std::process::Command::new("sh").args(["-c", "ulimit -Hn"]).output().unwrap();
    let hard = String::from_utf8_lossy(&hard.stdout).trim().parse::<u64>().unwrap_or(20_000).min(20_000);
    for file in ["gateway.toml", "deploy/compose/gateway.toml"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let (ok, _, stderr) = check_limited(&path, hard);
        assert!(ok && !stderr.contains("descriptors"), "{file} under {hard} descriptors: {stderr}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(
        &path,
        MINIMAL.replace("listen = \"127.0.0.1:8080\"", "listen = \"127.0.0.1:8080\"\nmax_connections = 10000"),
    )
    .unwrap();
    let (ok, _, stderr) = check_limited(&path, 512);
    assert!(ok, "a warning, not an error: {stderr}");
    let warning = format!("{}:4: warning: server.max_connections: max_connections = 10000 need about", path.display());
    assert!(stderr.contains(&warning) && stderr.contains("this process may open 512"), "{stderr}");
}

/// Files with two to six problems of every kind mixed: `check` names every one, each on its
/// line, in one run.
#[test]
fn check_finds_every_problem_of_a_file_in_one_run() {
    let cases: [(&str, &[(&str, &str)]); 5] = [
        // The issue's own file: a misspelt key, two bad durations and an unknown upstream.
        (
            "[routes.idempotency]\nleas = \"5s\"\nlease = \"ten\"\nwait = \"soon\"",
            &[
                ("routes[0].idempotency.leas", "unknown key"),
                ("routes[0].idempotency.lease", "expected a duration such as 5s or 250ms"),
                ("routes[0].idempotency.wait", "expected a duration such as 5s or 250ms"),
            ],
        ),
        (
            "[routes.idempotency]\nmax_key_len = \"long\"\nretention = 5\nscope = \"everyone\"\nreplay_header = \"bad header\"",
            &[
                ("routes[0].idempotency.max_key_len", "expected a whole number such as 1, not the string \"long\""),
                ("routes[0].idempotency.retention", "not the number 5"),
                ("routes[0].idempotency.scope", "none of"),
                ("routes[0].idempotency.replay_header", ""),
            ],
        ),
        (
            "[routes.idempotency]\nstore_statuses = [\"2xx\", \"9xx\"]\nmax_stored_body = \"huge\"",
            &[
                ("routes[0].idempotency.store_statuses", ""),
                ("routes[0].idempotency.max_stored_body", "expected a size such as 64KiB or 1MiB"),
            ],
        ),
        (
            "[routes.idempotency]\non_store_error = \"maybe\"\nignore = [\"no-slash\"]\n\
             [routes.idempotency.reconcile]\nafter = \"soon\"\nanswer_status = 42",
            &[
                ("routes[0].idempotency.on_store_error", "neither"),
                ("routes[0].idempotency.ignore", "JSON Pointer"),
                ("routes[0].idempotency.reconcile.answer_status", "between 200 and 599"),
                ("routes[0].idempotency.reconcile.path", "is required"),
                ("routes[0].idempotency.reconcile.after", "neither a duration"),
            ],
        ),
        (
            "[routes.idempotency]\nlease = \"1ms\"",
            &[("routes[0].idempotency.lease", "at least 10ms"), ("routes[0].upstream", "not defined")],
        ),
    ];
    for (policy, expected) in cases {
        let mut text = MINIMAL.replace("[routes.idempotency]", policy);
        if expected.iter().any(|(key, _)| *key == "routes[0].upstream") {
            text = text.replace("upstream = \"app\"", "upstream = \"nowhere\"");
        }
        let issues = match Config::from_toml(&text, "gw.toml") {
            Err(ConfigError::Invalid { issues, .. }) => issues,
            other => panic!("{policy}: {other:?}"),
        };
        for (key, reason) in expected {
            assert!(
                issues.iter().any(|i| i.key == *key && i.reason.contains(reason) && i.line.is_some()),
                "{policy}: no {key} ({reason}) in {issues:#?}"
            );
        }
        assert_eq!(issues.len(), expected.len(), "{policy}: {issues:#?}");
    }
    // The command prints every one, each as FILE:LINE: KEY: REASON.
    let (ok, _, stderr) = check(
        &MINIMAL
            .replace("[routes.idempotency]", "[routes.idempotency]\nleas = \"5s\"\nlease = \"ten\"\nwait = \"soon\"")
            .replace("upstream = \"app\"", "upstream = \"nowhere\""),
    );
    assert!(!ok);
    for line in [
        "gw.toml:15: routes[0] (\"create\").upstream: \"nowhere\" is not defined under [upstreams]",
        "gw.toml:18: routes[0] (\"create\").idempotency.leas: unknown key",
        "gw.toml:19: routes[0] (\"create\").idempotency.lease: \"ten\" is not a duration",
        "gw.toml:20: routes[0] (\"create\").idempotency.wait: \"soon\" is not a duration",
    ] {
        assert!(stderr.contains(line), "missing {line:?} in\n{stderr}");
    }
}

/// A value of the wrong type is named in the file's words, never in Rust's (`usize`,
/// `a sequence`): the operator wrote TOML.
#[test]
fn check_names_wrong_types_in_the_file_s_words() {
    let text = MINIMAL
        .replace("backend = \"memory\"", "backend = \"memory\"\nconnections = \"one\"")
        .replace("listen = \"127.0.0.1:8080\"", "listen = \"127.0.0.1:8080\"\nmax_connections = -5")
        .replace("methods = [\"POST\"]", "methods = \"POST\"")
        .replace("[routes.idempotency]", "[routes.idempotency]\nrenew = \"yes\"");
    let (ok, _, stderr) = check(&text);
    assert!(!ok, "{stderr}");
    for line in [
        "store.connections: expected a whole number such as 1, not the string \"one\"",
        "server.max_connections: the number -5 is out of range: expected a whole number such as 1",
        "routes[0] (\"create\").methods: expected a list such as [\"a\", \"b\"], not the string \"POST\"",
        "routes[0] (\"create\").idempotency.renew: expected true or false, not the string \"yes\"",
    ] {
        assert!(stderr.contains(line), "missing {line:?} in\n{stderr}");
    }
    for rust in ["usize", "u64", "u32", "invalid type", "a sequence", "a boolean"] {
        assert!(!stderr.contains(rust), "{rust:?} in\n{stderr}");
    }
}

#[test]
fn check_warns_about_a_grace_period_longer_than_a_lease() {
    let text = MINIMAL
        .replace("listen = \"127.0.0.1:8080\"", "listen = \"127.0.0.1:8080\"\nshutdown_grace = \"20s\"")
        .replace("[routes.idempotency]", "[routes.idempotency]\nlease = \"10s\"");
    let (ok, _, stderr) = check(&text);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains(
            "warning: server.shutdown_grace: 20s is longer than routes[0] (\"create\").idempotency.lease (10s)"
        ),
        "{stderr}"
    );
}

#[test]
fn check_command_accepts_a_valid_file() {
    let (ok, stdout, stderr) = check(MINIMAL);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("ok"), "{stdout}");
}

#[test]
fn check_command_rejects_an_invalid_file_naming_file_key_and_reason() {
    let (ok, _stdout, stderr) =
        check(&MINIMAL.replace("[routes.idempotency]", "[routes.idempotency]\nwait = \"soon\""));
    assert!(!ok);
    assert!(
        stderr.contains("gw.toml")
            && stderr.contains("routes[0] (\"create\").idempotency.wait")
            && stderr.contains("expected a duration such as 5s or 250ms"),
        "{stderr}"
    );

    let (ok, _stdout, stderr) = check(
        &MINIMAL
            .replace("scope = ", "x = ")
            .replace("[routes.idempotency]", "[routes.idempotency]\nscope = \"everyone\""),
    );
    assert!(!ok);
    assert!(stderr.contains("routes[0] (\"create\").idempotency.scope"), "{stderr}");
}

#[test]
fn check_warns_about_leases_that_undermine_the_guarantee_but_accepts_them() {
    let text = MINIMAL
        .replace("[routes.idempotency]", "[routes.idempotency]\nlease = \"2s\"\nrenew = false")
        .replace("backend = \"memory\"", "backend = \"memory\"\ntimeout = \"1s\"");
    let (ok, stdout, stderr) = check(&text);
    assert!(ok, "warnings do not fail the check: {stderr}");
    assert!(stdout.contains("ok"), "{stdout}");
    assert!(
        stderr.contains("gw.toml:19: warning: routes[0] (\"create\").idempotency.lease: 2s is shorter than upstreams.app.timeout (30s) and renew = false"),
        "{stderr}"
    );
    assert!(stderr.contains("is less than 3 × store.timeout (1s)"), "{stderr}");
    // The minimal file holds unknown outcomes without a lookup: that, and nothing else (the
    // default caps are fitted to any descriptor limit, without a warning).
    let (ok, _, stderr) = check(MINIMAL);
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("warning")).collect();
    assert!(ok && warnings.len() == 1, "{stderr}");
    assert!(
        warnings[0].contains(
            "routes[0] (\"create\").idempotency: holds unknown outcomes without [routes.idempotency.reconcile]"
        )
    );
}

#[test]
fn check_warns_when_a_connect_may_take_the_whole_timeout() {
    // timeout below the default connect_timeout (5s): the table's line; equal to a
    // connect_timeout set: its own line.
    for (lines, line, said) in [
        ("timeout = \"1s\"", 8, "5s is not shorter than timeout (1s)"),
        ("timeout = \"2s\"\nconnect_timeout = \"2s\"", 11, "2s is not shorter than timeout (2s)"),
    ] {
        let text =
            MINIMAL.replace("url = \"http://127.0.0.1:3000\"", &format!("url = \"http://127.0.0.1:3000\"\n{lines}"));
        let (ok, _, stderr) = check(&text);
        assert!(ok, "warnings do not fail the check: {stderr}");
        let want = format!("gw.toml:{line}: warning: upstreams.app.connect_timeout: {said}: a connect that hangs");
        assert!(stderr.contains(&want), "no {want:?} in {stderr}");
    }
    // Shorter: no such warning.
    let text = MINIMAL.replace("url = \"http://127.0.0.1:3000\"", "url = \"http://127.0.0.1:3000\"\ntimeout = \"6s\"");
    let (_, _, stderr) = check(&text);
    assert!(!stderr.contains("connect_timeout"), "{stderr}");
}

#[test]
fn the_admin_token_may_come_from_the_environment_and_a_public_admin_listener_is_warned_about() {
    let with =
        |lines: &str| MINIMAL.replace("listen = \"127.0.0.1:8080\"", &format!("listen = \"127.0.0.1:8080\"\n{lines}"));
    // A variable name no other test uses; the child process gets it, this one never sets it.
    let var = "IDEMGATE_TEST_ADMIN_TOKEN_7361";
    let text = with(&format!("admin_token_env = \"{var}\""));
    assert_issue(&text, "server.admin_token_env", "is not set");
    let out = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["check", "--config", "/dev/stdin"])
        .env(var, "a-token-from-the-environment")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(text.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_issue(
        &with("admin_token = \"x-0123456789abcdef\"\nadmin_token_env = \"X\""),
        "server.admin_token_env",
        "not both",
    );

    let (ok, _, stderr) = check(&with("admin_listen = \"0.0.0.0:9090\""));
    assert!(ok, "{stderr}");
    assert!(stderr.contains("warning: server.admin_listen: 0.0.0.0:9090 is not a loopback address"), "{stderr}");
    assert!(!stderr.contains("server.admin_tls"), "no token, nothing crosses in clear: {stderr}");
    let (ok, _, stderr) =
        check(&with("admin_listen = \"0.0.0.0:9090\"\nadmin_token = \"a-random-token-of-our-own-0123\""));
    assert!(ok, "{stderr}");
    assert!(stderr.contains("warning: server.admin_tls: is not set while the admin listener"), "{stderr}");
    assert_issue(
        &with("[server.admin_tls]\ncert = \"/nonexistent/c.pem\"\nkey = \"/nonexistent/k.pem\""),
        "server.admin_tls",
        "there is no admin listener",
    );
}

/// docs/security.md, "an admin token no client can send, or everyone knows": `check` refuses
/// a token with a character outside visible ASCII (never printing it), counts characters, and
/// warns about the sample token of `gateway.toml`.
#[test]
fn an_admin_token_is_visible_ascii_and_never_the_sample() {
    let with =
        |lines: &str| MINIMAL.replace("listen = \"127.0.0.1:8080\"", &format!("listen = \"127.0.0.1:8080\"\n{lines}"));
    for (token, at) in [("éééééééééééééééé", 1), ("0123456789 abcdefgh", 11), ("0123456789abcdef\\u0007", 17)]
    {
        let text = with(&format!("admin_token = \"{token}\""));
        let (ok, _, stderr) = check(&text);
        assert!(!ok, "{token:?}: {stderr}");
        assert!(
            stderr.contains(&format!("server.admin_token: character {at} of the token is not visible ASCII")),
            "{stderr}"
        );
        assert!(!stderr.contains(token.trim()), "the token is never printed: {stderr}");
    }
    // Eight two-byte characters are 16 bytes, not 16 characters: refused for what they are.
    let (ok, _, stderr) = check(&with("admin_token = \"ÿÿÿÿÿÿÿÿ\""));
    assert!(!ok && stderr.contains("not visible ASCII"), "{stderr}");

    let sample = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.toml")).unwrap();
    let line = sample.lines().find(|l| l.contains("admin_token = ")).expect("gateway.toml shows an admin_token");
    let (ok, _, stderr) = check(&with(line.trim_start_matches('#').trim()));
    assert!(ok, "{stderr}");
    assert!(stderr.contains("warning: server.admin_token: is the sample value from gateway.toml"), "{stderr}");
    let (ok, _, stderr) = check(&with("admin_token = \"a-random-token-of-our-own-0123\""));
    assert!(ok && !stderr.contains("server.admin_token"), "{stderr}");
}

#[test]
fn check_command_reports_a_missing_file() {
    let out = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["check", "--config", "/nonexistent/gateway.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/gateway.toml: cannot read"));
}

#[test]
fn mode_is_enforce_or_observe_and_observing_without_an_admin_listener_is_warned_about() {
    let config = Config::from_toml(MINIMAL, "t").unwrap();
    assert_eq!(config.routes[0].idempotency.as_ref().unwrap().mode, idemgate::policy::Mode::Enforce);
    let observing = MINIMAL.replace("[routes.idempotency]", "[routes.idempotency]\nmode = \"observe\"");
    let config = Config::from_toml(&observing, "t").unwrap();
    assert_eq!(config.routes[0].idempotency.as_ref().unwrap().mode, idemgate::policy::Mode::Observe);
    for bad in ["\"Observe\"", "\"shadow\"", "\"\"", "true", "1"] {
        let text = MINIMAL.replace("[routes.idempotency]", &format!("[routes.idempotency]\nmode = {bad}"));
        let issues = issues_of(&text);
        assert!(issues.iter().any(|(k, _)| k == "routes[0].idempotency.mode"), "mode = {bad}: {issues:#?}");
    }
    assert_issue(
        &MINIMAL.replace("[routes.idempotency]", "[routes.idempotency]\nmode = \"shadow\""),
        "routes[0].idempotency.mode",
        "\"shadow\" is neither \"enforce\" nor \"observe\"",
    );
    let (ok, _, stderr) = check(&observing);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("warning: routes[0] (\"create\").idempotency.mode: \"observe\" counts what enforcing would do"),
        "{stderr}"
    );
    let with_admin = observing
        .replace("listen = \"127.0.0.1:8080\"", "listen = \"127.0.0.1:8080\"\nadmin_listen = \"127.0.0.1:9090\"");
    let (ok, _, stderr) = check(&with_admin);
    assert!(ok && !stderr.contains("idempotency.mode"), "{stderr}");
}

/// `[routes.idempotency.identity]`: a pin names what a route's records were made under, and
/// never lets two tenants or two routes share records.
#[test]
fn identity_pins_are_checked_and_never_merge_tenants() {
    let route = |hosts: &str, identity: &str| {
        MINIMAL.replace("path = \"/orders\"", &format!("hosts = {hosts}\npath = \"/orders\""))
            + "[routes.idempotency.identity]\n"
            + identity
    };
    let two = "[\"t1.example.com\", \"t2.example.com\"]";
    assert!(Config::from_toml(&route(two, "host = \"t1.example.com\""), "t").is_ok());
    assert!(Config::from_toml(&route("[\"*.example.com\"]", "host = \"T1.example.com.\""), "t").is_ok());
    assert!(Config::from_toml(&route("[\"t1.example.com\"]", "per_host = true\nname = \"orders\""), "t").is_ok());
    assert_issue(&route(two, "host = \"t3.example.com\""), "routes[0].idempotency.identity.host", "not a host");
    assert_issue(&route(two, "host = \"*.example.com\""), "routes[0].idempotency.identity.host", "exact host");
    assert_issue(&route(two, "per_host = false"), "routes[0].idempotency.identity.per_host", "share records");
    assert_issue(
        &route(two, "per_host = false\nhost = \"t1.example.com\""),
        "routes[0].idempotency.identity.per_host",
        "contradicts",
    );
    assert_issue(&route(two, "name = \"bad name\""), "routes[0].idempotency.identity.name", "A-Z a-z");
    assert_issue(
        &route(two, "[routes.idempotency.identity.previous_fingerprint]\nignore = []"),
        "routes[0].idempotency.identity.previous_fingerprint",
        "the route's own",
    );
    assert_issue(
        &route(two, "[routes.idempotency.identity.previous_fingerprint]\nignore = [\"ts\"]"),
        "routes[0].idempotency.identity.previous_fingerprint.ignore",
        "",
    );
    assert_issue(&route(two, "colour = \"red\""), "routes[0].idempotency.identity.colour", "");
    // Two routes never share an identity: a pin onto another route's name is refused.
    let twins = MINIMAL.to_owned()
        + "[[routes]]\nname = \"create-v2\"\nmethods = [\"PUT\"]\npath = \"/orders\"\nupstream = \"app\"\n\
           [routes.idempotency]\n[routes.idempotency.identity]\nname = \"create\"\n";
    assert_issue(&twins, "routes[1].idempotency.identity.name", "already names the records of route \"create\"");
}

/// `check --running OLD --config NEW`: per route, what the change does to records in
/// retention; exit 1 when a reload would refuse it, with the pin that keeps them.
#[test]
fn check_compares_the_running_file_with_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let one =
        write("one.toml", &MINIMAL.replace("path = \"/orders\"", "hosts = [\"t1.example.com\"]\npath = \"/orders\""));
    let two_hosts =
        MINIMAL.replace("path = \"/orders\"", "hosts = [\"t1.example.com\", \"t2.example.com\"]\npath = \"/orders\"");
    let unpinned = write("unpinned.toml", &two_hosts);
    let pinned = write("pinned.toml", &(two_hosts + "[routes.idempotency.identity]\nhost = \"t1.example.com\"\n"));
    let check = |next: &std::path::Path, json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_idemgate"));
        cmd.arg("check").arg("--config").arg(next).arg("--running").arg(&one);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (code, text) = check(&unpinned, false);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("route \"create\": hosts: refused:") && text.contains("host = \"t1.example.com\""), "{text}");
    let (code, text) = check(&unpinned, true);
    assert_eq!(code, Some(1));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["safe"], false);
    assert_eq!(json["findings"][0]["setting"], "hosts");
    assert_eq!(json["findings"][0]["verdict"], "refused");
    let (code, text) = check(&pinned, false);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("hosts: kept:") && text.contains("ok: records in retention keep their names"), "{text}");
    // --json needs --running.
    let out = Command::new(env!("CARGO_BIN_EXE_idemgate")).args(["check", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Appends a `[[routes]]` table to `text`, with `lines` in it, on upstream `app`.
fn and_route(text: &str, lines: &str) -> String {
    format!("{text}\n[[routes]]\nupstream = \"app\"\n{lines}\n")
}

/// The warnings of a valid file that say a request can reach a route that does not enforce.
fn unprotected(text: &str) -> Vec<(String, String)> {
    let config = Config::from_toml(text, "t").unwrap_or_else(|e| panic!("{e}"));
    config.warnings.into_iter().filter(|w| w.reason.contains("does not enforce")).map(|w| (w.key, w.reason)).collect()
}

/// The issue's case, tried as a new user would: `hosts = ["api.example.com"]` on the keyed
/// `POST /orders` and a catch-all pass-through route. A POST with any other Host (curl's
/// `127.0.0.1:PORT`) goes to the catch-all, unprotected; `check` said ok. It still says ok,
/// with a warning naming both routes, what falls through and what to do.
#[test]
fn check_names_what_a_host_split_leaves_unprotected() {
    let keyed = MINIMAL.replace("methods = [\"POST\"]", "hosts = [\"api.example.com\"]\nmethods = [\"POST\"]");
    let split = and_route(&keyed, "name = \"rest\"\npath = \"/{*rest}\"");
    let (ok, stdout, stderr) = check(&split);
    assert!(ok && stdout.contains("ok"), "a warning, not an error: {stderr}");
    let line = stderr.lines().find(|l| l.contains("does not enforce")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("gw.toml:") && line.contains("warning: routes[0] (\"create\").hosts: "), "{line}");
    for part in [
        "route \"create\" enforces idempotency on POST /orders for api.example.com only",
        "POST /orders for any host no route names goes to route \"rest\", which does not enforce it",
        "leave hosts out of route \"create\" (or list in it every host clients send)",
        "[routes.idempotency] table",
    ] {
        assert!(line.contains(part), "{part:?} in {line}");
    }
    // A host another route names falls through too, and is named.
    let admin_get =
        and_route(&split, "name = \"admin\"\nhosts = [\"admin.example.com\"]\nmethods = [\"GET\"]\npath = \"/\"");
    let found = unprotected(&admin_get);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].1.contains("POST /orders for admin.example.com and any host no route names"), "{found:#?}");
    // A route of another host set that takes the path, and one of a wildcard's names.
    let other_host = and_route(&keyed, "name = \"other\"\nhosts = [\"admin.example.com\"]\npath = \"/orders\"");
    let found = unprotected(&other_host);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].1.contains("for admin.example.com goes to route \"other\""), "{found:#?}");
    assert!(found[0].1.contains("add those hosts to route \"create\""), "{found:#?}");
    let wild = MINIMAL.replace("methods = [\"POST\"]", "hosts = [\"*.example.com\"]\nmethods = [\"POST\"]");
    let carved = and_route(&wild, "name = \"one-tenant\"\nhosts = [\"a.example.com\"]\npath = \"/{*rest}\"");
    let found = unprotected(&carved);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].1.contains("POST /orders for a.example.com goes to route \"one-tenant\""), "{found:#?}");
    // A keyed route for every host, whose path one host's pass-through route takes over.
    let taken = and_route(MINIMAL, "name = \"tenant\"\nhosts = [\"t.example.com\"]\npath = \"/{*rest}\"");
    let found = unprotected(&taken);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].0, "routes[1].hosts", "{found:#?}");
    assert!(found[0].1.contains("route \"create\" enforces idempotency on POST /orders, but"), "{found:#?}");
    // The paths overlap as the router matches them, not as strings compare.
    let id = keyed.replace("path = \"/orders\"", "path = \"/orders/{id}\"");
    assert_eq!(unprotected(&and_route(&id, "name = \"tail\"\npath = \"/orders/{*rest}\"")).len(), 1);
    assert!(unprotected(&and_route(&id, "name = \"elsewhere\"\npath = \"/payments/{*rest}\"")).is_empty());
}

/// What leaves nothing unprotected is not warned about: the keyed route alone serving
/// `POST /orders` beside a catch-all, another host's or path's route that only reads, and a
/// route that observes (the adoption path: `idemgate report` counts what it would change).
#[test]
fn check_does_not_warn_where_every_unsafe_request_reaches_enforcement() {
    let rest = "name = \"rest\"\npath = \"/{*rest}\"";
    assert!(unprotected(MINIMAL).is_empty());
    assert!(unprotected(&and_route(MINIMAL, rest)).is_empty(), "PUT /orders to a catch-all is not listed anywhere");
    let keyed = MINIMAL.replace("methods = [\"POST\"]", "hosts = [\"api.example.com\"]\nmethods = [\"POST\"]");
    let reads = and_route(&keyed, "name = \"list\"\nmethods = [\"GET\", \"HEAD\"]\npath = \"/{*rest}\"");
    assert!(unprotected(&reads).is_empty());
    let both = and_route(&keyed, "name = \"rest\"\nmethods = [\"GET\"]\npath = \"/orders\"");
    assert!(unprotected(&both).is_empty());
    let observing = keyed.replace("[routes.idempotency]", "[routes.idempotency]\nmode = \"observe\"");
    assert!(unprotected(&and_route(&observing, rest)).is_empty(), "the keyed route observes");
    let observed_rest = and_route(&keyed, &format!("{rest}\n[routes.idempotency]\nmode = \"observe\""));
    assert!(unprotected(&observed_rest).is_empty(), "the other route observes");
    let enforced_rest = and_route(&keyed, &format!("{rest}\n[routes.idempotency]"));
    assert!(unprotected(&enforced_rest).is_empty(), "the other route enforces");
    let every_host =
        and_route(MINIMAL, "name = \"tenant\"\nhosts = [\"t.example.com\"]\nmethods = [\"GET\"]\npath = \"/{*rest}\"");
    assert!(unprotected(&every_host).is_empty());
}

/// Another unsafe method on the keyed path, listed by a route that does not enforce: a
/// retried `PUT /orders` runs again while `POST /orders` is keyed. A route that lists only
/// safe methods, or a catch-all that lists none, is not warned about.
#[test]
fn check_names_an_unsafe_method_another_route_lists_on_a_keyed_path() {
    let put = and_route(MINIMAL, "name = \"replace\"\nmethods = [\"PUT\", \"GET\"]\npath = \"/orders\"");
    let found = unprotected(&put);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].0, "routes[1].methods");
    for part in [
        "PUT /orders goes to route \"replace\", which lists PUT and does not enforce idempotency",
        "route \"create\" enforces it on POST /orders",
    ] {
        assert!(found[0].1.contains(part), "{part:?} in {found:#?}");
    }
    // On a keyed route for one host, the methods of that host are the ones named.
    let keyed = MINIMAL.replace("methods = [\"POST\"]", "hosts = [\"api.example.com\"]\nmethods = [\"POST\"]");
    let wide = and_route(&keyed, "name = \"writes\"\nmethods = [\"PATCH\", \"DELETE\"]\npath = \"/{*rest}\"");
    let found = unprotected(&wide);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].1.contains("PATCH and DELETE /orders on api.example.com go to route \"writes\""), "{found:#?}");
}

#[test]
fn replica_acks_and_their_timeout_refuse_what_cannot_be_meant() {
    let redis = |lines: &str| {
        MINIMAL.replace(
            "backend = \"memory\"",
            &format!("backend = \"redis\"\nurl = \"redis+sentinel://127.0.0.1:26379/m\"\n{lines}"),
        )
    };
    assert_issue(&redis("replica_acks = 17"), "store.replica_acks", "between 0 and 16");
    assert_issue(&redis("replica_acks = 4294967296"), "store.replica_acks", "");
    assert_issue(&redis("replica_acks = -1"), "store.replica_acks", "");
    assert_issue(&redis("replica_acks = \"1\""), "store.replica_acks", "");
    assert_issue(
        &redis("replica_acks = 1\nreplica_ack_timeout = \"0s\""),
        "store.replica_ack_timeout",
        "longer than 0",
    );
    assert_issue(
        &redis("replica_acks = 1\nreplica_ack_timeout = \"500us\""),
        "store.replica_ack_timeout",
        "at least 1ms",
    );
    assert_issue(&redis("replica_ack_timeout = \"soon\""), "store.replica_ack_timeout", "");
    // The memory store has no replicas to wait for.
    let memory =
        MINIMAL.replace("backend = \"memory\"", "backend = \"memory\"\nreplica_acks = 1\nreplica_ack_timeout = \"1s\"");
    assert_issue(&memory, "store.replica_acks", "redis backend only");
    assert_issue(&memory, "store.replica_ack_timeout", "redis backend only");

    let warned = |text: &str| -> Vec<(String, String)> {
        let config = Config::from_toml(text, "test.toml").unwrap_or_else(|e| panic!("{e}"));
        config.warnings.into_iter().map(|w| (w.key, w.reason)).collect()
    };
    let idle = warned(&redis("replica_ack_timeout = \"2s\""));
    assert!(idle.iter().any(|(k, r)| k == "store.replica_ack_timeout" && r.contains("no effect")), "{idle:?}");
    // A wait for replicas the lease may not outlast (lease 3s: 2s + 1s is over two thirds).
    let long = warned(
        &redis("replica_acks = 1\nreplica_ack_timeout = \"2s\"")
            .replace("[routes.idempotency]", "[routes.idempotency]\nlease = \"3s\""),
    );
    assert!(
        long.iter().any(|(k, r)| k == "routes[0].idempotency.lease" && r.contains("replica_ack_timeout")),
        "{long:?}"
    );
    let sound = warned(&redis("replica_acks = 1"));
    assert!(!sound.iter().any(|(k, _)| k.starts_with("store.replica")), "{sound:?}");
    // One server: only a failover behind its address promotes a replica.
    let single = warned(
        &MINIMAL
            .replace("backend = \"memory\"", "backend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nreplica_acks = 1"),
    );
    assert!(single.iter().any(|(k, r)| k == "store.replica_acks" && r.contains("one server")), "{single:?}");
}

/// `[[server.admin_tokens]]`: each token named once, its secret from the environment or a
/// file (never the configuration), under the same rules as `admin_token`, and no secret
/// shared by two names (the audit trail names who acted by their token).
#[test]
fn named_admin_tokens_are_checked_each_and_against_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "a-token-from-a-file-0123\n").unwrap();
    let token = |name: &str, role: &str, source: &str| {
        format!("\n[[server.admin_tokens]]\nname = \"{name}\"\nrole = \"{role}\"\n{source}\n")
    };
    let with = |tokens: &str| {
        format!("{}{tokens}", MINIMAL.replace("[store]", "admin_token = \"legacy-token-0123456789\"\n\n[store]"))
    };
    let env = |name: &str| match name {
        "ALICE" => Some("alice-token-0123456789".to_owned()),
        "SHORT" => Some("short".to_owned()),
        "SAME" => Some("legacy-token-0123456789".to_owned()),
        _ => None,
    };
    let issues = |text: &str| match Config::from_toml_with_env(text, "test.toml", &env) {
        Err(ConfigError::Invalid { issues, .. }) => issues.into_iter().map(|i| (i.key, i.reason)).collect::<Vec<_>>(),
        other => panic!("expected validation issues, got {other:?}"),
    };
    let file_source = format!("token_file = \"{}\"", file.display());
    let good = with(&(token("alice", "operate", "token_env = \"ALICE\"") + &token("viewer", "read", &file_source)));
    let config = Config::from_toml_with_env(&good, "test.toml", &env).unwrap_or_else(|e| panic!("{e}"));
    let named: Vec<(&str, &str)> =
        config.server.access.tokens.iter().map(|t| (t.name.as_str(), t.role.as_str())).collect();
    assert_eq!(named, [("admin", "operate"), ("alice", "operate"), ("viewer", "read")]);
    assert_eq!(config.server.access.tokens[2].secret, "a-token-from-a-file-0123", "trimmed");
    assert!(!format!("{config:?}").contains("alice-token"), "a token is never in a debug print");

    let cases = [
        (token("admin", "read", "token_env = \"ALICE\""), "server.admin_tokens[0].name", "taken by server.admin_token"),
        (token("a b", "read", "token_env = \"ALICE\""), "server.admin_tokens[0].name", "A-Z a-z 0-9 - _ ."),
        (
            token("bob", "write", "token_env = \"ALICE\""),
            "server.admin_tokens[0].role",
            "neither \"read\" nor \"operate\"",
        ),
        (token("bob", "read", ""), "server.admin_tokens[0]", "never written in the configuration"),
        (
            token("bob", "read", &format!("token_env = \"ALICE\"\n{file_source}")),
            "server.admin_tokens[0].token_file",
            "not both",
        ),
        (token("bob", "read", "token_env = \"NOPE\""), "server.admin_tokens[0].token_env", "\"NOPE\" is not set"),
        (
            token("bob", "read", "token_file = \"/nonexistent/token\""),
            "server.admin_tokens[0].token_file",
            "cannot read /nonexistent/token",
        ),
        (token("bob", "read", "token_env = \"SHORT\""), "server.admin_tokens[0].token_env", "at least 16"),
        (token("bob", "read", "token_env = \"SAME\""), "server.admin_tokens[0].token_env", "same token as \"admin\""),
        (
            token("bob", "read", "token_env = \"ALICE\"") + &token("bob", "operate", &file_source),
            "server.admin_tokens[1].name",
            "taken by an earlier token",
        ),
    ];
    for (tokens, key, reason) in &cases {
        let found = issues(&with(tokens));
        assert!(found.iter().any(|(k, r)| k == key && r.contains(reason)), "no {key}: ...{reason}... in {found:#?}");
        for (_, r) in &found {
            assert!(!r.contains("alice-token") && !r.contains("legacy-token"), "a token is printed: {r}");
        }
    }
    let retention = MINIMAL.replace("[store]", "audit_max_entries = 0\naudit_max_age = \"0s\"\n\n[store]");
    let found = issues(&retention);
    assert!(found.iter().any(|(k, _)| k == "server.audit_max_entries"), "{found:#?}");
    assert!(found.iter().any(|(k, _)| k == "server.audit_max_age"), "{found:#?}");
}
