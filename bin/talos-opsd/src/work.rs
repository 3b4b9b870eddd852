//! The daemon's operations as tasks: a start planned (and dropped should
//! shutdown begin meanwhile), journaled and run, or a resume; each one's
//! end recorded (metrics, catalogue, retention); and shutdown, which
//! refuses new work and parks what runs as one step: from the moment it
//! begins no start is accepted, and a start already under way is either
//! refused (`UNAVAILABLE`) or journaled and parked at a step boundary,
//! never cut in the middle of a step.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use talos_client::ops::{
    ClusterLockPolicy, Event, OpRecord, OpSpec, OpState, Ops, OpsError, Plan, Refusal,
};
use talos_client::ops::{OpKind, StopHandle, Unsaved};
use talos_opsd_api::{event_to_proto, state_name};
use tokio::sync::{oneshot, watch};

use crate::config::ResolvedCluster;
use crate::manager::{Manager, Running, StartError};
use crate::proto;
use crate::proto::operation_event::Event as Ev;

/// Whether the daemon takes work, and the jobs it has taken.
#[derive(Debug, Default)]
pub(crate) struct Work {
    /// Shutdown has begun: no new job is taken.
    pub stopping: bool,
    next: u64,
    /// Every job from the moment it is taken (before its plan) to the end
    /// of its task, with the handle that parks it.
    jobs: HashMap<u64, StopHandle>,
}

/// What a job does.
pub(crate) enum Job {
    /// Plan the spec (matching the confirmed fingerprint, if any) and run it
    /// under the cluster lock as the policy says.
    Run(Box<OpSpec>, Option<String>, ClusterLockPolicy),
    /// Resume the interrupted operation with this id.
    Resume(String),
}

enum Planned {
    Run(Box<Plan>),
    Resume(String),
}

/// A job's place among the daemon's work; dropped when its task ends.
struct Ticket {
    manager: Arc<Manager>,
    n: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let none_left = {
            let mut work = self.manager.work();
            work.jobs.remove(&self.n);
            work.jobs.is_empty()
        };
        if none_left {
            self.manager.idle.notify_waiters();
        }
    }
}

type Answer = oneshot::Sender<Result<(String, Vec<String>), StartError>>;

impl Manager {
    /// Takes a job, unless shutdown has begun; checked and recorded in one
    /// step with shutdown's own change, so none slips between them.
    fn take_job(self: &Arc<Self>, stop: &StopHandle) -> Result<Ticket, StartError> {
        let mut work = self.work();
        if work.stopping {
            return Err(StartError::ShuttingDown);
        }
        work.next += 1;
        let n = work.next;
        work.jobs.insert(n, stop.clone());
        Ok(Ticket {
            manager: Arc::clone(self),
            n,
        })
    }

    /// Runs the job as a task; answers with the operation id and the
    /// plan's notes once it is journaled, or with the refusal (preflight,
    /// busy, interrupted, a changed plan, shutdown) that came first.
    pub(crate) async fn spawn(
        self: &Arc<Self>,
        cluster: ResolvedCluster,
        job: Job,
    ) -> Result<(String, Vec<String>), StartError> {
        let stop = StopHandle::new();
        let ticket = self.take_job(&stop)?;
        let (started_tx, started_rx) = oneshot::channel();
        let (events, _) = watch::channel(Vec::new());
        let running = Arc::new(Running {
            cluster: cluster.config.name.clone(),
            stop: stop.clone(),
            events,
        });
        let manager = Arc::clone(self);
        tokio::spawn(async move {
            let _ticket = ticket;
            manager
                .run_job(cluster, job, stop, running, started_tx)
                .await;
        });
        match started_rx.await {
            Ok(result) => result,
            Err(_) => Err(StartError::Ops(OpsError::StepFailed {
                step: "start".into(),
                reason: "the operation's task ended before it was journaled".into(),
            })),
        }
    }

    async fn run_job(
        self: &Arc<Self>,
        cluster: ResolvedCluster,
        job: Job,
        stop: StopHandle,
        running: Arc<Running>,
        started_tx: Answer,
    ) {
        let started_tx = Mutex::new(Some(started_tx));
        let refuse = |e: StartError| {
            if let Some(tx) = started_tx
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
            {
                let _ = tx.send(Err(e));
            }
        };
        let kind = match &job {
            Job::Run(spec, ..) => Some(spec.kind()),
            Job::Resume(id) => self
                .journal()
                .ok()
                .and_then(|j| j.get(id).ok())
                .and_then(|r| {
                    [OpKind::Snapshot, OpKind::Drill]
                        .into_iter()
                        .find(|k| k.name() == r.kind)
                }),
        };
        let opened = match kind {
            Some(kind) => self.open_for(&cluster, kind),
            None => self.open(&cluster),
        };
        let mut ops = match opened {
            Ok(ops) => ops,
            Err(e) => return refuse(e.into()),
        };
        ops.set_stop(stop);
        let job = match job {
            Job::Run(spec, confirmed, policy) => {
                ops.set_cluster_lock_policy(policy);
                // Shutdown drops a plan in progress (it changes nothing):
                // the start is refused at once instead of holding shutdown
                // up for as long as a silent cluster takes to answer.
                let mut stopping = self.stop_signal.subscribe();
                let planned = tokio::select! {
                    planned = plan_matching(&ops, &spec, confirmed) => planned,
                    _ = stopping.wait_for(|s| *s) => return refuse(StartError::ShuttingDown),
                };
                match planned {
                    Ok(plan) => Planned::Run(Box::new(plan)),
                    Err(e) => return refuse(e.into()),
                }
            }
            Job::Resume(id) => Planned::Resume(id),
        };
        // The last point at which a start is refused; from here it is
        // journaled, and a shutdown that begins now parks it at its next
        // step boundary (its stop handle is among the jobs).
        if self.is_stopping() {
            return refuse(StartError::ShuttingDown);
        }
        let notes = match &job {
            Planned::Run(plan) => plan.notes.clone(),
            Planned::Resume(_) => Vec::new(),
        };
        let mut id = None::<String>;
        let mut observe = |event: Event<'_>| {
            #[cfg(feature = "test-hooks")]
            crate::test_hooks::observe(&event, &self.state_dir);
            if let Event::Started { id: started } = event {
                id = Some(started.to_string());
                self.running
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
                refuse(e.into());
            }
            return;
        };
        let unsaved = ops.journal().unsaved(&id);
        self.finish(&cluster, &id, &running, result, unsaved);
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
        tracing::info!(target: "audit", op = %id, cluster = %name, result = %result_label, error = %talos_client::text::escaped(&error, 1024), "operation ended");
        running.events.send_modify(|all| {
            all.push(proto::OperationEvent {
                operation_id: id.to_string(),
                event: Some(Ev::Finished(proto::Finished { state, error })),
            })
        });
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }

    /// Refuses new work from now on; `false` when it already was refused.
    pub fn stop_taking_work(&self) -> bool {
        let first = !std::mem::replace(&mut self.work().stopping, true);
        self.stop_signal.send_replace(true);
        first
    }

    /// Stops taking work and parks every job at its next step boundary (a
    /// start still planning is refused); returns once none is left.
    pub async fn shutdown(&self) {
        self.stop_taking_work();
        loop {
            let idle = self.idle.notified();
            let jobs: Vec<StopHandle> = self.work().jobs.values().cloned().collect();
            if jobs.is_empty() {
                return;
            }
            for job in &jobs {
                job.park();
            }
            idle.await;
        }
    }
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
