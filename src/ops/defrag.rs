//! `defrag`: gives back the space etcd's members keep after data was
//! deleted and compacted, one member at a time, without risking quorum.
//!
//! A member's database file only grows; deleted and compacted revisions
//! leave free pages that only a defragmentation returns, and while it runs
//! the member answers nothing (etcd rewrites the whole file). So: members
//! whose in-use/size ratio is below the threshold (or all), followers
//! first and the leader last, after handing its leadership over; before
//! each one every other voter must be healthy, and after it the member
//! must answer healthy and caught up again before the next. A NOSPACE
//! alarm found at plan time is disarmed only after the defragmentations
//! that freed the space. The result reports the bytes reclaimed per member.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::cluster::{ClusterView, VOTER_CALL_TIMEOUT, member_address};
use super::fresh::{Check, CheckKind, Guard, PlannedNode, Voters};
use super::plan::{Facts, Plan, PlannedStep, Step, StepInfo};
use super::{OpSpec, Ops, OpsError, Outcome, Refusal};
use crate::client::{AlarmType, EtcdMember, MemberId};

/// Options of a defragmentation ([`OpSpec::Defrag`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DefragOptions {
    /// The members to consider, by address or hostname (empty: every
    /// voter).
    #[serde(default)]
    pub nodes: Vec<String>,
    /// A member is defragmented when its in-use/size ratio is below this
    /// (default [`DefragOptions::DEFAULT_THRESHOLD`]).
    pub threshold: f64,
    /// Defragment every member considered, whatever its ratio.
    #[serde(default)]
    pub all: bool,
}

impl DefragOptions {
    /// Half of the file unused: worth a rewrite.
    pub const DEFAULT_THRESHOLD: f64 = 0.5;

    /// Every voter below the default threshold.
    pub fn new() -> DefragOptions {
        DefragOptions {
            nodes: Vec::new(),
            threshold: DefragOptions::DEFAULT_THRESHOLD,
            all: false,
        }
    }
}

// The threshold is never NaN once planned (refused outside (0, 1]), so
// equality is an equivalence, as `OpSpec: Eq` needs.
impl Eq for DefragOptions {}

impl Default for DefragOptions {
    fn default() -> Self {
        DefragOptions::new()
    }
}

/// What a step of a defragmentation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DefragPhase {
    /// Read the cluster again: every voter healthy.
    Check,
    /// Hand the leadership over (the leader's turn comes last).
    Forfeit,
    /// Defragment the member, then wait until it is healthy and caught up.
    Defrag,
    /// Disarm the NOSPACE alarm the plan found, now that space is free.
    Disarm,
}

/// One step of a defragmentation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefragStep {
    /// What it does.
    pub phase: DefragPhase,
    /// The member's address ("" for the cluster-wide check).
    pub node: String,
}

impl StepInfo for DefragStep {
    fn name(&self) -> &'static str {
        match self.phase {
            DefragPhase::Check => "check",
            DefragPhase::Forfeit => "forfeit",
            DefragPhase::Defrag => "defrag",
            DefragPhase::Disarm => "disarm",
        }
    }

    fn destructive(&self) -> bool {
        // A defragmentation blocks the member while it runs, a forfeit
        // moves the leader, a disarm lets writes in again: each asks first.
        !matches!(self.phase, DefragPhase::Check)
    }

    fn node(&self) -> Option<&str> {
        (!self.node.is_empty()).then_some(self.node.as_str())
    }

    fn precondition(&self) -> Option<CheckKind> {
        (!matches!(self.phase, DefragPhase::Check)).then_some(CheckKind::VotersHealthy)
    }
}

impl DefragStep {
    /// Its precondition with its subject: every voter healthy (a NOSPACE
    /// alarm aside), but the member a defragmentation takes out for its
    /// duration; the member still the planned one.
    pub(crate) fn check(&self, facts: &DefragFacts) -> Result<Option<Check>, OpsError> {
        if self.precondition().is_none() {
            return Ok(None);
        }
        let member = member_at(facts, &self.node, self.name())?;
        Ok(Some(Check::VotersHealthy(Voters {
            node: Some(PlannedNode {
                address: member.address.clone(),
                hostname: member.hostname.clone(),
                member_id: Some(member.member_id),
            }),
            except: (self.phase == DefragPhase::Defrag).then_some(member.member_id),
            nospace_ok: true,
        })))
    }
}

/// A member as the plan read it, and what its defragmentation gave back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DefragMember {
    /// Its hostname.
    pub hostname: String,
    /// Its address.
    pub address: String,
    /// Its member id.
    pub member_id: MemberId,
    /// Its database file's size at plan time, bytes.
    pub db_size: i64,
    /// The part of it in use, bytes.
    pub db_size_in_use: i64,
    /// Whether it led at plan time.
    pub leads: bool,
    /// The file's size after its defragmentation.
    #[serde(default)]
    pub db_size_after: Option<i64>,
}

