//! `retire NODE`: the seeds' handover. Preflight refusals, a verified
//! snapshot from a surviving voter, forfeit when NODE leads, EtcdLeaveCluster
//! on NODE, Reset of NODE at once (its API server keeps accepting
//! connections without etcd after the leave, and KubePrism keeps sending it
//! traffic until it stops), confirmation through a survivor, and a wait
//! until NODE is silent.
//!
//! Nothing slow sits between the leave's answer and the reset: the reset
//! request and the connection are ready before the leave is sent, and the
//! only work in between is one journal commit. The survivors' confirmation
//! therefore comes after the reset; the leave's answer already means the
//! member was removed (upstream removes it before stopping etcd).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::cluster::{ClusterView, member_address, names};
use super::plan::{Facts, Plan, PlannedStep, Step, StepInfo, need};
use super::policy::{Source, check_removal, pick_source, unhealthy_voters};
use super::spec::millis;
use super::{OpSpec, Ops, OpsError, Outcome, Refusal};
use crate::client::{MemberId, ResetRequest, WipeMode};

pub(crate) use super::wipe::default_wipe;

fn default_silence_timeout() -> Duration {
    RetireOptions::DEFAULT_SILENCE_TIMEOUT
}

/// Options of a retire ([`OpSpec::Retire`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RetireOptions {
    /// The node to retire: hostname or address.
    pub node: String,
    /// Labels to wipe. The default (`STATE`, `EPHEMERAL`) gains `ETCD` at
    /// plan time when the node has that volume (Talos 1.14).
    #[serde(default = "default_wipe")]
    pub wipe: Vec<String>,
    /// The node already left etcd: only reset it.
    #[serde(default)]
    pub already_left: bool,
    /// Where the verified snapshot goes (`None`: the operations layer's
    /// snapshot directory).
    #[serde(default)]
    pub snapshot_dir: Option<PathBuf>,
    /// How long to wait for the node to go silent.
    #[serde(
        default = "default_silence_timeout",
        with = "millis",
        rename = "silence_timeout_ms"
    )]
    pub silence_timeout: Duration,
}

impl RetireOptions {
    /// How long a retired node may take to go silent, by default.
    pub const DEFAULT_SILENCE_TIMEOUT: Duration = Duration::from_secs(120);

    /// Retire `node` with the defaults: wipe STATE and EPHEMERAL (and ETCD
    /// where the node has it), the default snapshot directory and silence
    /// timeout.
    pub fn new(node: impl Into<String>) -> RetireOptions {
        RetireOptions {
            node: node.into(),
            wipe: default_wipe(),
            already_left: false,
            snapshot_dir: None,
            silence_timeout: Self::DEFAULT_SILENCE_TIMEOUT,
        }
    }
}

/// The steps of a retire (and of a migration's retire half).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetireStep {
    /// A verified snapshot from a surviving voter.
    Snapshot,
    /// Hand leadership over if the node leads.
    Forfeit,
    /// EtcdLeaveCluster on the node.
    Leave,
    /// Reset the node at once.
    Reset,
    /// A survivor no longer lists it; the rest are healthy.
    Confirm,
    /// Wait until its API stops answering.
    WaitSilent,
}

impl StepInfo for RetireStep {
    fn name(&self) -> &'static str {
        match self {
            RetireStep::Snapshot => "snapshot",
            RetireStep::Forfeit => "forfeit",
            RetireStep::Leave => "leave",
            RetireStep::Reset => "reset",
            RetireStep::Confirm => "confirm",
            RetireStep::WaitSilent => "wait-silent",
        }
    }

    fn destructive(&self) -> bool {
        matches!(
            self,
            RetireStep::Forfeit | RetireStep::Leave | RetireStep::Reset
        )
    }
}

/// The member a retire removes, as the preflight identified it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedMember {
    /// Its member id.
    pub member_id: MemberId,
    /// Its member name.
    pub hostname: String,
}

/// What a retire's preflight found and its steps recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RetireFacts {
    /// The node's address.
    pub address: String,
    /// Its member (`None`: it already left).
    pub member: Option<PlannedMember>,
    /// Whether it led at plan time (`None`: not known yet).
    pub leads: Option<bool>,
    /// The surviving voter the snapshot comes from (`None` until chosen).
    pub source: Option<Source>,
    /// The labels to wipe.
    pub wipe: Vec<String>,
    /// Where the snapshot goes (resolved).
    pub snapshot_dir: PathBuf,
    /// How long to wait for silence.
    #[serde(with = "millis", rename = "silence_timeout_ms")]
    pub silence_timeout: Duration,
    /// The verified snapshot, once taken.
    pub snapshot: Option<PathBuf>,
    /// Milliseconds between the leave's answer and the reset's.
    pub leave_to_reset_gap_ms: Option<f64>,
}

