//! Turning Talos responses (`repeated X messages = 1`, each message carrying
//! `common.Metadata`) into per-node results.

use tonic::Code;

use super::error::Error;
use crate::api::{cluster, common, machine};

/// The outcome of a call on one node.
#[derive(Debug)]
#[non_exhaustive]
pub struct NodeResult<T> {
    /// The node (as targeted, or as apid named it in `metadata.hostname`).
    pub node: String,
    /// What that node answered.
    pub result: Result<T, Error>,
}

impl<T> NodeResult<T> {
    /// One node's outcome (for callers that call each node themselves and
    /// collect the answers as a fanned-out call returns them).
    pub fn new(node: impl Into<String>, result: Result<T, Error>) -> Self {
        NodeResult {
            node: node.into(),
            result,
        }
    }

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
    machine::ContainersResponse => machine::Container,
    machine::EtcdDowngradeValidateResponse => machine::EtcdDowngradeValidate,
    machine::EtcdDowngradeEnableResponse => machine::EtcdDowngradeEnable,
    machine::EtcdDowngradeCancelResponse => machine::EtcdDowngradeCancel,
    machine::ServiceStartResponse => machine::ServiceStart,
    machine::ServiceStopResponse => machine::ServiceStop,
    machine::ServiceRestartResponse => machine::ServiceRestart,
    machine::EtcdMemberListResponse => machine::EtcdMembers,
    machine::EtcdRemoveMemberByIdResponse => machine::EtcdRemoveMemberById,
    machine::EtcdLeaveClusterResponse => machine::EtcdLeaveCluster,
    machine::EtcdForfeitLeadershipResponse => machine::EtcdForfeitLeadership,
    machine::EtcdRecoverResponse => machine::EtcdRecover,
    machine::EtcdAlarmListResponse => machine::EtcdAlarm,
    machine::EtcdAlarmDisarmResponse => machine::EtcdAlarmDisarm,
    machine::EtcdDefragmentResponse => machine::EtcdDefragment,
    machine::EtcdStatusResponse => machine::EtcdStatus,
    machine::GenerateClientConfigurationResponse => machine::GenerateClientConfiguration,
    machine::HostnameResponse => machine::Hostname,
    machine::RebootResponse => machine::Reboot,
    machine::UpgradeResponse => machine::Upgrade,
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
///
/// Like the official Go client (`FilterMessages` in pkg/machinery/client),
/// the status wins when present: its code and its message. `metadata.error`
/// is Go's rendering of the same status (`rpc error: code = ... desc = ...`)
/// and is used only without a status, so a node's failure reads the same
/// whether it came through `node` or `nodes`.
pub(crate) fn metadata_error(metadata: Option<&common::Metadata>) -> Option<Error> {
    let md = metadata?;
    let status = md.status.as_ref().filter(|s| s.code != 0);
    if md.error.is_empty() && status.is_none() {
        return None;
    }
    let (code, message) = match status {
        Some(s) if !s.message.is_empty() => (Code::from_i32(s.code), s.message.clone()),
        Some(s) => (Code::from_i32(s.code), md.error.clone()),
        None => (Code::Unknown, md.error.clone()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::google;
    use crate::client::Failure;

    fn metadata(error: &str, status: Option<(i32, &str)>) -> common::Metadata {
        common::Metadata {
            hostname: "10.0.0.3".into(),
            error: error.into(),
            status: status.map(|(code, message)| google::rpc::Status {
                code,
                message: message.into(),
                details: vec![],
            }),
        }
    }

    fn failure(error: Error) -> (Code, Failure) {
        match error {
            Error::Unavailable(f) => (Code::Unavailable, f),
            Error::Status { code, failure } => (code, failure),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn status_message_wins_over_the_go_rendering_like_the_official_client() {
        // What apid's BuildError sends for a node it cannot reach.
        let md = metadata(
            "rpc error: code = Unavailable desc = connection refused",
            Some((14, "connection refused")),
        );
        let (code, f) = failure(metadata_error(Some(&md)).unwrap());
        assert_eq!(code, Code::Unavailable);
        assert_eq!(f.message, "connection refused");
        assert_eq!(f.node.as_deref(), Some("10.0.0.3"));
    }

    #[test]
    fn error_string_is_used_without_a_status() {
        let (code, f) = failure(metadata_error(Some(&metadata("it broke", None))).unwrap());
        assert_eq!((code, f.message.as_str()), (Code::Unknown, "it broke"));
        let md = metadata("rpc error: code = Unavailable desc = x", Some((14, "")));
        let (code, f) = failure(metadata_error(Some(&md)).unwrap());
        assert_eq!(code, Code::Unavailable);
        assert_eq!(f.message, "rpc error: code = Unavailable desc = x");
        assert!(metadata_error(Some(&metadata("", None))).is_none());
        assert!(metadata_error(Some(&metadata("", Some((0, "ok"))))).is_none());
    }
}
