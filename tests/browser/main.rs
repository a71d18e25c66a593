//! The console in a real browser: headless Chromium driven through WebDriver (Debian's
//! `chromium` and `chromium-driver`) against real gateways on one real Redis.
//!
//! ```text
//! cargo test --test browser
//! ```
//!
//! Without Chromium or chromedriver on the machine the suite says so and runs nothing: its
//! scenarios are reported as not run, never as passed. With `CI=true` (where `.ci/run`
//! installs them) a missing browser fails the suite instead.

#[path = "../support/mod.rs"]
mod support;

mod webdriver;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use http::Method;
use support::client::{Client, DEFAULT_AUTH};
use support::gateway_proc::{GatewayProc, Toml};
use support::raw_upstream::{Misbehaviour, RawUpstream};
use support::upstream::TestUpstream;
use webdriver::{Driver, Session};

const ALICE: &str = "alice-console-token-0123";
const VIEWER: &str = "viewer-console-token-0123";
const WAIT: Duration = Duration::from_secs(15);
/// A key that is also markup: it must show as these characters, and run nothing.
const HOSTILE_KEY: &str = "k1<img/src=x/onerror=window.__pwned=1></script>";
/// The operator's answer, markup too: the console shows it back as text.
const OPERATOR_ANSWER: &str = r#"{"id":"op-1","note":"</script><img src=x onerror=window.__pwned=3>"}"#;

/// One scenario: given Chromium, chromedriver and a runtime, what went wrong, if anything.
type Scenario = fn(&Path, &Path, &tokio::runtime::Runtime) -> Result<(), String>;

fn main() -> ExitCode {
    let (chromium, chromedriver) = match (
        find("IDEMGATE_CHROMIUM", &["chromium", "chromium-browser"]),
        find("IDEMGATE_CHROMEDRIVER", &["chromedriver"]),
    ) {
        (Some(chromium), Some(chromedriver)) => (chromium, chromedriver),
        _ => {
            let what = "Chromium and chromedriver (apt-get install chromium chromium-driver)";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                eprintln!("browser: FAILED: {what} are needed in CI");
                return ExitCode::FAILURE;
            }
            eprintln!("browser: NOT RUN: 1 scenario skipped, {what} not installed");
            return ExitCode::SUCCESS;
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let scenarios: [(&str, Scenario); 3] = [
        (
            "a stuck key is resolved in the console, its retry replays, another gateway shows who",
            resolve_in_the_console,
        ),
        ("open consoles poll within the admin cap and the probes are answered beside them", consoles_beside_probes),
        ("a flood on the admin listener while the console polls", flood_while_the_console_polls),
    ];
    let mut failed = 0;
    for (name, scenario) in scenarios {
        eprintln!("browser: {name} ...");
        match scenario(&chromium, &chromedriver, &runtime) {
            Ok(()) => eprintln!("browser: {name}: pass"),
            Err(e) => {
                failed += 1;
                eprintln!("browser: {name}: FAILED: {e}");
            }
        }
    }
    if failed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

/// `var` if set, else the first of `names` on the PATH.
fn find(var: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(var) {
        return Some(path.into());
    }
    let path = std::env::var_os("PATH")?;
    names.iter().flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name))).find(|p| p.is_file())
}

fn check(holds: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if holds { Ok(()) } else { Err(what()) }
}

/// A gateway on `redis_url` with alice (operate) and viewer (read), the orders route on
/// `upstream`, `routes` after it, and `server` lines more.
fn gateway(upstream: std::net::SocketAddr, redis_url: &str, server: &str, routes: String) -> GatewayProc {
    let server = format!(
        "{server}\n[[server.admin_tokens]]\nname = \"alice\"\nrole = \"operate\"\ntoken_env = \"TEST_ALICE\"\n\n\
         [[server.admin_tokens]]\nname = \"viewer\"\nrole = \"read\"\ntoken_env = \"TEST_VIEWER\"\n"
    );
    let store = format!("backend = \"redis\"\nurl = \"{redis_url}\"");
    let toml = Toml {
        server: &server,
        store: &store,
        upstream_lines: "timeout = \"5s\"",
        policy: "admin_body_preview = true",
        routes,
        ..Toml::new(upstream)
    }
    .render();
    GatewayProc::start_full(&toml, &[], &[("TEST_ALICE", ALICE), ("TEST_VIEWER", VIEWER)])
}

