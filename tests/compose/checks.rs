//! The checkers: each returns every problem it finds, naming the service or key.

use super::*;

pub(crate) fn check_services_present(stack: &Stack) -> Vec<String> {
    let mut problems = Vec::new();
    for name in EXPECTED_SERVICES {
        if stack.service(name).is_none() {
            problems.push(format!("service `{name}` is missing"));
        }
    }
    for svc in stack.services.values() {
        if svc.image.is_none() && svc.build.is_none() {
            problems.push(format!("service `{}`: has neither `image` nor `build`", svc.name));
        }
        if let Some(Err(e)) = stack.argv(svc) {
            problems.push(format!("service `{}`: {e}", svc.name));
        }
    }
    let expect_program = |name: &str, program: &str, problems: &mut Vec<String>| {
        if let Some(svc) = stack.service(name) {
            match stack.program(svc) {
                Some(p) if p == program => {}
                Some(p) => problems.push(format!("service `{name}`: runs `{p}`, expected `{program}`")),
                None => problems.push(format!("service `{name}`: is not built from this repository's Dockerfile")),
            }
        }
    };
    for gateway in GATEWAYS {
        expect_program(gateway, GATEWAY_BIN, &mut problems);
    }
    expect_program("orders", ORDERS_BIN, &mut problems);
    problems
}

pub(crate) fn check_healthchecks(stack: &Stack) -> Vec<String> {
    let mut problems = Vec::new();
    for svc in stack.services.values() {
        let name = &svc.name;
        let Some(hc) = &svc.healthcheck else {
            problems.push(format!("service `{name}`: has no healthcheck (depends_on needs service_healthy)"));
            continue;
        };
        if hc.disabled || hc.test.is_empty() || hc.test[0] == "NONE" {
            problems.push(format!("service `{name}`: healthcheck is disabled or has no test"));
            continue;
        }
        if !matches!(hc.test[0].as_str(), "CMD" | "CMD-SHELL") || hc.test.len() < 2 {
            problems.push(format!("service `{name}`: healthcheck.test must start with CMD or CMD-SHELL and a command"));
            continue;
        }
        let Some(Ok(argv)) = stack.argv(svc) else { continue };
        // Locally built services: the probe must exist in the image and hit a real port.
        let probe = if hc.test[0] == "CMD" {
            hc.test[1].clone()
        } else {
            hc.test[1].split_whitespace().next().unwrap_or_default().to_owned()
        };
        if basename(&probe) == "curl" {
            let installs_curl = match stack.image_dockerfile(svc) {
                Some(Ok(df)) => df.final_stage().args_of("RUN").any(|r| r.split_whitespace().any(|w| w == "curl")),
                _ => false,
            };
            if !installs_curl {
                problems.push(format!(
                    "service `{name}`: healthcheck runs curl, but the image's final stage does not install it"
                ));
            }
        }
        let Some(url) = healthcheck_url(&hc.test) else {
            problems.push(format!("service `{name}`: healthcheck has no http:// URL to probe"));
            continue;
        };
        if !is_loopback_host(&url.host) {
            problems.push(format!(
                "service `{name}`: healthcheck probes `{}`; it runs inside the container, use 127.0.0.1",
                url.host
            ));
        }
        let port = url.port.unwrap_or(80);
        match basename(&argv[0]) {
            GATEWAY_BIN => match stack.gateway_config(svc) {
                Ok(config) => {
                    let admin = config.server.admin_listen.map(|a| a.port());
                    if admin != Some(port) || url.path != "/readyz" {
                        problems.push(format!(
                            "service `{name}`: healthcheck probes port {port} path `{}`, \
                             expected the admin listener's /readyz (admin_listen port {admin:?})",
                            url.path
                        ));
                    }
                }
                Err(e) => problems.push(format!("service `{name}`: {e}")),
            },
            ORDERS_BIN => match split_host_port(&orders_listen(&argv)) {
                Ok((_, listen)) if listen == port && url.path == "/healthz" => {}
                Ok((_, listen)) => problems.push(format!(
                    "service `{name}`: healthcheck probes port {port} path `{}`, \
                     expected --listen port {listen} path /healthz",
                    url.path
                )),
                Err(e) => problems.push(format!("service `{name}`: --listen: {e}")),
            },
            _ => {}
        }
    }
    problems
}

