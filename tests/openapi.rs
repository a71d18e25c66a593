//! The API's OpenAPI document, through the real binary: `idemgate routes --from-openapi`
//! (routes that pass check and protect what the document keys, regenerated as a diff of
//! their block, names kept when an operationId changes), `idemgate check --openapi` (what is
//! left unprotected, said truthfully: the upstream sees it run twice), `idemgate openapi` (the
//! contract merged in, and the same as an Overlay), and bad documents refused with the place.
//! A real validator and a generated client read the output in `scripts/openapi-check`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use http::Method;
use serde_json::Value;

use crate::support::gateway_proc::GatewayProc;
use crate::support::upstream::TestUpstream;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openapi/fixtures").join(name)
}

fn idemgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idemgate")).args(args).output().expect("idemgate runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The standalone configuration for `doc`, pointed at `upstream` on the memory store.
fn configuration(doc: &Path, upstream: std::net::SocketAddr) -> String {
    let out = idemgate(&["routes", "--from-openapi", doc.to_str().unwrap(), "--upstream", "app"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let toml = text(&out.stdout);
    let replaced = toml
        .replace("listen = \"127.0.0.1:8080\"", "listen = \"127.0.0.1:0\"")
        .replace("admin_listen = \"127.0.0.1:9090\"", "admin_listen = \"127.0.0.1:0\"")
        .replace("backend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"", "backend = \"memory\"")
        .replace("url = \"http://127.0.0.1:3000\"", &format!("url = \"http://{upstream}\""));
    assert_ne!(replaced, toml);
    replaced
}

#[tokio::test]
async fn routes_from_a_document_pass_check_and_protect_what_it_keys() {
    let upstream = TestUpstream::start().await;
    let doc = fixture("payments.yaml");
    let toml = configuration(&doc, upstream.addr);
    // The names come from method and path, the scope from the document's apiKey scheme.
    assert!(toml.contains("name = \"post-payments\"\nmethods = [\"POST\"]\npath = \"/v1/payments\""), "{toml}");
    assert!(toml.contains("scope = \"header:X-Api-Key\""), "{toml}");
    assert!(toml.contains("# createRefund: POST /v1/payments/{payment_id}/refunds"), "{toml}");
    assert!(toml.contains("required = false"), "the refund key is optional in the document:\n{toml}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.toml");
    std::fs::write(&file, &toml).unwrap();
    let check = idemgate(&["check", "--config", file.to_str().unwrap(), "--openapi", doc.to_str().unwrap()]);
    let said = text(&check.stdout);
    assert!(check.status.success(), "{said}{}", text(&check.stderr));
    assert!(said.contains("3 of 5 unsafe operations (POST, PATCH) protected"), "{said}");
    assert!(said.contains("paths./payments/{payment_id}/capture.post: POST /v1/payments/{payment_id}/capture reaches route \"passthrough\""), "{said}");
    assert!(said.contains("paths./customers/{customer_id}.patch: PATCH"), "{said}");

    let gateway = GatewayProc::start(&toml);
    let client = gateway.client();
    let caller = [("x-api-key", "sk_test_1"), ("idempotency-key", "k-1"), ("content-type", "application/json")];
    let first = client.send(Method::POST, "/v1/payments", &caller, r#"{"amount":2500}"#).await;
    let again = client.send(Method::POST, "/v1/payments", &caller, r#"{"amount":2500}"#).await;
    assert_eq!((first.status.as_u16(), again.status.as_u16()), (201, 201));
    assert!(again.is_replay(), "the retry is replayed");
    // Another caller's key of the same name is its own.
    let other = [("x-api-key", "sk_test_2"), ("idempotency-key", "k-1"), ("content-type", "application/json")];
    assert!(!client.send(Method::POST, "/v1/payments", &other, r#"{"amount":2500}"#).await.is_replay());
    let anonymous = client.send(Method::POST, "/v1/payments", &caller[1..], r#"{"amount":2500}"#).await;
    assert_eq!(anonymous.status, 400, "no X-Api-Key: {}", anonymous.problem());
    // What coverage said is left out is left out: the capture runs twice.
    let capture = "/v1/payments/pay_1/capture";
    client.send(Method::POST, capture, &caller, "{}").await;
    client.send(Method::POST, capture, &caller, "{}").await;
    let seen: Vec<(String, String)> = upstream.seen().iter().map(|s| (s.method.clone(), s.path.clone())).collect();
    let payments = seen.iter().filter(|(_, p)| p == "/v1/payments").count();
    assert_eq!(payments, 2, "once per caller, never for the retry or the anonymous call: {seen:?}");
    assert_eq!(seen.iter().filter(|(_, p)| p == capture).count(), 2, "{seen:?}");
}

#[test]
fn regenerating_is_a_diff_of_the_block_and_keeps_route_names() {
    let dir = tempfile::tempdir().unwrap();
    let doc = dir.path().join("payments.yaml");
    let original = std::fs::read_to_string(fixture("payments.yaml")).unwrap();
    std::fs::write(&doc, &original).unwrap();
    let file = dir.path().join("gateway.toml");
    let (doc_s, file_s) = (doc.to_str().unwrap(), file.to_str().unwrap());
    let write = idemgate(&["routes", "--from-openapi", doc_s, "--config", file_s, "--write"]);
    assert!(write.status.success(), "{}", text(&write.stderr));
    let written = std::fs::read_to_string(&file).unwrap();
    // A hand-written route beside the block, covering one operation itself.
    let hand = "\n[[routes]]\nname = \"capture\"\nmethods = [\"POST\"]\npath = \"/v1/payments/{payment_id}/capture\"\n\
                upstream = \"api\"\n[routes.idempotency]\nscope = \"header:X-Api-Key\"\nrequired = false\n";
    std::fs::write(&file, format!("{written}{hand}")).unwrap();
    let same = idemgate(&["routes", "--from-openapi", doc_s, "--config", file_s, "--all"]);
    let diff = text(&same.stdout);
    assert_eq!(same.status.code(), Some(1), "--all adds the PATCH: {diff}");
    assert!(
        text(&same.stderr).contains(
            "capturePayment (POST /v1/payments/{payment_id}/capture): route \"capture\" of the file covers it already"
        ),
        "{}",
        text(&same.stderr)
    );
    assert!(diff.contains("+name = \"patch-customers-customer_id\""), "{diff}");
    assert!(!diff.contains("capture\"\n"), "{diff}");
    // A renamed operationId changes a comment, never a name.
    std::fs::write(&doc, original.replace("operationId: createPayment", "operationId: chargeCard")).unwrap();
    // A configuration may hold secrets: rewriting it keeps its permissions.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let renamed = idemgate(&["routes", "--from-openapi", doc_s, "--config", file_s]);
    let diff = text(&renamed.stdout);
    let changed: Vec<&str> = diff
        .lines()
        .filter(|l| (l.starts_with('+') || l.starts_with('-')) && !l.starts_with("+++") && !l.starts_with("---"))
        .collect();
    assert_eq!(
        changed,
        [
            "-# createPayment: POST /v1/payments (paths./payments.post)",
            "+# chargeCard: POST /v1/payments (paths./payments.post)"
        ],
        "{diff}"
    );
    let write = idemgate(&["routes", "--from-openapi", doc_s, "--config", file_s, "--write"]);
    assert!(write.status.success(), "{}", text(&write.stderr));
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "nothing left beside it");
    let again = idemgate(&["routes", "--from-openapi", doc_s, "--config", file_s]);
    assert!(again.status.success() && again.stdout.is_empty(), "{}", text(&again.stderr));
    assert!(text(&again.stderr).contains("up to date"), "{}", text(&again.stderr));
    let check = idemgate(&["check", "--config", file_s]);
    assert!(check.status.success(), "{}", text(&check.stderr));
}

#[test]
fn a_document_without_security_says_so_and_never_guesses() {
    let out = idemgate(&["routes", "--from-openapi", fixture("orders-3.0.json").to_str().unwrap()]);
    let (toml, said) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{said}");
    assert!(toml.contains("path = \"/api/orders\""), "the servers' path prefix: {toml}");
    assert!(toml.contains("# TO DECIDE: no caller can be read from the document"), "{toml}");
    assert!(toml.contains("scope = \"global\""), "{toml}");
    assert!(said.contains("to decide: the scope of \"post-orders\" (its # TO DECIDE)"), "{said}");
    assert!(!toml.contains("cancel"), "cancel declares no key and --all was not given: {toml}");
}

#[test]
fn bad_documents_are_refused_with_the_place() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &str); 8] = [
        ("swagger: '2.0'\ninfo: {title: t, version: '1'}\npaths: {}\n", "swagger: this is a Swagger 2.0 document"),
        (
            "openapi: 3.1.0\npaths:\n  /o:\n    post:\n      parameters:\n        - $ref: 'common.yaml#/p'\n",
            "paths./o.post.parameters[0].$ref: \"common.yaml#/p\" points outside this document",
        ),
        (
            "openapi: 3.1.0\npaths:\n  /o:\n    post:\n      parameters:\n        - $ref: '#/components/parameters/A'\ncomponents:\n  parameters:\n    A: {$ref: '#/components/parameters/A'}\n",
            "a loop",
        ),
        (
            "openapi: 3.1.0\npaths:\n  /o:\n    post:\n      parameters:\n        - {in: header}\n",
            "paths./o.post.parameters[0]: a parameter needs a string `name` and `in`",
        ),
        ("openapi: 3.1.0\npaths:\n  o:\n    post: {}\n", "paths.o: a path must start with '/'"),
        (
            "openapi: 3.1.0\npaths:\n  /o:\n    post: {security: [{nope: []}]}\n",
            "components.securitySchemes.nope: a security requirement names this scheme",
        ),
        ("openapi: 3.1.0\npaths: [\n", "not YAML"),
        (
            "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n",
            "budget",
        ),
    ];
    for (i, (doc, expected)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("{i}.yaml"));
        std::fs::write(&path, doc).unwrap();
        let out = idemgate(&["routes", "--from-openapi", path.to_str().unwrap()]);
        let said = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{doc}: {said}");
        assert!(said.contains(expected), "{doc}: expected {expected:?} in {said}");
        assert!(out.stdout.is_empty(), "nothing printed for a bad document: {}", text(&out.stdout));
    }
}

#[test]
fn coverage_names_keyed_routes_that_match_nothing_and_keys_read_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.toml");
    let toml = "[server]\nlisten = \"127.0.0.1:0\"\n[store]\nbackend = \"memory\"\n[upstreams.api]\nurl = \"http://127.0.0.1:9\"\n\
                [[routes]]\nname = \"pay\"\nmethods = [\"POST\"]\npath = \"/v1/payments\"\nupstream = \"api\"\n\
                [routes.idempotency]\nrequired = false\nscope = \"header:X-Api-Key\"\n\
                [[routes]]\nname = \"ghost\"\nmethods = [\"POST\"]\npath = \"/v1/ghosts\"\nupstream = \"api\"\n\
                [routes.idempotency]\nscope = \"header:X-Api-Key\"\n";
    std::fs::write(&file, toml).unwrap();
    let out = idemgate(&[
        "check",
        "--config",
        file.to_str().unwrap(),
        "--openapi",
        fixture("payments.yaml").to_str().unwrap(),
        "--unsafe-methods",
        "POST,PATCH,PUT,DELETE",
    ]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(said.contains("route \"ghost\" (POST /v1/ghosts) is keyed but matches no operation"), "{said}");
    assert!(
        said.contains(
            "paths./payments.post: route \"pay\" has required = false while the document requires Idempotency-Key"
        ),
        "{said}"
    );
    assert!(
        said.contains("paths./customers.post: POST /v1/customers matches no route: the gateway answers it 404"),
        "{said}"
    );
    assert!(said.contains("1 of 7 unsafe operations (POST, PATCH, PUT, DELETE) protected"), "{said}");
    let bad =
        idemgate(&["check", "--config", file.to_str().unwrap(), "--openapi", "x.yaml", "--unsafe-methods", "post"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
}

/// The merged document, parsed.
fn merged(config: &Path, extra: &[&str]) -> Value {
    let doc = fixture("payments.yaml");
    let mut args = vec!["openapi", "--config", config.to_str().unwrap(), "--spec", doc.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    let out = idemgate(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

#[tokio::test]
async fn the_contract_goes_into_the_keyed_operations_only() {
    let upstream = TestUpstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.toml");
    // The generated routes, and one by hand for the capture, which declares no key.
    let capture = "\n[[routes]]\nname = \"capture\"\nmethods = [\"POST\"]\npath = \"/v1/payments/{id}/capture\"\n\
                   upstream = \"app\"\n[routes.idempotency]\nmax_key_len = 64\n";
    std::fs::write(&file, configuration(&fixture("payments.yaml"), upstream.addr) + capture).unwrap();
    let doc = merged(&file, &[]);
    let create = &doc["paths"]["/payments"]["post"];
    let keys: Vec<&Value> =
        create["parameters"].as_array().unwrap().iter().filter(|p| p.to_string().contains("IdempotencyKey")).collect();
    assert_eq!(keys.len(), 1, "declared by reference already, not added twice: {}", create["parameters"]);
    let list = &doc["paths"]["/payments"]["get"];
    assert!(!list.to_string().contains("Idempotency"), "not keyed, not changed: {list}");
    let capture = &doc["paths"]["/payments/{payment_id}/capture"]["post"]["parameters"];
    let added = capture.as_array().unwrap().iter().find(|p| p["name"] == "Idempotency-Key");
    let added = added.unwrap_or_else(|| panic!("the key is added where the document does not declare it: {capture}"));
    assert_eq!(
        (&added["in"], &added["required"], &added["schema"]["maxLength"]),
        (&"header".into(), &true.into(), &64.into())
    );
    let refund = &doc["paths"]["/payments/{payment_id}/refunds"]["post"];
    let responses = &refund["responses"];
    for status in ["400", "408", "409", "413", "422", "502", "503", "504"] {
        assert!(responses[status]["content"]["application/problem+json"].is_object(), "{status}: {responses}");
    }
    assert_eq!(responses["409"]["headers"]["Retry-After"]["$ref"], "#/components/headers/IdempotencyRetryAfter");
    assert_eq!(responses["201"]["headers"]["Idempotent-Replay"]["$ref"], "#/components/headers/IdempotentReplay");
    assert!(responses["201"]["content"]["application/problem+json"].is_object(), "response-not-stored: {responses}");
    assert!(!responses.as_object().unwrap().contains_key("429"), "no max_new_keys on this route");
    // A shared response was copied into the keyed operation, never changed where it is shared.
    let shared = &doc["components"]["responses"]["Error"];
    assert!(!shared.to_string().contains("Idempotent-Replay"), "{shared}");
    assert_eq!(doc["components"]["schemas"]["IdempotencyProblem"]["required"][0], "type");
    // The API's own error shape, where the file sets one.
    let shaped = std::fs::read_to_string(&file).unwrap()
        + "\n[errors]\ncontent_type = \"application/json\"\nbody = '{\"error\": {\"code\": \"{type}\", \"message\": \"{detail}\"}}'\n\
           [errors.key-reused]\nstatus = 400\n";
    std::fs::write(&file, shaped).unwrap();
    let doc = merged(&file, &[]);
    let responses = &doc["paths"]["/payments/{payment_id}/refunds"]["post"]["responses"];
    assert!(!responses["422"]["description"].as_str().unwrap().contains("key-reused"), "moved to 400: {responses}");
    assert!(!responses["400"]["content"].as_object().unwrap().contains_key("application/problem+json"), "{responses}");
    let schema = &responses["409"]["content"]["application/json"]["schema"];
    assert_eq!(schema["properties"]["error"]["properties"]["code"]["type"], "string", "{responses}");
}
