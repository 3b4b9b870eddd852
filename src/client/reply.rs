//! Turning Talos responses (`repeated X messages = 1`, each message carrying
//! `common.Metadata`) into per-node results.

use tonic::Code;

use super::error::Error;
use crate::api::{cluster, common, machine};

/// The outcome of a call on one node.
#[derive(Debug)]
pub struct NodeResult<T> {
    /// The node (as targeted, or as apid named it in `metadata.hostname`).
    pub node: String,
    /// What that node answered.
    pub result: Result<T, Error>,
}

impl<T> NodeResult<T> {
    /// Maps the success value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> NodeResult<U> {
        NodeResult {
            node: self.node,
            result: self.result.map(f),
        }
    }
}

/// Per-node outcomes of a call that targeted several nodes.
pub type NodeResults<T> = Vec<NodeResult<T>>;

/// A response message that carries Talos metadata.
pub(crate) trait WithMetadata {
    fn metadata(&self) -> Option<&common::Metadata>;
}

/// A Talos response: a list of per-node messages.
pub(crate) trait Messages {
    type Item: WithMetadata;
    fn into_messages(self) -> Vec<Self::Item>;
}

macro_rules! talos_response {
    ($($response:ty => $item:ty),* $(,)?) => {$(
        impl WithMetadata for $item {
            fn metadata(&self) -> Option<&common::Metadata> {
                self.metadata.as_ref()
            }
        }
        impl Messages for $response {
            type Item = $item;
            fn into_messages(self) -> Vec<$item> {
                self.messages
            }
        }
    )*};
}

talos_response! {
    machine::ApplyConfigurationResponse => machine::ApplyConfiguration,
    machine::BootstrapResponse => machine::Bootstrap,
    machine::EtcdMemberListResponse => machine::EtcdMembers,
    machine::EtcdRemoveMemberByIdResponse => machine::EtcdRemoveMemberById,
    machine::EtcdLeaveClusterResponse => machine::EtcdLeaveCluster,
    machine::EtcdForfeitLeadershipResponse => machine::EtcdForfeitLeadership,
    machine::EtcdRecoverResponse => machine::EtcdRecover,
    machine::EtcdAlarmListResponse => machine::EtcdAlarm,
    machine::EtcdAlarmDisarmResponse => machine::EtcdAlarmDisarm,
    machine::EtcdDefragmentResponse => machine::EtcdDefragment,
    machine::EtcdStatusResponse => machine::EtcdStatus,
    machine::HostnameResponse => machine::Hostname,
    machine::RebootResponse => machine::Reboot,
    machine::ResetResponse => machine::Reset,
    machine::ServiceListResponse => machine::ServiceList,
    machine::ShutdownResponse => machine::Shutdown,
    machine::VersionResponse => machine::Version,
}

impl WithMetadata for common::Data {
    fn metadata(&self) -> Option<&common::Metadata> {
        self.metadata.as_ref()
    }
}

impl WithMetadata for cluster::HealthCheckProgress {
    fn metadata(&self) -> Option<&common::Metadata> {
        self.metadata.as_ref()
    }
}

/// The error a message's metadata reports, if any. apid sets
/// `metadata.error` (and `metadata.status`) on the message it substitutes for
/// a node that failed; the rest of such a message is meaningless.
pub(crate) fn metadata_error(metadata: Option<&common::Metadata>) -> Option<Error> {
    let md = metadata?;
    let status_code = md.status.as_ref().map_or(0, |s| s.code);
    if md.error.is_empty() && status_code == 0 {
        return None;
    }
    let code = match md.status.as_ref() {
        Some(s) if s.code != 0 => Code::from_i32(s.code),
        _ => Code::Unknown,
    };
    let message = if md.error.is_empty() {
        md.status
            .as_ref()
            .map(|s| s.message.clone())
            .unwrap_or_default()
    } else {
        md.error.clone()
    };
    Some(Error::from_code(code, message, Some(&md.hostname)))
}

/// Decodes every message of a response into a per-node result. Messages
/// without `metadata.hostname` are attributed to `default_node`.
pub(crate) fn decode<R, T>(
    response: R,
    default_node: &str,
    convert: impl Fn(R::Item) -> Result<T, Error>,
) -> NodeResults<T>
where
    R: Messages,
{
    response
        .into_messages()
        .into_iter()
        .map(|message| {
            let node = message
                .metadata()
                .map(|md| md.hostname.clone())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| default_node.to_string());
            let result = match metadata_error(message.metadata()) {
                Some(error) => Err(error.with_node(&node)),
                None => convert(message).map_err(|e| e.with_node(&node)),
            };
            NodeResult { node, result }
        })
        .collect()
}
