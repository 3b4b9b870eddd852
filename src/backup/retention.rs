//! Retention tiers: keep the newest N, plus the newest backup of each of
//! the latest H hours, D days and W ISO weeks (the scheme of restic's and
//! borg's `--keep-*`). Tiers are applied per store and cluster; the newest
//! backup of each is always kept, whatever the counts.

use std::collections::BTreeMap;

use super::BackupError;
use super::catalogue::CatalogueEntry;
use super::metadata::{KIT_SUFFIX, sidecar_key};
use super::store::{Store, StoreError};

/// How many backups to keep.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Retention {
    /// The newest N.
    pub keep_last: usize,
    /// The newest of each of the latest H hours that have a backup.
    pub hourly: usize,
    /// The newest of each of the latest D days.
    pub daily: usize,
    /// The newest of each of the latest W ISO weeks.
    pub weekly: usize,
}

/// What [`Retention::plan`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetentionPlan {
    /// Kept, with why (`last`, `hourly`, `daily`, `weekly`).
    pub keep: Vec<(CatalogueEntry, Vec<&'static str>)>,
    /// To delete.
    pub delete: Vec<CatalogueEntry>,
}

impl Retention {
    /// Decides, for catalogue `entries` (any order), which to keep.
    pub fn plan(&self, entries: &[CatalogueEntry]) -> RetentionPlan {
        let mut groups: BTreeMap<(&str, &str), Vec<&CatalogueEntry>> = BTreeMap::new();
        for entry in entries {
            groups
                .entry((&entry.store, &entry.metadata.cluster))
                .or_default()
                .push(entry);
        }
        let mut plan = RetentionPlan {
            keep: Vec::new(),
            delete: Vec::new(),
        };
        for (_, mut group) in groups {
            group.sort_by(|a, b| {
                (b.metadata.time, &b.metadata.object.key)
                    .cmp(&(a.metadata.time, &a.metadata.object.key))
            });
            let times: Vec<_> = group.iter().map(|e| e.metadata.time).collect();
            let counts = crate::tiers::Counts {
                keep_last: self.keep_last,
                hourly: self.hourly,
                daily: self.daily,
                weekly: self.weekly,
            };
            let reasons = crate::tiers::reasons(counts, &times);
            for (entry, why) in group.into_iter().zip(reasons) {
                if why.is_empty() {
                    plan.delete.push(entry.clone());
                } else {
                    plan.keep.push((entry.clone(), why));
                }
            }
        }
        plan
    }
}

/// Deletes what `plan` says to delete from `store` (entries of other
/// stores are left alone): the object, its kit, then its sidecar, so an
/// interrupted run is finished by the next one. Returns the keys deleted.
pub async fn apply_retention(
    store: &dyn Store,
    plan: &RetentionPlan,
) -> Result<Vec<String>, BackupError> {
    let name = store.describe();
    let mut deleted = Vec::new();
    for entry in plan.delete.iter().filter(|e| e.store == name) {
        let object = &entry.metadata.object.key;
        let mut keys = vec![object.clone()];
        if entry.metadata.kit.is_some() {
            keys.push(format!("{object}{KIT_SUFFIX}"));
        }
        keys.push(sidecar_key(object));
        for key in keys {
            match store.delete(&key).await {
                Ok(()) => deleted.push(key),
                Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::metadata::{BackupMetadata, Encryption, FORMAT, StoredObject};
    use crate::snapshot::{SnapshotReport, Status};
    use time::{Duration, OffsetDateTime, macros::datetime};

    fn entry(store: &str, cluster: &str, time: OffsetDateTime) -> CatalogueEntry {
        CatalogueEntry {
            store: store.into(),
            complete: true,
            stored_size: Some(0),
            metadata: BackupMetadata {
                format: FORMAT.into(),
                cluster: cluster.into(),
                node: "n".into(),
                time,
                snapshot: SnapshotReport {
                    size: 0,
                    sha256: String::new(),
                    status: Status {
                        hash: 0,
                        revision: 1,
                        total_keys: 1,
                        total_entries: 1,
                        total_size: 0,
                    },
                },
                object: StoredObject {
                    key: format!("{cluster}/{}", time.unix_timestamp()),
                    size: 1,
                    sha256: String::new(),
                    compression: "zstd".into(),
                    encryption: Encryption::None,
                },
                kit: None,
                talos_version: None,
                etcd_version: None,
                tool_version: "0".into(),
            },
        }
    }

    fn kept_times(plan: &RetentionPlan) -> Vec<(OffsetDateTime, Vec<&'static str>)> {
        let mut kept: Vec<_> = plan
            .keep
            .iter()
            .map(|(e, why)| (e.metadata.time, why.clone()))
            .collect();
        kept.sort_by_key(|k| std::cmp::Reverse(k.0));
        kept
    }

    #[test]
    fn tiers_keep_the_newest_of_each_hour_day_and_week() {
        let newest = datetime!(2026-03-04 10:45 UTC);
        let entries: Vec<_> = (0..144)
            .map(|i| entry("s3://b/p", "prod", newest - Duration::minutes(30 * i)))
            .collect();
        let retention = Retention {
            keep_last: 2,
            hourly: 3,
            daily: 2,
            weekly: 1,
        };
        let plan = retention.plan(&entries);
        assert_eq!(
            kept_times(&plan),
            vec![
                (newest, vec!["last", "hourly", "daily", "weekly"]),
                (datetime!(2026-03-04 10:15 UTC), vec!["last"]),
                (datetime!(2026-03-04 09:45 UTC), vec!["hourly"]),
                (datetime!(2026-03-04 08:45 UTC), vec!["hourly"]),
                (datetime!(2026-03-03 23:45 UTC), vec!["daily"]),
            ]
        );
        assert_eq!(plan.delete.len(), 139);
    }

    #[test]
    fn each_store_and_cluster_keeps_its_newest_whatever_the_counts() {
        let t = datetime!(2026-03-04 10:00 UTC);
        let entries = vec![
            entry("a", "prod", t),
            entry("a", "prod", t - Duration::hours(1)),
            entry("a", "lab", t - Duration::hours(5)),
            entry("b", "prod", t - Duration::hours(9)),
        ];
        let plan = Retention::default().plan(&entries);
        let mut kept: Vec<_> = plan
            .keep
            .iter()
            .map(|(e, why)| (e.store.as_str(), e.metadata.cluster.as_str(), why.clone()))
            .collect();
        kept.sort();
        assert_eq!(
            kept,
            vec![
                ("a", "lab", vec!["newest"]),
                ("a", "prod", vec!["newest"]),
                ("b", "prod", vec!["newest"]),
            ]
        );
        assert_eq!(plan.delete.len(), 1);
        assert_eq!(plan.delete[0].metadata.time, t - Duration::hours(1));
    }
}
