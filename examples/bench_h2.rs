//! A load generator for HTTP/2 with prior knowledge (h2c), for the benchmark's HTTP/2 rows:
//! wrk speaks only HTTP/1.1, and h2load sends the same headers on every request, where first
//! requests need a new `Idempotency-Key` each.
//!
//!     cargo run --release --example bench_h2 -- 127.0.0.1:8080 /orders 4 16 5 unique
//!
//! Opens CONNECTIONS connections with STREAMS requests in flight on each, for SECONDS, then
//! prints the line bench/run reads from wrk: `RESULT requests=… duration_us=… p50_us=…
//! p99_us=… errors=… status_errors=…` (a status of 400 or more is a status error, as wrk
//! counts them). MODE: `plain` (no key), `unique` (a new key on every request) or `replay`
//! (every request the key `"$BENCH_RUN-replay"`, which bench/run stores first). The body and
//! the caller's credential come from BENCH_BODY and BENCH_AUTHORIZATION, the key prefix from
//! BENCH_RUN, as the wrk scripts take them.
//!
//! A server that ends a connection (GOAWAY after so many requests) ends the streams on it:
//! their requests count as errors, so bench/run fails rather than report a lighter load.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Plain,
    Unique,
    Replay,
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    errors: u64,
    status_errors: u64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "usage: bench_h2 ADDR PATH CONNECTIONS STREAMS SECONDS plain|unique|replay";
    let mut args = std::env::args().skip(1);
    let addr: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let path = args.next().ok_or(usage)?;
    let connections: usize = args.next().ok_or(usage)?.parse()?;
    let streams: usize = args.next().ok_or(usage)?.parse()?;
    let seconds: u64 = args.next().ok_or(usage)?.parse()?;
    let mode = match args.next().ok_or(usage)?.as_str() {
        "plain" => Mode::Plain,
        "unique" => Mode::Unique,
        "replay" => Mode::Replay,
        other => return Err(format!("unknown mode {other:?}: {usage}").into()),
    };
    if connections == 0 || streams == 0 || seconds == 0 {
        return Err(usage.into());
    }
    let body = Bytes::from(std::env::var("BENCH_BODY").unwrap_or_default());
    let authorization = std::env::var("BENCH_AUTHORIZATION").unwrap_or_default();
    let run = std::env::var("BENCH_RUN").unwrap_or_else(|_| "h2".to_owned());
    let uri: hyper::Uri = format!("http://{addr}{path}").parse()?;

    // Two threads, as wrk runs with -t2.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (tally, elapsed) = runtime.block_on(async move {
        let mut senders = Vec::with_capacity(connections);
        for _ in 0..connections {
            let stream = TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            let (sender, connection) =
                hyper::client::conn::http2::Builder::new(TokioExecutor::new()).handshake(TokioIo::new(stream)).await?;
            tokio::spawn(connection);
            senders.push(sender);
        }
        let started = Instant::now();
        let deadline = started + Duration::from_secs(seconds);
        let mut workers = tokio::task::JoinSet::new();
        for (c, sender) in senders.into_iter().enumerate() {
            for s in 0..streams {
                let mut sender = sender.clone();
                let (uri, body, authorization, run) = (uri.clone(), body.clone(), authorization.clone(), run.clone());
                workers.spawn(async move {
                    let mut tally = Tally::default();
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        n += 1;
                        let mut request = Request::post(uri.clone())
                            .header("content-type", "application/json")
                            .header("authorization", authorization.as_str());
                        match mode {
                            Mode::Plain => {}
                            Mode::Unique => {
                                request = request.header("idempotency-key", format!("\"{run}-{c}-{s}-{n}\""))
                            }
                            Mode::Replay => request = request.header("idempotency-key", format!("\"{run}-replay\"")),
                        }
                        let Ok(request) = request.body(Full::new(body.clone())) else {
                            tally.errors += 1;
                            break;
                        };
                        let sent = Instant::now();
                        let answered = match sender.send_request(request).await {
                            Ok(response) => {
                                let status = response.status();
                                response.into_body().collect().await.ok().map(|_| status)
                            }
                            Err(_) => None,
                        };
                        match answered {
                            Some(status) => {
                                let us = u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX);
                                tally.latencies_us.push(us);
                                if status.as_u16() >= 400 {
                                    tally.status_errors += 1;
                                }
                            }
                            None => {
                                tally.errors += 1;
                                // A connection gone stays gone: stop rather than spin on it.
                                if sender.is_closed() {
                                    break;
                                }
                            }
                        }
                    }
                    tally
                });
            }
        }
        let mut all = Tally::default();
        while let Some(done) = workers.join_next().await {
            let tally = done?;
            all.latencies_us.extend(tally.latencies_us);
            all.errors += tally.errors;
            all.status_errors += tally.status_errors;
        }
        Ok::<_, Box<dyn std::error::Error>>((all, started.elapsed()))
    })?;

    let mut latencies = tally.latencies_us;
    latencies.sort_unstable();
    let percentile = |p: usize| {
        if latencies.is_empty() { 0 } else { latencies[((latencies.len() - 1) * p / 100).min(latencies.len() - 1)] }
    };
    println!(
        "RESULT requests={} duration_us={} p50_us={} p99_us={} errors={} status_errors={}",
        latencies.len(),
        elapsed.as_micros(),
        percentile(50),
        percentile(99),
        tally.errors,
        tally.status_errors
    );
    Ok(())
}
