//! Strict decoding of a machine configuration, as upstream's config loader
//! does before anything else (pkg/machinery/config/configloader/internal/
//! decoder/decoder.go): every document's kind must be registered by the
//! release the node runs (pkg/machinery/config/internal/registry), the
//! v1alpha1 document may carry only known keys (siderolabs/gen
//! xyaml.CheckUnknownKeys), and no document may appear twice. Errors read
//! as upstream's: `error decoding document APIVERSION/KIND/NAME (line N):
//! ...`, and reach the client as InvalidArgument.

use serde::Deserialize as _;
use serde_norway::{Mapping, Value};
use tonic::Status;

use super::TalosVersion;
use super::config_schema::{self, Field, KINDS_1_13_9, KINDS_1_14_0};

/// Keys that make a document without `kind` the v1alpha1 document.
const V1ALPHA1_KEYS: [&str; 4] = ["machine", "cluster", "debug", "persist"];

/// Checks `yaml` as the loader of a node running `version` does. YAML that
/// does not parse is left to the caller's parser to report.
pub(crate) fn check(yaml: &[u8], version: TalosVersion) -> Result<(), Status> {
    let Ok(text) = std::str::from_utf8(yaml) else {
        return Ok(());
    };
    let mut documents = Vec::new();
    for document in serde_norway::Deserializer::from_str(text) {
        match Value::deserialize(document) {
            Ok(value) => documents.push(value),
            Err(_) => return Ok(()),
        }
    }
    let lines = document_lines(text, documents.len());
    let mut seen = Vec::new();
    for (value, line) in documents.iter().zip(lines) {
        let Value::Mapping(map) = value else {
            continue;
        };
        let field = |key: &str| map.get(key).and_then(Value::as_str).unwrap_or_default();
        let (api_version, kind, name) = (field("apiVersion"), field("kind"), field("name"));
        let id = format!(
            "{api_version}/{}/{name}",
            if kind.is_empty() { "v1alpha1" } else { kind }
        );
        if seen.contains(&id) {
            return Err(Status::invalid_argument(format!(
                "duplicate document {id} is not allowed (line {line})"
            )));
        }
        seen.push(id.clone());
        let fail = |e: String| {
            Status::invalid_argument(format!("error decoding document {id} (line {line}): {e}"))
        };
        let legacy = map
            .keys()
            .any(|k| k.as_str().is_some_and(|k| V1ALPHA1_KEYS.contains(&k)));
        let version_of_doc = if legacy { "v1alpha1" } else { api_version };
        if version_of_doc == "v1alpha1" && kind.is_empty() {
            if let Some(unknown) = unknown_keys(value, Field::Struct("Config")) {
                return Err(fail(format!(
                    "unknown keys found during decoding:\n{}",
                    emit(&unknown)
                )));
            }
            continue;
        }
        if kind.is_empty() {
            return Err(fail("missing kind".into()));
        }
        if version_of_doc.is_empty() {
            return Err(fail("missing apiVersion".into()));
        }
        let registered = match version {
            TalosVersion::V1_13_9 => KINDS_1_13_9,
            _ => KINDS_1_14_0,
        };
        if version_of_doc != "v1alpha1" || !registered.contains(&kind) {
            return Err(fail(format!("{kind:?} {version_of_doc:?}: not registered")));
        }
        // The same unknown-key check as the v1alpha1 document's, for the
        // kinds whose shape the simulator knows.
        if let Some(section) = config_schema::document_section(kind)
            && let Some(unknown) = unknown_keys(value, Field::Struct(section))
        {
            return Err(fail(format!(
                "unknown keys found during decoding:\n{}",
                emit(&unknown)
            )));
        }
    }
    conflicts(&documents)
}

/// Kinds that may not share a name with a document of another kind
/// (ConflictsWithKinds of pkg/machinery/config/types/network/layer2_vip.go
/// and hcloud_vip.go): one address is announced one way.
const CONFLICTING: &[(&str, &str)] = &[
    ("Layer2VIPConfig", "HCloudVIPConfig"),
    ("HCloudVIPConfig", "Layer2VIPConfig"),
];

