//! Child processes that die with the test process.
//!
//! Children are spawned with PR_SET_PDEATHSIG from a thread that lives as long as the process:
//! the signal fires when the spawning *thread* exits, so a short-lived test thread must not be
//! the parent. A test binary that panics, or is killed, leaves no redis-server or gateway behind.
// Children die with the test process (prctl before exec): a libc call. The gateway itself
// has no unsafe code.
#![allow(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::process::{Child, Command};

/// Spawns `cmd`; the child gets SIGKILL when this test process ends.
pub fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let _ = tx.send(cmd.spawn());
        loop {
            std::thread::park();
        }
    });
    rx.recv().map_err(|_| std::io::Error::other("spawner thread died"))?
}
