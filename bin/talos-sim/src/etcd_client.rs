//! A small etcd v3 client over the generated `etcdserverpb` stubs, used by
//! the simulated nodes to drive their real etcd members.

use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use tonic::transport::Endpoint;

use crate::etcd_tls::{Connector, DeadlineChannel, EtcdPki};

use crate::api::etcdserverpb::cluster_client::ClusterClient;
use crate::api::etcdserverpb::kv_client::KvClient;
use crate::api::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::api::etcdserverpb::{
    self as pb, AlarmMember, AlarmRequest, DefragmentRequest, Member, MemberAddRequest,
    MemberListRequest, MemberPromoteRequest, MemberRemoveRequest, MoveLeaderRequest, PutRequest,
    RangeRequest, SnapshotRequest, StatusRequest, StatusResponse,
};

/// Timeout of one etcd request.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A membership request, as upstream's etcd client sends one: leader
/// required, made once, with the caller's deadline if it has one. When
/// raft drops the proposal (it ignores a membership change that arrives
/// while an earlier one is unapplied), the call waits for that deadline,
/// as a Talos node's does.
fn membership<T>(message: T, timeout: Option<Duration>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "hasleader",
        tonic::metadata::MetadataValue::from_static("true"),
    );
    if let Some(timeout) = timeout {
        request.set_timeout(timeout);
    }
    request
}

/// Channels to one or more etcd members, tried in order.
#[derive(Clone)]
pub struct EtcdClient {
    members: Vec<(String, DeadlineChannel)>,
    tls: Arc<ClientConfig>,
}

/// A lazily connected channel to the member at `url` (`https://ip:port`),
/// over TLS with `tls` (see [`crate::etcd_tls`]); no connect timeout: a
/// call waits for its own deadline ([`DeadlineChannel`]).
fn channel(url: &str, tls: &Arc<ClientConfig>) -> Result<DeadlineChannel, tonic::Status> {
    let invalid = |e: String| tonic::Status::invalid_argument(format!("etcd URL {url:?}: {e}"));
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| invalid(e.to_string()))?;
    let (Some(host), Some(port)) = (uri.host(), uri.port_u16()) else {
        return Err(invalid("no host and port".into()));
    };
    let connector = Connector {
        tls: tls.clone(),
        host: host.to_string(),
        port,
    };
    Ok(DeadlineChannel(
        Endpoint::from_shared(url.to_string())
            .map_err(|e| invalid(e.to_string()))?
            .connect_with_connector_lazy(connector),
    ))
}

/// `d` moved at random by up to `fraction` of it either way, as etcd's
/// client jitters its retry wait (client/v3 utils.go jitterUp).
fn jitter_up(d: Duration, fraction: f64) -> Duration {
    let unit = (crate::random_u64() % 1_000_000) as f64 / 1_000_000.0;
    d.mul_f64(1.0 + fraction * (unit * 2.0 - 1.0))
}

/// Whether `status` is the transport's, not the member's: a connection
/// refused or reset (Unavailable), or a TLS connection that did not
/// complete within the connect timeout, as to a frozen member (tonic
/// reports that as Unknown "transport error"). A status a member sent
/// carries no source. grpc-go's balancer skips such a connection.
fn unreachable(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some()
        && matches!(
            status.code(),
            tonic::Code::Unavailable | tonic::Code::Unknown
        )
}

fn with_timeout<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(CALL_TIMEOUT);
    request
}

/// A request that etcd refuses at once ("etcdserver: no leader",
/// Unavailable) while the member has no leader, instead of letting it wait
/// out its deadline: what upstream's `clientv3.WithRequireLeader` does for
/// the membership calls (v1alpha1_server.go).
fn require_leader<T>(message: T) -> tonic::Request<T> {
    let mut request = with_timeout(message);
    request.metadata_mut().insert(
        "hasleader",
        tonic::metadata::MetadataValue::from_static("true"),
    );
    request
}

impl EtcdClient {
    /// A client for the members at `urls` (`https://ip:port`), over TLS
    /// with the cluster's etcd client identity (`pki`).
    pub async fn connect(urls: &[String], pki: &EtcdPki) -> Result<EtcdClient, tonic::Status> {
        let tls = pki.client_config();
        let members = urls
            .iter()
            .map(|url| Ok((url.clone(), channel(url, &tls)?)))
            .collect::<Result<_, tonic::Status>>()?;
        Ok(EtcdClient { members, tls })
    }

