//! What [`Lookups`](crate::store::Lookups) of unknown outcomes speak.

use std::time::Duration;

use super::record::StoredResponse;

/// What starting a lookup of an unknown record found (see [`Lookups::lookup`](crate::store::Lookups::lookup)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The lookup is this caller's; `attempt` executions may have reached the upstream.
    Started {
        /// Executions that may have reached the upstream.
        attempt: u32,
    },
    /// Another lookup holds the key for `left` more at most; its end wakes a [`Watch`](crate::store::Watch).
    Busy {
        /// Time left on that lookup's lease.
        left: Duration,
    },
    /// The record is no longer unknown (or is another request's): claim it again to see.
    Moved,
}

/// What a lookup learned, to be written to its record.
#[derive(Debug, Clone, Copy)]
pub enum LookupEnd<'a> {
    /// The upstream has the request's answer: the record becomes completed with it, kept for
    /// `retention`.
    Found {
        /// The answer to replay.
        response: &'a StoredResponse,
        /// How long it is replayed.
        retention: Duration,
    },
    /// The upstream says the request never ran: released (as the next attempt) if that can
    /// be trusted by now, with a tombstone kept for `ttl`.
    NotFound {
        /// How long the released tombstone is kept.
        ttl: Duration,
    },
    /// No usable answer: the record stays unknown, free for the next lookup.
    Failed,
}

/// The result of ending a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupEnded {
    /// The record was written.
    Done,
    /// "Not found" cannot be trusted for `left` more (the upstream may still be running the
    /// request); the record stays unknown, free for the next lookup.
    TooEarly {
        /// Time until it can be trusted.
        left: Duration,
    },
    /// The lookup was no longer this caller's (an operator settled the key, or its lease
    /// passed and another lookup took over); nothing was written.
    Lost,
}
