//! Scheduled snapshots: per cluster with a `[cluster.snapshots]` table, a
//! verified snapshot every interval, through the same operation as the API
//! (so it is journaled, catalogued, and refused while another operation
//! holds the cluster). A failed or refused tick is logged, counted and
//! retried at the next one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::manager::Manager;
use talos_client::ops::{OpSpec, SnapshotOptions};

/// Starts one schedule task per cluster with snapshots configured; they end
/// when `generation` moves past `mine` (a reload) or the daemon stops.
pub fn start(manager: &Arc<Manager>, generation: &Arc<AtomicU64>) {
    let mine = generation.load(Ordering::SeqCst);
    for cluster in manager.clusters() {
        let Some(schedule) = cluster.config.snapshots.clone() else {
            continue;
        };
        let manager = Arc::clone(manager);
        let generation = Arc::clone(generation);
        let name = cluster.config.name.clone();
        tokio::spawn(async move {
            let mut next = later(tokio::time::Instant::now(), schedule.until_next());
            loop {
                tokio::time::sleep_until(next).await;
                let now = tokio::time::Instant::now();
                next = match schedule.interval {
                    // A steady cadence; a tick that overran is not repeated.
                    Some(interval) => later(next, interval.0).max(now),
                    None => later(now, schedule.until_next()),
                };
                if manager.is_stopping() || generation.load(Ordering::SeqCst) != mine {
                    return;
                }
                tick(&manager, &name).await;
            }
        });
    }
}

/// `from + by`, or a year from `from` should the clock not reach that far
/// (durations are bounded by the configuration, so this is a safety net, not
/// a schedule).
fn later(from: tokio::time::Instant, by: std::time::Duration) -> tokio::time::Instant {
    from.checked_add(by)
        .or_else(|| from.checked_add(std::time::Duration::from_secs(365 * 86400)))
        .unwrap_or(from)
}

async fn tick(manager: &Arc<Manager>, cluster: &str) {
    match manager
        .start(cluster, OpSpec::Snapshot(SnapshotOptions::default()), None)
        .await
    {
        Ok((record, _)) => {
            tracing::info!(cluster, op = %record.id, "scheduled snapshot started");
            // Wait for it, so ticks never pile up on one cluster.
            let rx = manager.running(&record.id).map(|r| r.events.subscribe());
            if let Some(mut rx) = rx {
                let _ = rx
                    .wait_for(|events| {
                        events.last().is_some_and(|e| {
                            matches!(
                                e.event,
                                Some(crate::proto::operation_event::Event::Finished(_))
                            )
                        })
                    })
                    .await;
            }
        }
        Err(e) => {
            manager.metrics.snapshot_failed(cluster);
            tracing::warn!(
                cluster,
                "scheduled snapshot not taken, retried next tick: {e}"
            );
        }
    }
}
