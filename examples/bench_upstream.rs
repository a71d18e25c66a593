//! The benchmark's upstream: the least an HTTP/1.1 service can do. It reads each request's
//! body and answers 201 with a small JSON body, so the benchmark measures the proxies in front
//! of it, not the service.
//!
//!     cargo run --release --example bench_upstream -- 127.0.0.1:3999

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const ANSWER: &[u8] = br#"{"order_id":1,"status":"created"}"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::args().nth(1).ok_or("usage: bench_upstream ADDR")?.parse()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(addr).await?;
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = service_fn(|req: Request<hyper::body::Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    let mut response = Response::new(Full::new(Bytes::from_static(ANSWER)));
                    *response.status_mut() = hyper::StatusCode::CREATED;
                    response
                        .headers_mut()
                        .insert("content-type", hyper::header::HeaderValue::from_static("application/json"));
                    Ok::<_, Infallible>(response)
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    })
}
