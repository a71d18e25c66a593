//! The commands that read the API's OpenAPI document: `idemgate routes --from-openapi`
//! (routes for its keyed operations, printed or merged into a file), `idemgate openapi` (the
//! gateway's contract written back into it, merged or as an Overlay), and the coverage that
//! `idemgate check --openapi` adds to a check.
//!
//! Exit status: 0 done, 1 a file that cannot be read or a result that does not validate (or,
//! for `routes --config` without `--write`, a file the document would change), 2 usage.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use http::Method;
use idemgate::config::Config;
use idemgate::openapi::{self, Document, Format, Node, Operation};

/// `idemgate routes`.
#[derive(Args)]
#[command(after_help = "\
Examples:
  idemgate routes --from-openapi openapi.yaml > gateway.toml
                                   a whole configuration: the keyed operations, the rest passed through
  idemgate routes --from-openapi openapi.yaml --config gateway.toml
                                   what regenerating would change in the file, as a diff (exit 1 if any)
  idemgate routes --from-openapi openapi.yaml --config gateway.toml --write
                                   and change it: the block of routes from openapi.yaml, replaced whole")]
pub struct RoutesArgs {
    /// The OpenAPI 3.0 or 3.1 document (YAML or JSON) to make routes from.
    #[arg(long, value_name = "FILE")]
    from_openapi: PathBuf,
    /// Every POST and PATCH, not only the operations that declare an Idempotency-Key header.
    #[arg(long)]
    all: bool,
    /// The upstream the routes send to [default: the file's only upstream, or "api"].
    #[arg(long, value_name = "NAME")]
    upstream: Option<String>,
    /// A configuration to merge the routes into: show the difference, or write it (--write).
    #[arg(long, short, value_name = "PATH")]
    config: Option<PathBuf>,
    /// With --config: write the merged file instead of showing the difference.
    #[arg(long, requires = "config")]
    write: bool,
}

/// `idemgate openapi`.
#[derive(Args)]
#[command(after_help = "\
Examples:
  idemgate openapi --config gateway.toml --spec openapi.yaml > openapi.idempotent.yaml
                                   the document with the gateway's contract merged in
  idemgate openapi --config gateway.toml --spec openapi.yaml --overlay > idempotency.overlay.yaml
                                   the same change as an OpenAPI Overlay 1.0 document
  idemgate openapi --config gateway.toml > idempotency.overlay.yaml
                                   an overlay from the routes alone (paths as the routes write them)")]
pub struct OpenapiArgs {
    /// The configuration whose keyed routes make the contract [default: gateway.toml].
    #[arg(long, short, value_name = "PATH")]
    config: Option<PathBuf>,
    /// The API's OpenAPI document: merged with the contract (or, with --overlay, the overlay
    /// written for it).
    #[arg(long, value_name = "FILE")]
    spec: Option<PathBuf>,
    /// Write an OpenAPI Overlay 1.0 document even with --spec.
    #[arg(long)]
    overlay: bool,
    /// Without --spec: the prefix the routes' paths carry that the document's paths do not
    /// (its servers' path, such as /v1).
    #[arg(long, value_name = "PATH", conflicts_with = "spec", default_value = "")]
    base_path: String,
    /// JSON instead of YAML [default: the format of --spec, else YAML].
    #[arg(long)]
    json: bool,
}

/// A document read from `path`, with its operations; every problem printed.
pub fn read(path: &Path) -> Result<(Document, Vec<Operation>), ExitCode> {
    let shown = path.display();
    let text = match std::fs::metadata(path) {
        Ok(m) if m.len() > openapi::MOST_BYTES => {
            eprintln!("{shown}: {} bytes; the largest document read is {} bytes", m.len(), openapi::MOST_BYTES);
            return Err(ExitCode::FAILURE);
        }
        _ => std::fs::read_to_string(path),
    };
    let text = text.map_err(|e| {
        eprintln!("{shown}: cannot read: {e}");
        ExitCode::FAILURE
    })?;
    let doc = Document::parse(&text).map_err(|e| {
        eprintln!("{shown}: {e}");
        ExitCode::FAILURE
    })?;
    let operations = openapi::operations(&doc).map_err(|errors| {
        for e in errors {
            eprintln!("{shown}: {e}");
        }
        ExitCode::FAILURE
    })?;
    Ok((doc, operations))
}

