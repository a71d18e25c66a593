//! The model: the compose file, its Dockerfiles and the files they name.

use super::*;

/// The demo stack as files: read from the repository, with optional in-memory replacements.
pub(crate) struct Stack {
    pub(crate) root: PathBuf,
    /// Replacement contents by path relative to `root`, for the mutation tests.
    pub(crate) overrides: HashMap<PathBuf, String>,
    /// Problems found while interpolating `${VAR}` in the compose file.
    pub(crate) variable_problems: Vec<String>,
    pub(crate) services: BTreeMap<String, Service>,
    /// Top-level `volumes:` names.
    pub(crate) named_volumes: BTreeSet<String>,
    /// Parsed Dockerfiles by path relative to `root`.
    pub(crate) dockerfiles: BTreeMap<PathBuf, Result<Dockerfile, String>>,
}

#[derive(Debug, Default)]
pub(crate) struct Service {
    pub(crate) name: String,
    pub(crate) image: Option<String>,
    pub(crate) build: Option<Build>,
    pub(crate) entrypoint: Option<Vec<String>>,
    pub(crate) command: Option<Vec<String>>,
    pub(crate) environment: BTreeMap<String, String>,
    pub(crate) ports: Vec<Result<Port, String>>,
    pub(crate) volumes: Vec<Result<Mount, String>>,
    pub(crate) healthcheck: Option<Healthcheck>,
    pub(crate) depends_on: Vec<Dependency>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Build {
    /// Relative to the compose file's directory.
    pub(crate) context: PathBuf,
    /// Relative to the context.
    pub(crate) dockerfile: PathBuf,
}

impl Build {
    pub(crate) fn dockerfile_path(&self) -> PathBuf {
        normalize(&self.context.join(&self.dockerfile))
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Port {
    pub(crate) published: Option<u16>,
    pub(crate) target: u16,
    pub(crate) protocol: String,
}

#[derive(Debug, Clone)]
pub(crate) struct Mount {
    /// A host path (bind mount) or a volume name; `None` for an anonymous volume.
    pub(crate) source: Option<String>,
    pub(crate) target: String,
    pub(crate) bind: bool,
    pub(crate) read_only: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Healthcheck {
    pub(crate) test: Vec<String>,
    pub(crate) disabled: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Dependency {
    pub(crate) service: String,
    /// `None` in the short (list) syntax, which means `service_started`.
    pub(crate) condition: Option<String>,
}

impl Stack {
    /// The repository's files as they are.
    pub(crate) fn load() -> Stack {
        Self::load_with(&[])
    }

    /// The repository's files, with `overrides` (path relative to the root, new contents)
    /// replacing some of them in memory.
    pub(crate) fn load_with(overrides: &[(&str, String)]) -> Stack {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let overrides = overrides.iter().map(|(p, text)| (PathBuf::from(p), text.clone())).collect();
        let mut stack = Stack {
            root,
            overrides,
            variable_problems: Vec::new(),
            services: BTreeMap::new(),
            named_volumes: BTreeSet::new(),
            dockerfiles: BTreeMap::new(),
        };
        if let Err(e) = stack.parse() {
            panic!("{COMPOSE_FILE}: {e}");
        }
        stack
    }

    pub(crate) fn parse(&mut self) -> Result<(), String> {
        let raw = self.read(Path::new(COMPOSE_FILE))?;
        let dotenv = self.read(Path::new(".env")).map(|t| parse_dotenv(&t)).unwrap_or_default();
        let (text, variable_problems) = interpolate(&raw, &dotenv);
        self.variable_problems = variable_problems;
        let mut doc: Value = serde_yaml_ng::from_str(&text).map_err(|e| format!("not valid YAML: {e}"))?;
        doc.apply_merge().map_err(|e| format!("YAML merge keys: {e}"))?;
        let services = doc.get("services").and_then(Value::as_mapping).ok_or("no `services:` mapping")?;
        for (name, body) in services {
            let name = name.as_str().ok_or("a service name is not a string")?.to_owned();
            let service = parse_service(&name, body).map_err(|e| format!("service `{name}`: {e}"))?;
            self.services.insert(name, service);
        }
        if let Some(volumes) = doc.get("volumes").and_then(Value::as_mapping) {
            self.named_volumes = volumes.keys().filter_map(Value::as_str).map(str::to_owned).collect();
        }
        let builds: BTreeSet<PathBuf> =
            self.services.values().filter_map(|s| s.build.as_ref()).map(Build::dockerfile_path).collect();
        for path in builds {
            let parsed = self.read(&path).and_then(|text| parse_dockerfile(&text));
            self.dockerfiles.insert(path, parsed);
        }
        Ok(())
    }

    /// A file's contents: the override if there is one, else the file on disk.
    pub(crate) fn read(&self, relative: &Path) -> Result<String, String> {
        let relative = normalize(relative);
        if let Some(text) = self.overrides.get(&relative) {
            return Ok(text.clone());
        }
        std::fs::read_to_string(self.root.join(&relative))
            .map_err(|e| format!("cannot read {}: {e}", relative.display()))
    }

    pub(crate) fn exists(&self, relative: &Path) -> bool {
        let relative = normalize(relative);
        self.overrides.contains_key(&relative) || self.root.join(&relative).exists()
    }

    pub(crate) fn service(&self, name: &str) -> Option<&Service> {
        self.services.get(name)
    }

    /// The build that makes a service's image: its own `build:`, or that of another service
    /// tagging the same `image:` (the image is built once and shared).
    pub(crate) fn image_build<'a>(&'a self, svc: &'a Service) -> Option<&'a Build> {
        if let Some(build) = &svc.build {
            return Some(build);
        }
        let image = svc.image.as_ref()?;
        self.services.values().find(|s| s.build.is_some() && s.image.as_ref() == Some(image))?.build.as_ref()
    }

    /// The Dockerfile a service's image comes from, for services built from this repository.
    pub(crate) fn image_dockerfile(&self, svc: &Service) -> Option<Result<&Dockerfile, String>> {
        let path = self.image_build(svc)?.dockerfile_path();
        Some(match self.dockerfiles.get(&path) {
            Some(Ok(df)) => Ok(df),
            Some(Err(e)) => Err(format!("{}: {e}", path.display())),
            None => Err(format!("{}: not parsed", path.display())),
        })
    }

    /// The argv a container of a locally built service runs: the entrypoint and command
    /// from the compose file, or else from the final stage of its Dockerfile. `None` for
    /// services running a third-party image (whose defaults are not visible here).
    pub(crate) fn argv(&self, svc: &Service) -> Option<Result<Vec<String>, String>> {
        let df = match self.image_dockerfile(svc)? {
            Ok(df) => df,
            Err(e) => return Some(Err(e)),
        };
        let stage = df.final_stage();
        let entrypoint = svc.entrypoint.clone().or_else(|| stage.entrypoint.clone()).unwrap_or_default();
        // Overriding the entrypoint clears the image's CMD (Docker's rule).
        let command = match (&svc.entrypoint, &svc.command) {
            (_, Some(c)) => c.clone(),
            (Some(_), None) => Vec::new(),
            (None, None) => stage.cmd.clone().unwrap_or_default(),
        };
        let argv: Vec<String> = entrypoint.into_iter().chain(command).collect();
        if argv.is_empty() {
            return Some(Err("runs no command (no entrypoint or command in compose or the Dockerfile)".into()));
        }
        Some(Ok(argv))
    }

    /// The program a locally built service runs (basename of argv[0]).
    pub(crate) fn program(&self, svc: &Service) -> Option<String> {
        let argv = self.argv(svc)?.ok()?;
        Some(basename(&argv[0]).to_owned())
    }

    pub(crate) fn services_running(&self, program: &str) -> Vec<&Service> {
        self.services.values().filter(|s| self.program(s).as_deref() == Some(program)).collect()
    }

    /// Where a gateway's config comes from: the host file (relative to the root) mounted at
    /// the path its command passes to `--config`.
    pub(crate) fn gateway_config_source(&self, svc: &Service) -> Result<(PathBuf, String), String> {
        let argv = self.argv(svc).ok_or("is not built from this repository")??;
        let in_container = flag_value(&argv, &["--config", "-c"]).ok_or_else(|| {
            format!("command {argv:?} passes no --config (its default, ./gateway.toml, is not in the image)")
        })?;
        let mount = svc
            .volumes
            .iter()
            .flatten()
            .find(|m| normalize(Path::new(&m.target)) == normalize(Path::new(&in_container)))
            .ok_or_else(|| format!("--config {in_container} is not a mounted file (no volume targets it)"))?;
        match (&mount.source, mount.bind) {
            (Some(source), true) => Ok((normalize(Path::new(source)), in_container)),
            _ => Err(format!("--config {in_container} is mounted from a volume, not from a file of this repository")),
        }
    }

    /// A gateway service's validated config.
    pub(crate) fn gateway_config(&self, svc: &Service) -> Result<Config, String> {
        let (source, _) = self.gateway_config_source(svc)?;
        let text = self.read(&source)?;
        Config::from_toml(&text, &source.display().to_string()).map_err(|e| e.to_string())
    }

    /// The TCP ports a service listens on inside its container.
    pub(crate) fn listen_ports(&self, svc: &Service) -> Result<BTreeSet<u16>, String> {
        if let Some(argv) = self.argv(svc) {
            let argv = argv?;
            return match basename(&argv[0]) {
                GATEWAY_BIN => {
                    let config = self.gateway_config(svc)?;
                    Ok(config.server.admin_listen.iter().chain([&config.server.listen]).map(|a| a.port()).collect())
                }
                ORDERS_BIN => Ok(BTreeSet::from([split_host_port(&orders_listen(&argv))?.1])),
                other => Err(format!("runs `{other}`, whose ports tests/compose/ does not know")),
            };
        }
        let image = svc.image.as_deref().unwrap_or_default();
        let command = svc.command.clone().unwrap_or_default();
        if image.starts_with("redis:") {
            return Ok(BTreeSet::from([flag_value(&command, &["--port"])
                .and_then(|p| p.parse().ok())
                .unwrap_or(6379)]));
        }
        if image.starts_with("postgres:") {
            return Ok(BTreeSet::from([svc.environment.get("PGPORT").and_then(|p| p.parse().ok()).unwrap_or(5432)]));
        }
        Err(format!("image `{image}`: tests/compose/ does not know which ports it listens on"))
    }
}

/// The `--listen` address of an order-service argv (its default when absent).
pub(crate) fn orders_listen(argv: &[String]) -> String {
    flag_value(argv, &["--listen"]).unwrap_or_else(|| "127.0.0.1:3000".into())
}

pub(crate) fn parse_service(name: &str, body: &Value) -> Result<Service, String> {
    let mut svc = Service { name: name.to_owned(), ..Service::default() };
    let body = body.as_mapping().ok_or("is not a mapping")?;
    let get = |key: &str| body.get(key);
    svc.image = get("image").map(|v| scalar(v).ok_or("image: not a string")).transpose()?;
    svc.build = match get("build") {
        None => None,
        Some(Value::String(context)) => Some(Build { context: context.into(), dockerfile: "Dockerfile".into() }),
        Some(v @ Value::Mapping(_)) => Some(Build {
            context: v.get("context").and_then(Value::as_str).unwrap_or(".").into(),
            dockerfile: v.get("dockerfile").and_then(Value::as_str).unwrap_or("Dockerfile").into(),
        }),
        Some(_) => return Err("build: neither a path nor a mapping".into()),
    };
    svc.entrypoint = get("entrypoint").map(|v| words(v).map_err(|e| format!("entrypoint: {e}"))).transpose()?;
    svc.command = get("command").map(|v| words(v).map_err(|e| format!("command: {e}"))).transpose()?;
    svc.environment = match get("environment") {
        None => BTreeMap::new(),
        Some(Value::Mapping(m)) => m
            .iter()
            .map(|(k, v)| {
                let key = scalar(k).ok_or("environment: a key is not a string")?;
                Ok((key, scalar(v).unwrap_or_default()))
            })
            .collect::<Result<_, String>>()?,
        Some(Value::Sequence(items)) => items
            .iter()
            .map(|item| {
                let item = scalar(item).ok_or("environment: an entry is not a string")?;
                let (k, v) = item.split_once('=').unwrap_or((&item, ""));
                Ok((k.to_owned(), v.to_owned()))
            })
            .collect::<Result<_, String>>()?,
        Some(_) => return Err("environment: neither a mapping nor a list".into()),
    };
    svc.ports = sequence(get("ports"), "ports")?.iter().map(parse_port).collect();
    svc.volumes = sequence(get("volumes"), "volumes")?.iter().map(parse_mount).collect();
    svc.healthcheck = match get("healthcheck") {
        None => None,
        Some(h) => {
            let test = match h.get("test") {
                None => Vec::new(),
                Some(Value::String(s)) => vec!["CMD-SHELL".to_owned(), s.clone()],
                Some(v) => words(v).map_err(|e| format!("healthcheck.test: {e}"))?,
            };
            Some(Healthcheck { test, disabled: h.get("disable").and_then(Value::as_bool).unwrap_or(false) })
        }
    };
    svc.depends_on = match get("depends_on") {
        None => Vec::new(),
        Some(Value::Sequence(items)) => items
            .iter()
            .map(|i| Ok(Dependency { service: scalar(i).ok_or("depends_on: not a name")?, condition: None }))
            .collect::<Result<_, String>>()?,
        Some(Value::Mapping(m)) => m
            .iter()
            .map(|(k, v)| {
                let service = scalar(k).ok_or("depends_on: a key is not a name")?;
                Ok(Dependency { service, condition: v.get("condition").and_then(scalar) })
            })
            .collect::<Result<_, String>>()?,
        Some(_) => return Err("depends_on: neither a list nor a mapping".into()),
    };
    Ok(svc)
}

pub(crate) fn sequence<'a>(value: Option<&'a Value>, key: &str) -> Result<&'a [Value], String> {
    match value {
        None => Ok(&[]),
        Some(Value::Sequence(items)) => Ok(items),
        Some(_) => Err(format!("{key}: not a list")),
    }
}

/// A YAML scalar as a string (numbers and booleans as written).
pub(crate) fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A command in list form, or a string split into words as compose does (quotes group).
pub(crate) fn words(v: &Value) -> Result<Vec<String>, String> {
    match v {
        Value::Sequence(items) => {
            items.iter().map(|i| scalar(i).ok_or_else(|| "an item is not a string".into())).collect()
        }
        Value::String(s) => split_words(s),
        _ => Err("neither a string nor a list".into()),
    }
}

pub(crate) fn split_words(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => out.extend(word.take()),
            '\'' | '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some(q) if q == c => break,
                        Some(x) => w.push(x),
                        None => return Err(format!("unclosed quote in {s:?}")),
                    }
                }
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    out.extend(word);
    Ok(out)
}

pub(crate) fn parse_port(v: &Value) -> Result<Port, String> {
    let port =
        |s: &str| s.parse::<u16>().map_err(|_| format!("ports: `{s}` is not a port (ranges are not supported here)"));
    match v {
        Value::Number(n) => Ok(Port { published: None, target: port(&n.to_string())?, protocol: "tcp".into() }),
        Value::String(s) => {
            let (spec, protocol) = s.split_once('/').unwrap_or((s, "tcp"));
            // [HOST_IP:][HOST_PORT:]CONTAINER_PORT, from the right so IPv6 addresses survive.
            let mut parts = spec.rsplitn(3, ':');
            let target = port(parts.next().unwrap_or_default())?;
            let published = parts.next().filter(|p| !p.is_empty()).map(port).transpose()?;
            Ok(Port { published, target, protocol: protocol.to_owned() })
        }
        Value::Mapping(_) => Ok(Port {
            target: port(&v.get("target").and_then(scalar).ok_or("ports: long syntax without `target`")?)?,
            published: v.get("published").and_then(scalar).map(|p| port(&p)).transpose()?,
            protocol: v.get("protocol").and_then(scalar).unwrap_or_else(|| "tcp".into()),
        }),
        _ => Err("ports: an entry is neither a string, a number nor a mapping".into()),
    }
}

pub(crate) fn parse_mount(v: &Value) -> Result<Mount, String> {
    let is_path = |s: &str| s.starts_with('.') || s.starts_with('/') || s.starts_with('~');
    match v {
        Value::String(s) => {
            let parts: Vec<&str> = s.split(':').collect();
            match parts[..] {
                [target] => Ok(Mount { source: None, target: target.into(), bind: false, read_only: false }),
                [source, target] | [source, target, _] => Ok(Mount {
                    source: Some(source.into()),
                    target: target.into(),
                    bind: is_path(source),
                    read_only: parts.get(2).is_some_and(|m| m.split(',').any(|o| o == "ro")),
                }),
                _ => Err(format!("volumes: cannot parse `{s}`")),
            }
        }
        Value::Mapping(_) => {
            let source = v.get("source").and_then(scalar);
            Ok(Mount {
                bind: v.get("type").and_then(Value::as_str) == Some("bind") || source.as_deref().is_some_and(is_path),
                source,
                target: v.get("target").and_then(scalar).ok_or("volumes: long syntax without `target`")?,
                read_only: v.get("read_only").and_then(Value::as_bool).unwrap_or(false),
            })
        }
        _ => Err("volumes: an entry is neither a string nor a mapping".into()),
    }
}

/// `.env` lines `NAME=VALUE` (comments and blank lines skipped, one level of quotes removed).
pub(crate) fn parse_dotenv(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().trim_matches('"').trim_matches('\'').to_owned()))
        .collect()
}

