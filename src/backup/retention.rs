//! Retention tiers: keep the newest N, plus the newest backup of each of
//! the latest H hours, D days and W ISO weeks (the scheme of restic's and
//! borg's `--keep-*`). Tiers are applied per store and cluster; the newest
//! backup of each is always kept, whatever the counts.

use std::collections::BTreeMap;

use super::catalogue::CatalogueEntry;
use super::metadata::{KIT_SUFFIX, sidecar_key};
use super::store::{Store, StoreError};
use super::BackupError;

/// How many backups to keep.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
pub struct RetentionPlan {
    /// Kept, with why (`last`, `hourly`, `daily`, `weekly`).
    pub keep: Vec<(CatalogueEntry, Vec<&'static str>)>,
    /// To delete.
    pub delete: Vec<CatalogueEntry>,
}

type Bucket = (i32, u16, u8);

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
            group.sort_by(|a, b| b.metadata.time.cmp(&a.metadata.time));
            let mut reasons: Vec<Vec<&'static str>> = vec![Vec::new(); group.len()];
            for (i, r) in reasons.iter_mut().enumerate().take(self.keep_last.max(1)) {
                r.push(if i < self.keep_last { "last" } else { "newest" });
            }
            let tiers: [(&'static str, usize, fn(&CatalogueEntry) -> Bucket); 3] = [
                ("hourly", self.hourly, |e| {
                    let t = e.metadata.time;
                    (t.year(), t.ordinal(), t.hour())
                }),
                ("daily", self.daily, |e| {
                    let t = e.metadata.time;
                    (t.year(), t.ordinal(), 0)
                }),
                ("weekly", self.weekly, |e| {
                    let (year, week, _) = e.metadata.time.to_iso_week_date();
                    (year, u16::from(week), 0)
                }),
            ];
            for (name, count, bucket) in tiers {
                let mut last = None;
                let mut kept = 0;
                for (i, entry) in group.iter().enumerate() {
                    if kept == count {
                        break;
                    }
                    let b = bucket(entry);
                    if last != Some(b) {
                        last = Some(b);
                        kept += 1;
                        reasons[i].push(name);
                    }
                }
            }
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
