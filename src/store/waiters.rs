//! Local registry of requests waiting for a key to settle.
//!
//! A duplicate that finds its key in flight must wait without polling the store in a loop and
//! without holding a pooled connection. It registers here; whoever learns that the key was
//! completed or released (the memory store directly, the Redis store through its pub/sub
//! subscriber) wakes every waiter of that key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, futures::OwnedNotified};
use tokio::time::Instant;

/// Waiters by record key name.
#[derive(Default)]
pub(crate) struct Waiters {
    map: Mutex<HashMap<String, (Arc<Notify>, usize)>>,
}

impl Waiters {
    /// Registers interest in `key`. `poll` bounds each wait when notifications may be missed
    /// (the Redis subscription is down, or a message was lost).
    pub(crate) fn watch(self: &Arc<Self>, key: &str, poll: Option<Duration>) -> Watch {
        let notify = {
            let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
            let entry = map.entry(key.to_owned()).or_insert_with(|| (Arc::new(Notify::new()), 0));
            entry.1 += 1;
            Arc::clone(&entry.0)
        };
        // Created now, so a notify_waiters() from this moment on is not missed even though the
        // future is first polled later.
        let notified = notify.notified_owned();
        Watch { notified, poll, _registration: Registration { waiters: Arc::clone(self), key: key.to_owned() } }
    }

    /// Wakes every waiter of `key`.
    pub(crate) fn notify(&self, key: &str) {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((notify, _)) = map.get(key) {
            notify.notify_waiters();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// A registered wait for one key; see [`Lifecycle::watch`](super::Lifecycle::watch).
pub struct Watch {
    notified: OwnedNotified,
    poll: Option<Duration>,
    _registration: Registration,
}

impl Watch {
    /// Waits until the key changes, or until `until`, or (for stores whose notifications can
    /// be missed) until the next poll interval, whichever comes first. The caller re-reads the
    /// key afterwards in every case.
    pub async fn changed(self, until: Instant) {
        let until = match self.poll {
            Some(poll) => until.min(Instant::now() + poll),
            None => until,
        };
        let _ = tokio::time::timeout_at(until, self.notified).await;
    }
}

/// Removes the registry entry when the last waiter of a key goes away.
struct Registration {
    waiters: Arc<Waiters>,
    key: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut map = self.waiters.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = map.get_mut(&self.key) {
            entry.1 -= 1;
            if entry.1 == 0 {
                map.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn notify_wakes_a_watch_registered_before_it() {
        let w = Arc::new(Waiters::default());
        let watch = w.watch("k", None);
        w.notify("k");
        let start = Instant::now();
        watch.changed(start + Duration::from_secs(60)).await;
        assert_eq!(Instant::now(), start, "woke at once, not at the deadline");
        assert_eq!(w.len(), 0, "registration removed");
    }

    #[tokio::test(start_paused = true)]
    async fn other_keys_do_not_wake_and_the_deadline_bounds_the_wait() {
        let w = Arc::new(Waiters::default());
        let watch = w.watch("k", None);
        w.notify("other");
        let start = Instant::now();
        watch.changed(start + Duration::from_secs(3)).await;
        assert_eq!(Instant::now() - start, Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn poll_interval_caps_each_wait() {
        let w = Arc::new(Waiters::default());
        let watch = w.watch("k", Some(Duration::from_millis(100)));
        let start = Instant::now();
        watch.changed(start + Duration::from_secs(3)).await;
        assert_eq!(Instant::now() - start, Duration::from_millis(100));
    }

    #[test]
    fn registry_entries_are_shared_and_cleaned_up() {
        let w = Arc::new(Waiters::default());
        let a = w.watch("k", None);
        let b = w.watch("k", None);
        assert_eq!(w.len(), 1);
        drop(a);
        assert_eq!(w.len(), 1);
        drop(b);
        assert_eq!(w.len(), 0);
    }
}
