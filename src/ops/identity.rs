//! Who answers at an address. A retire acts on a node by its address, and
//! between the plan and a reset (or across a crash and a resume) another
//! machine can come to answer there: the same machine reset and rejoined as
//! a new member, or a new one given the address. So the plan records the
//! node's identity (its node id, COSI `Identities.cluster.talos.dev`, which
//! Talos keeps on STATE and renews when STATE is wiped; its hostname; its
//! member id) and every destructive step checks it again, and a reset that
//! is not sent right after the leave it follows is sent only to a node
//! that is that machine and no member.
//!
//! It also says what counts as evidence that a node was reset: it answers
//! in maintenance mode, or it does not answer, no survivor lists a member
//! at its address, name or id, and the survivors' discovery no longer lists
//! its node id. A node that refuses our certificate, a silent node that
//! discovery still lists (cut off, not reset), or another machine at the
//! address, is no evidence: nothing is sent while it lasts, and when it
//! outlasts the reset's deadline the operation stops as needs-attention.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::cluster::member_address;
use super::retire::RetireFacts;
use super::{Ops, OpsError};
use crate::Error;
use crate::client::{EtcdMember, MemberId};
use crate::maintenance::MaintenanceClient;

/// How long one identity question to the node may take.
const IDENTITY_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The node a retire acts on, as it described itself at plan time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TargetIdentity {
    /// Its node id (`Identities.cluster.talos.dev`, id `local`); `None`
    /// when the node did not answer at plan time.
    pub node_id: Option<String>,
}

/// What the node at an address says now.
#[derive(Debug)]
pub(crate) enum Answer {
    /// It answers with the cluster's credentials: its node id (`None`:
    /// it has none, STATE is not in use) and its own etcd member id
    /// (`None`: no etcd member runs there).
    Cluster {
        node_id: Option<String>,
        member_id: Option<MemberId>,
    },
    /// It answers without a client certificate: maintenance mode.
    Maintenance,
    /// It refuses our certificate or role: nothing can be told.
    RefusesUs(String),
    /// It does not answer.
    Silent(String),
}

impl Ops {
    /// The node id of `address`, or `None` when it does not say.
    pub(super) async fn node_id_of(&self, address: &str) -> Option<String> {
        self.client
            .with_call_timeout(IDENTITY_CALL_TIMEOUT)
            .node(address)
            .resources()
            .node_identity()
            .await
            .ok()
            .map(|i| i.node_id)
    }

    /// Asks the node at `address` who it is.
    pub(crate) async fn answer_of(&self, address: &str) -> Answer {
        let client = self.client.with_call_timeout(IDENTITY_CALL_TIMEOUT);
        let node = client.node(address);
        let node_id = match node.resources().node_identity().await {
            Ok(identity) => Some(identity.node_id),
            Err(Error::NotFound(_)) => None,
            Err(e @ (Error::Unauthenticated(_) | Error::PermissionDenied(_))) => {
                return Answer::RefusesUs(e.to_string());
            }
            Err(silent) => {
                return match self.maintenance_answers(address).await {
                    true => Answer::Maintenance,
                    false => Answer::Silent(silent.to_string()),
                };
            }
        };
        let member_id = node
            .resources()
            .etcd_member()
            .await
            .ok()
            .map(|m| m.member_id);
        Answer::Cluster { node_id, member_id }
    }

    /// Whether `address` answers Version without a client certificate, as
    /// only a node in maintenance mode does (a configured node requires
    /// one). Nothing is sent but the Version request.
    async fn maintenance_answers(&self, address: &str) -> bool {
        let endpoint = format!("{}:{}", bracket(address), self.api_port());
        let Ok(client) = MaintenanceClient::dangerous_unverified(&endpoint) else {
            return false;
        };
        matches!(
            tokio::time::timeout(IDENTITY_CALL_TIMEOUT, client.version()).await,
            Ok(Ok(_))
        )
    }

    /// The API port of the talosconfig's endpoints (Talos serves the same
    /// port on every node).
    fn api_port(&self) -> u16 {
        self.endpoints
            .iter()
            .find_map(|e| crate::config::normalize_endpoint(e).ok())
            .map_or(crate::config::DEFAULT_API_PORT, |e| e.port)
    }

