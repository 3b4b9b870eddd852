//! The daemon's operations: the configured clusters, the operations running
//! in this process (each with its step events and a stop handle), starting
//! and resuming them through `talos_client::ops` (each one a tokio task),
//! and parking them all at shutdown. One operation per cluster is the
//! operations layer's own lock, shared with `talosctl-rs ops --local` on the
//! same state directory.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use talos_client::Client;
use talos_client::config::ResolvedContext;
use talos_client::ops::{
    ClusterLockPolicy, ClusterLockRecord, OpKind, OpRecord, OpSpec, Ops, OpsError, Plan, StopHandle,
};
use tokio::sync::watch;

use crate::catalogue::Catalogue;
use crate::config::ResolvedCluster;
use crate::metrics::Metrics;
use crate::proto;
use crate::work::Job;

/// An operation running in this process.
pub struct Running {
    /// The configured cluster.
    pub cluster: String,
    /// Park or cancel it.
    pub stop: StopHandle,
    /// Every event so far, in order; the last is `Finished` once it ends.
    pub events: watch::Sender<Vec<proto::OperationEvent>>,
}

/// The daemon's state shared by the API, the scheduler and shutdown.
pub struct Manager {
    /// Where the journal, locks and snapshots live.
    pub state_dir: PathBuf,
    clusters: Mutex<HashMap<String, ResolvedCluster>>,
    pub(crate) running: Mutex<HashMap<String, Arc<Running>>>,
    /// Whether new work is refused, and the work being set up (planned,
    /// not yet journaled) that shutdown must park or wait for.
    pub(crate) work: Mutex<crate::work::Work>,
    /// Becomes `true` when shutdown begins: a plan in progress for a start
    /// is dropped at once.
    pub(crate) stop_signal: watch::Sender<bool>,
    pub(crate) idle: tokio::sync::Notify,
    /// The metrics.
    pub metrics: Metrics,
    catalogue: Mutex<Catalogue>,
    /// Operations whose run ended with a journal write failing and whose
    /// end could not be recorded yet, by id: recorded before the next
    /// plan or start on their cluster.
    pub(crate) unsettled: Mutex<HashMap<String, crate::settle::Unsettled>>,
}

/// Why a plan or a start was refused (mapped to gRPC codes by the
/// service).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The operations layer refused or failed.
    #[error(transparent)]
    Ops(#[from] OpsError),
    /// No such cluster in the configuration.
    #[error("no cluster {} is configured", talos_client::text::quoted(.0))]
    UnknownCluster(String),
    /// The daemon is shutting down.
    #[error("the daemon is shutting down: it takes no new work")]
    ShuttingDown,
    /// The operation's record changed since the resume plan the caller
    /// confirmed.
    #[error(
        "operation {id} changed since its resume was planned (fingerprint {confirmed}, now {now}): plan the resume again"
    )]
    RecordChanged {
        /// The operation.
        id: String,
        /// The fingerprint confirmed.
        confirmed: String,
        /// The fingerprint of the record now.
        now: String,
    },
    /// The operation ran against a cluster no configured cluster is.
    #[error(
        "operation {id} ran against talosconfig context {context:?}, which is no configured cluster's: configure it, or use talosctl-rs ops --local"
    )]
    NotConfigured {
        /// The operation.
        id: String,
        /// Its context.
        context: String,
    },
    /// An earlier operation's end could not be journaled, and the journal
    /// still refuses writes.
    #[error(
        "operation {id} ended when the journal could not be written, and its end cannot be recorded yet ({error}): free space on the state directory's file system or end what holds the journal locked, then try again"
    )]
    JournalUnwritable {
        /// The operation.
        id: String,
        /// The journal's error now.
        error: String,
    },
}

impl Manager {
    /// A manager over `clusters`, journaled in `state_dir`.
    pub fn new(
        state_dir: PathBuf,
        clusters: Vec<ResolvedCluster>,
        metrics: Metrics,
    ) -> anyhow::Result<Arc<Manager>> {
        // The whole journal is checked once, at start: a damaged one is
        // refused here with what to do, not met by every later call.
        talos_client::ops::Journal::open(&state_dir)?.check()?;
        let catalogue = Catalogue::open(&state_dir)?;
        let manager = Manager {
            state_dir,
            clusters: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            work: Mutex::new(crate::work::Work::default()),
            stop_signal: watch::channel(false).0,
            idle: tokio::sync::Notify::new(),
            metrics,
            catalogue: Mutex::new(catalogue),
            unsettled: Mutex::new(HashMap::new()),
        };
        manager.set_clusters(clusters);
        Ok(Arc::new(manager))
    }

    /// Replaces the configured clusters (SIGHUP); running operations go on.
    pub fn set_clusters(&self, clusters: Vec<ResolvedCluster>) {
        let map = clusters
            .into_iter()
            .map(|c| (c.config.name.clone(), c))
            .collect();
        *self.clusters.lock().unwrap_or_else(PoisonError::into_inner) = map;
    }

