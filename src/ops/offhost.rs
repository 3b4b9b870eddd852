//! `snapshot --to s3://BUCKET/PREFIX` (or `--to DIR --encrypt ...`): the
//! snapshot step streams the etcd snapshot through the backup pipeline
//! (every check of a saved snapshot, zstd, age for the recipients, a
//! multipart upload or a file renamed into place; no plaintext on disk when
//! encrypted) into the store, and the retention step keeps the cluster's
//! backups in that store by count and tiers. A directory store holds the
//! same object set as a bucket. Needs the `backup` feature; without it
//! such a plan is refused.

use serde::{Deserialize, Serialize};

use super::snapshot::{OffHost, SnapshotFacts, SnapshotOptions};
use super::{Ops, OpsError, Outcome, Refusal};

/// How an S3 store is reached beyond its `s3://BUCKET/PREFIX`: what is left
/// `None` comes from the AWS environment (`AWS_REGION`, `AWS_ENDPOINT_URL`),
/// and addressing is `path` unless given. Flattened into the options that
/// name a store, so the journal keeps `s3_addressing`, `s3_region` and
/// `s3_endpoint` beside the store. Credentials are never here: they come
/// from the environment only, so they are never journaled.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct S3Access {
    /// `path` (self-hosted servers; the default) or `virtual` (AWS).
    #[serde(
        default,
        rename = "s3_addressing",
        skip_serializing_if = "Option::is_none"
    )]
    pub addressing: Option<String>,
    /// The region, e.g. `eu-central-1` (default: `AWS_REGION`, else
    /// `us-east-1`).
    #[serde(default, rename = "s3_region", skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The endpoint URL, e.g. `http://10.0.0.5:8333` (default:
    /// `AWS_ENDPOINT_URL`, else AWS's for the region).
    #[serde(
        default,
        rename = "s3_endpoint",
        skip_serializing_if = "Option::is_none"
    )]
    pub endpoint: Option<String>,
}

impl S3Access {
    /// The addressing, `path` when unset.
    pub fn addressing(&self) -> &str {
        self.addressing.as_deref().unwrap_or("path")
    }

    /// Opens the store `name` (a directory, or `s3://...` reached as this
    /// says).
    #[cfg(feature = "backup")]
    pub(crate) fn open(&self, name: &str) -> Result<Box<dyn crate::backup::Store>, String> {
        if !name.starts_with("s3://") {
            return Ok(Box::new(crate::backup::LocalStore::new(name)));
        }
        let addressing = self
            .addressing()
            .parse::<crate::backup::Addressing>()
            .map_err(|e| e.to_string())?;
        crate::backup::open_store_with(
            name,
            addressing,
            self.region.as_deref(),
            self.endpoint.as_deref(),
        )
        .map_err(|e| e.to_string())
    }
}

impl OffHost {
    /// How the planned store is reached.
    pub fn access(&self) -> S3Access {
        S3Access {
            addressing: (!self.addressing.is_empty()).then(|| self.addressing.clone()),
            region: self.region.clone(),
            endpoint: self.endpoint.clone(),
        }
    }
}

impl Ops {
    /// Checks an off-host store and its recipients at plan time.
    pub(super) fn plan_off_host(
        &self,
        store: &str,
        options: &SnapshotOptions,
    ) -> Result<OffHost, OpsError> {
        let bad = |error: String| Refusal::BadStore {
            store: store.to_string(),
            error,
        };
        let remote = store.starts_with("s3://");
        if !remote && !std::path::Path::new(store).is_absolute() {
            return Err(
                bad("a store is s3://BUCKET/PREFIX or an absolute directory".into()).into(),
            );
        }
        if !remote && options.s3 != S3Access::default() {
            return Err(bad(
                "S3 addressing, region and endpoint are for an s3://BUCKET/PREFIX store, not a directory".into(),
            )
            .into());
        }
        #[cfg(feature = "backup")]
        {
            options.s3.open(store).map_err(bad)?;
            for recipient in &options.encrypt {
                recipient
                    .parse::<crate::backup::Recipient>()
                    .map_err(|e| bad(format!("recipient {recipient:?}: {e}")))?;
            }
            if options.kit && options.encrypt.is_empty() {
                return Err(bad(
                    "a recovery kit holds the cluster's secret-encryption keys and is only stored encrypted: give a recipient".into(),
                )
                .into());
            }
            Ok(OffHost {
                store: store.to_string(),
                addressing: if remote {
                    options.s3.addressing().to_string()
                } else {
                    String::new()
                },
                region: options.s3.region.clone(),
                endpoint: options.s3.endpoint.clone(),
                recipients: options.encrypt.clone(),
                key: None,
                size: None,
                kit: options.kit,
                tiers: options.tiers,
            })
        }
        #[cfg(not(feature = "backup"))]
        {
            let _ = options;
            Err(
                bad("this build has no off-host backups (talos-client feature `backup`)".into())
                    .into(),
            )
        }
    }

    /// The snapshot step, off-host.
    #[cfg(feature = "backup")]
    pub(super) async fn snapshot_off_host(
        &self,
        facts: &mut SnapshotFacts,
    ) -> Result<Outcome, OpsError> {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};

        use crate::backup::{self, BackupRequest, Recipient};

