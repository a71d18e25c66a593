//! The Kubernetes example (`deploy/kubernetes/`), checked without a cluster: the config in
//! the ConfigMap loads, the probes hit the admin endpoints on the admin port, the pod drains
//! within its grace period, and the budget and Service select the Deployment's pods.

use std::path::Path;
use std::time::Duration;

use idemgate::config::Config;
use serde_yaml_ng::Value;

fn manifest(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn config() -> Config {
    let map = manifest("configmap.yaml");
    let text = map["data"]["gateway.toml"].as_str().expect("data.gateway.toml");
    // The token comes from the Secret at run time; a stand-in here.
    let env = |name: &str| (name == "IDEMGATE_ADMIN_TOKEN").then(|| "a-token-of-at-least-16-chars".to_owned());
    Config::from_toml_with_env(text, "configmap.yaml", &env).unwrap_or_else(|e| panic!("{e}"))
}

fn container() -> Value {
    manifest("deployment.yaml")["spec"]["template"]["spec"]["containers"][0].clone()
}

fn port_named(name: &str) -> u64 {
    container()["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port named {name}"))
}

#[test]
fn the_config_loads_and_listens_where_the_pod_says() {
    let config = config();
    // The probes need the admin port on the pod's address; the Service does not expose it,
    // and check says so.
    assert!(config.warnings.iter().any(|w| w.key == "server.admin_listen"));
    assert_eq!(u64::from(config.server.listen.port()), port_named("http"));
    assert_eq!(config.server.admin_listen.map(|a| u64::from(a.port())), Some(port_named("admin")));
    assert!(config.server.admin_token.is_some(), "the admin token comes from the environment");
}

#[test]
fn probes_hit_the_admin_endpoints() {
    let c = container();
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "admin");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "admin");
    assert_eq!(c["env"][0]["name"], "IDEMGATE_ADMIN_TOKEN");
}

#[test]
fn a_pod_drains_within_its_grace_period() {
    let deployment = manifest("deployment.yaml");
    let grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"].as_u64().unwrap();
    let pause: u64 = container()["lifecycle"]["preStop"]["exec"]["command"][1].as_str().unwrap().parse().unwrap();
    let shutdown = config().server.shutdown_grace;
    // preStop pause, then the drain, then a second for answers of abandoned exchanges.
    let needed = Duration::from_secs(pause) + shutdown + Duration::from_secs(1);
    assert!(needed < Duration::from_secs(grace), "{needed:?} does not fit in {grace}s");
    assert!(config().routes.iter().filter_map(|r| r.idempotency.as_ref()).all(|p| p.lease > Duration::ZERO));
}

#[test]
fn the_budget_and_the_service_select_the_gateways() {
    let deployment = manifest("deployment.yaml");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&deployment["spec"]["selector"]["matchLabels"], labels);
    assert_eq!(&manifest("pdb.yaml")["spec"]["selector"]["matchLabels"], labels);
    let service = manifest("service.yaml");
    assert_eq!(&service["spec"]["selector"], labels);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "http", "only the proxy port is exposed");
    assert_eq!(service["spec"]["ports"].as_sequence().unwrap().len(), 1);
}
