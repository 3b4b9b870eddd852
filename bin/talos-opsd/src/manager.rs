//! The daemon's operations: the configured clusters, the operations running
//! in this process (each with its step events and a stop handle), starting
//! and resuming them through `talos_client::ops` (each one a tokio task),
//! and parking them all at shutdown. One operation per cluster is the
//! operations layer's own lock, shared with `talosctl-rs ops --local` on the
//! same state directory.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use talos_client::Client;
use talos_client::ops::{
    ClusterLockPolicy, ClusterLockRecord, Event, OpRecord, OpSpec, OpState, Ops, OpsError, Plan,
    Refusal, StopHandle, Unsaved,
};
use talos_opsd_api::{event_to_proto, state_name};
use tokio::sync::{oneshot, watch};

use crate::catalogue::Catalogue;
use crate::config::ResolvedCluster;
use crate::metrics::Metrics;
use crate::proto;
use crate::proto::operation_event::Event as Ev;

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
    running: Mutex<HashMap<String, Arc<Running>>>,
    idle: tokio::sync::Notify,
    stopping: AtomicBool,
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
    #[error("no cluster {0:?} is configured")]
    UnknownCluster(String),
    /// The daemon is shutting down.
    #[error("the daemon is shutting down")]
    ShuttingDown,
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
            idle: tokio::sync::Notify::new(),
            stopping: AtomicBool::new(false),
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
        self.stopping.load(Ordering::SeqCst)
    }

    /// The journal (a fresh connection: cheap, and safe across threads).
    pub fn journal(&self) -> Result<talos_client::ops::Journal, OpsError> {
        talos_client::ops::Journal::open(&self.state_dir)
    }

    fn open(&self, cluster: &ResolvedCluster) -> Result<Ops, OpsError> {
        let client = Client::from_context(&cluster.context)?;
        let mut ops = Ops::open(&cluster.context, client, &self.state_dir)?;
        let keep = cluster.config.snapshots.as_ref().map_or(0, |s| s.keep);
        ops.set_snapshot_defaults(self.snapshot_dir(cluster), keep);
        Ok(ops)
    }

    /// The cluster to plan, start or resume on, once every earlier
    /// operation on it is recorded as ended.
    fn resolve(&self, cluster: &str) -> Result<ResolvedCluster, StartError> {
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
    /// would be (another operation holding the cluster included). The lock
    /// is let go at once; a start plans again and compares fingerprints.
    pub async fn plan(&self, cluster: &str, spec: &OpSpec) -> Result<Plan, StartError> {
        let resolved = self.resolve(cluster)?;
        let spec = configured(&resolved, spec.clone());
        // A plan only shown takes no cluster lock: a start takes it.
        let mut ops = self.open(&resolved)?;
        ops.set_cluster_lock_policy(ClusterLockPolicy::PlanOnly);
        let mut plan = ops.plan(&spec).await?;
        plan.release();
        Ok(plan)
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

    /// Where `cluster`'s backups are stored as object sets, and how it is
    /// reached: its `store`, or its snapshot directory when snapshots are
    /// encrypted there; `None` for plain snapshot files (catalogued in the
    /// journal instead).
    pub fn backup_store(
        &self,
        cluster: &ResolvedCluster,
    ) -> Option<(String, talos_client::ops::S3Access)> {
        let snapshots = cluster.config.snapshots.as_ref()?;
        match &snapshots.store {
            Some(store) => Some((store.clone(), snapshots.access())),
            None if !snapshots.encrypt.is_empty() => Some((
                self.snapshot_dir(cluster).display().to_string(),
                talos_client::ops::S3Access::default(),
            )),
            None => None,
        }
    }

    /// The backups in the stores of the configured clusters (or of
    /// `only`), listed live from each store, that cluster's only; and the
    /// stores that could not be listed, each within a bound so one
    /// unreachable store does not hold up the answer.
    pub async fn stored_backups(
        &self,
        only: Option<&str>,
    ) -> (Vec<proto::Snapshot>, Vec<proto::StoreListError>) {
        const LIST_BOUND: std::time::Duration = std::time::Duration::from_secs(20);
        let mut snapshots = Vec::new();
        let mut errors = Vec::new();
        let clusters = match only.and_then(|name| self.cluster(name)) {
            Some(one) => vec![one],
            None if only.is_some() => Vec::new(),
            None => self.clusters(),
        };
        for cluster in clusters {
            let Some((name, access)) = self.backup_store(&cluster) else {
                continue;
            };
            let error = |message: String| proto::StoreListError {
                cluster: cluster.config.name.clone(),
                store: name.clone(),
                message,
            };
            let listed = async {
                let addressing = access
                    .addressing()
                    .parse::<talos_client::backup::Addressing>()
                    .map_err(|e| e.to_string())?;
                let store = talos_client::backup::open_store_with(
                    &name,
                    addressing,
                    access.region.as_deref(),
                    access.endpoint.as_deref(),
                )
                .map_err(|e| e.to_string())?;
                talos_client::backup::catalogue(&[store.as_ref()])
                    .await
                    .map_err(|e| e.to_string())
            };
            let entries = match tokio::time::timeout(LIST_BOUND, listed).await {
                Ok(Ok(entries)) => entries,
                Ok(Err(e)) => {
                    errors.push(error(e));
                    continue;
                }
                Err(_) => {
                    errors.push(error(format!(
                        "not listed within {} s",
                        LIST_BOUND.as_secs()
                    )));
                    continue;
                }
            };
            for entry in entries {
                let meta = &entry.metadata;
                if meta.cluster != cluster.context.name {
                    continue;
                }
                let recipients = match &meta.object.encryption {
                    talos_client::backup::Encryption::Age { recipients } => recipients.len(),
                    _ => 0,
                };
                snapshots.push(proto::Snapshot {
                    cluster: cluster.config.name.clone(),
                    operation_id: String::new(),
                    node: meta.node.clone(),
                    taken: meta
                        .time
                        .format(&time::format_description::well_known::Rfc3339)
                        .unwrap_or_default(),
                    revision: meta.snapshot.status.revision,
                    sha256: meta.snapshot.sha256.clone(),
                    size: meta.snapshot.size,
                    path: String::new(),
                    store: name.clone(),
                    key: meta.object.key.clone(),
                    recipients: u32::try_from(recipients).unwrap_or(u32::MAX),
                    kit: meta.kit.is_some(),
                    complete: entry.complete,
                });
            }
        }
        (snapshots, errors)
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

    /// Runs the job as a task; answers with the operation id and the
    /// plan's notes once it is journaled, or with the refusal (preflight,
    /// busy, interrupted, a changed plan) that came first.
    async fn spawn(
        self: &Arc<Self>,
        cluster: ResolvedCluster,
        job: Job,
    ) -> Result<(String, Vec<String>), StartError> {
        let (started_tx, started_rx) =
            oneshot::channel::<Result<(String, Vec<String>), OpsError>>();
        let stop = StopHandle::new();
        let (events, _) = watch::channel(Vec::new());
        let running = Arc::new(Running {
            cluster: cluster.config.name.clone(),
            stop: stop.clone(),
            events,
        });
        let manager = Arc::clone(self);
        tokio::spawn(async move {
            let started_tx = Mutex::new(Some(started_tx));
            let refuse = |e: OpsError| {
                if let Some(tx) = started_tx
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take()
                {
                    let _ = tx.send(Err(e));
                }
            };
            let mut ops = match manager.open(&cluster) {
                Ok(ops) => ops,
                Err(e) => return refuse(e),
            };
            ops.set_stop(stop);
            let job = match job {
                Job::Run(spec, confirmed, policy) => {
                    ops.set_cluster_lock_policy(policy);
                    match plan_matching(&ops, &spec, confirmed).await {
                        Ok(plan) => Planned::Run(Box::new(plan)),
                        Err(e) => return refuse(e),
                    }
                }
                Job::Resume(id) => Planned::Resume(id),
            };
            let notes = match &job {
                Planned::Run(plan) => plan.notes.clone(),
                Planned::Resume(_) => Vec::new(),
            };
            let mut id = None::<String>;
            let mut observe = |event: Event<'_>| {
                #[cfg(feature = "test-hooks")]
                crate::test_hooks::observe(&event, &manager.state_dir);
                if let Event::Started { id: started } = event {
                    id = Some(started.to_string());
                    manager
                        .running
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(started.to_string(), Arc::clone(&running));
                    if let Some(tx) = started_tx
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .take()
                    {
                        let _ = tx.send(Ok((started.to_string(), notes.clone())));
                    }
                }
                if let Some(mut event) = event_to_proto(&event) {
                    event.operation_id = id.clone().unwrap_or_default();
                    running.events.send_modify(|all| all.push(event));
                }
            };
            let result = match job {
                Planned::Run(plan) => ops.run(*plan, &mut observe).await,
                Planned::Resume(ref op) => ops.resume(op, &mut observe).await,
            };
            let Some(id) = id else {
                if let Err(e) = result {
                    refuse(e);
                }
                return;
            };
            let unsaved = ops.journal().unsaved(&id);
            manager.finish(&cluster, &id, &running, result, unsaved);
        });
        match started_rx.await {
            Ok(result) => Ok(result?),
            Err(_) => Err(StartError::Ops(OpsError::StepFailed {
                step: "start".into(),
                reason: "the operation's task ended before it was journaled".into(),
            })),
        }
    }

    /// After a run: the final event, metrics, catalogue and retention.
    fn finish(
        &self,
        cluster: &ResolvedCluster,
        id: &str,
        running: &Running,
        result: Result<OpRecord, OpsError>,
        unsaved: Option<Unsaved>,
    ) {
        let name = &cluster.config.name;
        let mut record = self.journal().and_then(|j| j.get(id));
        if let (Err(error @ OpsError::Journal { .. }), Ok(durable)) = (&result, &record)
            && durable.state == OpState::Running
        {
            record = Ok(self.settle_failed(cluster, durable, &error.to_string(), unsaved));
        }
        let (state, error) = match (&result, &record) {
            (Ok(r), _) => (state_name(r.state), String::new()),
            (Err(e), Ok(r)) => (state_name(r.state), e.to_string()),
            (Err(e), Err(_)) => ("failed".to_string(), e.to_string()),
        };
        let parked = matches!(result, Err(OpsError::Parked { .. }));
        let result_label = if parked { "parked" } else { state.as_str() };
        if let Ok(record) = &record {
            crate::history::record(&self.metrics, name, record, result_label);
            if record.kind == talos_client::ops::OpKind::Snapshot.name() {
                self.after_snapshot(cluster, record, result.is_ok());
            }
        }
        tracing::info!(target: "audit", op = %id, cluster = %name, result = %result_label, error = %error, "operation ended");
        running.events.send_modify(|all| {
            all.push(proto::OperationEvent {
                operation_id: id.to_string(),
                event: Some(Ev::Finished(proto::Finished { state, error })),
            })
        });
        let mut map = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        map.remove(id);
        if map.is_empty() {
            self.idle.notify_waiters();
        }
    }

    /// A snapshot operation ended: its snapshot catalogued and, when it
    /// succeeded, retention by age.
    fn after_snapshot(&self, cluster: &ResolvedCluster, record: &OpRecord, ok: bool) {
        let name = &cluster.config.name;
        if !ok {
            // A verified snapshot the journal names (the operation failed
            // after it, at retention say) is catalogued all the same.
            self.catalogue_snapshot(name, record);
            return;
        }
        let Some((path, _)) = self.catalogue_snapshot(name, record) else {
            return;
        };
        let catalogue = self.catalogue();
        if let Err(e) = catalogue.prune_missing(name) {
            tracing::error!(cluster = %name, "{e}");
        }
        if let Some(max_age) = cluster.config.snapshots.as_ref().and_then(|s| s.max_age) {
            let Some(cutoff) = retention_cutoff(time::OffsetDateTime::now_utc(), max_age.0) else {
                tracing::warn!(cluster = %name, "max_age reaches before any date: nothing expires");
                return;
            };
            let held = self
                .journal()
                .and_then(|j| talos_client::ops::held_snapshots(&j, &fingerprint_of(cluster)));
            let held = match held {
                Ok(held) => held,
                Err(e) => {
                    tracing::error!(cluster = %name, "nothing expires: reading the journal: {e}");
                    return;
                }
            };
            match crate::catalogue::expire(&catalogue, name, &cutoff, &path, &held) {
                Ok(removed) if !removed.is_empty() => {
                    tracing::info!(cluster = %name, removed = removed.len(), "expired snapshots removed")
                }
                Ok(_) => {}
                Err(e) => tracing::error!(cluster = %name, "expiring snapshots: {e}"),
            }
        }
    }

    /// Catalogues the verified snapshot `record`'s facts name, if any;
    /// returns its path and metadata.
    pub(crate) fn catalogue_snapshot(
        &self,
        name: &str,
        record: &OpRecord,
    ) -> Option<(PathBuf, talos_client::snapshot::SnapshotMetadata)> {
        if record.kind != talos_client::ops::OpKind::Snapshot.name() {
            return None;
        }
        let path = record.facts["snapshot"].as_str().map(PathBuf::from)?;
        let sidecar = PathBuf::from(format!("{}.json", path.display()));
        let meta = std::fs::read(&sidecar).ok().and_then(|b| {
            serde_json::from_slice::<talos_client::snapshot::SnapshotMetadata>(&b).ok()
        });
        let Some(meta) = meta else {
            tracing::warn!(cluster = %name, path = %path.display(), "snapshot sidecar unreadable: not catalogued");
            return None;
        };
        if let Err(e) = self.catalogue().add(name, &record.id, &path, &meta) {
            tracing::error!(cluster = %name, "{e}");
        }
        Some((path, meta))
    }

    /// Stops taking work and parks every running operation at its next
    /// step boundary; returns once none runs.
    pub async fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        loop {
            let idle = self.idle.notified();
            let running: Vec<_> = self
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .cloned()
                .collect();
            if running.is_empty() {
                return;
            }
            for op in &running {
                op.stop.park();
            }
            idle.await;
        }
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

enum Job {
    Run(Box<OpSpec>, Option<String>, ClusterLockPolicy),
    Resume(String),
}

/// Plans `spec`; with `confirmed`, refuses a plan whose fingerprint differs
/// (the cluster changed since the caller's plan).
async fn plan_matching(
    ops: &Ops,
    spec: &OpSpec,
    confirmed: Option<String>,
) -> Result<Plan, OpsError> {
    let plan = ops.plan(spec).await?;
    match confirmed {
        Some(confirmed) if confirmed != plan.fingerprint => Err(Refusal::PlanChanged {
            confirmed,
            now: plan.fingerprint,
        }
        .into()),
        _ => Ok(plan),
    }
}

enum Planned {
    Run(Box<Plan>),
    Resume(String),
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
            panic!("poison the locks");
        })
        .join();
        assert!(poisoned.is_err());
        assert!(manager.catalogue.is_poisoned());
        assert!(manager.clusters().is_empty());
        assert!(manager.running("x").is_none());
        assert!(manager.catalogue().list(None).is_ok());
    }
}
