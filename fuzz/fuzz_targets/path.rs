//! The path normaliser: any path is normalised without a panic, to an absolute path without
//! `//`, `.` or `..` segments, and normalising twice changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = format!("/{text}");
    let once = idemgate::normalize_path(&path).into_owned();
    assert!(once.starts_with('/'));
    assert!(!once.contains("//"), "{once}");
    assert!(!once.split('/').any(|s| s == "." || s == ".."), "{once}");
    assert_eq!(idemgate::normalize_path(&once), once.as_str());
});