pub(crate) fn check_depends_on(stack: &Stack) -> Vec<String> {
    let mut problems = Vec::new();
    for svc in stack.services.values() {
        for dep in &svc.depends_on {
            let (name, target) = (&svc.name, &dep.service);
            if dep.condition.as_deref() != Some("service_healthy") {
                problems.push(format!(
                    "service `{name}`: depends_on `{target}` uses condition {}, expected service_healthy",
                    dep.condition.as_deref().unwrap_or("service_started (short syntax)")
                ));
            }
            match stack.service(target) {
                None => problems.push(format!("service `{name}`: depends_on `{target}`, which is not a service")),
                Some(t) if t.healthcheck.is_none() => {
                    problems.push(format!("service `{name}`: depends_on `{target}`, which has no healthcheck"))
                }
                Some(_) => {}
            }
        }
    }
    for (service, needs) in REQUIRED_DEPENDENCIES {
        let Some(svc) = stack.service(service) else { continue };
        for &need in needs {
            if !svc.depends_on.iter().any(|d| d.service == need) {
                problems.push(format!("service `{service}`: does not depend on `{need}`"));
            }
        }
    }
    problems
}

pub(crate) fn check_ports(stack: &Stack) -> Vec<String> {
    let mut problems = Vec::new();
    let mut published: BTreeMap<(u16, String), String> = BTreeMap::new();
    for svc in stack.services.values() {
        let name = &svc.name;
        let listening = stack.listen_ports(svc);
        for port in &svc.ports {
            let port = match port {
                Ok(p) => p,
                Err(e) => {
                    problems.push(format!("service `{name}`: {e}"));
                    continue;
                }
            };
            if let Some(host) = port.published
                && let Some(other) = published.insert((host, port.protocol.clone()), name.clone())
            {
                problems.push(format!(
                    "service `{name}`: host port {host}/{} is also published by `{other}`",
                    port.protocol
                ));
            }
            match &listening {
                Ok(ports) if ports.contains(&port.target) => {}
                Ok(ports) => problems.push(format!(
                    "service `{name}`: publishes container port {}, but it listens on {ports:?}",
                    port.target
                )),
                Err(e) => problems.push(format!("service `{name}`: publishes {}, but: {e}", port.target)),
            }
        }
    }
    problems
}

/// Paths the Docker build needs from the context, besides the Dockerfile's own COPY sources.
pub(crate) fn workspace_paths(stack: &Stack) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = ["Cargo.toml", "Cargo.lock", "src/lib.rs", "src/main.rs"].map(PathBuf::from).to_vec();
    let manifest: toml::Table =
        stack.read(Path::new("Cargo.toml")).ok().and_then(|t| t.parse().ok()).unwrap_or_default();
    let members = manifest.get("workspace").and_then(|w| w.get("members")).and_then(|m| m.as_array());
    for member in members.into_iter().flatten().filter_map(|m| m.as_str()).filter(|m| *m != ".") {
        paths.push(Path::new(member).join("Cargo.toml"));
        paths.push(Path::new(member).join("src"));
    }
    paths
}

