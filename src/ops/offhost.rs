//! `snapshot --to s3://BUCKET/PREFIX`: the snapshot step streams the etcd
//! snapshot through the backup pipeline (every check of a saved snapshot,
//! zstd, age for the recipients, a multipart upload; no plaintext on disk
//! when encrypted) instead of into a directory, and the retention step
//! keeps the newest N of the cluster's backups in that store. Needs the
//! `backup` feature; without it such a plan is refused.

use super::snapshot::{OffHost, SnapshotFacts, SnapshotOptions};
use super::{Ops, OpsError, Outcome, Refusal};

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
        if !store.starts_with("s3://") {
            return Err(bad("an off-host store is named s3://BUCKET/PREFIX".into()).into());
        }
        let addressing = options.s3_addressing.as_deref().unwrap_or("path");
        #[cfg(feature = "backup")]
        {
            let parsed = addressing
                .parse::<crate::backup::Addressing>()
                .map_err(|e| bad(e.to_string()))?;
            crate::backup::open_store(store, parsed).map_err(|e| bad(e.to_string()))?;
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
                addressing: addressing.to_string(),
                recipients: options.encrypt.clone(),
                key: None,
                size: None,
                kit: options.kit,
                tiers: options.tiers,
            })
        }
        #[cfg(not(feature = "backup"))]
        {
            let _ = addressing;
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
        let store = backup::open_store(&off.store, off.addressing.parse().map_err(|e| fail(&e))?)
            .map_err(|e| fail(&e))?;
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
        let store = backup::open_store(&off.store, off.addressing.parse().map_err(|e| fail(&e))?)
            .map_err(|e| fail(&e))?;
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
