//! The instances an upstream balances its requests over: fixed by the configuration, or
//! the addresses its name resolved to last.

use std::ops::Deref;
use std::sync::Arc;

use super::instance::Instance;
use super::resolve::Resolved;

/// The instances requests are balanced over.
pub(super) enum Members {
    /// `url` or `urls`, for the configuration's life. At least one.
    Fixed(Vec<Arc<Instance>>),
    /// `url` with `resolve_every`: one instance per address its host resolved to last.
    Resolved(Arc<Resolved>),
}

/// The instances one request is balanced over, held until it is done with them: a resolved
/// set may be replaced meanwhile, and the indexes a request has tried refer to this one.
pub(super) enum Set<'a> {
    Fixed(&'a [Arc<Instance>]),
    Resolved(Arc<Vec<Arc<Instance>>>),
}

impl Deref for Set<'_> {
    type Target = [Arc<Instance>];

    fn deref(&self) -> &Self::Target {
        match self {
            Set::Fixed(list) => list,
            Set::Resolved(list) => list,
        }
    }
}
