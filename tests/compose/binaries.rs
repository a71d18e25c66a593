//! The binaries, for `--help` and `check`.

use super::*;

/// Path of a workspace binary: the gateway from cargo; the order service from the same
/// target directory, built there first if this test run did not build it.
pub(crate) fn workspace_binary(program: &str) -> Result<PathBuf, String> {
    match program {
        GATEWAY_BIN => Ok(PathBuf::from(env!("CARGO_BIN_EXE_idemgate"))),
        ORDERS_BIN => {
            static ORDERS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
            ORDERS.get_or_init(order_service_binary).clone()
        }
        other => Err(format!("`{other}` is not a binary of this workspace")),
    }
}

pub(crate) fn order_service_binary() -> Result<PathBuf, String> {
    let gateway = Path::new(env!("CARGO_BIN_EXE_idemgate"));
    let profile_dir = gateway.parent().ok_or("CARGO_BIN_EXE_idemgate has no parent")?;
    let binary = profile_dir.join(format!("{ORDERS_BIN}{}", std::env::consts::EXE_SUFFIX));
    if binary.is_file() {
        return Ok(binary);
    }
    // `cargo test --workspace` builds it; a run of this test alone may not have.
    let mut cmd = crate::support::cargo();
    cmd.args(["build", "--quiet", "-p", ORDERS_BIN, "--manifest-path"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(profile) => {
            cmd.args(["--profile", profile]);
        }
    }
    if let Some(target_dir) = profile_dir.parent().filter(|d| d.join("CACHEDIR.TAG").exists()) {
        cmd.arg("--target-dir").arg(target_dir);
    }
    let status = cmd.status().map_err(|e| format!("cannot run cargo build -p {ORDERS_BIN}: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build -p {ORDERS_BIN} failed: {status}"));
    }
    if binary.is_file() { Ok(binary) } else { Err(format!("{} is missing after cargo build", binary.display())) }
}

/// `<program> --help`, once per program.
pub(crate) fn help_text(program: &str) -> Result<String, String> {
    static HELP: OnceLock<Mutex<HashMap<String, Result<String, String>>>> = OnceLock::new();
    let cache = HELP.get_or_init(Default::default);
    if let Some(cached) = cache.lock().unwrap().get(program) {
        return cached.clone();
    }
    let result = workspace_binary(program).and_then(|bin| {
        let out =
            Command::new(&bin).arg("--help").output().map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        if !out.status.success() {
            return Err(format!("{} --help exited with {}", bin.display(), out.status));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    });
    cache.lock().unwrap().insert(program.to_owned(), result.clone());
    result
}

/// Whether `flag` appears in a help text as a whole word.
pub(crate) fn help_mentions(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(at, _)| {
        let before = help[..at].chars().next_back();
        let after = help[at + flag.len()..].chars().next();
        let boundary = |c: Option<char>| c.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        boundary(before) && boundary(after)
    })
}
