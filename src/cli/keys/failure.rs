//! Why a command of `idemgate keys` failed, which decides its exit status.

/// Why a command failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// What the operator gave cannot be used (flags, environment, input): exit 2.
    Usage(String),
    /// The admin listener refused, answered nonsense, or could not be reached: exit 1.
    Failed(String),
}