    /// The node at the address is still the machine the plan saw, and
    /// reports itself as the planned member; else what it is instead.
    pub(super) async fn still_planned_member(&self, facts: &RetireFacts) -> Result<(), String> {
        let Some(planned) = &facts.member else {
            return Err("the plan names no member".into());
        };
        match self.answer_of(&facts.address).await {
            Answer::Cluster { node_id, member_id } => {
                if let Some(other) = other_machine(facts, node_id.as_deref()) {
                    return Err(other);
                }
                if member_id != Some(planned.member_id) {
                    return Err(format!(
                        "{} reports itself as member {} where the plan had {} ({}): not the planned member",
                        facts.address,
                        member_id.map_or("none".to_string(), |m| m.to_string()),
                        planned.member_id,
                        planned.hostname
                    ));
                }
                Ok(())
            }
            other => Err(format!(
                "{} cannot be checked: {}",
                facts.address,
                describe(&other)
            )),
        }
    }

    fn check_node_id(
        &self,
        facts: &RetireFacts,
        now: Option<&str>,
        step: &str,
    ) -> Result<(), OpsError> {
        match other_machine(facts, now) {
            Some(other) => Err(OpsError::attention(step, other)),
            None => Ok(()),
        }
    }

    /// The members the survivors list at the target's address, name or id.
    async fn members_at(&self, facts: &RetireFacts) -> Result<Vec<EtcdMember>, OpsError> {
        let members = self.surviving_member_list(facts).await?;
        let planned = facts.member.as_ref();
        Ok(members
            .into_iter()
            .filter(|m| {
                member_address(m).as_deref() == Some(facts.address.as_str())
                    || planned.is_some_and(|p| p.member_id == m.id || p.hostname == m.hostname)
            })
            .collect())
    }

    /// The member list as a survivor sees it: the snapshot source first,
    /// then through the endpoints, else any other endpoint's own list (a
    /// frozen survivor hides nothing).
    async fn surviving_member_list(
        &self,
        facts: &RetireFacts,
    ) -> Result<Vec<EtcdMember>, OpsError> {
        let client = self
            .client
            .with_call_timeout(super::cluster::VOTER_CALL_TIMEOUT);
        if let Some(source) = survivor_source(facts)
            && let Ok(members) = client.node(source).etcd_member_list(true).await
        {
            return Ok(members);
        }
        let others: Vec<String> = self
            .endpoint_hosts()
            .into_iter()
            .filter(|h| *h != facts.address && Some(h.as_str()) != survivor_source(facts))
            .collect();
        Ok(super::cluster::member_list_any(&client, &others).await?)
    }

    /// The target as the survivors' discovery (COSI `Members`) still lists
    /// it: by the planned node id, else by hostname; `None` when gone.
    /// Talos takes a node out of discovery when it is reset (its affiliate
    /// is deleted), while a node merely cut off stays listed; so a silent
    /// node counts as reset only once discovery no longer lists it. An
    /// error when no survivor answers.
    async fn discovered(&self, facts: &RetireFacts) -> Result<Option<String>, OpsError> {
        let client = self
            .client
            .with_call_timeout(super::cluster::VOTER_CALL_TIMEOUT);
        let asked = match survivor_source(facts) {
            Some(source) => client.node(source).resources().cluster_members().await.ok(),
            None => None,
        };
        let members = match asked {
            Some(found) => found,
            None => client.resources().cluster_members().await?,
        };
        let node_id = facts.identity.as_ref().and_then(|i| i.node_id.as_deref());
        let hostname = facts.member.as_ref().map(|m| m.hostname.as_str());
        Ok(members.iter().find_map(|m| match node_id {
            Some(id) => (m.node_id == id).then(|| format!("node id {id} ({})", m.hostname)),
            None => (Some(m.hostname.as_str()) == hostname)
                .then(|| format!("member {} ({})", m.id, m.hostname)),
        }))
    }

    /// Whether the survivors still list member `id`; an error when none
    /// answers.
    pub(super) async fn still_listed(
        &self,
        facts: &RetireFacts,
        id: MemberId,
    ) -> Result<bool, OpsError> {
        Ok(self
            .surviving_member_list(facts)
            .await?
            .iter()
            .any(|m| m.id == id))
    }

