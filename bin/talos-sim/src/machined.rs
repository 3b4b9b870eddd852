//! The machined side of a simulated node: the Talos calls, answered from the
//! node's real etcd member and simulated machine state. Behaviour follows
//! siderolabs/talos internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tonic::{Request, Response, Status};

use super::machined_control as control;
use super::machined_etcd as etcd;
use super::node::{Action, Node, system_volumes};
use super::shared::Shared;
use crate::api::cluster::{HealthCheckProgress, HealthCheckRequest};
use crate::api::etcdserverpb::downgrade_request::DowngradeAction as Downgrade;
use crate::api::machine;
use crate::api::server::cluster::cluster_service_server::ClusterService;
use crate::api::server::machine::machine_service_server::MachineService;
use crate::api::{common, machine::reset_request::WipeMode};

type BoxStream<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

/// The rollback delay of a TRY apply when the request sets none
/// (constants.ConfigTryTimeout upstream).
pub(crate) const DEFAULT_TRY_TIMEOUT: Duration = Duration::from_secs(60);

/// One node's Talos API implementation.
#[derive(Clone)]
pub(crate) struct Machined {
    pub node: Arc<Node>,
    pub shared: Arc<Shared>,
}

fn one<T>(message: T) -> Result<Response<T>, Status> {
    Ok(Response::new(message))
}

pub(crate) fn actor_id() -> String {
    let a = super::random_u64();
    let b = super::random_u64();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | (b >> 48) & 0x3fff,
        b & 0xffff_ffff_ffff
    )
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

impl Machined {
    /// The etcd service as machined reports it: its health is the last
    /// result of the service's own check (see [`crate::etcd_health`]),
    /// unknown until the first one.
    async fn etcd_service(&self) -> machine::ServiceInfo {
        let running = self.node.etcd_running().await;
        let health = self.node.etcd_health.state();
        let events = self.node.etcd_events();
        machine::ServiceInfo {
            id: "etcd".into(),
            state: if running { "Running" } else { "Finished" }.into(),
            events: Some(machine::ServiceEvents {
                events: events
                    .into_iter()
                    .map(|e| machine::ServiceEvent {
                        msg: e.message,
                        state: e.state,
                        ts: Some(timestamp(e.at)),
                    })
                    .collect(),
            }),
            health: Some(machine::ServiceHealth {
                unknown: health.unknown,
                healthy: health.healthy,
                last_message: health.message,
                last_change: health.last_change.map(timestamp),
            }),
        }
    }

    /// The kubelet service (see [`crate::kubelet`]): running since its last
    /// start, its health unknown until the first check.
    fn kubelet_service(&self) -> machine::ServiceInfo {
        let Some(k) = self
            .node
            .kubelet
            .state(self.node.timing.kubelet_health_initial_delay)
        else {
            return Self::static_service("kubelet");
        };
        let event = |msg: &str, state: &str, at| machine::ServiceEvent {
            msg: msg.into(),
            state: state.into(),
            ts: Some(timestamp(at)),
        };
        let mut events = vec![
            event("Running pre stage", "Preparing", k.started),
            event("Creating service runner", "Preparing", k.started),
            event(
                "Started task kubelet (PID 0) for container kubelet",
                "Running",
                k.started,
            ),
        ];
        if k.checked {
            events.push(event("Health check successful", "Running", k.first_check));
        }
        machine::ServiceInfo {
            id: "kubelet".into(),
            state: "Running".into(),
            events: Some(machine::ServiceEvents { events }),
            health: Some(machine::ServiceHealth {
                unknown: !k.checked,
                healthy: k.checked,
                last_message: String::new(),
                last_change: k.checked.then(|| timestamp(k.first_check)),
            }),
        }
    }

    fn static_service(id: &str) -> machine::ServiceInfo {
        machine::ServiceInfo {
            id: id.into(),
            state: "Running".into(),
            events: Some(machine::ServiceEvents::default()),
            health: Some(machine::ServiceHealth {
                unknown: false,
                healthy: true,
                last_message: String::new(),
                last_change: None,
            }),
        }
    }

