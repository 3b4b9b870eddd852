//! The daemon's operations: the configured clusters, the operations running
//! in this process (each with its step events and a stop handle), starting
//! and resuming them through `talos_client::ops`, and parking them all at
//! shutdown. One operation per cluster is the operations layer's own lock.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use talos_client::Client;
use talos_client::ops::{
    ApplyOptions, Event, JoinOptions, MigrateOptions, OpRecord, OpState, Ops, OpsError, Plan,
    RetireOptions, SnapshotOptions, StepState, StopHandle,
};
use tokio::sync::{oneshot, watch};

use crate::catalogue::Catalogue;
use crate::config::ResolvedCluster;
use crate::metrics::Metrics;
use crate::proto;
use crate::proto::operation_event::Event as Ev;

/// What to start.
#[derive(Debug, Clone)]
pub enum Request {
    /// A verified snapshot into the cluster's snapshot directory.
    Snapshot {
        /// Keep the newest N (0: the configured retention).
        keep: usize,
    },
    /// Retire a node.
    Retire(RetireOptions),
    /// Wait for a new member.
    Join(JoinOptions),
    /// Apply a configuration on trial, then confirm.
    Apply(ApplyOptions),
    /// Join a new node, then retire an old one.
    Migrate(MigrateOptions),
}

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
}

/// Why a start was refused (mapped to gRPC codes by the service).
pub type StartError = OpsError;

