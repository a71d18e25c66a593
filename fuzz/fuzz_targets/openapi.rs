//! An API's OpenAPI document, as `idemgate routes --from-openapi` and `idemgate openapi` read
//! it: any bytes are read or refused with a place, never a panic; the routes written for any
//! document are TOML that reads back (a hostile path, operationId or header name cannot
//! close a string or start a table: the configuration may be refused, never misread); and the
//! contract merged into it and written as an overlay never panics.
#![no_main]

use idemgate::config::{Config, ConfigError};
use idemgate::openapi::{Document, Options, block, merge, operations, overlay, standalone, targets_in};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(doc) = Document::parse(text) else { return };
    let Ok(ops) = operations(&doc) else { return };
    let options = Options { source: "api.yaml", upstream: "api", all: true };
    let routes = block(&ops, &options, None);
    let toml = standalone(&routes.text, &options);
    let config = match Config::from_toml(&toml, "<fuzz>") {
        Err(ConfigError::Syntax { message, .. }) => panic!("the routes do not read back as TOML: {message}\n{toml}"),
        Err(_) => return,
        Ok(config) => config,
    };
    let mut notes = Vec::new();
    let targets = targets_in(&config, &ops, &mut notes);
    let mut merged = doc.root.clone();
    merge(&mut merged, &doc, &targets, "https://example.com/errors#", &mut notes);
    let _ = overlay(&doc.root, &merged, "fuzz", None);
    serde_json::to_string(&merged).expect("the merged document writes as JSON");
});
