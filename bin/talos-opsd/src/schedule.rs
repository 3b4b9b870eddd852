//! Scheduled work, per cluster: a verified snapshot (`[cluster.snapshots]`),
//! a restore drill of the newest off-host backup (`[cluster.drills]`) and a
//! defragmentation of the members that need one (`[cluster.defrag]`),
//! each every interval or at each cron time, through the same operations
//! as the API (so they are journaled, counted in the metrics, and refused
//! while another operation holds the cluster). A tick that finds the
//! cluster held by another operation waits for it, up to a minute; a failed
//! or refused tick is logged, counted and retried at the next one.

use std::future::Future;
use std::hash::{BuildHasher as _, Hasher as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::Cadence;
use crate::manager::{Manager, StartError};
use talos_client::ops::{DrillOptions, OpKind, OpSpec, OpsError};

/// How long a tick waits for a cluster that another operation holds.
const BUSY_PATIENCE: Duration = Duration::from_secs(60);
/// How often it looks again meanwhile.
const BUSY_RETRY: Duration = Duration::from_millis(250);

/// Starts the schedule tasks of every cluster; they end when `generation`
/// moves past the current one (a reload) or the daemon stops.
pub fn start(manager: &Arc<Manager>, generation: &Arc<AtomicU64>) {
    for cluster in manager.clusters() {
        let name = cluster.config.name.clone();
        if let Some(schedule) = cluster.config.snapshots.clone() {
            let jitter = schedule.jitter.map(|j| j.0);
            let spec = OpSpec::Snapshot(schedule.snapshot_options());
            every(manager, generation, schedule, jitter, {
                let name = name.clone();
                move |manager| tick(manager, name.clone(), spec.clone())
            });
        }
        if let Some(drills) = cluster.config.drills.clone() {
            let snapshots = cluster.config.snapshots.as_ref();
            let from = drills
                .from
                .clone()
                .or_else(|| snapshots.and_then(|s| s.store.clone()))
                .unwrap_or_default();
            let mut options = DrillOptions::new(from);
            options.identity_files = drills.identity.clone();
            options.s3 = drills.access(snapshots);
            let spec = OpSpec::Drill(options);
            let name = name.clone();
            every(manager, generation, drills, None, move |manager| {
                tick(manager, name.clone(), spec.clone())
            });
        }
        if let Some(defrag) = cluster.config.defrag.clone() {
            let jitter = defrag.jitter.map(|j| j.0);
            let spec = OpSpec::Defrag(defrag.defrag_options());
            let name = name.clone();
            every(manager, generation, defrag, jitter, move |manager| {
                tick(manager, name.clone(), spec.clone())
            });
        }
    }
}

/// Runs `task` on `cadence` (each run up to `jitter` late, at random)
/// until a reload or shutdown.
fn every<C, F, Fut>(
    manager: &Arc<Manager>,
    generation: &Arc<AtomicU64>,
    cadence: C,
    jitter: Option<Duration>,
    task: F,
) where
    C: Cadence + Send + 'static,
    F: Fn(Arc<Manager>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let mine = generation.load(Ordering::SeqCst);
    let manager = Arc::clone(manager);
    let generation = Arc::clone(generation);
    tokio::spawn(async move {
        let Some(first) = cadence.until_next() else {
            return no_next_firing(&cadence);
        };
        let mut next = later(tokio::time::Instant::now(), first);
        loop {
            let delay = jitter.map_or(Duration::ZERO, random_below);
            tokio::time::sleep_until(later(next, delay)).await;
            let now = tokio::time::Instant::now();
            next = match (cadence.interval(), cadence.until_next()) {
                // A steady cadence; a tick that overran is not repeated.
                (Some(interval), _) => later(next, interval.0).max(now),
                (None, Some(until)) => later(now, until),
                (None, None) => return no_next_firing(&cadence),
            };
            if manager.is_stopping() || generation.load(Ordering::SeqCst) != mine {
                return;
            }
            task(Arc::clone(&manager)).await;
        }
    });
}

/// A schedule with no next time ends, saying so: it never runs at some
/// pace of its own.
fn no_next_firing(cadence: &impl Cadence) {
    let cron = cadence.cron().map(|c| c.text.as_str()).unwrap_or_default();
    tracing::error!(
        "schedule {cron:?} has no next time to run: it stops until the configuration is reloaded"
    );
}

/// A random duration in `[0, bound)`.
fn random_below(bound: Duration) -> Duration {
    let millis = bound.as_millis().min(u128::from(u64::MAX)) as u64;
    if millis == 0 {
        return Duration::ZERO;
    }
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(millis);
    Duration::from_millis(hasher.finish() % millis)
}

/// `from + by`, or a year from `from` should the clock not reach that far
/// (durations are bounded by the configuration, so this is a safety net, not
/// a schedule).
fn later(from: tokio::time::Instant, by: Duration) -> tokio::time::Instant {
    from.checked_add(by)
        .or_else(|| from.checked_add(Duration::from_secs(365 * 86400)))
        .unwrap_or(from)
}

async fn tick(manager: Arc<Manager>, cluster: String, spec: OpSpec) {
    let kind = spec.kind().name();
    let without_lock = manager
        .cluster(&cluster)
        .is_some_and(|c| c.config.without_cluster_lock);
    // A cluster busy with another operation (a snapshot's tick beside a
    // drill's) is waited for, a while: else two schedules whose operations
    // take about their interval could keep each other off for good.
    let patient = tokio::time::Instant::now() + BUSY_PATIENCE;
    let started = loop {
        match manager
            .start(&cluster, spec.clone(), None, without_lock)
            .await
        {
            Err(StartError::Ops(OpsError::Busy { .. }))
                if tokio::time::Instant::now() < patient && !manager.is_stopping() =>
            {
                tokio::time::sleep(BUSY_RETRY).await;
            }
            other => break other,
        }
    };
    match started {
        Ok((record, _)) => {
            tracing::info!(cluster, op = %record.id, kind, "scheduled operation started");
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
            if kind == OpKind::Snapshot.name() {
                manager.metrics.snapshot_failed(&cluster);
            } else if kind == OpKind::Drill.name() {
                manager.metrics.drill_failed(&cluster);
            } else if kind == OpKind::Defrag.name() {
                manager.metrics.defrag_failed(&cluster);
            }
            tracing::warn!(
                cluster,
                kind,
                "scheduled operation not started, retried next tick: {e}"
            );
        }
    }
}
