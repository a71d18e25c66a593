//! Settle notifications: one subscription per gateway to its settle channel, fanned out to
//! the local waiters.
//!
//! The subscription goes to the primary (one node, or the one Sentinel names, moving with it
//! on a failover) or to any node of a Cluster, where a PUBLISH on one node reaches the
//! subscribers of all. Delivery is at-most-once; waiters also re-read their key at a bounded
//! interval, shorter while the subscription is down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;

use super::links::Links;
use crate::store::waiters::Waiters;

/// How long making the subscription may take before the next server is tried.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Keeps one subscription to `channel` alive and wakes local waiters.
pub(super) async fn subscribe(links: Links, channel: String, waiters: Arc<Waiters>, subscribed: Arc<AtomicBool>) {
    let mut changes = links.changes();
    let mut backoff = Duration::from_millis(100);
    let mut turn = 0usize;
    // Whether the subscription is down since it was last said (one WARN per outage, not one
    // per try: a store that stays down for minutes is tried every few seconds).
    let mut lost = false;
    loop {
        changes.borrow_and_update();
        let clients = links.notify_clients();
        if let Some(client) = clients.get(turn % clients.len().max(1)) {
            // The node tried, for the log: an address, never credentials.
            let node = client.get_connection_info().addr().to_string();
            let opened = tokio::time::timeout(SUBSCRIBE_TIMEOUT, async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(&channel).await.map(|()| pubsub)
            });
            match opened.await {
                Ok(Ok(pubsub)) => {
                    subscribed.store(true, Ordering::Release);
                    if std::mem::take(&mut lost) {
                        tracing::info!(node, channel, "store notifications subscribed again");
                    }
                    backoff = Duration::from_millis(100);
                    let mut messages = pubsub.into_on_message();
                    let moved = loop {
                        tokio::select! {
                            message = messages.next() => match message {
                                Some(msg) => {
                                    if let Ok(key) = std::str::from_utf8(msg.get_payload_bytes()) {
                                        waiters.notify(key);
                                    }
                                }
                                None => break false,
                            },
                            _ = changes.changed() => break true,
                        }
                    };
                    subscribed.store(false, Ordering::Release);
                    if moved {
                        // The store's links lead to a new primary: subscribe there at once.
                        continue;
                    }
                    tracing::warn!(
                        node,
                        channel,
                        "store notification subscription lost; waiters poll until it is back"
                    );
                    lost = true;
                }
                Ok(Err(e)) if !lost => {
                    tracing::warn!(node, error = %e, "cannot subscribe to store notifications; waiters poll until it is back");
                    lost = true;
                }
                Ok(Err(e)) => tracing::debug!(node, error = %e, "cannot subscribe to store notifications"),
                Err(_) if !lost => {
                    tracing::warn!(node, "subscribing to store notifications timed out; waiters poll until it is back");
                    lost = true;
                }
                Err(_) => tracing::debug!(node, "subscribing to store notifications timed out"),
            }
            turn = turn.wrapping_add(1);
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            _ = changes.changed() => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
