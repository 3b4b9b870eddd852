//! Machine configuration parsing, validation and diffing for the simulated
//! ApplyConfiguration.

use serde::Deserialize as _;
use serde_norway::{Mapping, Value};
use tonic::Status;

use super::config_schema::{self, Field};

/// The header fields every other document starts with (meta.Meta), for a
/// kind whose fields the simulator does not know.
const DOCUMENT_ORDER: &[&str] = &["apiVersion", "kind", "name"];

/// Fields whose Go type has its own decoder (so the unknown-key check of
/// [`config_schema`] leaves them alone) but which encode as the struct
/// behind them: their items follow that struct's field order
/// (pkg/machinery/config/types/v1alpha1/v1alpha1_types.go).
const ENCODED_AS: &[(&str, &str, Field)] = &[
    ("NetworkConfig", "interfaces", Field::Seq("Device")),
    ("Device", "vlans", Field::Seq("Vlan")),
    (
        "ClusterConfig",
        "inlineManifests",
        Field::Seq("ClusterInlineManifest"),
    ),
    (
        "APIServerConfig",
        "admissionControl",
        Field::Seq("AdmissionPluginConfig"),
    ),
];

/// A parsed machine configuration: the v1alpha1 document and the others,
/// in their canonical order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MachineConfig {
    /// The v1alpha1 document.
    pub v1alpha1: Value,
    /// The other documents, in the order given.
    pub documents: Vec<Value>,
}

impl MachineConfig {
    /// Encodes the configuration as upstream's container does: v1alpha1
    /// first, then the other documents, separated by `---`
    /// (pkg/machinery/config/container/container.go).
    pub(crate) fn encode(&self) -> String {
        let mut out = encode_document(&self.v1alpha1);
        for document in &self.documents {
            out.push_str("---\n");
            out.push_str(&encode_document(document));
        }
        out
    }

    /// The v1alpha1 document alone, encoded.
    pub(crate) fn encode_v1alpha1(&self) -> String {
        encode_document(&self.v1alpha1)
    }
}

fn encode_document(document: &Value) -> String {
    serde_norway::to_string(document).expect("YAML values serialize")
}

/// Parses machine configuration YAML (one or more documents) into its typed
/// form: keys in the order upstream's typed config encodes them, so that a
/// reordered file is the same configuration (upstream re-encodes both sides
/// before diffing, pkg/machinery/config/configdiff). Struct fields whose
/// order the simulator does not know are sorted by name, which is also how
/// Go encodes maps.
///
/// Invalid YAML, a missing v1alpha1 document or a machine type other than
/// controlplane fail with InvalidArgument, as upstream's validation does.
pub(crate) fn parse(yaml: &[u8]) -> Result<MachineConfig, Status> {
    let mut v1alpha1 = None;
    let mut documents = Vec::new();
    for document in serde_norway::Deserializer::from_slice(yaml) {
        let value = Value::deserialize(document)
            .map_err(|e| Status::invalid_argument(format!("failed to parse config: {e}")))?;
        if value.is_null() {
            continue;
        }
        if value.get("version").and_then(|v| v.as_str()) == Some("v1alpha1") {
            if v1alpha1.is_some() {
                return Err(Status::invalid_argument("duplicate v1alpha1.Config"));
            }
            v1alpha1 = Some(typed(value, Field::Struct("Config")));
        } else {
            documents.push(canonical_document(value));
        }
    }
    let v1alpha1 = v1alpha1.ok_or_else(|| {
        Status::invalid_argument(
            "the applied machine configuration doesn't contain v1alpha1 config, did you mean to patch the machine config instead?",
        )
    })?;
    Ok(MachineConfig {
        v1alpha1,
        documents,
    })
}

impl MachineConfig {
    /// `machine.type` as written (empty when absent).
    pub(crate) fn machine_type(&self) -> &str {
        self.v1alpha1
            .get("machine")
            .and_then(|m| m.get("type"))
            .and_then(|t| t.as_str())
            .unwrap_or_default()
    }

    /// Whether it configures a worker: `worker`, `join` or no type, as
    /// upstream parses the type (pkg/machinery/config/machine/machine.go).
    pub(crate) fn is_worker(&self) -> bool {
        crate::validate::parse_type(self.machine_type()) == Some("worker")
    }

    /// Refuses a configuration of the other machine type than the node's:
    /// that takes a reinstall, not an apply.
    pub(crate) fn check_role(&self, node_is_worker: bool) -> Result<(), Status> {
        let node = if node_is_worker {
            "a worker"
        } else {
            "a control plane"
        };
        match crate::validate::parse_type(self.machine_type()) {
            Some("controlplane" | "init") if !node_is_worker => Ok(()),
            Some("worker") if node_is_worker => Ok(()),
            _ => Err(Status::invalid_argument(format!(
                "1 error occurred:\n\t* machine type {:?} cannot be applied to {node} node without a reboot into a new install",
                self.machine_type()
            ))),
        }
    }
}

/// Parses and re-encodes a configuration (see [`parse`]).
pub(crate) fn normalize(yaml: &[u8]) -> Result<String, Status> {
    parse(yaml).map(|c| c.encode())
}

