//! `ReplicationLink`: a TCP proxy between a replica and its primary (the replica does
//! `REPLICAOF 127.0.0.1 <link port>`), standing in for the network and the replica's backlog.
//!
//! - Lag: every chunk the primary sends reaches the replica `lag` after the link read it, in
//!   order: a pure time shift, so the replica trails the primary by `lag` and whatever the
//!   primary acknowledged in the last `lag` lives on the primary alone.
//! - `freeze`/`thaw`: nothing more reaches the replica while frozen; the connections stay up and
//!   what the primary sends queues in the link, to arrive at once on the thaw.
//! - `crash`: every byte not yet delivered is dropped and the connections are cut at once, and
//!   the link refuses connections from then on: the network of a host that died. Call it
//!   together with the SIGKILL of the primary; a primary killed alone leaves its last `lag` of
//!   writes on their way, and the replica gets them, as a host that merely lost its process
//!   would.
//!
//! The replica-to-primary direction carries the replica's handshake and its `REPLCONF ACK`s.
//! It is never delayed nor frozen: the replica's own position is what a failover keeps, and
//! `WAIT` already pays the lag once (its `REPLCONF GETACK` travels in the delayed stream, behind
//! the writes it asks about); delaying the answer too would make every `WAIT` cost twice the lag
//! the replica trails by. So while frozen the primary still hears from its replica every
//! second: `INFO` shows it connected with `lag=0` or `1`, and only `WAIT` finds it behind.
//!
//! Each link runs on a thread and runtime of its own, so that it goes on delivering while a
//! test blocks (the fixtures' waits are blocking) and whatever runtime the test uses.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Flowing,
    Frozen,
    /// Cut: nothing more is delivered, and the link is gone.
    Crashed,
}

pub struct ReplicationLink {
    /// Where the replica connects.
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
    /// The link's thread; joined once it is cut, after which nothing more is delivered.
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl ReplicationLink {
    /// A link on a fresh loopback port to the primary at `primary`, delaying what it sends by
    /// `lag` (zero: no delay).
    pub fn start(primary: SocketAddr, lag: Duration) -> ReplicationLink {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (mode, watching) = watch::channel(Mode::Flowing);
        let thread = std::thread::Builder::new()
            .name(format!("replication-link-{}", addr.port()))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                // Returning drops the runtime, and with it every connection and queued byte.
                runtime.block_on(serve(listener, primary, lag, watching));
            })
            .unwrap();
        ReplicationLink { addr, mode, thread: Mutex::new(Some(thread)) }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Stops delivering; what the primary sends queues until [`thaw`].
    pub fn freeze(&self) {
        self.mode.send_if_modified(|m| std::mem::replace(m, Mode::Frozen) == Mode::Flowing);
    }

    /// Delivers what queued while frozen (its lag has passed) and carries on.
    pub fn thaw(&self) {
        self.mode.send_if_modified(|m| std::mem::replace(m, Mode::Flowing) == Mode::Frozen);
    }

    /// Drops every byte not yet delivered, cuts the connections and refuses new ones; returns
    /// once the link is gone.
    pub fn crash(&self) {
        self.mode.send_replace(Mode::Crashed);
        if let Some(thread) = self.thread.lock().unwrap().take() {
            thread.join().expect("the link's thread never panics");
        }
    }
}

impl Drop for ReplicationLink {
    fn drop(&mut self) {
        self.crash();
    }
}

async fn serve(listener: std::net::TcpListener, primary: SocketAddr, lag: Duration, mode: watch::Receiver<Mode>) {
    let listener = TcpListener::from_std(listener).unwrap();
    let crashed = mode.clone();
    let mut crashed = std::pin::pin!(async move {
        let mut crashed = crashed;
        let _ = crashed.wait_for(|m| *m == Mode::Crashed).await;
    });
    loop {
        tokio::select! {
            biased;
            () = &mut crashed => return,
            accepted = listener.accept() => {
                let Ok((replica, _)) = accepted else { continue };
                tokio::spawn(carry(replica, primary, lag, mode.clone()));
            }
        }
    }
}

/// One replication connection: the primary's stream delayed by `lag`, the replica's own
/// traffic as it comes.
async fn carry(replica: TcpStream, primary: SocketAddr, lag: Duration, mode: watch::Receiver<Mode>) {
    // Refused: dropping `replica` closes it, and the replica tries again on its own.
    let Ok(upstream) = TcpStream::connect(primary).await else { return };
    let _ = replica.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (mut from_replica, mut to_replica) = replica.into_split();
    let (mut from_primary, mut to_primary) = upstream.into_split();
    let (queue, mut queued) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    // Each chunk is stamped when read, and delivered at stamp + lag: the stamps keep their
    // spacing, so the replica sees the primary's stream exactly `lag` late.
    let stamp = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from_primary.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if queue.send((Instant::now() + lag, buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    };
    let deliver = async move {
        let mut mode = mode;
        while let Some((due, chunk)) = queued.recv().await {
            tokio::time::sleep_until(due).await;
            let Ok(now) = mode.wait_for(|m| *m != Mode::Frozen).await.map(|m| *m) else { return };
            if now == Mode::Crashed || to_replica.write_all(&chunk).await.is_err() {
                return;
            }
        }
        // The primary closed: what was on its way has arrived; close as it did.
        let _ = to_replica.shutdown().await;
    };
    let acks = async move {
        let _ = tokio::io::copy(&mut from_replica, &mut to_primary).await;
    };
    tokio::select! {
        _ = async { tokio::join!(stamp, deliver) } => {}
        () = acks => {}
    }
}
