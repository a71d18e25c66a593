//! The Docker demo stack, checked without Docker: `docker-compose.yml`, the `Dockerfile`,
//! `.dockerignore` and `deploy/compose/gateway.toml` must agree with each other and with
//! the binaries this workspace builds.
//!
//! Each checker takes the parsed [`Stack`] and returns a list of problems, each naming the
//! service, key or file that rotted. The `#[test]`s assert the list is empty for the real
//! files; the `broken_*` tests feed in-memory mutations of them and assert it is not, so
//! every checker provably fails when it should.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use idemgate::config::{Config, StoreBackendConfig};
use serde_yaml_ng::Value;

/// The compose file, relative to the repository root.
pub(crate) const COMPOSE_FILE: &str = "docker-compose.yml";
/// The services the demo promises (deploy/compose/README.md).
pub(crate) const EXPECTED_SERVICES: [&str; 5] = ["redis", "postgres", "orders", "gateway-a", "gateway-b"];
/// The gateway services, which share one Redis.
pub(crate) const GATEWAYS: [&str; 2] = ["gateway-a", "gateway-b"];
/// What each service must wait for.
pub(crate) const REQUIRED_DEPENDENCIES: [(&str, &[&str]); 3] =
    [("gateway-a", &["redis", "orders"]), ("gateway-b", &["redis", "orders"]), ("orders", &["postgres"])];
/// The program each workspace binary is run as inside the image.
pub(crate) const GATEWAY_BIN: &str = "idemgate";
pub(crate) const ORDERS_BIN: &str = "order-service";
/// Directories on the runtime image's PATH (debian:bookworm-slim).
pub(crate) const PATH_DIRS: [&str; 6] = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"];

mod binaries;
mod checks;
mod dockerfile;
mod model;
mod util;

use binaries::*;
use checks::*;
use dockerfile::*;
use model::*;
use util::*;

// Tests on the real files

#[track_caller]
fn assert_clean(what: &str, problems: Vec<String>) {
    assert!(problems.is_empty(), "the Docker demo stack rotted ({what}):\n  - {}", problems.join("\n  - "));
}

#[test]
fn services_are_all_there() {
    assert_clean("services", check_services_present(&Stack::load()));
}

#[test]
fn every_service_has_a_working_healthcheck() {
    assert_clean("healthchecks", check_healthchecks(&Stack::load()));
}

#[test]
fn depends_on_waits_for_healthy_services() {
    assert_clean("depends_on", check_depends_on(&Stack::load()));
}

#[test]
fn published_ports_are_unique_and_listened_on() {
    assert_clean("ports", check_ports(&Stack::load()));
}

#[test]
fn mounted_and_built_paths_exist() {
    assert_clean("paths", check_paths_exist(&Stack::load()));
}

#[test]
fn mounted_gateway_configs_load() {
    let stack = Stack::load();
    assert_clean("gateway config", check_gateway_configs(&stack));
    for svc in stack.services_running(GATEWAY_BIN) {
        let (source, _) = stack.gateway_config_source(svc).unwrap();
        if let Err(e) = Config::load(&stack.root.join(&source)) {
            panic!("service `{}`: Config::load({}): {e}", svc.name, source.display());
        }
    }
}

