//! `retire NODE`: handing a control-plane node's place over. Preflight refusals, a verified
//! snapshot from a surviving voter, forfeit when NODE leads, EtcdLeaveCluster
//! on NODE, Reset of NODE at once (its API server keeps accepting
//! connections without etcd after the leave, and KubePrism keeps sending it
//! traffic until it stops), confirmation through a survivor, and a wait
//! until NODE is silent.
//!
//! Nothing sits between the leave's answer and the reset: the two are one
//! unit (the engine journals the leave as started before it is sent and
//! writes nothing until the reset has answered), the connection is ready,
//! and the node's identity was checked right before the leave. The
//! survivors' confirmation therefore comes after the reset; the leave's
//! answer already means the member was removed (upstream removes it before
//! stopping etcd).
//!
//! Right before the forfeit, the leave and a removal, the engine's check
//! `quorum-without` reads the cluster again within a short bound (see
//! src/ops/fresh.rs): a plan made minutes ago (a snapshot of a large
//! database, a person at a prompt, a crash and a resume) says nothing about
//! a survivor that froze since. The reset's check `out-of-etcd` is the
//! leave's own answer when it follows at once; otherwise (resumed, retried,
//! or of a node that already left) it is [`Ops::reset_checked`]: sent only
//! to the planned machine when no survivor lists a member there.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::cluster::{ClusterView, member_address, names};
use super::fresh::{Check, CheckKind, Fresh, Guard, Guarded, Verdict};
use super::fresh_checks::CHECK_CALL_TIMEOUT;
use super::identity::TargetIdentity;
use super::plan::{Facts, Plan, PlannedStep, Step, StepInfo, need};
use super::policy::{Source, check_removal, pick_source, unhealthy_voters};
use super::send::Sent;
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
    /// Renew a Lease through this Kubernetes API endpoint (a KubePrism or
    /// a load balancer) from right before the forfeit until the node is
    /// silent, and report the renewals that failed: what a leader-elected
    /// controller behind that endpoint went through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_probe: Option<LeaseProbe>,
}

/// A Lease renewed through a Kubernetes API endpoint during a retire, as a
/// leader-elected controller renews its own (client-go's timing unless
/// told otherwise), with the admin kubeconfig a surviving control-plane
/// node serves (held in memory only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LeaseProbe {
    /// The endpoint: `https://host:port`.
    pub server: String,
    /// The name its certificate is checked against, when not the URL's
    /// host (`localhost` for a KubePrism reached from elsewhere).
    #[serde(default)]
    pub tls_server_name: Option<String>,
    /// How long a renewal may keep failing before the lease counts as lost.
    #[serde(with = "millis", rename = "renew_deadline_ms")]
    pub renew_deadline: Duration,
    /// How often it renews and retries.
    #[serde(with = "millis", rename = "retry_period_ms")]
    pub retry_period: Duration,
}

impl LeaseProbe {
    /// A probe through `server` with client-go's timing (renew deadline
    /// 10 s, retry period 2 s).
    pub fn new(server: impl Into<String>) -> LeaseProbe {
        LeaseProbe {
            server: server.into(),
            tls_server_name: None,
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
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
            lease_probe: None,
        }
    }
}

/// The steps of a retire (and of a migration's retire half).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetireStep {
    /// A verified snapshot from a surviving voter.
    Snapshot,
    /// Read the cluster again right before the first change: every
    /// survivor answers within a short bound, the lists agree, quorum holds
    /// without the node, and the node is still the planned machine and
    /// member.
    Check,
    /// Hand leadership over if the node leads.
    Forfeit,
    /// EtcdLeaveCluster on the node.
    Leave,
    /// The node is dead: remove its member by id through a survivor.
    Remove,
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
            RetireStep::Check => "check",
            RetireStep::Forfeit => "forfeit",
            RetireStep::Leave => "leave",
            RetireStep::Remove => "remove",
            RetireStep::Reset => "reset",
            RetireStep::Confirm => "confirm",
            RetireStep::WaitSilent => "wait-silent",
        }
    }

    fn destructive(&self) -> bool {
        matches!(
            self,
            RetireStep::Forfeit | RetireStep::Leave | RetireStep::Remove | RetireStep::Reset
        )
    }

    fn bound_to_next(&self) -> bool {
        // The leave and the reset are one unit: no journal write between.
        matches!(self, RetireStep::Leave)
    }

    fn point_of_no_return(&self) -> bool {
        matches!(
            self,
            RetireStep::Leave | RetireStep::Remove | RetireStep::Reset
        )
    }

    fn precondition(&self) -> Option<CheckKind> {
        match self {
            RetireStep::Forfeit | RetireStep::Leave | RetireStep::Remove => {
                Some(CheckKind::QuorumWithout)
            }
            RetireStep::Reset => Some(CheckKind::OutOfEtcd),
            _ => None,
        }
    }
}

