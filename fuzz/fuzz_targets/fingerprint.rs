//! Canonical JSON through the fingerprint: any body under any of the parsed media types is
//! fingerprinted without a panic, and the same body gives the same fingerprint.
#![no_main]

use http::Request;
use idemgate::policy::fingerprint::{self, FingerprintSpec, JsonPointer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let spec = FingerprintSpec {
        ignore: vec![JsonPointer::parse("/client_ts").unwrap(), JsonPointer::parse("/items/0/note").unwrap()],
        headers: vec![],
    };
    for media in ["application/json", "application/merge-patch+json", "application/x-www-form-urlencoded"] {
        let (parts, ()) = Request::post("/orders?b=2&a=1").header("content-type", media).body(()).unwrap().into_parts();
        let a = fingerprint::compute("orders", &spec, &parts, data);
        let b = fingerprint::compute("orders", &spec, &parts, data);
        assert_eq!(a, b);
    }
});
