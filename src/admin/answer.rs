//! A stored answer as `GET /keys?...&include=answer` shows it: what a replay sends, and the
//! start of its body only for an operate token on a route that allows it
//! (`admin_body_preview`): bodies carry customers' data.

use crate::operator::audit::Actor;
use crate::runtime::IdempotentRoute;
use crate::store::StoredResponse;

/// The most of a stored body `include=answer` shows (to an operate token, on a route that
/// allows it): enough to recognise an answer, not a bulk export.
const BODY_PREVIEW: usize = 4096;

/// Whether `actor` may see the start of a stored body on `route`: an operate token, on a
/// route whose configuration allows it (`admin_body_preview`); else the reason why not.
pub(super) fn body_preview_allowed(route: &IdempotentRoute, actor: &Actor) -> Result<(), &'static str> {
    if !route.policy.admin_body_preview {
        return Err("the route does not allow it (admin_body_preview)");
    }
    if actor.role != crate::config::AdminRole::Operate {
        return Err("an operate token is needed");
    }
    Ok(())
}

/// A stored answer as `include=answer` shows it: what a replay sends, its status and headers
/// (every value as text, or as bytes where it is not text), and, where allowed, the start of
/// its body.
pub(super) fn document(answer: &StoredResponse, preview: Result<(), &'static str>) -> serde_json::Value {
    let mut headers = serde_json::Map::new();
    for (name, value) in &answer.headers {
        let text = value.to_str().map_or_else(|_| format!("{:?}", value.as_bytes()), str::to_owned);
        match headers.get_mut(name.as_str()) {
            Some(serde_json::Value::Array(values)) => values.push(text.into()),
            _ => {
                headers.insert(name.as_str().to_owned(), serde_json::Value::Array(vec![text.into()]));
            }
        }
    }
    let mut fields = serde_json::Map::new();
    fields.insert("body_bytes".to_owned(), answer.body.len().into());
    fields.insert("headers".to_owned(), serde_json::Value::Object(headers));
    fields.insert("status".to_owned(), answer.status.as_u16().into());
    match preview {
        Err(why) => {
            fields.insert("body_preview_withheld".to_owned(), why.into());
        }
        Ok(()) => {
            let body = answer.body.to_bytes();
            let shown = &body[..body.len().min(BODY_PREVIEW)];
            // Cut at a character's boundary; a body that is not text is shown as base64.
            let text = match std::str::from_utf8(shown) {
                Ok(text) => Some(text),
                Err(e) if e.error_len().is_none() => std::str::from_utf8(&shown[..e.valid_up_to()]).ok(),
                Err(_) => None,
            };
            match text {
                Some(text) => {
                    fields.insert("body_preview".to_owned(), text.into());
                    fields.insert("body_preview_encoding".to_owned(), "utf-8".into());
                }
                None => {
                    fields.insert("body_preview".to_owned(), base64(shown).into());
                    fields.insert("body_preview_encoding".to_owned(), "base64".into());
                }
            }
            fields.insert("body_preview_truncated".to_owned(), (body.len() > BODY_PREVIEW).into());
        }
    }
    serde_json::Value::Object(fields)
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue, header};

    use super::*;

    #[test]
    fn a_preview_is_text_cut_at_a_character_or_base64() {
        assert_eq!(
            (base64(b"Man"), base64(b"Ma"), base64(b"M"), base64(b"")),
            ("TWFu".into(), "TWE=".into(), "TQ==".into(), String::new())
        );
        let answer = |body: Vec<u8>| StoredResponse {
            status: http::StatusCode::CREATED,
            headers: HeaderMap::from_iter([(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"))]),
            body: body.into(),
        };
        // 4095 bytes, then a two-byte character across the cut: the preview stops before it.
        let mut text = "a".repeat(BODY_PREVIEW - 1).into_bytes();
        text.extend_from_slice("é and more".as_bytes());
        let doc = document(&answer(text), Ok(()));
        assert_eq!(doc["body_preview"].as_str().map(str::len), Some(BODY_PREVIEW - 1));
        assert_eq!(
            (doc["body_preview_encoding"].as_str(), doc["body_preview_truncated"].as_bool()),
            (Some("utf-8"), Some(true))
        );
        assert_eq!(doc["headers"]["content-type"], serde_json::json!(["text/plain"]));
        let doc = document(&answer(vec![0xff, 0xfe, 0x00]), Ok(()));
        assert_eq!(
            (doc["body_preview"].as_str(), doc["body_preview_encoding"].as_str()),
            (Some("//4A"), Some("base64"))
        );
        let doc = document(&answer(b"secret".to_vec()), Err("an operate token is needed"));
        assert!(doc.get("body_preview").is_none() && doc["body_preview_withheld"] == "an operate token is needed");
        assert_eq!(doc["body_bytes"], 6);
    }
}