impl DefragFacts {
    /// These facts with every database size zeroed: a plan's fingerprint
    /// covers the members and their order, not the sizes, which a busy
    /// cluster changes every second.
    pub(crate) fn without_sizes(&self) -> DefragFacts {
        let mut facts = self.clone();
        for m in &mut facts.members {
            m.db_size = 0;
            m.db_size_in_use = 0;
            m.db_size_after = None;
        }
        facts
    }
}

impl DefragMember {
    /// Bytes given back, once defragmented.
    pub fn reclaimed(&self) -> Option<i64> {
        self.db_size_after.map(|after| self.db_size - after)
    }

    fn ratio(&self) -> f64 {
        if self.db_size <= 0 {
            return 1.0;
        }
        self.db_size_in_use as f64 / self.db_size as f64
    }
}

/// What a defragmentation's preflight found and its steps recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DefragFacts {
    /// The members to defragment, in order (the leader last).
    pub members: Vec<DefragMember>,
    /// Members with a NOSPACE alarm at plan time.
    #[serde(default)]
    pub nospace: Vec<MemberId>,
}

/// How long one member's defragmentation may take (etcd rewrites the whole
/// file; 8 GiB, etcd's largest quota, takes minutes on a slow disk).
const DEFRAG_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a member may take to answer healthy and catch up afterwards.
const RECOVER_TIMEOUT: Duration = Duration::from_secs(120);

/// Raft entries a member may trail the others by to count as caught up.
const CAUGHT_UP: u64 = 100;

/// Whether every error in a status is the NOSPACE alarm (which is why one
/// defragments, so it does not make the member unfit).
fn only_nospace(errors: &[String]) -> bool {
    errors.iter().all(|e| e.contains("NOSPACE"))
}

/// The voters not healthy in `view`, a NOSPACE alarm excepted.
pub(super) fn unfit(view: &ClusterView, except: Option<MemberId>) -> Vec<String> {
    let nospace_only = |id: MemberId| {
        matches!(
            view.statuses.iter().find(|(m, _)| m.id == id),
            Some((_, Ok(s))) if !s.is_learner && only_nospace(&s.errors)
        )
    };
    view.voters()
        .filter(|m| Some(m.id) != except && !view.healthy(m.id) && !nospace_only(m.id))
        .map(|m| format!("{} ({})", m.hostname, view.unhealthy_reason(m.id)))
        .collect()
}

fn bytes(n: i64) -> String {
    let n = n as f64;
    if n.abs() >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", n / (1024.0 * 1024.0))
    } else {
        format!("{:.1} KiB", n / 1024.0)
    }
}

/// A member's database size before and after its defragmentation, in
/// words: the bytes given back, or that it grew while the defragmentation
/// ran (writes went on; etcd gave back what it could), never a negative
/// reclaim.
fn size_change(hostname: &str, before: i64, after: i64) -> String {
    if after > before {
        return format!(
            "{hostname}: {} -> {}: the database grew by {} while it ran (writes went on), nothing to report as reclaimed",
            bytes(before),
            bytes(after),
            bytes(after - before)
        );
    }
    format!(
        "{hostname}: {} -> {}, {} reclaimed",
        bytes(before),
        bytes(after),
        bytes(before - after)
    )
}

