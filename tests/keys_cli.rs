//! `idemgate keys`, the real binary, against a fake admin listener that records every request
//! and answers canned documents: what goes on the wire (token, scope headers, encoding, the
//! resolution document), paging, output, and how failures are reported.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, pki_types::PrivateKeyDer};

const TOKEN: &str = "s3cret-admin";
const HOSTILE_KEY: &str = "a b/c?d#e%2F";
const SCOPE_HASH: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

// ---- The fake admin listener ----

/// One request as the admin listener saw it.
#[derive(Clone, Debug)]
struct Recorded {
    method: String,
    /// Path and query, as sent.
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Recorded {
    fn path(&self) -> &str {
        self.target.split_once('?').map_or(&self.target, |(p, _)| p)
    }

    fn query(&self) -> &str {
        self.target.split_once('?').map_or("", |(_, q)| q)
    }

    fn param(&self, name: &str) -> Option<String> {
        form_urlencoded::parse(self.query().as_bytes()).find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn scope_headers(&self) -> Vec<(String, String)> {
        self.headers.iter().filter(|(n, _)| n.starts_with("scope-")).cloned().collect()
    }
}

/// A canned answer: status, content type, body.
struct Canned(u16, &'static str, String);

fn ok(doc: Value) -> Canned {
    Canned(200, "application/json", doc.to_string())
}

fn problem(status: u16, title: &str, detail: &str) -> Canned {
    let doc = json!({ "type": "https://idemgate.dev/errors/x", "title": title, "status": status, "detail": detail });
    Canned(status, "application/problem+json", doc.to_string())
}

type Handler = Arc<dyn Fn(&Recorded) -> Canned + Send + Sync>;

struct FakeAdmin {
    url: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
    _runtime: tokio::runtime::Runtime,
}

impl FakeAdmin {
    fn start(handler: impl Fn(&Recorded) -> Canned + Send + Sync + 'static) -> Self {
        Self::start_with(handler, None)
    }

    fn start_with(handler: impl Fn(&Recorded) -> Canned + Send + Sync + 'static, tls: Option<TlsAcceptor>) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = match tls {
            Some(_) => format!("https://localhost:{port}"),
            None => format!("http://127.0.0.1:{port}"),
        };
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let log = Arc::clone(&requests);
        runtime.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { continue };
                let (handler, log, tls) = (Arc::clone(&handler), Arc::clone(&log), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(tcp).await {
                                serve(stream, handler, log).await;
                            }
                        }
                        None => serve(tcp, handler, log).await,
                    }
                });
            }
        });
        Self { url, requests, _runtime: runtime }
    }

    fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    fn only_request(&self) -> Recorded {
        let requests = self.requests();
        assert_eq!(requests.len(), 1, "{requests:#?}");
        requests.into_iter().next().unwrap()
    }
}

