//! Where log lines go: a buffer in memory, written to stderr by a thread of its own.
//!
//! One access line per request, written to stderr with a system call each, cost the request
//! path more than a tenth of its time, and a slow reader of stderr (a full pipe, a stalled log
//! shipper) would stall every request behind it. So, as nginx's `access_log ... buffer=
//! flush=`: a line is appended to a shared buffer and the request goes on; the writer thread
//! writes the buffer out when it holds [`BATCH`] bytes, every [`FLUSH_EVERY`], and at once for
//! any line that is not an access line (warnings, errors, startup), so that those keep their
//! place among the access lines and are never late. [`flush`] writes out what is left at
//! shutdown.
//!
//! Bounded: when the writer cannot keep up and [`LIMIT`] bytes wait, new lines are dropped
//! (never blocking a request) and counted, in `idemgate_log_lines_dropped_total` and in one
//! line of their own once the writer catches up.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::Metadata;
use tracing_subscriber::fmt::MakeWriter;

/// Bytes that wake the writer thread before its timer.
pub const BATCH: usize = 64 * 1024;
/// The room each of the two buffers keeps: a batch, and what arrives while the writer thread
/// wakes up. Filling a buffer sized for one batch grew it (a copy of the whole batch, and at
/// 128 KiB a fresh mapping) once per batch, and the writer then shrank it back.
const ROOM: usize = 2 * BATCH;
/// The most time a line waits in the buffer.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Bytes that may wait; lines past it are dropped.
pub const LIMIT: usize = 8 * 1024 * 1024;

/// The target of the access lines, the only lines that may wait for the timer.
const ACCESS_TARGET: &str = "idemgate::access";

/// Lines dropped since the process started, for the metrics (one writer per process).
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Log lines dropped because the buffer was full, since the process started.
pub fn dropped_lines() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    /// A line that must not wait for the timer is in `bytes`.
    urgent: bool,
    /// Lines dropped since the writer last reported them.
    dropped: u64,
    /// No more lines: write out what is left and stop.
    closed: bool,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // A panic while holding the lock leaves a buffer that is still bytes: keep using it.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_one();
        let thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// The process's writer, for [`flush`] from wherever the process ends.
static PROCESS: OnceLock<Arc<Shared>> = OnceLock::new();

/// Writes out every line logged so far and stops the writer thread; later lines go to stderr
/// directly. Call at shutdown and before `std::process::exit`, which runs no destructors.
pub fn flush() {
    if let Some(shared) = PROCESS.get() {
        shared.close();
    }
}

/// The `MakeWriter` for the log subscriber; see the module docs.
#[derive(Clone)]
pub struct LogWriter {
    shared: Arc<Shared>,
}

/// How the access lines are written when the log subscriber's own formatting is bypassed
/// (see [`format_access_lines_here`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessFormat {
    /// As the subscriber's JSON format writes them (`log_format = "json"`).
    Json,
    /// As its text format writes them without colours (`log_format = "pretty"`, not a terminal).
    Text,
}

/// The format of the access lines, once the binary has asked for them to be formatted here.
static ACCESS: OnceLock<AccessFormat> = OnceLock::new();

/// Lets `access::log` format access lines itself, straight into the process's buffer (see
/// [`stderr`]), in the same shape as the subscriber would: the subscriber's generic
/// formatting cost more than the rest of a pass-through request. The subscriber's filter
/// still decides whether a line is written at all. Without the process's writer, nothing
/// changes.
pub fn format_access_lines_here(format: AccessFormat) {
    if PROCESS.get().is_some() {
        let _ = ACCESS.set(format);
    }
}

/// Where `access::log` writes a line it formatted itself, if the binary asked for that.
pub(crate) fn access_format() -> Option<AccessFormat> {
    ACCESS.get().copied()
}

/// Appends one access line (a whole line, newline included) to the process's buffer.
pub(crate) fn write_access_line(line: &[u8]) {
    if let Some(shared) = PROCESS.get() {
        let _ = Line { shared, urgent: false }.write(line);
    }
}

