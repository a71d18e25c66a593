//! The embedded store: one process, same semantics as Redis (see `engine`); an operator's
//! calls and the index of held records in `operator`.

mod audit;
mod engine;
mod operator;

pub use self::engine::MemoryStore;