async fn serve<S>(stream: S, handler: Handler, log: Arc<Mutex<Vec<Recorded>>>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request: http::Request<hyper::body::Incoming>| {
        let (handler, log) = (Arc::clone(&handler), Arc::clone(&log));
        async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await.map(|b| b.to_bytes().to_vec()).unwrap_or_default();
            let recorded = Recorded {
                method: parts.method.to_string(),
                target: parts.uri.path_and_query().map(|pq| pq.as_str().to_owned()).unwrap_or_default(),
                headers: parts
                    .headers
                    .iter()
                    .map(|(n, v)| (n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                    .collect(),
                body,
            };
            let Canned(status, content_type, body) = handler(&recorded);
            log.lock().unwrap().push(recorded);
            let response = http::Response::builder()
                .status(status)
                .header("content-type", content_type)
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
}

// ---- Running the binary ----

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {self:?}"))
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {:?}\n--- stdout\n{}--- stderr\n{}", self.code, self.stdout, self.stderr)
    }
}

/// Runs `idemgate keys ARGS` with only the given IDEMGATE_* variables (the test's own
/// environment might hold others) and `stdin`.
fn keys(args: &[&str], env: &[(&str, &str)], stdin: Option<&[u8]>) -> Run {
    let mut all = vec!["keys"];
    all.extend_from_slice(args);
    idemgate(&all, env, stdin)
}

/// Runs `idemgate ARGS` with only `env` of the IDEMGATE_ variables.
fn idemgate(args: &[&str], env: &[(&str, &str)], stdin: Option<&[u8]>) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idemgate"));
    command.args(args);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("IDEMGATE_") || name == "SSL_CERT_FILE" || name == "SSL_CERT_DIR" {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied());
    command.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    if let Some(input) = stdin {
        // The child may exit without reading (a refused combination): a broken pipe is fine.
        let _ = child.stdin.take().unwrap().write_all(input);
    }
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

const WITH_TOKEN: (&str, &str) = ("IDEMGATE_ADMIN_TOKEN", TOKEN);

fn completed() -> Value {
    json!({ "state": "completed", "attempt": 1, "expires_in_ms": 86_399_000, "status": 201, "body_bytes": 17 })
}

// ---- Show, release: token, scope, encoding ----

#[test]
fn show_sends_the_token_and_the_scope_as_headers_never_in_the_url() {
    let admin = FakeAdmin::start(|_| ok(completed()));
    let env = [
        WITH_TOKEN,
        ("IDEMGATE_SCOPE_AUTHORIZATION", "Bearer alice"),
        ("IDEMGATE_SCOPE_COOKIE", "session=abc"),
        ("IDEMGATE_SCOPE_X_API_KEY", "k-123"),
    ];
    let run = keys(&["show", "--admin", &admin.url, "--route", "orders", "--key", HOSTILE_KEY], &env, None);
    assert_eq!(run.code, Some(0), "{run:?}");

    let request = admin.only_request();
    assert_eq!((request.method.as_str(), request.path()), ("GET", "/keys"));
    assert_eq!(request.header("authorization"), Some(format!("Bearer {TOKEN}").as_str()));
    assert_eq!(
        request.scope_headers(),
        [
            ("scope-authorization".to_owned(), "Bearer alice".to_owned()),
            ("scope-cookie".to_owned(), "session=abc".to_owned()),
            ("scope-x-api-key".to_owned(), "k-123".to_owned()),
        ]
    );
    // Every reserved character encoded, so the key arrives whole and nothing leaks into the URL.
    assert_eq!(request.query(), "route=orders&key=a+b%2Fc%3Fd%23e%252F");
    assert_eq!(request.param("key").as_deref(), Some(HOSTILE_KEY));
    for secret in ["alice", "session", "abc", "k-123", TOKEN] {
        assert!(!request.target.contains(secret), "{secret} in {}", request.target);
    }

    assert!(run.stdout.contains(HOSTILE_KEY), "{run:?}");
    for line in ["completed", "attempt", "201", "23h59m"] {
        assert!(run.stdout.contains(line), "{line} missing: {run:?}");
    }
}

#[test]
fn show_prints_an_absent_key_as_an_answer_and_json_for_scripts() {
    let admin = FakeAdmin::start(|_| Canned(404, "application/json", json!({ "state": "absent" }).to_string()));
    let args = ["show", "--admin", &admin.url, "--route", "orders", "--key", "k1"];
    let run = keys(&args, &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("absent"), "{run:?}");

    let run = keys(&[&args[..], &["--json"]].concat(), &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.json(), json!({ "state": "absent" }));

    let present = FakeAdmin::start(|_| ok(completed()));
    let run =
        keys(&["show", "--admin", &present.url, "--route", "orders", "--key", "k1", "--json"], &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.json(), completed());
}

/// An absent key looked up without a caller, on a route that keeps keys per caller: the hint
/// names the variables that send that route's scope, from `GET /routes`.
#[test]
fn an_absent_key_without_a_caller_names_the_variables_of_the_routes_scope() {
    let routes = |scope: Value| json!([{ "name": "orders", "idempotency": { "scope": scope, "on_missing_scope": "anonymous" } }]);
    let per_caller = routes(json!(["header:x-tenant", "cookie:session", "cookie:csrf?"]));
    let admin = FakeAdmin::start(move |request| match request.path() {
        "/routes" => ok(per_caller.clone()),
        _ => Canned(404, "application/json", json!({ "state": "absent" }).to_string()),
    });
    let args = ["show", "--admin", &admin.url, "--route", "orders", "--key", "k1"];
    let run = keys(&args, &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("absent"), "{run:?}");
    assert!(run.stderr.contains("keeps keys per caller (header:x-tenant, cookie:session, cookie:csrf?)"), "{run:?}");
    assert!(run.stderr.contains("(IDEMGATE_SCOPE_X_TENANT and IDEMGATE_SCOPE_COOKIE, --scope-stdin"), "{run:?}");
    assert!(!run.stderr.contains("<NAME>"), "{run:?}");

    // Keys shared by every caller: absent is the whole answer.
    let global = routes(json!([]));
    let admin = FakeAdmin::start(move |request| match request.path() {
        "/routes" => ok(global.clone()),
        _ => Canned(404, "application/json", json!({ "state": "absent" }).to_string()),
    });
    let run = keys(&["show", "--admin", &admin.url, "--route", "orders", "--key", "k1"], &[WITH_TOKEN], None);
    assert_eq!((run.code, run.stderr.as_str()), (Some(0), ""), "{run:?}");
}

/// Every field of a record is printed with a label for people, durations made readable.
#[test]
fn show_labels_every_field_for_people() {
    let record = json!({
        "state": "unknown", "attempt": 2, "expires_in_ms": 3_600_000, "lookup_in_flight": true,
        "lookup_left_ms": 4_000, "not_found_trusted_in_ms": 90_000,
    });
    let admin = FakeAdmin::start(move |_| ok(record.clone()));
    let run = keys(
        &["show", "--admin", &admin.url, "--route", "orders", "--key", "k1"],
        &[WITH_TOKEN, ("IDEMGATE_SCOPE_AUTHORIZATION", "Bearer alice")],
        None,
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    for line in ["lookup left           4s\n", "not found trusted in  1m30s\n", "expires in            1h\n"] {
        assert!(run.stdout.contains(line), "{line:?} missing: {run:?}");
    }
    assert!(!run.stdout.contains("_ms"), "{run:?}");
}

#[test]
fn scope_stdin_lines_become_scope_headers_next_to_the_variables() {
    let admin = FakeAdmin::start(|_| ok(json!({ "released": true, "was": "unknown" })));
    let stdin = b"# the caller of ticket 4711\n\nAuthorization: Bearer bob\r\nCookie:  session=xyz \n";
    let run = keys(
        &["release", "--admin", &admin.url, "--route", "orders", "--key", "k1", "--scope-stdin"],
        &[WITH_TOKEN, ("IDEMGATE_SCOPE_X_TENANT", "t1")],
        Some(stdin),
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("released (was unknown)"), "{run:?}");

    let request = admin.only_request();
    assert_eq!(request.method, "DELETE");
    assert_eq!(request.query(), "route=orders&key=k1");
    assert_eq!(
        request.scope_headers(),
        [
            ("scope-x-tenant".to_owned(), "t1".to_owned()),
            ("scope-authorization".to_owned(), "Bearer bob".to_owned()),
            ("scope-cookie".to_owned(), "session=xyz".to_owned()),
        ]
    );
}

#[test]
fn a_bad_scope_line_is_refused_without_echoing_it() {
    let admin = FakeAdmin::start(|_| ok(completed()));
    let run = keys(
        &["show", "--admin", &admin.url, "--route", "orders", "--key", "k1", "--scope-stdin"],
        &[WITH_TOKEN],
        Some(b"Bearer hunter2\n"),
    );
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("line 1"), "{run:?}");
    assert!(!run.stderr.contains("hunter2"), "{run:?}");
    assert!(admin.requests().is_empty());
}

#[test]
fn scope_hash_goes_in_the_query_and_the_scope_variables_stay_home() {
    let admin = FakeAdmin::start(|_| ok(json!({ "released": false, "was": null })));
    let run = keys(
        &["release", "--admin", &admin.url, "--route", "orders", "--key", "k1", "--scope-hash", SCOPE_HASH],
        &[WITH_TOKEN, ("IDEMGATE_SCOPE_AUTHORIZATION", "Bearer alice")],
        None,
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("not released"), "{run:?}");
    let request = admin.only_request();
    assert_eq!(request.param("scope_hash").as_deref(), Some(SCOPE_HASH));
    assert!(request.scope_headers().is_empty(), "{request:?}");

    let run = keys(
        &["release", "--admin", &admin.url, "--route", "orders", "--key", "k1", "--scope-hash", "xyz"],
        &[WITH_TOKEN],
        None,
    );
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("64 hex digits"), "{run:?}");
    assert_eq!(admin.requests().len(), 1, "a bad hash must not be sent");
}

