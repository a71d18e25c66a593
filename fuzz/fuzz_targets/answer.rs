//! The operator's answer (`PUT /keys`): any bytes are read or refused, never a panic; an
//! answer that is taken carries no header a replay never carries (no framing of its own), no
//! body on a status that has none, and a final status.
#![no_main]

use idemgate::operator::{has_no_body, parse_answer, refused_header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(answer) = parse_answer(data, &Default::default()) {
        assert!((200..600).contains(&answer.status.as_u16()), "{:?}", answer.status);
        for name in answer.headers.keys() {
            assert_eq!(refused_header(name), None, "{name} was taken");
        }
        assert!(!has_no_body(answer.status) || answer.body.is_empty());
        // What is taken is stored: it encodes and reads back the same.
        let stored = idemgate::store::StoredResponse::decode(answer.encode()).expect("a taken answer decodes");
        assert_eq!(stored, answer);
    }
});
