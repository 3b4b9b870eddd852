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

use std::time::{Duration, Instant};

use serde_json::json;

use super::cluster::{ClusterView, member_address, names, quorum};
use super::snapshot::pick_source;
use super::{OpKind, Ops, OpsError, Outcome, Plan, PlannedStep, fact};
use crate::client::{MemberId, ResetRequest, WipeMode};

/// Options of [`Ops::plan_retire`].
#[derive(Debug, Clone)]
pub struct RetireOptions {
    /// The node to retire: hostname or address.
    pub node: String,
    /// Labels to wipe (default STATE and EPHEMERAL).
    pub wipe: Vec<String>,
    /// The node already left etcd: only reset it.
    pub already_left: bool,
    /// Where the verified snapshot goes.
    pub snapshot_dir: std::path::PathBuf,
    /// How long to wait for the node to go silent.
    pub silence_timeout: Duration,
}

impl Ops {
    /// Preflight of a retire: refuses (changing nothing) when the node is
    /// not a member (unless `already_left`), is the last voter, a learner is
    /// present, the member lists disagree, a remaining voter is unhealthy,
    /// the healthy voters left would be fewer than a quorum, or the node is
    /// the talosconfig's only endpoint.
    pub async fn plan_retire(&self, options: &RetireOptions) -> Result<Plan, OpsError> {
        let view = ClusterView::read(&self.client).await?;
        let wipe = if options.wipe.is_empty() {
            vec!["STATE".to_string(), "EPHEMERAL".to_string()]
        } else {
            options.wipe.clone()
        };
        let mut facts = serde_json::Map::new();
        let member = view.find(&options.node);
        let address = match member {
            Some(m) => member_address(m).unwrap_or_else(|| options.node.clone()),
            None => options.node.clone(),
        };
        self.refuse_only_endpoint(&options.node, &address)?;
        let mut steps = Vec::new();
        match member {
            None if !options.already_left => {
                return Err(OpsError::Refused(format!(
                    "{} is not an etcd member (members: {}); use --already-left to only reset it",
                    options.node,
                    names(&view.members).join(", ")
                )));
            }
            Some(m) if options.already_left => {
                return Err(OpsError::Refused(format!(
                    "--already-left, but {} is still etcd member {}",
                    options.node, m.id
                )));
            }
            None => {}
            Some(m) => {
                check_quorum(&view, m.id, &m.hostname)?;
                let (source, source_address) = pick_source(&view, Some(m.id))?;
                facts.insert("source".into(), json!(source_address));
                facts.insert("member_id".into(), json!(m.id.to_string()));
                let leads = view.leader() == Some(m.id);
                steps.push(step(
                    "snapshot",
                    format!(
                        "verified snapshot from surviving voter {source} into {}",
                        options.snapshot_dir.display()
                    ),
                    false,
                ));
                steps.push(step(
                    "forfeit",
                    if leads {
                        format!(
                            "{} leads: hand leadership over and wait for a new leader",
                            m.hostname
                        )
                    } else {
                        format!("{} does not lead: nothing to hand over", m.hostname)
                    },
                    true,
                ));
                steps.push(step(
                    "leave",
                    format!("EtcdLeaveCluster on {} ({address})", m.hostname),
                    true,
                ));
            }
        }
        steps.push(step(
            "reset",
            format!(
                "reset {address} at once: wipe {}, no reboot, not graceful",
                wipe.join(", ")
            ),
            true,
        ));
        if member.is_some() {
            steps.push(step(
                "confirm",
                "a survivor no longer lists the member and every remaining member is healthy"
                    .into(),
                false,
            ));
        }
        steps.push(step(
            "wait-silent",
            format!("wait until {address}'s API stops answering"),
            false,
        ));
        facts.insert("address".into(), json!(address));
        Ok(Plan {
            kind: OpKind::Retire,
            params: json!({
                "node": options.node,
                "wipe": wipe,
                "already_left": options.already_left,
                "snapshot_dir": options.snapshot_dir,
                "silence_timeout_s": options.silence_timeout.as_secs(),
            }),
            steps,
            notes: Vec::new(),
            facts,
        })
    }

    pub(super) fn refuse_only_endpoint(&self, node: &str, address: &str) -> Result<(), OpsError> {
        let hosts: Vec<String> = self
            .endpoints
            .iter()
            .filter_map(|e| crate::config::normalize_endpoint(e).ok())
            .map(|e| e.host)
            .collect();
        if !hosts.is_empty() && hosts.iter().all(|h| h == node || h == address) {
            return Err(OpsError::Refused(format!(
                "{node} is the only endpoint of talosconfig context {:?}: retiring it loses the API; add another endpoint first (config add-endpoint)",
                self.context
            )));
        }
        Ok(())
    }

