//! The `idemgate` command: serve a config (no command), check one, print its policy, or look
//! after keys through a running gateway's admin listener (`idemgate keys`). Each command
//! offers only the options it uses.
//!
//! The binary is the only place that reads the environment: the log filter (`RUST_LOG`) here,
//! the admin token and a caller's scope in `cli/keys/`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand};
use idemgate::config::{Config, LogFormat};
use idemgate::log_writer::AccessFormat;
use idemgate::{Live, Server, Upstream};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

#[path = "cli/keys/mod.rs"]
mod keys;
#[path = "cli/openapi/mod.rs"]
mod openapi;
#[path = "cli/report/mod.rs"]
mod report;

/// An idempotency gateway: a reverse proxy that runs each keyed request upstream once.
#[derive(Parser)]
#[command(version, about, after_help = SERVE_HELP)]
struct Cli {
    /// Path of the configuration file to serve [default: gateway.toml].
    #[arg(long, short, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Log lines as JSON (one object per line) or for people; overrides `server.log_format`.
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Option<Command>,
}

const SERVE_HELP: &str = "\
Without a command, idemgate serves the configuration file until SIGTERM or SIGINT, which
finish the requests in flight first (server.shutdown_grace; a second signal stops at once).
SIGHUP, or POST /reload on the admin listener, reloads the file without a restart: a bad file
is logged and the running configuration stays.

Examples:
  idemgate --config gateway.toml            serve
  idemgate check --config gateway.toml      validate a file, as before a reload
  idemgate check --config new.toml --running gateway.toml
                                            and say what it does to the records the running
                                            file made (a reload refuses what would rename them)
  idemgate keys list --config gateway.toml --route create-order";

/// The file a command reads.
#[derive(Args)]
struct FileArgs {
    /// Path of the configuration file [default: gateway.toml].
    #[arg(long, short, value_name = "PATH")]
    config: Option<PathBuf>,
}

/// What `check` reads.
#[derive(Args)]
struct CheckArgs {
    /// Path of the configuration file [default: gateway.toml].
    #[arg(long, short, value_name = "PATH")]
    config: Option<PathBuf>,
    /// The configuration that runs now: also say, per route, what changing to --config does
    /// to the records in retention, and fail if it would rename them (as a reload refuses).
    #[arg(long, value_name = "PATH")]
    running: Option<PathBuf>,
    /// With --running: print that comparison as JSON on stdout.
    #[arg(long, requires = "running")]
    json: bool,
    /// The API's OpenAPI document: also say which of its unsafe operations no route
    /// enforcing idempotency covers, which keyed routes match none of its operations, and
    /// where a route reads the declared Idempotency-Key otherwise.
    #[arg(long, value_name = "FILE", conflicts_with = "running")]
    openapi: Option<PathBuf>,
    /// With --openapi: the methods counted as unsafe.
    #[arg(long, value_name = "METHODS", requires = "openapi", value_delimiter = ',', default_value = "POST,PATCH")]
    unsafe_methods: Vec<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the configuration and exit: 0 when valid, 1 with every problem listed.
    Check(CheckArgs),
    /// Print the idempotency policy of every route as Markdown, for the API's clients.
    Policy(FileArgs),
    /// List, show, resolve or release idempotency records through the admin listener.
    Keys(keys::KeysArgs),
    /// What enforcement would change, per route, from running gateways' counters.
    Report(report::ReportArgs),
    /// Print [[routes]] for the operations of an OpenAPI document, or merge them into a file.
    Routes(openapi::RoutesArgs),
    /// Write the gateway's contract into the API's OpenAPI document, or as an Overlay.
    Openapi(openapi::OpenapiArgs),
}

