//! etcd calls: membership, leadership, status, alarms, defragmentation,
//! snapshots and recovery.

use std::fmt;
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::{Stream, StreamExt as _};

use super::data_stream::{DataStream, Item};
use super::reply::metadata_error;
use super::{Client, Error, Idempotency, One, Result, Scope, machine_stub};
use crate::api::{common, machine};

/// An etcd member id, shown (and parsed) as 16 hex digits like talosctl.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MemberId(pub u64);

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl FromStr for MemberId {
    type Err = std::num::ParseIntError;

    /// Parses hex, with or without a `0x` prefix.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let digits = s.trim().trim_start_matches("0x").trim_start_matches("0X");
        u64::from_str_radix(digits, 16).map(MemberId)
    }
}

impl serde::Serialize for MemberId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for MemberId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse()
            .map_err(|_| serde::de::Error::custom(format!("member id {text:?} is not hex")))
    }
}

/// One member of the etcd cluster.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct EtcdMember {
    /// Member id.
    pub id: MemberId,
    /// Member name (the node's hostname).
    pub hostname: String,
    /// URLs for peer traffic.
    pub peer_urls: Vec<String>,
    /// URLs for client traffic.
    pub client_urls: Vec<String>,
    /// A learner replicates but does not vote.
    pub is_learner: bool,
}

impl From<machine::EtcdMember> for EtcdMember {
    fn from(m: machine::EtcdMember) -> Self {
        EtcdMember {
            id: MemberId(m.id),
            hostname: m.hostname,
            peer_urls: m.peer_urls,
            client_urls: m.client_urls,
            is_learner: m.is_learner,
        }
    }
}

/// The status of one etcd member, as its node reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct EtcdMemberStatus {
    /// This member's id.
    pub member_id: MemberId,
    /// The cluster protocol version.
    pub protocol_version: String,
    /// Storage version (etcd 3.6+; empty otherwise).
    pub storage_version: String,
    /// Physically allocated database size, bytes.
    pub db_size: i64,
    /// Logically used database size, bytes.
    pub db_size_in_use: i64,
    /// The leader this member believes in (0: none).
    pub leader: MemberId,
    /// Raft committed index.
    pub raft_index: u64,
    /// Raft term.
    pub raft_term: u64,
    /// Raft applied index.
    pub raft_applied_index: u64,
    /// Alarm and health errors.
    pub errors: Vec<String>,
    /// Whether this member is a learner.
    pub is_learner: bool,
}

impl EtcdMemberStatus {
    /// Whether this member is the leader.
    pub fn is_leader(&self) -> bool {
        self.leader.0 != 0 && self.leader == self.member_id
    }
}

impl From<machine::EtcdMemberStatus> for EtcdMemberStatus {
    fn from(s: machine::EtcdMemberStatus) -> Self {
        EtcdMemberStatus {
            member_id: MemberId(s.member_id),
            protocol_version: s.protocol_version,
            storage_version: s.storage_version,
            db_size: s.db_size,
            db_size_in_use: s.db_size_in_use,
            leader: MemberId(s.leader),
            raft_index: s.raft_index,
            raft_term: s.raft_term,
            raft_applied_index: s.raft_applied_index,
            errors: s.errors,
            is_learner: s.is_learner,
        }
    }
}

/// The kind of an etcd alarm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum AlarmType {
    /// No alarm.
    None,
    /// The backend quota is exhausted.
    Nospace,
    /// Data corruption was detected.
    Corrupt,
}

impl fmt::Display for AlarmType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AlarmType::None => "NONE",
            AlarmType::Nospace => "NOSPACE",
            AlarmType::Corrupt => "CORRUPT",
        })
    }
}

/// An alarm raised on one member.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MemberAlarm {
    /// The member.
    pub member_id: MemberId,
    /// The alarm.
    pub alarm: AlarmType,
}

fn alarms(list: Vec<machine::EtcdMemberAlarm>) -> Vec<MemberAlarm> {
    use machine::etcd_member_alarm::AlarmType as Wire;
    list.into_iter()
        .map(|a| MemberAlarm {
            member_id: MemberId(a.member_id),
            alarm: match Wire::try_from(a.alarm) {
                Ok(Wire::Nospace) => AlarmType::Nospace,
                Ok(Wire::Corrupt) => AlarmType::Corrupt,
                _ => AlarmType::None,
            },
        })
        .collect()
}