#[test]
fn mounted_gateway_configs_pass_idemgate_check() {
    let stack = Stack::load();
    let configs: BTreeSet<PathBuf> = stack
        .services_running(GATEWAY_BIN)
        .into_iter()
        .map(|svc| {
            stack.gateway_config_source(svc).map(|(p, _)| p).unwrap_or_else(|e| panic!("service `{}`: {e}", svc.name))
        })
        .collect();
    assert!(!configs.is_empty(), "no service runs idemgate with a mounted config");
    for config in configs {
        let out = Command::new(env!("CARGO_BIN_EXE_idemgate"))
            .arg("check")
            .arg("--config")
            .arg(&config)
            .current_dir(&stack.root)
            .output()
            .expect("run idemgate check");
        assert!(
            out.status.success(),
            "idemgate check --config {} failed ({}):\n{}",
            config.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn gateway_config_agrees_with_compose() {
    assert_clean("gateway config vs compose", check_config_agrees_with_compose(&Stack::load()));
}

#[test]
fn commands_use_only_flags_the_binaries_have() {
    assert_clean("command flags", check_command_flags(&Stack::load()));
}

#[test]
fn orders_database_url_matches_postgres() {
    assert_clean("database URL", check_database_url(&Stack::load()));
}

#[test]
fn every_variable_has_a_default() {
    assert_clean("variables", check_variables(&Stack::load()));
}

#[test]
fn dockerfile_builds_and_ships_both_binaries() {
    assert_clean("Dockerfile", check_dockerfile(&Stack::load()));
}

/// What keeps the files usable beyond the newest tools, and the image small: docker-compose v1 (1.29, still shipped
/// by some distributions) rejects top-level keys other than these, among them `name:`; and a
/// `# syntax=` directive makes BuildKit pull a frontend image before building, which fails
/// offline and behind registries that mirror only base images.
fn check_portability(compose: &str, dockerfile: &str, manifest: &str) -> Vec<String> {
    const TOP_LEVEL: [&str; 6] = ["version", "services", "volumes", "networks", "secrets", "configs"];
    let mut problems = Vec::new();
    match serde_yaml_ng::from_str::<Value>(compose) {
        Ok(Value::Mapping(doc)) => {
            for key in doc.keys().filter_map(Value::as_str) {
                if !TOP_LEVEL.contains(&key) && !key.starts_with("x-") {
                    problems.push(format!("{COMPOSE_FILE}: top-level `{key}:` is rejected by docker-compose v1"));
                }
            }
        }
        other => problems.push(format!("{COMPOSE_FILE}: not a YAML mapping: {other:?}")),
    }
    // The shipped binaries are stripped: by the release profile the image builds with, or by
    // a strip step of its own.
    let profile_strips = manifest
        .parse::<toml::Table>()
        .ok()
        .and_then(|m| m.get("profile")?.get("release")?.get("strip").cloned())
        .is_some_and(|strip| strip.as_str() == Some("symbols") || strip.as_bool() == Some(true));
    let builds_release = dockerfile.lines().any(|l| l.trim_start().starts_with("RUN cargo build --release"));
    for bin in [GATEWAY_BIN, ORDERS_BIN] {
        let strip_step = dockerfile.lines().any(|l| {
            l.trim_start().starts_with("RUN") && l.contains("strip ") && l.contains(&format!("target/release/{bin}"))
        });
        if !(strip_step || profile_strips && builds_release) {
            problems.push(format!(
                "Dockerfile: `{bin}` is shipped unstripped (strip = \"symbols\" in Cargo.toml's [profile.release], or RUN strip target/release/{bin})"
            ));
        }
    }
    // Parser directives are `# key=value` comments before anything else in the file.
    for line in dockerfile.lines().take_while(|l| l.starts_with('#')) {
        let directive = line.trim_start_matches('#').trim().to_ascii_lowercase();
        if directive.starts_with("syntax=") {
            problems.push(format!("Dockerfile: `{line}` makes BuildKit fetch a frontend image before building"));
        }
    }
    problems
}

fn read_repo_file(file: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap()
}

#[test]
fn compose_file_works_with_compose_v1_and_dockerfile_builds_offline() {
    assert_clean(
        "portability",
        check_portability(&read_repo_file(COMPOSE_FILE), &read_repo_file("Dockerfile"), &read_repo_file("Cargo.toml")),
    );
}

#[test]
fn broken_portability_is_caught() {
    let dockerfile = read_repo_file("Dockerfile");
    let compose = read_repo_file(COMPOSE_FILE);
    let manifest = read_repo_file("Cargo.toml");
    assert_caught(check_portability(&format!("name: demo\n{compose}"), &dockerfile, &manifest), "top-level `name:`");
    assert_caught(
        check_portability(&compose, &format!("# syntax=docker/dockerfile:1\n{dockerfile}"), &manifest),
        "fetch a frontend image",
    );
    assert_caught(
        check_portability(&compose, &dockerfile, &manifest.replace("strip = \"symbols\"", "strip = \"none\"")),
        "`idemgate` is shipped unstripped",
    );
}

// The checkers catch rot: in-memory mutations of the real files

/// The real file with the first `from` replaced by `to` (which must be there, so a
/// mutation that no longer applies fails instead of passing vacuously).
fn mutate(file: &'static str, from: &str, to: &str) -> (&'static str, String) {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    assert!(text.contains(from), "{file} no longer contains {from:?}: update this mutation");
    (file, text.replacen(from, to, 1))
}

#[track_caller]
fn assert_caught(problems: Vec<String>, needle: &str) {
    assert!(problems.iter().any(|p| p.contains(needle)), "expected a problem mentioning {needle:?}, got {problems:#?}");
}

#[test]
fn broken_depends_on_condition_is_caught() {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(COMPOSE_FILE)).unwrap();
    // gateway-b's orders-2 dependency: the last `condition: service_healthy` in the file.
    let at = text.rfind("condition: service_healthy").expect("a service_healthy condition");
    let broken =
        format!("{}condition: service_started{}", &text[..at], &text[at + "condition: service_healthy".len()..]);
    let problems = check_depends_on(&Stack::load_with(&[(COMPOSE_FILE, broken)]));
    assert_caught(problems, "service `gateway-b`: depends_on `orders-2` uses condition service_started");
}

#[test]
fn broken_short_depends_on_and_unknown_service_are_caught() {
    let stack = Stack::load_with(&[mutate(
        COMPOSE_FILE,
        "    depends_on:\n      postgres:\n        condition: service_healthy\n",
        "    depends_on: [postgress]\n",
    )]);
    let problems = check_depends_on(&stack);
    assert_caught(problems.clone(), "depends_on `postgress`, which is not a service");
    assert_caught(problems.clone(), "service_started (short syntax)");
    assert_caught(problems, "service `orders`: does not depend on `postgres`");
}

#[test]
fn broken_duplicate_host_port_is_caught() {
    let stack = Stack::load_with(&[mutate(COMPOSE_FILE, "127.0.0.1:8082:8080", "127.0.0.1:8081:8080")]);
    assert_caught(check_ports(&stack), "host port 8081/tcp is also published by");
}

#[test]
fn broken_orders_port_is_caught_everywhere_it_matters() {
    let stack = Stack::load_with(&[mutate(COMPOSE_FILE, "- 0.0.0.0:3000", "- 0.0.0.0:3001")]);
    assert_caught(check_ports(&stack), "service `orders`: publishes container port 3000, but it listens on {3001}");
    assert_caught(check_healthchecks(&stack), "service `orders`: healthcheck probes port 3000");
    assert_caught(check_config_agrees_with_compose(&stack), "but service `orders` listens on {3001}");
}

#[test]
fn broken_gateway_config_is_caught() {
    let config = "deploy/compose/gateway.toml";
    // The admin port moves: the published 9090 and the /readyz healthcheck no longer reach it.
    let stack =
        Stack::load_with(&[mutate(config, "admin_listen = \"0.0.0.0:9090\"", "admin_listen = \"0.0.0.0:9999\"")]);
    assert_caught(check_ports(&stack), "service `gateway-a`: publishes container port 9090");
    assert_caught(check_healthchecks(&stack), "service `gateway-b`: healthcheck probes port 9090");
    // Loopback listener, wrong Redis host, an upstream that is not a service.
    let stack = Stack::load_with(&[mutate(config, "listen = \"0.0.0.0:8080\"", "listen = \"127.0.0.1:8080\"")]);
    assert_caught(check_config_agrees_with_compose(&stack), "server.listen = 127.0.0.1:8080 is loopback-only");
    let stack = Stack::load_with(&[mutate(config, "redis://redis:6379", "redis://cache:6379")]);
    assert_caught(check_config_agrees_with_compose(&stack), "store.url host `cache` is not a compose service");
    let stack = Stack::load_with(&[mutate(config, "http://orders:3000", "http://order:3000")]);
    assert_caught(
        check_config_agrees_with_compose(&stack),
        "upstreams.orders.url host `order` is not a compose service",
    );
    // An invalid value.
    let stack = Stack::load_with(&[mutate(config, "lease = \"10s\"", "lease = \"10 parsecs\"")]);
    assert_caught(check_gateway_configs(&stack), "lease");
}

#[test]
fn broken_config_mount_is_caught() {
    let stack = Stack::load_with(&[mutate(
        COMPOSE_FILE,
        "./deploy/compose/gateway.toml:/etc/idemgate/gateway.toml:ro",
        "./deploy/compose/gateway.toml:/etc/idemgate/idemgate.toml:ro",
    )]);
    assert_caught(
        check_config_agrees_with_compose(&stack),
        "service `gateway-a`: --config /etc/idemgate/gateway.toml is not a mounted file",
    );
    let stack = Stack::load_with(&[mutate(COMPOSE_FILE, "./deploy/compose/gateway.toml:", "./deploy/gateway.toml:")]);
    assert_caught(
        check_paths_exist(&stack),
        "service `gateway-a`: mounts `./deploy/gateway.toml`, which does not exist",
    );
}

#[test]
fn broken_healthcheck_is_caught() {
    let stack = Stack::load_with(&[mutate(
        COMPOSE_FILE,
        "    healthcheck:\n      test: [\"CMD\", \"redis-cli\", \"ping\"]\n",
        "    x-no-healthcheck:\n      test: [\"CMD\", \"redis-cli\", \"ping\"]\n",
    )]);
    assert_caught(check_healthchecks(&stack), "service `redis`: has no healthcheck");
    assert_caught(check_depends_on(&stack), "depends_on `redis`, which has no healthcheck");
}

#[test]
fn broken_command_flag_is_caught() {
    let stack = Stack::load_with(&[mutate(COMPOSE_FILE, "- --database", "- --db")]);
    assert_caught(check_command_flags(&stack), "service `orders`: `order-service` has no flag `--db`");
    assert_caught(check_database_url(&stack), "service `orders`: passes no --database");
}

#[test]
fn broken_database_credentials_are_caught() {
    let stack = Stack::load_with(&[mutate(COMPOSE_FILE, "POSTGRES_PASSWORD: orders", "POSTGRES_PASSWORD: secret")]);
    assert_caught(
        check_database_url(&stack),
        "--database password Some(\"orders\") does not match `postgres`'s POSTGRES_PASSWORD",
    );
}

#[test]
fn broken_variable_without_default_is_caught() {
    let stack = Stack::load_with(&[mutate(COMPOSE_FILE, "${RUST_LOG:-info}", "${RUST_LOG}")]);
    assert_caught(check_variables(&stack), "`${RUST_LOG}` has no default");
}

#[test]
fn broken_dockerfile_is_caught() {
    let stack = Stack::load_with(&[mutate("Dockerfile", "USER 10001:10001", "USER root")]);
    assert_caught(check_dockerfile(&stack), "the final stage runs as root");
    let stack = Stack::load_with(&[mutate(
        "Dockerfile",
        " /src/target/release/order-service /usr/local/bin/",
        " /usr/local/bin/",
    )]);
    assert_caught(
        check_dockerfile(&stack),
        "service `orders`: runs `order-service`, which Dockerfile's final stage does not install",
    );
    let stack = Stack::load_with(&[mutate("Dockerfile", "CMD [\"idemgate\",", "CMD [\"idemgated\",")]);
    assert_caught(check_services_present(&stack), "service `gateway-a`: runs `idemgated`, expected `idemgate`");
}

#[test]
fn broken_dockerignore_is_caught() {
    let stack = Stack::load_with(&[(".dockerignore", "target/\ndeploy/\n".to_owned())]);
    assert_caught(check_paths_exist(&stack), ".dockerignore excludes `deploy/compose/gateway.toml`");
    let stack = Stack::load_with(&[(".dockerignore", "**/*.lock\n!Cargo.toml\n".to_owned())]);
    assert_caught(check_paths_exist(&stack), ".dockerignore excludes `Cargo.lock`");
}

#[test]
fn helpers_parse_what_compose_accepts() {
    assert_eq!(split_words("a 'b c' \"d\"e").unwrap(), ["a", "b c", "de"]);
    let port = parse_port(&Value::String("[::1]:8081:8080/udp".into())).unwrap();
    assert_eq!((port.published, port.target, port.protocol.as_str()), (Some(8081), 8080, "udp"));
    let url = parse_url("postgres://u:p@db:5432/name?sslmode=disable").unwrap();
    assert_eq!(
        url,
        Url {
            scheme: "postgres".into(),
            user: Some("u".into()),
            password: Some("p".into()),
            host: "db".into(),
            port: Some(5432),
            path: "/name".into()
        }
    );
    let env = BTreeMap::from([("SET".to_owned(), "yes".to_owned())]);
    let (text, problems) = interpolate("a: ${SET}\nb: ${UNSET:-d}\nc: $$HOME\nd: $UNSET\n", &env);
    assert_eq!(text, "a: yes\nb: d\nc: $HOME\nd: \n");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(dockerignore_excludes(&["target/".into()], "target/debug/x"));
    assert!(!dockerignore_excludes(&["*.db".into(), "!keep.db".into()], "keep.db"));
    assert!(dockerignore_excludes(&["**/*.db".into()], "a/b/c.db"));
}
