//! What the operations read of a cluster: its members as each voter sees
//! them, their statuses, and how to reach a member's node.

use std::time::Duration;

use crate::client::{EtcdMember, EtcdMemberStatus, MemberId};
use crate::{Client, Error};

/// The host of a member's first peer URL: the node's address, which apid
/// accepts as a `node` target.
pub(crate) fn member_address(member: &EtcdMember) -> Option<String> {
    let url = member.peer_urls.first().or(member.client_urls.first())?;
    let rest = url.split("://").nth(1).unwrap_or(url);
    let host = rest.split('/').next()?;
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    };
    Some(
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
    )
}

/// How long a preflight waits for one voter's own etcd status or member
/// list.
pub(crate) const VOTER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The cluster as read by a preflight.
pub(crate) struct ClusterView {
    /// The member list, as the first answering node sees it.
    pub members: Vec<EtcdMember>,
    /// Each voter's own status, or why it could not be read.
    pub statuses: Vec<(EtcdMember, Result<EtcdMemberStatus, Error>)>,
    /// Member lists that differ from `members`, by node.
    pub disagreements: Vec<String>,
}

impl ClusterView {
    /// Reads the members through the endpoint, then every voter's status
    /// and own member list, each call bounded by `timeout`
    /// ([`VOTER_CALL_TIMEOUT`] in the preflights): on a node whose etcd
    /// service is down the calls do not fail, they wait for etcd
    /// (upstream's local etcd client sends with WaitForReady), and that
    /// voter is unhealthy for the preflight. When the endpoint's member
    /// list does not answer (a linearizable list waits on a hung leader),
    /// the endpoint's own list is used, else that of the first of `hosts`
    /// to answer.
    pub async fn read_via(
        client: &Client,
        timeout: Duration,
        hosts: &[String],
    ) -> Result<ClusterView, Error> {
        let client = &client.with_call_timeout(timeout);
        let mut members = member_list_any(client, hosts).await?;
        members.sort_by_key(|m| m.id);
        let mut statuses = Vec::new();
        let mut disagreements = Vec::new();
        let ids: Vec<MemberId> = members.iter().map(|m| m.id).collect();
        for member in members.iter().filter(|m| !m.is_learner) {
            let Some(address) = member_address(member) else {
                continue;
            };
            let node = client.node(address.as_str());
            let status = node.etcd_status().await;
            if status.is_ok() {
                match node.etcd_member_list(true).await {
                    Ok(mut seen) => {
                        seen.sort_by_key(|m| m.id);
                        let seen_ids: Vec<MemberId> = seen.iter().map(|m| m.id).collect();
                        if seen_ids != ids {
                            disagreements.push(format!(
                                "{} sees {}",
                                member.hostname,
                                names(&seen).join(", ")
                            ));
                        }
                    }
                    Err(e) => disagreements.push(format!("{}: {e}", member.hostname)),
                }
            }
            statuses.push((member.clone(), status));
        }
        Ok(ClusterView {
            members,
            statuses,
            disagreements,
        })
    }

    /// The voters.
    pub fn voters(&self) -> impl Iterator<Item = &EtcdMember> {
        self.members.iter().filter(|m| !m.is_learner)
    }

    /// Whether this voter answered with a status free of errors.
    pub fn healthy(&self, id: MemberId) -> bool {
        self.statuses
            .iter()
            .any(|(m, s)| m.id == id && matches!(s, Ok(s) if s.errors.is_empty() && !s.is_learner))
    }

    /// Why a voter is unhealthy, in words.
    pub fn unhealthy_reason(&self, id: MemberId) -> String {
        match self.statuses.iter().find(|(m, _)| m.id == id) {
            Some((_, Ok(s))) if !s.errors.is_empty() => s.errors.join("; "),
            Some((_, Err(e))) => e.to_string(),
            _ => "no status".into(),
        }
    }

    /// The leader's member id, as the healthy voters report it.
    pub fn leader(&self) -> Option<MemberId> {
        self.statuses
            .iter()
            .find_map(|(_, s)| s.as_ref().ok().map(|s| s.leader))
            .filter(|l| l.0 != 0)
    }

    /// The cluster as read, in one line per member (id, name, learner,
    /// healthy) and the leader: what a plan's fingerprint covers.
    pub fn basis(&self) -> String {
        let mut lines: Vec<String> = self
            .members
            .iter()
            .map(|m| {
                format!(
                    "{} {} learner={} healthy={}",
                    m.id,
                    m.hostname,
                    m.is_learner,
                    self.healthy(m.id)
                )
            })
            .collect();
        lines.push(format!("leader={:?}", self.leader()));
        lines.join("\n")
    }

    /// Member `id`, if listed.
    pub fn find_id_member(&self, id: MemberId) -> Option<&EtcdMember> {
        self.members.iter().find(|m| m.id == id)
    }

    /// Whether member `id` is listed.
    pub fn find_id(&self, id: MemberId) -> bool {
        self.members.iter().any(|m| m.id == id)
    }

    /// The member named by `node`: a hostname or an address (a `:port`
    /// after it, as an API endpoint has, is ignored).
    pub fn find(&self, node: &str) -> Option<&EtcdMember> {
        let host = host_of(node);
        self.members.iter().find(|m| {
            m.hostname == node || m.hostname == host || member_address(m).as_deref() == Some(host)
        })
    }
}

/// The member list through the endpoint (linearizable); else the
/// endpoint's own list, or the first of `hosts` to answer with its own (a
/// leader that hangs stalls only the linearizable one); the endpoint's
/// error when none answers.
pub(crate) async fn member_list_any(
    client: &Client,
    hosts: &[String],
) -> Result<Vec<EtcdMember>, Error> {
    let first = match client.etcd_member_list(false).await {
        Ok(members) => return Ok(members),
        Err(e) => e,
    };
    // A linearizable list needs a leader; the endpoint's own (serializable)
    // list does not, and a hung leader is what the caller must then see.
    if let Ok(members) = client.etcd_member_list(true).await {
        return Ok(members);
    }
    for host in hosts {
        if let Ok(members) = client.node(host.as_str()).etcd_member_list(true).await {
            return Ok(members);
        }
    }
    Err(first)
}

/// `node` without a trailing `:port` (and without IPv6 brackets).
pub(crate) fn host_of(node: &str) -> &str {
    let host = match node.rsplit_once(':') {
        Some((h, port))
            if port.chars().all(|c| c.is_ascii_digit())
                && (h.starts_with('[') || !h.contains(':')) =>
        {
            h
        }
        _ => node,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

pub(crate) fn names(members: &[EtcdMember]) -> Vec<String> {
    members.iter().map(|m| m.hostname.clone()).collect()
}

/// Quorum of `n` voters.
pub(crate) fn quorum(n: usize) -> usize {
    n / 2 + 1
}