impl RetireFacts {
    /// The steps for these facts: the full handover of a member, or only
    /// the reset of a node that already left.
    pub(crate) fn steps(&self) -> Vec<RetireStep> {
        use RetireStep::*;
        if self.member.is_some() {
            vec![Snapshot, Forfeit, Leave, Reset, Confirm, WaitSilent]
        } else {
            vec![Reset, WaitSilent]
        }
    }

    fn member(&self) -> Result<&PlannedMember, OpsError> {
        need(&self.member, "member")
    }

    fn source(&self) -> Result<&Source, OpsError> {
        need(&self.source, "source")
    }
}

impl RetireStep {
    /// What the step does, in the cluster's terms.
    pub(crate) fn describe(self, f: &RetireFacts) -> String {
        let name = f
            .member
            .as_ref()
            .map_or(f.address.as_str(), |m| m.hostname.as_str());
        let address = &f.address;
        match self {
            RetireStep::Snapshot => match &f.source {
                Some(s) => format!(
                    "verified snapshot from surviving voter {} into {}",
                    s.name,
                    f.snapshot_dir.display()
                ),
                None => format!(
                    "verified snapshot from a surviving voter into {}",
                    f.snapshot_dir.display()
                ),
            },
            RetireStep::Forfeit => match f.leads {
                Some(true) => {
                    format!("{name} leads: hand leadership over and wait for a new leader")
                }
                Some(false) => format!("{name} does not lead: nothing to hand over"),
                None => format!("if {name} leads, hand leadership over and wait for a new leader"),
            },
            RetireStep::Leave => format!("EtcdLeaveCluster on {name} ({address})"),
            RetireStep::Reset => format!(
                "reset {address} at once: wipe {}, no reboot, not graceful",
                f.wipe.join(", ")
            ),
            RetireStep::Confirm => {
                "a survivor no longer lists the member and every remaining member is healthy".into()
            }
            RetireStep::WaitSilent => format!("wait until {address}'s API stops answering"),
        }
    }
}

impl Ops {
    /// Preflight of a retire: refuses (changing nothing) when the node is
    /// not a member (unless `already_left`), is the last voter, a learner is
    /// present, the member lists disagree, a remaining voter is unhealthy,
    /// the healthy voters left would be fewer than a quorum, or the node is
    /// the talosconfig's only endpoint, or a label to wipe names no located
    /// volume of the node.
    pub(super) async fn plan_retire(&self, options: &RetireOptions) -> Result<Plan, OpsError> {
        let view = ClusterView::read(&self.client).await?;
        let member = view.find(&options.node);
        let address = match member {
            Some(m) => member_address(m).unwrap_or_else(|| options.node.clone()),
            None => options.node.clone(),
        };
        self.refuse_only_endpoint(&options.node, &address)?;
        let (wipe, wipe_note) = self.wipe_labels(&address, &options.wipe).await;
        let mut facts = RetireFacts {
            address,
            member: None,
            leads: None,
            source: None,
            wipe,
            snapshot_dir: self.snapshot_dir(options.snapshot_dir.as_ref()),
            silence_timeout: options.silence_timeout,
            snapshot: None,
            leave_to_reset_gap_ms: None,
        };
        match member {
            None if !options.already_left => {
                return Err(Refusal::NotMember {
                    node: options.node.clone(),
                    members: names(&view.members),
                }
                .into());
            }
            Some(m) if options.already_left => {
                return Err(Refusal::StillMember {
                    node: options.node.clone(),
                    member_id: m.id.to_string(),
                }
                .into());
            }
            None => {}
            Some(m) => {
                check_removal(&view, m.id, &m.hostname)?;
                facts.source = Some(pick_source(&view, Some(m.id))?);
                facts.leads = Some(view.leader() == Some(m.id));
                facts.member = Some(PlannedMember {
                    member_id: m.id,
                    hostname: m.hostname.clone(),
                });
            }
        }
        self.check_wipe_labels(&facts.address, &facts.wipe).await?;
        let steps = facts
            .steps()
            .into_iter()
            .map(|s| PlannedStep::new(Step::Retire(s), s.describe(&facts)))
            .collect();
        Ok(Plan::new(
            OpSpec::Retire(options.clone()),
            steps,
            wipe_note.into_iter().collect(),
            Facts::Retire(facts),
            &view.basis(),
        ))
    }

    pub(super) fn refuse_only_endpoint(&self, node: &str, address: &str) -> Result<(), OpsError> {
        let hosts: Vec<String> = self
            .endpoints
            .iter()
            .filter_map(|e| crate::config::normalize_endpoint(e).ok())
            .map(|e| e.host)
            .collect();
        if !hosts.is_empty() && hosts.iter().all(|h| h == node || h == address) {
            return Err(Refusal::OnlyEndpoint {
                node: node.to_string(),
                context: self.context.clone(),
            }
            .into());
        }
        Ok(())
    }