impl Ops {
    /// Plans a defragmentation: the cluster read, every voter healthy (a
    /// NOSPACE alarm aside), no learner catching up, the lists agreeing;
    /// the members below the threshold in order, the leader last.
    pub(super) async fn plan_defrag(&self, options: &DefragOptions) -> Result<Plan, OpsError> {
        if !(options.threshold > 0.0 && options.threshold <= 1.0) {
            return Err(Refusal::BadThreshold {
                value: options.threshold.to_string(),
            }
            .into());
        }
        let view = self.read_view().await?;
        if let Some(learner) = view.members.iter().find(|m| m.is_learner) {
            return Err(Refusal::LearnerCatchingUp {
                learner: learner.hostname.clone(),
            }
            .into());
        }
        if !view.disagreements.is_empty() {
            return Err(Refusal::ListsDisagree {
                details: view.disagreements.clone(),
            }
            .into());
        }
        let unhealthy = unfit(&view, None);
        if !unhealthy.is_empty() {
            return Err(Refusal::UnhealthyVoters { voters: unhealthy }.into());
        }
        let mut considered: Vec<&EtcdMember> = Vec::new();
        for node in &options.nodes {
            let Some(member) = view.find(node) else {
                return Err(Refusal::NotMember {
                    node: node.clone(),
                    members: super::cluster::names(&view.members),
                }
                .into());
            };
            if !considered.iter().any(|m| m.id == member.id) {
                considered.push(member);
            }
        }
        if options.nodes.is_empty() {
            considered = view.voters().collect();
        }
        let leader = view.leader();
        let mut members = Vec::new();
        let mut notes = Vec::new();
        for member in considered {
            let Some(address) = member_address(member) else {
                return Err(Refusal::NoAddress {
                    member: member.hostname.clone(),
                }
                .into());
            };
            let Some((_, Ok(status))) = view.statuses.iter().find(|(m, _)| m.id == member.id)
            else {
                continue;
            };
            let planned = DefragMember {
                hostname: member.hostname.clone(),
                address,
                member_id: member.id,
                db_size: status.db_size,
                db_size_in_use: status.db_size_in_use,
                leads: leader == Some(member.id),
                db_size_after: None,
            };
            let ratio = planned.ratio();
            if options.all || ratio < options.threshold {
                members.push(planned);
            } else {
                notes.push(format!(
                    "{}: {:.0}% of {} in use, not below {:.0}%: left as is",
                    planned.hostname,
                    ratio * 100.0,
                    bytes(planned.db_size),
                    options.threshold * 100.0
                ));
            }
        }
        // Followers first, the leader last.
        members.sort_by_key(|m| m.leads);
        let alarms = self.client.etcd_alarm_list().await?;
        let nospace: Vec<MemberId> = alarms
            .iter()
            .filter(|a| a.alarm == AlarmType::Nospace)
            .map(|a| a.member_id)
            .collect();
        if members.is_empty() {
            notes.push("no member to defragment".into());
        }
        if !nospace.is_empty() && members.is_empty() {
            notes.push(
                "a NOSPACE alarm is raised, but no member is defragmented: it stays armed".into(),
            );
        }
        let facts = DefragFacts {
            members,
            nospace: if notes.iter().any(|n| n.contains("stays armed")) {
                Vec::new()
            } else {
                nospace
            },
        };
        let steps = defrag_steps(&facts);
        Ok(Plan::new(
            OpSpec::Defrag(options.clone()),
            steps,
            notes,
            Facts::Defrag(facts),
            &view.basis(),
        ))
    }

    pub(super) async fn defrag_step(
        &self,
        step: &DefragStep,
        facts: &mut DefragFacts,
        guard: &mut Guard<'_>,
    ) -> Result<Outcome, OpsError> {
        let name = step.name();
        match step.phase {
            DefragPhase::Check => {
                let view = self.read_view().await?;
                let unhealthy = unfit(&view, None);
                if !unhealthy.is_empty() {
                    return Err(OpsError::step(
                        name,
                        Refusal::UnhealthyVoters { voters: unhealthy },
                    ));
                }
                Ok(Outcome::done(format!(
                    "{} healthy voters",
                    view.voters().count()
                )))
            }
            DefragPhase::Forfeit => {
                let member = member_at(facts, &step.node, name)?.clone();
                self.hand_over(&member.address, &member.hostname, member.member_id, guard)
                    .await
            }
            DefragPhase::Defrag => {
                let member = member_at(facts, &step.node, name)?.clone();
                let after = self.defragment(&member, name, guard).await?;
                let slot = facts
                    .members
                    .iter_mut()
                    .find(|m| m.address == step.node)
                    .expect("found above");
                slot.db_size_after = Some(after);
                Ok(Outcome::done(format!(
                    "{}; healthy and caught up",
                    size_change(&member.hostname, member.db_size, after)
                )))
            }
            DefragPhase::Disarm => {
                let target = self.client.node(step.node.as_str());
                let fresh = guard.proof(self).await?;
                let disarmed = self.send_alarm_disarm(fresh, &target).await?;
                let left = target.etcd_alarm_list().await?;
                if let Some(alarm) = left.iter().find(|a| a.alarm == AlarmType::Nospace) {
                    return Err(OpsError::step(
                        name,
                        format!(
                            "member {} raised NOSPACE again: the database is still over its quota",
                            alarm.member_id
                        ),
                    ));
                }
                Ok(Outcome::done(format!("disarmed {disarmed} alarm(s)")))
            }
        }
    }

