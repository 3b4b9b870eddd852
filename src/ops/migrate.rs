//! `migrate --from OLD --to NEW`: moving the control plane to new machines
//! as one journaled operation. NEW joins (from maintenance mode when a configuration is
//! given) and becomes a healthy voter; only then is OLD retired, through
//! the retire's own checks and steps: verified snapshot, forfeit, leave,
//! reset at once, confirmation, silence.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::cluster::{member_address, names};
use super::fresh::{Check, CheckKind, Guard};
use super::join::{JoinFacts, JoinOptions, JoinStep, MaintenanceApply};
use super::plan::{Facts, Plan, PlannedStep, Step, StepInfo};
use super::policy::{check_removal, pick_source, unhealthy_voters};
use super::retire::{PlannedMember, RetireFacts, RetireOptions, RetireStep, default_wipe};
use super::spec::millis;
use super::{OpSpec, Ops, OpsError, Outcome, Refusal};

fn default_join_timeout() -> Duration {
    JoinOptions::DEFAULT_TIMEOUT
}

fn default_silence_timeout() -> Duration {
    RetireOptions::DEFAULT_SILENCE_TIMEOUT
}

/// Options of a migration ([`OpSpec::Migrate`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MigrateOptions {
    /// The node to retire: hostname or address.
    pub from: String,
    /// The node that takes its place: hostname or address.
    pub to: String,
    /// A configuration to apply to NEW in maintenance mode first.
    #[serde(default)]
    pub maintenance: Option<MaintenanceApply>,
    /// How long NEW may take to become a healthy voter.
    #[serde(
        default = "default_join_timeout",
        with = "millis",
        rename = "join_timeout_ms"
    )]
    pub join_timeout: Duration,
    /// Labels to wipe on OLD.
    #[serde(default = "default_wipe")]
    pub wipe: Vec<String>,
    /// Where the verified snapshot goes (`None`: the operations layer's
    /// snapshot directory).
    #[serde(default)]
    pub snapshot_dir: Option<PathBuf>,
    /// How long to wait for OLD to go silent.
    #[serde(
        default = "default_silence_timeout",
        with = "millis",
        rename = "silence_timeout_ms"
    )]
    pub silence_timeout: Duration,
    /// Renew a Lease through this endpoint during OLD's handover and report
    /// the failed renewals ([`RetireOptions::lease_probe`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_probe: Option<super::LeaseProbe>,
}

impl MigrateOptions {
    /// Migrate from `from` to `to` with the join's and the retire's
    /// defaults.
    pub fn new(from: impl Into<String>, to: impl Into<String>) -> MigrateOptions {
        let retire = RetireOptions::new(from);
        MigrateOptions {
            from: retire.node,
            to: to.into(),
            maintenance: None,
            join_timeout: JoinOptions::DEFAULT_TIMEOUT,
            wipe: retire.wipe,
            snapshot_dir: retire.snapshot_dir,
            silence_timeout: retire.silence_timeout,
            lease_probe: None,
        }
    }
}

/// The steps of a migration: the join's, a fresh check, the retire's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MigrateStep {
    /// A step of the join half.
    Join(JoinStep),
    /// The retire's checks again, with NEW voting.
    CheckRetire,
    /// A step of the retire half.
    Retire(RetireStep),
}

impl StepInfo for MigrateStep {
    fn name(&self) -> &'static str {
        match self {
            MigrateStep::Join(s) => s.name(),
            MigrateStep::CheckRetire => "check-retire",
            MigrateStep::Retire(s) => s.name(),
        }
    }

    fn destructive(&self) -> bool {
        match self {
            MigrateStep::Join(s) => s.destructive(),
            MigrateStep::CheckRetire => false,
            MigrateStep::Retire(s) => s.destructive(),
        }
    }

    fn bound_to_next(&self) -> bool {
        matches!(self, MigrateStep::Retire(s) if s.bound_to_next())
    }

    fn point_of_no_return(&self) -> bool {
        match self {
            MigrateStep::Join(s) => s.point_of_no_return(),
            MigrateStep::CheckRetire => false,
            MigrateStep::Retire(s) => s.point_of_no_return(),
        }
    }

    fn precondition(&self) -> Option<CheckKind> {
        match self {
            MigrateStep::Join(s) => s.precondition(),
            MigrateStep::CheckRetire => None,
            MigrateStep::Retire(s) => s.precondition(),
        }
    }
}

impl MigrateStep {
    /// Its precondition with its subject: its half's.
    pub(crate) fn check(self, facts: &MigrateFacts) -> Option<Check> {
        match self {
            MigrateStep::Join(s) => s.check(&facts.join).ok().flatten(),
            MigrateStep::CheckRetire => None,
            MigrateStep::Retire(s) => s.check(&facts.retire),
        }
    }
}

/// A migration's facts: its join half's and its retire half's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MigrateFacts {
    /// The join half.
    #[serde(flatten)]
    pub join: JoinFacts,
    /// The retire half.
    #[serde(flatten)]
    pub retire: RetireFacts,
}

impl MigrateStep {
    fn describe(self, f: &MigrateFacts) -> String {
        match self {
            MigrateStep::Join(s) => s.describe(&f.join),
            MigrateStep::CheckRetire => format!(
                "the retire's checks on {} with {} voting: quorum after removal, no learner, lists agree",
                f.retire.address, f.join.node
            ),
            MigrateStep::Retire(s) => s.describe(&f.retire),
        }
    }
}

