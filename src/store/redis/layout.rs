//! A record as Redis holds it: one string, so that the common claim is one native command
//! (`SET key value NX GET PX ttl`) and a replay is served from that command's reply.
//!
//! | bytes (1-based, as the Lua scripts index them) | field |
//! |---|---|
//! | 1 | state: its letter (`State::letter`): `p` in progress, `c` completed, `x` executed (body not stored), `u` outcome unknown, `r` released |
//! | 2 | `1` when a duplicate waits (the settle then publishes), else `0` |
//! | 3..=12 | attempt, 10 decimal digits |
//! | 13..=25 | lease mark, 13 decimal digits: the record's PTTL at which the lease ends (`p` only) |
//! | 26..=57 | request fingerprint (zeros in a released tombstone) |
//! | 58..=73 | owner token: the claim's (`p`); the one whose settle wrote the record (`c`, `x`; zeros when a lookup or an operator did); a lookup's (`u`, zeros when none runs); zeros otherwise |
//! | 74.. | the stored response (`c`: whole; `x`: status and headers); `u`: when it became unknown and when "not found" can be trusted (see `lua/lookup.lua`), then the owner whose settle made it unknown |
//!
//! An unknown record (`u`) uses the lease mark and the owner for the lookup that may be
//! running on it (zeros when none is).
//!
//! The lease lives while PTTL > mark, so lease and record share Redis's own expiry clock and
//! no field holds a wall-clock time: a gateway's clock never matters, and the native claim can
//! write the mark (`ttl - lease`) without knowing Redis's time. The Lua scripts in `lua/`
//! read and write the same layout through `lua/record.lua`, which starts each of them.

use bytes::Bytes;

use crate::policy::fingerprint::Fingerprint;
use crate::store::error::StoreError;
use crate::store::names::OwnerToken;
use crate::store::state::State;

/// Bytes before the stored response.
pub(super) const HEADER: usize = 73;
const FINGERPRINT: std::ops::Range<usize> = 25..57;

/// A record read from Redis.
pub(super) struct Record {
    pub state: State,
    pub attempt: u32,
    value: Bytes,
}

impl Record {
    /// Reads `value`; an error names what does not fit the layout.
    pub fn parse(value: Bytes) -> Result<Self, StoreError> {
        if value.len() < HEADER {
            return Err(StoreError::Protocol(format!("a record of {} bytes (at least {HEADER})", value.len())));
        }
        let state = State::from_letter(value[0])
            .ok_or_else(|| StoreError::Protocol(format!("a record in state {:?}", char::from(value[0]))))?;
        let attempt = std::str::from_utf8(&value[2..12])
            .ok()
            .and_then(|digits| digits.parse().ok())
            .ok_or_else(|| StoreError::Protocol("a record whose attempt is not a number".into()))?;
        Ok(Self { state, attempt, value })
    }

    /// Whether the record was made for a request with `fingerprint`.
    pub fn fingerprint_is(&self, fingerprint: &Fingerprint) -> bool {
        self.value[FINGERPRINT] == fingerprint.as_bytes()[..]
    }

    /// The stored response's bytes, sharing the value's buffer.
    pub fn response(&self) -> Bytes {
        self.value.slice(HEADER..)
    }
}

/// A new claim's record: in progress, nobody waiting, `attempt`, the lease ending `lease_ms`
/// into a record that lives `ttl_ms` (at least `lease_ms`).
pub(super) fn claim(
    attempt: u32,
    ttl_ms: u64,
    lease_ms: u64,
    fingerprint: &Fingerprint,
    owner: &OwnerToken,
) -> Vec<u8> {
    use std::io::Write as _;
    let mut value = Vec::with_capacity(HEADER);
    // Writing to a Vec cannot fail.
    let _ = write!(value, "p0{attempt:010}{:013}", ttl_ms.saturating_sub(lease_ms));
    value.extend_from_slice(fingerprint.as_bytes());
    value.extend_from_slice(owner.as_bytes());
    value
}

/// What an unknown record keeps after its header: its PTTL when it was settled (`retention`),
/// how long after that a lookup's "not found" can be trusted, and the owner whose settle made
/// it unknown (the owner field is a lookup's while one runs; see `lua/settle.lua`).
pub(super) fn unknown_tail(retention_ms: u64, trusted_in_ms: u64, owner: &OwnerToken) -> Vec<u8> {
    let mut tail = format!("{retention_ms:013}{trusted_in_ms:013}").into_bytes();
    tail.extend_from_slice(owner.as_bytes());
    tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_reads_back_as_written() {
        let fp = Fingerprint::from_bytes([7; 32]);
        let value = claim(3, 60_000, 10_000, &fp, &OwnerToken::generate());
        assert_eq!(value.len(), HEADER);
        assert_eq!(&value[..25], b"p000000000030000000050000");
        let record = Record::parse(Bytes::from(value)).unwrap();
        assert_eq!((record.state, record.attempt), (State::InProgress, 3));
        assert!(record.fingerprint_is(&fp));
        assert!(!record.fingerprint_is(&Fingerprint::from_bytes([8; 32])));
        assert!(record.response().is_empty());
    }

    #[test]
    fn values_that_do_not_fit_the_layout_are_errors() {
        for value in [&b"p0"[..], &[b'z'; HEADER][..], &[b'p'; HEADER][..]] {
            assert!(Record::parse(Bytes::copy_from_slice(value)).is_err(), "{value:?}");
        }
    }
}
