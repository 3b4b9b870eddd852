//! The service-account validation a node's API server gets from a machine
//! configuration (all its documents), as the Talos version the node runs
//! derives it, and the guard that keeps every token issued so far valid
//! across an apply.
//!
//! What each version does (read upstream, not summaries):
//! - v1.13.9, `internal/app/machined/pkg/controllers/k8s/control_plane_static_pod.go`
//!   (`manageAPIServer`): `--service-account-issuer` and `--api-audiences`
//!   both default to `cluster.controlPlane.endpoint`; the signing key is
//!   `cluster.serviceAccount.key` and `--service-account-key-file` holds its
//!   public key only (`render_secrets_static_pod.go`, `secrets/root.go`).
//!   `cluster.apiServer.extraArgs` are merged with `pkg/argsbuilder`'s
//!   policies: a named flag overwrites the derived one (every value of a
//!   list becomes one flag), the key-file flags are denied.
//! - v1.14, `internal/app/machined/pkg/controllers/k8s/control_plane_final.go`:
//!   the issuer flag is the issuer URL first, then the accepted issuers;
//!   audiences, keys and issuers come from a `KubeServiceAccountConfig`
//!   document (`pkg/machinery/config/types/k8s/service_account.go`:
//!   audiences default to the issuer URL; accepted keys are the signing
//!   key's public key, then `accepted.publicKeys`) or, without one, from the
//!   v1alpha1 document as 1.13.9 does (`v1alpha1_k8s_bridge.go`). Extra
//!   arguments come from a `KubeAPIServerConfig` document when there is one.
//! - kube-apiserver (`pkg/kubeapiserver/options/authentication.go`): the
//!   first `--service-account-issuer` signs, all are accepted; without
//!   `--api-audiences` the audiences are the issuers.

use serde::{Deserialize, Serialize};
use serde_norway::Value;
use sha2::Digest as _;

use super::Refusal;
use super::config_diff::{Documents, string_at};

/// A machine's role (`machine.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MachineRole {
    /// A control-plane node: runs an API server.
    Controlplane,
    /// The legacy bootstrap control-plane node: runs an API server.
    Init,
    /// A worker: no API server.
    Worker,
}

impl MachineRole {
    /// The role a configuration gives its machine (`machine.type`).
    pub(crate) fn of(docs: &Documents) -> MachineRole {
        match string_at(docs.v1alpha1(), &["machine", "type"]) {
            Some("controlplane") => MachineRole::Controlplane,
            Some("init") => MachineRole::Init,
            _ => MachineRole::Worker,
        }
    }

    /// Whether a node of this role runs an API server (upstream's
    /// `IsControlPlane`: init and controlplane).
    pub fn runs_api_server(self) -> bool {
        !matches!(self, MachineRole::Worker)
    }

    /// Its name in a configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            MachineRole::Controlplane => "controlplane",
            MachineRole::Init => "init",
            MachineRole::Worker => "worker",
        }
    }
}

impl std::fmt::Display for MachineRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for MachineRole {
    type Err = String;

    fn from_str(s: &str) -> Result<MachineRole, String> {
        match s {
            "controlplane" => Ok(MachineRole::Controlplane),
            "init" => Ok(MachineRole::Init),
            "worker" => Ok(MachineRole::Worker),
            other => Err(format!(
                "unknown machine role {other:?} (controlplane, init or worker)"
            )),
        }
    }
}

/// Reads `allow_issuer_change` as the roles it allows; a journal written
/// before it was per role holds a bool (true: every role).
pub(crate) fn roles_or_bool<'de, D>(de: D) -> Result<Vec<MachineRole>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        All(bool),
        Roles(Vec<MachineRole>),
    }
    Ok(match Given::deserialize(de)? {
        Given::All(true) => vec![MachineRole::Controlplane, MachineRole::Init],
        Given::All(false) => Vec::new(),
        Given::Roles(roles) => roles,
    })
}

/// Which derivation a Talos version uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Derivation {
    /// Before 1.14: endpoint-derived flags, no Kube* documents.
    V1_13,
    /// 1.14 and later: `KubeServiceAccountConfig` and friends.
    V1_14,
}

