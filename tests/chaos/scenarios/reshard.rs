//! A Redis Cluster resharded under load: the slots of the keys in flight are held MIGRATING
//! for seconds while their requests are claimed and their answers, small and 20 KiB, are
//! settled; then their keys move and the slots change hands. Every retry after the lease is a
//! replay, and no key runs twice: a large answer whose two-key settle meets ASK or TRYAGAIN
//! falls back to the one-key settle, and the settle keeps trying while the lease lasts.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method};
use idemgate::policy::{key, scope};
use idemgate::store::RecordKey;
use tokio::task::JoinSet;

use crate::common::{Report, gateway_toml, order, route};
use crate::ledger::{Faults, Ledger};
use crate::support::client::{Client, DEFAULT_AUTH, Reply};
use crate::support::cluster::RedisCluster;
use crate::support::gateway_proc::GatewayProc;
use crate::support::unique;

const KEYS: u32 = 120;
/// Answers of this size go through the side-key settle on Redis.
const LARGE: u32 = 20 * 1024;
const LEASE: Duration = Duration::from_secs(5);
/// How long the slots stay MIGRATING.
const MIGRATING: Duration = Duration::from_secs(2);

pub async fn run() -> Report {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0)).await.unwrap();
    let ledger = Ledger::start(Faults { first_delay: Duration::from_millis(300), ..Faults::default() }).await;
    let prefix = unique("reshard");
    let routes = route("orders", "/orders", &format!("lease = \"{}s\"", LEASE.as_secs()));
    let toml = gateway_toml(&cluster.url(), ledger.addr, &prefix, &routes);
    let gateways = [GatewayProc::start(&toml), GatewayProc::start(&toml)];
    let clients = [gateways[0].client(), gateways[1].client()];
    let keys: Vec<String> = (0..KEYS).map(|n| format!("\"reshard-{n}\"")).collect();

    // Every slot these keys' records live in moves to the next primary.
    let primaries = cluster.primary_ports();
    let mut moves: Vec<(u16, u16, u16)> = keys
        .iter()
        .map(|k| {
            let record = record_key(&prefix, k);
            let from = cluster.node_for_key(record.as_str());
            let to = primaries[(primaries.iter().position(|p| *p == from).unwrap() + 1) % primaries.len()];
            (cluster.slot_for_key(record.as_str()), from, to)
        })
        .collect();
    // And every shard's first slot, where its epoch marker lives: the markers move too, and
    // no gateway may take that for a data loss.
    for (i, from) in primaries.iter().enumerate() {
        let to = primaries[(i + 1) % primaries.len()];
        moves.push((cluster.first_slot(*from), *from, to));
    }
    moves.sort_unstable();
    moves.dedup_by_key(|(slot, _, _)| *slot);

    // Half the keys are claimed before the migration begins and settle during it; the other
    // half are claimed and settled while it runs. Odd keys answer 20 KiB.
    let mut first = JoinSet::new();
    let send = |first: &mut JoinSet<(String, Result<Reply, String>)>, range: std::ops::Range<u32>| {
        for n in range {
            let (client, key) = (clients[n as usize % 2].clone(), keys[n as usize].clone());
            first.spawn(async move { (key.clone(), post(&client, &key, n).await) });
        }
    };
    send(&mut first, 0..KEYS / 2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cluster = Arc::new(cluster);
    let moving = Arc::new(moves);
    blocking(&cluster, &moving, RedisCluster::begin_migrations).await;
    send(&mut first, KEYS / 2..KEYS);
    tokio::time::sleep(MIGRATING).await;
    blocking(&cluster, &moving, RedisCluster::finish_migrations).await;
    let moves = moving;
    let mut errors = 0;
    for (key, reply) in first.join_all().await {
        match reply {
            Ok(r) if r.status == 201 => {}
            // Refused before it ran (a claim that met a slot in motion): the client retries.
            Ok(r) if r.status == 503 => errors += 1,
            other => panic!("{key}: {other:?}"),
        }
    }

    // Past every lease: a key left claimed could be taken over now and run again.
    tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
    let mut replays = 0;
    for (n, key) in keys.iter().enumerate() {
        let retry = post(&clients[(n + 1) % 2], key, n as u32).await.unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(retry.status, 201, "{key}: {retry:?}\n{}", { "see log" });
        replays += u32::from(retry.is_replay());
        let attempts = ledger.attempts(key);
        assert!(attempts.len() <= 1, "{key} ran {} times (attempts {attempts:?})", attempts.len());
    }
    assert_eq!(ledger.keys_over(1), vec![], "no key ran twice");
    for gateway in &gateways {
        let metrics = Client::new(gateway.admin).get("/metrics", &[]).await;
        let text = String::from_utf8_lossy(&metrics.body).into_owned();
        assert!(text.contains("idemgate_store_data_loss_total 0"), "a resharding counted as a data loss:\n{text}");
    }
    let moved: Vec<u64> = cluster.primary_ports().iter().map(|port| cluster.dbsize(*port)).collect();
    Report {
        requests: 2 * KEYS,
        executions: ledger.totals().arrivals,
        caught: ledger.totals().backstop_hits,
        errors,
        note: format!(
            "{} slots MIGRATING for {}s under {KEYS} keys (half 20 KiB answers), every shard's first slot among \
             them; {replays} retries replayed, {errors} first tries refused before running; keys per shard \
             after {moved:?}; data loss counted 0",
            moves.len(),
            MIGRATING.as_secs()
        ),
    }
}

/// Runs a fixture step that talks to the nodes synchronously, off the runtime's threads.
async fn blocking(
    cluster: &Arc<RedisCluster>,
    moves: &Arc<Vec<(u16, u16, u16)>>,
    step: fn(&RedisCluster, &[(u16, u16, u16)]),
) {
    let (cluster, moves) = (Arc::clone(cluster), Arc::clone(moves));
    tokio::task::spawn_blocking(move || step(&cluster, &moves)).await.unwrap();
}

async fn post(client: &Client, key: &str, n: u32) -> Result<Reply, String> {
    let size = if n % 2 == 1 { LARGE.to_string() } else { "0".into() };
    let headers = [
        ("content-type", "application/json"),
        ("idempotency-key", key),
        ("authorization", DEFAULT_AUTH),
        ("x-answer-bytes", size.as_str()),
    ];
    client.try_send(Method::POST, "/orders", &headers, order(n)).await
}

/// The gateway's name for `raw` sent by the default caller on route `orders`.
fn record_key(prefix: &str, raw: &str) -> RecordKey {
    let name = http::HeaderName::from_static("idempotency-key");
    let mut headers = HeaderMap::new();
    headers.insert(name.clone(), HeaderValue::from_str(raw).unwrap());
    headers.insert(http::header::AUTHORIZATION, HeaderValue::from_static(DEFAULT_AUTH));
    let k = key::extract(&headers, &name, 255).unwrap().unwrap();
    let source = scope::ScopeSource::parse(&["header:Authorization"]).unwrap();
    let scope = scope::derive(&source, scope::MissingScope::Reject, &headers).unwrap();
    RecordKey::new(prefix, "orders", &scope, &k)
}
