//! The key parser: any header bytes are read or refused, never a panic; a key read once reads
//! the same when sent again quoted.
#![no_main]

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

const H: HeaderName = HeaderName::from_static("idempotency-key");

fuzz_target!(|data: &[u8]| {
    let Ok(value) = HeaderValue::from_bytes(data) else { return };
    let mut headers = HeaderMap::new();
    headers.insert(H, value);
    if let Ok(Some(key)) = idemgate::policy::key::extract(&headers, &H, 8192) {
        let quoted = format!("\"{}\"", key.as_str().replace('\\', "\\\\").replace('"', "\\\""));
        headers.insert(H, HeaderValue::from_str(&quoted).expect("printable ASCII"));
        let again = idemgate::policy::key::extract(&headers, &H, 8192).expect("a quoted key reads");
        assert_eq!(again.map(|k| k.as_str().to_owned()).as_deref(), Some(key.as_str()));
    }
});
