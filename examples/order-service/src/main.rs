//! Command-line entry point: parse flags, connect, serve until SIGTERM or SIGINT.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use order_service::{Database, DbError, Error, Options, serve_with};
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

/// Example order API with UNIQUE(user_id, idem_key) as the idempotency backstop.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to listen on (host:port; port 0 picks a free one).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:3000")]
    listen: String,
    /// Database URL: sqlite:PATH (created if missing) or postgres://USER@HOST:PORT/DB.
    #[arg(long, value_name = "URL", default_value = "sqlite:orders.db")]
    database: String,
    /// For demos only: honour the request header `X-Demo-Fault: drop-answer` on POST
    /// /orders, which makes the order and then breaks its answer off (the head and part of
    /// the body are sent, then the connection is closed). Off by default: the header is
    /// ignored.
    #[arg(long)]
    demo_faults: bool,
}

#[derive(Debug, thiserror::Error)]
enum StartupError {
    #[error("cannot install signal handler: {0}")]
    Signal(std::io::Error),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("cannot open database: {0}")]
    Database(#[from] DbError),
    #[error(transparent)]
    Serve(#[from] Error),
}

#[tokio::main]
async fn main() -> ExitCode {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), StartupError> {
    // Handlers go in before anything else so a signal during startup is not lost and a
    // failure to install them is reported instead of leaving an unstoppable server.
    let shutdown = shutdown_signal()?;
    let db = Database::connect(&args.database).await?;
    let listener = TcpListener::bind(&args.listen)
        .await
        .map_err(|source| StartupError::Bind { addr: args.listen.clone(), source })?;
    let addr = listener.local_addr().map_err(|source| StartupError::Bind { addr: args.listen, source })?;
    tracing::info!(backend = db.backend(), "listening on {addr}");
    if args.demo_faults {
        tracing::warn!("demo faults are on: X-Demo-Fault: drop-answer breaks the answer to POST /orders off");
    }
    // One machine-readable line on stdout, for scripts that start the service on port 0.
    println!("order-service listening listen={addr}");
    let _ = std::io::Write::flush(&mut std::io::stdout());
    serve_with(listener, db, Options { demo_faults: args.demo_faults }, shutdown).await?;
    tracing::info!("shut down cleanly");
    Ok(())
}

#[cfg(unix)]
fn shutdown_signal() -> Result<impl Future<Output = ()> + Send + 'static, StartupError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(StartupError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(StartupError::Signal)?;
    Ok(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!("{name} received: finishing in-flight requests");
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> Result<impl Future<Output = ()> + Send + 'static, StartupError> {
    Ok(async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot wait for Ctrl-C, shutting down: {err}");
        }
        tracing::info!("Ctrl-C received: finishing in-flight requests");
    })
}