pub(crate) fn check_paths_exist(stack: &Stack) -> Vec<String> {
    let mut problems = Vec::new();
    let mut builds: Vec<&Build> = Vec::new();
    for svc in stack.services.values() {
        let name = &svc.name;
        if let Some(build) = &svc.build {
            if !stack.root.join(&build.context).is_dir() {
                problems
                    .push(format!("service `{name}`: build context `{}` is not a directory", build.context.display()));
            }
            if !stack.exists(&build.dockerfile_path()) {
                problems.push(format!(
                    "service `{name}`: build dockerfile `{}` does not exist",
                    build.dockerfile_path().display()
                ));
            }
            if let Some(Err(e)) = stack.dockerfiles.get(&build.dockerfile_path()) {
                problems.push(format!("service `{name}`: {e}"));
            }
            builds.push(build);
        }
        if let (Some(image), None) = (&svc.image, &svc.build) {
            // Only registry images are pulled; a name built by another service must match it.
            if !image.contains(':') && !image.contains('@') {
                problems.push(format!("service `{name}`: image `{image}` has no tag; pin one"));
            }
        }
        for mount in &svc.volumes {
            match mount {
                Err(e) => problems.push(format!("service `{name}`: {e}")),
                Ok(Mount { source: Some(source), bind: true, .. }) => {
                    if !source.starts_with("./") && !source.starts_with("../") {
                        problems.push(format!(
                            "service `{name}`: mounts `{source}`; use a path relative to the repository (./...)"
                        ));
                    } else if !stack.exists(Path::new(source)) {
                        problems.push(format!(
                            "service `{name}`: mounts `{source}`, which does not exist in the repository"
                        ));
                    }
                }
                Ok(Mount { source: Some(volume), bind: false, .. }) if !stack.named_volumes.contains(volume) => {
                    problems
                        .push(format!("service `{name}`: volume `{volume}` is not declared under top-level `volumes:`"))
                }
                Ok(_) => {}
            }
        }
    }
    // Build inputs must not be hidden by .dockerignore.
    let ignore: Vec<String> = stack
        .read(Path::new(".dockerignore"))
        .map(|t| t.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_owned).collect())
        .unwrap_or_default();
    for build in builds {
        let mut needed = workspace_paths(stack);
        if let Some(Ok(df)) = stack.dockerfiles.get(&build.dockerfile_path()) {
            for stage in &df.stages {
                for args in stage.args_of("COPY").chain(stage.args_of("ADD")) {
                    let words = exec_form(args).unwrap_or_else(|| args.split_whitespace().map(str::to_owned).collect());
                    if words.iter().any(|w| w.starts_with("--from=")) {
                        continue;
                    }
                    let sources = words.iter().filter(|w| !w.starts_with("--")).cloned().collect::<Vec<_>>();
                    for source in sources.iter().take(sources.len().saturating_sub(1)).filter(|s| *s != ".") {
                        let path = normalize(&build.context.join(source));
                        if !stack.exists(&path) {
                            problems.push(format!(
                                "{}: COPY source `{source}` does not exist",
                                build.dockerfile_path().display()
                            ));
                        }
                        needed.push(PathBuf::from(source));
                    }
                }
            }
        }
        for path in needed {
            let shown = path.display().to_string();
            if !stack.exists(&build.context.join(&path)) {
                problems.push(format!("build input `{shown}` does not exist"));
            }
            if dockerignore_excludes(&ignore, &shown) {
                problems.push(format!(".dockerignore excludes `{shown}`, which the image build needs"));
            }
        }
    }
    problems
}

/// Whether `.dockerignore` patterns exclude a path (last match wins; `!` re-includes; a
/// pattern matching a directory excludes what is inside it; `**` spans directories).
pub(crate) fn dockerignore_excludes(patterns: &[String], path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut excluded = false;
    for pattern in patterns {
        let (negated, pattern) = match pattern.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, pattern.as_str()),
        };
        let pattern: Vec<&str> =
            pattern.trim_start_matches("./").split('/').filter(|s| !s.is_empty() && *s != ".").collect();
        if (1..=segments.len()).any(|n| glob_path(&pattern, &segments[..n])) {
            excluded = !negated;
        }
    }
    excluded
}

pub(crate) fn glob_path(pattern: &[&str], path: &[&str]) -> bool {
    match (pattern.first(), path.first()) {
        (None, None) => true,
        (Some(&"**"), _) => glob_path(&pattern[1..], path) || (!path.is_empty() && glob_path(pattern, &path[1..])),
        (Some(p), Some(s)) => glob_segment(p.as_bytes(), s.as_bytes()) && glob_path(&pattern[1..], &path[1..]),
        _ => false,
    }
}