/// Starts the process's writer thread over stderr; [`flush`] before the process ends.
pub fn stderr() -> std::io::Result<LogWriter> {
    let writer = start(std::io::stderr())?;
    // The first writer is the process's (tests may start more, over buffers of their own).
    let _ = PROCESS.set(Arc::clone(&writer.shared));
    Ok(writer)
}

/// Starts a writer thread over `out`.
fn start<W: Write + Send + 'static>(out: W) -> std::io::Result<LogWriter> {
    let pending = Pending { bytes: Vec::with_capacity(ROOM), ..Pending::default() };
    let shared = Arc::new(Shared { pending: Mutex::new(pending), wake: Condvar::new(), thread: Mutex::new(None) });
    let thread = {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new().name("idemgate-log".into()).spawn(move || write_out(&shared, out))?
    };
    *shared.thread.lock().unwrap_or_else(PoisonError::into_inner) = Some(thread);
    Ok(LogWriter { shared })
}

/// The writer thread: waits for a batch, an urgent line, the timer or the end, then writes
/// what waits without holding the lock.
fn write_out<W: Write>(shared: &Shared, mut out: W) {
    let mut spare = Vec::with_capacity(ROOM);
    loop {
        let mut pending = shared.lock();
        if !pending.closed && !pending.urgent && pending.bytes.len() < BATCH {
            pending = shared.wake.wait_timeout(pending, FLUSH_EVERY).unwrap_or_else(PoisonError::into_inner).0;
        }
        let closed = pending.closed;
        let dropped = std::mem::take(&mut pending.dropped);
        pending.urgent = false;
        std::mem::swap(&mut pending.bytes, &mut spare);
        drop(pending);
        // A failed write (stderr closed) loses these lines; there is nowhere to report it.
        if !spare.is_empty() {
            let _ = out.write_all(&spare);
        }
        if dropped > 0 {
            let _ = writeln!(out, "idemgate: {dropped} log lines dropped: stderr was not read fast enough");
        }
        let _ = out.flush();
        // Keep the room of one batch and its margin, not the peak of a burst.
        spare.clear();
        spare.shrink_to(ROOM);
        if closed {
            return;
        }
    }
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Line { shared: &self.shared, urgent: true }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        Line { shared: &self.shared, urgent: meta.target() != ACCESS_TARGET }
    }
}

/// One log line on its way into the buffer (the subscriber writes each line in one call).
pub struct Line<'a> {
    shared: &'a Shared,
    urgent: bool,
}

