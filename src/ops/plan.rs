//! A plan: the typed steps an operation will take, the facts its preflight
//! found, and a fingerprint of both with the spec, so a plan confirmed in
//! one place (a terminal talking to a daemon) is run only while the cluster
//! still matches it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::apply::{ApplyFacts, ApplyStep};
use super::defrag::{DefragFacts, DefragStep};
use super::drill::{DrillFacts, DrillStep};
use super::fresh::{Check, CheckKind};
use super::join::{JoinFacts, JoinStep};
use super::lock::ClusterLock;
use super::migrate::{MigrateFacts, MigrateStep};
use super::restore::{RestoreFacts, RestoreStep};
use super::retire::{RetireFacts, RetireStep};
use super::snapshot::{SnapshotFacts, SnapshotStep};
use super::upgrade::{UpgradeFacts, UpgradeStep};
use super::{OpKind, OpSpec, OpsError};

/// What every operation's step enum says about its steps.
pub(crate) trait StepInfo {
    /// The step's name (`snapshot`, `leave`, `try`, ...), never a node.
    fn name(&self) -> &'static str;
    /// Whether it changes the cluster.
    fn destructive(&self) -> bool;
    /// What must hold right before it is sent: the check the engine runs
    /// then, in the same process, every time it is sent (`Some` exactly
    /// for the destructive steps; a test over every step holds them to it).
    fn precondition(&self) -> Option<CheckKind>;
    /// The node it acts on, when the operation has several.
    fn node(&self) -> Option<&str> {
        None
    }
    /// Whether the next step follows at once, with no journal write
    /// between them (a leave and its reset).
    fn bound_to_next(&self) -> bool {
        false
    }
    /// Whether the cluster cannot be put back as it was once this step
    /// ran (a leave, a reset): a failure from here on needs attention.
    fn point_of_no_return(&self) -> bool {
        false
    }
}

/// One step of any operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Step {
    /// A step of a snapshot.
    Snapshot(SnapshotStep),
    /// A step of a retire.
    Retire(RetireStep),
    /// A step of a join.
    Join(JoinStep),
    /// A step of a migration.
    Migrate(MigrateStep),
    /// A step of an apply.
    Apply(ApplyStep),
    /// A step of a drill.
    Drill(DrillStep),
    /// A step of a defragmentation.
    Defrag(DefragStep),
    /// A step of an upgrade.
    Upgrade(UpgradeStep),
    /// A step of a restore.
    Restore(RestoreStep),
}

impl Step {
    fn info(&self) -> &dyn StepInfo {
        match self {
            Step::Snapshot(s) => s,
            Step::Retire(s) => s,
            Step::Join(s) => s,
            Step::Migrate(s) => s,
            Step::Apply(s) => s,
            Step::Drill(s) => s,
            Step::Defrag(s) => s,
            Step::Upgrade(s) => s,
            Step::Restore(s) => s,
        }
    }

    /// Its name (`snapshot`, `leave`, `try`, ...).
    pub fn name(&self) -> &'static str {
        self.info().name()
    }

    /// The node it acts on, when the operation has several (apply).
    pub fn node(&self) -> Option<&str> {
        self.info().node()
    }

    /// Whether it changes the cluster.
    pub fn destructive(&self) -> bool {
        self.info().destructive()
    }

    /// The check the engine runs right before it is sent (destructive
    /// steps only).
    pub fn precondition(&self) -> Option<CheckKind> {
        self.info().precondition()
    }

    /// Its precondition with the subject `facts` give it; `None` for a
    /// step that changes nothing, an error for a destructive one whose
    /// check cannot be built (a fact missing, facts of another kind).
    pub(crate) fn check(&self, facts: &Facts) -> Result<Option<Check>, OpsError> {
        let check = match (self, facts) {
            (Step::Retire(s), Facts::Retire(f)) => s.check(f),
            (Step::Migrate(s), Facts::Migrate(f)) => s.check(f),
            (Step::Join(s), Facts::Join(f)) => s.check(f)?,
            (Step::Apply(s), Facts::Apply(f)) => s.check(f)?,
            (Step::Defrag(s), Facts::Defrag(f)) => s.check(f)?,
            (Step::Upgrade(s), Facts::Upgrade(f)) => s.check(f)?,
            (Step::Restore(s), Facts::Restore(f)) => s.check(f),
            (Step::Snapshot(_) | Step::Drill(_), _) => None,
            _ => None,
        };
        let declared = self.precondition();
        if check.as_ref().map(Check::kind) != declared {
            return Err(OpsError::step(
                &self.label(),
                format!(
                    "its precondition {} cannot be built from the operation's facts; nothing was sent",
                    declared.map_or("(none)".into(), |k| k.to_string())
                ),
            ));
        }
        Ok(check)
    }

    /// Whether the next step follows it at once, with no journal write
    /// between them.
    pub fn bound_to_next(&self) -> bool {
        self.info().bound_to_next()
    }

    /// Whether a failure once it ran needs attention.
    pub fn point_of_no_return(&self) -> bool {
        self.info().point_of_no_return()
    }

    /// Its name, with its node when it has one (`try 10.5.0.2`).
    pub fn label(&self) -> String {
        label(self.name(), self.node())
    }
}