/// A key a running request holds is refused by the admin listener (409, printed, exit 1);
/// `--force` asks for the release all the same, and only then is `force=true` sent.
#[test]
fn release_sends_force_only_when_asked_and_prints_a_refusal() {
    let admin = FakeAdmin::start(|request| match request.param("force").as_deref() {
        Some("true") => ok(json!({ "released": true, "was": "in_progress" })),
        _ => problem(409, "Not releasable", "A request holds this key and may be running upstream now."),
    });
    let base = ["release", "--admin", &admin.url, "--route", "orders", "--key", "k1", "--scope-hash", SCOPE_HASH];
    let run = keys(&base, &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("409 Not releasable: A request holds this key"), "{run:?}");
    let run = keys(&[&base[..], &["--force"]].concat(), &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("released (was in_progress)"), "{run:?}");
    let forced: Vec<Option<String>> = admin.requests().iter().map(|r| r.param("force")).collect();
    assert_eq!(forced, [None, Some("true".to_owned())]);
    // The admin listener refuses a parameter given twice: each is sent once.
    let last = admin.requests().pop().unwrap();
    assert_eq!(last.query(), format!("route=orders&key=k1&scope_hash={SCOPE_HASH}&force=true"));
}

// ---- List: paging, table, JSON ----

/// Three records over two pages; the second page is asked for with a cursor that needs
/// encoding. The state listed is echoed back.
fn two_pages(request: &Recorded) -> Canned {
    let record = |key: &str, since_ms: u64, scope: char| {
        json!({
            "key": key, "scope_hash": scope.to_string().repeat(64), "state": request.param("state"),
            "attempt": 1, "since_ms": since_ms, "method": "POST", "path": "/orders",
        })
    };
    let (records, next) = match request.param("cursor").as_deref() {
        None => (vec![record("k-one", 192_000, 'a'), record(HOSTILE_KEY, 850, 'b')], json!("c 1/+&")),
        Some("c 1/+&") => (vec![record("k-three", 7_500_000, 'c')], Value::Null),
        Some(other) => return problem(400, "Bad request", &format!("unknown cursor {other}")),
    };
    ok(
        json!({ "route": request.param("route"), "state": request.param("state"), "records": records, "next_cursor": next }),
    )
}

