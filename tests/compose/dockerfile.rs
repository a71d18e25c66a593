//! Dockerfile.

use super::*;

#[derive(Debug)]
pub(crate) struct Dockerfile {
    pub(crate) stages: Vec<Stage>,
}

#[derive(Debug, Default)]
pub(crate) struct Stage {
    pub(crate) name: Option<String>,
    /// `(KEYWORD, arguments)` in order, continuation lines joined.
    pub(crate) instructions: Vec<(String, String)>,
    pub(crate) entrypoint: Option<Vec<String>>,
    pub(crate) cmd: Option<Vec<String>>,
}

impl Dockerfile {
    pub(crate) fn final_stage(&self) -> &Stage {
        self.stages.last().expect("parse_dockerfile refuses a file without FROM")
    }
}

impl Stage {
    pub(crate) fn args_of<'a>(&'a self, keyword: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.instructions.iter().filter(move |(k, _)| k == keyword).map(|(_, a)| a.as_str())
    }

    /// The full paths of files copied into this stage from another stage
    /// (`COPY --from=...`): that is where built binaries come from.
    pub(crate) fn copied_from_stages(&self) -> Vec<String> {
        let mut out = Vec::new();
        for args in self.args_of("COPY") {
            let mut words = exec_form(args).unwrap_or_else(|| args.split_whitespace().map(str::to_owned).collect());
            let flags: Vec<String> = words.iter().take_while(|w| w.starts_with("--")).cloned().collect();
            if !flags.iter().any(|f| f.starts_with("--from=")) {
                continue;
            }
            words.drain(..flags.len());
            let Some(dest) = words.pop() else { continue };
            let into_dir = dest.ends_with('/') || words.len() > 1;
            for source in &words {
                out.push(if into_dir {
                    format!("{}/{}", dest.trim_end_matches('/'), basename(source))
                } else {
                    dest.clone()
                });
            }
        }
        out
    }
}

/// `["a", "b"]` (JSON exec form) as words; `None` for the shell form.
pub(crate) fn exec_form(args: &str) -> Option<Vec<String>> {
    let args = args.trim();
    if !args.starts_with('[') {
        return None;
    }
    serde_json::from_str(args).ok()
}

pub(crate) fn parse_dockerfile(text: &str) -> Result<Dockerfile, String> {
    let mut stages: Vec<Stage> = Vec::new();
    let mut logical = String::new();
    let mut lines = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && logical.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                logical.push_str(head);
                logical.push(' ');
            }
            None => {
                logical.push_str(trimmed);
                lines.push(std::mem::take(&mut logical));
            }
        }
    }
    for line in lines {
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let keyword = keyword.to_ascii_uppercase();
        let args = args.trim().to_owned();
        if keyword == "FROM" {
            let words: Vec<&str> = args.split_whitespace().filter(|w| !w.starts_with("--")).collect();
            let name = match words[..] {
                [_, keyword, name] if keyword.eq_ignore_ascii_case("as") => Some(name.to_owned()),
                _ => None,
            };
            stages.push(Stage { name, ..Stage::default() });
            continue;
        }
        let stage = stages.last_mut().ok_or_else(|| format!("`{keyword}` before the first FROM"))?;
        let as_argv = |a: &str| exec_form(a).unwrap_or_else(|| vec!["/bin/sh".into(), "-c".into(), a.to_owned()]);
        match keyword.as_str() {
            "CMD" => stage.cmd = Some(as_argv(&args)),
            "ENTRYPOINT" => stage.entrypoint = Some(as_argv(&args)),
            _ => {}
        }
        stage.instructions.push((keyword, args));
    }
    if stages.is_empty() {
        return Err("no FROM".into());
    }
    Ok(Dockerfile { stages })
}