    fn channel_for(&self, url: &str) -> Result<DeadlineChannel, tonic::Status> {
        match self.members.iter().find(|(u, _)| u == url) {
            Some((_, ch)) => Ok(ch.clone()),
            None => channel(url, &self.tls),
        }
    }

    /// Runs `call` against each member in turn until one answers without
    /// `Unavailable`.
    async fn first_answer<T, F, Fut>(&self, call: &F) -> Result<T, tonic::Status>
    where
        F: Fn(DeadlineChannel) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let mut last = tonic::Status::unavailable("no etcd endpoints");
        for (_, ch) in &self.members {
            match call(ch.clone()).await {
                Err(status)
                    if status.code() == tonic::Code::Unavailable || unreachable(&status) =>
                {
                    last = status
                }
                other => return other,
            }
        }
        Err(last)
    }

    /// Runs a call etcd's Go client marks repeatable (client/v3 retry.go:
    /// MemberList, Alarm, Range...) as that client's retry interceptor does
    /// (retry_interceptor.go, options.go): up to 100 attempts, round robin
    /// over the members, an `Unavailable` answer (such as "etcdserver: no
    /// leader" during an election) retried, with a 25 ms wait (jittered by
    /// 10%) after each round over a quorum of them. A member that cannot be
    /// reached is left out of the rounds that follow, as the balancer's
    /// picker skips a connection that is not ready. The last answer a member
    /// gave is returned when all attempts fail; the caller's deadline (which
    /// drops this future) ends the retries earlier.
    async fn repeatable<T, F, Fut>(&self, call: &F) -> Result<T, tonic::Status>
    where
        F: Fn(DeadlineChannel) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        const MAX_ATTEMPTS: usize = 100;
        const WAIT_BETWEEN: Duration = Duration::from_millis(25);
        let quorum = self.members.len() / 2 + 1;
        let mut reachable: Vec<bool> = vec![true; self.members.len()];
        let mut answered: Option<tonic::Status> = None;
        let mut unreachable_status = tonic::Status::unavailable("no etcd endpoints");
        let mut next = 0;
        for attempt in 0..MAX_ATTEMPTS {
            if attempt > 0 && attempt % quorum == 0 {
                tokio::time::sleep(jitter_up(WAIT_BETWEEN, 0.10)).await;
            }
            let Some(index) = (0..self.members.len())
                .map(|i| (next + i) % self.members.len())
                .find(|&i| reachable[i])
            else {
                break;
            };
            next = index + 1;
            match call(self.members[index].1.clone()).await {
                Err(status) if unreachable(&status) => {
                    reachable[index] = false;
                    unreachable_status = status;
                }
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    answered = Some(status);
                }
                other => return other,
            }
        }
        Err(answered.unwrap_or(unreachable_status))
    }

    /// Lists the members through a reachable member (retried as
    /// `Self::repeatable` says), as a linearizable read: upstream's etcd
    /// client (client/v3 cluster.go, v3.6) asks for one unless told to
    /// serialize, and Talos never does
    /// (v1alpha1_server.go EtcdMemberList, internal/pkg/etcd). A member
    /// that cannot confirm the cluster's current membership with a quorum
    /// (etcdserver's MemberList waits for a read index first) fails
    /// instead of answering what it last saw.
    pub async fn member_list(&self) -> Result<Vec<Member>, tonic::Status> {
        self.repeatable(&|ch| async move {
            let resp = ClusterClient::new(ch)
                .member_list(require_leader(MemberListRequest { linearizable: true }))
                .await?;
            Ok(resp.into_inner().members)
        })
        .await
    }

    /// Adds a member (as a learner when asked) in one call, within
    /// `timeout` if given; returns the new member.
    pub(crate) async fn member_add_within(
        &self,
        peer_url: &str,
        learner: bool,
        timeout: Option<Duration>,
    ) -> Result<Member, tonic::Status> {
        self.first_answer(&|ch| async move {
            let resp = ClusterClient::new(ch)
                .member_add(membership(
                    MemberAddRequest {
                        peer_ur_ls: vec![peer_url.to_string()],
                        is_learner: learner,
                    },
                    timeout,
                ))
                .await?
                .into_inner();
            resp.member
                .ok_or_else(|| tonic::Status::internal("MemberAdd returned no member"))
        })
        .await
    }

    /// Removes a member by id in one call, within `timeout` if given.
    pub(crate) async fn member_remove_within(
        &self,
        id: u64,
        timeout: Option<Duration>,
    ) -> Result<(), tonic::Status> {
        self.first_answer(&|ch| async move {
            ClusterClient::new(ch)
                .member_remove(membership(MemberRemoveRequest { id }, timeout))
                .await
                .map(drop)
        })
        .await
    }

    /// Promotes a learner to a voting member in one call, within `timeout`
    /// if given.
    pub(crate) async fn member_promote_within(
        &self,
        id: u64,
        timeout: Option<Duration>,
    ) -> Result<(), tonic::Status> {
        self.first_answer(&|ch| async move {
            ClusterClient::new(ch)
                .member_promote(membership(MemberPromoteRequest { id }, timeout))
                .await
                .map(drop)
        })
        .await
    }

    /// Adds a member (as a learner when asked) in one call with the
    /// default deadline; returns the new member.
    pub async fn member_add(&self, peer_url: &str, learner: bool) -> Result<Member, tonic::Status> {
        self.member_add_within(peer_url, learner, Some(CALL_TIMEOUT))
            .await
    }

    /// Removes a member by id in one call with the default deadline.
    pub async fn member_remove(&self, id: u64) -> Result<(), tonic::Status> {
        self.member_remove_within(id, Some(CALL_TIMEOUT)).await
    }

    /// Promotes a learner in one call with the default deadline.
    pub async fn member_promote(&self, id: u64) -> Result<(), tonic::Status> {
        self.member_promote_within(id, Some(CALL_TIMEOUT)).await
    }

    /// Status of the member at `url`.
    pub async fn status(&self, url: &str) -> Result<StatusResponse, tonic::Status> {
        let resp = MaintenanceClient::new(self.channel_for(url)?)
            .status(with_timeout(StatusRequest {}))
            .await?;
        Ok(resp.into_inner())
    }

    /// Lists active alarms (cluster-wide).
    pub async fn alarm_list(&self) -> Result<Vec<AlarmMember>, tonic::Status> {
        self.repeatable(&|ch| async move {
            let resp = MaintenanceClient::new(ch)
                .alarm(with_timeout(AlarmRequest {
                    action: pb::alarm_request::AlarmAction::Get as i32,
                    member_id: 0,
                    alarm: pb::AlarmType::None as i32,
                }))
                .await?;
            Ok(resp.into_inner().alarms)
        })
        .await
    }

    /// Raises an alarm on a member (for tests and demonstrations).
    pub async fn alarm_activate(
        &self,
        member_id: u64,
        alarm: pb::AlarmType,
    ) -> Result<(), tonic::Status> {
        self.first_answer(&|ch| async move {
            MaintenanceClient::new(ch)
                .alarm(with_timeout(AlarmRequest {
                    action: pb::alarm_request::AlarmAction::Activate as i32,
                    member_id,
                    alarm: alarm as i32,
                }))
                .await
                .map(drop)
        })
        .await
    }

    /// Disarms every active alarm; returns the alarms that were disarmed.
    pub async fn alarm_disarm_all(&self) -> Result<Vec<AlarmMember>, tonic::Status> {
        let mut disarmed = Vec::new();
        for alarm in self.alarm_list().await? {
            let resp = self
                .first_answer(&|ch| async move {
                    MaintenanceClient::new(ch)
                        .alarm(with_timeout(AlarmRequest {
                            action: pb::alarm_request::AlarmAction::Deactivate as i32,
                            member_id: alarm.member_id,
                            alarm: alarm.alarm,
                        }))
                        .await
                })
                .await?;
            disarmed.extend(resp.into_inner().alarms);
        }
        Ok(disarmed)
    }

    /// Defragments the member at `url`.
    pub async fn defragment(&self, url: &str) -> Result<(), tonic::Status> {
        let mut request = tonic::Request::new(DefragmentRequest {});
        request.set_timeout(Duration::from_secs(300));
        MaintenanceClient::new(self.channel_for(url)?)
            .defragment(request)
            .await
            .map(drop)
    }

    /// Streams a snapshot of the member at `url` (etcd appends a sha256
    /// trailer to the database bytes).
    pub async fn snapshot(
        &self,
        url: &str,
    ) -> Result<tonic::Streaming<pb::SnapshotResponse>, tonic::Status> {
        // No deadline: a snapshot takes as long as it takes.
        let channel = channel(url, &self.tls)?;
        let resp = MaintenanceClient::new(channel)
            .max_decoding_message_size(64 << 20)
            .snapshot(SnapshotRequest {})
            .await?;
        Ok(resp.into_inner())
    }

    /// Asks the leader at `leader_url` to hand leadership to `target`.
    pub async fn move_leader(&self, leader_url: &str, target: u64) -> Result<(), tonic::Status> {
        MaintenanceClient::new(self.channel_for(leader_url)?)
            .move_leader(require_leader(MoveLeaderRequest { target_id: target }))
            .await
            .map(drop)
    }

    /// Validates, enables or cancels a downgrade of the cluster's storage
    /// to `version` (`MAJOR.MINOR`) through the member at `url`, as the
    /// client's `Downgrade` sends it (leader required); returns the cluster
    /// version the member reports.
    pub async fn downgrade(
        &self,
        url: &str,
        action: pb::downgrade_request::DowngradeAction,
        version: &str,
    ) -> Result<String, tonic::Status> {
        let resp = MaintenanceClient::new(self.channel_for(url)?)
            .downgrade(require_leader(pb::DowngradeRequest {
                action: action as i32,
                version: version.to_string(),
            }))
            .await?;
        Ok(resp.into_inner().version)
    }

    /// Writes a key.
    pub async fn put(&self, key: Vec<u8>, value: Vec<u8>) -> Result<(), tonic::Status> {
        self.first_answer(&|ch| {
            let (key, value) = (key.clone(), value.clone());
            async move {
                KvClient::new(ch)
                    .max_encoding_message_size(64 << 20)
                    .put(with_timeout(PutRequest {
                        key,
                        value,
                        lease: 0,
                    }))
                    .await
                    .map(drop)
            }
        })
        .await
    }

    /// Deletes every key under `prefix`, then compacts the history up to
    /// that revision (physically), so that the space the deleted values
    /// held is free for a defragmentation to give back. Returns how many
    /// keys were deleted.
    pub async fn delete_prefix_and_compact(&self, prefix: &[u8]) -> Result<i64, tonic::Status> {
        let mut range_end = prefix.to_vec();
        if let Some(last) = range_end.last_mut() {
            *last += 1;
        }
        let deleted = self
            .first_answer(&|ch| {
                let (key, range_end) = (prefix.to_vec(), range_end.clone());
                async move {
                    KvClient::new(ch)
                        .delete_range(with_timeout(pb::DeleteRangeRequest {
                            key,
                            range_end,
                            prev_kv: false,
                        }))
                        .await
                        .map(tonic::Response::into_inner)
                }
            })
            .await?;
        let revision = deleted.header.map_or(0, |h| h.revision);
        self.first_answer(&|ch| async move {
            KvClient::new(ch)
                .compact(with_timeout(pb::CompactionRequest {
                    revision,
                    physical: true,
                }))
                .await
                .map(drop)
        })
        .await?;
        Ok(deleted.deleted)
    }

    /// A linearizable read of `key` from the member at `url`, within
    /// `timeout`: what upstream's etcd health check sends
    /// (internal/pkg/etcd/etcd.go, ValidateQuorum). A learner refuses it
    /// ("etcdserver: rpc not supported for learner"), and a member without
    /// quorum cannot answer it.
    pub async fn get_linearizable(
        &self,
        url: &str,
        key: &[u8],
        timeout: Duration,
    ) -> Result<(), tonic::Status> {
        let mut request = tonic::Request::new(RangeRequest {
            key: key.to_vec(),
            serializable: false,
            ..RangeRequest::default()
        });
        request.set_timeout(timeout);
        KvClient::new(self.channel_for(url)?)
            .range(request)
            .await
            .map(drop)
    }
}