impl<S: Scope> Client<S> {
    /// Lists etcd members. `query_local` asks the node's own member
    /// (serializable read), as `talosctl etcd members` does.
    pub async fn etcd_member_list(&self, query_local: bool) -> Result<S::Output<Vec<EtcdMember>>> {
        self.unary(
            Idempotency::Read,
            |t| async move {
                machine_stub(t)
                    .etcd_member_list(machine::EtcdMemberListRequest { query_local })
                    .await
            },
            |m: machine::EtcdMembers| Ok(m.members.into_iter().map(EtcdMember::from).collect()),
        )
        .await
    }

    /// Reports the status of the node's etcd member.
    pub async fn etcd_status(&self) -> Result<S::Output<EtcdMemberStatus>> {
        self.unary(
            Idempotency::Read,
            |t| async move { machine_stub(t).etcd_status(()).await },
            |m: machine::EtcdStatus| {
                m.member_status
                    .map(EtcdMemberStatus::from)
                    .ok_or_else(|| Error::protocol(None, "EtcdStatus without member_status"))
            },
        )
        .await
    }

    /// Lists the alarms raised in the etcd cluster.
    pub async fn etcd_alarm_list(&self) -> Result<S::Output<Vec<MemberAlarm>>> {
        self.unary(
            Idempotency::Read,
            |t| async move { machine_stub(t).etcd_alarm_list(()).await },
            |m: machine::EtcdAlarm| Ok(alarms(m.member_alarms)),
        )
        .await
    }

    /// Disarms the etcd alarms; returns those that were disarmed.
    pub async fn etcd_alarm_disarm(&self) -> Result<S::Output<Vec<MemberAlarm>>> {
        self.unary(
            Idempotency::Mutation,
            |t| async move { machine_stub(t).etcd_alarm_disarm(()).await },
            |m: machine::EtcdAlarmDisarm| Ok(alarms(m.member_alarms)),
        )
        .await
    }

    /// Defragments the node's etcd database (heavy: one node at a time).
    pub async fn etcd_defragment(&self) -> Result<S::Output<()>> {
        self.unary(
            Idempotency::Mutation,
            |t| async move { machine_stub(t).etcd_defragment(()).await },
            |_: machine::EtcdDefragment| Ok(()),
        )
        .await
    }

    /// Moves etcd leadership away from the node if it leads. Returns the new
    /// leader's name, or `None` when the node was not the leader.
    pub async fn etcd_forfeit_leadership(&self) -> Result<S::Output<Option<String>>> {
        self.unary(
            Idempotency::Mutation,
            |t| async move {
                machine_stub(t)
                    .etcd_forfeit_leadership(machine::EtcdForfeitLeadershipRequest {})
                    .await
            },
            |m: machine::EtcdForfeitLeadership| Ok(Some(m.member).filter(|s| !s.is_empty())),
        )
        .await
    }

    /// Makes the node's etcd member leave the cluster; the node stops etcd
    /// and deletes its data.
    pub async fn etcd_leave_cluster(&self) -> Result<S::Output<()>> {
        self.unary(
            Idempotency::Mutation,
            |t| async move {
                machine_stub(t)
                    .etcd_leave_cluster(machine::EtcdLeaveClusterRequest {})
                    .await
            },
            |_: machine::EtcdLeaveCluster| Ok(()),
        )
        .await
    }

    /// Removes a member that no longer has a node, by id.
    pub async fn etcd_remove_member_by_id(&self, id: MemberId) -> Result<S::Output<()>> {
        self.unary(
            Idempotency::Mutation,
            |t| async move {
                machine_stub(t)
                    .etcd_remove_member_by_id(machine::EtcdRemoveMemberByIdRequest {
                        member_id: id.0,
                    })
                    .await
            },
            |_: machine::EtcdRemoveMemberById| Ok(()),
        )
        .await
    }

    /// Starts etcd in bootstrap mode on the node (optionally from a snapshot
    /// uploaded with [`Client::etcd_recover`]).
    pub async fn bootstrap(
        &self,
        recover_etcd: bool,
        skip_hash_check: bool,
    ) -> Result<S::Output<()>> {
        self.unary(
            Idempotency::Mutation,
            |t| async move {
                machine_stub(t)
                    .bootstrap(machine::BootstrapRequest {
                        recover_etcd,
                        recover_skip_hash_check: skip_hash_check,
                    })
                    .await
            },
            |_: machine::Bootstrap| Ok(()),
        )
        .await
    }
}

