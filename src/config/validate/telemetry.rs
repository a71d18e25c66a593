//! `[telemetry]`: where spans go, and how many.

use http::{HeaderName, Uri};

use super::Issues;
use crate::config::file::TelemetrySection;
use crate::config::{Secret, TelemetryConfig};

/// The default `service.name`.
const SERVICE_NAME: &str = "idemgate";

pub(super) fn telemetry(
    s: &TelemetrySection,
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Issues,
) -> Option<TelemetryConfig> {
    let traces_url = match &s.otlp_endpoint {
        None => {
            issues.add(
                "telemetry.otlp_endpoint",
                "is required: the OTLP/HTTP collector, e.g. \"http://otel-collector:4318\"",
            );
            None
        }
        Some(text) => issues.check("telemetry.otlp_endpoint", traces_url(text)),
    };
    let sample_ratio = s.sample_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sample_ratio) {
        issues.add("telemetry.sample_ratio", format!("{sample_ratio} is not between 0 and 1"));
    }
    let service_name = s.service_name.clone().unwrap_or_else(|| SERVICE_NAME.to_owned());
    if service_name.trim().is_empty() {
        issues.add("telemetry.service_name", "must not be empty");
    }
    // Only from the environment: a token in the file would travel with every copy of it.
    let header = match &s.headers_env {
        None => Some(None),
        Some(var) => match env(var) {
            None => {
                issues.add("telemetry.headers_env", format!("the environment variable {var:?} is not set"));
                None
            }
            Some(value) => issues.check("telemetry.headers_env", header(var, &value)).map(Some),
        },
    };
    if let Some(path) = &s.ca_file
        && let Err(e) = std::fs::metadata(path)
    {
        issues.add("telemetry.ca_file", format!("cannot read {}: {e}", path.display()));
    }
    Some(TelemetryConfig {
        traces_url: traces_url?,
        service_name,
        sample_ratio,
        header: header?,
        ca_file: s.ca_file.clone(),
    })
}

/// The collector's base URL, and its traces path after it.
fn traces_url(text: &str) -> Result<Uri, String> {
    let base: Uri = text.parse().map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if !matches!(base.scheme_str(), Some("http" | "https")) || base.host().is_none_or(str::is_empty) {
        return Err(format!("{text:?} must be an http:// or https:// URL with a host"));
    }
    if base.query().is_some() {
        return Err(format!("{text:?} must not have a query"));
    }
    let url = format!("{}/v1/traces", text.trim_end_matches('/'));
    url.parse().map_err(|e| format!("{url:?} is not a URL: {e}"))
}

/// `Name: value`, as `headers_env` holds it. The value never appears in an error.
fn header(var: &str, text: &str) -> Result<(HeaderName, Secret), String> {
    let (name, value) =
        text.split_once(':').ok_or_else(|| format!("{var:?} must hold one header as \"Name: value\""))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("{var:?} holds no valid header name before its ':'"))?;
    let value = value.trim();
    if value.is_empty() || http::HeaderValue::from_str(value).is_err() {
        return Err(format!("{var:?} holds no valid header value after its ':'"));
    }
    Ok((name, Secret(value.to_owned())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_follows_the_base_url() {
        assert_eq!(traces_url("http://c:4318").unwrap(), "http://c:4318/v1/traces");
        assert_eq!(traces_url("https://c/otlp/").unwrap(), "https://c/otlp/v1/traces");
        assert!(traces_url("c:4318").is_err());
        assert!(traces_url("ftp://c").is_err());
    }

    #[test]
    fn a_header_is_name_and_value_and_errors_never_show_the_value() {
        let (name, value) = header("OTLP_AUTH", "Authorization: Bearer s3cret").unwrap();
        assert_eq!((name.as_str(), value.0.as_str()), ("authorization", "Bearer s3cret"));
        for bad in ["no colon s3cret", "bad name: s3cret", "x:"] {
            let e = header("OTLP_AUTH", bad).unwrap_err();
            assert!(!e.contains("s3cret"), "{e}");
        }
    }
}
