//! An upstream that executes each request and then fails to answer it properly, over raw TCP:
//! the cases where the gateway cannot know whether the upstream acted. And instances that
//! fail below HTTP: one whose connects hang ([`Hanging`]), one that resets every connection
//! ([`resetting`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::upstream::TestUpstream;

/// How the upstream fails after it has read (and "executed") a request.
#[derive(Debug, Clone, Copy)]
pub enum Misbehaviour {
    /// Closes the connection without a byte of response.
    CloseAfterRequest,
    /// Sends a head with `content-length: 100`, ten bytes of body, and closes.
    HalfBody,
    /// Answers properly (201), so that a retry that gets through can be told apart. The answer
    /// names a header of its own in `Connection` (`x-upstream-hop`), which is hop-by-hop.
    Answer,
    /// Answers `HTTP/1.0 200 OK` and closes, as an old server does.
    AnswerHttp10,
    /// Accepts a WebSocket upgrade (101) and then echoes every byte back.
    UpgradeEcho,
}

pub struct RawUpstream {
    pub addr: SocketAddr,
    /// The head of every request executed, in order.
    heads: Arc<Mutex<Vec<String>>>,
    mode: Arc<Mutex<Misbehaviour>>,
}

impl RawUpstream {
    pub async fn start(mode: Misbehaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let mode = Arc::new(Mutex::new(mode));
        let (h, m) = (Arc::clone(&heads), Arc::clone(&mode));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&h), Arc::clone(&m)));
            }
        });
        Self { addr, heads, mode }
    }

    pub fn set(&self, mode: Misbehaviour) {
        *self.mode.lock().unwrap() = mode;
    }

    pub fn executions(&self) -> usize {
        self.heads.lock().unwrap().len()
    }

    /// The value of `name` in each executed request (lower-case name), `None` where absent.
    pub fn header_values(&self, name: &str) -> Vec<Option<String>> {
        self.heads
            .lock()
            .unwrap()
            .iter()
            .map(|head| {
                head.lines().find_map(|line| {
                    let (k, v) = line.split_once(':')?;
                    k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
                })
            })
            .collect()
    }
}

async fn serve(mut stream: TcpStream, heads: Arc<Mutex<Vec<String>>>, mode: Arc<Mutex<Misbehaviour>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    // Keep-alive: one request after another until the gateway or this upstream closes.
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let length: usize = head
            .lines()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-length")))
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..head_end + length);
        heads.lock().unwrap().push(head);
        let mode = *mode.lock().unwrap();
        match mode {
            Misbehaviour::CloseAfterRequest => return,
            Misbehaviour::HalfBody => {
                let _ = stream.write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 100\r\n\r\n0123456789").await;
                return;
            }
            Misbehaviour::UpgradeEcho => {
                let switched = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n";
                if stream.write_all(switched).await.is_err() {
                    return;
                }
                // Bytes that came with the head belong to the new protocol.
                if !buf.is_empty() && stream.write_all(&buf).await.is_err() {
                    return;
                }
                loop {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if stream.write_all(&chunk[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            }
            Misbehaviour::AnswerHttp10 => {
                let _ = stream
                    .write_all(b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                return;
            }
            Misbehaviour::Answer => {
                let body = b"{\"created\":true}";
                let reply = format!(
                    "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\nconnection: x-upstream-hop\r\n\
                     x-upstream-hop: this connection only\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                if stream.write_all(reply.as_bytes()).await.is_err() || stream.write_all(body).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// An instance whose connects hang: a listener that accepts nothing, its accept queue filled
/// first. Linux then drops every SYN it is sent, and a connect waits until its own timeout,
/// as with a host that is down or a server whose backlog overflowed.
pub struct Hanging {
    pub addr: SocketAddr,
    listener: TcpListener,
    /// The connections that fill the accept queue, kept open.
    _fillers: Vec<TcpStream>,
}

impl Hanging {
    pub async fn start() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        // A backlog of 0 holds one connection (two on some kernels); the rest hang.
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut fillers = Vec::new();
        for _ in 0..8 {
            match tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => fillers.push(stream),
                Ok(Err(e)) => panic!("connecting to the listener being filled: {e}"),
                Err(_) => return Self { addr, listener, _fillers: fillers },
            }
        }
        panic!("the accept queue of {addr} never filled: connects to it would not hang");
    }

    /// Comes back: accepts what waits and what comes, and answers as a [`TestUpstream`].
    pub fn come_back(self) -> TestUpstream {
        TestUpstream::on(self.listener)
    }
}

/// An instance that accepts every connection and resets it (`SO_LINGER` 0) without a byte of
/// answer: at once, before reading anything, or, with `read_first`, once the gateway has
/// written something (so that the connection was made, and the request was sent). Counts
/// the connections.
pub async fn resetting(read_first: bool) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            // A connection reset before it is accepted fails the accept; the listener goes on.
            let Ok((mut stream, _)) = listener.accept().await else { continue };
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if read_first {
                    let _ = stream.read(&mut [0u8; 4096]).await;
                }
                let _ = stream.set_zero_linger();
                drop(stream);
            });
        }
    });
    (addr, accepted)
}
