//! The quorum guard of a plain reset: a non-graceful reset of a node that
//! is still a voting etcd member leaves a dead member that still counts for
//! quorum, so it is refused (the retire operation leaves etcd first).

use super::{OpsError, Refusal};
use crate::{Client, Error};

/// Refuses a non-graceful reset of `node` while it is a voting etcd member.
/// An unreachable node passes (the reset itself will fail); a node without
/// etcd (a worker) passes.
pub async fn check_plain_reset(client: &Client, node: &str) -> Result<(), OpsError> {
    let target = client.node(node);
    let hostname = match target.hostname().await {
        Ok(h) => h,
        Err(_) => return Ok(()),
    };
    let members = match target.etcd_member_list(false).await {
        Ok(m) => m,
        Err(Error::Unimplemented(_)) => return Ok(()),
        Err(e) => {
            return Err(Refusal::MembershipUnknown {
                node: node.into(),
                error: e.to_string(),
            }
            .into());
        }
    };
    let voters = members.iter().filter(|m| !m.is_learner).count();
    if members
        .iter()
        .any(|m| m.hostname == hostname && !m.is_learner)
    {
        let quorum = super::cluster::quorum(voters);
        return Err(Refusal::ResetOfVoter {
            node: node.into(),
            hostname,
            voters,
            quorum,
        }
        .into());
    }
    Ok(())
}