impl Client<One> {
    /// Streams a snapshot of the node's etcd database, in the chunks the
    /// server sends (1 KiB with Talos). Chunks are pulled as the caller reads
    /// them, so HTTP/2 flow control keeps memory flat for any size.
    ///
    /// For a verified snapshot on disk use [`crate::snapshot::save`].
    pub async fn etcd_snapshot(&self) -> Result<ByteStream> {
        self.data_stream(
            "/machine.MachineService/EtcdSnapshot",
            &machine::EtcdSnapshotRequest {},
        )
        .await
    }

    /// Starts a server-streaming call whose answers are `common.Data`, read
    /// by [`DataStream`] rather than the generated stub.
    pub(super) async fn data_stream(
        &self,
        path: &'static str,
        request: &impl prost::Message,
    ) -> Result<ByteStream> {
        let message = request.encode_to_vec();
        let mut framed = Vec::with_capacity(5 + message.len());
        framed.push(0);
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(&message);
        let framed = Bytes::from(framed);
        // A connection that broke under the endpoint in use fails the
        // request before any answer: the channel is dropped and the stream
        // opened once more through the next endpoint, as a unary read is
        // retried (these streams only read).
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (index, transport, node) = self.transport(&self.target, None).await?;
            match self
                .open_data_stream(path, framed.clone(), transport, &node)
                .await
            {
                Err(OpenError::Transport(e)) if attempt == 1 => {
                    tracing::debug!(error = %e, "stream not opened; trying the next endpoint");
                    self.conn.mark_failed(index).await;
                }
                Err(OpenError::Transport(e)) => {
                    return Err(Error::from_status(
                        &tonic::Status::from_error(e),
                        Some(&node),
                    ));
                }
                Err(OpenError::Other(e)) => return Err(e),
                Ok(inner) => return Ok(ByteStream { inner, node }),
            }
        }
    }

    async fn open_data_stream(
        &self,
        path: &'static str,
        framed: Bytes,
        transport: super::Transport,
        node: &str,
    ) -> std::result::Result<DataStream, OpenError> {
        use tower::ServiceExt as _;
        // The request tonic's generated client would send.
        let request = http::Request::builder()
            .method(http::Method::POST)
            .version(http::Version::HTTP_2)
            .uri(path)
            .header(http::header::TE, "trailers")
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .body(tonic::body::Body::new(http_body_util::Full::new(framed)))
            .map_err(|e| {
                OpenError::Other(Error::from_status(
                    &tonic::Status::internal(e.to_string()),
                    Some(node),
                ))
            })?;
        let response = transport
            .oneshot(request)
            .await
            .map_err(|e| OpenError::Transport(e.into()))?;
        DataStream::new(response).map_err(|s| OpenError::Other(Error::from_status(&s, Some(node))))
    }

    /// Uploads a snapshot for a later [`bootstrap`](Client::bootstrap) with
    /// `recover_etcd`.
    pub async fn etcd_recover<St>(&self, chunks: St) -> Result<()>
    where
        St: Stream<Item = Bytes> + Send + 'static,
    {
        let (_, transport, node) = self.transport(&self.target, None).await?;
        let request = chunks.map(|bytes| common::Data {
            metadata: None,
            bytes,
        });
        let response = machine_stub(transport)
            .etcd_recover(request)
            .await
            .map_err(|s| Error::from_status(&s, Some(&node)))?;
        let replies = super::reply::decode(response.into_inner(), &node, |_| Ok(()));
        One::finish(replies)
    }
}

/// A byte stream from the API (an etcd snapshot, a file). Yields the
/// payloads in order, in batches of about 256 KiB of what has arrived (not
/// the server's message boundaries); a node-side failure arrives as an error
/// item, and ends the stream.
pub struct ByteStream {
    inner: DataStream,
    node: String,
}

impl ByteStream {
    /// The node the stream comes from.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The next chunk, or `None` at the end of the stream.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>> {
        self.next().await.transpose()
    }
}

impl Stream for ByteStream {
    type Item = Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        this.inner.poll_item(cx).map(|item| {
            item.map(|item| match item {
                Ok(Item::Bytes(bytes)) => Ok(bytes),
                Ok(Item::Failed(metadata)) => Err(metadata_error(Some(&metadata))
                    .expect("a failed message carries an error")
                    .with_node(&this.node)),
                Err(status) => Err(Error::from_status(&status, Some(&this.node))),
            })
        })
    }
}

/// Why a data stream did not open.
enum OpenError {
    /// The connection failed under the request: nothing was answered.
    Transport(Box<dyn std::error::Error + Send + Sync>),
    /// The node answered with an error.
    Other(Error),
}