/// The configuration file when none is named.
const DEFAULT_CONFIG: &str = "gateway.toml";

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `--config` before a command names that command's file, as it always has.
    let file = |own: Option<PathBuf>| own.or_else(|| cli.config.clone()).unwrap_or_else(|| DEFAULT_CONFIG.into());
    match cli.command {
        Some(Command::Check(args)) => {
            if cli.log_format.is_some() {
                refuse("check", "prints what it finds and logs nothing: --log-format is for serving");
            }
            let methods = match openapi::methods(&args.unsafe_methods) {
                Ok(methods) => methods,
                Err(why) => refuse("check", &why),
            };
            let openapi = args.openapi.as_deref().map(|spec| (spec, methods.as_slice()));
            check(&file(args.config), args.running.as_deref(), args.json, openapi)
        }
        Some(Command::Policy(args)) => {
            if cli.log_format.is_some() {
                refuse("policy", "prints Markdown and logs nothing: --log-format is for serving");
            }
            match Config::load(&file(args.config)) {
                Ok(config) => {
                    print!("{}", idemgate::policy_markdown(&config.routes));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        // The admin listener is the source of truth here: no configuration file is read
        // unless the action names one (`keys list --config FILE`).
        Some(Command::Keys(args)) => {
            if cli.config.is_some() || cli.log_format.is_some() {
                refuse(
                    "keys",
                    "reads no configuration file unless its action names one (idemgate keys list --config FILE), \
                     and logs nothing: give neither --config nor --log-format before it",
                );
            }
            keys::run(args)
        }
        Some(Command::Report(args)) => {
            if cli.config.is_some() || cli.log_format.is_some() {
                refuse("report", "reads the gateways' counters, no configuration file, and logs nothing");
            }
            report::run(args)
        }
        Some(Command::Routes(_)) if cli.config.is_some() || cli.log_format.is_some() => {
            refuse("routes", "takes its file after it (--config), and logs nothing")
        }
        Some(Command::Routes(args)) => openapi::routes(args),
        Some(Command::Openapi(args)) => {
            if cli.log_format.is_some() {
                refuse("openapi", "prints a document and logs nothing: --log-format is for serving");
            }
            openapi::contract(args, file(None))
        }
        None => serve(&file(None), cli.log_format),
    }
}

/// Ends the process with clap's usage error (exit 2): `command` does not take an option given.
fn refuse(command: &str, why: &str) -> ! {
    Cli::command().error(clap::error::ErrorKind::ArgumentConflict, format!("{command} {why}")).exit()
}

/// Starts logging to stderr: JSON lines, or text (coloured only on a terminal). The filter
/// comes from `RUST_LOG` (default `info`).
fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Through a buffer and a thread of its own (see log_writer); straight to stderr if that
    // thread cannot start.
    let ansi = std::io::stderr().is_terminal();
    let writer = match idemgate::log_writer::stderr() {
        Ok(writer) => {
            // Access lines are formatted by the gateway itself, in the subscriber's shape
            // (see access.rs); coloured ones are left to the subscriber.
            match format {
                LogFormat::Json => idemgate::log_writer::format_access_lines_here(AccessFormat::Json),
                LogFormat::Pretty if !ansi => idemgate::log_writer::format_access_lines_here(AccessFormat::Text),
                LogFormat::Pretty => {}
            }
            BoxMakeWriter::new(writer)
        }
        Err(e) => {
            eprintln!("cannot start the log writer thread ({e}); logging to stderr directly");
            BoxMakeWriter::new(std::io::stderr)
        }
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).init(),
        LogFormat::Pretty => builder.with_ansi(ansi).init(),
    }
}

fn check(
    path: &std::path::Path,
    running: Option<&std::path::Path>,
    json: bool,
    openapi: Option<(&std::path::Path, &[http::Method])>,
) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    // Building the clients reads CA bundles, which validation alone does not parse. Every
    // upstream is tried, so that one bad bundle does not hide the next.
    let mut failed = false;
    for upstream in &config.upstreams {
        if let Err(e) = Upstream::new(upstream, None) {
            eprintln!("{}: upstreams.{}: {e}", path.display(), upstream.name);
            failed = true;
        }
    }
    if failed {
        return ExitCode::FAILURE;
    }
    for warning in config.warning_lines(&path.display().to_string()) {
        eprintln!("{warning}");
    }
    // The gateway raises its soft descriptor limit to the hard one when it starts: the caps
    // the file sets must fit in that. This process's limit stands in for the service's (a
    // unit's LimitNOFILE or a container's ulimit may differ): the warning says which it read.
    if let Some((_, hard)) = idemgate::descriptors::limits()
        && let Some(warning) = idemgate::descriptors::check_warning(&config, &path.display().to_string(), hard)
    {
        eprintln!("{warning}");
    }
    if !replicas_suffice(path, &config) {
        return ExitCode::FAILURE;
    }
    if let Some(running) = running {
        return compare(running, path, &config, json);
    }
    let idempotent = config.routes.iter().filter(|r| r.idempotency.is_some()).count();
    println!(
        "{}: ok: routes {} ({} idempotent), upstreams {}",
        path.display(),
        config.routes.len(),
        idempotent,
        config.upstreams.len()
    );
    match openapi {
        Some((spec, methods)) => openapi::coverage(&config, spec, methods),
        None => ExitCode::SUCCESS,
    }
}

