//! The API's own OpenAPI document: routes made from its operations (`idemgate routes
//! --from-openapi`), what a configuration leaves of them unprotected (`idemgate check
//! --openapi`), and the gateway's contract written back into it (`idemgate openapi`).
//!
//! The document is read as a tree, not into a typed model: OpenAPI 3.0 and 3.1 differ in
//! their schemas, the typed crates each read one of them, and a report must name the place
//! of what it found in the document's own terms.

mod contract;
mod coverage;
mod document;
mod node;
mod operations;
mod overlay;
mod routes;

pub use coverage::{Coverage, coverage};
pub use document::{Document, Format, MOST_BYTES, OpenApiError};
pub use node::Node;
pub use operations::{KeyParameter, Operation, Scope, operations};
pub use overlay::{Target, merge, overlay, skeleton, targets_in, targets_of_routes};
pub use routes::{Block, Options, block, merged, standalone};