/// `idemgate routes --from-openapi`.
pub fn routes(args: RoutesArgs) -> ExitCode {
    let (_, operations) = match read(&args.from_openapi) {
        Ok(read) => read,
        Err(code) => return code,
    };
    // The block is known by the document's file name, wherever it is run from.
    let source = args.from_openapi.file_name().map_or_else(|| "openapi".into(), |n| n.to_string_lossy().into_owned());
    let existing = match &args.config {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => match Config::from_toml(&text, &path.display().to_string()) {
                Ok(config) => Some((path, text, config)),
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && args.write => None,
            Err(e) => {
                eprintln!("{}: cannot read: {e}", path.display());
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let upstream = match (&args.upstream, &existing) {
        (Some(name), Some((path, _, config))) if !config.upstreams.iter().any(|u| &u.name == name) => {
            eprintln!("{}: has no upstream {name:?} (--upstream)", path.display());
            return ExitCode::FAILURE;
        }
        (Some(name), _) => name.clone(),
        (None, Some((path, _, config))) => match config.upstreams.as_slice() {
            [one] => one.name.clone(),
            many => {
                let names: Vec<&str> = many.iter().map(|u| u.name.as_str()).collect();
                eprintln!("{}: several upstreams ({}): say which with --upstream", path.display(), names.join(", "));
                return ExitCode::FAILURE;
            }
        },
        (None, None) => "api".to_owned(),
    };
    if upstream.is_empty() || !upstream.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        eprintln!("--upstream {upstream:?}: an upstream's name uses only A-Z a-z 0-9 - _");
        return ExitCode::from(2);
    }
    let options = openapi::Options { source: &source, upstream: &upstream, all: args.all };
    let block =
        openapi::block(&operations, &options, existing.as_ref().map(|(_, text, config)| (config, text.as_str())));
    for skipped in &block.skipped {
        eprintln!("skipped: {skipped}");
    }
    // One line per reason, whatever the number of routes it holds for.
    let mut reasons: Vec<(&str, Vec<&str>)> = Vec::new();
    for (route, why) in &block.to_decide {
        match reasons.iter_mut().find(|(w, _)| w == why) {
            Some((_, routes)) => routes.push(route),
            None => reasons.push((why, vec![route])),
        }
    }
    for (why, routes) in reasons {
        let more = if routes.len() > 3 { format!(" and {} more", routes.len() - 3) } else { String::new() };
        let names: Vec<String> = routes.iter().take(3).map(|r| format!("{r:?}")).collect();
        eprintln!(
            "to decide: the scope of {}{more} ({} # TO DECIDE): {why}",
            names.join(", "),
            if routes.len() == 1 { "its" } else { "their" }
        );
    }
    let path = args.config.as_ref();
    let (before, after) = match &existing {
        Some((path, text, _)) => match openapi::merged(text, &source, &block.text) {
            Ok(after) => (text.clone(), after),
            Err(why) => {
                eprintln!("{}: {why}", path.display());
                return ExitCode::FAILURE;
            }
        },
        // A file to be written that does not exist yet gets a whole configuration.
        None => (String::new(), openapi::standalone(&block.text, &options)),
    };
    // What is printed or written passes check as it is, or is neither printed nor written.
    let origin = path.map_or_else(|| "<routes>".to_owned(), |p| p.display().to_string());
    if let Err(e) = Config::from_toml(&after, &origin) {
        eprintln!("the routes made from {source} do not validate: {e}");
        return ExitCode::FAILURE;
    }
    eprintln!("{} routes from {} operations of {source}", block.routes, operations.len());
    let Some(path) = path else {
        print!("{after}");
        return ExitCode::SUCCESS;
    };
    if before == after {
        eprintln!("{}: up to date with {source}", path.display());
        return ExitCode::SUCCESS;
    }
    if args.write {
        return match replace(path, &after) {
            Ok(()) => {
                eprintln!("{}: written", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: cannot write: {e}", path.display());
                ExitCode::FAILURE
            }
        };
    }
    let shown = path.display().to_string();
    let diff = similar::TextDiff::from_lines(&before, &after);
    print!("{}", diff.unified_diff().context_radius(3).header(&shown, &format!("{shown} (from {source})")));
    eprintln!("{shown}: {source} changes it (above); --write writes it");
    ExitCode::FAILURE
}

/// Writes `text` over the file at `path` whole or not at all: into a file beside it (beside
/// what a link points at), with its permissions (a configuration may hold secrets), then
/// renamed over it, so that a gateway reloading meanwhile reads the old file or the new one.
fn replace(path: &Path, text: &str) -> std::io::Result<()> {
    let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut name = target.file_name().map(std::ffi::OsStr::to_os_string).unwrap_or_default();
    name.push(".idemgate-new");
    let temporary = target.with_file_name(name);
    std::fs::write(&temporary, text)?;
    let renamed = match std::fs::metadata(&target) {
        Ok(meta) => std::fs::set_permissions(&temporary, meta.permissions()),
        Err(_) => Ok(()),
    }
    .and_then(|()| std::fs::rename(&temporary, &target));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    renamed
}

/// `idemgate openapi`.
pub fn contract(args: OpenapiArgs, default_config: PathBuf) -> ExitCode {
    let path = args.config.unwrap_or(default_config);
    let config = match Config::load(&path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let base = config.server.problem_base.clone();
    let mut notes = Vec::new();
    let title = format!("The idempotency contract of {}", path.display());
    let (output, format) = match &args.spec {
        Some(spec) => {
            let (doc, operations) = match read(spec) {
                Ok(read) => read,
                Err(code) => return code,
            };
            let targets = openapi::targets_in(&config, &operations, &mut notes);
            let mut merged = doc.root.clone();
            openapi::merge(&mut merged, &doc, &targets, &base, &mut notes);
            eprintln!("{} operations of {} get the contract", targets.len(), spec.display());
            let output = if args.overlay {
                let name = spec.file_name().map(|n| n.to_string_lossy().into_owned());
                openapi::overlay(&doc.root, &merged, &title, name.as_deref())
            } else {
                merged
            };
            (output, doc.format)
        }
        None => {
            let targets = openapi::targets_of_routes(&config, &args.base_path, &mut notes);
            let skeleton = openapi::skeleton(&targets);
            let doc = Document { root: skeleton.clone(), format: Format::Yaml, version: "3.1.0".into() };
            let mut merged = skeleton.clone();
            openapi::merge(&mut merged, &doc, &targets, &base, &mut notes);
            notes.push(
                "without --spec the overlay is written blind: where the document already declares the key \
                 header, or writes a response the gateway may also give by $ref, applying it gives an invalid \
                 document; the header reaches only operations that list parameters. Give --spec to have it \
                 written for the document as it is"
                    .into(),
            );
            (openapi::overlay(&skeleton, &merged, &title, None), Format::Yaml)
        }
    };
    for note in &notes {
        eprintln!("note: {note}");
    }
    match write(&output, if args.json { Format::Json } else { format }) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cannot write the document: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write(node: &Node, format: Format) -> Result<String, String> {
    match format {
        Format::Json => serde_json::to_string_pretty(node).map(|s| s + "\n").map_err(|e| e.to_string()),
        Format::Yaml => serde_saphyr::to_string(node).map_err(|e| e.to_string()),
    }
}

/// `--unsafe-methods POST,PATCH,PUT`: methods in upper case.
pub fn methods(names: &[String]) -> Result<Vec<http::Method>, String> {
    names
        .iter()
        .map(|name| {
            let name = name.trim();
            http::Method::from_bytes(name.as_bytes())
                .ok()
                .filter(|_| !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase()))
                .ok_or_else(|| format!("--unsafe-methods: {name:?} is not an HTTP method in upper case, like POST"))
        })
        .collect()
}

/// `check --openapi`: what the configuration leaves of the document unprotected.
pub fn coverage(config: &Config, spec: &Path, methods: &[Method]) -> ExitCode {
    let (_, operations) = match read(spec) {
        Ok(read) => read,
        Err(code) => return code,
    };
    let shown = spec.display();
    let found = openapi::coverage(&config.routes, &operations, methods);
    for finding in &found.findings {
        println!("{shown}: {finding}");
    }
    let methods: Vec<&str> = methods.iter().map(Method::as_str).collect();
    println!(
        "{shown}: {} of {} unsafe operations ({}) protected by a route that enforces idempotency",
        found.covered,
        found.unsafe_operations,
        methods.join(", ")
    );
    ExitCode::SUCCESS
}
