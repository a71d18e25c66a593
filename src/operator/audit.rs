//! The audit trail: every change an operator asks for through the admin API — made, refused
//! or failed in the store, or refused for the caller's role — is one log line under the
//! target `idemgate::audit` and one entry in the store's trail, which every gateway on the
//! store shares (`GET /audit`), so an operator on gateway B sees what was done through
//! gateway A.
//!
//! An entry says who (the token's name and role), what (the action), where (the route, and
//! the record as every log line names it: the short hash of its name, never the client's key,
//! scope or body, as docs/security.md promises), the record's state before and after as the
//! store's own reply said, from which address, when, through which gateway, the status
//! answered and what came of it. Calls without a valid token are only logged: a stranger's
//! flood must not push the operators' entries out of a capped trail.

use std::net::IpAddr;
use std::sync::OnceLock;
use std::time::SystemTime;

use serde::Serialize;

use crate::config::{AdminRole, AuditRetention};
use crate::runtime::Runtime;
use crate::store::Audit as _;

/// Who calls: the name and role of the token presented, and the address the call came from.
#[derive(Debug, Clone)]
pub struct Actor {
    /// The token's name (`"admin"` for `server.admin_token`).
    pub name: String,
    /// The token's role.
    pub role: AdminRole,
    /// The admin client's address.
    pub from: IpAddr,
}

/// What came of a call, in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The change was made.
    Done,
    /// Nothing was there to change.
    Nothing,
    /// The record's state did not allow it (409).
    Conflict,
    /// The token's role does not allow it (403).
    Forbidden,
    /// The request was not one the store could be asked (400).
    BadRequest,
    /// The store or the file failed; nothing is known to have changed.
    Failed,
}

/// One entry of the trail, as written to the store and read back by `GET /audit`. Fields in
/// alphabetical order, as the admin API's other documents.
#[derive(Debug, Serialize)]
pub struct Entry<'a> {
    /// `resolve`, `release`, `forced-release` or `reload`.
    pub action: &'a str,
    /// The record's state after the call, when the call names a record.
    pub after: Option<&'a str>,
    /// When, RFC 3339 in UTC.
    pub at: String,
    /// The record's state before the call, as the store's reply said.
    pub before: Option<&'a str>,
    /// The token's name.
    pub by: &'a str,
    /// What came of it, in words.
    pub detail: &'a str,
    /// The admin client's address.
    pub from: String,
    /// The gateway that served the call (its host name).
    pub gateway: &'static str,
    /// What came of it, in one word.
    pub outcome: Outcome,
    /// The record, as log lines name it (the short hash of its name).
    pub record: Option<&'a str>,
    /// The token's role.
    pub role: &'static str,
    /// The route, when the call names one the configuration has.
    pub route: Option<&'a str>,
    /// The status the call was answered with.
    pub status: u16,
}

/// What one call did, before it is dated and signed with its actor.
pub struct Change<'a> {
    pub action: &'a str,
    pub route: Option<&'a str>,
    pub record: Option<&'a str>,
    pub before: Option<&'a str>,
    pub after: Option<&'a str>,
    pub outcome: Outcome,
    pub status: u16,
    pub detail: &'a str,
}

/// Writes `change` by `actor` to the log and to the store's trail, kept as `retention` says.
/// The change is already made (or refused): a trail the store cannot write to is logged as
/// such, and the call's answer stands.
pub async fn write(rt: &Runtime, retention: AuditRetention, actor: &Actor, change: Change<'_>) {
    let Change { action, route, record, before, after, outcome, status, detail } = change;
    let entry = Entry {
        action,
        after,
        at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        before,
        by: &actor.name,
        detail,
        from: actor.from.to_string(),
        gateway: host_name(),
        outcome,
        record,
        role: actor.role.as_str(),
        route,
        status,
    };
    // The line the log has always had for a key (its fields kept), and one for a reload.
    if action == "reload" {
        tracing::info!(
            target: "idemgate::audit",
            peer = %actor.from,
            by = %actor.name,
            role = actor.role.as_str(),
            action,
            status,
            result = detail,
            "operator reloaded the configuration"
        );
    } else {
        tracing::info!(
            target: "idemgate::audit",
            peer = %actor.from,
            by = %actor.name,
            role = actor.role.as_str(),
            action,
            route = %route.unwrap_or("-"),
            key = record.unwrap_or("-"),
            before = before.unwrap_or("-"),
            after = after.unwrap_or("-"),
            status,
            result = detail,
            "operator changed a key"
        );
    }
    let document = match serde_json::to_string(&entry) {
        Ok(document) => document,
        Err(e) => {
            tracing::error!(error = %e, "audit entry not written to the store: it cannot be encoded");
            return;
        }
    };
    if let Err(e) = rt.audit().append(&document, retention.max_entries, retention.max_age).await {
        tracing::error!(error = %e, action, "audit entry not written to the store (the log line above stands)");
    }
}

/// This host's name, as the audit trail names the gateway; `"-"` where it cannot be read.
fn host_name() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|name| name.trim().chars().filter(|c| c.is_ascii_graphic()).take(253).collect::<String>())
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| "-".to_owned())
    })
}
