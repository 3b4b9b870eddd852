//! A structural diff of two machine configurations: the field paths that
//! differ, by document, whatever the key order or formatting.
//!
//! Paths in the v1alpha1 document are bare (`cluster.controlPlane.endpoint`,
//! `machine.network.interfaces[0].vip.ip`); paths in other documents start
//! with the document's kind and, for a named document, its name in brackets
//! (`KubeServiceAccountConfig.issuer.issuerURL`, `Layer2VIPConfig[10.0.0.50]`
//! for a whole added or removed document).

use serde::Deserialize as _;
use serde_norway::Value;

/// A parsed machine configuration: its documents by identity.
#[derive(Debug, Clone)]
pub(crate) struct Documents {
    docs: Vec<(String, Value)>,
}

/// Why a file is not a machine configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigParseError(String);

impl Documents {
    /// Parses every YAML document; a document without `kind` and with
    /// `version: v1alpha1` is the v1alpha1 one.
    pub(crate) fn parse(yaml: &[u8]) -> Result<Documents, ConfigParseError> {
        let mut docs: Vec<(String, Value)> = Vec::new();
        for (i, document) in serde_norway::Deserializer::from_slice(yaml).enumerate() {
            let value = Value::deserialize(document)
                .map_err(|e| ConfigParseError(format!("document {}: {e}", i + 1)))?;
            if value.is_null() {
                continue;
            }
            if !value.is_mapping() {
                return Err(ConfigParseError(format!(
                    "document {} is not a mapping",
                    i + 1
                )));
            }
            let id = identity(&value);
            if docs.iter().any(|(d, _)| *d == id) {
                let shown = if id.is_empty() { "v1alpha1" } else { &id };
                return Err(ConfigParseError(format!("duplicate document {shown}")));
            }
            docs.push((id, value));
        }
        if !docs.iter().any(|(id, _)| id.is_empty()) {
            return Err(ConfigParseError(
                "no v1alpha1 document (version: v1alpha1)".into(),
            ));
        }
        Ok(Documents { docs })
    }

    /// The v1alpha1 document.
    pub(crate) fn v1alpha1(&self) -> &Value {
        self.get("").expect("checked by parse")
    }

    /// A document by identity (`Kind` or `Kind[name]`; "" for v1alpha1).
    pub(crate) fn get(&self, id: &str) -> Option<&Value> {
        self.docs.iter().find(|(d, _)| d == id).map(|(_, v)| v)
    }

    /// The first document of `kind`.
    pub(crate) fn of_kind(&self, kind: &str) -> Option<&Value> {
        self.docs
            .iter()
            .find(|(_, v)| v.get("kind").and_then(Value::as_str) == Some(kind))
            .map(|(_, v)| v)
    }

    /// Each document other than v1alpha1 as (`kind`, `apiVersion`).
    pub(crate) fn kinds(&self) -> impl Iterator<Item = (&str, &str)> {
        self.docs
            .iter()
            .filter(|(id, _)| !id.is_empty())
            .map(|(_, v)| {
                (
                    v.get("kind").and_then(Value::as_str).unwrap_or_default(),
                    v.get("apiVersion")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                )
            })
    }

    /// Every document with its identity (`Kind`, `Kind[name]`, "" for
    /// v1alpha1).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.docs.iter().map(|(id, v)| (id.as_str(), v))
    }

    /// The paths that differ between `self` (old) and `new`, sorted.
    pub(crate) fn changed_paths(&self, new: &Documents) -> Vec<String> {
        let mut paths = Vec::new();
        for (id, old) in &self.docs {
            match new.get(id) {
                Some(new) => diff_value(id, old, new, &mut paths),
                None => paths.push(id.clone()),
            }
        }
        for (id, _) in &new.docs {
            if self.get(id).is_none() {
                paths.push(id.clone());
            }
        }
        paths.sort();
        paths.dedup();
        paths
    }
}

