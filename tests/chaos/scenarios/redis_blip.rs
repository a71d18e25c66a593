//! Redis stops right after the gateways claimed their keys and comes back while the lease
//! still runs: the upstream answers in the meantime. Redis keeps an append-only file, fsynced
//! on every write, so nothing it acknowledged is lost (a stop here is a kill -9). The gateway
//! answers each client at once and keeps trying to settle behind the answer, for as long as
//! the lease allows; when Redis is back within the lease, every retry after the lease would
//! have passed is a replay, and no request runs twice.

use std::time::Duration;

use tokio::task::JoinSet;

use crate::common::{Report, gateway_toml, order, post, route};
use crate::ledger::{Faults, Ledger};
use crate::support::gateway_proc::GatewayProc;
use crate::support::redis::RedisServer;
use crate::support::unique;

/// The route's lease: the window the settle has to land in.
const LEASE: Duration = Duration::from_secs(5);
/// How long the upstream takes to answer; Redis stops halfway through.
const UPSTREAM: Duration = Duration::from_millis(800);
/// Requests per outage.
const KEYS: u32 = 20;

pub async fn run() -> Report {
    let redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let ledger = Ledger::start(Faults { first_delay: UPSTREAM, ..Faults::default() }).await;
    let routes = route("orders", "/orders", &format!("lease = \"{}s\"", LEASE.as_secs()));
    let gateway = GatewayProc::start(&gateway_toml(&redis.url(), ledger.addr, &unique("blip"), &routes));
    let client = gateway.client();
    let mut requests = 0;
    let mut outages = Vec::new();
    for down in [Duration::from_millis(500), Duration::from_millis(1500), Duration::from_secs(3)] {
        let keys: Vec<String> = (0..KEYS).map(|n| format!("\"blip-{}-{n}\"", down.as_millis())).collect();
        let mut first = JoinSet::new();
        for (n, key) in keys.iter().enumerate() {
            let (client, key) = (client.clone(), key.clone());
            first.spawn(async move { (post(&client, "/orders", &key, &order(n as u32)).await, key) });
        }
        // Every claim is made (Redis answers within milliseconds); the upstream is still busy.
        tokio::time::sleep(UPSTREAM / 2).await;
        redis.stop();
        tokio::time::sleep(down).await;
        redis.restart();
        for (reply, key) in first.join_all().await {
            let reply = reply.unwrap_or_else(|e| panic!("{key}: {e}"));
            assert_eq!(reply.status, 201, "{key}: the client gets the upstream's answer at once: {reply:?}");
        }
        // Past the lease of every claim: a key left claimed could now be taken over and run.
        tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
        let mut replays = 0;
        for (n, key) in keys.iter().enumerate() {
            let retry = post(&client, "/orders", key, &order(n as u32)).await.unwrap_or_else(|e| panic!("{key}: {e}"));
            assert_eq!(retry.status, 201, "{key}: {retry:?}\n{}", gateway.log());
            assert!(retry.is_replay(), "{key}: the retry ran again instead of replaying\n{}", gateway.log());
            assert_eq!(ledger.arrivals(key), 1, "{key}: ran {} times", ledger.arrivals(key));
            replays += 1;
        }
        requests += 2 * KEYS;
        outages.push(format!("{:.1}s: {replays}/{KEYS} replayed", down.as_secs_f64()));
    }
    assert_eq!(ledger.keys_over(1), vec![], "no key ran twice");
    let totals = ledger.totals();
    Report {
        requests,
        executions: totals.arrivals,
        caught: totals.backstop_hits,
        errors: 0,
        note: format!("Redis down while the upstream answered, lease 5s: {}", outages.join(", ")),
    }
}
