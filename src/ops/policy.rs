//! The rules the operations decide by, each one function over a
//! [`ClusterView`] read once: which voters are unhealthy, whether a member
//! may be removed without losing quorum, and which member a snapshot comes
//! from. Pure, so they are table-tested without a cluster.

use serde::{Deserialize, Serialize};

use super::Refusal;
use super::cluster::{ClusterView, member_address, quorum};
use crate::client::MemberId;

/// Raft entries a voter may trail the most advanced one by and still count
/// as healthy.
pub(crate) const MAX_RAFT_LAG: u64 = 1000;

/// The voters (other than `except`) whose status is missing or reports
/// errors, or whose raft index trails the most advanced of them by more
/// than [`MAX_RAFT_LAG`], each as `NAME (REASON)`.
pub(crate) fn unhealthy_voters(view: &ClusterView, except: Option<MemberId>) -> Vec<String> {
    let index_of = |id: MemberId| {
        view.statuses
            .iter()
            .find(|(m, _)| m.id == id)
            .and_then(|(_, s)| s.as_ref().ok())
            .map(|s| s.raft_index)
    };
    let counted = || view.voters().filter(|m| Some(m.id) != except);
    let top = counted().filter_map(|m| index_of(m.id)).max().unwrap_or(0);
    counted()
        .filter_map(|m| {
            if !view.healthy(m.id) {
                return Some(format!("{} ({})", m.hostname, view.unhealthy_reason(m.id)));
            }
            let lag = top.saturating_sub(index_of(m.id)?);
            (lag > MAX_RAFT_LAG).then(|| {
                format!(
                    "{} (trails the most advanced voter by {lag} raft entries, more than {MAX_RAFT_LAG})",
                    m.hostname
                )
            })
        })
        .collect()
}

/// Whether member `id` (named `name`) may leave: no learner catching up,
/// not the last voter, the lists agree, every remaining voter is healthy
/// and they are a quorum of themselves.
pub(crate) fn check_removal(view: &ClusterView, id: MemberId, name: &str) -> Result<(), Refusal> {
    if let Some(learner) = view.members.iter().find(|m| m.is_learner) {
        return Err(Refusal::LearnerCatchingUp {
            learner: learner.hostname.clone(),
        });
    }
    let voters = view.voters().count();
    if voters <= 1 {
        return Err(Refusal::LastVoter { node: name.into() });
    }
    if !view.disagreements.is_empty() {
        return Err(Refusal::ListsDisagree {
            details: view.disagreements.clone(),
        });
    }
    let unhealthy = unhealthy_voters(view, Some(id));
    if !unhealthy.is_empty() {
        return Err(Refusal::UnhealthyVoters { voters: unhealthy });
    }
    let remaining = view.voters().filter(|m| m.id != id).count();
    let healthy = view
        .voters()
        .filter(|m| m.id != id && view.healthy(m.id))
        .count();
    if healthy < quorum(remaining) {
        return Err(Refusal::BelowQuorum {
            healthy,
            quorum: quorum(remaining),
        });
    }
    Ok(())
}

/// A member a snapshot is taken from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Source {
    /// Its member name.
    pub name: String,
    /// Its node's address.
    pub address: String,
}

