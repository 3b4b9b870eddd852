//! `drill`: proves that a stored backup restores, without touching the
//! cluster. The newest catalogued backup of this cluster in a store (or a
//! given key) is fetched, decrypted with the identities, verified, restored
//! into a throwaway etcd on this host and compared with its sidecar
//! (revision, key count, each top-level prefix read); see
//! [`crate::backup::drill`]. Needs the `backup` feature.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::plan::{Plan, StepInfo};
use super::{Ops, OpsError, Outcome, Refusal};

/// Options of a drill ([`OpSpec::Drill`](super::OpSpec::Drill)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DrillOptions {
    /// The store: a directory or `s3://BUCKET/PREFIX`.
    pub from: String,
    /// The backup's object key (`None`: the newest of this cluster's).
    #[serde(default)]
    pub key: Option<String>,
    /// Files of age identities (`AGE-SECRET-KEY-1...`), as `age -i` reads
    /// them; their contents are never journaled.
    #[serde(default)]
    pub identity_files: Vec<PathBuf>,
    /// How the S3 store is reached (addressing, region, endpoint).
    #[serde(flatten)]
    pub s3: super::S3Access,
}

impl DrillOptions {
    /// A drill of the newest backup of this cluster in `from`.
    pub fn new(from: impl Into<String>) -> DrillOptions {
        DrillOptions {
            from: from.into(),
            key: None,
            identity_files: Vec::new(),
            s3: super::S3Access::default(),
        }
    }
}

/// The one step of a drill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DrillStep {
    /// Fetch, decrypt, verify, restore into a throwaway etcd, compare.
    Drill,
}

impl StepInfo for DrillStep {
    fn name(&self) -> &'static str {
        "drill"
    }

    fn destructive(&self) -> bool {
        false
    }

    fn precondition(&self) -> Option<super::fresh::CheckKind> {
        None
    }
}

/// What a drill's preflight found and its step recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DrillFacts {
    /// The store.
    pub store: String,
    /// The backup drilled.
    pub key: String,
    /// The revision its sidecar records.
    pub revision: i64,
    /// The drill's report (JSON), once run.
    pub report: Option<serde_json::Value>,
}

impl Ops {
    /// Plans a drill: the store opens, the backup is catalogued (the newest
    /// of this cluster's unless a key is given) and the identities read.
    pub(super) async fn plan_drill(&self, options: &DrillOptions) -> Result<Plan, OpsError> {
        let bad = |error: String| Refusal::BadStore {
            store: options.from.clone(),
            error,
        };
        #[cfg(feature = "backup")]
        {
            use super::OpSpec;
            use super::plan::{Facts, PlannedStep, Step};
            let (store, _) = self.drill_inputs(options).map_err(bad)?;
            let entry = self
                .choose_backup(&*store, options.key.as_deref())
                .await
                .map_err(bad)?;
            let facts = DrillFacts {
                store: options.from.clone(),
                key: entry.metadata.object.key.clone(),
                revision: entry.metadata.snapshot.status.revision,
                report: None,
            };
            let step = PlannedStep::new(
                Step::Drill(DrillStep::Drill),
                format!(
                    "fetch {} (revision {}), decrypt, verify, restore into a throwaway etcd on this host and compare with its sidecar; the cluster is not touched",
                    facts.key, facts.revision
                ),
            );
            Ok(Plan::new(
                OpSpec::Drill(options.clone()),
                vec![step],
                Vec::new(),
                Facts::Drill(facts),
                "",
            ))
        }
        #[cfg(not(feature = "backup"))]
        {
            Err(
                bad("this build has no off-host backups (talos-client feature `backup`)".into())
                    .into(),
            )
        }
    }

    /// The backup `key` in `store`, or the newest complete one of this
    /// cluster.
    #[cfg(feature = "backup")]
    pub(super) async fn choose_backup(
        &self,
        store: &dyn crate::backup::Store,
        key: Option<&str>,
    ) -> Result<crate::backup::CatalogueEntry, String> {
        let entries = crate::backup::catalogue(&[store])
            .await
            .map_err(|e| e.to_string())?;
        let ours = |e: &&crate::backup::CatalogueEntry| e.metadata.cluster == self.context;
        let entry = match key {
            Some(key) => entries.iter().find(|e| e.metadata.object.key == key),
            None => entries.iter().filter(ours).find(|e| e.complete),
        };
        if let Some(entry) = entry {
            return Ok(entry.clone());
        }
        Err(match (key, entries.iter().find(ours)) {
            (Some(key), _) => format!("no catalogued backup {key}"),
            // Only incomplete ones: the newest says which check failed.
            (None, Some(newest)) => format!(
                "no complete backup of cluster {:?}: the newest, {}, failed the size check: {}",
                self.context,
                newest.metadata.object.key,
                newest.incomplete().unwrap_or_default()
            ),
            (None, None) => format!("no backup of cluster {:?}", self.context),
        })
    }

    #[cfg(feature = "backup")]
    pub(super) fn drill_inputs(
        &self,
        options: &DrillOptions,
    ) -> Result<(Box<dyn crate::backup::Store>, Vec<crate::backup::Identity>), String> {
        use crate::backup;
        let store = options.s3.open(&options.from)?;
        let mut identities = Vec::new();
        for file in &options.identity_files {
            identities.extend(backup::read_identities(file).map_err(|e| e.to_string())?);
        }
        Ok((store, identities))
    }

    pub(super) async fn drill_step(
        &self,
        options: &DrillOptions,
        facts: &mut DrillFacts,
    ) -> Result<Outcome, OpsError> {
        #[cfg(feature = "backup")]
        {
            let (store, identities) = self
                .drill_inputs(options)
                .map_err(|e| OpsError::step("drill", e))?;
            let drill = crate::backup::DrillOptions {
                identities,
                ..crate::backup::DrillOptions::default()
            };
            let report = crate::backup::drill(&*store, &facts.key, &drill)
                .await
                .map_err(|e| OpsError::step("drill", e))?;
            facts.report = serde_json::to_value(&report).ok();
            if !report.ok {
                return Err(OpsError::step(
                    "drill",
                    format!(
                        "{} failed the check {}",
                        facts.key,
                        report.failed_check.as_deref().unwrap_or("?")
                    ),
                ));
            }
            Ok(Outcome::done(format!(
                "restored revision {} with {} keys, as its sidecar says ({} ms)",
                report.revision.unwrap_or_default(),
                report.keys.unwrap_or_default(),
                report.duration_ms
            )))
        }
        #[cfg(not(feature = "backup"))]
        {
            let _ = (options, facts);
            Err(OpsError::step(
                "drill",
                "this build has no off-host backups (talos-client feature `backup`)",
            ))
        }
    }
}