pub(crate) fn glob_segment(pattern: &[u8], s: &[u8]) -> bool {
    match (pattern.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => glob_segment(&pattern[1..], s) || (!s.is_empty() && glob_segment(pattern, &s[1..])),
        (Some(b'?'), Some(_)) => glob_segment(&pattern[1..], &s[1..]),
        (Some(p), Some(c)) => p == c && glob_segment(&pattern[1..], &s[1..]),
        _ => false,
    }
}

/// Each gateway's mounted config validates (as `Config::from_toml`, the text `load` reads).
pub(crate) fn check_gateway_configs(stack: &Stack) -> Vec<String> {
    let mut problems = Vec::new();
    for svc in stack.services_running(GATEWAY_BIN) {
        if let Err(e) = stack.gateway_config(svc) {
            problems.push(format!("service `{}`: {e}", svc.name));
        }
    }
    if stack.services_running(GATEWAY_BIN).is_empty() {
        problems.push("no service runs idemgate".into());
    }
    problems
}

/// The gateway configs agree with the compose file: mount, store, upstreams, listeners.
pub(crate) fn check_config_agrees_with_compose(stack: &Stack) -> Vec<String> {
    let mut problems = Vec::new();
    let mut stores = BTreeSet::new();
    for svc in stack.services_running(GATEWAY_BIN) {
        let name = &svc.name;
        match stack.gateway_config_source(svc) {
            Ok((source, target)) => {
                let read_only = svc.volumes.iter().flatten().any(|m| m.target == target && m.read_only);
                if !read_only {
                    problems.push(format!(
                        "service `{name}`: the config mount `{}` is not read-only (:ro)",
                        source.display()
                    ));
                }
            }
            Err(e) => {
                problems.push(format!("service `{name}`: {e}"));
                continue;
            }
        }
        let config = match stack.gateway_config(svc) {
            Ok(c) => c,
            Err(e) => {
                problems.push(format!("service `{name}`: {e}"));
                continue;
            }
        };
        for (key, addr) in
            [("server.listen", Some(config.server.listen)), ("server.admin_listen", config.server.admin_listen)]
        {
            match addr {
                Some(a) if a.ip().is_loopback() => problems.push(format!(
                    "service `{name}`: {key} = {a} is loopback-only: \
                     published ports and other containers cannot reach it"
                )),
                None => problems.push(format!("service `{name}`: {key} is not set (the healthcheck needs /readyz)")),
                Some(_) => {}
            }
        }
        match &config.store.backend {
            StoreBackendConfig::Redis { url, .. } => {
                stores.insert((url.clone(), config.store.key_prefix.clone()));
                match parse_url(url) {
                    Ok(u) => {
                        let redis = stack.service(&u.host);
                        if redis.is_none() {
                            problems.push(format!(
                                "service `{name}`: store.url host `{}` is not a compose service",
                                u.host
                            ));
                        } else if u.host != "redis" {
                            problems.push(format!(
                                "service `{name}`: store.url host `{}` should be the `redis` service",
                                u.host
                            ));
                        }
                        if u.port.unwrap_or(6379) != 6379 {
                            problems.push(format!("service `{name}`: store.url port {:?} is not Redis's 6379", u.port));
                        }
                        if !svc.depends_on.iter().any(|d| d.service == u.host) {
                            problems
                                .push(format!("service `{name}`: uses store `{}` but does not depend on it", u.host));
                        }
                    }
                    Err(e) => problems.push(format!("service `{name}`: store.url: {e}")),
                }
            }
            StoreBackendConfig::Memory { .. } => problems.push(format!(
                "service `{name}`: store.backend is memory; the gateways must share Redis for cross-gateway replays"
            )),
        }
        for (upstream, url) in config.upstreams.iter().flat_map(|u| u.urls.iter().map(move |url| (u, url))) {
            let key = format!("upstreams.{}.url", upstream.name);
            let Some(host) = url.host() else {
                problems.push(format!("service `{name}`: {key} has no host"));
                continue;
            };
            let port = url.port_u16().unwrap_or(if url.scheme_str() == Some("https") { 443 } else { 80 });
            let Some(target) = stack.service(host) else {
                problems.push(format!("service `{name}`: {key} host `{host}` is not a compose service"));
                continue;
            };
            match stack.listen_ports(target) {
                Ok(ports) if ports.contains(&port) => {}
                Ok(ports) => problems.push(format!(
                    "service `{name}`: {key} = {url} uses port {port}, but service `{host}` listens on {ports:?}"
                )),
                Err(e) => problems.push(format!("service `{name}`: {key}: service `{host}`: {e}")),
            }
            if !svc.depends_on.iter().any(|d| d.service == host) {
                problems
                    .push(format!("service `{name}`: {key} points at `{host}`, but the service does not depend on it"));
            }
        }
    }
    if stores.len() > 1 {
        problems.push(format!(
            "the gateways use different stores or key prefixes, so they cannot replay each other's keys: {stores:?}"
        ));
    }
    problems
}

