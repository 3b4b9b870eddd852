//! When a journal write fails: what it was about to record, kept in
//! memory, and the honest end of the operation recorded once the journal
//! takes writes again.

use super::{OpRecord, OpState, StepState, now};

/// What the journal was about to record when a write failed (disk full,
/// the database locked by another process): the end of a step with the
/// facts that went with it, or an operation's state. Kept in memory so the
/// operation can be recorded honestly once the journal takes writes again
/// ([`OpRecord::settled`], [`Journal::settle`](super::Journal::settle)).
#[derive(Debug, Clone, Default)]
pub struct Unsaved {
    /// Step ends not written, in the order they happened (a leave and the
    /// reset bound to it can both be here).
    pub(super) step_ends: Vec<UnsavedEnd>,
    pub(super) facts: Option<serde_json::Value>,
    pub(super) state: Option<OpState>,
}

#[derive(Debug, Clone)]
pub(super) struct UnsavedEnd {
    pub(super) index: usize,
    pub(super) state: StepState,
    pub(super) duration_ms: u64,
    pub(super) detail: Option<String>,
}

impl Unsaved {
    /// The facts the failed write carried (a snapshot's path, say).
    pub fn facts(&self) -> Option<&serde_json::Value> {
        self.facts.as_ref()
    }

    /// The same without its facts: for files they name that were moved
    /// aside, so the record never names a file that is not there.
    pub fn without_facts(mut self) -> Unsaved {
        self.facts = None;
        self
    }
}

impl OpRecord {
    /// This record (the journal's, of an operation whose run ended with a
    /// journal write failing for `reason`) as it is to be recorded: the
    /// unsaved step end and facts applied, and an honest end state. Every
    /// step done: succeeded (only the final state was lost). A step failed,
    /// or nothing destructive started: failed, a step in flight marked
    /// failed. A destructive step started or done: needs-attention, a step
    /// in flight left running so that `resume` reconciles it with the
    /// cluster. The reason is in the detail of the step it concerns (the
    /// one in flight, else the next one). A record no longer running is
    /// returned as it is.
    pub fn settled(&self, reason: &str, unsaved: Option<&Unsaved>) -> OpRecord {
        let mut record = self.clone();
        if record.state != OpState::Running {
            return record;
        }
        let now = now();
        let lost = format!("the journal could not record this: {reason}");
        let unsaved = unsaved.cloned().unwrap_or_default();
        let mut noted = false;
        for end in &unsaved.step_ends {
            let Some(step) = record.steps.get_mut(end.index) else {
                continue;
            };
            step.state = end.state;
            if step.started.is_none() {
                step.started = Some(now.clone());
            }
            step.finished = Some(now.clone());
            step.duration_ms = Some(end.duration_ms);
            step.detail = Some(match &end.detail {
                Some(detail) if !detail.is_empty() => format!("{detail}; {lost}"),
                _ => lost.clone(),
            });
            noted = true;
        }
        if let Some(facts) = unsaved.facts {
            record.facts = facts;
        }
        let steps = &record.steps;
        let state = match unsaved.state.filter(|s| *s != OpState::Running) {
            Some(intended) => intended,
            None if steps
                .iter()
                .all(|s| matches!(s.state, StepState::Done | StepState::Skipped)) =>
            {
                OpState::Succeeded
            }
            None if steps.iter().any(|s| s.state == StepState::Failed) => OpState::Failed,
            None if steps
                .iter()
                .any(|s| s.destructive && s.state != StepState::Pending) =>
            {
                OpState::NeedsAttention
            }
            None => OpState::Failed,
        };
        for step in &mut record.steps {
            if step.state == StepState::Running {
                if state != OpState::NeedsAttention {
                    step.state = StepState::Failed;
                    step.finished = Some(now.clone());
                }
                step.detail = Some(format!("in flight when {lost}"));
                noted = true;
            }
        }
        if !noted
            && state != OpState::Succeeded
            && let Some(next) = record
                .steps
                .iter_mut()
                .find(|s| s.state == StepState::Pending)
        {
            next.detail = Some(format!("not started: {lost}"));
        }
        record.state = state;
        record.updated = now;
        record
    }
}
