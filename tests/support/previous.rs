//! The previous release's binary, to run beside this one on one Redis (a rolling upgrade).
//!
//! `IDEMGATE_PREVIOUS_BIN` names it when it is at hand. Otherwise it is built once per target
//! directory from the commit `PREVIOUS` names, taken out of this repository's history with
//! `git archive`, renamed `idemgate-previous` (so that its binary never replaces this build's
//! `idemgate`), and built in this build's target directory: the dependencies are mostly this
//! build's own, already compiled, so only the gateway's two crates are, and those this build
//! no longer takes from crates.io (hyper, which it patches: see vendor/README.md).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The commit of the previous release: the last commit before the reshaping that keeps the
/// Redis layout byte for byte. Move it forward when a release ships.
pub const PREVIOUS: &str = "21151af";

/// The path of the previous release's binary, building it on first use.
pub fn binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("IDEMGATE_PREVIOUS_BIN") {
        return bin.into();
    }
    // One build at a time within this process; cargo's own lock keeps processes apart.
    static BUILD: Mutex<()> = Mutex::new(());
    let _one = BUILD.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let this = Path::new(env!("CARGO_BIN_EXE_idemgate"));
    let profile_dir = this.parent().expect("the binary's directory");
    let target = profile_dir.parent().expect("the target directory");
    let kept = target.join("previous").join(format!("idemgate-{PREVIOUS}"));
    if kept.exists() {
        return kept;
    }
    let source = target.join("previous").join(PREVIOUS);
    if !source.join("Cargo.toml").exists() {
        extract(&source);
    }
    // What the previous release needs and this build does not (crates.io's hyper, which this
    // build patches) is fetched first; without a network, a cache that holds it will do, and
    // the build below says what is missing.
    let fetched = super::cargo().args(["fetch", "--quiet", "--manifest-path"]).arg(source.join("Cargo.toml")).status();
    if !fetched.is_ok_and(|s| s.success()) {
        eprintln!("could not fetch the previous release's dependencies; building from the local cache");
    }
    let status = super::cargo()
        .args(["build", "--offline", "--quiet", "--bin", "idemgate-previous", "--manifest-path"])
        .arg(source.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target)
        // Built once and never edited: incremental caches (on in that tree's own profile)
        // would only take space, 168 MB of a fresh clone's target/.
        .env("CARGO_INCREMENTAL", "0")
        .status()
        .expect("run cargo build for the previous release");
    assert!(status.success(), "building the previous release ({PREVIOUS}) failed");
    let built = profile_dir.join("idemgate-previous");
    std::fs::copy(&built, &kept).unwrap_or_else(|e| panic!("copy {} to {}: {e}", built.display(), kept.display()));
    kept
}

/// `PREVIOUS`'s tree in `dir`, its package renamed so its outputs stand beside this build's.
fn extract(dir: &Path) {
    let repo = env!("CARGO_MANIFEST_DIR");
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("create the previous release's directory");
    let archive = Command::new("git")
        .args(["-C", repo, "archive", "--format=tar", PREVIOUS])
        .output()
        .expect("run git archive (the test needs git and this repository's history)");
    assert!(
        archive.status.success(),
        "git archive {PREVIOUS} failed (a clone without history cannot run this test; set IDEMGATE_PREVIOUS_BIN): {}",
        String::from_utf8_lossy(&archive.stderr)
    );
    let mut untar =
        Command::new("tar").args(["-x", "-C"]).arg(dir).stdin(std::process::Stdio::piped()).spawn().expect("run tar");
    std::io::Write::write_all(untar.stdin.as_mut().expect("tar's stdin"), &archive.stdout).expect("feed tar");
    assert!(untar.wait().expect("wait for tar").success(), "tar failed");
    let manifest = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).expect("read the previous Cargo.toml");
    let renamed = text.replacen("name = \"idemgate\"", "name = \"idemgate-previous\"", 1).replacen(
        "default-run = \"idemgate\"",
        "default-run = \"idemgate-previous\"",
        1,
    ) + "\n[lib]\nname = \"idemgate\"\npath = \"src/lib.rs\"\n\n[[bin]]\nname = \"idemgate-previous\"\npath = \"src/main.rs\"\n";
    assert_ne!(renamed, text, "the previous Cargo.toml names no package idemgate");
    std::fs::write(&manifest, renamed).expect("write the previous Cargo.toml");
}