/// With `[store] replica_acks`, asks the store how many replicas it has and how many
/// acknowledge a write: fewer than asked is an error (every claim would be given back and its
/// request refused); a store that cannot be asked is a warning (it may be down while the file
/// is checked). False on the error.
fn replicas_suffice(path: &std::path::Path, config: &Config) -> bool {
    use idemgate::config::StoreBackendConfig;
    let StoreBackendConfig::Redis { url, connections, tls, password, replicas } = &config.store.backend else {
        return true;
    };
    if replicas.count == 0 {
        return true;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{}: warning: store.replica_acks: cannot ask the store for its replicas: {e}", path.display());
            return true;
        }
    };
    let prefix = &config.store.key_prefix;
    let asked = runtime.block_on(async {
        let password = password.as_ref().map(|p| p.0.as_str());
        let store = idemgate::store::RedisStore::open(url, tls, password, *connections, config.store.timeout, prefix)
            .map_err(|e| e.to_string())?
            .requiring(*replicas);
        let deadline = config.store.timeout * 4 + replicas.timeout;
        let settings = tokio::time::timeout(deadline, store.settings())
            .await
            .map_err(|_| format!("no answer within {deadline:?}"))?;
        let acks = settings.acks.ok_or("no acknowledgement asked")?;
        let acknowledged = acks.acknowledged?;
        Ok::<_, String>((settings.replicas, acknowledged))
    });
    match asked {
        Ok((connected, acknowledged)) if acknowledged < i64::from(replicas.count) => {
            let connected = connected.map_or_else(|| "an unknown number of".to_owned(), |n| n.to_string());
            eprintln!(
                "{}: store.replica_acks: {} is more than the replicas that acknowledge a write within \
                 replica_ack_timeout ({acknowledged}; {connected} connected to the primary): every claim would \
                 be given back and its request refused (503)",
                path.display(),
                replicas.count
            );
            false
        }
        Ok(_) => true,
        Err(why) => {
            eprintln!(
                "{}: warning: store.replica_acks: cannot count the store's replicas ({why}); the gateway asks \
                 again at start and on /readyz",
                path.display()
            );
            true
        }
    }
}

/// `check --running`: what changing from the running file to `path` does to the records in
/// retention, per route; exit 1 when a reload would refuse it.
fn compare(running: &std::path::Path, path: &std::path::Path, next: &Config, json: bool) -> ExitCode {
    let before = match Config::load(running) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("--running: {e}");
            return ExitCode::FAILURE;
        }
    };
    let comparison = idemgate::config::change::compare(&before, next);
    if json {
        println!("{}", comparison.to_json());
    } else {
        for line in comparison.lines() {
            println!("{}: {line}", path.display());
        }
    }
    if comparison.is_safe() {
        if !json {
            println!("{}: ok: records in retention keep their names against {}", path.display(), running.display());
        }
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "{}: refused: the change would rename records in retention or turn their retries into 422 (a reload \
             refuses it too); see Safe: above",
            path.display()
        );
        ExitCode::FAILURE
    }
}

fn serve(path: &std::path::Path, log_format: Option<LogFormat>) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    init_logging(log_format.unwrap_or(config.server.log_format));
    for warning in config.warning_lines(&path.display().to_string()) {
        tracing::warn!("{warning}");
    }
    // Many systems start processes with a soft limit of 1024 descriptors whatever the hard
    // limit allows; a server takes what it is allowed (the listeners' caps are fitted to it).
    idemgate::descriptors::raise();
    // One thread asked for: the runtime is that thread, without a pool, which a pool of one
    // worker still pays for (figures in docs/performance.md). Nothing else differs.
    let mut builder = if config.server.worker_threads == Some(1) {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    if let Some(threads) = config.server.worker_threads.filter(|&n| n > 1) {
        builder.worker_threads(threads);
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            idemgate::log_writer::flush();
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async {
        let server = match Server::bind_reloadable(&config, Some(path.to_path_buf())).await {
            Ok(s) => s,
            Err(e) => {
                // After the config's warnings, which the log writer may still hold.
                idemgate::log_writer::flush();
                eprintln!("{}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        };
        let admin = server.admin_addr().map_or_else(|| "none".to_owned(), |a| a.to_string());
        let store = server.gateway().runtime().backend().describe();
        tracing::info!(listen = %server.local_addr(), %admin, %store, "idemgate serving");
        // One machine-readable line on stdout: scripts that start the gateway on port 0 read
        // the addresses it got from here instead of guessing a free port beforehand.
        println!("idemgate listening proxy={} admin={admin}", server.local_addr());
        let _ = std::io::Write::flush(&mut std::io::stdout());
        server.warn_if_store_unreachable();
        reload_on_sighup(server.live());
        server.run(shutdown_signal()).await;
        ExitCode::SUCCESS
    });
    idemgate::log_writer::flush();
    code
}

/// Reloads the configuration on every SIGHUP (which would otherwise end the process). A bad
/// file is logged and the running configuration stays.
fn reload_on_sighup(live: std::sync::Arc<Live>) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        tracing::warn!("cannot install the SIGHUP handler; reload with POST /reload on the admin listener");
        return;
    };
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            if let Err(e) = live.reload() {
                tracing::error!(error = %e, "reload refused; the running configuration stays");
            }
        }
    });
}

/// Completes on the first SIGTERM or SIGINT; a second one ends the process at once.
async fn shutdown_signal() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
        tracing::error!("cannot install the SIGTERM handler; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("signal received; send another to stop immediately");
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::warn!("second signal: exiting without draining");
        idemgate::log_writer::flush();
        std::process::exit(130);
    });
}
