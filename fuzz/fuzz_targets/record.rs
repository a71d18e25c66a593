//! The record codec: any bytes decode or fail cleanly; whatever decodes encodes back to a
//! record that decodes to the same response.
#![no_main]

use bytes::Bytes;
use idemgate::store::StoredResponse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(response) = StoredResponse::decode(Bytes::copy_from_slice(data)) {
        let again = StoredResponse::decode(response.encode()).expect("an encoded record decodes");
        assert_eq!(again, response);
    }
});