/// Every `--flag` a compose command passes to a workspace binary appears in its `--help`.
pub(crate) fn check_command_flags(stack: &Stack) -> Vec<String> {
    let mut problems = Vec::new();
    for svc in stack.services.values() {
        let Some(Ok(argv)) = stack.argv(svc) else { continue };
        let program = basename(&argv[0]);
        let help = match help_text(program) {
            Ok(h) => h,
            Err(e) => {
                problems.push(format!("service `{}`: {e}", svc.name));
                continue;
            }
        };
        for arg in argv[1..].iter().filter(|a| a.starts_with('-') && a.len() > 1) {
            let flag = arg.split('=').next().unwrap_or(arg);
            if !help_mentions(&help, flag) {
                problems.push(format!("service `{}`: `{program}` has no flag `{flag}` (not in its --help)", svc.name));
            }
        }
    }
    problems
}

/// The order service's `--database` URL points at the postgres service with its credentials.
pub(crate) fn check_database_url(stack: &Stack) -> Vec<String> {
    let mut problems = Vec::new();
    for svc in stack.services_running(ORDERS_BIN) {
        let name = &svc.name;
        let Some(Ok(argv)) = stack.argv(svc) else { continue };
        let Some(url) = flag_value(&argv, &["--database"]) else {
            problems.push(format!("service `{name}`: passes no --database (it would use SQLite inside the container)"));
            continue;
        };
        let url = match parse_url(&url) {
            Ok(u) => u,
            Err(e) => {
                problems.push(format!("service `{name}`: --database: {e}"));
                continue;
            }
        };
        if !matches!(url.scheme.as_str(), "postgres" | "postgresql") {
            problems.push(format!("service `{name}`: --database scheme `{}` is not postgres", url.scheme));
            continue;
        }
        let Some(pg) = stack.service(&url.host) else {
            problems.push(format!("service `{name}`: --database host `{}` is not a compose service", url.host));
            continue;
        };
        if url.host != "postgres" {
            problems.push(format!("service `{name}`: --database host `{}` should be the `postgres` service", url.host));
        }
        if let Ok(ports) = stack.listen_ports(pg)
            && !ports.contains(&url.port.unwrap_or(5432))
        {
            problems.push(format!(
                "service `{name}`: --database port {:?}, but `{}` listens on {ports:?}",
                url.port, url.host
            ));
        }
        let env = |key: &str| pg.environment.get(key).cloned();
        let user = env("POSTGRES_USER").unwrap_or_else(|| "postgres".into());
        let expected = [
            ("user", "POSTGRES_USER", Some(user.clone()), url.user.clone()),
            ("password", "POSTGRES_PASSWORD", env("POSTGRES_PASSWORD"), url.password.clone()),
            (
                "database",
                "POSTGRES_DB",
                Some(env("POSTGRES_DB").unwrap_or(user)),
                Some(url.path.trim_start_matches('/').to_owned()),
            ),
        ];
        for (what, var, want, got) in expected {
            if want.is_none() {
                problems.push(format!("service `{}`: {var} is not set", pg.name));
            } else if want != got {
                problems.push(format!(
                    "service `{name}`: --database {what} {got:?} does not match `{}`'s {var} {want:?}",
                    pg.name
                ));
            }
        }
        if !svc.depends_on.iter().any(|d| d.service == url.host) {
            problems.push(format!("service `{name}`: uses database `{}` but does not depend on it", url.host));
        }
    }
    problems
}

