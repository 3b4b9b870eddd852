//! The changed-path rule of an apply: with no expected change, any change
//! refuses; a changed secret (CAs, keys, tokens, encryption secrets,
//! service-account keys, in v1alpha1 and in any other document) refuses
//! unless it is named itself, even inside an expected document or section.
//!
//! Secret fields by name, as upstream's redaction and secrets bundle know
//! them (`pkg/machinery/config/types/v1alpha1/v1alpha1_redact.go`,
//! `pkg/machinery/config/generate/secrets/bundle.go`): `machine.token`,
//! `machine.ca`, `cluster.ca`, `cluster.aggregatorCA`, `cluster.etcd.ca`,
//! `cluster.serviceAccount`, `cluster.token`, `cluster.secret`,
//! `cluster.secretboxEncryptionSecret`, `cluster.aescbcEncryptionSecret`,
//! accepted CAs, WireGuard private keys, registry credentials, and
//! `KubeServiceAccountConfig`'s `privateKey` and accepted `publicKeys`.

use std::collections::BTreeMap;

use serde_norway::Value;

use super::Refusal;
use super::config_diff::{Documents, covered};

/// Mapping keys whose value is a secret (or a trust anchor) wherever they
/// appear.
const SECRET_KEYS: &[&str] = &[
    "token",
    "ca",
    "acceptedCAs",
    "aggregatorCA",
    "serviceAccount",
    "secret",
    "secretboxEncryptionSecret",
    "aescbcEncryptionSecret",
    "key",
    "privateKey",
    "publicKeys",
    "password",
    "auth",
    "identityToken",
    "clientIdentity",
];

/// Documents that hold nothing but secrets (every field is one).
const SECRET_KINDS: &[&str] = &[
    "KubeAPIServerCAConfig",
    "KubeAggregatorCAConfig",
    "KubeEtcdEncryptionConfig",
    "DiscoveryIdentityConfig",
    "TrustedRootsConfig",
];

const META: &[&str] = &["apiVersion", "kind", "name"];

/// The secret paths whose value differs between `old` and `new` (added,
/// removed or changed), outermost secret first, sorted.
pub(crate) fn changed_secrets(old: &Documents, new: &Documents) -> Vec<String> {
    let (a, b) = (secrets(old), secrets(new));
    let mut out: Vec<String> = a
        .iter()
        .filter(|(p, v)| b.get(*p) != Some(*v))
        .map(|(p, _)| p.clone())
        .chain(b.keys().filter(|p| !a.contains_key(*p)).cloned())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Every secret in a configuration by path.
fn secrets(docs: &Documents) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for (id, doc) in docs.iter() {
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
        let whole = SECRET_KINDS.contains(&kind);
        if let Value::Mapping(fields) = doc {
            for (key, value) in fields {
                let Some(key) = key.as_str() else { continue };
                if META.contains(&key) && !id.is_empty() {
                    continue;
                }
                let path = join(id, key);
                if whole || SECRET_KEYS.contains(&key) {
                    out.insert(path, value.clone());
                } else {
                    walk(&path, value, &mut out);
                }
            }
        }
    }
    out
}

fn walk(path: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Mapping(fields) => {
            for (key, child) in fields {
                let Some(key) = key.as_str() else { continue };
                let child_path = join(path, key);
                if SECRET_KEYS.contains(&key) {
                    out.insert(child_path, child.clone());
                } else {
                    walk(&child_path, child, out);
                }
            }
        }
        Value::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(&format!("{path}[{i}]"), item, out);
            }
        }
        Value::Tagged(t) => walk(path, &t.value, out),
        _ => {}
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Whether `expected` names the secret at `secret` itself: it is that path
/// or lies under it (a whole section or document does not name it).
fn names(expected: &str, secret: &str) -> bool {
    covered(expected.trim_end_matches('.'), secret)
}