/// `Kind` or `Kind[name]`; "" for the v1alpha1 document.
fn identity(doc: &Value) -> String {
    match doc.get("kind").and_then(Value::as_str) {
        None => String::new(),
        Some(kind) => match doc.get("name").and_then(Value::as_str) {
            Some(name) => format!("{kind}[{name}]"),
            None => kind.to_string(),
        },
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn key_text(key: &Value) -> String {
    match key {
        Value::String(s) => s.clone(),
        other => serde_norway::to_string(other)
            .unwrap_or_default()
            .trim_end()
            .to_string(),
    }
}

fn diff_value(path: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Mapping(a), Value::Mapping(b)) => {
            for (key, value) in a {
                let child = join(path, &key_text(key));
                match b.get(key) {
                    Some(other) => diff_value(&child, value, other, out),
                    None => out.push(child),
                }
            }
            for (key, _) in b {
                if !a.contains_key(key) {
                    out.push(join(path, &key_text(key)));
                }
            }
        }
        (Value::Sequence(a), Value::Sequence(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff_value(&format!("{path}[{i}]"), x, y, out);
            }
        }
        (Value::Tagged(a), Value::Tagged(b)) if a.tag == b.tag => {
            diff_value(path, &a.value, &b.value, out)
        }
        (a, b) if a == b => {}
        _ => out.push(path.to_string()),
    }
}

/// Whether `path` is `expected` or lies under it.
pub(crate) fn covered(path: &str, expected: &str) -> bool {
    let expected = expected.trim_end_matches('.');
    match path.strip_prefix(expected) {
        Some("") => true,
        Some(rest) => rest.starts_with('.') || rest.starts_with('['),
        None => false,
    }
}

/// A string at `path` (dotted keys) in `doc`.
pub(crate) fn string_at<'a>(doc: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut value = doc;
    for key in path {
        value = value.get(*key)?;
    }
    value.as_str().filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "version: v1alpha1\nmachine:\n  type: controlplane\n  certSANs: [a]\n\
        cluster:\n  controlPlane:\n    endpoint: https://10.0.0.21:6443\n  clusterName: c\n";

    fn docs(s: &str) -> Documents {
        Documents::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn reordering_changes_nothing() {
        let reordered = "cluster:\n  clusterName: c\n  controlPlane: {endpoint: 'https://10.0.0.21:6443'}\n\
            machine: {certSANs: [a], type: controlplane}\nversion: v1alpha1\n";
        assert!(docs(OLD).changed_paths(&docs(reordered)).is_empty());
    }

    #[test]
    fn paths_by_document_and_field() {
        let new = OLD
            .replace("10.0.0.21", "k8s.example")
            .replace("[a]", "[a, b]")
            + "---\napiVersion: v1alpha1\nkind: Layer2VIPConfig\nname: 10.0.0.50\nlink: eth0\n";
        assert_eq!(
            docs(OLD).changed_paths(&docs(&new)),
            [
                "Layer2VIPConfig[10.0.0.50]",
                "cluster.controlPlane.endpoint",
                "machine.certSANs"
            ]
        );
        let vip = "---\napiVersion: v1alpha1\nkind: Layer2VIPConfig\nname: 10.0.0.50\nlink: eth0\n";
        let (a, b) = (
            format!("{OLD}{vip}"),
            format!("{OLD}{}", vip.replace("eth0", "eth1")),
        );
        assert_eq!(
            docs(&a).changed_paths(&docs(&b)),
            ["Layer2VIPConfig[10.0.0.50].link"]
        );
    }

    #[test]
    fn coverage_is_by_path_segment() {
        assert!(covered(
            "cluster.controlPlane.endpoint",
            "cluster.controlPlane"
        ));
        assert!(covered(
            "cluster.controlPlane.endpoint",
            "cluster.controlPlane.endpoint"
        ));
        assert!(covered("Layer2VIPConfig[10.0.0.50]", "Layer2VIPConfig"));
        assert!(covered(
            "machine.network.interfaces[0].vip",
            "machine.network"
        ));
        assert!(!covered("cluster.controlPlaneX", "cluster.controlPlane"));
        assert!(!covered("machine.token", "cluster"));
    }

    #[test]
    fn bad_files_are_named() {
        assert!(Documents::parse(b"machine: [\n").is_err());
        assert!(
            Documents::parse(b"apiVersion: v1alpha1\nkind: Layer2VIPConfig\n")
                .unwrap_err()
                .to_string()
                .contains("no v1alpha1 document")
        );
        let dup = format!("{OLD}---\n{OLD}");
        assert!(
            Documents::parse(dup.as_bytes())
                .unwrap_err()
                .to_string()
                .contains("duplicate")
        );
    }
}