pub(crate) fn check_variables(stack: &Stack) -> Vec<String> {
    stack.variable_problems.clone()
}

/// The Dockerfile builds both binaries in a builder stage and ships them in a final stage
/// that runs as a non-root user; every program a compose command runs is in the image.
pub(crate) fn check_dockerfile(stack: &Stack) -> Vec<String> {
    let mut problems = Vec::new();
    if stack.dockerfiles.is_empty() {
        problems.push("no service builds from a Dockerfile".into());
    }
    for (path, df) in &stack.dockerfiles {
        let file = path.display();
        let df = match df {
            Ok(df) => df,
            Err(e) => {
                problems.push(format!("{file}: {e}"));
                continue;
            }
        };
        if df.stages.len() < 2 {
            problems.push(format!("{file}: has {} FROM; expected a multi-stage build", df.stages.len()));
        }
        let (build_stages, [last]) = df.stages.split_at(df.stages.len() - 1) else { unreachable!() };
        let builds = build_stages
            .iter()
            .flat_map(|s| s.args_of("RUN"))
            .filter(|r| r.contains("cargo build"))
            .collect::<Vec<_>>();
        for bin in [GATEWAY_BIN, ORDERS_BIN] {
            if !builds.iter().any(|r| r.contains(&format!("-p {bin}")) || r.contains("--workspace")) {
                problems.push(format!("{file}: no `cargo build` in a build stage builds `{bin}` (-p {bin})"));
            }
        }
        for args in last.args_of("COPY") {
            if let Some(from) = args.split_whitespace().find_map(|w| w.strip_prefix("--from="))
                && !build_stages.iter().any(|s| s.name.as_deref() == Some(from))
                && !from.contains(':')
            {
                problems.push(format!("{file}: final stage copies --from={from}, which is not a stage"));
            }
        }
        match last.args_of("USER").last().map(|u| u.split(':').next().unwrap_or_default().trim()) {
            None => problems.push(format!("{file}: the final stage has no USER, so it runs as root")),
            Some("root" | "0") => problems.push(format!("{file}: the final stage runs as root (USER)")),
            Some(_) => {}
        }
        let installed = last.copied_from_stages();
        let on_path = |program: &str| {
            installed.iter().any(|p| {
                if program.contains('/') {
                    p == program
                } else {
                    basename(p) == program && PATH_DIRS.iter().any(|d| Path::new(p).parent() == Some(Path::new(d)))
                }
            })
        };
        for bin in [GATEWAY_BIN, ORDERS_BIN] {
            if !on_path(bin) {
                problems.push(format!("{file}: the final stage does not copy `{bin}` into a PATH directory"));
            }
        }
        let exposed: BTreeSet<u16> = last
            .args_of("EXPOSE")
            .flat_map(|a| a.split_whitespace())
            .filter_map(|p| p.split('/').next()?.parse().ok())
            .collect();
        for svc in stack.services.values() {
            if stack.image_build(svc).map(Build::dockerfile_path).as_ref() != Some(path) {
                continue;
            }
            let Some(Ok(argv)) = stack.argv(svc) else { continue };
            if !on_path(&argv[0]) {
                problems.push(format!(
                    "service `{}`: runs `{}`, which {file}'s final stage does not install",
                    svc.name, argv[0]
                ));
            }
            if let Ok(ports) = stack.listen_ports(svc) {
                for port in ports.difference(&exposed) {
                    problems
                        .push(format!("{file}: does not EXPOSE port {port}, which service `{}` listens on", svc.name));
                }
            }
        }
    }
    problems
}