    pub(super) async fn retire_step(
        &mut self,
        step: RetireStep,
        facts: &mut RetireFacts,
    ) -> Result<Outcome, OpsError> {
        let target = self.client.node(facts.address.as_str());
        match step {
            RetireStep::Snapshot => {
                let source = facts.source()?.address.clone();
                let path = self.take_snapshot(&source, &facts.snapshot_dir).await?;
                let detail = format!("{} (from {source})", path.display());
                facts.snapshot = Some(path);
                Ok(Outcome::done(detail))
            }
            RetireStep::Forfeit => {
                let id = facts.member()?.member_id;
                let status = target.etcd_status().await?;
                if status.leader != id {
                    return Ok(Outcome::skipped("the node does not lead"));
                }
                let successor = target.etcd_forfeit_leadership().await?;
                let survivor = self.client.node(facts.source()?.address.as_str());
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    if let Ok(s) = survivor.etcd_status().await
                        && s.leader.0 != 0
                        && s.leader != id
                    {
                        return Ok(Outcome::done(format!(
                            "leadership moved to {}",
                            successor.unwrap_or_else(|| s.leader.to_string())
                        )));
                    }
                    if Instant::now() > deadline {
                        return Err(OpsError::step(
                            "forfeit",
                            "no other member took the lead within 30s",
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            RetireStep::Leave => {
                target.etcd_leave_cluster().await?;
                self.leave_answered = Some(Instant::now());
                Ok(Outcome::done("the member left etcd"))
            }
            RetireStep::Reset => {
                target.reset(reset_request(&facts.wipe)).await?;
                let detail = match self.leave_answered.take() {
                    Some(answered) => {
                        let gap = answered.elapsed().as_secs_f64() * 1000.0;
                        facts.leave_to_reset_gap_ms = Some(gap);
                        format!("reset accepted {gap:.1} ms after the leave's answer")
                    }
                    None => "reset accepted".to_string(),
                };
                Ok(Outcome::done(detail))
            }
            RetireStep::Confirm => self.confirm_gone(facts.member()?.member_id).await,
            RetireStep::WaitSilent => {
                self.wait_silent(&facts.address, facts.silence_timeout)
                    .await
            }
        }
    }

    /// After a crash with `step` in flight: is it already done?
    pub(super) async fn reconcile_retire(
        &mut self,
        step: RetireStep,
        facts: &RetireFacts,
    ) -> Result<Option<Outcome>, OpsError> {
        match step {
            RetireStep::Leave => {
                let id = facts.member()?.member_id;
                let survivor = self.client.node(facts.source()?.address.as_str());
                let members = survivor.etcd_member_list(false).await?;
                Ok((!members.iter().any(|m| m.id == id))
                    .then(|| Outcome::done("reconciled: the member is already gone")))
            }
            RetireStep::Reset => {
                let answers = self
                    .client
                    .node(facts.address.as_str())
                    .version()
                    .await
                    .is_ok();
                Ok((!answers).then(|| Outcome::done("reconciled: the node no longer answers")))
            }
            // Forfeit checks who leads; the rest is read-only.
            _ => Ok(None),
        }
    }

    async fn confirm_gone(&self, id: MemberId) -> Result<Outcome, OpsError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last;
        loop {
            match ClusterView::read(&self.client).await {
                Ok(view) if view.find_id(id) => last = "the member is still listed".into(),
                Ok(view) => {
                    let unhealthy = unhealthy_voters(&view, None);
                    if unhealthy.is_empty() && view.disagreements.is_empty() {
                        let voters = view.voters().count();
                        return Ok(Outcome::done(format!(
                            "{voters} healthy voters: {}",
                            names(&view.members).join(", ")
                        )));
                    }
                    last = format!("{}{}", unhealthy.join("; "), view.disagreements.join("; "));
                }
                Err(e) => last = e.to_string(),
            }
            if Instant::now() > deadline {
                return Err(OpsError::step("confirm", last));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn wait_silent(&self, address: &str, timeout: Duration) -> Result<Outcome, OpsError> {
        let started = Instant::now();
        let target = self.client.node(address);
        loop {
            let answered = tokio::time::timeout(Duration::from_secs(5), target.version()).await;
            if !matches!(answered, Ok(Ok(_))) {
                return Ok(Outcome::done(format!(
                    "silent after {:.1} s",
                    started.elapsed().as_secs_f64()
                )));
            }
            if started.elapsed() > timeout {
                return Err(OpsError::step(
                    "wait-silent",
                    format!("{address} still answers after {} s", timeout.as_secs()),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The reset of a node that has left etcd: at once, not graceful (it has
/// nothing left to leave), no reboot (it powers off).
fn reset_request(wipe: &[String]) -> ResetRequest {
    ResetRequest {
        graceful: false,
        reboot: false,
        system_labels_to_wipe: wipe.to_vec(),
        user_disks_to_wipe: Vec::new(),
        mode: WipeMode::SystemDisk,
    }
}
