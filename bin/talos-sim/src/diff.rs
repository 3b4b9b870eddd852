//! Machine configuration parsing, validation and diffing for the simulated
//! ApplyConfiguration.

use serde::Deserialize as _;
use tonic::Status;

/// Parses machine configuration YAML (one or more documents) and returns it
/// re-encoded, so that diffs compare content rather than formatting (upstream
/// re-encodes both sides before diffing, pkg/machinery/config/configdiff).
///
/// Invalid YAML, a missing v1alpha1 document or a machine type other than
/// controlplane fail with InvalidArgument, as upstream's validation does.
pub(crate) fn normalize(yaml: &[u8]) -> Result<String, Status> {
    let mut documents = Vec::new();
    for document in serde_norway::Deserializer::from_slice(yaml) {
        let value = serde_norway::Value::deserialize(document)
            .map_err(|e| Status::invalid_argument(format!("failed to parse config: {e}")))?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    let v1alpha1 = documents
        .iter()
        .find(|d| d.get("version").and_then(|v| v.as_str()) == Some("v1alpha1"))
        .ok_or_else(|| {
            Status::invalid_argument(
                "the applied machine configuration doesn't contain v1alpha1 config, did you mean to patch the machine config instead?",
            )
        })?;
    match v1alpha1
        .get("machine")
        .and_then(|m| m.get("type"))
        .and_then(|t| t.as_str())
    {
        Some("controlplane" | "init") => {}
        Some(other) => {
            return Err(Status::invalid_argument(format!(
                "1 error occurred:\n\t* machine type {other:?} cannot be applied to a control plane node without a reboot into a new install"
            )));
        }
        None => {
            return Err(Status::invalid_argument(
                "1 error occurred:\n\t* machine.type is required",
            ));
        }
    }
    let mut out = String::new();
    for (i, document) in documents.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&serde_norway::to_string(document).expect("YAML values serialize"));
    }
    Ok(out)
}

/// A unified diff of two configurations with `a`/`b` headers, as upstream's
/// pkg/machinery/textdiff produces; empty when they are equal.
pub(crate) fn unified(old: &str, new: &str) -> String {
    if old == new {
        return String::new();
    }
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header("a", "b")
        .to_string()
}

/// Formats a duration as Go's `time.Duration.String` does (`1m0s`, `30s`,
/// `1.5s`, `250ms`), since Talos prints try-mode timeouts that way.
pub(crate) fn go_duration(d: std::time::Duration) -> String {
    let total = d.as_secs_f64();
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", trim_float(nanos as f64 / 1e3));
    }
    if total < 1.0 {
        let ms = d.as_secs_f64() * 1000.0;
        return format!("{}ms", trim_float(ms));
    }
    let hours = d.as_secs() / 3600;
    let minutes = (d.as_secs() % 3600) / 60;
    let seconds = total - (hours * 3600 + minutes * 60) as f64;
    let seconds = format!("{}s", trim_float(seconds));
    match (hours, minutes) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

fn trim_float(value: f64) -> String {
    let text = format!("{value:.9}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        use std::time::Duration;
        assert_eq!(go_duration(Duration::from_secs(60)), "1m0s");
        assert_eq!(go_duration(Duration::from_secs(30)), "30s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(go_duration(Duration::from_secs(3723)), "1h2m3s");
        // Go's time.Duration.String below a millisecond and at zero.
        assert_eq!(go_duration(Duration::ZERO), "0s");
        assert_eq!(go_duration(Duration::from_nanos(1500)), "1.5µs");
        assert_eq!(go_duration(Duration::from_nanos(42)), "42ns");
    }

    #[test]
    fn rejects_configs_without_v1alpha1() {
        let err = normalize(b"apiVersion: v1alpha1\nkind: Layer2VIPConfig\nname: x\n").unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        let err = normalize(b"version: v1alpha1\nmachine: [\n").unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn diff_has_upstream_headers() {
        let a =
            normalize(b"version: v1alpha1\nmachine:\n  type: controlplane\ncluster:\n  name: a\n")
                .unwrap();
        let b =
            normalize(b"version: v1alpha1\nmachine: {type: controlplane}\ncluster:\n  name: b\n")
                .unwrap();
        let d = unified(&a, &b);
        assert!(d.starts_with("--- a\n+++ b\n@@"), "{d}");
        assert!(d.contains("-  name: a\n+  name: b\n"), "{d}");
        assert_eq!(unified(&a, &a), "");
    }
}