    /// Validates a reset request like upstream's Reset handler; returns the
    /// volume labels to wipe.
    fn reset_targets(&self, request: &machine::ResetRequest) -> Result<Vec<String>, Status> {
        let mode = WipeMode::try_from(request.mode).unwrap_or(WipeMode::All);
        if !request.user_disks_to_wipe.is_empty() {
            if mode == WipeMode::SystemDisk {
                return Err(Status::unknown(
                    "reset failed: invalid input, wipe mode SYSTEM_DISK doesn't support UserDisksToWipe parameter",
                ));
            }
            // A simulated node has no user disks.
            let device = &request.user_disks_to_wipe[0];
            return Err(Status::unknown(format!(
                "reset user disk failed: device {device} wasn't found"
            )));
        }
        if !request.system_partitions_to_wipe.is_empty() {
            if mode == WipeMode::UserDisks {
                return Err(Status::unknown(
                    "reset failed: invalid input, wipe mode USER_DISKS doesn't support SystemPartitionsToWipe parameter",
                ));
            }
            let mut targets = Vec::new();
            for spec in &request.system_partitions_to_wipe {
                self.node.locate_for_reset(&spec.label)?;
                if spec.wipe {
                    targets.push(spec.label.clone());
                }
            }
            return Ok(targets);
        }
        Ok(match mode {
            WipeMode::UserDisks => Vec::new(),
            _ => system_volumes(self.node.talos_version())
                .iter()
                .map(|s| s.to_string())
                .collect(),
        })
    }
}

#[tonic::async_trait]
impl MachineService for Machined {
    async fn version(
        &self,
        _request: Request<()>,
    ) -> Result<Response<machine::VersionResponse>, Status> {
        one(machine::VersionResponse {
            messages: vec![machine::Version {
                metadata: None,
                version: Some(machine::VersionInfo {
                    tag: self.node.talos_version().tag().into(),
                    sha: "talos-sim".into(),
                    built: String::new(),
                    go_version: format!("talos-sim {}", env!("CARGO_PKG_VERSION")),
                    os: "linux".into(),
                    arch: go_arch().into(),
                }),
                // A simulated node behaves as an installed machine (Reset
                // leaves etcd and wipes, which container mode skips): it
                // reports the metal platform in metal mode
                // (internal/app/machined/pkg/runtime/mode.go, Mode.String).
                platform: Some(machine::PlatformInfo {
                    name: "metal".into(),
                    mode: "metal".into(),
                }),
                features: self
                    .node
                    .is_configured()
                    .then_some(machine::FeaturesInfo { rbac: true }),
            }],
        })
    }

    async fn generate_client_configuration(
        &self,
        request: Request<machine::GenerateClientConfigurationRequest>,
    ) -> Result<Response<machine::GenerateClientConfigurationResponse>, Status> {
        crate::client_config::generate(&self.node, request.into_inner()).map(Response::new)
    }

    async fn hostname(
        &self,
        _request: Request<()>,
    ) -> Result<Response<machine::HostnameResponse>, Status> {
        one(machine::HostnameResponse {
            messages: vec![machine::Hostname {
                metadata: None,
                hostname: self.node.name.clone(),
            }],
        })
    }

    async fn service_list(
        &self,
        _request: Request<()>,
    ) -> Result<Response<machine::ServiceListResponse>, Status> {
        // The services of a Talos node, sorted by id as machined lists them
        // (internal/app/machined/pkg/system/system.go, List): etcd and
        // trustd run on control-plane nodes only.
        let control_plane = self.node.is_control_plane();
        let mut services = Vec::new();
        for id in [
            "apid",
            "containerd",
            "cri",
            "etcd",
            "kubelet",
            "machined",
            "trustd",
            "udevd",
        ] {
            match id {
                "etcd" if control_plane => services.push(self.etcd_service().await),
                "etcd" => {}
                "trustd" if !control_plane => {}
                "kubelet" => services.push(self.kubelet_service()),
                _ => services.push(Self::static_service(id)),
            }
        }
        one(machine::ServiceListResponse {
            messages: vec![machine::ServiceList {
                metadata: None,
                services,
            }],
        })
    }