        let fail = |e: &dyn std::fmt::Display| OpsError::step("snapshot", e);
        let off = facts
            .off_host
            .clone()
            .ok_or_else(|| OpsError::MissingFact("off_host".into()))?;
        let store = off.access().open(&off.store).map_err(|e| fail(&e))?;
        let mut request = BackupRequest::new(self.context.clone());
        for r in &off.recipients {
            request
                .recipients
                .push(r.parse::<Recipient>().map_err(|e| fail(&e))?);
        }
        let address = facts.source.address.clone();
        let target = self.client.node(address.as_str());
        request.talos_version = target.version().await.ok().map(|v| v.tag);
        let mut kit_note = String::new();
        if off.kit {
            let gathered = self.gather_kit(&address).await?;
            kit_note = format!(
                "; kit: {} encryption key(s), {} member(s), {} CA(s), {} configuration digest(s)",
                gathered.kit.encryption_secrets.len(),
                gathered.kit.members.len(),
                gathered.kit.ca_fingerprints.len(),
                gathered.kit.node_configs.len(),
            );
            if !gathered.unread.is_empty() {
                kit_note += &format!(" ({} did not answer)", gathered.unread.join(", "));
            }
            request.kit = Some(gathered.kit);
        }
        let stall = self.snapshot_stall;
        let stream = tokio::time::timeout(stall, target.etcd_snapshot())
            .await
            .map_err(|_| OpsError::SnapshotStalled {
                node: address.clone(),
                seconds: stall.as_secs(),
            })??;
        let node = stream.node().to_string();
        let stalled = Arc::new(AtomicBool::new(false));
        let guarded = super::snapshot::stall_guard(stream, stall, stalled.clone());
        let stored = match backup::backup_chunks(&*store, guarded, &node, &request).await {
            Ok(stored) => stored,
            Err(_) if stalled.load(Ordering::Relaxed) => {
                return Err(OpsError::SnapshotStalled {
                    node: address,
                    seconds: stall.as_secs(),
                });
            }
            Err(e) => return Err(fail(&e)),
        };
        let object = &stored.metadata.object;
        let detail = format!(
            "{}/{} ({} bytes stored, revision {}, {}) from {address}",
            off.store.trim_end_matches('/'),
            object.key,
            object.size,
            stored.metadata.snapshot.status.revision,
            if off.recipients.is_empty() {
                "not encrypted".to_string()
            } else {
                format!("age-encrypted for {} recipient(s)", off.recipients.len())
            }
        ) + &kit_note;
        if let Some(o) = facts.off_host.as_mut() {
            o.key = Some(object.key.clone());
            o.size = Some(object.size);
        }
        Ok(Outcome::done(detail))
    }

    /// The retention step, off-host: the newest `keep` of this cluster's
    /// backups in the store stay, nothing else is touched.
    #[cfg(feature = "backup")]
    pub(super) async fn retain_off_host(
        &self,
        facts: &mut SnapshotFacts,
    ) -> Result<Outcome, OpsError> {
        use crate::backup::{self, Retention};

        let fail = |e: &dyn std::fmt::Display| OpsError::step("retention", e);
        let off = facts
            .off_host
            .clone()
            .ok_or_else(|| OpsError::MissingFact("off_host".into()))?;
        // keep 0 keeps everything, unless tiers say what to keep.
        if facts.keep == 0 && off.tiers.is_empty() {
            return Ok(Outcome::done("nothing to remove"));
        }
        let store = off.access().open(&off.store).map_err(|e| fail(&e))?;
        let entries = backup::catalogue(&[&*store]).await.map_err(|e| fail(&e))?;
        let ours: Vec<_> = entries
            .into_iter()
            .filter(|e| e.metadata.cluster == self.context)
            .collect();
        let retention = Retention {
            keep_last: facts.keep,
            hourly: off.tiers.hourly,
            daily: off.tiers.daily,
            weekly: off.tiers.weekly,
        };
        let plan = retention.plan(&ours);
        let removed = backup::apply_retention(&*store, &plan)
            .await
            .map_err(|e| fail(&e))?;
        Ok(Outcome::done(if removed.is_empty() {
            "nothing to remove".to_string()
        } else {
            format!("removed {}", removed.join(", "))
        }))
    }

    #[cfg(not(feature = "backup"))]
    pub(super) async fn snapshot_off_host(
        &self,
        _facts: &mut SnapshotFacts,
    ) -> Result<Outcome, OpsError> {
        Err(OpsError::step(
            "snapshot",
            "this build has no off-host backups (talos-client feature `backup`)",
        ))
    }

    #[cfg(not(feature = "backup"))]
    pub(super) async fn retain_off_host(
        &self,
        _facts: &mut SnapshotFacts,
    ) -> Result<Outcome, OpsError> {
        Err(OpsError::step(
            "retention",
            "this build has no off-host backups (talos-client feature `backup`)",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::S3Access;
    use crate::ops::{DrillOptions, OpSpec, SnapshotOptions};

    /// The access settings sit flat beside the store in the journal, so
    /// records written before region and endpoint existed still read.
    #[test]
    fn access_is_journaled_flat_and_older_records_read() {
        let old: SnapshotOptions = serde_json::from_value(serde_json::json!({
            "store": "s3://b/p",
            "s3_addressing": "virtual"
        }))
        .unwrap();
        assert_eq!(old.s3.addressing.as_deref(), Some("virtual"));
        assert_eq!(
            (old.s3.region.as_ref(), old.s3.endpoint.as_ref()),
            (None, None)
        );

        let mut drill = DrillOptions::new("s3://b/p");
        drill.s3 = S3Access {
            addressing: Some("path".into()),
            region: Some("eu-central-1".into()),
            endpoint: Some("http://10.0.0.5:8333".into()),
        };
        let spec = OpSpec::Drill(drill);
        let json = serde_json::to_value(&spec).unwrap();
        let text = json.to_string();
        for key in ["\"s3_addressing\"", "\"s3_region\"", "\"s3_endpoint\""] {
            assert!(text.contains(key), "{text}");
        }
        assert!(!text.contains("\"s3\""), "{text}");
        let back: OpSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back, spec);
    }
}