impl Write for Line<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut pending = self.shared.lock();
        if pending.closed {
            // After the final flush (the last lines of shutdown): straight to stderr.
            drop(pending);
            return std::io::stderr().write_all(bytes).map(|()| bytes.len());
        }
        if pending.bytes.len() + bytes.len() > LIMIT {
            pending.dropped += 1;
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return Ok(bytes.len());
        }
        pending.bytes.extend_from_slice(bytes);
        let wake = self.urgent || pending.bytes.len() >= BATCH;
        // Only the line that crosses the threshold wakes the thread; later ones find it awake.
        let first = wake && !pending.urgent;
        pending.urgent |= wake;
        drop(pending);
        if first {
            self.shared.wake.notify_one();
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// An `out` the test can read, and block.
    #[derive(Clone, Default)]
    struct Sink {
        bytes: Arc<Mutex<Vec<u8>>>,
        gate: Arc<Mutex<()>>,
    }

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let _open = self.gate.lock().unwrap_or_else(PoisonError::into_inner);
            self.bytes.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.bytes.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
        }
    }

    fn line(writer: &LogWriter, urgent: bool, text: &str) {
        let mut l = Line { shared: &writer.shared, urgent };
        l.write_all(text.as_bytes()).expect("a line is always taken");
    }

    fn wait_for(sink: &Sink, text: &str, within: Duration) -> Duration {
        let start = Instant::now();
        while !sink.text().contains(text) {
            assert!(start.elapsed() < within, "{text:?} not written within {within:?}: {:?}", sink.text());
            std::thread::sleep(Duration::from_millis(2));
        }
        start.elapsed()
    }

    #[test]
    fn access_lines_wait_for_the_timer_and_others_are_written_at_once_in_order() {
        let sink = Sink::default();
        let writer = start(sink.clone()).expect("thread");
        line(&writer, false, "access 1\n");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(sink.text(), "", "an access line waits for the timer or a batch");
        line(&writer, true, "warning\n");
        let took = wait_for(&sink, "warning", Duration::from_millis(500));
        assert!(took < FLUSH_EVERY / 2, "a warning is written at once, not after {took:?}");
        assert_eq!(sink.text(), "access 1\nwarning\n", "in the order they were logged");
        line(&writer, false, "access 2\n");
        wait_for(&sink, "access 2", FLUSH_EVERY * 3);
        line(&writer, false, "access 3\n");
        writer.shared.close();
        assert!(sink.text().ends_with("access 3\n"), "the final flush writes what is left");
    }

    /// A request's access line is logged before its answer leaves, so a line that follows
    /// another in time, on any thread, follows it in the output: a key's replay is never
    /// logged before the request that executed it. Through the access lines' own path, as the
    /// process's writer (the only test that sets it).
    #[test]
    fn access_lines_from_different_threads_keep_the_order_they_were_logged_in() {
        let sink = Sink::default();
        let writer = start(sink.clone()).expect("thread");
        assert!(PROCESS.set(Arc::clone(&writer.shared)).is_ok(), "no other test sets the process's writer");
        let (to_b, from_a) = std::sync::mpsc::channel::<usize>();
        let (to_a, from_b) = std::sync::mpsc::channel::<usize>();
        let b = std::thread::spawn(move || {
            while let Ok(n) = from_a.recv() {
                write_access_line(format!("line {n}\n").as_bytes());
                if to_a.send(n + 1).is_err() {
                    break;
                }
            }
        });
        // The threads take turns: each line is logged after the one before it returned.
        let mut n = 0;
        while n < 200 {
            write_access_line(format!("line {n}\n").as_bytes());
            to_b.send(n + 1).expect("thread b");
            n = from_b.recv().expect("thread b");
        }
        drop(to_b);
        b.join().expect("thread b");
        writer.shared.close();
        let expected: String = (0..200).map(|n| format!("line {n}\n")).collect();
        assert_eq!(sink.text(), expected);
    }

    #[test]
    fn a_full_batch_is_written_before_the_timer() {
        let sink = Sink::default();
        let writer = start(sink.clone()).expect("thread");
        let text = format!("{}\n", "a".repeat(1023));
        for _ in 0..(BATCH / 1024) {
            line(&writer, false, &text);
        }
        let took = wait_for(&sink, &text, FLUSH_EVERY * 3);
        assert!(took < FLUSH_EVERY / 2, "a batch is written at once, not after {took:?}");
    }

    #[test]
    fn a_stalled_reader_drops_lines_and_counts_them_instead_of_blocking() {
        let sink = Sink::default();
        let gate = sink.gate.lock().expect("gate");
        let writer = start(sink.clone()).expect("thread");
        // The writer thread takes the first urgent line and blocks on the gate.
        line(&writer, true, "first\n");
        std::thread::sleep(Duration::from_millis(50));
        let before = dropped_lines();
        let text = format!("{}\n", "b".repeat(1023));
        let start = Instant::now();
        for _ in 0..(LIMIT / 1024 + 100) {
            line(&writer, false, &text);
        }
        assert!(start.elapsed() < Duration::from_secs(5), "logging never blocks");
        assert!(dropped_lines() - before >= 100, "lines past the limit are dropped and counted");
        drop(gate);
        writer.shared.close();
        assert!(sink.text().contains("log lines dropped"), "and the drop is reported once the writer catches up");
    }
}