impl Manager {
    /// A manager over `clusters`, journaled in `state_dir`.
    pub fn new(
        state_dir: PathBuf,
        clusters: Vec<ResolvedCluster>,
        metrics: Metrics,
    ) -> anyhow::Result<Arc<Manager>> {
        talos_client::ops::Journal::open(&state_dir)?;
        let catalogue = Catalogue::open(&state_dir)?;
        let manager = Manager {
            state_dir,
            clusters: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            idle: tokio::sync::Notify::new(),
            stopping: AtomicBool::new(false),
            metrics,
            catalogue: Mutex::new(catalogue),
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
        *self.clusters.lock().unwrap() = map;
    }

    /// One configured cluster, by its name or else by its talosconfig
    /// context's name when exactly one cluster uses that context.
    pub fn cluster(&self, name: &str) -> Option<ResolvedCluster> {
        let clusters = self.clusters.lock().unwrap();
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
        let mut all: Vec<_> = self.clusters.lock().unwrap().values().cloned().collect();
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
        self.catalogue.lock().unwrap()
    }

    /// An operation running in this process.
    pub fn running(&self, id: &str) -> Option<Arc<Running>> {
        self.running.lock().unwrap().get(id).cloned()
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
        Ops::open(&cluster.context, client, &self.state_dir)
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

    /// Plans and starts `request` on `cluster`; returns once it is
    /// journaled, with the preflight's notes.
    pub async fn start(
        self: &Arc<Self>,
        cluster: &str,
        request: Request,
    ) -> Result<(OpRecord, Vec<String>), StartError> {
        if self.is_stopping() {
            return Err(OpsError::Refused("the daemon is shutting down".into()));
        }
        let resolved = self
            .cluster(cluster)
            .ok_or_else(|| OpsError::Refused(format!("no cluster {cluster:?} is configured")))?;
        let (id, notes) = self.spawn(resolved, Job::Run(request)).await?;
        Ok((self.journal()?.get(&id)?, notes))
    }

    async fn plan(
        &self,
        ops: &Ops,
        cluster: &ResolvedCluster,
        request: Request,
    ) -> Result<Plan, OpsError> {
        match request {
            Request::Snapshot { keep } => {
                let configured = cluster.config.snapshots.as_ref().map_or(0, |s| s.keep);
                let options = SnapshotOptions {
                    dir: self.snapshot_dir(cluster),
                    keep: if keep == 0 { configured } else { keep },
                };
                ops.plan_snapshot(&options).await
            }
            Request::Retire(mut options) => {
                if options.snapshot_dir.as_os_str().is_empty() {
                    options.snapshot_dir = self.snapshot_dir(cluster);
                }
                ops.plan_retire(&options).await
            }
            Request::Join(options) => ops.plan_join(&options).await,
            Request::Migrate(mut options) => {
                if options.snapshot_dir.as_os_str().is_empty() {
                    options.snapshot_dir = self.snapshot_dir(cluster);
                }
                ops.plan_migrate(&options).await
            }
            Request::Apply(options) => ops.plan_apply(&options).await,
        }
    }

    /// Resumes interrupted operation `id` of `cluster` in the background.
    pub async fn resume(self: &Arc<Self>, cluster: &str, id: &str) -> Result<String, OpsError> {
        let resolved = self
            .cluster(cluster)
            .ok_or_else(|| OpsError::Refused(format!("no cluster {cluster:?} is configured")))?;
        let (id, _) = self.spawn(resolved, Job::Resume(id.to_string())).await?;
        Ok(id)
    }

    /// Marks operation `id` as needing a person.
    pub fn needs_attention(&self, cluster: &str, id: &str) -> Result<OpRecord, OpsError> {
        let resolved = self
            .cluster(cluster)
            .ok_or_else(|| OpsError::Refused(format!("no cluster {cluster:?} is configured")))?;
        self.open(&resolved)?.mark_needs_attention(id)
    }

    /// Runs the job on a thread of its own (the journal's connection is
    /// not shared between threads, so an operation's future stays on one);
    /// answers with the operation id and the plan's notes once it is
    /// journaled, or with the refusal (preflight, busy, interrupted) that
    /// came first.
    async fn spawn(
        self: &Arc<Self>,
        cluster: ResolvedCluster,
        job: Job,
    ) -> Result<(String, Vec<String>), OpsError> {
        let (started_tx, started_rx) =
            oneshot::channel::<Result<(String, Vec<String>), OpsError>>();
        let started_tx = Arc::new(Mutex::new(Some(started_tx)));
        let stop = StopHandle::new();
        let (events, _) = watch::channel(Vec::new());
        let running = Arc::new(Running {
            cluster: cluster.config.name.clone(),
            stop: stop.clone(),
            events,
        });
        let manager = Arc::clone(self);
        let refuse = {
            let started_tx = Arc::clone(&started_tx);
            move |e: OpsError| {
                if let Some(tx) = started_tx.lock().unwrap().take() {
                    let _ = tx.send(Err(e));
                }
            }
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| OpsError::Io {
                path: self.state_dir.clone(),
                source,
            })?;
        std::thread::spawn(move || {
            runtime.block_on(async move {
                let began = Instant::now();
                let mut ops = match manager.open(&cluster) {
                    Ok(ops) => ops,
                    Err(e) => return refuse(e),
                };
                ops.set_stop(stop);
                let job = match job {
                    Job::Run(request) => match manager.plan(&ops, &cluster, request).await {
                        Ok(plan) => Planned::Run(plan),
                        Err(e) => return refuse(e),
                    },
                    Job::Resume(id) => Planned::Resume(id),
                };
                let notes = match &job {
                    Planned::Run(plan) => plan.notes.clone(),
                    Planned::Resume(_) => Vec::new(),
                };
                let mut id = None::<String>;
                let mut observe = |event: Event<'_>| {
                    crash_hook(&event);
                    if let Event::Started { id: started } = event {
                        id = Some(started.to_string());
                        manager
                            .running
                            .lock()
                            .unwrap()
                            .insert(started.to_string(), Arc::clone(&running));
                        if let Some(tx) = started_tx.lock().unwrap().take() {
                            let _ = tx.send(Ok((started.to_string(), notes.clone())));
                        }
                    }
                    if let Some(mut event) = to_proto(&event) {
                        event.operation_id = id.clone().unwrap_or_default();
                        running.events.send_modify(|all| all.push(event));
                    }
                };
                let result = match job {
                    Planned::Run(plan) => ops.run(plan, &mut observe).await,
                    Planned::Resume(ref op) => ops.resume(op, &mut observe).await,
                };
                let Some(id) = id else {
                    if let Err(e) = result {
                        refuse(e);
                    }
                    return;
                };
                manager.finish(&cluster, &id, &running, result, began);
            })
        });
        started_rx
            .await
            .unwrap_or_else(|_| Err(OpsError::Refused("the operation's task ended".into())))
    }

    /// After a run: the final event, metrics, catalogue and retention.
    fn finish(
        &self,
        cluster: &ResolvedCluster,
        id: &str,
        running: &Running,
        result: Result<OpRecord, OpsError>,
        began: Instant,
    ) {
        let name = &cluster.config.name;
        let record = self.journal().and_then(|j| j.get(id));
        let (state, error) = match (&result, &record) {
            (Ok(r), _) => (state_name(r.state), String::new()),
            (Err(e), Ok(r)) => (state_name(r.state), e.to_string()),
            (Err(e), Err(_)) => ("failed".to_string(), e.to_string()),
        };
        let parked = matches!(result, Err(OpsError::Parked { .. }));
        let result_label = if parked { "parked" } else { state.as_str() };
        if let Ok(record) = &record {
            self.metrics
                .operation(name, &record.kind, result_label, began.elapsed());
            if let Some(gap) = record.facts["leave_to_reset_gap_ms"].as_f64() {
                self.metrics.leave_to_reset_gap(name, gap / 1000.0);
            }
            if record.kind == "snapshot" {
                self.after_snapshot(cluster, record, result.is_ok(), began);
            }
        }
        tracing::info!(target: "audit", op = %id, cluster = %name, result = %result_label, error = %error, "operation ended");
        running.events.send_modify(|all| {
            all.push(proto::OperationEvent {
                operation_id: id.to_string(),
                event: Some(Ev::Finished(proto::Finished { state, error })),
            })
        });
        let mut map = self.running.lock().unwrap();
        map.remove(id);
        if map.is_empty() {
            self.idle.notify_waiters();
        }
    }

    fn after_snapshot(
        &self,
        cluster: &ResolvedCluster,
        record: &OpRecord,
        ok: bool,
        began: Instant,
    ) {
        let name = &cluster.config.name;
        if !ok {
            self.metrics.snapshot_failed(name);
            return;
        }
        let Some(path) = record.facts["snapshot"].as_str().map(PathBuf::from) else {
            return;
        };
        let sidecar = PathBuf::from(format!("{}.json", path.display()));
        let meta = std::fs::read(&sidecar).ok().and_then(|b| {
            serde_json::from_slice::<talos_client::snapshot::SnapshotMetadata>(&b).ok()
        });
        let Some(meta) = meta else {
            tracing::warn!(cluster = %name, path = %path.display(), "snapshot sidecar unreadable: not catalogued");
            return;
        };
        let catalogue = self.catalogue();
        if let Err(e) = catalogue.add(name, &record.id, &path, &meta) {
            tracing::error!(cluster = %name, "{e}");
        }
        self.metrics
            .snapshot_succeeded(name, meta.report.size, began.elapsed());
        if let Err(e) = catalogue.prune_missing(name) {
            tracing::error!(cluster = %name, "{e}");
        }
        if let Some(max_age) = cluster.config.snapshots.as_ref().and_then(|s| s.max_age) {
            let cutoff = time::OffsetDateTime::now_utc() - max_age.0;
            let cutoff = cutoff
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default();
            match crate::catalogue::expire(&catalogue, name, &cutoff, &path) {
                Ok(removed) if !removed.is_empty() => {
                    tracing::info!(cluster = %name, removed = removed.len(), "expired snapshots removed")
                }
                Ok(_) => {}
                Err(e) => tracing::error!(cluster = %name, "expiring snapshots: {e}"),
            }
        }
    }

    /// Stops taking work and parks every running operation at its next
    /// step boundary; returns once none runs.
    pub async fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        loop {
            let idle = self.idle.notified();
            let running: Vec<_> = self.running.lock().unwrap().values().cloned().collect();
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

enum Job {
    Run(Request),
    Resume(String),
}

enum Planned {
    Run(Plan),
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

/// An operation state as the API writes it.
pub fn state_name(state: OpState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A step state as the API writes it.
pub fn step_state_name(state: StepState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn to_proto(event: &Event<'_>) -> Option<proto::OperationEvent> {
    let ev = match *event {
        Event::StepStarted {
            index,
            name,
            destructive,
        } => Ev::StepStarted(proto::StepStarted {
            index: index as u32,
            name: name.into(),
            destructive,
        }),
        Event::StepEnded {
            index,
            name,
            state,
            duration_ms,
            detail,
        } => Ev::StepEnded(proto::StepEnded {
            index: index as u32,
            name: name.into(),
            state: step_state_name(state),
            duration_ms,
            detail: detail.into(),
        }),
        _ => return None,
    };
    Some(proto::OperationEvent {
        operation_id: String::new(),
        event: Some(ev),
    })
}

/// `TALOS_OPSD_TEST_CRASH=started:STEP` or `answered:STEP` aborts the daemon
/// at that point, as a crash would (for the crash-safety tests).
fn crash_hook(event: &Event<'_>) {
    let Ok(crash) = std::env::var("TALOS_OPSD_TEST_CRASH") else {
        return;
    };
    let point = match event {
        Event::StepStarted { name, .. } => format!("started:{name}"),
        Event::StepAnswered { name, .. } => format!("answered:{name}"),
        _ => return,
    };
    if point == crash {
        std::process::abort();
    }
}