impl RetireStep {
    /// Its precondition with its subject (the retired node as planned).
    pub(crate) fn check(self, facts: &RetireFacts) -> Option<Check> {
        let facts = Box::new(facts.clone());
        match self.precondition()? {
            CheckKind::OutOfEtcd => Some(Check::OutOfEtcd(facts)),
            _ => Some(Check::QuorumWithout(facts)),
        }
    }
}

/// The member a retire removes, as the preflight identified it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
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
    /// The node did not answer at plan time: its member is removed through
    /// a survivor, and nothing is sent to it.
    #[serde(default)]
    pub dead: bool,
    /// Who the node is, as it said at plan time (`None`: a journal of an
    /// earlier version, or a node that did not answer).
    #[serde(default)]
    pub identity: Option<TargetIdentity>,
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
    /// The node's Kubernetes API server accepted connections at plan time
    /// (port 6443): the retire waits until it no longer does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server_accepting: Option<bool>,
    /// The Lease renewed during the retire, if asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_probe: Option<LeaseProbe>,
    /// What the lease probe saw, once the node is silent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_renewals: Option<crate::kube::RenewalStats>,
}

impl RetireFacts {
    /// The steps for these facts: the full handover of a member, or only
    /// the reset of a node that already left.
    pub(crate) fn steps(&self) -> Vec<RetireStep> {
        use RetireStep::*;
        if self.member.is_some() && self.dead {
            vec![Snapshot, Check, Remove, Confirm]
        } else if self.member.is_some() {
            vec![Snapshot, Check, Forfeit, Leave, Reset, Confirm, WaitSilent]
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
            RetireStep::Check => format!(
                "read the cluster again: survivors answer within {} s, quorum holds without {name}, {address} {}",
                CHECK_CALL_TIMEOUT.as_secs(),
                if f.dead {
                    "still does not answer"
                } else {
                    "is still the planned machine and member"
                }
            ),
            RetireStep::Forfeit => match f.leads {
                Some(true) => {
                    format!("{name} leads: hand leadership over and wait for a new leader")
                }
                Some(false) => format!("{name} does not lead: nothing to hand over"),
                None => format!("if {name} leads, hand leadership over and wait for a new leader"),
            },
            RetireStep::Leave => format!("EtcdLeaveCluster on {name} ({address})"),
            RetireStep::Remove => format!(
                "{address} does not answer: remove member {} ({name}) through a surviving voter",
                f.member
                    .as_ref()
                    .map_or("?".to_string(), |m| m.member_id.to_string())
            ),
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
        let view = self.read_view().await?;
        let member = view.find(&options.node);
        let address = match member {
            Some(m) => member_address(m).unwrap_or_else(|| options.node.clone()),
            None => options.node.clone(),
        };
        self.refuse_only_endpoint(&options.node, &address)?;
        let (wipe, wipe_note) = self.wipe_labels(&address, &options.wipe).await;
        let api_server_accepting = Some(api_server_accepts(&address).await);
        let mut facts = RetireFacts {
            address,
            member: None,
            leads: None,
            dead: false,
            identity: None,
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
                facts.dead = !view.healthy(m.id) && !self.answers(&facts.address).await;
                facts.leads = Some(view.leader() == Some(m.id));
                facts.member = Some(PlannedMember {
                    member_id: m.id,
                    hostname: m.hostname.clone(),
                });
            }
        }
        if !facts.dead {
            self.check_wipe_labels(&facts.address, &facts.wipe).await?;
        }
        if options.already_left {
            self.refuse_if_node_is_member(&options.node, &facts.address, &view)
                .await?;
        }
        facts.identity = Some(TargetIdentity {
            node_id: self.node_id_of(&facts.address).await,
        });
        let steps = facts
            .steps()
            .into_iter()
            .map(|s| PlannedStep::new(Step::Retire(s), s.describe(&facts)))
            .collect();
        // A dead node is sent nothing: no reset wipes anything.
        let mut notes: Vec<String> = wipe_note.filter(|_| !facts.dead).into_iter().collect();
        let remaining = view.voters().count().saturating_sub(1);
        if facts.dead {
            notes.push(format!(
                "{} does not answer: its member is removed through a survivor and nothing is sent to it; wipe the machine before it is used again (if it answers again, a retire of {} with already_left resets it once its identity is checked)",
                facts.address, options.node
            ));
        }
        if facts.member.is_some() && remaining > 0 && remaining % 2 == 0 {
            notes.push(format!(
                "{remaining} voters remain, an even count: they survive no more failures than {} would",
                remaining - 1
            ));
        }
        Ok(Plan::new(
            OpSpec::Retire(options.clone()),
            steps,
            notes,
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
        guard: &mut Guard<'_>,
    ) -> Result<Outcome, OpsError> {
        let result = self.retire_step_inner(step, facts, guard).await;
        // A failed step ends the lease probe too, its findings kept: they
        // matter most when the handover went wrong.
        if let Err(e) = &result
            && let Some(renewer) = self.lease_renewer.take()
        {
            let stats = renewer.stop().await;
            let server = facts
                .lease_probe
                .as_ref()
                .map_or("?", |p| p.server.as_str());
            tracing::warn!(step = step.name(), error = %e, "{}", describe_renewals(server, &stats));
            facts.lease_renewals = Some(stats);
        }
        result
    }

    async fn retire_step_inner(
        &mut self,
        step: RetireStep,
        facts: &mut RetireFacts,
        guard: &mut Guard<'_>,
    ) -> Result<Outcome, OpsError> {
        let target = self.client.node(facts.address.as_str());
        match step {
            RetireStep::Snapshot => {
                let first = facts.source()?.clone();
                let exclude = facts.member()?.member_id;
                let (path, source, note) = self
                    .take_snapshot_retrying(&first, Some(exclude), &facts.snapshot_dir)
                    .await?;
                let detail = format!("{} (from {}){note}", path.display(), source.address);
                facts.source = Some(source);
                facts.snapshot = Some(path);
                Ok(Outcome::done(detail))
            }
            RetireStep::Check => {
                // The same check the engine runs before the forfeit, the
                // leave and the removal; here a failure changes nothing.
                let (verdict, leads) = self.quorum_without(facts).await?;
                let saw = match verdict {
                    Verdict::Holds(saw, _) => saw,
                    Verdict::Fails(saw) | Verdict::Done(saw) => {
                        return Err(OpsError::step("check", saw));
                    }
                };
                facts.leads = leads.or(facts.leads);
                match &facts.lease_probe {
                    Some(probe) => {
                        let started = self.start_lease_probe(facts, probe).await?;
                        Ok(Outcome::done(format!("{saw}; {started}")))
                    }
                    None => Ok(Outcome::done(saw)),
                }
            }
            RetireStep::Remove => {
                let id = facts.member()?.member_id;
                let survivor = facts.source()?.address.clone();
                self.remove_member_through(&survivor, id, guard).await?;
                Ok(Outcome::done(format!(
                    "member {id} removed through {survivor}; wipe {} before it is used again",
                    facts.address
                )))
            }
            RetireStep::Forfeit => {
                let id = facts.member()?.member_id;
                let status = target.etcd_status().await?;
                if status.leader != id {
                    return Ok(Outcome::skipped("the node does not lead"));
                }
                let fresh = guard.proof(self).await?;
                let successor = self.send_forfeit(fresh, &target).await?;
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
                let detail = self.leave(facts, guard).await?;
                self.leave_answered = Some(Instant::now());
                Ok(Outcome::done(detail))
            }
            RetireStep::Reset => {
                // Its check: the leave answered moments ago in this
                // process, or no member is at the node (or it was reset
                // already: nothing to send).
                let first = match guard.verdict(self).await? {
                    Guarded::Fresh(fresh) => fresh,
                    Guarded::Done(saw) => {
                        return Ok(Outcome::done(format!(
                            "{saw}; nothing was sent (check out-of-etcd)"
                        )));
                    }
                };
                let answered = self.leave_answered.take();
                self.reset_until_accepted(facts, answered, first, guard)
                    .await
            }
            RetireStep::Confirm => self.confirm_gone(facts.member()?.member_id).await,
            RetireStep::WaitSilent => {
                let started = Instant::now();
                let silent = self
                    .wait_silent(&facts.address, facts.silence_timeout)
                    .await?;
                // The probe's findings go in the result even if the API
                // server check below fails (the failure path stops it).
                let mut detail = silent.detail;
                if facts.api_server_accepting == Some(true) {
                    let left = facts.silence_timeout.saturating_sub(started.elapsed());
                    detail.push_str(&format!(
                        "; {}",
                        self.wait_api_server_gone(&facts.address, left).await?
                    ));
                }
                if let Some(renewer) = self.lease_renewer.take() {
                    // One more round once the node and its API server are
                    // gone: the controllers' path must renew without them.
                    if let Some(probe) = &facts.lease_probe {
                        renewer
                            .next_round(probe.retry_period + probe.renew_deadline)
                            .await;
                    }
                    let stats = renewer.stop().await;
                    let server = facts
                        .lease_probe
                        .as_ref()
                        .map_or("?", |p| p.server.as_str());
                    detail.push_str(&format!("; {}", describe_renewals(server, &stats)));
                    facts.lease_renewals = Some(stats);
                }
                Ok(Outcome::done(detail))
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
                // Asked of the snapshot's source, else through the
                // endpoints: one frozen survivor does not hide the answer.
                let id = facts.member()?.member_id;
                Ok((!self.still_listed(facts, id).await?)
                    .then(|| Outcome::done("reconciled: the member is already gone")))
            }
            // The reset step itself checks a reset that does not follow
            // its leave at once.
            RetireStep::Reset => Ok(None),
            // Forfeit checks who leads; the rest is read-only.
            _ => Ok(None),
        }
    }

    /// Whether the node's API answers at all (bounded).
    /// Removes a member through a survivor. etcd never answers a
    /// membership proposal that a newly elected leader dropped (raft holds
    /// conf changes until the leader has applied its log), and Talos sends
    /// one MemberRemove per call (v1alpha1_server.go,
    /// EtcdRemoveMemberByID): so each try is bounded, and after a try that
    /// ran out of time the member list decides whether it landed.
    /// Each try is sent on a fresh check of its own.
    async fn remove_member_through(
        &self,
        survivor: &str,
        id: MemberId,
        guard: &mut Guard<'_>,
    ) -> Result<(), OpsError> {
        let node = self.client.with_call_timeout(REMOVE_TRY).node(survivor);
        let mut tries = 0;
        loop {
            tries += 1;
            let fresh = guard.proof(self).await?;
            match self.send_remove_member(fresh, &node, id).await {
                Ok(()) => return Ok(()),
                // Gone already: an earlier try landed after its deadline.
                Err(Sent::Failed(crate::Error::NotFound(_))) if tries > 1 => return Ok(()),
                Err(Sent::Failed(crate::Error::DeadlineExceeded(_))) if tries < REMOVE_TRIES => {
                    if let Ok(members) = node.etcd_member_list(false).await
                        && !members.iter().any(|m| m.id == id)
                    {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub(super) async fn answers(&self, address: &str) -> bool {
        self.client
            .with_call_timeout(Duration::from_secs(5))
            .node(address)
            .version()
            .await
            .is_ok()
    }

    /// EtcdLeaveCluster with a deadline past Talos's own retry window; an
    /// answer that says nothing (a deadline, a dropped connection) is
    /// settled by asking a survivor whether the member is gone.
    async fn leave(&self, facts: &RetireFacts, guard: &mut Guard<'_>) -> Result<String, OpsError> {
        let id = facts.member()?.member_id;
        let target = self
            .client
            .with_call_timeout(self.leave_timeouts.0)
            .node(facts.address.as_str());
        let fresh = guard.proof(self).await?;
        let error = match self.send_leave(fresh, &target).await {
            Ok(()) => return Ok("the member left etcd".into()),
            Err(Sent::Failed(e)) if ambiguous(&e) => e,
            Err(e) => return Err(e.into()),
        };
        let settle = self.leave_timeouts.1;
        let deadline = Instant::now() + settle;
        loop {
            match self.still_listed(facts, id).await {
                Ok(false) => {
                    return Ok(format!(
                        "the member left etcd (the leave answered {error}; a survivor no longer lists member {id})"
                    ));
                }
                // Talos may still be removing it: neither done nor safely
                // failed, so a person decides (resume settles it again).
                Ok(true) if Instant::now() > deadline => {
                    return Err(OpsError::attention(
                        "leave",
                        format!(
                            "the leave answered {error} and member {id} is still listed {} s later: the node may still be removing it",
                            settle.as_secs()
                        ),
                    ));
                }
                Err(e) if Instant::now() > deadline => {
                    return Err(OpsError::attention(
                        "leave",
                        format!(
                            "the leave answered {error} and no survivor says whether member {id} is gone: {e}"
                        ),
                    ));
                }
                _ => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }

    /// Sends the reset, again with backoff while it is refused, until it is
    /// accepted or the node shows it was reset. Each send has a fresh
    /// check of its own ([`Ops::reset_checked`] for a resend); while that
    /// cannot tell (the node silent but still discovered, or refusing this
    /// client), nothing is sent and the check repeats until its deadline.
    async fn reset_until_accepted(
        &self,
        facts: &mut RetireFacts,
        leave_answered: Option<Instant>,
        mut fresh: Fresh,
        guard: &mut Guard<'_>,
    ) -> Result<Outcome, OpsError> {
        let target = self.client.node(facts.address.as_str());
        let deadline = Instant::now() + RESET_TIMEOUT;
        let mut pause = Duration::from_millis(100);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let error = match self
                .send_reset(fresh, &target, reset_request(&facts.wipe))
                .await
            {
                Ok(_) => break,
                Err(Sent::Failed(e)) => e,
                Err(refused) => return Err(refused.into()),
            };
            if Instant::now() + pause > deadline {
                return Err(OpsError::attention(
                    "reset",
                    format!(
                        "{} left etcd but refused the reset {attempts} times in {} s: {error}",
                        facts.address,
                        RESET_TIMEOUT.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
            fresh = match guard.verdict(self).await {
                Ok(Guarded::Fresh(fresh)) => fresh,
                Ok(Guarded::Done(detail)) => {
                    return Ok(Outcome::done(format!(
                        "{detail} (the reset answered {error})"
                    )));
                }
                Err(OpsError::NeedsAttention { step, reason }) => {
                    return Err(OpsError::attention(
                        &step,
                        format!("{reason}; the reset was refused {attempts} times: {error}"),
                    ));
                }
                Err(e) => return Err(e),
            };
        }
        let retried = if attempts > 1 {
            format!(" (attempt {attempts})")
        } else {
            String::new()
        };
        let detail = match leave_answered {
            Some(answered) => {
                let gap = answered.elapsed().as_secs_f64() * 1000.0;
                facts.leave_to_reset_gap_ms = Some(gap);
                format!("reset accepted {gap:.1} ms after the leave's answer{retried}")
            }
            None => format!("reset accepted{retried}"),
        };
        Ok(Outcome::done(detail))
    }

    /// `--already-left`: the node itself is asked whether it runs a member
    /// the cluster lists, as plain `reset`'s quorum guard asks it (names and
    /// URLs alone miss a multi-homed node named by another address).
    async fn refuse_if_node_is_member(
        &self,
        node: &str,
        address: &str,
        view: &ClusterView,
    ) -> Result<(), OpsError> {
        if let super::identity::Answer::Cluster {
            member_id: Some(id),
            ..
        } = self.answer_of(address).await
            && view.find_id(id)
        {
            return Err(Refusal::StillMember {
                node: node.to_string(),
                member_id: id.to_string(),
            }
            .into());
        }
        Ok(())
    }

    async fn confirm_gone(&self, id: MemberId) -> Result<Outcome, OpsError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last;
        loop {
            match self.read_view().await {
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
            OpsError::poll_stop(&self.stop)?;
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
            OpsError::poll_stop(&self.stop)?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The port of a control-plane node's Kubernetes API server.
const API_SERVER_PORT: u16 = 6443;

/// Whether `address`'s Kubernetes API server accepts a TCP connection
/// within a second.
pub(crate) async fn api_server_accepts(address: &str) -> bool {
    matches!(
        tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::TcpStream::connect((address, API_SERVER_PORT)),
        )
        .await,
        Ok(Ok(_))
    )
}

/// The lease probe's result, in words.
pub(crate) fn describe_renewals(server: &str, stats: &crate::kube::RenewalStats) -> String {
    let mut text = format!(
        "lease renewals through {server}: {} renewed, {} failed (a lease lost each), {} failed attempts, longest {:.1} s without a renewal",
        stats.renewed,
        stats.failed,
        stats.failed_attempts,
        stats.longest_gap_ms as f64 / 1000.0
    );
    if let Some(e) = &stats.last_error {
        text.push_str(&format!(" (last error: {e})"));
    }
    text
}

impl Ops {
    /// Starts renewing the probe's Lease through its endpoint, with the
    /// admin kubeconfig of the surviving voter (in memory only).
    async fn start_lease_probe(
        &mut self,
        facts: &RetireFacts,
        probe: &LeaseProbe,
    ) -> Result<String, OpsError> {
        let source = facts.source()?.address.clone();
        let fail = |e: String| {
            OpsError::step(
                "check",
                format!(
                    "the lease probe through {} cannot start: {e}; nothing was changed",
                    probe.server
                ),
            )
        };
        let yaml = self
            .client
            .node(source.as_str())
            .kubeconfig()
            .await
            .map_err(|e| fail(format!("{source} serves no kubeconfig: {e}")))?;
        let mut config = crate::kube::KubeConfig::from_yaml(&yaml)
            .map_err(|e| fail(e.to_string()))?
            .with_server(probe.server.clone());
        if let Some(name) = &probe.tls_server_name {
            config = config.with_tls_server_name(name.clone());
        }
        let client = crate::kube::KubeClient::new(&config)
            .map_err(|e| fail(e.to_string()))?
            .with_timeout(probe.renew_deadline);
        let mut options =
            crate::kube::LeaseRenewerOptions::new("kube-system", "talos-client-retire-probe");
        options.renew_deadline = probe.renew_deadline;
        options.retry_period = probe.retry_period;
        options.lease_duration = (probe.renew_deadline * 3 / 2).max(Duration::from_secs(1));
        let renewer = crate::kube::LeaseRenewer::start(client, options)
            .await
            .map_err(|e| fail(e.to_string()))?;
        self.lease_renewer = Some(renewer);
        Ok(format!(
            "renewing Lease kube-system/talos-client-retire-probe through {} every {:.1} s",
            probe.server,
            probe.retry_period.as_secs_f64()
        ))
    }

    /// Waits until `address`'s Kubernetes API server refuses connections.
    async fn wait_api_server_gone(
        &self,
        address: &str,
        timeout: Duration,
    ) -> Result<String, OpsError> {
        let started = Instant::now();
        loop {
            if !api_server_accepts(address).await {
                return Ok(format!(
                    "its Kubernetes API server (port {API_SERVER_PORT}) no longer accepts connections"
                ));
            }
            if started.elapsed() > timeout {
                return Err(OpsError::step(
                    "wait-silent",
                    format!(
                        "{address}'s Kubernetes API server still accepts connections on port {API_SERVER_PORT} although its Talos API is silent"
                    ),
                ));
            }
            OpsError::poll_stop(&self.stop)?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One MemberRemove try, and how many before the step fails.
const REMOVE_TRY: Duration = Duration::from_secs(15);
const REMOVE_TRIES: u32 = 4;

/// How long a refused reset is sent again.
const RESET_TIMEOUT: Duration = Duration::from_secs(60);

use super::policy::MAX_RAFT_LAG;

/// A voter other than `leaving` that trails the most advanced voter's raft
/// index by more than [`MAX_RAFT_LAG`], in words.
pub(crate) fn raft_lag(view: &ClusterView, leaving: MemberId) -> Option<String> {
    let indexes: Vec<(&str, u64)> = view
        .statuses
        .iter()
        .filter(|(m, _)| m.id != leaving && !m.is_learner)
        .filter_map(|(m, s)| s.as_ref().ok().map(|s| (m.hostname.as_str(), s.raft_index)))
        .collect();
    let top = indexes.iter().map(|(_, i)| *i).max()?;
    indexes
        .iter()
        .find(|(_, i)| top - i > MAX_RAFT_LAG)
        .map(|(name, i)| {
            format!(
                "{name} trails the most advanced voter by {} raft entries (more than {MAX_RAFT_LAG}): it may not keep quorum without the leaving member",
                top - i
            )
        })
}

/// Whether an error of a call leaves open whether the call took effect.
fn ambiguous(e: &crate::Error) -> bool {
    use crate::Error as E;
    matches!(
        e,
        E::DeadlineExceeded(_) | E::Unavailable(_) | E::Cancelled(_) | E::Connect(_)
    ) || matches!(e, E::Status { code, .. } if *code == tonic::Code::Unknown)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{EtcdMember, EtcdMemberStatus};

    /// Voter `cp-N` (member id N) whose raft index is `index`.
    fn voter(n: u64, index: u64) -> (EtcdMember, Result<EtcdMemberStatus, crate::Error>) {
        let member = EtcdMember {
            id: MemberId(n),
            hostname: format!("cp-{n}"),
            peer_urls: vec![format!("https://10.0.0.{n}:2380")],
            client_urls: Vec::new(),
            is_learner: false,
        };
        let status = EtcdMemberStatus {
            member_id: MemberId(n),
            protocol_version: String::new(),
            storage_version: String::new(),
            db_size: 0,
            db_size_in_use: 0,
            leader: MemberId(1),
            raft_index: index,
            raft_term: 2,
            raft_applied_index: index,
            errors: Vec::new(),
            is_learner: false,
        };
        (member, Ok(status))
    }

    fn view(indexes: &[u64]) -> ClusterView {
        let statuses: Vec<_> = indexes
            .iter()
            .enumerate()
            .map(|(i, index)| voter(i as u64 + 1, *index))
            .collect();
        ClusterView {
            members: statuses.iter().map(|(m, _)| m.clone()).collect(),
            statuses,
            disagreements: Vec::new(),
        }
    }

    #[test]
    fn a_survivor_trailing_by_more_than_the_bound_is_named() {
        // Within the bound: nothing to say.
        assert_eq!(raft_lag(&view(&[5000, 4500, 4900]), MemberId(3)), None);
        // cp-2 trails cp-1 by 1500 entries.
        let lag = raft_lag(&view(&[5000, 3500, 4900]), MemberId(3)).unwrap();
        assert!(
            lag.starts_with("cp-2 trails") && lag.contains("1500"),
            "{lag}"
        );
        // The leaving member's own lag does not count.
        assert_eq!(raft_lag(&view(&[5000, 4990, 10]), MemberId(3)), None);
    }
}
