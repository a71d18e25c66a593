//! Who may call the admin API (`admin_token`, `[[server.admin_tokens]]`) and what the audit
//! trail keeps (`server.audit_max_entries`, `server.audit_max_age`): the part of `[server]` a
//! reload applies to the admin listener.

use std::time::Duration;

/// What an admin token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminRole {
    /// Everything that only looks: the console's views, `GET /keys`, `GET /routes`,
    /// `GET /audit`.
    Read,
    /// Also what changes things: `PUT` and `DELETE /keys`, `POST /reload`.
    Operate,
}

impl AdminRole {
    /// Parses `"read"` or `"operate"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "read" => Ok(Self::Read),
            "operate" => Ok(Self::Operate),
            other => Err(format!("{other:?} is neither \"read\" nor \"operate\"")),
        }
    }

    /// As the configuration and the audit trail write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Operate => "operate",
        }
    }
}

/// One admin token: who holds it, what it may do, and the secret itself (never printed).
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken {
    /// Its holder, as the audit trail names them.
    pub name: String,
    /// What it may do.
    pub role: AdminRole,
    /// The token, trimmed.
    pub secret: String,
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminToken").field("name", &self.name).field("role", &self.role).finish_non_exhaustive()
    }
}

/// Who may call the admin API, and what its audit trail keeps: the part of `[server]` a
/// reload applies to the admin listener (tokens added or revoked without a restart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminAccess {
    /// Every admin token with its name and role: `admin_token` as the operate token
    /// `"admin"`, then `[[server.admin_tokens]]` in file order.
    pub tokens: Vec<AdminToken>,
    /// What the audit trail keeps.
    pub audit: AuditRetention,
}

/// What the audit trail keeps (`server.audit_max_entries`, `server.audit_max_age`): an entry
/// goes once either says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditRetention {
    /// Entries kept at most.
    pub max_entries: u64,
    /// Age past which an entry goes.
    pub max_age: Duration,
}
