//! Resuming and abandoning an operation through the API, planned and
//! confirmed as a start is: [`Manager::plan_resume`] shows what a resume
//! would do next (the step in flight, reconciled with the cluster first,
//! then the steps still to run) with a fingerprint of the record as read;
//! [`Manager::resume_confirmed`] and [`Manager::abandon_confirmed`] act
//! only while the record still has that fingerprint. Each step a resume
//! sends is checked against the cluster by the operations layer right
//! before it is sent, as on a first run.

use std::sync::Arc;

use sha2::Digest as _;
use talos_client::ops::{OpRecord, OpState, OpsError, StepState};
use talos_opsd_api::{record_to_proto, state_name, step_state_name};

use crate::config::ResolvedCluster;
use crate::manager::{Manager, StartError};
use crate::proto;
use crate::work::Job;

/// sha256 (hex) of what a resume or an abandon is confirmed about: the
/// operation, its state, and each step's state and times. Any step run or
/// ended since changes it.
pub fn fingerprint(record: &OpRecord) -> String {
    let mut hasher = sha2::Sha256::new();
    hasher.update(record.id.as_bytes());
    hasher.update([0]);
    hasher.update(state_name(record.state).as_bytes());
    for step in &record.steps {
        for part in [
            step.index.to_string(),
            step.label(),
            step_state_name(step.state),
            step.started.clone().unwrap_or_default(),
            step.finished.clone().unwrap_or_default(),
        ] {
            hasher.update([0]);
            hasher.update(part.as_bytes());
        }
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What a resume of `record` would do, in order: the step in flight (or a
/// destructive step that failed: it may have taken effect) reconciled with
/// the cluster first, then every step not done.
fn steps_left(record: &OpRecord) -> Vec<proto::PlannedStep> {
    record
        .steps
        .iter()
        .filter(|s| !matches!(s.state, StepState::Done | StepState::Skipped))
        .map(|s| {
            let description = match s.state {
                StepState::Running => format!(
                    "in flight when it stopped (since {}): reconciled with the cluster first, found done or sent again once its precondition holds; {}",
                    s.started.as_deref().unwrap_or("?"),
                    s.description
                ),
                StepState::Failed if s.destructive => format!(
                    "failed, and may have taken effect: reconciled with the cluster first, found done or sent again once its precondition holds; {}",
                    s.description
                ),
                StepState::Failed => format!("failed: run again; {}", s.description),
                _ => s.description.clone(),
            };
            proto::PlannedStep {
                name: s.name.clone(),
                node: s.node.clone().unwrap_or_default(),
                description,
                destructive: s.destructive,
            }
        })
        .collect()
}

impl Manager {
    /// The operation `id` names and its configured cluster, when it can be
    /// resumed or abandoned here: it has not ended, does not run in this
    /// daemon, and ran against a configured cluster.
    fn waiting(&self, id: &str) -> Result<(OpRecord, ResolvedCluster), StartError> {
        if self.is_stopping() {
            return Err(StartError::ShuttingDown);
        }
        let record = self.journal()?.get(id)?;
        let refused = |reason: &str| {
            StartError::Ops(OpsError::NotResumable {
                id: record.id.clone(),
                state: record.state,
                reason: reason.into(),
            })
        };
        if self.running(&record.id).is_some() {
            return Err(refused(
                "it runs in this daemon now: watch it, or cancel it",
            ));
        }
        if matches!(
            record.state,
            OpState::Succeeded | OpState::Abandoned | OpState::Cancelled
        ) {
            return Err(refused("it has ended"));
        }
        let name =
            self.cluster_of(&record.ca_fingerprint)
                .ok_or_else(|| StartError::NotConfigured {
                    id: record.id.clone(),
                    context: record.context.clone(),
                })?;
        let cluster = self.resolve(&name)?;
        Ok((record, cluster))
    }

    /// What resuming operation `id` would do next, and the fingerprint to
    /// confirm it (or its abandon) with; changes nothing.
    pub fn plan_resume(&self, id: &str) -> Result<proto::ResumePlan, StartError> {
        let (record, cluster) = self.waiting(id)?;
        let steps = steps_left(&record);
        let mut notes = vec![format!(
            "operation {} ({}) on cluster {} is {} since {}",
            record.id,
            record.kind,
            cluster.config.name,
            state_name(record.state),
            record.updated
        )];
        if steps.is_empty() {
            notes.push("no step is left: a resume records its end".into());
        }
        notes.push("an abandon ends it here and leaves the cluster as it is now".into());
        Ok(proto::ResumePlan {
            fingerprint: fingerprint(&record),
            operation: Some(record_to_proto(
                &record,
                cluster.config.name.clone(),
                Vec::new(),
            )),
            steps,
            notes,
        })
    }

    /// The waiting operation `id`, refused unless its record still has the
    /// fingerprint `confirmed`.
    fn confirmed(
        &self,
        id: &str,
        confirmed: &str,
    ) -> Result<(OpRecord, ResolvedCluster), StartError> {
        let (record, cluster) = self.waiting(id)?;
        let now = fingerprint(&record);
        if now != confirmed {
            return Err(StartError::RecordChanged {
                id: record.id,
                confirmed: confirmed.to_string(),
                now,
            });
        }
        Ok((record, cluster))
    }

    /// Resumes operation `id` as planned by [`Manager::plan_resume`] (its
    /// record must still have the fingerprint `confirmed`); answers once
    /// it runs again.
    pub async fn resume_confirmed(
        self: &Arc<Self>,
        id: &str,
        confirmed: &str,
    ) -> Result<OpRecord, StartError> {
        let (record, cluster) = self.confirmed(id, confirmed)?;
        let (id, _) = self.spawn(cluster, Job::Resume(record.id)).await?;
        Ok(self.journal()?.get(&id)?)
    }

    /// Ends operation `id` without further action, as planned by
    /// [`Manager::plan_resume`] (fingerprint `confirmed`); refused while
    /// another process runs it (it holds the cluster's lock).
    pub fn abandon_confirmed(&self, id: &str, confirmed: &str) -> Result<OpRecord, StartError> {
        let (record, cluster) = self.confirmed(id, confirmed)?;
        Ok(self.open(&cluster)?.abandon(&record.id)?)
    }
}