    /// One configured cluster, by its name or else by its talosconfig
    /// context's name when exactly one cluster uses that context.
    pub fn cluster(&self, name: &str) -> Option<ResolvedCluster> {
        let clusters = self.clusters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cluster) = clusters.get(name) {
            return Some(cluster.clone());
        }
        let mut by_context = clusters.values().filter(|c| c.context.name == name);
        match (by_context.next(), by_context.next()) {
            (Some(one), None) => Some(one.clone()),
            _ => None,
        }
    }

    /// Every configured cluster.
    pub fn clusters(&self) -> Vec<ResolvedCluster> {
        let mut all: Vec<_> = self
            .clusters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| a.config.name.cmp(&b.config.name));
        all
    }

    /// The configured name of the cluster with CA fingerprint `fp`.
    pub fn cluster_of(&self, fingerprint: &str) -> Option<String> {
        self.clusters()
            .into_iter()
            .find(|c| fingerprint_of(c) == fingerprint)
            .map(|c| c.config.name)
    }

    pub(crate) fn work(&self) -> std::sync::MutexGuard<'_, crate::work::Work> {
        self.work.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The catalogue.
    pub fn catalogue(&self) -> std::sync::MutexGuard<'_, Catalogue> {
        self.catalogue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// An operation running in this process.
    pub fn running(&self, id: &str) -> Option<Arc<Running>> {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    /// Whether shutdown has begun.
    pub fn is_stopping(&self) -> bool {
        self.work().stopping
    }

    /// The journal (a fresh connection: cheap, and safe across threads).
    pub fn journal(&self) -> Result<talos_client::ops::Journal, OpsError> {
        talos_client::ops::Journal::open(&self.state_dir)
    }

    pub(crate) fn open(&self, cluster: &ResolvedCluster) -> Result<Ops, OpsError> {
        self.open_with(cluster, &cluster.context)
    }

    /// As [`Manager::open`], for an operation of `kind`: a snapshot or a
    /// drill presents the cluster's backup credential where one is
    /// configured, never the admin one.
    pub(crate) fn open_for(
        &self,
        cluster: &ResolvedCluster,
        kind: OpKind,
    ) -> Result<Ops, OpsError> {
        self.open_with(cluster, cluster.context_for(kind))
    }

    fn open_with(
        &self,
        cluster: &ResolvedCluster,
        context: &ResolvedContext,
    ) -> Result<Ops, OpsError> {
        let client = Client::from_context(context)?;
        let mut ops = Ops::open(context, client, &self.state_dir)?;
        let keep = cluster.config.snapshots.as_ref().map_or(0, |s| s.keep);
        ops.set_snapshot_defaults(self.snapshot_dir(cluster), keep);
        Ok(ops)
    }

    /// The cluster to plan, start or resume on, once every earlier
    /// operation on it is recorded as ended.
    pub(crate) fn resolve(&self, cluster: &str) -> Result<ResolvedCluster, StartError> {
        if self.is_stopping() {
            return Err(StartError::ShuttingDown);
        }
        let resolved = self
            .cluster(cluster)
            .ok_or_else(|| StartError::UnknownCluster(cluster.to_string()))?;
        self.settle_unsettled(&resolved)?;
        Ok(resolved)
    }

    /// Plans `spec` on `cluster` and changes nothing: refused as a start
    /// would be (another operation holding the cluster included), without
    /// taking the cluster's lock: plans are read-only, any number run at
    /// once, and one against a cluster that does not answer holds nothing
    /// while it waits. The lock belongs to a start, which plans again under
    /// it and compares fingerprints.
    pub async fn plan(&self, cluster: &str, spec: &OpSpec) -> Result<Plan, StartError> {
        let resolved = self.resolve(cluster)?;
        let spec = configured(&resolved, spec.clone());
        Ok(self
            .open_for(&resolved, spec.kind())?
            .preview(&spec)
            .await?)
    }

    /// The risk report of `cluster` (`talosctl-rs ops report`), from the
    /// daemon's journal and the cluster, read with the cluster's reader
    /// credential where one is configured; each configured credential's
    /// certificate is reported. Sets the report's metrics. Changes nothing
    /// on the cluster and takes no lock.
    pub async fn report(&self, cluster: &str) -> Result<talos_client::ops::RiskReport, StartError> {
        let resolved = self
            .cluster(cluster)
            .ok_or_else(|| StartError::UnknownCluster(cluster.to_string()))?;
        let ops = self.open_with(&resolved, resolved.report_context())?;
        let mut options = talos_client::ops::ReportOptions::default();
        options.credentials = [
            ("admin", Some(&resolved.context)),
            ("backup", resolved.backup.as_ref()),
            ("reader", resolved.reader.as_ref()),
        ]
        .into_iter()
        .filter_map(|(purpose, context)| Some((purpose.to_string(), context?.credentials.clone())))
        .collect();
        let report = ops.report(&options).await?;
        self.metrics.report(cluster, &report);
        Ok(report)
    }

    /// The snapshot directory of `cluster`.
    pub fn snapshot_dir(&self, cluster: &ResolvedCluster) -> PathBuf {
        cluster
            .config
            .snapshots
            .as_ref()
            .and_then(|s| s.dir.clone())
            .unwrap_or_else(|| self.state_dir.join("snapshots").join(&cluster.config.name))
    }

    /// Plans and starts `spec` on `cluster`; returns once it is journaled,
    /// with the preflight's notes. With `confirmed`, the plan made now must
    /// have that fingerprint (the one the caller showed and confirmed).
    /// With `without_cluster_lock`, an operation goes on where Kubernetes
    /// cannot hold the cluster lock (journaled, and audited here).
    pub async fn start(
        self: &Arc<Self>,
        cluster: &str,
        spec: OpSpec,
        confirmed: Option<String>,
        without_cluster_lock: bool,
    ) -> Result<(OpRecord, Vec<String>), StartError> {
        let resolved = self.resolve(cluster)?;
        let spec = configured(&resolved, spec);
        let policy = if without_cluster_lock {
            ClusterLockPolicy::AllowWithout
        } else {
            ClusterLockPolicy::Required
        };
        let (id, notes) = self
            .spawn(resolved, Job::Run(Box::new(spec), confirmed, policy))
            .await?;
        let record = self.journal()?.get(&id)?;
        if let Some(lock @ ClusterLockRecord::Without { .. }) = &record.cluster_lock {
            tracing::warn!(target: "audit", op = %id, cluster = %cluster, "started without the cluster lock: {lock}");
        }
        Ok((record, notes))
    }

    /// Resumes interrupted operation `id` of `cluster` in the background.
    pub async fn resume(self: &Arc<Self>, cluster: &str, id: &str) -> Result<String, StartError> {
        let resolved = self.resolve(cluster)?;
        let (id, _) = self.spawn(resolved, Job::Resume(id.to_string())).await?;
        Ok(id)
    }

    /// Marks operation `id` as needing a person.
    pub fn needs_attention(&self, cluster: &str, id: &str) -> Result<OpRecord, StartError> {
        let resolved = self.resolve(cluster)?;
        Ok(self.open(&resolved)?.mark_needs_attention(id)?)
    }
}

