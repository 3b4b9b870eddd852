//! When the journal refuses a write in the middle of an operation (a full
//! disk, the database locked by another process): the snapshot files the
//! journal does not name are moved aside as `.orphan`, and the operation's
//! end is recorded honestly (`OpRecord::settled`) at once, or before the
//! next plan or start on its cluster while the journal still refuses.

use std::path::PathBuf;
use std::sync::PoisonError;

use talos_client::ops::{OpRecord, OpsError, Unsaved};
use talos_opsd_api::state_name;

use crate::config::ResolvedCluster;
use crate::manager::{Manager, StartError};

/// An operation whose end the journal has not taken yet.
pub(crate) struct Unsettled {
    cluster: String,
    reason: String,
    unsaved: Option<Unsaved>,
}

impl Manager {
    /// An operation whose run ended with a journal write failing (`reason`):
    /// the snapshot files it wrote that the journal does not name are moved
    /// aside as `.orphan`, and its end is recorded honestly (see
    /// [`OpRecord::settled`]) now, or before the next plan or start on the
    /// cluster if the journal still refuses writes. Returns the record as
    /// it is (or will be) recorded.
    pub(crate) fn settle_failed(
        &self,
        cluster: &ResolvedCluster,
        durable: &OpRecord,
        reason: &str,
        unsaved: Option<Unsaved>,
    ) -> OpRecord {
        let name = &cluster.config.name;
        let mut reason = reason.to_string();
        let mut unsaved = unsaved;
        let unrecorded = unsaved
            .as_ref()
            .and_then(Unsaved::facts)
            .map(|facts| unrecorded_files(&durable.facts, facts))
            .unwrap_or_default();
        if !unrecorded.is_empty() {
            let moved = move_aside(name, &durable.id, &unrecorded);
            if !moved.is_empty() {
                reason = format!("{reason}; moved aside: {}", moved.join(", "));
            }
            unsaved = unsaved.map(Unsaved::without_facts);
        }
        let settled = durable.settled(&reason, unsaved.as_ref());
        let written = self.journal().and_then(|j| j.settle(&settled));
        match written {
            Ok(_) => {
                tracing::warn!(target: "audit", who = "talos-opsd", cluster = %name, op = %durable.id, state = %state_name(settled.state), "recorded after a journal write failed: {reason}")
            }
            Err(e) => {
                tracing::error!(cluster = %name, op = %durable.id, "the journal still refuses writes ({e}); the operation is recorded as {} before the next start on the cluster", state_name(settled.state));
                self.unsettled
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(
                        durable.id.clone(),
                        Unsettled {
                            cluster: name.clone(),
                            reason,
                            unsaved,
                        },
                    );
            }
        }
        settled
    }

    /// Records the end of every operation of `cluster` whose end the
    /// journal refused earlier; refuses while it still refuses.
    pub(crate) fn settle_unsettled(&self, cluster: &ResolvedCluster) -> Result<(), StartError> {
        let name = &cluster.config.name;
        let mut unsettled = self
            .unsettled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let ids: Vec<String> = unsettled
            .iter()
            .filter(|(_, u)| &u.cluster == name)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            let pending = &unsettled[&id];
            let refused = |e: OpsError| StartError::JournalUnwritable {
                id: id.clone(),
                error: e.to_string(),
            };
            let journal = self.journal().map_err(refused)?;
            let durable = journal.get(&id).map_err(refused)?;
            let settled = durable.settled(&pending.reason, pending.unsaved.as_ref());
            journal.settle(&settled).map_err(refused)?;
            tracing::warn!(target: "audit", who = "talos-opsd", cluster = %name, op = %id, state = %state_name(settled.state), "recorded after a journal write failed: {}", pending.reason);
            unsettled.remove(&id);
            self.catalogue_snapshot(name, &settled);
        }
        Ok(())
    }

    /// `record` as the API shows it: an operation whose end is not
    /// journaled yet shows the end it will be recorded with.
    pub fn as_recorded(&self, record: OpRecord) -> OpRecord {
        let unsettled = self
            .unsettled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match unsettled.get(&record.id) {
            Some(u) => record.settled(&u.reason, u.unsaved.as_ref()),
            None => record,
        }
    }
}

/// The snapshot files named in `unsaved` facts (any `snapshot` field) and
/// not in the journal's `durable` facts.
fn unrecorded_files(durable: &serde_json::Value, unsaved: &serde_json::Value) -> Vec<PathBuf> {
    fn snapshots(value: &serde_json::Value, into: &mut Vec<PathBuf>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    match value.as_str() {
                        Some(path) if key == "snapshot" => into.push(PathBuf::from(path)),
                        _ => snapshots(value, into),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| snapshots(v, into)),
            _ => {}
        }
    }
    let (mut recorded, mut written) = (Vec::new(), Vec::new());
    snapshots(durable, &mut recorded);
    snapshots(unsaved, &mut written);
    written.retain(|p| !recorded.contains(p));
    written
}

/// Renames each snapshot and its sidecar to `NAME.orphan` (a rename needs
/// no space on a full disk), with a log line; returns the new names.
fn move_aside(cluster: &str, id: &str, files: &[PathBuf]) -> Vec<String> {
    let mut moved = Vec::new();
    for path in files {
        for file in [
            path.clone(),
            PathBuf::from(format!("{}.json", path.display())),
        ] {
            if !file.exists() {
                continue;
            }
            let orphan = PathBuf::from(format!("{}.orphan", file.display()));
            match std::fs::rename(&file, &orphan) {
                Ok(()) => {
                    tracing::warn!(target: "audit", who = "talos-opsd", cluster = %cluster, op = %id, from = %file.display(), to = %orphan.display(), "written before a journal write failed: moved aside");
                    moved.push(orphan.display().to_string());
                }
                Err(e) => {
                    tracing::error!(cluster = %cluster, op = %id, "moving {} aside: {e}", file.display())
                }
            }
        }
    }
    moved
}
