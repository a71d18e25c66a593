//! The benchmark's upstream: the least an HTTP/1.1 service can do. It reads each request's
//! body and answers 201 with a small JSON body, so the benchmark measures the proxies in front
//! of it, not the service. `/size/N` answers N bytes instead (at most 16 MiB), sliced from one
//! buffer made at start, so that large answers cost the upstream no copy either.
//!
//! Given several addresses, one process listens on each: the instances of an upstream with
//! several `urls`, at the cost of one process, so that a scenario over three instances and
//! one over a single instance load the machine alike.
//!
//!     cargo run --release --example bench_upstream -- 127.0.0.1:3999 [127.0.0.1:4000 ...]

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const ANSWER: &[u8] = br#"{"order_id":1,"status":"created"}"#;
/// The largest `/size/N` answer.
const MAX_SIZE: usize = 16 << 20;

/// The answer to `path`: N bytes of `big` for `/size/N`, else the small JSON body.
fn answer(path: &str, big: &Bytes) -> Bytes {
    match path.strip_prefix("/size/").and_then(|n| n.parse::<usize>().ok()) {
        Some(n) => big.slice(..n.min(MAX_SIZE)),
        None => Bytes::from_static(ANSWER),
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let addrs: Vec<SocketAddr> = std::env::args().skip(1).map(|a| a.parse()).collect::<Result<_, _>>()?;
    if addrs.is_empty() {
        return Err("usage: bench_upstream ADDR [ADDR ...]".into());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let big = Bytes::from(vec![b'x'; MAX_SIZE]);
    runtime.block_on(async move {
        let mut listeners = Vec::with_capacity(addrs.len());
        for addr in addrs {
            listeners.push(TcpListener::bind(addr).await?);
        }
        let mut serving = tokio::task::JoinSet::new();
        for listener in listeners {
            serving.spawn(serve(listener, big.clone()));
        }
        match serving.join_next().await {
            Some(Ok(result)) => result,
            Some(Err(e)) => Err(e.into()),
            None => Ok(()),
        }
    })
}

async fn serve(listener: TcpListener, big: Bytes) -> Result<(), Error> {
    {
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            let big = big.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let body = answer(req.uri().path(), &big);
                    async move {
                        let _ = req.into_body().collect().await;
                        let mut response = Response::new(Full::new(body));
                        *response.status_mut() = hyper::StatusCode::CREATED;
                        response
                            .headers_mut()
                            .insert("content-type", hyper::header::HeaderValue::from_static("application/json"));
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    }
}
