//! What each [`CheckKind`](super::fresh::CheckKind) reads, and when it
//! holds. Every read is bounded ([`CHECK_CALL_TIMEOUT`] a call), and a
//! check that holds says what it saw, as one that fails does.

use std::time::{Duration, Instant};

use super::apply::read_config;
use super::cluster::{ClusterView, member_address, names};
use super::config_diff::Documents;
use super::fresh::{Check, PendingTry, Verdict, Voters};
use super::identity::Checked;
use super::policy::{check_removal, unhealthy_voters};
use super::retire::{RetireFacts, raft_lag};
use super::{Ops, OpsError};
use crate::client::resources::ConfigId;

/// How long each call of a check may take: a voter that does not answer
/// within it is not healthy now, whatever the plan saw.
pub(crate) const CHECK_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a reset's check waits for a node it cannot tell about (silent
/// but still discovered, refusing this client) before it fails.
const RESET_CHECK_WINDOW: Duration = Duration::from_secs(60);

impl Ops {
    /// Runs `check` (for step `label`). An error is a failure to run it at
    /// all (a park, a fact missing); a check that ran and found the
    /// cluster unfit is [`Verdict::Fails`].
    pub(super) async fn evaluate(&self, label: &str, check: &Check) -> Result<Verdict, OpsError> {
        match check {
            Check::QuorumWithout(facts) => Ok(self.quorum_without(facts).await?.0),
            Check::VotersHealthy(voters) => Ok(self.voters_healthy(voters).await),
            Check::OutOfEtcd(facts) => self.out_of_etcd(label, facts).await,
            Check::ApplyReady(node) => Ok(self.apply_ready(node).await),
            Check::TryPending(pending) => Ok(self.try_pending(pending).await),
            Check::QuorumLost { node, hosts } => Ok(self.quorum_lost(node, hosts).await),
            Check::InMaintenance { node, pins } => Ok(self.in_maintenance(node, pins).await),
        }
    }

    /// The cluster read through `hosts`, every call bounded.
    async fn bounded_view(&self, hosts: &[String]) -> Result<ClusterView, String> {
        ClusterView::read_via(&self.client, CHECK_CALL_TIMEOUT, hosts)
            .await
            .map_err(|e| {
                format!(
                    "the members cannot be read within {} s: {e}",
                    CHECK_CALL_TIMEOUT.as_secs()
                )
            })
    }

    /// Quorum holds without the retired node, read through the survivors:
    /// the removal rules, no survivor trailing, and the node still the
    /// planned machine and member (or, planned as dead, still silent).
    /// With whether the node leads now.
    pub(super) async fn quorum_without(
        &self,
        facts: &RetireFacts,
    ) -> Result<(Verdict, Option<bool>), OpsError> {
        let planned = super::plan::need(&facts.member, "member")?.clone();
        let hosts: Vec<String> = self
            .endpoint_hosts()
            .into_iter()
            .filter(|h| *h != facts.address)
            .collect();
        let fails = |why: String| Ok((Verdict::Fails(why), None));
        let view = match self.bounded_view(&hosts).await {
            Ok(view) => view,
            Err(why) => return fails(why),
        };
        let Some(member) = view.find_id_member(planned.member_id) else {
            return fails(format!(
                "{} (member {}) is no longer an etcd member",
                planned.hostname, planned.member_id
            ));
        };
        if let Err(refusal) = check_removal(&view, member.id, &member.hostname) {
            return fails(refusal.to_string());
        }
        if let Some(lag) = raft_lag(&view, member.id) {
            return fails(lag);
        }
        let node = if facts.dead {
            if self.answers(&facts.address).await {
                return fails(format!(
                    "{} answers again: it was planned as dead; plan the retire again",
                    facts.address
                ));
            }
            "still does not answer"
        } else {
            if let Err(why) = self.still_planned_member(facts).await {
                return fails(why);
            }
            "is still the planned machine and member"
        };
        let read_at = Instant::now();
        let remaining = view.voters().count() - 1;
        let even = if remaining % 2 == 0 {
            format!(
                " (an even count: it survives no more failures than {})",
                remaining.saturating_sub(1)
            )
        } else {
            String::new()
        };
        let saw = format!(
            "{remaining} healthy voters remain after {}{even}; {} {node}",
            planned.hostname, facts.address
        );
        let leads = view.leader() == Some(member.id);
        Ok((Verdict::Holds(saw, read_at), Some(leads)))
    }