    pub(super) async fn retire_step(
        &mut self,
        step: &str,
        facts: &mut serde_json::Map<String, serde_json::Value>,
    ) -> Result<Outcome, OpsError> {
        let params = facts.get("params").cloned().unwrap_or_default();
        let address = fact(facts, "address").to_string();
        let target = self.client.node(address.as_str());
        match step {
            "snapshot" => {
                let dir = params["snapshot_dir"].as_str().unwrap_or(".").to_string();
                let source = fact(facts, "source").to_string();
                let path = self.take_snapshot(&source, dir.as_ref()).await?;
                facts.insert("snapshot".into(), json!(path));
                Ok(Outcome::done(format!("{} (from {source})", path.display())))
            }
            "forfeit" => {
                let id = member_id(facts);
                let status = target.etcd_status().await?;
                if status.leader != id {
                    return Ok(Outcome::skipped("the node does not lead"));
                }
                let successor = target.etcd_forfeit_leadership().await?;
                let survivor = self.client.node(fact(facts, "source"));
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    if let Ok(s) = survivor.etcd_status().await
                        && s.leader.0 != 0
                        && s.leader != id
                    {
                        facts.insert("forfeited".into(), json!(true));
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
            "leave" => {
                target.etcd_leave_cluster().await?;
                self.leave_answered = Some(Instant::now());
                Ok(Outcome::done("the member left etcd"))
            }
            "reset" => {
                let request = reset_request(&params);
                target.reset(request).await?;
                let detail = match self.leave_answered.take() {
                    Some(answered) => {
                        let gap = answered.elapsed().as_secs_f64() * 1000.0;
                        facts.insert("leave_to_reset_gap_ms".into(), json!(gap));
                        format!("reset accepted {gap:.1} ms after the leave's answer")
                    }
                    None => "reset accepted".to_string(),
                };
                Ok(Outcome::done(detail))
            }
            "confirm" => self.confirm_gone(facts).await,
            "wait-silent" => {
                let timeout =
                    Duration::from_secs(params["silence_timeout_s"].as_u64().unwrap_or(120));
                self.wait_silent(&address, timeout).await
            }
            other => Err(OpsError::step(other, "unknown step")),
        }
    }

    /// After a crash with `step` in flight: is it already done?
    pub(super) async fn reconcile_retire(
        &mut self,
        step: &str,
        facts: &mut serde_json::Map<String, serde_json::Value>,
    ) -> Result<Option<Outcome>, OpsError> {
        let address = fact(facts, "address").to_string();
        match step {
            "leave" => {
                let id = member_id(facts);
                let survivor = self.client.node(fact(facts, "source"));
                let members = survivor.etcd_member_list(false).await?;
                Ok((!members.iter().any(|m| m.id == id))
                    .then(|| Outcome::done("reconciled: the member is already gone")))
            }
            "reset" => {
                let answers = self.client.node(address.as_str()).version().await.is_ok();
                Ok((!answers).then(|| Outcome::done("reconciled: the node no longer answers")))
            }
            // Forfeit checks who leads; the rest is read-only.
            _ => Ok(None),
        }
    }

    async fn confirm_gone(
        &self,
        facts: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Outcome, OpsError> {
        let id = member_id(facts);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last;
        loop {
            match ClusterView::read(&self.client).await {
                Ok(view) if view.find_id(id) => last = "the member is still listed".into(),
                Ok(view) => {
                    let unhealthy: Vec<_> = view
                        .voters()
                        .filter(|m| !view.healthy(m.id))
                        .map(|m| format!("{}: {}", m.hostname, view.unhealthy_reason(m.id)))
                        .collect();
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

fn step(name: &str, description: String, destructive: bool) -> PlannedStep {
    PlannedStep {
        name: name.into(),
        description,
        destructive,
    }
}

fn member_id(facts: &serde_json::Map<String, serde_json::Value>) -> MemberId {
    MemberId(u64::from_str_radix(fact(facts, "member_id"), 16).unwrap_or_default())
}

fn reset_request(params: &serde_json::Value) -> ResetRequest {
    ResetRequest {
        graceful: false,
        reboot: false,
        system_labels_to_wipe: params["wipe"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l.as_str().map(str::to_string))
            .collect(),
        user_disks_to_wipe: Vec::new(),
        mode: WipeMode::SystemDisk,
    }
}

/// The quorum rules of a retire of member `id`.
pub(super) fn check_quorum(view: &ClusterView, id: MemberId, name: &str) -> Result<(), OpsError> {
    let refuse = |reason: String| Err(OpsError::Refused(reason));
    if let Some(learner) = view.members.iter().find(|m| m.is_learner) {
        return refuse(format!(
            "learner {} is still catching up: wait until it is a voter (ops join {})",
            learner.hostname, learner.hostname
        ));
    }
    let voters: Vec<_> = view.voters().collect();
    if voters.len() <= 1 {
        return refuse(format!("{name} is the last voting member"));
    }
    if !view.disagreements.is_empty() {
        return refuse(format!(
            "the members' lists disagree: {}",
            view.disagreements.join("; ")
        ));
    }
    let remaining: Vec<_> = voters.iter().filter(|m| m.id != id).collect();
    let unhealthy: Vec<String> = remaining
        .iter()
        .filter(|m| !view.healthy(m.id))
        .map(|m| format!("{} ({})", m.hostname, view.unhealthy_reason(m.id)))
        .collect();
    if !unhealthy.is_empty() {
        return refuse(format!(
            "remaining voters are unhealthy: {}",
            unhealthy.join(", ")
        ));
    }
    let healthy = remaining.len();
    if healthy < quorum(remaining.len()) {
        return refuse(format!(
            "only {healthy} healthy voters would remain, fewer than a quorum of {}",
            quorum(remaining.len())
        ));
    }
    Ok(())
}
