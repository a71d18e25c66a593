//! A TCP proxy between the gateway and Redis, to make Redis look slow or to move it.
//!
//! - `slow_replies(window, delay)`: every chunk Redis sends within the next `window` reaches
//!   the gateway `delay` late, so a call can be applied by Redis and its reply arrive after
//!   the gateway's store timeout (a ghost claim). Later chunks queue behind a late one, as
//!   they would on a real connection.
//! - `retarget(addr)`: new connections go to `addr`, and open ones are cut, as after a
//!   failover behind a fixed address.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

struct State {
    target: SocketAddr,
    slow_until: Option<Instant>,
    delay: Duration,
}

pub struct TcpProxy {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    /// Bumped to cut every open connection.
    generation: watch::Sender<u64>,
}

impl TcpProxy {
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State { target, slow_until: None, delay: Duration::ZERO }));
        let (generation, _) = watch::channel(0u64);
        let accept_state = Arc::clone(&state);
        let cuts = generation.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let target = accept_state.lock().unwrap().target;
                let Ok(server) = TcpStream::connect(target).await else { continue };
                let mut cut = cuts.subscribe();
                let state = Arc::clone(&accept_state);
                tokio::spawn(async move {
                    tokio::select! {
                        () = pipe(client, server, state) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Self { addr, state, generation }
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Delays every reply chunk sent within the next `window` by `delay`.
    pub fn slow_replies(&self, window: Duration, delay: Duration) {
        let mut s = self.state.lock().unwrap();
        s.slow_until = Some(Instant::now() + window);
        s.delay = delay;
    }

    /// Sends new connections to `target` and cuts the open ones.
    pub fn retarget(&self, target: SocketAddr) {
        self.state.lock().unwrap().target = target;
        self.generation.send_modify(|g| *g += 1);
    }
}

async fn pipe(client: TcpStream, server: TcpStream, state: Arc<Mutex<State>>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = async {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    };
    let replies = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let delay = {
                let s = state.lock().unwrap();
                match s.slow_until {
                    Some(until) if Instant::now() < until => s.delay,
                    _ => Duration::ZERO,
                }
            };
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = requests => {}
        () = replies => {}
    }
}