#[test]
fn list_follows_the_cursor_and_prints_a_table() {
    let admin = FakeAdmin::start(two_pages);
    let run = keys(&["list", "--admin", &admin.url, "--route", "orders"], &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stderr.is_empty(), "{run:?}");

    let requests = admin.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    assert_eq!(requests[0].query(), "route=orders&state=unknown&limit=1000");
    // The second page asks only for what --max (default 1000) still allows.
    assert_eq!(requests[1].query(), "route=orders&state=unknown&cursor=c+1%2F%2B%26&limit=998");
    assert!(requests.iter().all(|r| r.method == "GET" && r.path() == "/keys"));
    assert!(requests.iter().all(|r| r.header("authorization") == Some(&format!("Bearer {TOKEN}"))));

    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{run:?}");
    let columns: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(columns, ["KEY", "STATE", "ATTEMPT", "SINCE", "METHOD", "PATH", "SCOPE_HASH"]);
    // The scope hash whole: what show, resolve and release take.
    assert!(
        lines[1].starts_with("k-one ")
            && lines[1].contains(" 3m12s ")
            && lines[1].ends_with(&format!(" {}", "a".repeat(64)))
    );
    assert!(
        lines[2].starts_with(HOSTILE_KEY)
            && lines[2].contains(" 850ms ")
            && lines[2].ends_with(&format!(" {}", "b".repeat(64)))
    );
    assert!(lines[3].starts_with("k-three ") && lines[3].contains(" 2h5m ") && lines[3].contains(" unknown "));
    // The columns line up: SINCE starts at the same place on every line.
    let at = lines[0].find("SINCE").unwrap();
    assert_eq!(&lines[1][at..at + 5], "3m12s", "{run:?}");
}