/// The rule: refuses any change when nothing is expected, a change outside
/// `expected`, and a changed secret not named one by one.
pub(crate) fn guard_paths(
    node: &str,
    file: &str,
    paths: &[String],
    secrets: &[String],
    expected: &[String],
) -> Result<(), Refusal> {
    if expected.is_empty() && !(paths.is_empty() && secrets.is_empty()) {
        let mut all: Vec<String> = paths.iter().chain(secrets).cloned().collect();
        all.sort();
        all.dedup();
        return Err(Refusal::ChangeNotExpected {
            node: node.into(),
            file: file.into(),
            paths: all,
        });
    }
    let unexpected: Vec<String> = paths
        .iter()
        .filter(|p| !expected.iter().any(|e| covered(p, e)))
        .cloned()
        .collect();
    if !unexpected.is_empty() {
        return Err(Refusal::UnexpectedChange {
            node: node.into(),
            file: file.into(),
            paths: unexpected,
            expected: expected.to_vec(),
        });
    }
    let unnamed: Vec<String> = secrets
        .iter()
        .filter(|s| !expected.iter().any(|e| names(e, s)))
        .cloned()
        .collect();
    if !unnamed.is_empty() {
        return Err(Refusal::SecretChange {
            node: node.into(),
            file: file.into(),
            paths: unnamed,
        });
    }
    Ok(())
}

/// Fields whose value is private material itself (not a trust anchor such as
/// a certificate), hidden wherever a configuration is shown.
const PRIVATE_KEYS: &[&str] = &[
    "key",
    "token",
    "secret",
    "secretboxEncryptionSecret",
    "aescbcEncryptionSecret",
    "privateKey",
    "password",
    "auth",
    "identityToken",
];

/// What stands in for a hidden value.
const REDACTED: &str = "<redacted>";

