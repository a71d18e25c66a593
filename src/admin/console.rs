//! `/console/`: the operator's console, one page over the admin API, its three files embedded
//! in the binary (no build step, no CDN, nothing fetched at run time).
//!
//! The page holds no data: it loads without a token, and every call it makes is an admin API
//! call the typed token authorises. What it shows comes from clients and the configuration,
//! so it is put on the page as text only, and every admin answer carries a policy that lets
//! nothing but the console's own files run (see [`secure`]).

use http::{HeaderMap, HeaderValue, Response, StatusCode, header};

use crate::body::{self, Body};

const INDEX: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");

/// The Content-Security-Policy of every admin answer: the console's own script and style,
/// calls to this listener only, never framed, no inline script or style, no forms sent
/// elsewhere. A JSON document opened as a page runs nothing either.
const POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
                      object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The answer for `path` under `/console`, if it is one of the console's files.
pub(super) fn file(path: &str) -> Option<Response<Body>> {
    let (text, content_type) = match path {
        "/console" => {
            // The page's relative links need the trailing slash.
            let mut r = Response::new(body::full(""));
            *r.status_mut() = StatusCode::PERMANENT_REDIRECT;
            r.headers_mut().insert(header::LOCATION, HeaderValue::from_static("/console/"));
            return Some(r);
        }
        "/console/" | "/console/index.html" => (INDEX, "text/html; charset=utf-8"),
        "/console/console.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "/console/console.css" => (STYLE, "text/css; charset=utf-8"),
        _ => return None,
    };
    let mut r = Response::new(body::full(text));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The files change with the binary: always asked for again.
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Some(r)
}

/// The headers every admin answer carries, the console's and the API's alike: the policy
/// above, no sniffing a JSON body into a script, no referrer, no framing, no window shared
/// with another site.
pub(super) fn secure(headers: &mut HeaderMap) {
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert("cross-origin-opener-policy", HeaderValue::from_static("same-origin"));
    headers.insert("cross-origin-resource-policy", HeaderValue::from_static("same-origin"));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page runs under a policy without inline script: it must hold none, nor inline
    /// handlers or styles, or the browser refuses them and the console does nothing.
    #[test]
    fn the_page_holds_no_inline_script_or_style() {
        let lower = INDEX.to_ascii_lowercase();
        for inline in ["<script>", "<style", " style=", " onclick=", " onload=", " onsubmit=", "javascript:"] {
            assert!(!lower.contains(inline), "index.html holds {inline}");
        }
        assert!(lower.contains("<script src=\"console.js\" defer></script>"));
        // Built with text only: no HTML from data.
        for sink in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"] {
            assert!(!SCRIPT.contains(sink), "console.js uses {sink}");
        }
        assert!(SCRIPT.contains("sessionStorage") && SCRIPT.contains("'idemgate.token'"));
        assert!(!SCRIPT.contains("localStorage") && !SCRIPT.contains("document.cookie"));
    }

    #[test]
    fn only_the_consoles_files_are_served() {
        for path in ["/console/", "/console/index.html", "/console/console.js", "/console/console.css"] {
            let r = file(path).unwrap_or_else(|| panic!("{path} not served"));
            assert_eq!(r.status(), StatusCode::OK);
        }
        assert_eq!(file("/console").map(|r| r.status()), Some(StatusCode::PERMANENT_REDIRECT));
        for path in ["/console/../admin", "/console/x.js", "/console/console.js/", "/consoles/"] {
            assert!(file(path).is_none(), "{path} served");
        }
    }
}
