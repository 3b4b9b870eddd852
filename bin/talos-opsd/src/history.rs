//! What the journal says about an ended operation, for the metrics: the
//! same numbers whether they are recorded as the operation ends or restored
//! from the journal when the daemon starts (so a restart does not empty
//! `/metrics`), and the operation's own times, not those of the process
//! that happened to finish it (a resumed snapshot's last step may take
//! milliseconds; its snapshot did not).

use std::path::PathBuf;
use std::time::Duration;

use talos_client::ops::{OpRecord, OpState};
use talos_opsd_api::state_name;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::manager::{Manager, fingerprint_of};
use crate::metrics::{DefragMemberResult, Metrics};

/// How long its steps ran, each step's own duration added up: the time an
/// interrupted operation waited for its resume is not counted.
pub fn duration(record: &OpRecord) -> Duration {
    Duration::from_millis(record.steps.iter().filter_map(|s| s.duration_ms).sum())
}

/// A snapshot operation's `snapshot` step: when it ended (Unix seconds)
/// and how long it ran.
pub fn snapshot_step(record: &OpRecord) -> Option<(f64, Duration)> {
    step_end(record, "snapshot")
}

/// When step `name` of `record` ended (Unix seconds) and how long it ran.
fn step_end(record: &OpRecord, name: &str) -> Option<(f64, Duration)> {
    let step = record.steps.iter().find(|s| s.name == name)?;
    let at = OffsetDateTime::parse(step.finished.as_deref()?, &Rfc3339).ok()?;
    let took = Duration::from_millis(step.duration_ms?);
    Some((at.unix_timestamp_nanos() as f64 / 1e9, took))
}

/// The size of the verified snapshot `record` names, from its sidecar
/// (or, off-host, the stored object's size).
fn snapshot_size(record: &OpRecord) -> Option<u64> {
    if let Some(size) = record.facts["off_host"]["size"].as_u64() {
        return Some(size);
    }
    let path = PathBuf::from(format!("{}.json", record.facts["snapshot"].as_str()?));
    let meta: talos_client::snapshot::SnapshotMetadata =
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    Some(meta.report.size)
}

/// When the last step of `record` that ran ended (Unix seconds).
fn ended_at(record: &OpRecord) -> Option<f64> {
    let finished = record
        .steps
        .iter()
        .rev()
        .find_map(|s| s.finished.as_deref())?;
    let at = OffsetDateTime::parse(finished, &Rfc3339).ok()?;
    Some(at.unix_timestamp_nanos() as f64 / 1e9)
}

/// The members a defragmentation gave space back from, from its facts,
/// with the duration of each one's `defrag` step.
fn defragmented(record: &OpRecord) -> Vec<DefragMemberResult> {
    let Some(members) = record.facts["members"].as_array() else {
        return Vec::new();
    };
    members
        .iter()
        .filter_map(|m| {
            let after = m["db_size_after"].as_i64()?;
            let address = m["address"].as_str().unwrap_or_default();
            let took = record
                .steps
                .iter()
                .find(|s| s.name == "defrag" && s.node.as_deref() == Some(address))
                .and_then(|s| s.duration_ms)
                .map(Duration::from_millis);
            Some(DefragMemberResult {
                member: m["hostname"].as_str().unwrap_or(address).to_string(),
                // A database that grew while it ran gave nothing back.
                reclaimed: (m["db_size"].as_i64()? - after).max(0),
                took,
            })
        })
        .collect()
}

/// Each node an upgrade moved, by hostname, with the time from its
/// `upgrade` step's start to its `wait-back` step's end.
fn upgraded(record: &OpRecord) -> Vec<(String, Duration)> {
    let Some(nodes) = record.facts["nodes"].as_array() else {
        return Vec::new();
    };
    nodes
        .iter()
        .filter_map(|n| {
            let address = n["address"].as_str()?;
            let took: u64 = record
                .steps
                .iter()
                .filter(|s| {
                    s.node.as_deref() == Some(address)
                        && matches!(s.name.as_str(), "upgrade" | "wait-back")
                })
                .filter_map(|s| s.duration_ms)
                .sum();
            Some((
                n["hostname"].as_str().unwrap_or(address).to_string(),
                Duration::from_millis(took),
            ))
        })
        .collect()
}

/// Counts operation `record` of `cluster`, ended with `result` (its state,
/// or `parked`), into `metrics`.
pub fn record(metrics: &Metrics, cluster: &str, record: &OpRecord, result: &str) {
    metrics.operation(cluster, &record.kind, result, duration(record));
    if let Some(gap) = record.facts["leave_to_reset_gap_ms"].as_f64() {
        metrics.leave_to_reset_gap(cluster, gap / 1000.0);
    }
    if record.kind == talos_client::ops::OpKind::Drill.name() {
        match record.state {
            OpState::Succeeded => {
                if let Some((at, took)) = step_end(record, "drill") {
                    let revision = record.facts["report"]["revision"].as_i64();
                    metrics.drill_succeeded(cluster, at, took, revision);
                }
            }
            OpState::Running => {}
            _ => metrics.drill_failed(cluster),
        }
        return;
    }
    if record.kind == talos_client::ops::OpKind::Defrag.name() {
        match record.state {
            OpState::Succeeded => {
                if let Some(at) = ended_at(record) {
                    metrics.defrag_succeeded(cluster, at, &defragmented(record));
                }
            }
            OpState::Running => {}
            _ => metrics.defrag_failed(cluster),
        }
        return;
    }
    if record.kind == talos_client::ops::OpKind::Upgrade.name() {
        match record.state {
            OpState::Succeeded => {
                if let Some(at) = ended_at(record) {
                    metrics.upgrade_succeeded(cluster, at, &upgraded(record));
                }
            }
            OpState::Running => {}
            _ => metrics.upgrade_failed(cluster),
        }
        return;
    }
    if record.kind != talos_client::ops::OpKind::Snapshot.name() {
        return;
    }
    match record.state {
        OpState::Succeeded => {
            if let Some((at, took)) = snapshot_step(record) {
                metrics.snapshot_succeeded(cluster, snapshot_size(record), took, at);
            }
        }
        // Parked: not ended; it is counted when its resume ends it.
        OpState::Running => {}
        _ => metrics.snapshot_failed(cluster),
    }
}

/// Every ended operation of the configured clusters, oldest first, as if
/// each had just ended: the counters and histograms count them all, the
/// gauges keep the newest. Operations still running are counted when they
/// end.
pub fn restore(manager: &Manager) {
    let journal = match manager.journal() {
        Ok(journal) => journal,
        Err(e) => {
            tracing::error!("metrics not restored: {e}");
            return;
        }
    };
    for cluster in manager.clusters() {
        let name = &cluster.config.name;
        let ops = match journal.list(Some(&fingerprint_of(&cluster))) {
            Ok(ops) => ops,
            Err(e) => {
                tracing::error!(cluster = %name, "metrics not restored: {e}");
                continue;
            }
        };
        let mut restored = 0;
        for op in ops.iter().rev().filter(|op| op.state != OpState::Running) {
            record(&manager.metrics, name, op, &state_name(op.state));
            restored += 1;
        }
        tracing::debug!(cluster = %name, operations = restored, "metrics restored from the journal");
    }
}
