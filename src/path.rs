//! Path normalisation, before routing.
//!
//! The hazard: routing sees the path as written, the upstream as it understands it. If
//! `//orders`, `/./orders`, `/x/../orders` or `/%6frders` miss the idempotent `/orders` route
//! (a catch-all takes them) while the upstream treats them as `/orders`, every retry spelled
//! that way runs again. So the path is normalised the way RFC 3986 §6.2.2 describes, and the
//! normalised path is both what the router matches and what the upstream receives:
//!
//! 1. percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded, and the hex
//!    digits of every other percent-encoding are upper-cased (`%2f` → `%2F`; an encoded `/`
//!    stays encoded, since decoding it would change the segments); a `%` that starts no
//!    encoding is written `%25`, so that decoding cannot make a new one (`/%%66a` would turn
//!    into `/%fa`, which the next reader takes for an encoded byte);
//! 2. runs of `/` are merged into one (not in RFC 3986, but what most servers do);
//! 3. `.` and `..` segments are removed (RFC 3986 §5.2.4); `..` never climbs above `/`.
//!
//! A trailing slash is kept as sent; the router matches `/orders/` to the route of `/orders`.

use std::borrow::Cow;

use http::uri::PathAndQuery;
use http::{Request, Uri};

/// The normalised form of `path`; borrowed when it is already normal (the common case).
pub fn normalize(path: &str) -> Cow<'_, str> {
    if !path.starts_with('/') || is_normal(path) {
        return Cow::Borrowed(path);
    }
    let decoded = decode_unreserved(path);
    Cow::Owned(remove_dot_segments(&decoded))
}

/// Whether `path` needs no change: no `%`, no `//`, no `.` or `..` segment. One pass over
/// the bytes: every request's path goes through here.
fn is_normal(path: &str) -> bool {
    // The length of the current segment while it is only dots (0 after a `/`), or past 2.
    let mut dots = 0u8;
    let mut after_slash = false;
    for &b in path.as_bytes() {
        match b {
            b'%' => return false,
            b'/' => {
                if after_slash || dots == 1 || dots == 2 {
                    return false;
                }
                after_slash = true;
                dots = 0;
            }
            b'.' if after_slash || (1..=2).contains(&dots) => {
                after_slash = false;
                dots += 1;
            }
            _ => {
                after_slash = false;
                dots = 3;
            }
        }
    }
    dots != 1 && dots != 2
}

fn decode_unreserved(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (bytes.get(i + 1).and_then(hex), bytes.get(i + 2).and_then(hex))
        {
            let c = hi << 4 | lo;
            if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
                out.push(char::from(c));
            } else {
                out.push('%');
                out.push(char::from(bytes[i + 1].to_ascii_uppercase()));
                out.push(char::from(bytes[i + 2].to_ascii_uppercase()));
            }
            i += 3;
            continue;
        }
        if bytes[i] == b'%' {
            out.push_str("%25");
            i += 1;
            continue;
        }
        // Everything else is copied as is: `path` is a valid &str, and only ASCII was consumed
        // above, so copying char by char keeps it valid.
        let len = utf8_len(bytes[i]);
        out.push_str(&path[i..i + len]);
        i += len;
    }
    out
}

