//! Hearing the Sentinels' `+switch-master` announcements, one listener task per Sentinel.
//!
//! A listener that cannot reach its Sentinel says so once per outage and tries again with
//! backoff: the follower's own checks cover the gap.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::config::Address;

/// A `+switch-master` announcement: the primary moved from `old` to `new`.
pub(super) struct Switch {
    pub old: Address,
    pub new: Address,
}

/// Aborts the announcement listeners when the follower stops.
pub(super) struct Listeners(pub Vec<JoinHandle<()>>);

impl Drop for Listeners {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Listens to one Sentinel's `+switch-master` announcements (`NAME OLD_IP OLD_PORT NEW_IP
/// NEW_PORT`) and passes on those of `master`.
pub(super) async fn listen(sentinel: redis::Client, master: String, announced: mpsc::Sender<Switch>) {
    let mut backoff = Duration::from_millis(100);
    let mut warned = false;
    loop {
        let opened = tokio::time::timeout(Duration::from_secs(5), async {
            let mut pubsub = sentinel.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await.map(|()| pubsub)
        });
        match opened.await {
            Ok(Ok(pubsub)) => {
                backoff = Duration::from_millis(100);
                warned = false;
                let mut messages = pubsub.into_on_message();
                while let Some(message) = futures_util::StreamExt::next(&mut messages).await {
                    let Ok(text) = std::str::from_utf8(message.get_payload_bytes()) else { continue };
                    if let Some(switch) = parse_switch(text, &master) {
                        let _ = announced.send(switch).await;
                    }
                }
            }
            // Said once per outage: the follower's own checks cover the gap.
            failed if !warned => {
                warned = true;
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_owned(),
                };
                tracing::warn!(sentinel = %sentinel.get_connection_info().addr(), error, "cannot hear this Sentinel's failover announcements");
            }
            _ => {}
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

fn parse_switch(text: &str, master: &str) -> Option<Switch> {
    let fields: Vec<&str> = text.split(' ').collect();
    let [name, old_host, old_port, new_host, new_port] = fields[..] else { return None };
    if name != master {
        return None;
    }
    Some(Switch {
        old: Address { host: old_host.to_owned(), port: old_port.parse().ok()? },
        new: Address { host: new_host.to_owned(), port: new_port.parse().ok()? },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switch_announcements_of_other_masters_are_ignored() {
        let switch = parse_switch("orders 10.0.0.1 6379 10.0.0.2 6380", "orders").unwrap();
        assert_eq!(switch.old, Address { host: "10.0.0.1".into(), port: 6379 });
        assert_eq!(switch.new, Address { host: "10.0.0.2".into(), port: 6380 });
        assert!(parse_switch("billing 10.0.0.1 6379 10.0.0.2 6380", "orders").is_none());
        assert!(parse_switch("orders 10.0.0.1 6379", "orders").is_none());
    }
}