fn sign_in(page: &Session<'_>, admin: std::net::SocketAddr, token: &str, who: &str) -> Result<(), String> {
    page.go(&format!("http://{admin}/console/"))?;
    // Longer than WAIT: on a listener at its cap, a page may wait for a place the listener
    // frees when a spare connection has been idle for 10 s.
    let field = page.find("#token", 3 * WAIT).map_err(|e| format!("{e}; the page: {}", page.source()))?;
    page.type_text(&field, token)?;
    page.click(&page.find("#use-token", WAIT)?)?;
    page.wait_text("#who-text", 3 * WAIT, |t| t.contains(who)).map(drop)
}

/// A person goes from "a key is stuck" to "resolved, and the retry replays" in the console
/// alone, and a second operator, on another gateway, sees who did it and cannot act.
fn resolve_in_the_console(chromium: &Path, chromedriver: &Path, rt: &tokio::runtime::Runtime) -> Result<(), String> {
    let redis = support::redis::RedisServer::start();
    let upstream = rt.block_on(RawUpstream::start(Misbehaviour::CloseAfterRequest));
    // And an upstream of two instances, one of them gone, for the instances' health.
    let live = rt.block_on(TestUpstream::start());
    let spread = format!(
        "\n[[routes]]\nname = \"spread\"\nmethods = [\"POST\"]\npath = \"/spread\"\nupstream = \"many\"\n\n\
         [upstreams.many]\nurls = [\"http://{}\", \"http://127.0.0.1:9\"]\n",
        live.addr
    );
    let a = gateway(upstream.addr, &redis.url(), "", spread.clone());
    let b = gateway(upstream.addr, &redis.url(), "", spread);
    let client = Client::new(a.addr);
    let key = format!("\"{HOSTILE_KEY}\"");
    let order = r#"{"sku":"A-1","note":"</script><img src=x onerror=window.__pwned=2>"}"#;
    let first = rt.block_on(client.post_json("/orders", Some(&key), order));
    check(first.status == 502, || format!("the upstream hung up: outcome unknown, not {}", first.status))?;
    check(upstream.executions() == 1, || "sent once".to_owned())?;

    // Enough requests that the gone instance fails three connects running (whatever each
    // request's answer: a pass-through request it could not take may be answered 502).
    for _ in 0..20 {
        rt.block_on(client.post_json("/spread", None, "{}"));
    }

    let driver = Driver::start(chromedriver)?;
    let page = driver.session(chromium)?;
    sign_in(&page, a.admin, ALICE, "alice (operate)")?;
    // The instances of each route's upstream, and the one left out, why and for how long.
    let routes = page.wait_text("#routes tbody", WAIT, |t| t.contains("left out for"))?;
    check(routes.contains("127.0.0.1:9: left out for") && routes.contains("(connect, ejection 1)"), || routes.clone())?;
    check(routes.contains(&format!("{}: serving", live.addr)), || routes.clone())?;
    let held = page.wait_text("#held tbody", WAIT, |t| t.contains(HOSTILE_KEY))?;
    check(held.contains("unknown"), || format!("the row says unknown: {held}"))?;
    // Shown as its characters: no element made of it, no script of it run.
    let images = page.run("return document.querySelectorAll('main img').length")?;
    check(images == 0, || format!("the key became markup: {images} images"))?;
    let pwned = page.run("return window.__pwned === undefined")?;
    check(pwned == true, || "a script from the key ran".to_owned())?;

    page.click(&page.find("#held tbody tr", WAIT)?)?;
    page.wait_text("#record", WAIT, |t| t.contains("unknown") && t.contains(HOSTILE_KEY))?;
    let status = page.find("#resolve-status", WAIT)?;
    page.clear(&status)?;
    page.type_text(&status, "201")?;
    page.type_text(&page.find("#resolve-body", WAIT)?, OPERATOR_ANSWER)?;
    page.click(&page.find("#resolve", WAIT)?)?;
    // The confirmation says what it does before anything changes.
    let said =
        page.wait_text("#confirm-text", WAIT, |t| t.contains("Every retry with this key will get this answer"))?;
    check(said.contains("status 201"), || said.clone())?;
    page.click(&page.find("#confirm-ok", WAIT)?)?;
    page.wait_text("#status", WAIT, |t| t.contains("Resolved"))?;

    let retry = rt.block_on(client.post_json("/orders", Some(&key), order));
    check(retry.status == 201 && retry.is_replay(), || format!("the retry got {} {:?}", retry.status, retry.body))?;
    check(&retry.body[..] == OPERATOR_ANSWER.as_bytes(), || format!("the operator's answer: {:?}", retry.body))?;
    // The record now shows the answer a replay sends, its body as text: markup in it stays
    // characters, and nothing of it runs.
    let record = page.wait_text("#record", WAIT, |t| t.contains("completed") && t.contains("answer body"))?;
    check(record.contains("onerror=window.__pwned=3"), || format!("the body as text: {record}"))?;
    let images = page.run("return document.querySelectorAll('main img, main script').length")?;
    check(images == 0, || format!("the body became markup: {images} elements"))?;
    check(page.run("return window.__pwned === undefined")? == true, || "a script from the body ran".to_owned())?;
    check(upstream.executions() == 1, || "the retry never reached the upstream".to_owned())?;
    let shot = page.screenshot()?;
    let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console.png");
    std::fs::write(&file, shot).map_err(|e| e.to_string())?;
    eprintln!("browser: the console as resolved: {}", file.display());

    // A second operator, on gateway B, read-only: sees alice's change, is offered nothing.
    let other = driver.session(chromium)?;
    sign_in(&other, b.admin, VIEWER, "viewer (read)")?;
    let trail = other.wait_text("#audit tbody", WAIT, |t| t.contains("alice") && t.contains("resolve"))?;
    check(trail.contains("unknown → completed"), || format!("before and after: {trail}"))?;
    check(!trail.contains(HOSTILE_KEY), || "the trail names the record, never the key".to_owned())?;
    for action in ["#reload", "#actions"] {
        let shown = other.displayed(&other.find(action, WAIT)?)?;
        check(!shown, || format!("{action} is offered to a read token"))?;
    }
    let bearer = format!("Bearer {VIEWER}");
    let refused = rt.block_on(Client::new(b.admin).send(
        Method::DELETE,
        "/keys?route=orders&key=%22k%22",
        &[("authorization", bearer.as_str()), ("scope-authorization", DEFAULT_AUTH)],
        "",
    ));
    check(refused.status == 403, || format!("the API refuses a read token: {}", refused.status))?;
    // A read token sees the answer's status and headers, never its body.
    let path = format!("/keys?route=orders&key={}&include=answer", percent(&key));
    let seen = rt.block_on(Client::new(b.admin).send(
        Method::GET,
        &path,
        &[("authorization", bearer.as_str()), ("scope-authorization", DEFAULT_AUTH)],
        "",
    ));
    let answer = &seen.json()["answer"];
    check(answer["status"] == 201 && answer["body_preview"].is_null(), || format!("{answer}"))?;
    check(answer["body_preview_withheld"] == "an operate token is needed", || format!("{answer}"))
}

