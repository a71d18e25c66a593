//! Demo faults: failures a demo can ask for, to show what the gateway does about them.
//!
//! Off unless the service runs with [`Options::demo_faults`] (the binary's `--demo-faults`);
//! without it the request header is ignored like any other unknown header.
//!
//! The one fault, `X-Demo-Fault: drop-answer` on `POST /orders`, lets the order be made as
//! usual and then loses the answer on its way back: the response head goes out with the
//! full body's `Content-Length`, part of the body follows, and then the connection is closed.
//! A client (or a gateway) sees a 201 whose body never completes: it cannot know from the
//! answer whether the order was made, which is what `GET /orders/lookup` is for.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_LENGTH;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;
use futures_util::StreamExt;
use futures_util::stream;

/// The request header that asks for a fault.
pub const FAULT_HEADER: HeaderName = HeaderName::from_static("x-demo-fault");

/// The value of [`FAULT_HEADER`] that drops the answer to a create.
pub const DROP_ANSWER: &str = "drop-answer";

/// How long the broken answer waits between its first bytes and the break, so that the head
/// and those bytes are on the wire before the connection goes.
const BREAK_AFTER: Duration = Duration::from_millis(50);

/// What the service does beyond serving orders. Everything here is off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Honour `X-Demo-Fault` on `POST /orders` (the binary's `--demo-faults`).
    pub demo_faults: bool,
}

/// The fault a request asks for, if faults are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Make the order, then break the answer off.
    DropAnswer,
}

impl Options {
    /// The fault `headers` ask for: `X-Demo-Fault: drop-answer` (the value's case and the
    /// spaces around it do not matter). Other values, and everything when faults are off,
    /// ask for none.
    pub fn fault(&self, headers: &HeaderMap) -> Option<Fault> {
        if !self.demo_faults {
            return None;
        }
        let asks = headers
            .get_all(FAULT_HEADER)
            .iter()
            .any(|value| value.to_str().is_ok_and(|value| value.trim().eq_ignore_ascii_case(DROP_ANSWER)));
        asks.then_some(Fault::DropAnswer)
    }
}

/// `response` with its body broken off: the same status and headers, a `Content-Length` of
/// the whole body, the first half of the body, then an error that makes the server close the
/// connection.
pub async fn drop_answer(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    // The bodies this applies to are a few dozen bytes, built in memory: reading one cannot fail.
    let whole = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
    parts.headers.insert(CONTENT_LENGTH, HeaderValue::from(whole.len()));
    let sent = whole.slice(..whole.len() / 2);
    let head = stream::iter([Ok::<Bytes, std::io::Error>(sent)]);
    let broken = stream::once(async {
        // Waiting here lets the server flush what it has before the error tears it down.
        tokio::time::sleep(BREAK_AFTER).await;
        Err(std::io::Error::other("demo fault: the answer is dropped"))
    });
    Response::from_parts(parts, Body::from_stream(head.chain(broken)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for value in values {
            map.append(FAULT_HEADER, HeaderValue::from_str(value).expect("header value"));
        }
        map
    }

    #[test]
    fn only_drop_answer_with_faults_on_asks_for_a_fault() {
        let on = Options { demo_faults: true };
        for asks in [&["drop-answer"][..], &["DROP-ANSWER"], &["  drop-answer "], &["other", "drop-answer"]] {
            assert_eq!(on.fault(&headers(asks)), Some(Fault::DropAnswer), "{asks:?}");
        }
        for not in [&[][..], &[""], &["drop"], &["drop-answer-now"], &["drop-answer, other"]] {
            assert_eq!(on.fault(&headers(not)), None, "{not:?}");
        }
    }

    #[test]
    fn faults_are_off_by_default() {
        assert_eq!(Options::default().fault(&headers(&["drop-answer"])), None);
    }
}
