//! After a crash: operations left running in the journal are reconciled
//! and continued through `Ops::resume` where every step has a reconciler;
//! the others are marked needs-attention with their exact state. And
//! `--recover-journal`: a journal that cannot be trusted is moved aside.

use std::sync::Arc;

use std::time::Duration;

use talos_client::ops::{OpRecord, OpState, StepState};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::manager::{Manager, fingerprint_of};

/// How old an irreversible step in flight may be for an unattended resume,
/// unless the configuration says otherwise (`resume_within`).
pub const DEFAULT_RESUME_WITHIN: Duration = Duration::from_secs(600);

/// The steps that cannot be undone: resumed unattended only while fresh.
const IRREVERSIBLE: &[&str] = &["leave", "remove", "reset"];

/// Whether an interrupted operation can be continued unattended. An apply
/// with a step in flight may have outlived its TRY window while nobody
/// watched; a leave, removal or reset in flight longer ago than `within`
/// may meet another machine at the address, or a cluster that moved on:
/// a person decides. `now` is the wall clock (the journal's times are).
fn safe_to_resume(record: &OpRecord, within: Duration, now: OffsetDateTime) -> bool {
    let fresh = || {
        record
            .steps
            .iter()
            .filter(|s| IRREVERSIBLE.contains(&s.name.as_str()))
            .filter(|s| s.state == StepState::Running)
            .all(|s| {
                s.started
                    .as_deref()
                    .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
                    .is_some_and(|t| now - t <= within)
            })
    };
    match record.kind.as_str() {
        "snapshot" | "join" => true,
        "retire" | "migrate" => fresh(),
        "apply" => record.in_flight().is_none_or(|s| !s.destructive),
        _ => false,
    }
}

/// Resumes or flags every interrupted operation of the configured clusters.
pub async fn recover(manager: &Arc<Manager>, within: Duration) {
    let journal = match manager.journal() {
        Ok(j) => j,
        Err(e) => {
            tracing::error!("reading the journal: {e}");
            return;
        }
    };
    for cluster in manager.clusters() {
        let name = cluster.config.name.clone();
        let interrupted = match journal.list(Some(&fingerprint_of(&cluster))) {
            Ok(ops) => ops.into_iter().filter(|op| op.state == OpState::Running),
            Err(e) => {
                tracing::error!(cluster = %name, "reading the journal: {e}");
                continue;
            }
        };
        for op in interrupted {
            let at = op
                .in_flight()
                .map(|s| format!("step {:?} in flight", s.name))
                .unwrap_or_else(|| "between steps".into());
            if safe_to_resume(&op, within, OffsetDateTime::now_utc()) {
                match manager.resume(&name, &op.id).await {
                    Ok(id) => {
                        tracing::info!(target: "audit", who = "talos-opsd", cluster = %name, op = %id, "resuming an interrupted {} ({at})", op.kind)
                    }
                    Err(e) => {
                        tracing::warn!(cluster = %name, op = %op.id, "not resumed ({at}): {e}")
                    }
                }
            } else {
                match manager.needs_attention(&name, &op.id) {
                    Ok(_) => {
                        tracing::warn!(target: "audit", who = "talos-opsd", cluster = %name, op = %op.id, "needs attention: {} interrupted with {at}", op.kind)
                    }
                    Err(e) => tracing::warn!(cluster = %name, op = %op.id, "{e}"),
                }
            }
        }
    }
}

/// `--recover-journal`: a journal that is empty or corrupt is moved aside
/// (with its WAL files) as `journal.sqlite.corrupt-TIME`, so that the
/// daemon starts with a new one; a sound journal is left alone.
pub fn recover_journal(state_dir: &std::path::Path) -> anyhow::Result<()> {
    use talos_client::ops::{Journal, OpsError};
    let path = match Journal::open(state_dir).and_then(|j| j.check()) {
        Ok(()) => {
            tracing::info!(state_dir = %state_dir.display(), "--recover-journal: the journal is sound; nothing to recover");
            return Ok(());
        }
        Err(OpsError::CorruptJournal { path, reason }) => {
            tracing::warn!(journal = %path.display(), "--recover-journal: {reason}");
            path
        }
        Err(other) => return Err(other.into()),
    };
    let now = time::OffsetDateTime::now_utc();
    let stamp = format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second()
    );
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("journal.sqlite")
        .to_string();
    for suffix in ["", "-wal", "-shm"] {
        let from = path.with_file_name(format!("{name}{suffix}"));
        if !from.exists() {
            continue;
        }
        let to = path.with_file_name(format!("{name}.corrupt-{stamp}{suffix}"));
        std::fs::rename(&from, &to)
            .map_err(|e| anyhow::anyhow!("moving {} aside: {e}", from.display()))?;
        tracing::warn!(target: "audit", who = "talos-opsd", from = %from.display(), to = %to.display(), "--recover-journal: the journal was moved aside; a new one starts without the history");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A retire interrupted with its leave in flight since `started`.
    fn retire_in_leave(started: &str) -> OpRecord {
        serde_json::from_value(serde_json::json!({
            "id": "op", "kind": "retire", "context": "c", "ca_fingerprint": "f",
            "params": {}, "facts": {}, "format": 2, "state": "running",
            "created": started, "updated": started,
            "steps": [
                {"index": 0, "name": "snapshot", "description": "", "destructive": false,
                 "state": "done", "started": started, "finished": started,
                 "duration_ms": 1, "detail": null},
                {"index": 1, "name": "leave", "description": "", "destructive": true,
                 "state": "running", "started": started, "finished": null,
                 "duration_ms": null, "detail": null}
            ]
        }))
        .unwrap()
    }

    #[test]
    fn an_irreversible_step_in_flight_is_resumed_only_while_fresh() {
        let now = OffsetDateTime::parse("2026-12-05T12:00:00Z", &Rfc3339).unwrap();
        let within = Duration::from_secs(600);
        assert!(safe_to_resume(
            &retire_in_leave("2026-12-05T11:55:00Z"),
            within,
            now
        ));
        assert!(!safe_to_resume(
            &retire_in_leave("2026-12-05T11:00:00Z"),
            within,
            now
        ));
        // An unreadable start time is no proof of freshness.
        assert!(!safe_to_resume(&retire_in_leave("yesterday"), within, now));
        assert!(safe_to_resume(
            &retire_in_leave("2026-12-05T11:00:00Z"),
            Duration::from_secs(7200),
            now
        ));
    }
}