/// A gateway's configuration naming its admin listener on every address, and its token.
fn config_naming(admin: &str, token_lines: &str) -> tempfile::NamedTempFile {
    let port = admin.rsplit(':').next().unwrap_or_default().trim_end_matches('/');
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"0.0.0.0:{port}\"\n{token_lines}\n\n[store]\nbackend = \"memory\"\n\n\
         [upstreams.app]\nurl = \"http://127.0.0.1:3000\"\n\n[[routes]]\nname = \"orders\"\npath = \"/orders\"\nupstream = \"app\"\n\n\
         [routes.idempotency]\n"
    );
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file
}

/// `--config FILE` takes the admin listener and its token from the file (0.0.0.0 meaning this
/// machine); without it no file is read, and options the command does not use are refused.
#[test]
fn keys_takes_the_listener_and_token_from_a_config_file_when_asked() {
    let admin = FakeAdmin::start(two_pages);
    let file = config_naming(&admin.url, &format!("admin_token = \"{TOKEN}-from-the-file\""));
    let path = file.path().to_str().unwrap();
    let run = keys(&["list", "--config", path, "--route", "orders"], &[], None);
    assert_eq!(run.code, Some(0), "{run:?}");
    let request = admin.requests().into_iter().next().expect("a request");
    assert_eq!(request.header("authorization"), Some(format!("Bearer {TOKEN}-from-the-file").as_str()));

    // The token through the variable the file names.
    let file = config_naming(&admin.url, "admin_token_env = \"MY_ADMIN_TOKEN\"");
    let run = keys(
        &["list", "--config", file.path().to_str().unwrap(), "--route", "orders"],
        &[("MY_ADMIN_TOKEN", "another-long-admin-token")],
        None,
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(admin.requests().iter().any(|r| r.header("authorization") == Some("Bearer another-long-admin-token")));

    // A file that is not there is unusable input, named.
    let run = keys(&["list", "--config", "/nonexistent/gw.toml", "--route", "orders"], &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("/nonexistent/gw.toml"), "{run:?}");
    // Neither --admin nor --config; both; options keys never uses.
    for args in [
        vec!["keys", "list", "--route", "orders"],
        vec!["keys", "list", "--admin", "http://127.0.0.1:1", "--config", path, "--route", "orders"],
        vec!["keys", "list", "--admin", "http://127.0.0.1:1", "--route", "orders", "--log-format", "json"],
        vec!["--config", path, "keys", "list", "--admin", "http://127.0.0.1:1", "--route", "orders"],
        vec!["check", "--log-format", "json"],
    ] {
        let run = idemgate(&args, &[WITH_TOKEN], None);
        assert_eq!(run.code, Some(2), "{args:?}: {run:?}");
    }
    // Neither: the refusal names both ways, --config too.
    let run = idemgate(&["keys", "list", "--route", "orders"], &[WITH_TOKEN], None);
    assert!(run.stderr.contains("--admin <URL>") && run.stderr.contains("--config <PATH>"), "{run:?}");
    let help = idemgate(&["keys", "list", "--help"], &[], None);
    assert!(!help.stdout.contains("--log-format"), "{help:?}");
}

/// The top-level help says what no command does, and how to reload.
#[test]
fn the_help_says_that_no_command_serves_and_how_to_reload() {
    let help = idemgate(&["--help"], &[], None);
    assert_eq!(help.code, Some(0), "{help:?}");
    for words in ["Without a command, idemgate serves", "SIGHUP", "POST /reload", "check", "keys"] {
        assert!(help.stdout.contains(words), "{words:?} in {}", help.stdout);
    }
}

/// What `list` prints in its SCOPE_HASH column, `show --scope-hash` takes as it is.
#[test]
fn show_takes_the_scope_hash_list_prints() {
    let admin = FakeAdmin::start(|request| {
        if request.param("state").is_some() {
            two_pages(request)
        } else {
            ok(json!({ "state": "unknown", "attempt": 1, "expires_in_ms": 1000 }))
        }
    });
    let listed = keys(&["list", "--admin", &admin.url, "--route", "orders"], &[WITH_TOKEN], None);
    assert_eq!(listed.code, Some(0), "{listed:?}");
    let line = listed.stdout.lines().find(|l| l.starts_with("k-one ")).unwrap_or_default().to_owned();
    let printed = line.split_whitespace().last().unwrap_or_default().to_owned();
    let shown = keys(
        &["show", "--admin", &admin.url, "--route", "orders", "--key", "k-one", "--scope-hash", &printed],
        &[WITH_TOKEN],
        None,
    );
    assert_eq!(shown.code, Some(0), "{shown:?}");
    let asked = admin.requests().into_iter().last().and_then(|r| r.param("scope_hash"));
    assert_eq!(asked.as_deref(), Some(printed.as_str()), "{line}");
}

#[test]
fn list_json_is_one_document_with_every_record() {
    let admin = FakeAdmin::start(two_pages);
    let run = keys(
        &["list", "--admin", &admin.url, "--route", "orders", "--state", "executed", "--json"],
        &[WITH_TOKEN],
        None,
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    let doc = run.json();
    assert_eq!(doc["route"], "orders");
    assert_eq!(doc["state"], "executed");
    assert_eq!(doc["next_cursor"], Value::Null);
    let keys: Vec<&str> = doc["records"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["k-one", HOSTILE_KEY, "k-three"]);
    assert!(admin.requests().iter().all(|r| r.param("state").as_deref() == Some("executed")));
}

#[test]
fn list_stops_at_max_and_says_that_more_exist() {
    // An endless listing: every page is full and has a next one.
    let admin = FakeAdmin::start(|request| {
        let limit: usize = request.param("limit").and_then(|l| l.parse().ok()).unwrap_or(100);
        let records: Vec<Value> = (0..limit.min(3))
            .map(|i| {
                json!({ "key": format!("k{i}"), "scope_hash": "f".repeat(64), "state": "unknown",
                "attempt": 2, "since_ms": 1000, "method": "POST", "path": "/orders" })
            })
            .collect();
        ok(json!({ "route": "orders", "state": "unknown", "records": records, "next_cursor": "more" }))
    });
    let run = keys(&["list", "--admin", &admin.url, "--route", "orders", "--max", "2"], &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(admin.only_request().param("limit").as_deref(), Some("2"));
    assert_eq!(run.stdout.lines().count(), 3, "{run:?}");
    assert!(run.stderr.contains("more exist") && run.stderr.contains("--cursor more"), "{run:?}");

    let run = keys(&["list", "--admin", &admin.url, "--route", "orders", "--max", "2", "--json"], &[WITH_TOKEN], None);
    assert_eq!(run.json()["next_cursor"], "more");
    assert_eq!(run.json()["records"].as_array().unwrap().len(), 2);
}

#[test]
fn list_cut_short_by_a_page_longer_than_asked_offers_that_page_again() {
    // A listener that ignores limit: continuing from its next cursor would skip a record.
    let admin = FakeAdmin::start(|_| {
        let records: Vec<Value> = (0..3).map(|i| json!({ "key": format!("k{i}"), "state": "unknown" })).collect();
        ok(json!({ "route": "orders", "state": "unknown", "records": records, "next_cursor": "p2" }))
    });
    let args = ["list", "--admin", &admin.url, "--route", "orders", "--max", "2", "--cursor", "p1"];
    let run = keys(&args, &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.stdout.lines().count(), 3, "{run:?}");
    assert!(run.stderr.contains("more exist; continue with --cursor p1"), "{run:?}");
    assert_eq!(admin.only_request().param("cursor").as_deref(), Some("p1"));
}

#[test]
fn list_without_a_route_is_a_usage_error() {
    let run = keys(&["list", "--admin", "http://127.0.0.1:9"], &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("--route"), "{run:?}");
}

// ---- Resolve ----

#[test]
fn resolve_sends_the_answer_as_one_json_document() {
    let admin = FakeAdmin::start(|_| ok(json!({ "resolved": true, "was": "unknown" })));
    let run = keys(
        &[
            "resolve",
            "--admin",
            &admin.url,
            "--route",
            "orders",
            "--key",
            HOSTILE_KEY,
            "--status",
            "201",
            "--header",
            "content-type: application/json",
            "--header",
            "Location:/orders/7",
            "--header",
            "Link: <a>",
            "--header",
            "link: <b>",
            "--body",
            r#"{"id":7}"#,
        ],
        &[WITH_TOKEN, ("IDEMGATE_SCOPE_AUTHORIZATION", "Bearer alice")],
        None,
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("resolved (was unknown)"), "{run:?}");

    let request = admin.only_request();
    assert_eq!(request.method, "PUT");
    assert_eq!(request.query(), "route=orders&key=a+b%2Fc%3Fd%23e%252F");
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(request.header("scope-authorization"), Some("Bearer alice"));
    assert_eq!(
        String::from_utf8(request.body).unwrap(),
        concat!(
            r#"{"status":201,"headers":{"content-type":"application/json","location":"/orders/7","#,
            r#""link":["<a>","<b>"]},"body":"{\"id\":7}"}"#
        )
    );
}

#[test]
fn resolve_reads_the_body_from_a_file_or_stdin() {
    let admin = FakeAdmin::start(|_| ok(json!({ "resolved": true, "was": "unknown" })));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("body.json");
    std::fs::write(&file, "{\"ok\": \"ünïcode\"}\n").unwrap();
    let base = ["resolve", "--admin", &admin.url, "--route", "orders", "--key", "k1", "--status", "200"];

    let run = keys(&[&base[..], &["--body-file", file.to_str().unwrap(), "--json"]].concat(), &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.json(), json!({ "resolved": true, "was": "unknown" }));
    let run = keys(&[&base[..], &["--body-file", "-"]].concat(), &[WITH_TOKEN], Some(b"from stdin\n"));
    assert_eq!(run.code, Some(0), "{run:?}");
    let run = keys(&base, &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(0), "{run:?}");

    let bodies: Vec<Value> = admin.requests().iter().map(|r| serde_json::from_slice(&r.body).unwrap()).collect();
    assert_eq!(bodies[0], json!({ "status": 200, "headers": {}, "body": "{\"ok\": \"ünïcode\"}\n" }));
    assert_eq!(bodies[1], json!({ "status": 200, "headers": {}, "body": "from stdin\n" }));
    assert_eq!(bodies[2], json!({ "status": 200, "headers": {}, "body": "" }));
}

#[test]
fn resolve_refuses_stdin_twice_binary_bodies_bad_headers_and_no_status() {
    let admin = FakeAdmin::start(|_| ok(json!({ "resolved": true, "was": "unknown" })));
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("body.bin");
    std::fs::write(&binary, [0x89, b'P', b'N', b'G', 0xff, 0x00]).unwrap();
    let base = ["resolve", "--admin", &admin.url, "--route", "orders", "--key", "k1", "--status", "200"];

    let run = keys(&[&base[..], &["--body-file", "-", "--scope-stdin"]].concat(), &[WITH_TOKEN], Some(b"x"));
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("--scope-stdin") && run.stderr.contains("standard input"), "{run:?}");

    let run = keys(&[&base[..], &["--body-file", binary.to_str().unwrap()]].concat(), &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("UTF-8"), "{run:?}");

    let run = keys(&[&base[..], &["--body", "x", "--body-file", "-"]].concat(), &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(2), "{run:?}");

    let run = keys(&[&base[..], &["--header", "no colon"]].concat(), &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(2), "{run:?}");

    let run = keys(&[&base[..], &["--header", "x-a: b\u{1}"]].concat(), &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("cannot carry"), "{run:?}");

    let run = keys(&["resolve", "--admin", &admin.url, "--route", "orders", "--key", "k1"], &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("--status"), "{run:?}");

    // What the admin listener would refuse is refused here, with its words, before sending:
    // headers a replay never carries, and a body on a status that has none.
    for header in ["Content-Length: 2", "transfer-encoding: chunked", "Set-Cookie: a=1", "Date: x"] {
        let run = keys(&[&base[..], &["--header", header]].concat(), &[WITH_TOKEN], None);
        assert_eq!(run.code, Some(2), "{header}: {run:?}");
        let name = header.split(':').next().unwrap().to_lowercase();
        assert!(run.stderr.contains(&format!("the header {name} cannot be part of a stored answer")), "{run:?}");
    }
    let no_content = ["resolve", "--admin", &admin.url, "--route", "orders", "--key", "k1", "--status", "204"];
    let run = keys(&[&no_content[..], &["--body", "x"]].concat(), &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("status 204 has no body") && run.stderr.contains("nothing was sent"), "{run:?}");

    assert!(admin.requests().is_empty(), "{:#?}", admin.requests());
}

// ---- Failures ----

#[test]
fn a_problem_answer_is_printed_and_exits_1() {
    let admin = FakeAdmin::start(|request| match request.method.as_str() {
        "PUT" => problem(409, "Conflict", "The key is completed; nothing changed."),
        _ => problem(401, "Unauthorized", "A valid bearer token is required."),
    });
    let run = keys(&["list", "--admin", &admin.url, "--route", "orders"], &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(run.stderr, "idemgate keys: 401 Unauthorized: A valid bearer token is required.\n");
    assert!(run.stdout.is_empty(), "{run:?}");

    let run = keys(
        &["resolve", "--admin", &admin.url, "--route", "orders", "--key", "k1", "--status", "200"],
        &[WITH_TOKEN],
        None,
    );
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(run.stderr, "idemgate keys: 409 Conflict: The key is completed; nothing changed.\n");

    // A 404 problem (token endpoints disabled) is not an absent key.
    let disabled = FakeAdmin::start(|_| {
        problem(404, "Admin endpoints that need a token are disabled", "/keys, /routes and /reload need a token.")
    });
    let run = keys(&["show", "--admin", &disabled.url, "--route", "orders", "--key", "k1"], &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("404 Admin endpoints that need a token are disabled"), "{run:?}");
}

#[test]
fn without_a_token_nothing_is_sent() {
    let admin = FakeAdmin::start(|_| ok(completed()));
    let args = ["show", "--admin", &admin.url, "--route", "orders", "--key", "k1"];
    for env in [&[][..], &[("IDEMGATE_ADMIN_TOKEN", " \n")][..]] {
        let run = keys(&args, env, None);
        assert_eq!(run.code, Some(2), "{run:?}");
        assert!(run.stderr.contains("IDEMGATE_ADMIN_TOKEN"), "{run:?}");
    }
    assert!(admin.requests().is_empty());
}

#[test]
fn an_unreachable_admin_listener_is_a_clear_failure() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let run = keys(&["show", "--admin", &url, "--route", "orders", "--key", "k1"], &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains(&format!("cannot reach the admin listener at {url}")), "{run:?}");

    let run = keys(&["show", "--admin", "127.0.0.1:9090", "--route", "orders", "--key", "k1"], &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("http://"), "{run:?}");
}

#[test]
fn show_without_a_key_is_a_usage_error() {
    let run = keys(&["show", "--admin", "http://127.0.0.1:9", "--route", "orders"], &[WITH_TOKEN], None);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("--key"), "{run:?}");
}

// ---- https ----

#[test]
fn an_https_admin_listener_is_verified_against_ssl_cert_file() {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()]).unwrap().signed_by(&leaf_key, &ca).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()))
        .unwrap();
    let admin = FakeAdmin::start_with(|_| ok(completed()), Some(TlsAcceptor::from(Arc::new(server))));
    let args = ["show", "--admin", &admin.url, "--route", "orders", "--key", "k1", "--json"];

    let run = keys(&args, &[WITH_TOKEN, ("SSL_CERT_FILE", ca_file.to_str().unwrap())], None);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.json(), completed());
    assert_eq!(admin.only_request().header("authorization"), Some(format!("Bearer {TOKEN}").as_str()));

    // Another CA: the token is never sent to a listener that cannot prove who it is.
    let other = dir.path().join("other.pem");
    let mut other_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    other_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    std::fs::write(&other, CertifiedIssuer::self_signed(other_params, KeyPair::generate().unwrap()).unwrap().pem())
        .unwrap();
    let run = keys(&args, &[WITH_TOKEN, ("SSL_CERT_FILE", other.to_str().unwrap())], None);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("cannot reach the admin listener"), "{run:?}");
    assert_eq!(admin.requests().len(), 1);
}
