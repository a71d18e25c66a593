//! Defaults, in one place so that docs/configuration.md can be checked against them.

use std::time::Duration;

pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(8);
pub const LOG_FORMAT: &str = "pretty";
pub const ON_STORE_ERROR: &str = "fail-closed";
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub const MAX_CONNECTIONS: usize = 10_000;
pub const ADMIN_MAX_CONNECTIONS: usize = 64;
pub const MAX_HEADER_BYTES: u64 = 64 << 10;
pub const MAX_EXCHANGES: usize = 4096;
pub const MAX_EXCHANGES_PER_CONNECTION: usize = 100;
pub const MAX_RESET_STREAMS: usize = 100;
pub const H2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// The admin token `gateway.toml` shows as an example: anyone who has read it knows it.
pub const SAMPLE_ADMIN_TOKEN: &str = "change-me-to-a-long-random-string";
/// The name `admin_token` holds in the audit trail, beside `[[server.admin_tokens]]`.
pub const ADMIN_TOKEN_NAME: &str = "admin";
/// `server.audit_max_entries`: months of a busy team's changes, a few MB of Redis memory.
pub const AUDIT_MAX_ENTRIES: u64 = 10_000;
/// `server.audit_max_age`.
pub const AUDIT_MAX_AGE: Duration = Duration::from_secs(90 * 24 * 3600);
pub const PROBLEM_BASE: &str = "https://github.com/idemgate/idemgate/blob/main/docs/errors.md#";
pub const STORE_TIMEOUT: Duration = Duration::from_secs(1);
/// One multiplexed connection pipelines every concurrent call into shared writes; more
/// split those batches (more syscalls on both ends) and add no parallelism to a Redis
/// that runs commands on one thread.
pub const CONNECTIONS: usize = 1;
/// `[store] replica_ack_timeout`: long enough for a replica on the same network to
/// acknowledge under load, short enough that a client refused for want of replicas hears it
/// well within its own timeout.
pub const REPLICA_ACK_TIMEOUT: Duration = Duration::from_millis(500);
pub const KEY_PREFIX: &str = "idemgate";
pub const MAX_ENTRIES: usize = 100_000;
pub const MAX_BYTES: u64 = 256 << 20;
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Connect failures running that leave an instance out of the balance.
pub const EJECT_AFTER: u32 = 3;
/// Exchanges running that broke before any answer (reset, closed) that leave an instance out.
pub const EJECT_AFTER_BROKEN: u32 = 5;
/// 502, 503 and 504 answers running that leave an instance out (Envoy's
/// `consecutive_gateway_failure` default).
pub const EJECT_AFTER_GATEWAY_ERRORS: u32 = 5;
/// How long an instance is left out the first time; doubled while it keeps failing.
pub const EJECT_FOR: Duration = Duration::from_secs(5);
/// The longest an instance is left out.
pub const EJECT_MAX: Duration = Duration::from_secs(300);
/// Most instances one upstream takes (listed, or resolved from its name).
pub const MAX_INSTANCES: usize = 64;
/// The shortest and longest `resolve_every`: a name is looked up at most once a second, and
/// at least once an hour.
pub const RESOLVE_MIN: Duration = Duration::from_secs(1);
pub const RESOLVE_MAX: Duration = Duration::from_secs(3600);
pub const KEY_HEADER: &str = "idempotency-key";
pub const MAX_KEY_LEN: usize = 255;
pub const SCOPE: &str = "header:Authorization";
pub const LEASE: Duration = Duration::from_secs(10);
pub const WAIT: Duration = Duration::from_secs(5);
pub const RETENTION: Duration = Duration::from_secs(24 * 3600);
/// What began executing: 2xx, 3xx and 4xx, except the 4xx that mean "not processed" or
/// "try again" (docs/idempotency-policy.md explains each).
pub const STORE_STATUSES: &[&str] = &["2xx", "3xx", "4xx", "!400", "!408", "!409", "!422", "!425", "!429"];
pub const ON_MISSING_SCOPE: &str = "reject";
pub const ON_UNKNOWN_OUTCOME: &str = "hold";
/// `routes.idempotency.mode`: enforce the policy.
pub const MODE: &str = "enforce";
pub const ATTEMPT_HEADER: &str = "idempotency-attempt";
pub const MAX_REQUEST_BODY: u64 = 1 << 20;
pub const MAX_STORED_BODY: u64 = 1 << 20;
pub const REPLAY_HEADER: &str = "idempotent-replay";

/// `[routes.idempotency.reconcile]`: the lookup's method, its answers, and its timing.
pub const RECONCILE_METHOD: &str = "GET";
pub const RECONCILE_FOUND: &[&str] = &["2xx"];
pub const RECONCILE_NOT_FOUND: &[&str] = &["404"];
pub const RECONCILE_AFTER: Duration = Duration::from_secs(1);
pub const RECONCILE_RELEASE_AFTER: Duration = Duration::from_secs(5);
