//! End to end: client → gateway → example order service (SQLite), with a private
//! `redis-server`. Assertions are on the rows in the order service's database.

use crate::support;

use std::time::Duration;

use order_service::Database;
use support::client::{Client, Reply};
use support::gateway::TestGateway;
use support::redis::RedisServer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

struct Stack {
    redis: RedisServer,
    gateway: TestGateway,
    db: Database,
    _dir: tempfile::TempDir,
    _stop_orders: oneshot::Sender<()>,
}

impl Stack {
    async fn start() -> Self {
        let redis = RedisServer::start();
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("orders.db").display());
        let service_db = Database::connect(&url).await.unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let orders = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(order_service::serve(listener, service_db, async move {
            let _ = stopped.await;
        }));
        let gateway = TestGateway::start(&format!(
            r#"
[server]
listen = "127.0.0.1:0"
[store]
backend = "redis"
url = "{redis}"
key_prefix = "{prefix}"
[upstreams.orders]
url = "http://{orders}"
[[routes]]
name = "create-order"
methods = ["POST"]
path = "/orders"
upstream = "orders"
[routes.idempotency]
ignore = ["/client_ts"]
[[routes]]
name = "order-service"
path = "/{{*rest}}"
upstream = "orders"
"#,
            redis = redis.url(),
            prefix = support::unique("e2e"),
        ))
        .await;
        let db = Database::connect(&url).await.unwrap();
        Self { redis, gateway, db, _dir: dir, _stop_orders: stop }
    }

    fn client(&self) -> Client {
        self.gateway.client()
    }

    async fn rows(&self) -> i64 {
        self.db.count_orders().await.unwrap()
    }
}

fn order(user: &str, sku: &str, quantity: u32) -> String {
    format!(r#"{{"user_id":"{user}","sku":"{sku}","quantity":{quantity}}}"#)
}

/// POST /orders as `user`: the order service takes the caller from `Authorization: Bearer`
/// (and refuses a body `user_id` that disagrees); the gateway scopes keys by the same header.
async fn post_order(client: &Client, user: &str, key: Option<&str>, body: &str) -> Reply {
    client.post_json_as("/orders", key, Some(&format!("Bearer {user}")), body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_original_scenario() {
    let stack = Stack::start().await;
    let client = stack.client();

    // First POST creates the order.
    let first = post_order(&client, "u1", Some("\"checkout-1\""), &order("u1", "BOOK-42", 1)).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.json()["status"], "created");
    assert_eq!(stack.rows().await, 1);

    // A client that lost that answer can ask for it through the pass-through route.
    let lookup =
        client.get("/orders/lookup", &[("authorization", "Bearer u1"), ("idempotency-key", "\"checkout-1\"")]).await;
    assert_eq!(lookup.status, 200);
    assert_eq!(lookup.body, first.body);

    // The same POST again: the same body, marked as a replay, no new row.
    let again = post_order(&client, "u1", Some("\"checkout-1\""), &order("u1", "BOOK-42", 1)).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.body, first.body);
    assert!(again.is_replay());
    assert_eq!(again.header("idempotency-backstop"), None, "answered by the gateway, not the backstop");
    assert_eq!(stack.rows().await, 1);

    // The same key with another body.
    let other = post_order(&client, "u1", Some("\"checkout-1\""), &order("u1", "BOOK-42", 5)).await;
    assert_eq!(other.status, 422);
    assert_eq!(stack.rows().await, 1);

    // No key.
    let none = post_order(&client, "u1", None, &order("u1", "BOOK-42", 1)).await;
    assert_eq!(none.status, 400);
    assert_eq!(stack.rows().await, 1);

    // Two concurrent submissions with one key: one order.
    let pen = order("u1", "PEN-7", 3);
    let (a, b) = tokio::join!(
        post_order(&client, "u1", Some("\"checkout-2\""), &pen),
        post_order(&client, "u1", Some("\"checkout-2\""), &pen),
    );
    assert_eq!((a.status.as_u16(), b.status.as_u16()), (201, 201));
    assert_eq!(a.body, b.body);
    assert_eq!(stack.rows().await, 2);

    // The order service's own view, through the pass-through route.
    let stats = client.get("/stats", &[]).await.json();
    assert_eq!(stats["orders"], 2);
    assert_eq!(stats["backstop_hits"], 0, "the gateway caught every duplicate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_flushed_between_two_identical_requests_is_caught_by_the_backstop() {
    let stack = Stack::start().await;
    let client = stack.client();
    let body = order("u2", "LAMP-3", 2);
    let first = post_order(&client, "u2", Some("\"lost-record\""), &body).await;
    assert_eq!(first.status, 201);

    // The gateway's record is gone (Redis restarted without persistence, failover, FLUSHALL).
    let _: () = ::redis::cmd("FLUSHALL").query(&mut stack.redis.connection()).unwrap();

    let retry = post_order(&client, "u2", Some("\"lost-record\""), &body).await;
    assert_eq!(retry.status, 201);
    assert_eq!(retry.body, first.body, "the backstop answers with the original order");
    assert_eq!(retry.header("idempotency-backstop"), Some("hit"));
    assert!(!retry.is_replay(), "the gateway had nothing to replay");
    assert_eq!(stack.rows().await, 1, "one row only");

    // The backstop's answer was stored: the next retry is a gateway replay again.
    let third = post_order(&client, "u2", Some("\"lost-record\""), &body).await;
    assert!(third.is_replay());
    assert_eq!(third.body, first.body);
    let stats = client.get("/stats", &[]).await.json();
    assert_eq!((stats["orders"].as_i64(), stats["backstop_hits"].as_i64()), (Some(1), Some(1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_then_a_different_body_is_refused_by_the_backstop() {
    let stack = Stack::start().await;
    let client = stack.client();
    assert_eq!(post_order(&client, "u3", Some("k"), &order("u3", "MUG", 1)).await.status, 201);
    stack.redis.restart();
    // The gateway reconnects by itself; the backstop sees the key reused with another payload.
    let mut status = 0;
    for _ in 0..100 {
        status = post_order(&client, "u3", Some("k"), &order("u3", "MUG", 4)).await.status.as_u16();
        if status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 422);
    assert_eq!(stack.rows().await, 1);
}