/// `text` percent-encoded for a query value.
fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Three operators with the console open, polling, on an admin listener capped at six
/// connections: each tab holds one connection (its calls go one at a time), and probes on
/// fresh connections are answered at once beside them.
fn consoles_beside_probes(chromium: &Path, chromedriver: &Path, rt: &tokio::runtime::Runtime) -> Result<(), String> {
    let redis = support::redis::RedisServer::start();
    let upstream = rt.block_on(TestUpstream::start());
    let gw = gateway(upstream.addr, &redis.url(), "admin_max_connections = 6", String::new());
    let driver = Driver::start(chromedriver)?;
    let tabs = [driver.session(chromium)?, driver.session(chromium)?, driver.session(chromium)?];
    // One after the other: a loading page takes several connections for a moment, whose
    // spares the listener closes after 10 s idle; then each tab holds one.
    for tab in &tabs {
        sign_in(tab, gw.admin, VIEWER, "viewer (read)")?;
    }
    std::thread::sleep(Duration::from_secs(11));
    let probe = Client::new(gw.admin);
    for n in 0..30 {
        let started = std::time::Instant::now();
        let ready = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(2), probe.try_send(Method::GET, "/readyz", &[], "")).await
        });
        let status = match ready {
            Ok(Ok(reply)) => reply.status.as_u16(),
            Ok(Err(e)) => return Err(format!("probe {n} failed: {e}")),
            Err(_) => return Err(format!("probe {n} waited 2 s beside three open consoles")),
        };
        check(status == 200, || format!("probe {n}: {status}"))?;
        check(started.elapsed() < Duration::from_secs(2), || format!("probe {n} took {:?}", started.elapsed()))?;
        std::thread::sleep(Duration::from_millis(100));
    }
    // And the consoles are still live.
    for tab in &tabs {
        tab.wait_text("#outcomes-window", WAIT, |t| t.starts_with("over the last"))?;
    }
    Ok(())
}