fn hex(b: &u8) -> Option<u8> {
    char::from(*b).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

fn utf8_len(first: u8) -> usize {
    match first {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    }
}

/// RFC 3986 §5.2.4 on an absolute path, with empty segments (`//`) merged away.
fn remove_dot_segments(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    let mut trailing_slash = false;
    for segment in path.split('/').skip(1) {
        trailing_slash = false;
        match segment {
            "" => trailing_slash = true,
            "." => trailing_slash = true,
            ".." => {
                segments.pop();
                trailing_slash = true;
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    if trailing_slash || out.is_empty() {
        out.push('/');
    }
    out
}

/// Replaces the request's path by its normal form (see [`normalize`]), which the router matches and
/// the upstream receives, so that no spelling of a path reaches another route than its own.
pub fn normalize_request<B>(request: &mut Request<B>) {
    let Cow::Owned(normal) = normalize(request.uri().path()) else { return };
    let target = match request.uri().query() {
        Some(query) => format!("{normal}?{query}"),
        None => normal,
    };
    let mut parts = request.uri().clone().into_parts();
    // A normalised path of a valid path is valid: it only loses characters or decodes
    // unreserved ones. Should parsing fail anyway, the request keeps its original path.
    if let Ok(pq) = target.parse::<PathAndQuery>() {
        parts.path_and_query = Some(pq);
        if let Ok(uri) = Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_spelling_of_a_path_becomes_one() {
        for spelling in ["/orders", "//orders", "/./orders", "/x/../orders", "/%6frders", "/%6Frders", "/x/./../orders"]
        {
            assert_eq!(normalize(spelling), "/orders", "{spelling}");
        }
        assert_eq!(normalize("/orders/"), "/orders/");
        assert_eq!(normalize("/orders//"), "/orders/");
        assert_eq!(normalize("/orders/."), "/orders/");
        assert_eq!(normalize("/../../orders"), "/orders");
        assert_eq!(normalize("/%2e%2e/admin"), "/admin");
        assert_eq!(normalize("/a/.."), "/");
        assert_eq!(normalize("/"), "/");
        assert_eq!(normalize("*"), "*");
    }

    #[test]
    fn reserved_encodings_stay_encoded_with_upper_case_hex() {
        assert_eq!(normalize("/files/a%2fb"), "/files/a%2Fb");
        assert_eq!(normalize("/files/a%20b"), "/files/a%20b");
        assert_eq!(normalize("/files/%zz"), "/files/%25zz");
        assert_eq!(normalize("/files/100%"), "/files/100%25");
        // Found by the fuzzer: decoding must not assemble a new encoding from a stray '%'.
        assert_eq!(normalize("/%%66a"), "/%25fa");
        assert_eq!(normalize(&normalize("/%%66a")), "/%25fa");
        assert_eq!(normalize("/caf%C3%A9/%c3%a9"), "/caf%C3%A9/%C3%A9");
    }

    #[test]
    fn normal_paths_are_borrowed() {
        assert!(matches!(normalize("/orders/42/items"), Cow::Borrowed(_)));
        assert!(matches!(normalize("/orders/"), Cow::Borrowed(_)));
    }

    proptest! {
        /// Never panics, always yields an absolute path without `//`, `.` or `..` segments, and
        /// normalising twice changes nothing.
        #[test]
        fn normalisation_is_total_and_idempotent(path in "/[a-zA-Z0-9%./_~-]{0,40}") {
            let once = normalize(&path).into_owned();
            prop_assert!(once.starts_with('/'));
            prop_assert!(!once.contains("//"), "{once}");
            prop_assert!(!once.split('/').any(|s| s == "." || s == ".."), "{once}");
            prop_assert_eq!(normalize(&once).into_owned(), once.clone());
        }

        /// The one-pass check says what the plain definition says.
        #[test]
        fn the_normal_check_matches_its_definition(path in "/[a./%b]{0,12}") {
            let defined = !path.contains('%') && !path.contains("//")
                && !path.split('/').any(|segment| segment == "." || segment == "..");
            prop_assert_eq!(is_normal(&path), defined, "{}", path);
        }

        /// Any path made of unreserved characters, percent-encoded byte by byte, comes back as
        /// itself.
        #[test]
        fn encoded_unreserved_decodes_to_itself(segments in proptest::collection::vec("[a-zA-Z0-9_~-]{1,8}", 1..5)) {
            let plain = format!("/{}", segments.join("/"));
            let encoded: String = plain.bytes().map(|b| if b == b'/' { "/".to_owned() } else { format!("%{b:02x}") }).collect();
            prop_assert_eq!(normalize(&encoded).into_owned(), plain);
        }
    }
}