    async fn apply_configuration(
        &self,
        request: Request<machine::ApplyConfigurationRequest>,
    ) -> Result<Response<machine::ApplyConfigurationResponse>, Status> {
        self.apply_configuration_call(request).await
    }

    async fn reset(
        &self,
        request: Request<machine::ResetRequest>,
    ) -> Result<Response<machine::ResetResponse>, Status> {
        let request = request.into_inner();
        let targets = self.reset_targets(&request)?;
        let actor = actor_id();
        // Like upstream, the reset sequence runs after the call returns.
        self.node.queue(Action::Reset {
            graceful: request.graceful,
            reboot: request.reboot,
            labels: targets,
            by_spec: !request.system_partitions_to_wipe.is_empty(),
            actor: actor.clone(),
        });
        one(machine::ResetResponse {
            messages: vec![machine::Reset {
                metadata: None,
                actor_id: actor,
            }],
        })
    }

    async fn reboot(
        &self,
        _request: Request<machine::RebootRequest>,
    ) -> Result<Response<machine::RebootResponse>, Status> {
        let actor = actor_id();
        self.node.queue(Action::Reboot {
            actor: actor.clone(),
        });
        one(machine::RebootResponse {
            messages: vec![machine::Reboot {
                metadata: None,
                actor_id: actor,
            }],
        })
    }

    async fn upgrade(
        &self,
        request: Request<machine::UpgradeRequest>,
    ) -> Result<Response<machine::UpgradeResponse>, Status> {
        super::machined_upgrade::legacy(self, request).await
    }

    async fn shutdown(
        &self,
        _request: Request<machine::ShutdownRequest>,
    ) -> Result<Response<machine::ShutdownResponse>, Status> {
        self.node.queue(Action::PowerOff);
        one(machine::ShutdownResponse {
            messages: vec![machine::Shutdown {
                metadata: None,
                actor_id: actor_id(),
            }],
        })
    }

    async fn bootstrap(
        &self,
        request: Request<machine::BootstrapRequest>,
    ) -> Result<Response<machine::BootstrapResponse>, Status> {
        self.node.check_controlplane("bootstrap")?;
        let request = request.into_inner();
        etcd::bootstrap(
            &self.node,
            request.recover_etcd,
            request.recover_skip_hash_check,
        )
        .await?;
        one(machine::BootstrapResponse {
            messages: vec![machine::Bootstrap { metadata: None }],
        })
    }

    async fn etcd_member_list(
        &self,
        request: Request<machine::EtcdMemberListRequest>,
    ) -> Result<Response<machine::EtcdMemberListResponse>, Status> {
        let members =
            etcd::member_list(&self.node, &self.shared, request.get_ref().query_local).await?;
        one(machine::EtcdMemberListResponse {
            messages: vec![members],
        })
    }

    async fn etcd_remove_member_by_id(
        &self,
        request: Request<machine::EtcdRemoveMemberByIdRequest>,
    ) -> Result<Response<machine::EtcdRemoveMemberByIdResponse>, Status> {
        etcd::remove_member_by_id(&self.node, &self.shared, request.get_ref().member_id).await?;
        one(machine::EtcdRemoveMemberByIdResponse {
            messages: vec![machine::EtcdRemoveMemberById { metadata: None }],
        })
    }

    async fn etcd_leave_cluster(
        &self,
        _request: Request<machine::EtcdLeaveClusterRequest>,
    ) -> Result<Response<machine::EtcdLeaveClusterResponse>, Status> {
        match self.node.take_leave_delay() {
            // The armed fault: the removal runs on its own, so it lands
            // after the delay even when the caller has given up.
            Some(delay) => {
                let (node, shared) = (self.node.clone(), self.shared.clone());
                let cause = crate::ledger::current_cause();
                tokio::spawn(crate::ledger::with_cause(cause, async move {
                    tokio::time::sleep(delay).await;
                    etcd::leave_cluster(&node, &shared).await
                }))
                .await
                .map_err(|e| Status::internal(e.to_string()))??;
            }
            None => etcd::leave_cluster(&self.node, &self.shared).await?,
        }
        one(machine::EtcdLeaveClusterResponse {
            messages: vec![machine::EtcdLeaveCluster { metadata: None }],
        })
    }

