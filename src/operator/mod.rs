//! What an operator does to held keys, in one place for the admin listener, the command line
//! and the tests: inspect a key, release it, settle it with an answer, list the keys that need
//! an operator (`service`); the answer an operator gives, checked so that no answer can break
//! a replay's framing (`answer`); the documents the admin API answers with, which the
//! command line reads (`wire`); and the audit trail every change is written to (`audit`).
//!
//! The HTTP side (routes, authorisation, problem documents) is `admin`'s; the rules are here.

mod answer;
pub mod audit;
mod service;
pub mod wire;

pub use self::answer::{AnswerError, parse_answer, refused_header};
pub(crate) use self::service::{Keys, Refusal};
pub use crate::headers::has_no_body;