/// `NAME` or `NAME NODE`.
pub(crate) fn label(name: &str, node: Option<&str>) -> String {
    match node {
        Some(node) => format!("{name} {node}"),
        None => name.to_string(),
    }
}

/// What a preflight found and the steps record as they run, per operation.
/// A fact a step needs and does not find is an error, never a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Facts {
    /// A snapshot's.
    Snapshot(SnapshotFacts),
    /// A retire's.
    Retire(RetireFacts),
    /// A join's.
    Join(JoinFacts),
    /// A migration's.
    Migrate(MigrateFacts),
    /// An apply's.
    Apply(ApplyFacts),
    /// A drill's.
    Drill(DrillFacts),
    /// A defragmentation's.
    Defrag(DefragFacts),
    /// An upgrade's.
    Upgrade(UpgradeFacts),
    /// A restore's.
    Restore(RestoreFacts),
}

/// A fact that a step needs, or the error naming it.
pub(crate) fn need<'a, T>(fact: &'a Option<T>, name: &str) -> Result<&'a T, OpsError> {
    fact.as_ref()
        .ok_or_else(|| OpsError::MissingFact(name.to_string()))
}

/// One planned step.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct PlannedStep {
    /// Its name.
    pub name: &'static str,
    /// The node it acts on, when the operation has several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// What it will do, in the cluster's terms.
    pub description: String,
    /// Whether it changes the cluster.
    pub destructive: bool,
    /// The typed step.
    #[serde(skip)]
    pub step: Step,
}

impl PlannedStep {
    /// `step`, described.
    pub(crate) fn new(step: Step, description: String) -> PlannedStep {
        PlannedStep {
            name: step.name(),
            node: step.node().map(str::to_string),
            description,
            destructive: step.destructive(),
            step,
        }
    }
}

/// What an operation will do, from its preflight; nothing has changed yet.
/// While it is alive it holds the cluster's lock (taken before the
/// preflight), so no other operation starts between the plan shown and its
/// run.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Plan {
    /// The id the operation will be journaled under.
    pub id: String,
    /// The kind.
    pub kind: OpKind,
    /// The operation and its options, as journaled.
    pub spec: OpSpec,
    /// The steps, in order.
    pub steps: Vec<PlannedStep>,
    /// What the preflight found worth saying (e.g. an even member count).
    pub notes: Vec<String>,
    /// Facts the steps start from (node addresses, member ids).
    pub facts: Facts,
    /// sha256 (hex) of what a confirmation is about: the spec, the steps
    /// and their order, the facts (less numbers that change by themselves,
    /// such as database sizes) and the cluster as read by the preflight
    /// (members, roles, health, leader): equal plans of an unchanged
    /// cluster have equal fingerprints, and a busy cluster's growing
    /// database does not change them.
    pub fingerprint: String,
    #[serde(skip)]
    pub(crate) lock: Option<Arc<ClusterLock>>,
    /// The cluster lock, when taken (an operation that may change the
    /// cluster).
    #[serde(skip)]
    pub(crate) cluster_lock: Option<super::cluster_lock::ClusterLockHold>,
}

impl Plan {
    /// A plan of `spec`, fingerprinted over `basis` (the cluster as read).
    pub(crate) fn new(
        spec: OpSpec,
        steps: Vec<PlannedStep>,
        notes: Vec<String>,
        facts: Facts,
        basis: &str,
    ) -> Plan {
        let mut plan = Plan {
            id: String::new(),
            kind: spec.kind(),
            spec,
            steps,
            notes,
            facts,
            fingerprint: String::new(),
            lock: None,
            cluster_lock: None,
        };
        plan.fingerprint = plan.digest(basis);
        plan
    }

    /// What a confirmation is about: the operation, its typed steps in
    /// order (each with its node), the facts they start from less the
    /// numbers that change by themselves (a defragmentation's database
    /// sizes), and the cluster as read (members, roles, health, leader).
    /// Descriptions and notes are words about these, often with those
    /// numbers in them, and are left out.
    fn digest(&self, basis: &str) -> String {
        let mut hasher = sha2::Sha256::new();
        let steps: Vec<_> = self.steps.iter().map(|s| &s.step).collect();
        let facts = match &self.facts {
            Facts::Defrag(f) => serde_json::to_string(&Facts::Defrag(f.without_sizes())),
            other => serde_json::to_string(other),
        };
        for part in [
            serde_json::to_string(&self.spec),
            facts,
            serde_json::to_string(&steps),
        ] {
            hasher.update(part.unwrap_or_default().as_bytes());
            hasher.update([0]);
        }
        hasher.update(basis.as_bytes());
        hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Whether any step changes the cluster (a confirmation is due).
    pub fn is_destructive(&self) -> bool {
        self.steps.iter().any(|s| s.destructive)
    }

    /// Lets the cluster's lock go (the plan stays readable, and runs only
    /// after taking the lock again).
    pub fn release(&mut self) {
        self.lock = None;
        self.cluster_lock = None;
    }

    /// How the plan holds the cluster lock: in the Lease, or without one
    /// (as told); `None` when it holds none (it changes nothing, or it was
    /// only planned to be shown).
    pub fn cluster_lock(&self) -> Option<&super::ClusterLockRecord> {
        self.cluster_lock.as_ref().map(|hold| &hold.record)
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