    async fn etcd_forfeit_leadership(
        &self,
        _request: Request<machine::EtcdForfeitLeadershipRequest>,
    ) -> Result<Response<machine::EtcdForfeitLeadershipResponse>, Status> {
        let member = etcd::forfeit_leadership(&self.node, &self.shared).await?;
        one(machine::EtcdForfeitLeadershipResponse {
            messages: vec![machine::EtcdForfeitLeadership {
                metadata: None,
                member,
            }],
        })
    }

    async fn read(
        &self,
        request: Request<machine::ReadRequest>,
    ) -> Result<Response<BoxStream<common::Data>>, Status> {
        let path = request.into_inner().path;
        let bytes = crate::files::read(&self.node, &path)?;
        let chunks: Vec<Result<common::Data, Status>> = bytes
            .chunks(crate::machined_etcd::SNAPSHOT_CHUNK)
            .map(|c| {
                Ok(common::Data {
                    metadata: None,
                    bytes: bytes::Bytes::copy_from_slice(c),
                })
            })
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }

    async fn kubeconfig(
        &self,
        _request: Request<()>,
    ) -> Result<Response<BoxStream<common::Data>>, Status> {
        self.node.check_controlplane("kubeconfig")?;
        if self.node.kubeconfig_withheld() {
            return Err(Status::unknown(
                "failed to generate admin kubeconfig: the cluster CA is not available",
            ));
        }
        let config = self.node.config.lock().expect("config lock").active.clone();
        let archive = crate::kubeconfig::archive(&config)?;
        let data = common::Data {
            metadata: None,
            bytes: archive.into(),
        };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(data)]))))
    }

    async fn etcd_snapshot(
        &self,
        _request: Request<machine::EtcdSnapshotRequest>,
    ) -> Result<Response<BoxStream<common::Data>>, Status> {
        let stream = etcd::snapshot(&self.node).await?;
        Ok(Response::new(Box::pin(stream)))
    }

    async fn etcd_recover(
        &self,
        request: Request<tonic::Streaming<common::Data>>,
    ) -> Result<Response<machine::EtcdRecoverResponse>, Status> {
        etcd::recover(&self.node, request.into_inner()).await?;
        one(machine::EtcdRecoverResponse {
            messages: vec![machine::EtcdRecover { metadata: None }],
        })
    }

    async fn etcd_alarm_list(
        &self,
        _request: Request<()>,
    ) -> Result<Response<machine::EtcdAlarmListResponse>, Status> {
        let member_alarms = etcd::alarm_list(&self.node).await?;
        one(machine::EtcdAlarmListResponse {
            messages: vec![machine::EtcdAlarm {
                metadata: None,
                member_alarms,
            }],
        })
    }

    async fn etcd_alarm_disarm(
        &self,
        _request: Request<()>,
    ) -> Result<Response<machine::EtcdAlarmDisarmResponse>, Status> {
        let member_alarms = etcd::alarm_disarm(&self.node).await?;
        one(machine::EtcdAlarmDisarmResponse {
            messages: vec![machine::EtcdAlarmDisarm {
                metadata: None,
                member_alarms,
            }],
        })
    }

    async fn etcd_defragment(
        &self,
        _request: Request<()>,
    ) -> Result<Response<machine::EtcdDefragmentResponse>, Status> {
        etcd::defragment(&self.node).await?;
        one(machine::EtcdDefragmentResponse {
            messages: vec![machine::EtcdDefragment { metadata: None }],
        })
    }

    async fn events(
        &self,
        request: Request<machine::EventsRequest>,
    ) -> Result<Response<BoxStream<machine::Event>>, Status> {
        crate::machined_streams::events(&self.node, request.into_inner()).map(Response::new)
    }

    async fn logs(
        &self,
        request: Request<machine::LogsRequest>,
    ) -> Result<Response<BoxStream<common::Data>>, Status> {
        crate::machined_streams::logs(&self.node, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn dmesg(
        &self,
        request: Request<machine::DmesgRequest>,
    ) -> Result<Response<BoxStream<common::Data>>, Status> {
        Ok(Response::new(crate::machined_streams::dmesg(
            &self.node,
            request.into_inner(),
        )))
    }

    async fn containers(
        &self,
        request: Request<machine::ContainersRequest>,
    ) -> Result<Response<machine::ContainersResponse>, Status> {
        let request = request.into_inner();
        let found = control::containers(&self.node, &request.namespace, request.driver).await?;
        one(machine::ContainersResponse {
            messages: vec![machine::Container {
                metadata: None,
                containers: found.into_iter().map(|c| c.info).collect(),
            }],
        })
    }

    async fn service_start(
        &self,
        request: Request<machine::ServiceStartRequest>,
    ) -> Result<Response<machine::ServiceStartResponse>, Status> {
        let resp = control::service_action(&self.node, &request.get_ref().id, "start").await?;
        one(machine::ServiceStartResponse {
            messages: vec![machine::ServiceStart {
                metadata: None,
                resp,
            }],
        })
    }

    async fn service_stop(
        &self,
        request: Request<machine::ServiceStopRequest>,
    ) -> Result<Response<machine::ServiceStopResponse>, Status> {
        let resp = control::service_action(&self.node, &request.get_ref().id, "stop").await?;
        one(machine::ServiceStopResponse {
            messages: vec![machine::ServiceStop {
                metadata: None,
                resp,
            }],
        })
    }

    async fn service_restart(
        &self,
        request: Request<machine::ServiceRestartRequest>,
    ) -> Result<Response<machine::ServiceRestartResponse>, Status> {
        let resp = control::service_action(&self.node, &request.get_ref().id, "restart").await?;
        one(machine::ServiceRestartResponse {
            messages: vec![machine::ServiceRestart {
                metadata: None,
                resp,
            }],
        })
    }

    async fn etcd_downgrade_validate(
        &self,
        request: Request<machine::EtcdDowngradeValidateRequest>,
    ) -> Result<Response<machine::EtcdDowngradeValidateResponse>, Status> {
        let version = &request.get_ref().version;
        let cluster_version = control::downgrade(&self.node, Downgrade::Validate, version).await?;
        one(machine::EtcdDowngradeValidateResponse {
            messages: vec![machine::EtcdDowngradeValidate {
                metadata: None,
                cluster_downgrade: Some(machine::EtcdClusterDowngrade { cluster_version }),
            }],
        })
    }

    async fn etcd_downgrade_enable(
        &self,
        request: Request<machine::EtcdDowngradeEnableRequest>,
    ) -> Result<Response<machine::EtcdDowngradeEnableResponse>, Status> {
        let version = &request.get_ref().version;
        let cluster_version = control::downgrade(&self.node, Downgrade::Enable, version).await?;
        one(machine::EtcdDowngradeEnableResponse {
            messages: vec![machine::EtcdDowngradeEnable {
                metadata: None,
                cluster_downgrade: Some(machine::EtcdClusterDowngrade { cluster_version }),
            }],
        })
    }

    async fn etcd_downgrade_cancel(
        &self,
        _request: Request<()>,
    ) -> Result<Response<machine::EtcdDowngradeCancelResponse>, Status> {
        let cluster_version = control::downgrade(&self.node, Downgrade::Cancel, "").await?;
        one(machine::EtcdDowngradeCancelResponse {
            messages: vec![machine::EtcdDowngradeCancel {
                metadata: None,
                cluster_downgrade: Some(machine::EtcdClusterDowngrade { cluster_version }),
            }],
        })
    }

    async fn etcd_status(
        &self,
        _request: Request<()>,
    ) -> Result<Response<machine::EtcdStatusResponse>, Status> {
        let member_status = etcd::status(&self.node).await?;
        one(machine::EtcdStatusResponse {
            messages: vec![machine::EtcdStatus {
                metadata: None,
                member_status: Some(member_status),
            }],
        })
    }
}

#[tonic::async_trait]
impl ClusterService for Machined {
    async fn health_check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<BoxStream<HealthCheckProgress>>, Status> {
        self.node.check_controlplane("cluster health check")?;
        let request = request.into_inner();
        let shared = self.shared.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(crate::health::health_check(shared, request, tx));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