    /// Every voter but `except` healthy within the bound, the lists
    /// agreeing, no learner; the node still the planned member (a worker:
    /// it answers).
    async fn voters_healthy(&self, voters: &Voters) -> Verdict {
        let view = match self.bounded_view(&self.endpoint_hosts()).await {
            Ok(view) => view,
            Err(why) => return Verdict::Fails(why),
        };
        if let Err(why) = fit(&view, voters.except, voters.nospace_ok) {
            return Verdict::Fails(why);
        }
        let mut saw = format!(
            "{} voters healthy{}, the lists agree: {}",
            view.voters()
                .filter(|m| Some(m.id) != voters.except)
                .count(),
            match voters.except.and_then(|id| view.find_id_member(id)) {
                Some(m) => format!(" besides {}", m.hostname),
                None => String::new(),
            },
            names(&view.members).join(", ")
        );
        if let Some(node) = &voters.node {
            match node.member_id {
                Some(id) => match view.find_id_member(id) {
                    Some(m) if member_address(m).as_deref() == Some(node.address.as_str()) => {
                        saw.push_str(&format!("; {} is member {id}", node.address));
                    }
                    Some(m) => {
                        return Verdict::Fails(format!(
                            "member {id} ({}) is at {} now, not {}",
                            node.hostname,
                            member_address(m).unwrap_or_default(),
                            node.address
                        ));
                    }
                    None => {
                        return Verdict::Fails(format!(
                            "{} ({}) is no longer member {id}",
                            node.hostname, node.address
                        ));
                    }
                },
                None => {
                    let answer = self
                        .client
                        .with_call_timeout(CHECK_CALL_TIMEOUT)
                        .node(node.address.as_str())
                        .version()
                        .await;
                    if let Err(e) = answer {
                        return Verdict::Fails(format!("{} does not answer: {e}", node.address));
                    }
                    saw.push_str(&format!("; {} answers", node.address));
                }
            }
        }
        Verdict::Holds(saw, Instant::now())
    }

    /// The node is out of etcd: its leave answered in this process moments
    /// ago, or [`Ops::reset_checked_until`] says to send (or that it was
    /// reset already).
    async fn out_of_etcd(&self, label: &str, facts: &RetireFacts) -> Result<Verdict, OpsError> {
        let name = facts
            .member
            .as_ref()
            .map_or(facts.address.as_str(), |m| m.hostname.as_str());
        if let Some(answered) = self.leave_answered
            && answered.elapsed() <= super::fresh::MAX_GAP
        {
            return Ok(Verdict::Holds(
                format!(
                    "{name} left etcd {} ms ago in this process: its leave answered right after check quorum-without held for it",
                    answered.elapsed().as_millis()
                ),
                answered,
            ));
        }
        let deadline = Instant::now() + RESET_CHECK_WINDOW;
        Ok(
            match self.reset_checked_until(facts, label, deadline).await {
                Ok(Checked::Send) => Verdict::Holds(
                    format!(
                        "no survivor lists a member at {}, {name} or its id; {} is the planned machine and runs no etcd member",
                        facts.address, facts.address
                    ),
                    Instant::now(),
                ),
                Ok(Checked::Evidence(saw)) => Verdict::Done(saw),
                Ok(Checked::Unsure(why)) => Verdict::Fails(why),
                Err(OpsError::NeedsAttention { reason, .. }) => Verdict::Fails(reason),
                Err(e) => return Err(e),
            },
        )
    }

