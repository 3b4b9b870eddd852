//! `migrate --from OLD --to NEW`: the seeds' night as one journaled
//! operation. NEW joins (from maintenance mode when a configuration is
//! given) and becomes a healthy voter; only then is OLD retired, through
//! the retire's own checks and steps: verified snapshot, forfeit, leave,
//! reset at once, confirmation, silence.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use super::apply::sha256_hex;
use super::cluster::{ClusterView, member_address, names};
use super::join::MaintenanceApply;
use super::retire::check_quorum;
use super::snapshot::pick_source;
use super::{OpKind, Ops, OpsError, Outcome, Plan, PlannedStep, fact};

/// Options of [`Ops::plan_migrate`].
#[derive(Debug, Clone)]
pub struct MigrateOptions {
    /// The node to retire: hostname or address.
    pub from: String,
    /// The node that takes its place: hostname or address.
    pub to: String,
    /// A configuration to apply to NEW in maintenance mode first.
    pub maintenance: Option<MaintenanceApply>,
    /// How long NEW may take to become a healthy voter.
    pub join_timeout: Duration,
    /// Labels to wipe on OLD (default STATE and EPHEMERAL).
    pub wipe: Vec<String>,
    /// Where the verified snapshot goes.
    pub snapshot_dir: PathBuf,
    /// How long to wait for OLD to go silent.
    pub silence_timeout: Duration,
}

fn step(name: &str, description: String, destructive: bool) -> PlannedStep {
    PlannedStep {
        name: name.into(),
        description,
        destructive,
    }
}

impl Ops {
    /// Preflight of a migration: OLD must be a voting member and not the
    /// talosconfig's only endpoint, NEW must not be a member yet (it may
    /// be a learner already joining), every voter must be healthy and the
    /// lists agree. The quorum checks of the retire run again once NEW is
    /// a voter, before anything touches OLD.
    pub async fn plan_migrate(&self, options: &MigrateOptions) -> Result<Plan, OpsError> {
        let view = ClusterView::read(&self.client).await?;
        let refuse = |reason: String| Err(OpsError::Refused(reason));
        let Some(old) = view.find(&options.from) else {
            return refuse(format!(
                "{} is not an etcd member (members: {})",
                options.from,
                names(&view.members).join(", ")
            ));
        };
        if old.is_learner {
            return refuse(format!("{} is a learner, not a voter", options.from));
        }
        if view.find(&options.to).is_some_and(|m| !m.is_learner) {
            return refuse(format!(
                "{} is already a voting member: retire {} with `ops retire`",
                options.to, options.from
            ));
        }
        let address = member_address(old).unwrap_or_else(|| options.from.clone());
        self.refuse_only_endpoint(&options.from, &address)?;
        if !view.disagreements.is_empty() {
            return refuse(format!(
                "the members' lists disagree: {}",
                view.disagreements.join("; ")
            ));
        }
        let unhealthy: Vec<String> = view
            .voters()
            .filter(|m| !view.healthy(m.id))
            .map(|m| format!("{} ({})", m.hostname, view.unhealthy_reason(m.id)))
            .collect();
        if !unhealthy.is_empty() {
            return refuse(format!("voters are unhealthy: {}", unhealthy.join(", ")));
        }
        let wipe = if options.wipe.is_empty() {
            vec!["STATE".to_string(), "EPHEMERAL".to_string()]
        } else {
            options.wipe.clone()
        };
        let mut params = json!({
            "node": options.to,
            "from": options.from,
            "timeout_s": options.join_timeout.as_secs(),
            "wipe": wipe,
            "snapshot_dir": options.snapshot_dir,
            "silence_timeout_s": options.silence_timeout.as_secs(),
        });
        let mut steps = Vec::new();
        if let Some(m) = &options.maintenance {
            steps.push(self.preflight_maintenance(&view, &options.to, m).await?);
            params["config_path"] = json!(m.config_path);
            params["config_sha256"] = json!(sha256_hex(&m.config));
            params["cert_fingerprints"] = json!(m.cert_fingerprints);
        }
        let (to, from) = (&options.to, &options.from);
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
        steps.extend([
            step(
                "wait-voter",
                format!(
                    "wait up to {} s until {to} is a voting member and every member is healthy",
                    options.join_timeout.as_secs()
                ),
                false,
            ),
            step(
                "check-retire",
                format!("the retire's checks on {from} with {to} voting: quorum after removal, no learner, lists agree"),
                false,
            ),
            step(
                "snapshot",
                format!(
                    "verified snapshot from a surviving voter into {}",
                    options.snapshot_dir.display()
                ),
                false,
            ),
            step(
                "forfeit",
                format!("if {from} leads, hand leadership over and wait for a new leader"),
                true,
            ),
            step("leave", format!("EtcdLeaveCluster on {from} ({address})"), true),
            step(
                "reset",
                format!(
                    "reset {address} at once: wipe {}, no reboot, not graceful",
                    wipe.join(", ")
                ),
                true,
            ),
            step(
                "confirm",
                "a survivor no longer lists the member and every remaining member is healthy"
                    .into(),
                false,
            ),
            step(
                "wait-silent",
                format!("wait until {address}'s API stops answering"),
                false,
            ),
        ]);
        let mut facts = serde_json::Map::new();
        facts.insert("node".into(), json!(options.to));
        facts.insert("address".into(), json!(address));
        facts.insert("member_id".into(), json!(old.id.to_string()));
        Ok(Plan {
            kind: OpKind::Migrate,
            params,
            steps,
            notes,
            facts,
        })
    }

    pub(super) async fn migrate_step(
        &mut self,
        step: &str,
        facts: &mut serde_json::Map<String, serde_json::Value>,
    ) -> Result<Outcome, OpsError> {
        match step {
            "apply-config" | "wait-voter" => self.join_step(step, facts).await,
            "check-retire" => self.check_retire(facts).await,
            _ => self.retire_step(step, facts).await,
        }
    }

    /// The retire's preflight, now that NEW votes; records the snapshot
    /// source for the steps that follow.
    async fn check_retire(
        &self,
        facts: &mut serde_json::Map<String, serde_json::Value>,
    ) -> Result<Outcome, OpsError> {
        let from = facts
            .get("params")
            .and_then(|p| p["from"].as_str())
            .unwrap_or_default()
            .to_string();
        let view = ClusterView::read(&self.client).await?;
        let old = view.find(&from).ok_or_else(|| {
            OpsError::step(
                "check-retire",
                format!("{from} is no longer an etcd member"),
            )
        })?;
        if old.id.to_string() != fact(facts, "member_id") {
            return Err(OpsError::step(
                "check-retire",
                format!("{from} is now member {}, not the one planned", old.id),
            ));
        }
        check_quorum(&view, old.id, &old.hostname)
            .map_err(|e| OpsError::step("check-retire", e))?;
        let (source, source_address) = pick_source(&view, Some(old.id))?;
        facts.insert("source".into(), json!(source_address));
        Ok(Outcome::done(format!(
            "{} voters; the snapshot comes from {source}",
            view.voters().count()
        )))
    }
}
