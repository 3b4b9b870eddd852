//! Running a plan: the journal record made from it, the step loop with its
//! park and cancel boundaries, and the dispatch of each typed step to its
//! operation (and, on resume, to its reconciler).

use std::time::Instant;

use super::fresh::{CheckRecord, Guard, GuardAt};
use super::journal::{self, StepEnd};
use super::plan::{Facts, Step};
use super::{
    ClusterLock, Event, OpRecord, OpSpec, OpState, Ops, OpsError, Outcome, Plan, StepRecord,
    StepState,
};

/// How a step ended, before it is journaled.
struct StepEnded {
    state: StepState,
    duration_ms: u64,
    detail: String,
    /// Its own start, when the journal does not hold it yet (see
    /// [`StepEnd::started`]).
    started: Option<String>,
    /// The checks the engine ran before sending it.
    checks: Vec<CheckRecord>,
    /// When it ended (RFC 3339): taken with its duration, since the end of
    /// the first half of a unit is written only after the second half ran.
    finished: String,
}

/// How a step in flight at an interruption was settled on resume.
enum Resumed {
    /// The step ran once in this process.
    No,
    /// Its reconciler found it done: its start is the journaled one.
    Confirmed,
    /// Run again from the start (the journaled start was the interrupted
    /// attempt's, at the time given).
    Again(Option<String>),
}

/// What a run needs besides the record: the typed spec, steps and facts.
struct Typed {
    spec: OpSpec,
    steps: Vec<Step>,
    facts: Facts,
}