    /// The node answers and runs its saved configuration (nothing pending
    /// that nobody confirmed), and every voter is healthy.
    async fn apply_ready(&self, node: &str) -> Verdict {
        let client = self.client.with_call_timeout(CHECK_CALL_TIMEOUT);
        if let Err(e) = client.node(node).version().await {
            return Verdict::Fails(format!("{node} does not answer: {e}"));
        }
        let running = match read_config(&client, node, ConfigId::Active).await {
            Ok(yaml) => yaml,
            Err(e) => return Verdict::Fails(format!("{node}'s configuration cannot be read: {e}")),
        };
        let pending = match read_config(&client, node, ConfigId::Persistent).await {
            Ok(saved) => match (Documents::parse(&running), Documents::parse(&saved)) {
                (Ok(running), Ok(saved)) => running.changed_paths(&saved),
                (Err(e), _) | (_, Err(e)) => {
                    return Verdict::Fails(format!("{node}'s configuration does not parse: {e}"));
                }
            },
            Err(crate::Error::NotFound(_)) => Vec::new(),
            Err(e) => {
                return Verdict::Fails(format!("{node}'s saved configuration cannot be read: {e}"));
            }
        };
        if !pending.is_empty() {
            return Verdict::Fails(format!(
                "{node} runs a configuration it has not saved (a try or a staged change is pending): {}",
                pending.join(", ")
            ));
        }
        let view = match self.bounded_view(&self.endpoint_hosts()).await {
            Ok(view) => view,
            Err(why) => return Verdict::Fails(why),
        };
        if let Err(why) = fit(&view, None, false) {
            return Verdict::Fails(why);
        }
        Verdict::Holds(
            format!(
                "{node} answers and runs its saved configuration; {} voters healthy, the lists agree",
                view.voters().count()
            ),
            Instant::now(),
        )
    }

    /// The TRY of the planned file is pending on the node: the same boot,
    /// it runs the file, its window still open. Saved already: done.
    async fn try_pending(&self, pending: &PendingTry) -> Verdict {
        let node = pending.node.as_str();
        let file = match super::apply::read_planned(&pending.config_path, &pending.config_sha256)
            .map_err(|e| e.to_string())
            .and_then(|bytes| Documents::parse(&bytes).map_err(|e| e.to_string()))
        {
            Ok(file) => file,
            Err(why) => return Verdict::Fails(why),
        };
        let client = self.client.with_call_timeout(CHECK_CALL_TIMEOUT);
        if let Some(before) = &pending.boot_id {
            match self.boot_id(node).await {
                Ok(now) if now == *before => {}
                Ok(now) => {
                    return Verdict::Fails(format!(
                        "{node} rebooted since the try (boot id {before} is now {now}): it runs its saved configuration again"
                    ));
                }
                Err(e) => return Verdict::Fails(format!("{node}'s boot id cannot be read: {e}")),
            }
        }
        let read = |which| read_config(&client, node, which);
        let parsed = |yaml: Result<Vec<u8>, crate::Error>| {
            yaml.map_err(|e| e.to_string())
                .and_then(|y| Documents::parse(&y).map_err(|e| e.to_string()))
        };
        match parsed(read(ConfigId::Persistent).await) {
            Ok(saved) if saved.changed_paths(&file).is_empty() => {
                return Verdict::Done(format!("{node} has saved the file already"));
            }
            Ok(_) => {}
            Err(why) => {
                return Verdict::Fails(format!(
                    "{node}'s saved configuration cannot be read: {why}"
                ));
            }
        }
        let drift = match parsed(read(ConfigId::Active).await) {
            Ok(running) => running.changed_paths(&file),
            Err(why) => return Verdict::Fails(format!("{node}'s configuration: {why}")),
        };
        if !drift.is_empty() {
            return Verdict::Fails(format!(
                "{node} no longer runs the tried file (it rolled back): {}",
                drift.join(", ")
            ));
        }
        let now = super::apply_steps::now_ms();
        if now >= pending.deadline_ms {
            return Verdict::Fails(format!(
                "{node}'s try window closed {} ms ago",
                now - pending.deadline_ms
            ));
        }
        Verdict::Holds(
            format!(
                "{node} runs the tried file on trial in the same boot, {:.1} s left in its window",
                (pending.deadline_ms - now) as f64 / 1000.0
            ),
            Instant::now(),
        )
    }