/// Compose's `${VAR}` interpolation with the `.env` values or the written defaults (the
/// caller's environment is deliberately ignored, so the result does not depend on it).
/// Also returns a problem for every variable that has neither.
pub(crate) fn interpolate(text: &str, dotenv: &BTreeMap<String, String>) -> (String, Vec<String>) {
    let mut out = String::with_capacity(text.len());
    let mut problems = Vec::new();
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let lineno = index + 1;
        let mut rest = line;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            if let Some(tail) = after.strip_prefix('$') {
                out.push('$');
                rest = tail;
            } else if let Some(braced) = after.strip_prefix('{') {
                let Some(close) = braced.find('}') else {
                    problems.push(format!("{COMPOSE_FILE}:{lineno}: unclosed `${{`"));
                    out.push('$');
                    rest = after;
                    continue;
                };
                let inner = &braced[..close];
                let name_end = inner.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(inner.len());
                let (name, op) = inner.split_at(name_end);
                let value = dotenv.get(name);
                let resolved = if let Some(default) = op.strip_prefix(":-").or_else(|| op.strip_prefix('-')) {
                    value
                        .filter(|v| !v.is_empty() || op.starts_with('-'))
                        .cloned()
                        .unwrap_or_else(|| default.to_owned())
                } else if let Some(alt) = op.strip_prefix(":+").or_else(|| op.strip_prefix('+')) {
                    value.map(|_| alt.to_owned()).unwrap_or_default()
                } else {
                    match value {
                        Some(v) => v.clone(),
                        None => {
                            problems.push(format!(
                                "{COMPOSE_FILE}:{lineno}: `${{{inner}}}` has no default (write `${{{name}:-value}}`) \
                                 and .env does not define {name}"
                            ));
                            String::new()
                        }
                    }
                };
                out.push_str(&resolved);
                rest = &braced[close + 1..];
            } else {
                let name_end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
                let name = &after[..name_end];
                if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
                    out.push('$');
                    rest = after;
                    continue;
                }
                match dotenv.get(name) {
                    Some(v) => out.push_str(v),
                    None => problems.push(format!(
                        "{COMPOSE_FILE}:{lineno}: `${name}` has no default (write `${{{name}:-value}}`, or `$${name}` \
                         for a literal dollar) and .env does not define {name}"
                    )),
                }
                rest = &after[name_end..];
            }
        }
        out.push_str(rest);
    }
    (out, problems)
}
