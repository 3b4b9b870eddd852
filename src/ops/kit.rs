//! The recovery kit of an off-host snapshot (`snapshot --kit`): what a
//! restore on new machines needs beyond etcd, read from the running
//! cluster when the snapshot is taken. Kubernetes' secret-encryption keys
//! (without them every Secret in the snapshot is unreadable, omni#610), the
//! etcd members, the fingerprints of the cluster's CAs and each member's
//! configuration digest. Stored age-encrypted beside the snapshot.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_norway::Value;
use sha2::{Digest as _, Sha256};

use super::cluster::member_address;
use super::{Ops, OpsError};
use crate::backup::{
    CaFingerprint, EncryptionSecret, KitMember, NodeConfigDigest, RecoveryKit, SecretString,
};
use crate::client::resources::ConfigId;
use crate::snapshot::Hex;

/// The CAs a v1alpha1 configuration carries, by the name the kit gives
/// them, and where.
const CAS: [(&str, &[&str]); 4] = [
    ("os", &["machine", "ca", "crt"]),
    ("kubernetes", &["cluster", "ca", "crt"]),
    ("etcd", &["cluster", "etcd", "ca", "crt"]),
    ("aggregator", &["cluster", "aggregatorCA", "crt"]),
];

/// A kit and what could not go into it.
pub(super) struct Gathered {
    pub kit: RecoveryKit,
    /// Members whose configuration could not be read.
    pub unread: Vec<String>,
}

impl Ops {
    /// Reads the kit through `source` (a control-plane node): its running
    /// configuration gives the keys and CAs, its etcd the members, and
    /// every member's running configuration its digest.
    pub(super) async fn gather_kit(&self, source: &str) -> Result<Gathered, OpsError> {
        let fail = |e: &dyn std::fmt::Display| OpsError::step("snapshot", format!("kit: {e}"));
        let node = self.client.node(source);
        let config = node
            .resources()
            .machine_config(ConfigId::Active)
            .await
            .map_err(|e| fail(&format!("the configuration of {source}: {e}")))?;
        let v1alpha1 = v1alpha1_document(&config.yaml)
            .ok_or_else(|| fail(&format!("{source} runs no v1alpha1 configuration")))?;
        let members = node
            .etcd_member_list(false)
            .await
            .map_err(|e| fail(&format!("the members through {source}: {e}")))?;

        let mut kit = RecoveryKit {
            cluster: self.context.clone(),
            revision: 0,
            encryption_secrets: encryption_secrets(&v1alpha1),
            members: members
                .iter()
                .map(|m| KitMember {
                    id: m.id.0,
                    hostname: m.hostname.clone(),
                    peer_urls: m.peer_urls.clone(),
                    client_urls: m.client_urls.clone(),
                    is_learner: m.is_learner,
                })
                .collect(),
            ca_fingerprints: ca_fingerprints(&v1alpha1).map_err(|e| fail(&e))?,
            node_configs: Vec::new(),
        };
        let mut unread = Vec::new();
        for member in &members {
            let Some(address) = member_address(member) else {
                unread.push(member.hostname.clone());
                continue;
            };
            match self
                .client
                .node(address.as_str())
                .resources()
                .machine_config(ConfigId::Active)
                .await
            {
                Ok(config) => kit.node_configs.push(NodeConfigDigest {
                    node: member.hostname.clone(),
                    sha256: Hex(&Sha256::digest(config.yaml.as_bytes())).to_string(),
                }),
                Err(_) => unread.push(member.hostname.clone()),
            }
        }
        Ok(Gathered { kit, unread })
    }
}

/// The v1alpha1 document of a (multi-document) configuration.
fn v1alpha1_document(yaml: &str) -> Option<Value> {
    use serde::Deserialize as _;
    serde_norway::Deserializer::from_str(yaml)
        .filter_map(|doc| Value::deserialize(doc).ok())
        .find(|doc| doc.get("version").and_then(Value::as_str) == Some("v1alpha1"))
}

fn lookup<'a>(doc: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(doc, |v, k| v.get(*k))
}

fn encryption_secrets(doc: &Value) -> Vec<EncryptionSecret> {
    [
        ("secretbox", "secretboxEncryptionSecret"),
        ("aescbc", "aescbcEncryptionSecret"),
    ]
    .into_iter()
    .filter_map(|(provider, field)| {
        let secret = lookup(doc, &["cluster", field])?.as_str()?;
        (!secret.is_empty()).then(|| EncryptionSecret {
            provider: provider.into(),
            secret: SecretString::new(secret),
        })
    })
    .collect()
}

/// sha256 of each CA certificate's DER. A certificate that is present but
/// does not decode is an error: a kit must not record a wrong fingerprint.
fn ca_fingerprints(doc: &Value) -> Result<Vec<CaFingerprint>, String> {
    let mut out = Vec::new();
    for (name, path) in CAS {
        let Some(crt) = lookup(doc, path).and_then(Value::as_str) else {
            continue;
        };
        let pem = BASE64
            .decode(crt.trim())
            .map_err(|e| format!("{}: not base64: {e}", path.join(".")))?;
        let der = x509_parser::pem::parse_x509_pem(&pem)
            .map_err(|e| format!("{}: not a PEM certificate: {e}", path.join(".")))?
            .1
            .contents;
        out.push(CaFingerprint {
            name: name.into(),
            sha256: Hex(&Sha256::digest(&der)).to_string(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_cas_come_from_the_v1alpha1_document() {
        let pem = "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n";
        let yaml = format!(
            "apiVersion: v1alpha1\nkind: HostnameConfig\nhostname: a\n---\n\
             version: v1alpha1\nmachine:\n  ca:\n    crt: {}\ncluster:\n  \
             secretboxEncryptionSecret: c2I=\n  aescbcEncryptionSecret: \"\"\n",
            BASE64.encode(pem)
        );
        let doc = v1alpha1_document(&yaml).unwrap();
        let secrets = encryption_secrets(&doc);
        assert_eq!(secrets.len(), 1);
        assert_eq!(secrets[0].provider, "secretbox");
        assert_eq!(secrets[0].secret.expose(), "c2I=");
        let cas = ca_fingerprints(&doc).unwrap();
        assert_eq!(cas.len(), 1);
        assert_eq!(cas[0].name, "os");
        // sha256 of the DER bytes 30 00.
        assert_eq!(
            cas[0].sha256,
            Hex(&Sha256::digest([0x30u8, 0x00])).to_string()
        );

        let bad = "version: v1alpha1\ncluster:\n  ca:\n    crt: \"!!\"\n";
        let err = ca_fingerprints(&v1alpha1_document(bad).unwrap()).unwrap_err();
        assert!(err.contains("cluster.ca.crt"), "{err}");
    }
}
