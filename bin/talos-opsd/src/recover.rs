//! After a crash: operations left running in the journal are continued
//! through `Ops::resume`, whatever their kind. The engine reconciles the
//! step in flight with the cluster and runs each destructive step's fresh
//! check right before it is sent: where the cluster no longer allows it,
//! nothing is sent and the operation needs attention, naming the check. And
//! `--recover-journal`: a journal that cannot be trusted is moved aside.

use std::sync::Arc;

use std::time::Duration;

use talos_client::ops::{OpRecord, OpState, StepState};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::manager::{Manager, fingerprint_of};

/// How old a step in flight that cannot be undone may be for an unattended
/// resume, unless the configuration says otherwise (`resume_within`).
pub const DEFAULT_RESUME_WITHIN: Duration = Duration::from_secs(600);

/// Why an interrupted operation is left for a person rather than resumed,
/// if it is: a step in flight that cannot be undone once sent (the
/// library says which: a leave, a reset, an installed release) whose send
/// began longer ago than `within` (or at a time that does not read). The
/// fresh checks cover what the cluster is now; this covers what nobody
/// saw meanwhile (a person who stepped in, a machine replaced). `now` is
/// the wall clock (the journal's times are).
fn left_for_a_person(record: &OpRecord, within: Duration, now: OffsetDateTime) -> Option<String> {
    let step = record
        .steps
        .iter()
        .find(|s| s.state == StepState::Running && s.point_of_no_return())?;
    let since = step
        .started
        .as_deref()
        .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok());
    match since {
        Some(t) if now - t <= within => None,
        Some(t) => Some(format!(
            "step {:?}, which cannot be undone, was in flight {} s ago, longer than {} s",
            step.label(),
            (now - t).whole_seconds(),
            within.as_secs()
        )),
        None => Some(format!(
            "step {:?}, which cannot be undone, was in flight since a time that does not read",
            step.label()
        )),
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
                .map(|s| format!("step {:?} in flight", s.label()))
                .unwrap_or_else(|| "between steps".into());
            if let Some(why) = left_for_a_person(&op, within, OffsetDateTime::now_utc()) {
                match manager.needs_attention(&name, &op.id) {
                    Ok(_) => {
                        tracing::warn!(target: "audit", who = "talos-opsd", cluster = %name, op = %op.id, "needs attention: {} interrupted with {at}: {why}", op.kind)
                    }
                    Err(e) => tracing::warn!(cluster = %name, op = %op.id, "{e}"),
                }
                continue;
            }
            match manager.resume(&name, &op.id).await {
                Ok(id) => {
                    tracing::info!(target: "audit", who = "talos-opsd", cluster = %name, op = %id, "resuming an interrupted {} ({at}); each destructive step is sent only once its check holds", op.kind)
                }
                Err(e) => {
                    tracing::warn!(cluster = %name, op = %op.id, "not resumed ({at}): {e}")
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
    // What can be put right in place first (the history kept); a journal
    // that cannot even be read for that is for the check below.
    if let Ok(Some(done)) = Journal::repair(state_dir) {
        tracing::warn!(target: "audit", who = "talos-opsd", state_dir = %state_dir.display(), "--recover-journal: the journal was repaired in place: {done}");
    }
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

    /// An operation of `kind` interrupted with step `step` (typed as
    /// journaled, e.g. `{"retire": "leave"}`) in flight since `started`.
    fn in_flight(kind: &str, name: &str, step: serde_json::Value, started: &str) -> OpRecord {
        serde_json::from_value(serde_json::json!({
            "id": "op", "kind": kind, "context": "c", "ca_fingerprint": "f",
            "params": {}, "facts": {}, "format": 2, "state": "running",
            "created": started, "updated": started,
            "steps": [
                {"index": 0, "name": "snapshot", "description": "", "destructive": false,
                 "state": "done", "started": started, "finished": started,
                 "duration_ms": 1, "detail": null},
                {"index": 1, "name": name, "description": "", "destructive": true,
                 "state": "running", "started": started, "finished": null,
                 "duration_ms": null, "detail": null, "step": step}
            ]
        }))
        .unwrap()
    }

    fn retire_in_leave(started: &str) -> OpRecord {
        in_flight(
            "retire",
            "leave",
            serde_json::json!({"retire": "leave"}),
            started,
        )
    }

    #[test]
    fn an_irreversible_step_in_flight_is_resumed_only_while_fresh() {
        let now = OffsetDateTime::parse("2026-12-05T12:00:00Z", &Rfc3339).unwrap();
        let within = Duration::from_secs(600);
        assert_eq!(
            left_for_a_person(&retire_in_leave("2026-12-05T11:55:00Z"), within, now),
            None
        );
        let stale = left_for_a_person(&retire_in_leave("2026-12-05T11:00:00Z"), within, now);
        assert!(
            stale.as_deref().is_some_and(|s| s.contains("\"leave\"")),
            "{stale:?}"
        );
        // An unreadable start time is no proof of freshness.
        assert!(left_for_a_person(&retire_in_leave("yesterday"), within, now).is_some());
        assert_eq!(
            left_for_a_person(
                &retire_in_leave("2026-12-05T11:00:00Z"),
                Duration::from_secs(7200),
                now
            ),
            None
        );
    }

    /// Which steps count is the library's answer, not a list of names: a
    /// defragmentation or a forfeit in flight for an hour is resumed (its
    /// check decides), an installed release is not.
    #[test]
    fn the_library_says_which_steps_cannot_be_undone() {
        let now = OffsetDateTime::parse("2026-12-05T12:00:00Z", &Rfc3339).unwrap();
        let hour_ago = "2026-12-05T11:00:00Z";
        let within = Duration::from_secs(600);
        let defrag = in_flight(
            "defrag",
            "defrag",
            serde_json::json!({"defrag": {"phase": "defrag", "node": "10.5.0.2"}}),
            hour_ago,
        );
        assert_eq!(left_for_a_person(&defrag, within, now), None);
        let forfeit = in_flight(
            "retire",
            "forfeit",
            serde_json::json!({"retire": "forfeit"}),
            hour_ago,
        );
        assert_eq!(left_for_a_person(&forfeit, within, now), None);
        let upgrade = in_flight(
            "upgrade",
            "upgrade",
            serde_json::json!({"upgrade": {"phase": "upgrade", "node": "10.5.0.2"}}),
            hour_ago,
        );
        assert!(left_for_a_person(&upgrade, within, now).is_some());
    }
}
