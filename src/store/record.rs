//! The stored form of an upstream response.
//!
//! Records are read on every replay, so the encoding is a flat binary layout read without
//! parsing text or copying the body:
//!
//! ```text
//! u8 version (1) | u16 status | u16 header count
//! per header: u16 name length | name | u32 value length | value
//! body: the rest of the record
//! ```

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use thiserror::Error;

use crate::body::Payload;

const VERSION: u8 = 1;

/// An upstream response as kept for replay.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    /// Status code.
    pub status: StatusCode,
    /// Headers, already filtered of anything that must not be replayed.
    pub headers: HeaderMap,
    /// Body, exactly as the upstream sent it.
    pub body: Payload,
}

/// Why stored bytes could not be read back as a response.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RecordError {
    /// The record was cut short.
    #[error("record truncated")]
    Truncated,
    /// The record was written by an unknown encoding version.
    #[error("unknown record version {0}")]
    Version(u8),
    /// A field holds an invalid value.
    #[error("invalid {0} in record")]
    Invalid(&'static str),
}

impl StoredResponse {
    /// Encodes the response for the store.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(self.encoded_len()).writer();
        // Writing into memory cannot fail.
        let _ = self.write_encoded(&mut out);
        out.into_inner().freeze()
    }

    /// Writes the encoding to `out`, so that a caller with its own buffer (a Redis command)
    /// gets the body copied once, straight into it.
    pub fn write_encoded(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        // The length fields bound what fits (65535 headers, 64 KiB names); hyper's own header
        // limits are far below that, so the filter only guards the format's invariants.
        let fits = |(k, v): &(&HeaderName, &HeaderValue)| {
            k.as_str().len() <= usize::from(u16::MAX) && u32::try_from(v.len()).is_ok()
        };
        let count = self.headers.iter().filter(fits).take(usize::from(u16::MAX)).count();
        out.write_all(&[VERSION])?;
        out.write_all(&self.status.as_u16().to_be_bytes())?;
        out.write_all(&(count as u16).to_be_bytes())?;
        for (name, value) in self.headers.iter().filter(fits).take(count) {
            out.write_all(&(name.as_str().len() as u16).to_be_bytes())?;
            out.write_all(name.as_str().as_bytes())?;
            out.write_all(&(value.len() as u32).to_be_bytes())?;
            out.write_all(value.as_bytes())?;
        }
        for piece in self.body.pieces() {
            out.write_all(piece)?;
        }
        Ok(())
    }

    /// The length of [`StoredResponse::encode`]'s bytes, to size a buffer before writing.
    pub fn encoded_len(&self) -> usize {
        let header_bytes: usize = self.headers.iter().map(|(k, v)| 6 + k.as_str().len() + v.len()).sum();
        5 + header_bytes + self.body.len()
    }

    /// Decodes a stored record; the body shares `bytes` without copying.
    pub fn decode(bytes: Bytes) -> Result<Self, RecordError> {
        let mut r = Reader { bytes, pos: 0 };
        match r.u8()? {
            VERSION => {}
            other => return Err(RecordError::Version(other)),
        }
        // An informational status is no final answer: replayed, the client would wait for
        // another, and take the connection's next response for it.
        let status = StatusCode::from_u16(r.u16()?)
            .ok()
            .filter(|s| !s.is_informational())
            .ok_or(RecordError::Invalid("status"))?;
        let count = r.u16()?;
        // The count comes from stored bytes: it sizes nothing until each header has been read.
        let mut headers = HeaderMap::new();
        for _ in 0..count {
            let len = usize::from(r.u16()?);
            let name = HeaderName::from_bytes(&r.take(len)?).map_err(|_| RecordError::Invalid("header name"))?;
            let len = r.u32()? as usize;
            let value =
                HeaderValue::from_maybe_shared(r.take(len)?).map_err(|_| RecordError::Invalid("header value"))?;
            headers.try_append(name, value).map_err(|_| RecordError::Invalid("header count"))?;
        }
        let body = r.bytes.slice(r.pos..).into();
        Ok(Self { status, headers, body })
    }

    /// The same response in one allocation of its own.
    ///
    /// Bodies and header values read from the network are slices of the connection's read
    /// buffer, and keep all of it alive: a store that kept them as they are would hold
    /// kilobytes per record where the response is a few hundred bytes.
    pub fn compact(&self) -> Self {
        Self::decode(self.encode()).unwrap_or_else(|_| self.clone())
    }

    /// Bytes this response occupies in a store, for size accounting.
    pub fn weight(&self) -> usize {
        self.body.len() + self.headers.iter().map(|(k, v)| k.as_str().len() + v.len()).sum::<usize>()
    }
}

struct Reader {
    bytes: Bytes,
    pos: usize,
}

