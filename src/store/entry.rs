//! What the store holds for one key, as [`Records`](crate::store::Records) read it and an
//! [`Operator`](crate::store::Operator) changes it.

use std::time::Duration;

use super::record::StoredResponse;
use super::state::State;

/// What the store holds for one key, for inspection.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The state, with what it holds.
    pub state: EntryState,
    /// Executions that may have reached the upstream so far.
    pub attempt: u32,
    /// Time until the record is dropped.
    pub expires_in: Duration,
    /// Completed: the answer a replay sends; executed: its status and headers (no body).
    /// Read with the record in the same call, so that an operator sees what a retry gets.
    pub answer: Option<StoredResponse>,
}

/// The state of a record, for inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryState {
    /// A claim is open; `lease_left` is zero when it can be taken over.
    InProgress {
        /// Time left on the lease.
        lease_left: Duration,
    },
    /// A response is stored.
    Completed {
        /// The stored status code.
        status: u16,
        /// Size of the stored body.
        body_len: usize,
    },
    /// The request ran; its body was not stored.
    Executed {
        /// The status it answered with.
        status: u16,
    },
    /// The request's outcome is unknown; retries are refused.
    Unknown {
        /// Time left on the lease of the lookup of the key that is running, if one is.
        lookup: Option<Duration>,
        /// How long until a lookup's "not found" is proof that the request never ran (zero:
        /// it is already); `None` when it never will be (a record written without that time).
        trusted_in: Option<Duration>,
    },
    /// Released: the next request runs, as the next attempt.
    Released,
}

impl EntryState {
    /// The state, without what it holds.
    pub fn state(&self) -> State {
        match self {
            Self::InProgress { .. } => State::InProgress,
            Self::Completed { .. } => State::Completed,
            Self::Executed { .. } => State::Executed,
            Self::Unknown { .. } => State::Unknown,
            Self::Released => State::Released,
        }
    }
}

/// The result of an operator's resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// Completed with the operator's answer; the state it had.
    Done {
        /// [`State::Unknown`] or [`State::Executed`].
        was: State,
    },
    /// Nothing changed: the record is in another state, or absent (`None`).
    Refused {
        /// Its state.
        state: Option<State>,
    },
}

/// The result of an operator's purge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purged {
    /// Released; the state it had (any but [`State::Released`]).
    Released {
        /// The state it had.
        was: State,
    },
    /// Not released: a request holds the key, its lease live for `lease_left` (it may be
    /// running upstream now), and the purge was not forced.
    Refused {
        /// Time left on the lease.
        lease_left: Duration,
    },
    /// Nothing to release: no record, or one already released.
    Nothing,
}
