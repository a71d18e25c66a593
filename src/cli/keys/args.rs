//! The flags of `idemgate keys` and its subcommands.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use idemgate::store::State;

use super::client::{AdminUrl, parse_admin_url};
use super::input::{parse_answer_header, parse_scope_hash};

pub(super) const ENV_HELP: &str = "\
Environment:
  IDEMGATE_ADMIN_TOKEN     the admin token (server.admin_token), sent as
                           Authorization: Bearer <token>; required with --admin
                           (with --config, the file's token is used)
  IDEMGATE_SCOPE_<NAME>    a scope header of the caller whose key it is, sent as
                           Scope-<Name> (NAME upper-cased, '-' as '_'), e.g.
                           IDEMGATE_SCOPE_AUTHORIZATION='Bearer alice' or
                           IDEMGATE_SCOPE_COOKIE='session=abc'
  SSL_CERT_FILE            CA bundle for an https:// admin URL (default: the system's)

Scope values are credentials: they are read from the environment or, with --scope-stdin,
from standard input (lines 'Name: value'), never from the command line.

Exit status: 0 done, 1 the admin listener refused or could not be reached, 2 unusable input.";

/// The `keys` command line.
#[derive(Args)]
#[command(after_help = ENV_HELP)]
pub struct KeysArgs {
    // Boxed: the flags are large next to the other commands', which would all pay for them.
    #[command(subcommand)]
    pub(super) action: Box<Action>,
}

#[derive(Subcommand)]
pub(super) enum Action {
    /// List a route's records in one state, following the pages up to --max records.
    #[command(after_help = ENV_HELP)]
    List(ListArgs),
    /// Show the record of one key.
    #[command(after_help = ENV_HELP)]
    Show(TargetArgs),
    /// Record the answer of an unknown (or executed) key: its retries get that answer.
    #[command(after_help = ENV_HELP)]
    Resolve(ResolveArgs),
    /// Release the record of one key: the next request with the key runs upstream again.
    /// A key a running request holds is refused unless --force.
    #[command(after_help = ENV_HELP)]
    Release(ReleaseArgs),
}

impl Action {
    /// Where the action's admin listener is.
    pub(super) fn admin(&self) -> &AdminArgs {
        match self {
            Action::List(args) => &args.admin,
            Action::Show(target) => &target.admin,
            Action::Resolve(args) => &args.target.admin,
            Action::Release(args) => &args.target.admin,
        }
    }
}

#[derive(Args)]
pub(super) struct ReleaseArgs {
    #[command(flatten)]
    pub(super) target: TargetArgs,
    /// Release the key even while a request holds it. That request may be running upstream
    /// now, and a retry would then run it a second time beside it: only when you know it is
    /// not running (its gateway is gone, and the upstream never saw it).
    #[arg(long)]
    pub(super) force: bool,
}

/// Where the admin listener is, and how to print its answers.
#[derive(Args)]
pub(super) struct AdminArgs {
    #[command(flatten)]
    pub(super) target: Target,
    /// Print the admin API's JSON documents (for scripts) instead of a table.
    #[arg(long)]
    pub(super) json: bool,
}

/// The admin listener: `--admin` or `--config`, one of them; a call without either names
/// both (a new user reaches for `--config`, which `report` takes too).
#[derive(Args)]
#[group(id = "target", required = true, multiple = false)]
pub(super) struct Target {
    /// The admin listener's base URL, e.g. http://127.0.0.1:9090 (http or https).
    #[arg(long, value_name = "URL", value_parser = parse_admin_url)]
    pub(super) admin: Option<AdminUrl>,
    /// Read the admin listener's address (server.admin_listen; 0.0.0.0 and [::] mean this
    /// machine) and its token (server.admin_token or the variable admin_token_env names) from
    /// this configuration file. Without it, no file is read.
    #[arg(long, short, value_name = "PATH")]
    pub(super) config: Option<PathBuf>,
}

#[derive(Args)]
pub(super) struct ListArgs {
    #[command(flatten)]
    pub(super) admin: AdminArgs,
    /// The idempotent route's name.
    #[arg(long, value_name = "R")]
    pub(super) route: String,
    /// Which records to list.
    #[arg(long, value_name = "S", value_enum, default_value_t = ListState::Unknown)]
    pub(super) state: ListState,
    /// Stop after this many records; stderr then says that more exist.
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) max: u32,
    /// Continue a listing where an earlier one stopped (the cursor it printed).
    #[arg(long, value_name = "C")]
    pub(super) cursor: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
pub(super) enum ListState {
    /// Sent upstream without a complete answer: retries get 502 outcome-unknown until the key
    /// is resolved or released.
    Unknown,
    /// Ran upstream; its answer's body was not stored.
    Executed,
}

impl ListState {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            ListState::Unknown => State::Unknown,
            ListState::Executed => State::Executed,
        }
        .name()
    }
}

/// One key of one route, and the caller whose key it is.
#[derive(Args)]
pub(super) struct TargetArgs {
    #[command(flatten)]
    pub(super) admin: AdminArgs,
    /// The idempotent route's name.
    #[arg(long, value_name = "R")]
    pub(super) route: String,
    /// The idempotency key, as the client's header carried it (a key that is not a token is
    /// quoted there: --key '"a b"').
    #[arg(long, value_name = "K")]
    pub(super) key: String,
    #[command(flatten)]
    pub(super) scope: ScopeArgs,
}

#[derive(Args)]
pub(super) struct ScopeArgs {
    /// Read the caller's scope headers from standard input, one 'Name: value' a line
    /// (blank lines and lines starting with # are skipped), in addition to IDEMGATE_SCOPE_*.
    #[arg(long)]
    pub(super) scope_stdin: bool,
    /// The caller's scope as its digest (64 hex digits) instead of its headers.
    #[arg(long, value_name = "HEX", value_parser = parse_scope_hash, conflicts_with = "scope_stdin")]
    pub(super) scope_hash: Option<String>,
    /// The host the request was sent to, on a route that serves several hosts and keeps keys
    /// per host (a scope hash already holds it).
    #[arg(long, value_name = "HOST", conflicts_with = "scope_hash")]
    pub(super) host: Option<String>,
}

#[derive(Args)]
pub(super) struct ResolveArgs {
    #[command(flatten)]
    pub(super) target: TargetArgs,
    /// The status code retries get.
    #[arg(long, value_name = "CODE", value_parser = clap::value_parser!(u16).range(200..=599))]
    pub(super) status: u16,
    /// A header of the answer, 'Name: value'; repeat for more (a repeated name keeps every value).
    #[arg(long = "header", value_name = "NAME: VALUE", value_parser = parse_answer_header)]
    pub(super) headers: Vec<(String, String)>,
    /// The answer's body, UTF-8 text (default: empty).
    #[arg(long, value_name = "TEXT", group = "answer_body")]
    pub(super) body: Option<String>,
    /// Read the answer's body from a file ('-': standard input); it must be UTF-8 text.
    #[arg(long, value_name = "PATH", group = "answer_body")]
    pub(super) body_file: Option<PathBuf>,
}