impl Reader {
    fn take(&mut self, n: usize) -> Result<Bytes, RecordError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or(RecordError::Truncated)?;
        let out = self.bytes.slice(self.pos..end);
        self.pos = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, RecordError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, RecordError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StoredResponse {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-multi", HeaderValue::from_static("a"));
        headers.append("x-multi", HeaderValue::from_static("b"));
        headers.insert("x-bytes", HeaderValue::from_bytes(b"\xffopaque").unwrap());
        StoredResponse {
            status: StatusCode::CREATED,
            headers,
            body: Bytes::from_static(b"{\"order_id\":1}\x00\xff").into(),
        }
    }

    #[test]
    fn round_trips_status_headers_and_body_exactly() {
        let r = sample();
        assert_eq!(StoredResponse::decode(r.encode()).unwrap(), r);
    }

    #[test]
    fn compact_copies_keep_everything() {
        let r = sample();
        let c = r.compact();
        assert_eq!(c, r);
        assert_ne!(c.body.to_bytes().as_ptr(), r.body.to_bytes().as_ptr(), "the body was copied");
    }

    #[test]
    fn a_body_in_pieces_is_encoded_as_one_and_equals_it() {
        let pieces = vec![Bytes::from_static(b"{\"order"), Bytes::new(), Bytes::from_static(b"_id\":1}\x00\xff")];
        let r = StoredResponse { body: Payload::from_pieces(pieces), ..sample() };
        assert_eq!(r.body.pieces().count(), 2, "empty pieces are left out");
        assert_eq!(r, sample(), "equal whatever the cut");
        assert_eq!(r.encode(), sample().encode());
        assert_eq!(StoredResponse::decode(r.encode()).unwrap(), r);
        assert_ne!(r.body, Payload::from(&b"{\"order_id\":1}\x00\xfe"[..]));
        assert_eq!(r.body.to_bytes(), Bytes::from_static(b"{\"order_id\":1}\x00\xff"));
    }

    #[test]
    fn empty_response_round_trips() {
        let r = StoredResponse { status: StatusCode::NO_CONTENT, headers: HeaderMap::new(), body: Payload::default() };
        assert_eq!(StoredResponse::decode(r.encode()).unwrap(), r);
    }

    #[test]
    fn a_huge_header_count_is_an_error_not_a_panic() {
        // Version, status 200, 65535 headers, then nothing.
        let bytes = Bytes::from_static(&[1, 0, 200, 0xff, 0xff]);
        assert_eq!(StoredResponse::decode(bytes), Err(RecordError::Truncated));
    }

    #[test]
    fn truncated_or_foreign_records_are_errors_not_panics() {
        let full = sample().encode();
        // Cuts inside the fixed part and the headers fail; a cut inside the body cannot be told
        // apart from a shorter body, which is why the store never truncates values.
        let body_start = full.len() - sample().body.len();
        for cut in 0..body_start {
            assert!(StoredResponse::decode(full.slice(..cut)).is_err(), "cut at {cut}");
        }
        let mut foreign = full.to_vec();
        foreign[0] = 9;
        assert_eq!(StoredResponse::decode(foreign.into()), Err(RecordError::Version(9)));
        let mut bad_status = full.to_vec();
        bad_status[1..3].copy_from_slice(&1000u16.to_be_bytes());
        assert_eq!(StoredResponse::decode(bad_status.into()), Err(RecordError::Invalid("status")));
        // Not a final answer: replayed, the client would take the next response for its own.
        let mut interim = full.to_vec();
        interim[1..3].copy_from_slice(&101u16.to_be_bytes());
        assert_eq!(StoredResponse::decode(interim.into()), Err(RecordError::Invalid("status")));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn response() -> impl Strategy<Value = StoredResponse> {
            (
                200u16..600,
                proptest::collection::vec(
                    ("[a-z][a-z0-9-]{0,12}", proptest::collection::vec(0x20u8..0x7f, 0..40)),
                    0..8,
                ),
                proptest::collection::vec(any::<u8>(), 0..300),
            )
                .prop_map(|(status, headers, body)| {
                    let mut map = HeaderMap::new();
                    for (name, value) in headers {
                        map.append(
                            HeaderName::from_bytes(name.as_bytes()).unwrap(),
                            HeaderValue::from_bytes(&value).unwrap(),
                        );
                    }
                    StoredResponse { status: StatusCode::from_u16(status).unwrap(), headers: map, body: body.into() }
                })
        }

        proptest! {
            #[test]
            fn every_response_round_trips(r in response()) {
                prop_assert_eq!(StoredResponse::decode(r.encode()).unwrap(), r);
            }

            /// Whatever a store hands back, decoding answers; it never panics (the fuzzer once
            /// found a header count that made `HeaderMap::with_capacity` panic).
            #[test]
            fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
                let _ = StoredResponse::decode(bytes.into());
            }
        }
    }
}