impl Derivation {
    /// From a version tag (`v1.13.9`, `1.14.0-rc.1`); an unreadable tag is
    /// taken as the older rules, which know fewer documents.
    pub(crate) fn of(tag: &str) -> Derivation {
        let mut parts = tag.trim_start_matches('v').split(['.', '-']);
        let major: u64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let minor: u64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if (major, minor) >= (1, 14) {
            Derivation::V1_14
        } else {
            Derivation::V1_13
        }
    }
}

/// Document kinds Talos v1.13.9 registers besides v1alpha1
/// (`pkg/machinery/config/types/**` `registry.Register` at v1.13.9).
#[rustfmt::skip]
const KINDS_1_13: &[&str] = &[
    "BlackholeRouteConfig", "BondConfig", "BridgeConfig", "DHCPv4Config", "DHCPv6Config",
    "DummyLinkConfig", "EnvironmentConfig", "EthernetConfig", "EventSinkConfig",
    "ExistingVolumeConfig", "ExtensionServiceConfig", "ExternalVolumeConfig", "HCloudVIPConfig",
    "HostnameConfig", "ImageVerificationConfig", "KmsgLogConfig", "KubeSpanConfig",
    "KubeSpanEndpointsConfig", "Layer2VIPConfig", "LinkAliasConfig", "LinkConfig",
    "NetworkDefaultActionConfig", "NetworkRuleConfig", "OOMConfig", "PCIDriverRebindConfig",
    "RawVolumeConfig", "RegistryAuthConfig", "RegistryMirrorConfig", "RegistryTLSConfig",
    "ResolverConfig", "RoutingRuleConfig", "SideroLinkConfig", "StaticHostConfig",
    "SwapVolumeConfig", "TCPProbeConfig", "TimeSyncConfig", "TrustedRootsConfig",
    "UserVolumeConfig", "VLANConfig", "VRFConfig", "VolumeConfig", "WatchdogTimerConfig",
    "WireguardConfig", "ZswapConfig",
];

/// The first document the version does not register, as upstream's
/// config registry says it (`pkg/machinery/config/internal/registry`:
/// `"KIND" "VERSION": not registered`). On 1.14 and later the node's own
/// dry run judges the kinds (1.14 registers every 1.13.9 kind).
pub(crate) fn unregistered(docs: &Documents, derivation: Derivation) -> Option<String> {
    docs.kinds().find_map(|(kind, api_version)| {
        let known = match derivation {
            Derivation::V1_13 => KINDS_1_13.contains(&kind) && api_version == "v1alpha1",
            Derivation::V1_14 => true,
        };
        (!known).then(|| format!("{kind:?} {api_version:?}: not registered"))
    })
}

/// The service-account validation an API server gets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SaValidation {
    /// The `--service-account-issuer` values: the first signs, all are
    /// accepted.
    pub issuers: Vec<String>,
    /// The audiences a token must be bound to one of.
    pub audiences: Vec<String>,
    /// The keys whose tokens verify (by fingerprint; the signing key first).
    pub keys: Vec<String>,
}

impl SaValidation {
    /// The issuer tokens are signed with.
    pub(crate) fn signing_issuer(&self) -> Option<&str> {
        self.issuers.first().map(String::as_str)
    }

    /// Derives it from `docs` as `derivation` does; an error is upstream's
    /// validation message for a document it refuses.
    pub(crate) fn derive(docs: &Documents, derivation: Derivation) -> Result<Self, String> {
        let v1 = docs.v1alpha1();
        let endpoint = string_at(v1, &["cluster", "controlPlane", "endpoint"]).unwrap_or_default();
        let legacy_key = string_at(v1, &["cluster", "serviceAccount", "key"]);
        let sa_doc = match derivation {
            Derivation::V1_13 => None,
            Derivation::V1_14 => docs.of_kind("KubeServiceAccountConfig"),
        };
        let mut out = match sa_doc {
            None => SaValidation {
                issuers: vec![endpoint.to_string()],
                audiences: vec![endpoint.to_string()],
                keys: legacy_key.map(legacy_fingerprint).into_iter().collect(),
            },
            Some(doc) => from_sa_document(doc, v1)?,
        };
        let extra = match derivation {
            Derivation::V1_14 => docs
                .of_kind("KubeAPIServerConfig")
                .and_then(|d| d.get("extraArgs")),
            Derivation::V1_13 => None,
        }
        .or_else(|| v1.get("cluster")?.get("apiServer")?.get("extraArgs"));
        if let Some(extra) = extra {
            if let Some(values) = arg_values(extra, "service-account-issuer") {
                out.issuers = values;
            }
            if let Some(values) = arg_values(extra, "api-audiences") {
                out.audiences = values;
            }
        }
        out.issuers.retain(|i| !i.is_empty());
        // kube-apiserver splits --api-audiences on commas, and takes the
        // issuers as audiences when the flag is absent.
        out.audiences = out
            .audiences
            .iter()
            .flat_map(|a| a.split(','))
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect();
        if out.audiences.is_empty() {
            out.audiences = out.issuers.clone();
        }
        Ok(out)
    }
}