impl Ops {
    /// Preflight of a migration: OLD must be a voting member and not the
    /// talosconfig's only endpoint, NEW must not be a member yet (it may
    /// be a learner already joining), every voter must be healthy and the
    /// lists agree, and every label to wipe must be a located volume of
    /// OLD. The quorum checks of the retire run again once NEW is
    /// a voter, before anything touches OLD.
    pub(super) async fn plan_migrate(&self, options: &MigrateOptions) -> Result<Plan, OpsError> {
        let view = self.read_view().await?;
        let (to, from) = (&options.to, &options.from);
        let Some(old) = view.find(from) else {
            return Err(Refusal::NotMember {
                node: from.clone(),
                members: names(&view.members),
            }
            .into());
        };
        if old.is_learner {
            return Err(Refusal::Learner { node: from.clone() }.into());
        }
        if view.find(to).is_some_and(|m| !m.is_learner) {
            return Err(Refusal::AlreadyVoter {
                node: to.clone(),
                old: from.clone(),
            }
            .into());
        }
        let address = member_address(old).unwrap_or_else(|| from.clone());
        self.refuse_only_endpoint(from, &address)?;
        if !view.disagreements.is_empty() {
            return Err(Refusal::ListsDisagree {
                details: view.disagreements.clone(),
            }
            .into());
        }
        let unhealthy = unhealthy_voters(&view, None);
        if !unhealthy.is_empty() {
            return Err(Refusal::UnhealthyVoters { voters: unhealthy }.into());
        }
        self.check_wipe_labels(&address, &options.wipe).await?;
        let join = self
            .join_facts(
                &view,
                to,
                options.join_timeout,
                options.maintenance.as_ref(),
            )
            .await?;
        let (wipe, wipe_note) = self.wipe_labels(&address, &options.wipe).await;
        let node_id = self.node_id_of(&address).await;
        let api_server_accepting = Some(super::retire::api_server_accepts(&address).await);
        let retire = RetireFacts {
            address,
            member: Some(PlannedMember {
                member_id: old.id,
                hostname: old.hostname.clone(),
            }),
            leads: None,
            dead: false,
            identity: Some(super::TargetIdentity { node_id }),
            source: None,
            wipe,
            snapshot_dir: self.snapshot_dir(options.snapshot_dir.as_ref()),
            silence_timeout: options.silence_timeout,
            snapshot: None,
            leave_to_reset_gap_ms: None,
            api_server_accepting,
            lease_probe: options.lease_probe.clone(),
            lease_renewals: None,
        };
        let facts = MigrateFacts { join, retire };
        let between = view.members.len() + usize::from(view.find(to).is_none());
        let mut notes = vec![format!(
            "between the join and the retire the cluster has {between} members{}",
            if between % 2 == 0 {
                format!(
                    ", an even count: it survives no more failures than {}, so the retire follows at once",
                    between - 1
                )
            } else {
                String::new()
            }
        )];
        if old.hostname != *from {
            notes.push(format!("{from} is member {} ({})", old.id, old.hostname));
        }
        notes.extend(wipe_note);
        let steps = facts
            .join
            .steps()
            .into_iter()
            .map(MigrateStep::Join)
            .chain([MigrateStep::CheckRetire])
            .chain(facts.retire.steps().into_iter().map(MigrateStep::Retire))
            .map(|s| PlannedStep::new(Step::Migrate(s), s.describe(&facts)))
            .collect();
        Ok(Plan::new(
            OpSpec::Migrate(options.clone()),
            steps,
            notes,
            Facts::Migrate(facts),
            &view.basis(),
        ))
    }

    pub(super) async fn migrate_step(
        &mut self,
        step: MigrateStep,
        facts: &mut MigrateFacts,
        guard: &mut Guard<'_>,
    ) -> Result<Outcome, OpsError> {
        match step {
            MigrateStep::Join(s) => self.join_step(s, &mut facts.join, guard).await,
            MigrateStep::CheckRetire => self.check_retire(&mut facts.retire).await,
            MigrateStep::Retire(s) => self.retire_step(s, &mut facts.retire, guard).await,
        }
    }

    pub(super) async fn reconcile_migrate(
        &mut self,
        step: MigrateStep,
        facts: &MigrateFacts,
    ) -> Result<Option<Outcome>, OpsError> {
        match step {
            MigrateStep::Join(s) => self.reconcile_join(s, &facts.join).await,
            MigrateStep::CheckRetire => Ok(None),
            MigrateStep::Retire(s) => self.reconcile_retire(s, &facts.retire).await,
        }
    }

    /// The retire's preflight, now that NEW votes: the same member, the
    /// quorum rules; records the snapshot source for the steps that follow.
    async fn check_retire(&self, facts: &mut RetireFacts) -> Result<Outcome, OpsError> {
        let planned = super::plan::need(&facts.member, "member")?.clone();
        let view = self.read_view().await?;
        let Some(old) = view.find_id_member(planned.member_id) else {
            return Err(OpsError::step(
                "check-retire",
                format!(
                    "{} (member {}) is no longer an etcd member",
                    planned.hostname, planned.member_id
                ),
            ));
        };
        check_removal(&view, old.id, &old.hostname)
            .map_err(|e| OpsError::step("check-retire", e))?;
        let source = pick_source(&view, Some(old.id))?;
        let detail = format!(
            "{} voters; the snapshot comes from {}",
            view.voters().count(),
            source.name
        );
        facts.leads = Some(view.leader() == Some(old.id));
        facts.source = Some(source);
        Ok(Outcome::done(detail))
    }
}