/// The container's check once every document decoded
/// (pkg/machinery/config/container/container.go, New): a document that
/// conflicts with an earlier one is refused, naming the earlier one first.
fn conflicts(documents: &[Value]) -> Result<(), Status> {
    let mut seen: Vec<String> = Vec::new();
    for value in documents {
        let field = |key: &str| {
            value
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (kind, name) = (field("kind"), field("name"));
        if kind.is_empty() {
            continue;
        }
        let id = format!("{kind}/{name}");
        for (this, other) in CONFLICTING {
            let earlier = format!("{other}/{name}");
            if *this == kind && seen.contains(&earlier) {
                return Err(Status::invalid_argument(format!(
                    "conflicting documents: {earlier} and {id}"
                )));
            }
        }
        seen.push(id);
    }
    Ok(())
}

/// The line each document's content starts on (1-based), for `count`
/// documents; line 1 when the split does not line up.
fn document_lines(text: &str, count: usize) -> Vec<usize> {
    let mut starts: Vec<Option<usize>> = vec![None];
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("---") {
            starts.push(None);
            continue;
        }
        let content = !line.trim().is_empty() && !line.trim_start().starts_with('#');
        if let Some(last) = starts.last_mut()
            && last.is_none()
            && content
        {
            *last = Some(i + 1);
        }
    }
    if starts.len() > count && starts[0].is_none() {
        starts.remove(0);
    }
    let mut lines: Vec<usize> = starts.into_iter().map(|s| s.unwrap_or(1)).collect();
    lines.resize(count, 1);
    lines
}

/// The keys of `value` that `field` does not know, as a tree of the same
/// shape (upstream reports them that way), or `None`.
fn unknown_keys(value: &Value, field: Field) -> Option<Value> {
    match (value, field) {
        (Value::Mapping(map), Field::Struct(name)) => {
            let known = config_schema::section(name)?;
            let mut unknown = Mapping::new();
            for (key, inner) in map {
                let Some(k) = key.as_str() else { continue };
                match known.iter().find(|(n, _)| *n == k) {
                    None => {
                        unknown.insert(key.clone(), inner.clone());
                    }
                    Some((_, f)) => {
                        if let Some(deeper) = unknown_keys(inner, *f) {
                            unknown.insert(key.clone(), deeper);
                        }
                    }
                }
            }
            (!unknown.is_empty()).then_some(Value::Mapping(unknown))
        }
        (Value::Sequence(items), Field::Seq(name)) => {
            let found: Vec<Value> = items
                .iter()
                .filter_map(|item| unknown_keys(item, Field::Struct(name)))
                .collect();
            (!found.is_empty()).then_some(Value::Sequence(found))
        }
        _ => None,
    }
}

/// YAML as Go's encoder writes it: four-space indentation, map keys sorted.
fn emit(value: &Value) -> String {
    let mut out = String::new();
    emit_into(value, 0, &mut out);
    out
}

fn emit_into(value: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match value {
        Value::Mapping(map) if !map.is_empty() => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by_key(|(k, _)| scalar(k));
            for (key, inner) in entries {
                out.push_str(&format!("{pad}{}:", scalar(key)));
                nested(inner, indent, out);
            }
        }
        Value::Sequence(items) if !items.is_empty() => {
            for item in items {
                out.push_str(&format!("{pad}-"));
                nested(item, indent, out);
            }
        }
        other => out.push_str(&format!("{pad}{}\n", scalar(other))),
    }
}

fn nested(value: &Value, indent: usize, out: &mut String) {
    match value {
        Value::Mapping(m) if !m.is_empty() => {
            out.push('\n');
            emit_into(value, indent + 4, out);
        }
        Value::Sequence(s) if !s.is_empty() => {
            out.push('\n');
            emit_into(value, indent + 4, out);
        }
        other => out.push_str(&format!(" {}\n", scalar(other))),
    }
}

fn scalar(value: &Value) -> String {
    serde_norway::to_string(value)
        .unwrap_or_default()
        .trim_end()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_follow_document_separators() {
        let text = "# c\nversion: v1alpha1\n---\n\napiVersion: v1alpha1\n";
        assert_eq!(document_lines(text, 2), vec![2, 5]);
        assert_eq!(document_lines("---\na: 1\n", 1), vec![2]);
    }

    #[test]
    fn nested_unknown_keys_are_reported_as_a_tree() {
        let yaml = b"version: v1alpha1\nmachine:\n  type: controlplane\n  install:\n    disk: /dev/sda\n    dsik: x\n  zeta: 1\n  alpha: {b: 2}\n";
        let err = check(yaml, TalosVersion::V1_13_9).unwrap_err();
        assert_eq!(
            err.message(),
            "error decoding document /v1alpha1/ (line 1): unknown keys found during decoding:\nmachine:\n    alpha:\n        b: 2\n    install:\n        dsik: x\n    zeta: 1\n"
        );
    }
}
