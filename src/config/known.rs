//! Every key the configuration file accepts, for the suggestion an unknown key gets ("did
//! you mean `retention`?"). `tests/config_docs.rs` checks the list against the schema in
//! `file.rs`: a key added there and not here fails it.

/// Every key of every table of the file, sorted.
pub const KNOWN_KEYS: &[&str] = &[
    "admin_body_preview",
    "admin_listen",
    "admin_max_connections",
    "admin_tls",
    "admin_token",
    "admin_token_env",
    "admin_tokens",
    "after",
    "answer_status",
    "attempt_header",
    "audit_max_age",
    "audit_max_entries",
    "backend",
    "body",
    "body_read_timeout",
    "ca_file",
    "cert",
    "cert_file",
    "certs",
    "connect_timeout",
    "connections",
    "content_type",
    "eject_after",
    "eject_after_broken",
    "eject_after_gateway_errors",
    "eject_for",
    "errors",
    "exclude_headers",
    "fingerprint_headers",
    "found",
    "h2_keepalive_interval",
    "header",
    "header_read_timeout",
    "headers",
    "headers_env",
    "host",
    "hosts",
    "idempotency",
    "identity",
    "idle_timeout",
    "ignore",
    "key",
    "key_file",
    "key_prefix",
    "lease",
    "listen",
    "log_format",
    "max_bytes",
    "max_connections",
    "max_entries",
    "max_exchanges",
    "max_exchanges_per_connection",
    "max_header_bytes",
    "max_key_len",
    "max_new_keys",
    "max_request_body",
    "max_reset_streams",
    "max_stored_body",
    "method",
    "methods",
    "mode",
    "name",
    "not_found",
    "on_missing_scope",
    "on_store_error",
    "on_unknown_outcome",
    "otlp_endpoint",
    "password_env",
    "path",
    "per_host",
    "previous_fingerprint",
    "problem_base",
    "reconcile",
    "release_after",
    "renew",
    "replay_header",
    "replay_headers",
    "replica_ack_timeout",
    "replica_acks",
    "required",
    "resolve_every",
    "retention",
    "role",
    "routes",
    "sample_ratio",
    "scope",
    "server",
    "service_name",
    "shutdown_grace",
    "status",
    "store",
    "store_statuses",
    "telemetry",
    "timeout",
    "tls",
    "token_env",
    "token_file",
    "trusted_proxies",
    "upstream",
    "upstreams",
    "url",
    "urls",
    "wait",
    "worker_threads",
];

/// The known key `unknown` is most likely a misspelling of: at most two edits away (one for
/// keys of four letters or fewer), the nearest, the first in the list on a tie.
pub fn nearest(unknown: &str) -> Option<&'static str> {
    let allowed = if unknown.chars().count() <= 4 { 1 } else { 2 };
    KNOWN_KEYS
        .iter()
        .map(|known| (distance(unknown, known), *known))
        .filter(|(d, _)| *d <= allowed)
        .min_by_key(|(d, _)| *d)
        .map(|(_, known)| known)
}

/// Edits (insert, delete, replace, swap of neighbours) from `a` to `b`.
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // Keys are short; a key of a kilobyte is no misspelling.
    if a.len() > 64 || b.len() > 64 {
        return usize::MAX;
    }
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_key_finds_the_key_it_meant() {
        assert_eq!(nearest("retension"), Some("retention"));
        assert_eq!(nearest("leas"), Some("lease"));
        assert_eq!(nearest("wiat"), Some("wait"));
        assert_eq!(nearest("max_stored_bdy"), Some("max_stored_body"));
        assert_eq!(nearest("surprise"), None);
        assert_eq!(nearest(&"x".repeat(2000)), None);
        let mut sorted = KNOWN_KEYS.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, KNOWN_KEYS, "kept sorted");
    }
}
