//! A cluster's snapshots as the daemon keeps them: where its backups are
//! stored and what the stores hold (listed live), and after a snapshot
//! operation its catalogue entry and retention by age.

use std::path::PathBuf;

use talos_client::ops::OpRecord;

use crate::config::ResolvedCluster;
use crate::manager::{Manager, fingerprint_of, retention_cutoff};
use crate::proto;

impl Manager {
    /// Where `cluster`'s backups are stored as object sets, and how it is
    /// reached: its `store`, or its snapshot directory when snapshots are
    /// encrypted there; `None` for plain snapshot files (catalogued in the
    /// journal instead).
    pub fn backup_store(
        &self,
        cluster: &ResolvedCluster,
    ) -> Option<(String, talos_client::ops::S3Access)> {
        let snapshots = cluster.config.snapshots.as_ref()?;
        match &snapshots.store {
            Some(store) => Some((store.clone(), snapshots.access())),
            None if !snapshots.encrypt.is_empty() => Some((
                self.snapshot_dir(cluster).display().to_string(),
                talos_client::ops::S3Access::default(),
            )),
            None => None,
        }
    }

    /// The backups in the stores of the configured clusters (or of
    /// `only`), listed live from each store, that cluster's only; and the
    /// stores that could not be listed, each within a bound so one
    /// unreachable store does not hold up the answer.
    pub async fn stored_backups(
        &self,
        only: Option<&str>,
    ) -> (Vec<proto::Snapshot>, Vec<proto::StoreListError>) {
        const LIST_BOUND: std::time::Duration = std::time::Duration::from_secs(20);
        let mut snapshots = Vec::new();
        let mut errors = Vec::new();
        let clusters = match only.and_then(|name| self.cluster(name)) {
            Some(one) => vec![one],
            None if only.is_some() => Vec::new(),
            None => self.clusters(),
        };
        for cluster in clusters {
            let Some((name, access)) = self.backup_store(&cluster) else {
                continue;
            };
            let error = |message: String| proto::StoreListError {
                cluster: cluster.config.name.clone(),
                store: name.clone(),
                message,
            };
            let listed = async {
                let addressing = access
                    .addressing()
                    .parse::<talos_client::backup::Addressing>()
                    .map_err(|e| e.to_string())?;
                let store = talos_client::backup::open_store_with(
                    &name,
                    addressing,
                    access.region.as_deref(),
                    access.endpoint.as_deref(),
                )
                .map_err(|e| e.to_string())?;
                talos_client::backup::catalogue(&[store.as_ref()])
                    .await
                    .map_err(|e| e.to_string())
            };
            let entries = match tokio::time::timeout(LIST_BOUND, listed).await {
                Ok(Ok(entries)) => entries,
                Ok(Err(e)) => {
                    errors.push(error(e));
                    continue;
                }
                Err(_) => {
                    errors.push(error(format!(
                        "not listed within {} s",
                        LIST_BOUND.as_secs()
                    )));
                    continue;
                }
            };
            for entry in entries {
                let meta = &entry.metadata;
                if meta.cluster != cluster.context.name {
                    continue;
                }
                let recipients = match &meta.object.encryption {
                    talos_client::backup::Encryption::Age { recipients } => recipients.len(),
                    _ => 0,
                };
                snapshots.push(proto::Snapshot {
                    cluster: cluster.config.name.clone(),
                    operation_id: String::new(),
                    node: meta.node.clone(),
                    taken: meta
                        .time
                        .format(&time::format_description::well_known::Rfc3339)
                        .unwrap_or_default(),
                    revision: meta.snapshot.status.revision,
                    sha256: meta.snapshot.sha256.clone(),
                    size: meta.snapshot.size,
                    path: String::new(),
                    store: name.clone(),
                    key: meta.object.key.clone(),
                    recipients: u32::try_from(recipients).unwrap_or(u32::MAX),
                    kit: meta.kit.is_some(),
                    complete: entry.complete,
                });
            }
        }
        (snapshots, errors)
    }

    /// A snapshot operation ended: its snapshot catalogued and, when it
    /// succeeded, retention by age.
    pub(crate) fn after_snapshot(&self, cluster: &ResolvedCluster, record: &OpRecord, ok: bool) {
        let name = &cluster.config.name;
        if !ok {
            // A verified snapshot the journal names (the operation failed
            // after it, at retention say) is catalogued all the same.
            self.catalogue_snapshot(name, record);
            return;
        }
        let Some((path, _)) = self.catalogue_snapshot(name, record) else {
            return;
        };
        let catalogue = self.catalogue();
        if let Err(e) = catalogue.prune_missing(name) {
            tracing::error!(cluster = %name, "{e}");
        }
        if let Some(max_age) = cluster.config.snapshots.as_ref().and_then(|s| s.max_age) {
            let Some(cutoff) = retention_cutoff(time::OffsetDateTime::now_utc(), max_age.0) else {
                tracing::warn!(cluster = %name, "max_age reaches before any date: nothing expires");
                return;
            };
            let held = self
                .journal()
                .and_then(|j| talos_client::ops::held_snapshots(&j, &fingerprint_of(cluster)));
            let held = match held {
                Ok(held) => held,
                Err(e) => {
                    tracing::error!(cluster = %name, "nothing expires: reading the journal: {e}");
                    return;
                }
            };
            match crate::catalogue::expire(&catalogue, name, &cutoff, &path, &held) {
                Ok(removed) if !removed.is_empty() => {
                    tracing::info!(cluster = %name, removed = removed.len(), "expired snapshots removed")
                }
                Ok(_) => {}
                Err(e) => tracing::error!(cluster = %name, "expiring snapshots: {e}"),
            }
        }
    }

    /// Catalogues the verified snapshot `record`'s facts name, if any;
    /// returns its path and metadata.
    pub(crate) fn catalogue_snapshot(
        &self,
        name: &str,
        record: &OpRecord,
    ) -> Option<(PathBuf, talos_client::snapshot::SnapshotMetadata)> {
        if record.kind != talos_client::ops::OpKind::Snapshot.name() {
            return None;
        }
        let path = record.facts["snapshot"].as_str().map(PathBuf::from)?;
        let sidecar = PathBuf::from(format!("{}.json", path.display()));
        let meta = std::fs::read(&sidecar).ok().and_then(|b| {
            serde_json::from_slice::<talos_client::snapshot::SnapshotMetadata>(&b).ok()
        });
        let Some(meta) = meta else {
            tracing::warn!(cluster = %name, path = %path.display(), "snapshot sidecar unreadable: not catalogued");
            return None;
        };
        if let Err(e) = self.catalogue().add(name, &record.id, &path, &meta) {
            tracing::error!(cluster = %name, "{e}");
        }
        Some((path, meta))
    }
}