/// Another document in its type's field order, when the simulator knows
/// it; otherwise its header first and the rest by name.
fn canonical_document(value: Value) -> Value {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match config_schema::document_section(kind) {
        Some(section) => typed(value, Field::Struct(section)),
        None => match value {
            Value::Mapping(map) => order(
                map.into_iter().map(|(k, v)| (k, sorted(v))).collect(),
                DOCUMENT_ORDER,
            ),
            other => other,
        },
    }
}

/// `value` as upstream's encoder writes the Go type `field` stands for:
/// struct fields in declaration order at every depth (those the simulator
/// does not know after them, by name), maps by key.
fn typed(value: Value, field: Field) -> Value {
    match (value, field) {
        (Value::Mapping(map), Field::Struct(section)) => {
            let fields = config_schema::section(section).unwrap_or_default();
            let map = map
                .into_iter()
                .map(|(key, value)| {
                    let name = key.as_str().unwrap_or_default();
                    let inner = ENCODED_AS
                        .iter()
                        .find(|(s, k, _)| *s == section && *k == name)
                        .map(|(_, _, f)| *f)
                        .or_else(|| fields.iter().find(|(k, _)| *k == name).map(|(_, f)| *f))
                        .unwrap_or(Field::Any);
                    (key, typed(value, inner))
                })
                .collect();
            let names: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
            order(map, &names)
        }
        (Value::Sequence(items), Field::Seq(section)) => Value::Sequence(
            items
                .into_iter()
                .map(|item| typed(item, Field::Struct(section)))
                .collect(),
        ),
        (value, _) => sorted(value),
    }
}

/// A value with every mapping in it sorted by key, as Go encodes maps.
fn sorted(value: Value) -> Value {
    match value {
        Value::Mapping(map) => order(map.into_iter().map(|(k, v)| (k, sorted(v))).collect(), &[]),
        Value::Sequence(items) => Value::Sequence(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

fn order(map: Mapping, known: &[&str]) -> Value {
    let mut entries: Vec<(Value, Value)> = map.into_iter().collect();
    let rank = |key: &Value| {
        let name = key.as_str().unwrap_or_default();
        match known.iter().position(|k| *k == name) {
            Some(i) => (0, i, String::new()),
            None => (1, 0, serde_norway::to_string(key).unwrap_or_default()),
        }
    };
    entries.sort_by_cached_key(|(key, _)| rank(key));
    Value::Mapping(entries.into_iter().collect())
}

/// A unified diff of two configurations as upstream's
/// pkg/machinery/textdiff produces it (see [`crate::textdiff`]): `--- a` /
/// `+++ b` headers, three lines of context and hunk headers that always
/// carry both counts (`@@ -1,1 +0,0 @@`); empty when they are equal.
pub(crate) fn unified(old: &str, new: &str) -> String {
    crate::textdiff::unified(old, new)
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
    fn key_order_does_not_matter() {
        // Upstream re-encodes through its typed config, so a reordered file
        // is the same configuration.
        let a = normalize(
            b"version: v1alpha1\nmachine:\n  type: controlplane\n  token: t\ncluster:\n  clusterName: c\n  network:\n    dnsDomain: d\n    podSubnets: [x]\n",
        )
        .unwrap();
        let b = normalize(
            b"cluster:\n  network:\n    podSubnets: [x]\n    dnsDomain: d\n  clusterName: c\nmachine:\n  token: t\n  type: controlplane\nversion: v1alpha1\n",
        )
        .unwrap();
        assert_eq!(a, b);
        assert!(
            a.starts_with("version: v1alpha1\nmachine:\n  type: controlplane\n"),
            "{a}"
        );
        // Other documents follow v1alpha1 whatever the input order.
        let c = normalize(
            b"kind: Layer2VIPConfig\nname: v\napiVersion: v1alpha1\n---\nversion: v1alpha1\nmachine: {type: controlplane}\n",
        )
        .unwrap();
        assert_eq!(
            c,
            "version: v1alpha1\nmachine:\n  type: controlplane\n---\napiVersion: v1alpha1\nkind: Layer2VIPConfig\nname: v\n"
        );
    }

    #[test]
    fn hunk_headers_always_carry_counts() {
        // As pkg/machinery/textdiff prints them (checked against its myers
        // formatter): an empty side starts at 0.
        assert_eq!(
            unified("a\n", "a\nb\n"),
            "--- a\n+++ b\n@@ -1,1 +1,2 @@\n a\n+b\n"
        );
        assert_eq!(unified("", "x\n"), "--- a\n+++ b\n@@ -0,0 +1,1 @@\n+x\n");
        assert_eq!(unified("x\n", ""), "--- a\n+++ b\n@@ -1,1 +0,0 @@\n-x\n");
        let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\n";
        assert_eq!(
            unified(old, &old.replace('f', "F")),
            "--- a\n+++ b\n@@ -3,7 +3,7 @@\n c\n d\n e\n-f\n+F\n g\n h\n i\n"
        );
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