impl Ops {
    /// Runs `plan`, reporting progress to `observe`, under the lock the
    /// plan holds (taken again if it was released; refused while another
    /// operation runs or an interrupted one awaits `resume` or `abandon`).
    pub async fn run(
        &mut self,
        mut plan: Plan,
        observe: &mut (dyn FnMut(Event<'_>) + Send),
    ) -> Result<OpRecord, OpsError> {
        if plan.id.is_empty() {
            plan.id = super::new_id();
        }
        let _lock = match plan.lock.take() {
            Some(lock) => lock,
            None => {
                let lock = std::sync::Arc::new(self.lock(&plan.id)?);
                self.refuse_if_interrupted()?;
                lock
            }
        };
        let cluster_lock = match plan.cluster_lock.take() {
            Some(hold) => Some(hold),
            // A plan only shown (PlanOnly) runs under the lock taken now.
            None if plan.spec.may_change_cluster() => {
                let policy = self.cluster_lock_policy;
                if policy == super::ClusterLockPolicy::PlanOnly {
                    self.cluster_lock_policy = super::ClusterLockPolicy::Required;
                }
                let taken = self.take_cluster_lock(&plan.id).await;
                self.cluster_lock_policy = policy;
                taken?
            }
            None => None,
        };
        let mut record = self.record_of(&plan)?;
        record.cluster_lock = cluster_lock.as_ref().map(|hold| hold.record.clone());
        self.cluster_lease = cluster_lock.and_then(|hold| hold.lease);
        self.journal.create(&record)?;
        observe(Event::Started { id: &record.id });
        let typed = Typed {
            spec: plan.spec,
            steps: plan.steps.into_iter().map(|s| s.step).collect(),
            facts: plan.facts,
        };
        let result = self.drive(record, typed, false, observe).await;
        self.end_cluster_lock(&result).await;
        result
    }

    /// After a run: an operation that ended lets its cluster lock go; one
    /// that stopped part-way (parked, needing attention, a crash) leaves it
    /// to expire, so that its holder stays named until then.
    async fn end_cluster_lock(&mut self, result: &Result<OpRecord, OpsError>) {
        let ended = match result {
            Ok(_) => true,
            Err(OpsError::Cancelled { .. } | OpsError::StepFailed { .. }) => true,
            Err(_) => false,
        };
        if ended {
            self.release_cluster_lock().await;
        } else {
            self.cluster_lease = None;
        }
    }

    fn record_of(&self, plan: &Plan) -> Result<OpRecord, OpsError> {
        let json = |what: &str, value: serde_json::Result<serde_json::Value>| {
            value.map_err(|e| OpsError::Unreadable {
                id: plan.id.clone(),
                what: what.into(),
                reason: e.to_string(),
            })
        };
        let now = journal::now();
        Ok(OpRecord {
            id: plan.id.clone(),
            kind: plan.kind.name().into(),
            context: self.context.clone(),
            ca_fingerprint: self.fingerprint.clone(),
            params: json("params", serde_json::to_value(&plan.spec))?,
            facts: json("facts", serde_json::to_value(&plan.facts))?,
            format: journal::FORMAT,
            state: OpState::Running,
            created: now.clone(),
            updated: now,
            steps: plan
                .steps
                .iter()
                .enumerate()
                .map(|(index, s)| StepRecord {
                    index,
                    name: s.name.to_string(),
                    node: s.node.clone(),
                    description: s.description.clone(),
                    destructive: s.destructive,
                    state: StepState::Pending,
                    started: None,
                    finished: None,
                    duration_ms: None,
                    detail: None,
                    fence: None,
                    checks: Vec::new(),
                    step: Some(s.step.clone()),
                })
                .collect(),
            cluster_lock: None,
        })
    }

    /// Continues an interrupted operation: the step that was in flight is
    /// first reconciled with the cluster (done, or sent again), then the
    /// remaining steps run. An operation of an earlier journal format is
    /// refused (it can only be abandoned).
    pub async fn resume(
        &mut self,
        id: &str,
        observe: &mut (dyn FnMut(Event<'_>) + Send),
    ) -> Result<OpRecord, OpsError> {
        let record = self.resumable(id)?;
        let typed = Typed {
            spec: record.spec()?,
            steps: record.typed_steps()?,
            facts: record.typed_facts()?,
        };
        let _lock: ClusterLock = self.lock(&record.id)?;
        let cluster_lock = match typed.spec.may_change_cluster() {
            true => self.resume_cluster_lock(&record).await?,
            false => None,
        };
        if let Some(hold) = cluster_lock {
            self.journal.set_cluster_lock(&record.id, &hold.record)?;
            self.cluster_lease = hold.lease;
        }
        observe(Event::Started { id: &record.id });
        let result = self.drive(record, typed, true, observe).await;
        self.end_cluster_lock(&result).await;
        result
    }

    /// The cluster lock taken again for a resumed operation (its own
    /// holder identity: a lease it still holds is taken at once). One run
    /// without a lock, as told, may go on without one.
    async fn resume_cluster_lock(
        &mut self,
        record: &OpRecord,
    ) -> Result<Option<super::cluster_lock::ClusterLockHold>, OpsError> {
        use super::ClusterLockPolicy;
        let policy = self.cluster_lock_policy;
        if matches!(
            record.cluster_lock,
            Some(super::ClusterLockRecord::Without { .. })
        ) && policy == ClusterLockPolicy::Required
        {
            self.cluster_lock_policy = ClusterLockPolicy::AllowWithout;
        }
        let taken = self.take_cluster_lock(&record.id).await;
        self.cluster_lock_policy = policy;
        taken
    }

    async fn drive(
        &mut self,
        record: OpRecord,
        typed: Typed,
        resuming: bool,
        observe: &mut (dyn FnMut(Event<'_>) + Send),
    ) -> Result<OpRecord, OpsError> {
        let id = record.id.clone();
        if resuming {
            self.journal.set_state(&id, OpState::Running)?;
        }
        self.take_checks();
        let Typed {
            spec,
            steps: typed_steps,
            mut facts,
        } = typed;
        let steps = record.steps;
        let mut started_with_previous = false;
        // A failure once a leave or reset ran needs attention.
        let mut past_no_return = steps
            .iter()
            .zip(&typed_steps)
            .any(|(s, t)| t.point_of_no_return() && s.state != StepState::Pending);
        // The end of a step bound to this one, written after this one's
        // call (nothing is written between a leave and its reset).
        let mut deferred: Option<(usize, StepEnded)> = None;
        if steps
            .iter()
            .any(|s| s.destructive && s.state != StepState::Pending)
        {
            self.stop.enter_destructive();
        }
        for (index, (step, typed_step)) in steps.iter().zip(&typed_steps).enumerate() {
            if matches!(step.state, StepState::Done | StepState::Skipped) {
                continue;
            }
            let mut started = Instant::now();
            let mut started_at = journal::now();
            // A running step is one in flight when the process died (on
            // resume) or one started in the same commit as the previous
            // step's end. A destructive step that failed is, on resume,
            // reconciled as one in flight: it may have taken effect.
            let failed_before = resuming && step.destructive && step.state == StepState::Failed;
            let in_flight = step.state == StepState::Running || failed_before;
            let bound = deferred.is_some();
            if failed_before {
                self.journal.step_started(&id, index)?;
            } else if !in_flight && !started_with_previous && !bound {
                self.stop_at_boundary(&id, step)?;
                self.journal.step_started(&id, index)?;
            }
            let (name, node) = (step.name.as_str(), step.node.as_deref());
            observe(Event::StepStarted {
                index,
                name,
                node,
                destructive: step.destructive,
            });
            past_no_return |= typed_step.point_of_no_return();
            let mut resumed = Resumed::No;
            let at = GuardAt {
                op: &id,
                index,
                bound,
            };
            let result = if in_flight && resuming {
                match self
                    .reconcile(&spec, typed_step, &mut facts, step.started.as_deref())
                    .await
                {
                    Ok(Some(outcome)) => {
                        resumed = Resumed::Confirmed;
                        Ok(outcome)
                    }
                    // Everything else is safe to do again: a new attempt,
                    // with its own start and duration.
                    Ok(None) => {
                        resumed = Resumed::Again(step.started.clone());
                        started = Instant::now();
                        started_at = journal::now();
                        self.guarded(&spec, typed_step, &mut facts, at, observe)
                            .await
                    }
                    Err(e) => Err(e),
                }
            } else {
                self.guarded(&spec, typed_step, &mut facts, at, observe)
                    .await
            };
            observe(Event::StepAnswered { index, name, node });
            let checks = self.take_checks();
            if let Err(OpsError::StoppedWaiting { cancel }) = result {
                let facts_value = serde_json::to_value(&facts).unwrap_or_default();
                return Err(self.stopped_waiting(&id, index, step, cancel, &facts_value)?);
            }
            let facts_value = serde_json::to_value(&facts).unwrap_or_default();
            let (state, detail) = match &result {
                Ok(outcome) => (outcome.state, outcome.detail.clone()),
                Err(error) => (StepState::Failed, error.to_string()),
            };
            let ended = own_times(
                StepEnded {
                    state,
                    duration_ms: started.elapsed().as_millis() as u64,
                    detail,
                    started: None,
                    checks,
                    finished: journal::now(),
                },
                resumed,
                step.started.as_deref(),
                // The second half of a unit is journaled as started only
                // after its call, and a step in flight on resume kept the
                // interrupted attempt's start: either way its own goes
                // with its end.
                (bound || (in_flight && resuming)).then_some(started_at),
            );
            // The next step of a unit runs at once; this step's end is
            // written with it.
            if result.is_ok() && typed_step.bound_to_next() && index + 1 < steps.len() {
                self.stop.enter_destructive();
                // Reported now (progress only; the journal follows).
                observe(Event::StepEnded {
                    index,
                    name,
                    node,
                    state: ended.state,
                    duration_ms: ended.duration_ms,
                    detail: &ended.detail,
                });
                deferred = Some((index, ended));
                continue;
            }
            if let Some((earlier, end)) = deferred.take() {
                let written = self.end_step(
                    &id,
                    earlier,
                    &steps[earlier],
                    &end,
                    &facts_value,
                    None,
                    None,
                );
                if let Err(e) = written {
                    // This step ran as well (the unit's second half): its
                    // end goes on record with the first's when the journal
                    // takes writes again.
                    let this = StepEnd {
                        state: ended.state,
                        duration_ms: ended.duration_ms,
                        detail: Some(&ended.detail),
                        started: ended.started.as_deref(),
                        checks: &ended.checks,
                        finished: Some(&ended.finished),
                    };
                    self.journal
                        .remember_step_end(&id, index, &this, &facts_value);
                    return Err(e);
                }
                // Recorded once its call has answered; its own start is
                // written with its end, just below.
                self.journal.step_started(&id, index)?;
            }
            // A destructive next step is journaled as started in the same
            // commit, so nothing slow sits between the two. A park or
            // cancel stops before it, unless this step was destructive too
            // (a sequence runs to its end).
            let next = steps
                .get(index + 1)
                .filter(|_| result.is_ok())
                .filter(|s| s.destructive)
                .filter(|_| step.destructive || !self.stop.is_stopping())
                .filter(|_| self.stop.enter_destructive())
                .map(|_| index + 1);
            self.end_step(&id, index, step, &ended, &facts_value, next, Some(observe))?;
            started_with_previous = next.is_some();
            if let Err(error) = result {
                let attention = past_no_return || matches!(error, OpsError::NeedsAttention { .. });
                let state = if attention {
                    OpState::NeedsAttention
                } else {
                    OpState::Failed
                };
                self.journal.set_state(&id, state)?;
                return Err(match error {
                    e @ (OpsError::StepFailed { .. } | OpsError::NeedsAttention { .. }) => e,
                    other if attention => OpsError::attention(&step.label(), other),
                    other => OpsError::step(&step.label(), other),
                });
            }
        }
        self.journal.set_state(&id, OpState::Succeeded)?;
        self.journal.get(&id)
    }

    /// Journals the end of step `index` (and the start of `next` in the same
    /// commit) and reports it to `observe`, if given.
    #[allow(clippy::too_many_arguments)]
    fn end_step(
        &mut self,
        id: &str,
        index: usize,
        step: &StepRecord,
        ended: &StepEnded,
        facts: &serde_json::Value,
        next: Option<usize>,
        observe: Option<&mut (dyn FnMut(Event<'_>) + Send)>,
    ) -> Result<(), OpsError> {
        let end = StepEnd {
            state: ended.state,
            duration_ms: ended.duration_ms,
            detail: Some(&ended.detail),
            started: ended.started.as_deref(),
            checks: &ended.checks,
            finished: Some(&ended.finished),
        };
        self.journal.step_ended(id, index, end, facts, next)?;
        let Some(observe) = observe else {
            return Ok(());
        };
        observe(Event::StepEnded {
            index,
            name: &step.name,
            node: step.node.as_deref(),
            state: ended.state,
            duration_ms: ended.duration_ms,
            detail: &ended.detail,
        });
        Ok(())
    }

    /// A wait stopped between two polls: a park leaves the step in flight
    /// (resume waits again); a cancel (accepted only before any destructive
    /// step) ends the step and the operation as cancelled.
    fn stopped_waiting(
        &mut self,
        id: &str,
        index: usize,
        step: &StepRecord,
        cancel: bool,
        facts: &serde_json::Value,
    ) -> Result<OpsError, OpsError> {
        if !cancel {
            return Ok(OpsError::Parked {
                id: id.into(),
                step: step.label(),
            });
        }
        let end = StepEnd {
            state: StepState::Failed,
            duration_ms: 0,
            detail: Some("cancelled while waiting; nothing was changed"),
            started: None,
            checks: &[],
            finished: None,
        };
        self.journal.step_ended(id, index, end, facts, None)?;
        self.journal.set_state(id, OpState::Cancelled)?;
        Ok(OpsError::Cancelled {
            id: id.into(),
            step: step.label(),
        })
    }

    /// At a step boundary: ends the run as cancelled or parked when asked.
    fn stop_at_boundary(&mut self, id: &str, step: &StepRecord) -> Result<(), OpsError> {
        let stopped = match self.stop.at_boundary() {
            None if !step.destructive || self.stop.enter_destructive() => return Ok(()),
            None | Some(true) => {
                self.journal.set_state(id, OpState::Cancelled)?;
                OpsError::Cancelled {
                    id: id.into(),
                    step: step.label(),
                }
            }
            Some(false) => OpsError::Parked {
                id: id.into(),
                step: step.label(),
            },
        };
        Err(stopped)
    }

    /// Runs `step` with its guard: a destructive step gets its declared
    /// check, which the guard runs right before each send, in this process
    /// (see [`Ops::guard_destructive`]); a step that changes nothing gets
    /// none, and cannot send.
    async fn guarded(
        &mut self,
        spec: &OpSpec,
        step: &Step,
        facts: &mut Facts,
        at: GuardAt<'_>,
        observe: &mut (dyn FnMut(Event<'_>) + Send),
    ) -> Result<Outcome, OpsError> {
        let check = step.check(facts)?;
        if step.destructive() && check.is_none() {
            return Err(super::fresh::undeclared(&step.label()));
        }
        let mut guard = Guard::new(at, step.name(), step.node(), check, observe);
        self.execute(spec, step, facts, &mut guard).await
    }

    async fn execute(
        &mut self,
        spec: &OpSpec,
        step: &Step,
        facts: &mut Facts,
        guard: &mut Guard<'_>,
    ) -> Result<Outcome, OpsError> {
        match (spec, step, facts) {
            (OpSpec::Snapshot(_), Step::Snapshot(s), Facts::Snapshot(f)) => {
                self.snapshot_step(*s, f).await
            }
            (OpSpec::Retire(_), Step::Retire(s), Facts::Retire(f)) => {
                self.retire_step(*s, f, guard).await
            }
            (OpSpec::Join(_), Step::Join(s), Facts::Join(f)) => self.join_step(*s, f, guard).await,
            (OpSpec::Migrate(_), Step::Migrate(s), Facts::Migrate(f)) => {
                self.migrate_step(*s, f, guard).await
            }
            (OpSpec::Apply(o), Step::Apply(s), Facts::Apply(f)) => {
                self.apply_step(o, s, f, guard).await
            }
            (OpSpec::Drill(o), Step::Drill(_), Facts::Drill(f)) => self.drill_step(o, f).await,
            (OpSpec::Defrag(_), Step::Defrag(s), Facts::Defrag(f)) => {
                self.defrag_step(s, f, guard).await
            }
            (OpSpec::Upgrade(o), Step::Upgrade(s), Facts::Upgrade(f)) => {
                self.upgrade_step(o, s, f, guard).await
            }
            (OpSpec::Restore(o), Step::Restore(s), Facts::Restore(f)) => {
                self.restore_step(o, *s, f, guard).await
            }
            _ => Err(mismatch(spec, step)),
        }
    }

    /// A step in flight at a crash (journaled as started at `started`):
    /// its outcome when it is done already, `None` when it is to run again
    /// (where that is safe).
    async fn reconcile(
        &mut self,
        spec: &OpSpec,
        step: &Step,
        facts: &mut Facts,
        started: Option<&str>,
    ) -> Result<Option<Outcome>, OpsError> {
        Ok(match (spec, step, &mut *facts) {
            (OpSpec::Retire(_), Step::Retire(s), Facts::Retire(f)) => {
                self.reconcile_retire(*s, f).await?
            }
            (OpSpec::Join(_), Step::Join(s), Facts::Join(f)) => self.reconcile_join(*s, f).await?,
            (OpSpec::Migrate(_), Step::Migrate(s), Facts::Migrate(f)) => {
                self.reconcile_migrate(*s, f).await?
            }
            (OpSpec::Apply(o), Step::Apply(s), Facts::Apply(f)) => {
                self.reconcile_apply(o, s, f, started).await?
            }
            (OpSpec::Restore(_), Step::Restore(s), Facts::Restore(f)) => {
                self.reconcile_restore(*s, f).await?
            }
            (OpSpec::Upgrade(o), Step::Upgrade(s), Facts::Upgrade(f)) => {
                self.reconcile_upgrade(o, s, f).await?
            }
            _ => None,
        })
    }
}

/// A step's end with its own times. `ended` is timed from `attempt` (the
/// wall-clock start of this process's attempt, when the journal does not
/// hold it). A step confirmed done on resume ran from its journaled start
/// (`journaled`) to its confirmation, the interruption included; a step run
/// again is this attempt alone, its detail naming the interrupted one.
fn own_times(
    mut ended: StepEnded,
    resumed: Resumed,
    journaled: Option<&str>,
    attempt: Option<String>,
) -> StepEnded {
    use time::OffsetDateTime;
    use time::format_description::well_known::Rfc3339;
    ended.started = attempt;
    match resumed {
        Resumed::No => {}
        Resumed::Confirmed => {
            let since = journaled.and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok());
            if let Some(since) = since {
                let now = OffsetDateTime::now_utc();
                let ms = (now - since).whole_milliseconds();
                if let Ok(text) = now.format(&Rfc3339) {
                    ended.finished = text;
                }
                ended.duration_ms = u64::try_from(ms).unwrap_or(0);
                ended.started = journaled.map(str::to_string);
                ended.detail = format!(
                    "{}; confirmed on resume (its time since it was sent includes the interruption)",
                    ended.detail
                );
            }
        }
        Resumed::Again(first) => {
            ended.detail = format!(
                "{}; run again on resume (the attempt started {} was interrupted)",
                ended.detail,
                first.as_deref().unwrap_or("earlier")
            );
        }
    }
    ended
}

fn mismatch(spec: &OpSpec, step: &Step) -> OpsError {
    OpsError::step(
        &step.label(),
        format!(
            "the step and the facts do not belong to a {} operation",
            spec.kind()
        ),
    )
}

/// The operations' futures are `Send`: a daemon spawns them as tasks.
#[allow(dead_code)]
fn futures_are_send(ops: &mut Ops, spec: &OpSpec, plan: Plan) {
    fn send<T: Send>(_: T) {}
    send(ops.plan(spec));
    send(ops.run(plan, &mut |_| {}));
    send(ops.resume("id", &mut |_| {}));
}