/// A snapshot that names no place (and no encryption or tiers) goes where
/// the cluster's snapshots are configured to go, as configured: its store
/// or directory, with encryption, kit and tiers. The caller's `keep`
/// stands.
fn configured(cluster: &ResolvedCluster, spec: OpSpec) -> OpSpec {
    match (spec, cluster.config.snapshots.as_ref()) {
        (OpSpec::Snapshot(asked), Some(schedule))
            if asked.dir.is_none()
                && asked.store.is_none()
                && asked.encrypt.is_empty()
                && asked.tiers.is_empty() =>
        {
            let mut options = schedule.snapshot_options();
            options.keep = asked.keep;
            OpSpec::Snapshot(options)
        }
        (spec, _) => spec,
    }
}

/// The RFC 3339 time before which snapshots are older than `max_age`, or
/// `None` when that reaches before any representable date (nothing
/// expires); never panics, whatever the duration.
pub fn retention_cutoff(now: time::OffsetDateTime, max_age: std::time::Duration) -> Option<String> {
    now.checked_sub(time::Duration::try_from(max_age).ok()?)?
        .format(&time::format_description::well_known::Rfc3339)
        .ok()
}

/// sha256 of a cluster's CA (hex), as the journal names clusters.
pub fn fingerprint_of(cluster: &ResolvedCluster) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(cluster.context.credentials.ca_pem())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest durations give no cutoff rather than a panic; an
    /// ordinary one gives the expected date.
    #[test]
    fn retention_cutoff_never_panics() {
        let now = time::OffsetDateTime::now_utc();
        for huge in [
            std::time::Duration::MAX,
            std::time::Duration::from_secs(5_000_000 * 86400),
        ] {
            assert_eq!(retention_cutoff(now, huge), None, "{huge:?}");
        }
        let at = time::OffsetDateTime::from_unix_timestamp(1_767_312_000).unwrap();
        let cutoff = retention_cutoff(at, std::time::Duration::from_secs(86400));
        assert_eq!(cutoff.as_deref(), Some("2026-01-01T00:00:00Z"));
    }

    /// A thread that panicked while holding a lock does not take the
    /// catalogue, the clusters or the running table down with it.
    #[test]
    fn a_poisoned_lock_is_recovered() {
        let dir = tempfile::tempdir().unwrap();
        let manager = Manager::new(dir.path().join("state"), Vec::new(), Metrics::new()).unwrap();
        let m = Arc::clone(&manager);
        let poisoned = std::thread::spawn(move || {
            let _catalogue = m.catalogue();
            let _clusters = m.clusters.lock().unwrap();
            let _running = m.running.lock().unwrap();
            let _work = m.work.lock().unwrap();
            panic!("poison the locks");
        })
        .join();
        assert!(poisoned.is_err());
        assert!(manager.catalogue.is_poisoned());
        assert!(manager.clusters().is_empty());
        assert!(manager.running("x").is_none());
        assert!(!manager.is_stopping());
        assert!(manager.catalogue().list(None).is_ok());
    }
}