    /// Moves the leadership away from member `id` (`hostname` at
    /// `address`) if it leads, and waits until another member leads.
    pub(super) async fn hand_over(
        &self,
        address: &str,
        hostname: &str,
        id: MemberId,
        guard: &mut Guard<'_>,
    ) -> Result<Outcome, OpsError> {
        let step = &super::plan::label("forfeit", Some(address));
        let node = self
            .client
            .with_call_timeout(VOTER_CALL_TIMEOUT)
            .node(address);
        let fresh = guard.proof(self).await?;
        let moved = self.send_forfeit(fresh, &node).await?;
        let Some(new) = moved else {
            return Ok(Outcome::skipped(format!("{hostname} does not lead now")));
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(status) = node.etcd_status().await
                && status.leader.0 != 0
                && status.leader != id
            {
                return Ok(Outcome::done(format!("{new} leads now")));
            }
            if Instant::now() > deadline {
                return Err(OpsError::step(
                    step,
                    "no other member took the lead within 30s",
                ));
            }
            OpsError::poll_stop(&self.stop)?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The member defragmented (its check found every other voter
    /// healthy: it answers nothing while it runs) and awaited until it
    /// answers healthy and caught up. Returns its size after.
    async fn defragment(
        &self,
        member: &DefragMember,
        step: &str,
        guard: &mut Guard<'_>,
    ) -> Result<i64, OpsError> {
        let node = self
            .client
            .with_call_timeout(DEFRAG_TIMEOUT)
            .node(member.address.as_str());
        let fresh = guard.proof(self).await?;
        self.send_defragment(fresh, &node).await?;
        self.await_caught_up(member, step).await
    }

    async fn await_caught_up(&self, member: &DefragMember, step: &str) -> Result<i64, OpsError> {
        let deadline = Instant::now() + RECOVER_TIMEOUT;
        let mut last;
        loop {
            match self.read_view().await {
                Ok(view) => {
                    let top = view
                        .statuses
                        .iter()
                        .filter_map(|(_, s)| s.as_ref().ok().map(|s| s.raft_index))
                        .max()
                        .unwrap_or(0);
                    match view.statuses.iter().find(|(m, _)| m.id == member.member_id) {
                        Some((_, Ok(s)))
                            if only_nospace(&s.errors)
                                && top.saturating_sub(s.raft_index) <= CAUGHT_UP =>
                        {
                            return Ok(s.db_size);
                        }
                        Some((_, Ok(s))) => {
                            last = format!(
                                "raft index {} of {top}; {}",
                                s.raft_index,
                                s.errors.join("; ")
                            )
                        }
                        Some((_, Err(e))) => last = e.to_string(),
                        None => last = "no longer listed".into(),
                    }
                }
                Err(e) => last = e.to_string(),
            }
            if Instant::now() > deadline {
                return Err(OpsError::step(
                    step,
                    format!(
                        "{} was defragmented but is not healthy and caught up after {} s: {last}",
                        member.hostname,
                        RECOVER_TIMEOUT.as_secs()
                    ),
                ));
            }
            OpsError::poll_stop(&self.stop)?;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

fn member_at<'a>(
    facts: &'a DefragFacts,
    address: &str,
    step: &str,
) -> Result<&'a DefragMember, OpsError> {
    facts
        .members
        .iter()
        .find(|m| m.address == address)
        .ok_or_else(|| OpsError::step(step, format!("{address} is not in the plan")))
}

/// The steps: a check, then per member (the leader's preceded by a
/// forfeit) a defragmentation, then the disarm when an alarm was found.
fn defrag_steps(facts: &DefragFacts) -> Vec<PlannedStep> {
    let mut steps = vec![PlannedStep::new(
        Step::Defrag(DefragStep {
            phase: DefragPhase::Check,
            node: String::new(),
        }),
        "read the cluster again: every voter healthy (a NOSPACE alarm aside)".into(),
    )];
    for m in &facts.members {
        if m.leads {
            steps.push(PlannedStep::new(
                Step::Defrag(DefragStep {
                    phase: DefragPhase::Forfeit,
                    node: m.address.clone(),
                }),
                format!("{} leads: hand leadership over before its turn", m.hostname),
            ));
        }
        steps.push(PlannedStep::new(
            Step::Defrag(DefragStep {
                phase: DefragPhase::Defrag,
                node: m.address.clone(),
            }),
            format!(
                "defragment {} ({}, {:.0}% of {} in use) once every other voter is healthy, then wait until it is healthy and caught up",
                m.hostname,
                m.address,
                m.ratio() * 100.0,
                bytes(m.db_size)
            ),
        ));
    }
    if let (false, Some(last)) = (facts.nospace.is_empty(), facts.members.last()) {
        steps.push(PlannedStep::new(
            Step::Defrag(DefragStep {
                phase: DefragPhase::Disarm,
                node: last.address.clone(),
            }),
            format!(
                "disarm the NOSPACE alarm of member(s) {}, now that space is free",
                facts
                    .nospace
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    steps
}

#[cfg(test)]
#[path = "defrag_tests.rs"]
mod tests;
