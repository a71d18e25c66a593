//! Opens many keep-alive connections to a server, sends one request on each, then holds them
//! idle, so the benchmark can read the server's memory with that many idle clients.
//!
//!     cargo run --release --example bench_idle -- 127.0.0.1:8080 /path 10000 15
//!
//! Prints `OPEN n` once every connection has had its answer, then sleeps for the given
//! number of seconds and exits (closing them all). With `-` for the path, sends nothing: the
//! connections are open but have never sent a byte (what a server holds for a client that
//! connected and went quiet, until its header timeout).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: bench_idle ADDR PATH CONNECTIONS HOLD_SECONDS";
    let addr: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let path = args.next().ok_or(usage)?;
    let count: usize = args.next().ok_or(usage)?.parse()?;
    let hold: u64 = args.next().ok_or(usage)?.parse()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        let request = format!("GET {path} HTTP/1.1\r\nhost: bench\r\n\r\n");
        let mut open = Vec::with_capacity(count);
        for _ in 0..count {
            let mut stream = TcpStream::connect(addr).await?;
            if path == "-" {
                open.push(stream);
                continue;
            }
            stream.write_all(request.as_bytes()).await?;
            let mut buf = [0u8; 4096];
            // One read is enough for the small answers of the benchmark's upstream.
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err("server closed a connection".into());
            }
            open.push(stream);
        }
        println!("OPEN {}", open.len());
        tokio::time::sleep(Duration::from_secs(hold)).await;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}
