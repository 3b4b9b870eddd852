//! The sidecar stored beside every backup object (`OBJECT.json`), and the
//! recovery kit stored encrypted beside it (`OBJECT.kit.age`).

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::snapshot::SnapshotReport;

use super::s3::SecretString;

/// The `format` of every sidecar this library writes: the catalogue and
/// retention only ever touch objects whose sidecar carries it.
pub const FORMAT: &str = "talos-client/backup/v1";

/// Suffix of the sidecar's key.
pub const SIDECAR_SUFFIX: &str = ".json";
/// Suffix of the kit's key.
pub const KIT_SUFFIX: &str = ".kit.age";

/// The sidecar of a backup: what the snapshot holds and how it is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BackupMetadata {
    /// Always [`FORMAT`].
    pub format: String,
    /// The cluster the snapshot is of.
    pub cluster: String,
    /// The node it was taken from.
    pub node: String,
    /// When it was taken (RFC 3339, UTC).
    #[serde(with = "time::serde::rfc3339")]
    pub time: OffsetDateTime,
    /// The snapshot as verified before storing: size, sha256, etcd's
    /// status (hash, revision, keys).
    pub snapshot: SnapshotReport,
    /// The stored object.
    pub object: StoredObject,
    /// The recovery kit, when one was stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kit: Option<StoredObject>,
    /// The Talos version of the node, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub talos_version: Option<String>,
    /// The etcd version of the node, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_version: Option<String>,
    /// The version of talos-client that stored it.
    pub tool_version: String,
}

impl BackupMetadata {
    /// The sidecar's key.
    pub fn sidecar_key(&self) -> String {
        sidecar_key(&self.object.key)
    }
}

/// The sidecar key of the object `key`.
pub fn sidecar_key(key: &str) -> String {
    format!("{key}{SIDECAR_SUFFIX}")
}

/// One stored object of a backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StoredObject {
    /// Its key in the store.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// sha256 of its bytes, hex.
    pub sha256: String,
    /// `zstd` (the snapshot object) or `none` (the kit).
    pub compression: String,
    /// How it is encrypted.
    pub encryption: Encryption,
}

/// How an object is encrypted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Encryption {
    /// Plain (compressed) snapshot bytes.
    None,
    /// The age format to these X25519 recipients.
    Age {
        /// The recipients (`age1...`).
        recipients: Vec<String>,
    },
}

/// What a restore needs beyond the etcd snapshot (stored encrypted, to the
/// backup's recipients, never in plain form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RecoveryKit {
    /// The cluster.
    pub cluster: String,
    /// The snapshot's revision (the pipeline sets it from the verified
    /// snapshot).
    pub revision: i64,
    /// Kubernetes' secret encryption keys (`secretbox`, `aescbc`).
    pub encryption_secrets: Vec<EncryptionSecret>,
    /// The etcd members when the snapshot was taken.
    pub members: Vec<KitMember>,
    /// Fingerprints of the cluster's certificate authorities.
    pub ca_fingerprints: Vec<CaFingerprint>,
    /// Each node's machine configuration digest.
    pub node_configs: Vec<NodeConfigDigest>,
}

impl RecoveryKit {
    /// An empty kit for `cluster` (revision 0: the pipeline sets it).
    pub fn new(cluster: impl Into<String>) -> RecoveryKit {
        RecoveryKit {
            cluster: cluster.into(),
            revision: 0,
            encryption_secrets: Vec::new(),
            members: Vec::new(),
            ca_fingerprints: Vec::new(),
            node_configs: Vec::new(),
        }
    }
}

/// A Kubernetes secret-encryption key of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EncryptionSecret {
    /// The provider: `secretbox` or `aescbc`.
    pub provider: String,
    /// The key as the machine configuration holds it (base64).
    pub secret: SecretString,
}

impl EncryptionSecret {
    /// The key `secret` of `provider`.
    pub fn new(provider: impl Into<String>, secret: SecretString) -> EncryptionSecret {
        EncryptionSecret {
            provider: provider.into(),
            secret,
        }
    }
}

/// An etcd member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KitMember {
    /// Member id.
    pub id: u64,
    /// Hostname.
    pub hostname: String,
    /// Peer URLs.
    pub peer_urls: Vec<String>,
    /// Client URLs.
    pub client_urls: Vec<String>,
    /// Whether it was a learner.
    pub is_learner: bool,
}

impl KitMember {
    /// Voting member `id` on `hostname`, its URLs not yet known.
    pub fn new(id: u64, hostname: impl Into<String>) -> KitMember {
        KitMember {
            id,
            hostname: hostname.into(),
            peer_urls: Vec::new(),
            client_urls: Vec::new(),
            is_learner: false,
        }
    }
}

/// The fingerprint of one certificate authority.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CaFingerprint {
    /// Which CA: `os`, `kubernetes`, `etcd`, `aggregator`...
    pub name: String,
    /// sha256 of the certificate's DER, hex.
    pub sha256: String,
}

impl CaFingerprint {
    /// CA `name` whose certificate's DER hashes to `sha256` (hex).
    pub fn new(name: impl Into<String>, sha256: impl Into<String>) -> CaFingerprint {
        CaFingerprint {
            name: name.into(),
            sha256: sha256.into(),
        }
    }
}

/// A node's machine configuration digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NodeConfigDigest {
    /// The node.
    pub node: String,
    /// sha256 of its configuration, hex.
    pub sha256: String,
}

impl NodeConfigDigest {
    /// `node`'s configuration, hashing to `sha256` (hex).
    pub fn new(node: impl Into<String>, sha256: impl Into<String>) -> NodeConfigDigest {
        NodeConfigDigest {
            node: node.into(),
            sha256: sha256.into(),
        }
    }
}

impl serde::Serialize for SecretString {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.expose())
    }
}

impl<'de> serde::Deserialize<'de> for SecretString {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(SecretString::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kits_keep_their_secrets_out_of_debug() {
        let kit = RecoveryKit {
            cluster: "c".into(),
            revision: 7,
            encryption_secrets: vec![EncryptionSecret {
                provider: "secretbox".into(),
                secret: SecretString::new("c2VjcmV0LWtleS1tYXRlcmlhbA=="),
            }],
            members: vec![],
            ca_fingerprints: vec![],
            node_configs: vec![],
        };
        assert!(!format!("{kit:?}").contains("c2VjcmV0"));
        let json = serde_json::to_string(&kit).unwrap();
        assert!(
            json.contains("c2VjcmV0"),
            "the kit itself carries it: {json}"
        );
        assert_eq!(serde_json::from_str::<RecoveryKit>(&json).unwrap(), kit);
    }
}