/// A node's dry-run diff (or any YAML-shaped text the node sends back) with
/// the values of private fields replaced: a plan is printed, journaled and
/// sent by the daemon, and must never carry a private key or a token. A
/// block value (`key: |` or a nested mapping) is hidden line by line.
pub(crate) fn redact_diff(diff: &str) -> String {
    let mut out = String::with_capacity(diff.len());
    // The indentation of the private field whose block is being hidden.
    let mut hiding: Option<usize> = None;
    for line in diff.lines() {
        let header = line.starts_with("---") || line.starts_with("+++");
        let Some(mark) = line.chars().next().filter(|c| matches!(c, ' ' | '+' | '-')) else {
            hiding = None;
            out.push_str(line);
            out.push('\n');
            continue;
        };
        if header {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let body = &line[1..];
        let indent = body.len() - body.trim_start().len();
        if let Some(field) = hiding {
            if indent > field && !body.trim().is_empty() {
                out.push(mark);
                out.push_str(&body[..indent]);
                out.push_str(REDACTED);
                out.push('\n');
                continue;
            }
            hiding = None;
        }
        let item = body.trim_start().trim_start_matches("- ");
        match item.split_once(':') {
            Some((name, value)) if PRIVATE_KEYS.contains(&name.trim()) => {
                let value = value.trim();
                if value.is_empty() || value.starts_with('|') || value.starts_with('>') {
                    hiding = Some(indent);
                    out.push_str(line);
                } else {
                    // A field name holds no colon: the first one ends it.
                    let colon = line.find(':').unwrap_or(line.len());
                    out.push_str(&line[..colon]);
                    out.push_str(": ");
                    out.push_str(REDACTED);
                }
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    if !diff.ends_with('\n') {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "version: v1alpha1\nmachine:\n  type: controlplane\n  token: t1\n\
        cluster:\n  clusterName: c\n  secretboxEncryptionSecret: s1\n  serviceAccount:\n    key: k1\n  \
        controlPlane:\n    endpoint: https://a:6443\n";

    fn docs(s: &str) -> Documents {
        Documents::parse(s.as_bytes()).unwrap()
    }

    fn check(new: &str, expected: &[&str]) -> Result<(), Refusal> {
        let (old, new) = (docs(BASE), docs(new));
        let expected: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        guard_paths(
            "n1",
            "f.yaml",
            &old.changed_paths(&new),
            &changed_secrets(&old, &new),
            &expected,
        )
    }

    #[test]
    fn a_dry_run_diff_never_shows_private_values() {
        let diff = "--- a\n+++ b\n@@ -1,6 +1,6 @@\n machine:\n   ca:\n     crt: PUBLICCERT\n-    key: OLDPRIVATE\n+    key: NEWPRIVATE\n-  token: oldtoken\n+  token: newtoken\n   certSANs: []\n cluster:\n   serviceAccount:\n     key: |\n       LINE1PRIVATE\n       LINE2PRIVATE\n   clusterName: c\nNo more.";
        let shown = redact_diff(diff);
        for secret in [
            "OLDPRIVATE",
            "NEWPRIVATE",
            "oldtoken",
            "newtoken",
            "LINE1PRIVATE",
            "LINE2PRIVATE",
        ] {
            assert!(!shown.contains(secret), "{secret} shown in:\n{shown}");
        }
        assert!(shown.contains("     crt: PUBLICCERT"), "{shown}");
        assert!(shown.contains("-    key: <redacted>"), "{shown}");
        assert!(shown.contains("+  token: <redacted>"), "{shown}");
        assert!(shown.contains("   clusterName: c"), "{shown}");
        assert!(shown.starts_with("--- a\n+++ b\n"), "{shown}");
        assert!(shown.ends_with("No more."), "{shown}");
        assert_eq!(shown.lines().count(), diff.lines().count());
    }

    #[test]
    fn nothing_expected_refuses_any_change_and_shows_the_paths() {
        let err = check(&BASE.replace("clusterName: c", "clusterName: d"), &[]).unwrap_err();
        assert!(
            matches!(&err, Refusal::ChangeNotExpected { paths, .. } if paths == &["cluster.clusterName"]),
            "{err}"
        );
        let err = check(&BASE.replace("s1", "s2"), &[]).unwrap_err();
        assert!(
            err.to_string()
                .contains("cluster.secretboxEncryptionSecret"),
            "{err}"
        );
        check(BASE, &[]).unwrap();
    }

    #[test]
    fn a_secret_inside_an_expected_section_must_be_named() {
        let new = BASE.replace("key: k1", "key: k2");
        let err = check(&new, &["cluster"]).unwrap_err();
        assert!(
            matches!(&err, Refusal::SecretChange { paths, .. } if paths == &["cluster.serviceAccount"]),
            "{err}"
        );
        check(&new, &["cluster.serviceAccount"]).unwrap();
        check(&new, &["cluster.serviceAccount.key"]).unwrap();
        let token = BASE.replace("token: t1", "token: t2");
        assert!(check(&token, &["machine"]).is_err());
        check(&token, &["machine.token"]).unwrap();
    }

    #[test]
    fn secrets_in_other_documents_are_found_added_or_changed() {
        let sa = "---\napiVersion: v1alpha1\nkind: KubeServiceAccountConfig\nissuer:\n  \
            issuerURL: https://a:6443\n  privateKey: P1\n";
        let with = format!("{BASE}{sa}");
        let err = check(&with, &["KubeServiceAccountConfig"]).unwrap_err();
        assert!(
            matches!(&err, Refusal::SecretChange { paths, .. }
                if paths == &["KubeServiceAccountConfig.issuer.privateKey"]),
            "{err}"
        );
        check(
            &with,
            &[
                "KubeServiceAccountConfig",
                "KubeServiceAccountConfig.issuer.privateKey",
            ],
        )
        .unwrap();
        let (a, b) = (docs(&with), docs(&with.replace("P1", "P2")));
        assert_eq!(
            changed_secrets(&a, &b),
            ["KubeServiceAccountConfig.issuer.privateKey"]
        );
        let ca = "---\napiVersion: v1alpha1\nkind: KubeAPIServerCAConfig\nca:\n  crt: C\n";
        let (a, b) = (docs(BASE), docs(&format!("{BASE}{ca}")));
        assert_eq!(changed_secrets(&a, &b), ["KubeAPIServerCAConfig.ca"]);
    }
}