    /// Quorum is lost: no etcd of `hosts` answers with a leader, and the
    /// node answers and runs no etcd.
    async fn quorum_lost(&self, node: &str, hosts: &[String]) -> Verdict {
        let probe = self.client.with_call_timeout(CHECK_CALL_TIMEOUT);
        if let Err(e) = probe.node(node).version().await {
            return Verdict::Fails(format!("{node} does not answer: {e}"));
        }
        for host in hosts {
            if let Ok(status) = probe.node(host.as_str()).etcd_status().await {
                if status.leader.0 != 0 {
                    return Verdict::Fails(format!(
                        "{host}'s etcd answers with leader {}: quorum is not lost",
                        status.leader
                    ));
                }
                if host == node {
                    return Verdict::Fails(format!("{node}'s etcd runs"));
                }
            }
        }
        Verdict::Holds(
            format!(
                "no etcd of {} answers with a leader; {node} answers and runs no etcd",
                hosts.join(", ")
            ),
            Instant::now(),
        )
    }

    /// The node answers in maintenance mode (as pinned) and no member is
    /// at it.
    async fn in_maintenance(&self, node: &str, pins: &[String]) -> Verdict {
        let answered = match super::join::maintenance_client(node, pins) {
            Ok(client) => tokio::time::timeout(CHECK_CALL_TIMEOUT, client.version())
                .await
                .map_err(|_| format!("no answer within {} s", CHECK_CALL_TIMEOUT.as_secs()))
                .and_then(|r| r.map_err(|e| e.to_string())),
            Err(e) => Err(e.to_string()),
        };
        if let Err(why) = answered {
            return Verdict::Fails(format!("{node} does not answer in maintenance mode: {why}"));
        }
        let view = match self.bounded_view(&self.endpoint_hosts()).await {
            Ok(view) => view,
            Err(why) => return Verdict::Fails(why),
        };
        if let Some(member) = view.find(node) {
            return Verdict::Fails(format!(
                "{node} is etcd member {} ({}) already",
                member.id, member.hostname
            ));
        }
        Verdict::Holds(
            format!(
                "{node} answers in maintenance mode ({}); no member is at it",
                if pins.is_empty() {
                    "its certificate NOT verified".to_string()
                } else {
                    "its certificate as pinned".to_string()
                }
            ),
            Instant::now(),
        )
    }
}

/// No learner, the lists agreeing, every voter but `except` healthy (a
/// NOSPACE alarm counted healthy when `nospace_ok`); else what is not so.
fn fit(
    view: &ClusterView,
    except: Option<crate::client::MemberId>,
    nospace_ok: bool,
) -> Result<(), String> {
    if let Some(learner) = view.members.iter().find(|m| m.is_learner) {
        return Err(format!("{} is a learner catching up", learner.hostname));
    }
    if !view.disagreements.is_empty() {
        return Err(format!(
            "the members' lists disagree: {}",
            view.disagreements.join("; ")
        ));
    }
    let unhealthy = if nospace_ok {
        super::defrag::unfit(view, except)
    } else {
        unhealthy_voters(view, except)
    };
    if !unhealthy.is_empty() {
        return Err(format!("voters not healthy: {}", unhealthy.join(", ")));
    }
    Ok(())
}