/// A flood of silent connections on the admin listener (past its cap) while an operator has
/// the console open: the console goes on over the connection it holds, the proxy serves, and
/// once the flood is cut off at the header timeout, probes are answered again.
fn flood_while_the_console_polls(
    chromium: &Path,
    chromedriver: &Path,
    rt: &tokio::runtime::Runtime,
) -> Result<(), String> {
    let redis = support::redis::RedisServer::start();
    let upstream = rt.block_on(TestUpstream::start());
    let gw =
        gateway(upstream.addr, &redis.url(), "admin_max_connections = 8\nheader_read_timeout = \"2s\"", String::new());
    let driver = Driver::start(chromedriver)?;
    let page = driver.session(chromium)?;
    sign_in(&page, gw.admin, ALICE, "alice (operate)")?;
    page.wait_text("#outcomes-window", WAIT, |t| t.starts_with("over the last"))?;
    let flood: Vec<std::net::TcpStream> = (0..40).filter_map(|_| std::net::TcpStream::connect(gw.admin).ok()).collect();
    check(flood.len() == 40, || format!("{} of 40 flood connections made", flood.len()))?;
    // The console refreshes through the flood: its window moves on.
    let before = page.text(&page.find("#outcomes-window", WAIT)?)?;
    page.wait_text("#outcomes-window", WAIT, |t| t.starts_with("over the last") && t != before)?;
    let served = rt.block_on(Client::new(gw.addr).post_json("/orders", Some("\"during-flood\""), "{}"));
    check(served.status == 201, || format!("the proxy during the flood: {}", served.status))?;
    // Cut off at the header timeout, seven at a time (the places the console leaves), the
    // flood drains in about 40 / 7 rounds of 2 s, and the probes have their places back.
    let ready = rt.block_on(async {
        let probe = Client::new(gw.admin);
        tokio::time::timeout(Duration::from_secs(20), probe.try_send(Method::GET, "/readyz", &[], "")).await
    });
    check(matches!(&ready, Ok(Ok(r)) if r.status == 200), || format!("a probe after the flood: {ready:?}"))?;
    drop(flood);
    page.wait_text("#outcomes-window", WAIT, |t| t.starts_with("over the last")).map(drop)
}