/// A `KubeServiceAccountConfig` document's validation, refused as upstream
/// refuses it (`service_account.go` `Validate` and
/// `V1Alpha1ConflictValidate`).
fn from_sa_document(doc: &Value, v1: &Value) -> Result<SaValidation, String> {
    if v1
        .get("cluster")
        .and_then(|c| c.get("serviceAccount"))
        .is_some()
    {
        return Err(
            "service account is already set in v1alpha1 config (.cluster.serviceAccount)".into(),
        );
    }
    let key = string_at(doc, &["issuer", "privateKey"])
        .ok_or("service issuer private key is required")?;
    let issuer =
        string_at(doc, &["issuer", "issuerURL"]).ok_or("service issuer URL is required")?;
    let list = |key: &str| -> Vec<String> {
        doc.get("accepted")
            .and_then(|a| a.get(key))
            .and_then(Value::as_sequence)
            .map(|s| {
                s.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut issuers = vec![issuer.to_string()];
    issuers.extend(list("issuers"));
    let mut audiences = list("audiences");
    if audiences.is_empty() {
        audiences.push(issuer.to_string());
    }
    let mut keys = vec![pem_fingerprint(key.as_bytes())];
    keys.extend(
        list("publicKeys")
            .iter()
            .map(|k| pem_fingerprint(k.as_bytes())),
    );
    Ok(SaValidation {
        issuers,
        audiences,
        keys,
    })
}

/// An extra argument's values as upstream's `ArgValue` gives them: a string
/// is one value (none when empty), a list is its items; `None` when the
/// argument is not named.
fn arg_values(extra: &Value, name: &str) -> Option<Vec<String>> {
    Some(match extra.get(name)? {
        Value::String(s) if s.is_empty() => Vec::new(),
        Value::Sequence(items) => items.iter().filter_map(scalar).collect(),
        other => scalar(other).into_iter().collect(),
    })
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `cluster.serviceAccount.key` is base64 of the PEM.
fn legacy_fingerprint(b64: &str) -> String {
    use base64::Engine as _;
    match base64::engine::general_purpose::STANDARD.decode(b64.trim()) {
        Ok(pem) => pem_fingerprint(&pem),
        Err(_) => pem_fingerprint(b64.as_bytes()),
    }
}

/// A short sha256 of a PEM block's decoded body (of the text when it is no
/// PEM), so a key never appears in a message. A private key and the same
/// key's public half have different fingerprints: a signing key moved to
/// the accepted keys counts as a change (conservative).
pub(crate) fn pem_fingerprint(pem: &[u8]) -> String {
    use base64::Engine as _;
    let text = String::from_utf8_lossy(pem);
    let body: String = text
        .lines()
        .filter(|l| !l.starts_with("-----") && !l.contains(':'))
        .collect::<String>()
        .split_whitespace()
        .collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&body)
        .unwrap_or_else(|_| pem.to_vec());
    let digest = sha2::Sha256::digest(&bytes);
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The verdict on a change the guard lets through.
pub(crate) struct Judged {
    /// The plan's note.
    pub note: String,
    /// What the change stops accepting (issuers, audiences, keys), when
    /// `allow_issuer_change` let it through; empty otherwise.
    pub allowed_loss: Vec<String>,
    /// Whether the API server's service-account validation changes at all
    /// (so its static pod restarts with new flags or keys).
    pub changes: bool,
}

/// What a node's version makes of the old and new configuration.
pub(crate) struct IssuerCheck<'a> {
    /// The node.
    pub node: &'a str,
    /// The Talos version it runs (its tag).
    pub version: &'a str,
    /// Its role (from its running configuration).
    pub role: MachineRole,
    /// The roles whose issuer change is allowed.
    pub allowed: &'a [MachineRole],
}

impl IssuerCheck<'_> {
    /// Refuses a configuration holding a document kind the node's version
    /// does not register, with upstream's words.
    pub(crate) fn known(&self, file: &str, new: &Documents) -> Result<(), Refusal> {
        match unregistered(new, Derivation::of(self.version)) {
            None => Ok(()),
            Some(message) => Err(Refusal::UnknownDocument {
                node: self.node.into(),
                version: self.version.into(),
                file: file.into(),
                message,
            }),
        }
    }

    /// Refuses a configuration the version does not register, then a
    /// change that stops accepting an issuer, audience or key the API
    /// server accepts now, unless allowed for the node's role. Workers run
    /// no API server and are not judged.
    pub(crate) fn judge(
        &self,
        file: &str,
        old: &Documents,
        new: &Documents,
    ) -> Result<Judged, Refusal> {
        let note = |note: String, changes: bool| Judged {
            note,
            allowed_loss: Vec::new(),
            changes,
        };
        let derivation = Derivation::of(self.version);
        if let Some(message) = unregistered(new, derivation) {
            return Err(Refusal::UnknownDocument {
                node: self.node.into(),
                version: self.version.into(),
                file: file.into(),
                message,
            });
        }
        if !self.role.runs_api_server() {
            return Ok(note(
                format!(
                    "{} (Talos {}, {}): runs no API server: the service-account issuer is not judged",
                    self.node, self.version, self.role
                ),
                false,
            ));
        }
        let bad = |file: &str, message: String| Refusal::UnknownDocument {
            node: self.node.into(),
            version: self.version.into(),
            file: file.into(),
            message,
        };
        let running = format!("{}'s running configuration", self.node);
        let before = SaValidation::derive(old, derivation).map_err(|e| bad(&running, e))?;
        let after = SaValidation::derive(new, derivation).map_err(|e| bad(file, e))?;
        let lost = lost(&before, &after);
        let summary = describe(&after);
        let changes = before != after;
        if lost.is_empty() {
            return Ok(note(
                format!(
                    "{} (Talos {}, {}): service-account validation keeps every issuer, audience and key: {summary}",
                    self.node, self.version, self.role
                ),
                changes,
            ));
        }
        if self.allowed.contains(&self.role) {
            return Ok(Judged {
                note: format!(
                    "{} (Talos {}, {}): service-account change ALLOWED for role {}: {}",
                    self.node,
                    self.version,
                    self.role,
                    self.role,
                    lost.join("; ")
                ),
                allowed_loss: lost,
                changes,
            });
        }
        Err(Refusal::IssuerChange {
            node: self.node.into(),
            version: self.version.into(),
            role: self.role.to_string(),
            lost,
            old: before.signing_issuer().unwrap_or("(none)").into(),
        })
    }
}

/// What `before` accepts that `after` no longer does, in words.
fn lost(before: &SaValidation, after: &SaValidation) -> Vec<String> {
    let mut out = Vec::new();
    let missing = |old: &[String], new: &[String]| -> Vec<String> {
        old.iter().filter(|o| !new.contains(o)).cloned().collect()
    };
    let issuers = missing(&before.issuers, &after.issuers);
    if !issuers.is_empty() {
        out.push(format!(
            "the issuer(s) {} would no longer be accepted (accepted after: {})",
            issuers.join(", "),
            list_or_none(&after.issuers)
        ));
    }
    let audiences = missing(&before.audiences, &after.audiences);
    if !audiences.is_empty() {
        out.push(format!(
            "the API audience(s) {} would no longer be accepted (audiences after: {})",
            audiences.join(", "),
            list_or_none(&after.audiences)
        ));
    }
    let keys = missing(&before.keys, &after.keys);
    if !keys.is_empty() {
        out.push(format!(
            "the service-account key(s) {} would no longer verify tokens (keys after: {})",
            keys.join(", "),
            list_or_none(&after.keys)
        ));
    }
    out
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

fn describe(v: &SaValidation) -> String {
    format!(
        "signing issuer {}, accepted issuers {}, audiences {}, {}",
        v.signing_issuer().unwrap_or("(none)"),
        list_or_none(&v.issuers),
        list_or_none(&v.audiences),
        match v.keys.len() {
            0 => "no service-account key in the configuration".to_string(),
            n => format!("{n} accepted key(s), the signing key unchanged"),
        }
    )
}

#[cfg(test)]
#[path = "sa_validation_tests.rs"]
mod tests;
