//! The documents `/keys` answers with, as the gateway writes them and the command line reads
//! them. Fields stand in alphabetical order, the order they have always been written in.

use serde::{Deserialize, Serialize};

use crate::store::{Entry, EntryState, State};

/// What `GET /keys?route=R&key=K` answers (404) for a key the store holds nothing for: the
/// document `{"state": "absent"}`.
pub const ABSENT: &str = "absent";

/// The environment variable `idemgate keys` sends as the caller's `header` (as `Scope-<header>`):
/// `IDEMGATE_SCOPE_` and the name in capitals, `-` as `_` (`x-tenant`: `IDEMGATE_SCOPE_X_TENANT`).
pub fn scope_variable(header: &str) -> String {
    format!("IDEMGATE_SCOPE_{}", header.to_ascii_uppercase().replace('-', "_"))
}

/// `GET /keys?route=R&key=K`: one record, with what its state holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Executions that may have reached the upstream so far.
    pub attempt: u32,
    /// Completed: the size of the stored body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_bytes: Option<usize>,
    /// Time until the record is dropped.
    pub expires_in_ms: u64,
    /// In progress: time left on the lease (zero: it can be taken over).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_left_ms: Option<u64>,
    /// Unknown: whether a lookup of it runs now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookup_in_flight: Option<bool>,
    /// Unknown: time left on the running lookup's lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookup_left_ms: Option<u64>,
    /// Unknown: when a lookup's "not found" becomes proof that the request never ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_found_trusted_in_ms: Option<u64>,
    /// The record's state.
    pub state: State,
    /// Completed or executed: the status answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

impl From<&Entry> for Record {
    fn from(entry: &Entry) -> Self {
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let mut record = Self {
            attempt: entry.attempt,
            body_bytes: None,
            expires_in_ms: ms(entry.expires_in),
            lease_left_ms: None,
            lookup_in_flight: None,
            lookup_left_ms: None,
            not_found_trusted_in_ms: None,
            state: entry.state.state(),
            status: None,
        };
        match entry.state {
            EntryState::InProgress { lease_left } => record.lease_left_ms = Some(ms(lease_left)),
            EntryState::Completed { status, body_len } => {
                record.status = Some(status);
                record.body_bytes = Some(body_len);
            }
            EntryState::Executed { status } => record.status = Some(status),
            EntryState::Unknown { lookup, trusted_in } => {
                record.lookup_in_flight = Some(lookup.is_some());
                record.lookup_left_ms = lookup.map(ms);
                record.not_found_trusted_in_ms = trusted_in.map(ms);
            }
            EntryState::Released => {}
        }
        record
    }
}

/// `DELETE /keys`: whether the key was released, and the state it had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Released {
    /// Whether anything was released (not when the key held nothing, or only a tombstone).
    pub released: bool,
    /// The state it had.
    pub was: Option<State>,
}

/// `PUT /keys`: the key was completed with the operator's answer; the state it had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolved {
    /// Always true in a 200 (a refusal is a 409 problem).
    pub resolved: bool,
    /// [`State::Unknown`] or [`State::Executed`].
    pub was: State,
}

/// `GET /keys?route=R&state=S`: one page of the route's records in state `S`, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Page {
    /// Where the next page starts; `None` on the last.
    pub next_cursor: Option<String>,
    /// The records.
    pub records: Vec<Listed>,
    /// The route.
    pub route: String,
    /// The state listed.
    pub state: State,
}

/// One record of a [`Page`], as the request that made it described it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listed {
    /// Executions that may have reached the upstream so far.
    pub attempt: u32,
    /// The key as a header carries it.
    pub key: String,
    /// The request's method.
    pub method: String,
    /// The request's path and query.
    pub path: String,
    /// The scope's hash, in hex.
    pub scope_hash: String,
    /// How long ago the record entered its state.
    pub since_ms: u64,
    /// The state (the page's).
    pub state: State,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The documents are what clients and scripts parse: byte for byte what the admin API
    /// wrote before they were types.
    #[test]
    fn documents_keep_their_fields_and_order() {
        let unknown = Entry {
            state: EntryState::Unknown { lookup: Some(Duration::from_millis(1500)), trusted_in: None },
            attempt: 2,
            expires_in: Duration::from_secs(60),
            answer: None,
        };
        assert_eq!(
            serde_json::to_string(&Record::from(&unknown)).unwrap(),
            r#"{"attempt":2,"expires_in_ms":60000,"lookup_in_flight":true,"lookup_left_ms":1500,"state":"unknown"}"#
        );
        let completed = Entry {
            state: EntryState::Completed { status: 201, body_len: 14 },
            attempt: 1,
            expires_in: Duration::from_secs(5),
            answer: None,
        };
        assert_eq!(
            serde_json::to_string(&Record::from(&completed)).unwrap(),
            r#"{"attempt":1,"body_bytes":14,"expires_in_ms":5000,"state":"completed","status":201}"#
        );
        let released = Released { released: false, was: None };
        assert_eq!(serde_json::to_string(&released).unwrap(), r#"{"released":false,"was":null}"#);
        let page = Page { next_cursor: None, records: Vec::new(), route: "orders".into(), state: State::Executed };
        let text = serde_json::to_string(&page).unwrap();
        assert_eq!(text, r#"{"next_cursor":null,"records":[],"route":"orders","state":"executed"}"#);
        assert_eq!(serde_json::from_str::<Page>(&text).unwrap(), page);
    }
}