/// A healthy voter to snapshot from, never `exclude`; a follower before
/// the leader, so the leader is spared the load.
pub(crate) fn pick_source(
    view: &ClusterView,
    exclude: Option<MemberId>,
) -> Result<Source, Refusal> {
    let leader = view.leader();
    let mut candidates: Vec<_> = view
        .voters()
        .filter(|m| Some(m.id) != exclude && view.healthy(m.id))
        .collect();
    candidates.sort_by_key(|m| (Some(m.id) == leader, m.id));
    let member = candidates.first().ok_or(Refusal::NoSnapshotSource)?;
    let address = member_address(member).ok_or_else(|| Refusal::NoAddress {
        member: member.hostname.clone(),
    })?;
    Ok(Source {
        name: member.hostname.clone(),
        address,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use crate::client::Failure;
    use crate::client::{EtcdMember, EtcdMemberStatus};

    /// A member `cp-N` with id N at 10.0.0.N; `learner` if so.
    fn member(n: u64, learner: bool) -> EtcdMember {
        EtcdMember {
            id: MemberId(n),
            hostname: format!("cp-{n}"),
            peer_urls: vec![format!("https://10.0.0.{n}:2380")],
            client_urls: Vec::new(),
            is_learner: learner,
        }
    }

    fn status(leader: u64, errors: &[&str]) -> EtcdMemberStatus {
        EtcdMemberStatus {
            member_id: MemberId(0),
            protocol_version: String::new(),
            storage_version: String::new(),
            db_size: 0,
            db_size_in_use: 0,
            leader: MemberId(leader),
            raft_index: 0,
            raft_term: 0,
            raft_applied_index: 0,
            errors: errors.iter().map(|e| e.to_string()).collect(),
            is_learner: false,
        }
    }

    /// A view of voters 1..=n (plus learners), leader 1; `down` answer no
    /// status, `erring` report an error.
    fn view(n: u64, learners: &[u64], down: &[u64], erring: &[u64]) -> ClusterView {
        let mut members: Vec<_> = (1..=n).map(|i| member(i, false)).collect();
        members.extend(learners.iter().map(|&i| member(i, true)));
        let statuses = (1..=n)
            .map(|i| {
                let s = if down.contains(&i) {
                    Err(Error::Unavailable(Failure {
                        node: None,
                        message: "down".into(),
                    }))
                } else if erring.contains(&i) {
                    Ok(status(1, &["NOSPACE"]))
                } else {
                    Ok(status(1, &[]))
                };
                (member(i, false), s)
            })
            .collect();
        ClusterView {
            members,
            statuses,
            disagreements: Vec::new(),
        }
    }

    #[test]
    fn removal_rules() {
        struct Case {
            what: &'static str,
            view: ClusterView,
            remove: u64,
            want: Result<(), &'static str>,
        }
        let mut disagreeing = view(3, &[], &[], &[]);
        disagreeing
            .disagreements
            .push("cp-2 sees cp-1, cp-2".into());
        let cases = [
            Case {
                what: "3 healthy voters, one leaves",
                view: view(3, &[], &[], &[]),
                remove: 3,
                want: Ok(()),
            },
            Case {
                what: "the leaving voter may be down",
                view: view(3, &[], &[3], &[]),
                remove: 3,
                want: Ok(()),
            },
            Case {
                what: "a remaining voter down",
                view: view(3, &[], &[2], &[]),
                remove: 3,
                want: Err("unhealthy"),
            },
            Case {
                what: "a remaining voter reporting errors",
                view: view(3, &[], &[], &[1]),
                remove: 3,
                want: Err("unhealthy"),
            },
            Case {
                what: "the last voter",
                view: view(1, &[], &[], &[]),
                remove: 1,
                want: Err("last"),
            },
            Case {
                what: "a learner catching up",
                view: view(3, &[4], &[], &[]),
                remove: 3,
                want: Err("learner"),
            },
            Case {
                what: "lists disagree",
                view: disagreeing,
                remove: 3,
                want: Err("disagree"),
            },
            Case {
                what: "2 voters, one leaves",
                view: view(2, &[], &[], &[]),
                remove: 2,
                want: Ok(()),
            },
        ];
        for case in cases {
            let got = check_removal(&case.view, MemberId(case.remove), "x");
            match (case.want, got) {
                (Ok(()), Ok(())) => {}
                (Err(word), Err(refusal)) => assert!(
                    refusal.to_string().contains(word),
                    "{}: {refusal}",
                    case.what
                ),
                (want, got) => panic!("{}: want {want:?}, got {got:?}", case.what),
            }
        }
    }

    #[test]
    fn source_choice() {
        // (view, exclude, want)
        let cases = [
            (view(3, &[], &[], &[]), None, Some("cp-2")),
            (view(3, &[], &[], &[]), Some(2), Some("cp-3")),
            (view(3, &[], &[2], &[]), Some(3), Some("cp-1")),
            (view(3, &[], &[2, 3], &[]), None, Some("cp-1")),
            (view(3, &[4], &[], &[2, 3]), None, Some("cp-1")),
            (view(2, &[], &[1], &[]), Some(2), None),
            (view(1, &[2], &[], &[]), Some(1), None),
        ];
        for (i, (view, exclude, want)) in cases.into_iter().enumerate() {
            let got = pick_source(&view, exclude.map(MemberId));
            match (want, got) {
                (Some(name), Ok(source)) => {
                    assert_eq!(source.name, name, "case {i}");
                    assert_eq!(source.address, format!("10.0.0.{}", &name[3..]));
                }
                (None, Err(Refusal::NoSnapshotSource)) => {}
                (want, got) => panic!("case {i}: want {want:?}, got {got:?}"),
            }
        }
    }

    /// `view(3, ..)` whose voters are at the given raft indexes.
    fn at_indexes(indexes: &[u64]) -> ClusterView {
        let mut v = view(indexes.len() as u64, &[], &[], &[]);
        for ((_, s), index) in v.statuses.iter_mut().zip(indexes) {
            if let Ok(s) = s {
                s.raft_index = *index;
            }
        }
        v
    }

    #[test]
    fn unhealthy_voter_rules() {
        let cases: [(ClusterView, Option<u64>, &[&str]); 9] = [
            // A voter trailing by more than MAX_RAFT_LAG entries is not
            // healthy; by exactly that many, it is.
            (at_indexes(&[5000, 3999, 5000]), None, &["cp-2"]),
            (at_indexes(&[5000, 4000, 5000]), None, &[]),
            // The excepted member neither trails nor sets the top.
            (at_indexes(&[5000, 3000, 9000]), Some(3), &["cp-2"]),
            (at_indexes(&[3000, 3000, 9000]), Some(3), &[]),
            (view(3, &[], &[], &[]), None, &[]),
            (view(3, &[], &[2], &[]), None, &["cp-2"]),
            (view(3, &[], &[2], &[3]), None, &["cp-2", "cp-3"]),
            (view(3, &[], &[2], &[]), Some(2), &[]),
            // Learners do not vote: never counted unhealthy.
            (view(3, &[4], &[], &[]), None, &[]),
        ];
        for (i, (view, except, want)) in cases.into_iter().enumerate() {
            let got = unhealthy_voters(&view, except.map(MemberId));
            let names: Vec<_> = got
                .iter()
                .map(|s| s.split(' ').next().unwrap().to_string())
                .collect();
            assert_eq!(names, want, "case {i}: {got:?}");
        }
    }
}
