//! The store's names: of a record, of a budget of new keys, and of a claim's owner. Record and
//! budget names are what Redis holds, pinned by a test: a change would orphan every record.

use sha2::{Digest, Sha256};

use crate::policy::key::IdempotencyKey;
use crate::policy::scope::Scope;

/// The store's name for one (route, scope, key): a hash, so that client input never lands in
/// a Redis key name (no injection, no steering of cluster hash slots).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordKey(pub(super) String);

impl RecordKey {
    /// Names the record of `key` sent by `scope` to `route`.
    pub fn new(prefix: &str, route: &str, scope: &Scope, key: &IdempotencyKey) -> Self {
        let mut h = Sha256::new();
        h.update(b"idemgate-record-v1\0");
        for part in [route.as_bytes(), scope.as_bytes(), key.as_str().as_bytes()] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
        // `s:`, a record held as one string; earlier versions kept hashes under `r:`, which
        // this version neither reads nor trips over (a string command on a hash would fail).
        Self(hashed_name(prefix, ":s:", &h.finalize()))
    }

    /// The name as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A short form for logs: enough to correlate, too little to be a key name.
    pub fn short(&self) -> &str {
        let hash = self.0.rsplit(':').next().unwrap_or(&self.0);
        &hash[..hash.len().min(12)]
    }
}

/// `{prefix}{kind}{hash in hex}`, in one allocation of the right size (`format!` over
/// `hex::encode` costs a `char` iterator, then formatting).
fn hashed_name(prefix: &str, kind: &str, hash: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut name = String::with_capacity(prefix.len() + kind.len() + 2 * hash.len());
    name.push_str(prefix);
    name.push_str(kind);
    for &b in hash {
        name.push(char::from(DIGITS[usize::from(b >> 4)]));
        name.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    name
}

/// The store's name for one budget of new keys: a route and a caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QuotaKey(pub(super) String);

impl QuotaKey {
    /// Names the budget of `scope` on `route`.
    pub fn new(prefix: &str, route: &str, scope: &Scope) -> Self {
        let mut h = Sha256::new();
        h.update(b"idemgate-quota-v1\0");
        h.update((route.len() as u64).to_be_bytes());
        h.update(route.as_bytes());
        h.update(scope.as_bytes());
        Self(hashed_name(prefix, ":q:", &h.finalize()))
    }

    /// The name as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A random token naming the owner of one claim.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct OwnerToken([u8; 16]);

impl OwnerToken {
    /// A fresh random token, made before the claim call that uses it.
    pub fn generate() -> Self {
        Self(rand::random())
    }

    pub(super) fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl std::fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OwnerToken({})", hex::encode(&self.0[..4]))
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderName, HeaderValue};

    use super::*;
    use crate::policy::key;

    /// Record and budget names are what Redis holds: a change to them would orphan every
    /// record stored before it. These were computed independently (SHA-256 over the same
    /// length-prefixed parts) and match what earlier versions wrote.
    #[test]
    fn record_and_budget_names_are_pinned() {
        let header = HeaderName::from_static("idempotency-key");
        let mut headers = HeaderMap::new();
        headers.insert(&header, HeaderValue::from_static("order-1234"));
        let key = key::extract(&headers, &header, 255).unwrap().unwrap();
        let scope = Scope::from_hex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f").unwrap();
        let record = RecordKey::new("app", "orders", &scope, &key);
        assert_eq!(record.as_str(), "app:s:a93d6ca578a5ecb796e80e15a17f7df2a74ab5f07c4e437d40c097c1ff0a0780");
        assert_eq!(record.short(), "a93d6ca578a5");
        assert_eq!(
            QuotaKey::new("app", "orders", &scope).as_str(),
            "app:q:6ec303631d1347e7a293fab359ffaa01a301ee914f3b308fb85af243fa83f69e"
        );
    }

    #[test]
    fn the_short_form_of_any_name_is_its_last_part() {
        assert_eq!(RecordKey("idem:s:0123456789abcdef".into()).short(), "0123456789ab");
        assert_eq!(RecordKey("plain".into()).short(), "plain");
        let tail = format!("{}:{}", "a".repeat(40), "b".repeat(23));
        assert_eq!(RecordKey(format!("p:{tail}")).short(), "bbbbbbbbbbbb", "the part after the last ':'");
    }
}
