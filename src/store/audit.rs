//! The audit trail the store keeps: what operators did through any gateway on it, newest
//! last, capped by count and by age. Each entry is one JSON document the admin API wrote; the
//! store only keeps, orders and pages them.

use std::fmt;

/// Where an entry stands in the trail: the time it was added (ms since the epoch, the store's
/// clock) and its order within that millisecond. Written `MS-SEQ`, as Redis names stream
/// entries; only ids of this form are taken back as a cursor, so a client's cursor can never
/// be read as another range (`+`, `-`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct AuditId {
    /// Milliseconds since the epoch.
    pub ms: u64,
    /// Order within the millisecond.
    pub seq: u64,
}

impl AuditId {
    /// Reads `MS-SEQ` (digits only, each a u64).
    pub fn parse(text: &str) -> Option<Self> {
        let (ms, seq) = text.split_once('-')?;
        let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(ms) || !digits(seq) {
            return None;
        }
        Some(Self { ms: ms.parse().ok()?, seq: seq.parse().ok()? })
    }
}

impl fmt::Display for AuditId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// One entry: its place and the document written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// Its place in the trail.
    pub id: AuditId,
    /// The JSON document, as written.
    pub document: String,
}

/// A page of the trail, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditPage {
    /// The entries.
    pub entries: Vec<AuditEntry>,
    /// The id to ask for older entries from; `None` when the page reached the oldest.
    pub next: Option<AuditId>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ids_of_the_stores_form_are_taken_back() {
        assert_eq!(AuditId::parse("1733412345678-3"), Some(AuditId { ms: 1_733_412_345_678, seq: 3 }));
        assert_eq!(AuditId::parse("1-0").map(|id| id.to_string()).as_deref(), Some("1-0"));
        for hostile in ["+", "-", "(1-0", "1", "1-", "-1", "1-2-3", "1- 2", "a-1", "99999999999999999999999-0", ""] {
            assert_eq!(AuditId::parse(hostile), None, "{hostile:?}");
        }
    }
}