    /// A reset that does not follow its leave at once (on resume, after a
    /// failure, for a node that already left): sent only when no survivor
    /// lists a member at the node's address, name or id and the node is
    /// the planned machine and runs no member; done without sending when
    /// the node shows it was reset. Anything else needs attention.
    pub(super) async fn reset_checked(
        &self,
        facts: &RetireFacts,
        step: &str,
    ) -> Result<Checked, OpsError> {
        let listed = self.members_at(facts).await?;
        if let Some(m) = listed.first() {
            return Err(OpsError::attention(
                step,
                format!(
                    "{} is not reset: the cluster lists member {} ({}) at it{}",
                    facts.address,
                    m.id,
                    m.hostname,
                    if m.is_learner {
                        ", a learner"
                    } else {
                        ", a voter"
                    }
                ),
            ));
        }
        let planned = facts.identity.as_ref().and_then(|i| i.node_id.as_deref());
        match self.answer_of(&facts.address).await {
            // A reset in progress wipes STATE (the node id with it) a while
            // before the node goes down, so a node answering without one
            // may be one whose reset was sent before an interruption; it
            // may also be another machine. Nothing is sent while that
            // cannot be told: asked again until it goes down, answers in
            // maintenance mode, or the window ends (then a person looks).
            Answer::Cluster {
                node_id: None,
                member_id: None,
            } if planned.is_some() => Ok(Checked::Unsure(format!(
                "{} answers with no node id (the plan saw {}): its STATE was wiped (a reset under way) or another machine answers",
                facts.address,
                planned.unwrap_or_default()
            ))),
            Answer::Cluster { node_id, member_id } => {
                self.check_node_id(facts, node_id.as_deref(), step)?;
                if let Some(id) = member_id {
                    return Err(OpsError::attention(
                        step,
                        format!(
                            "{} is not reset: it runs etcd member {id}, which the survivors do not list",
                            facts.address
                        ),
                    ));
                }
                Ok(Checked::Send)
            }
            Answer::Maintenance => Ok(Checked::Evidence(format!(
                "{} answers in maintenance mode: it was reset",
                facts.address
            ))),
            Answer::Silent(why) => match self.discovered(facts).await? {
                Some(listed) => Ok(Checked::Unsure(format!(
                    "{} does not answer ({why}), but the survivors' discovery still lists {listed}: a reset node leaves discovery, so it may be cut off or stopped rather than reset; reach it, then resume",
                    facts.address
                ))),
                None => Ok(Checked::Evidence(format!(
                    "{} does not answer ({why}), no survivor lists a member at its address, name or id, and discovery no longer lists it: counted as reset; wipe the machine before it is used again if it was not",
                    facts.address
                ))),
            },
            Answer::RefusesUs(why) => Ok(Checked::Unsure(format!(
                "{} refuses this client ({why}): whether it was reset cannot be told",
                facts.address
            ))),
        }
    }

    /// [`Ops::reset_checked`] again every `pause` while it cannot tell (the
    /// node silent but still discovered, or refusing this client: a network
    /// blip, an API restarting) until it can or `deadline` passes; then the
    /// operation needs attention with the last reason. Nothing is sent to
    /// the node meanwhile.
    pub(super) async fn reset_checked_until(
        &self,
        facts: &RetireFacts,
        step: &str,
        deadline: Instant,
    ) -> Result<Checked, OpsError> {
        let pause = Duration::from_millis(500);
        loop {
            match self.reset_checked(facts, step).await? {
                Checked::Unsure(why) if Instant::now() + pause > deadline => {
                    return Err(OpsError::attention(step, why));
                }
                Checked::Unsure(_) => {
                    OpsError::poll_stop(&self.stop)?;
                    tokio::time::sleep(pause).await;
                }
                decided => return Ok(decided),
            }
        }
    }
}

/// What [`Ops::reset_checked`] decided.
pub(crate) enum Checked {
    /// The node is the planned machine, out of etcd: send the reset.
    Send,
    /// The node shows it was reset.
    Evidence(String),
    /// Whether it was reset cannot be told now (why): nothing may be sent.
    Unsure(String),
}

/// Another machine at the address, in words, when the node id it reports
/// (`now`) is not the planned one.
fn other_machine(facts: &RetireFacts, now: Option<&str>) -> Option<String> {
    let planned = facts.identity.as_ref().and_then(|i| i.node_id.as_deref());
    match (planned, now) {
        (Some(planned), Some(now)) if planned != now => Some(format!(
            "another machine answers at {}: node id {now}, the plan saw {planned}",
            facts.address
        )),
        (Some(planned), None) => Some(format!(
            "{} has no node id now (the plan saw {planned}): its STATE was wiped or another machine answers",
            facts.address
        )),
        _ => None,
    }
}

/// The survivor asked first: the snapshot's source, unless it is the
/// target itself.
fn survivor_source(facts: &RetireFacts) -> Option<&str> {
    facts
        .source
        .as_ref()
        .map(|s| s.address.as_str())
        .filter(|a| *a != facts.address)
}

fn describe(answer: &Answer) -> String {
    match answer {
        Answer::Cluster { .. } => "it answers".into(),
        Answer::Maintenance => "it answers in maintenance mode".into(),
        Answer::RefusesUs(why) => format!("it refuses this client ({why})"),
        Answer::Silent(why) => format!("it does not answer ({why})"),
    }
}

/// `address` with brackets when it is an IPv6 address.
fn bracket(address: &str) -> String {
    if address.contains(':') && !address.starts_with('[') {
        format!("[{address}]")
    } else {
        address.to_string()
    }
}
