//! The maintenance calls an operator types during a night on the cluster:
//! service control, the node's containers, etcd's storage downgrade and the
//! images of a containerd namespace (api/machine/machine.proto and
//! api/machine/image.proto upstream).

use futures::StreamExt as _;

use super::upgrade::ImageNamespace;
use super::{Client, Error, Idempotency, One, Result, Scope, machine_stub};
use crate::api::machine;
use crate::api::machine::image_service_client::ImageServiceClient;

/// The containerd namespace a log or a container list comes from, as
/// talosctl's `-k`/`--kubernetes` picks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContainerNamespace {
    /// Talos's own services (`system`, through containerd).
    #[default]
    System,
    /// Kubernetes pods (`k8s.io`, through the CRI).
    Kubernetes,
}

impl ContainerNamespace {
    /// The namespace and driver talosctl sends for it.
    pub(crate) fn wire(self) -> (&'static str, crate::api::common::ContainerDriver) {
        use crate::api::common::ContainerDriver;
        match self {
            ContainerNamespace::System => ("system", ContainerDriver::Containerd),
            ContainerNamespace::Kubernetes => ("k8s.io", ContainerDriver::Cri),
        }
    }
}

/// One container (or pod sandbox) of a node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ContainerInfo {
    /// The containerd namespace.
    pub namespace: String,
    /// The id talosctl shows (`etcd`, `kube-system/POD:NAME:ID`).
    pub id: String,
    /// The pod it belongs to (its own id outside Kubernetes).
    pub pod_id: String,
    /// The container's name.
    pub name: String,
    /// The image.
    pub image: String,
    /// The process id of its task.
    pub pid: u32,
    /// Its status (`RUNNING`, `CONTAINER_RUNNING`, `SANDBOX_READY`, ...).
    pub status: String,
}

impl ContainerInfo {
    /// Whether it is a container of a pod rather than the pod (or a
    /// service) itself: talosctl draws it under its pod.
    pub fn in_pod(&self) -> bool {
        self.id != self.pod_id
    }
}

impl From<machine::ContainerInfo> for ContainerInfo {
    fn from(c: machine::ContainerInfo) -> Self {
        ContainerInfo {
            namespace: c.namespace,
            id: c.id,
            pod_id: c.pod_id,
            name: c.name,
            image: c.image,
            pid: c.pid,
            status: c.status,
        }
    }
}

/// What to do with a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceAction {
    /// Start it (a no-op when it runs).
    Start,
    /// Stop it (a no-op when it does not run).
    Stop,
    /// Stop and start it (a start when it does not run).
    Restart,
}

/// What to do with etcd's storage downgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DowngradeAction {
    /// Check that the cluster can be downgraded to the version.
    Validate,
    /// Start the downgrade to the version.
    Enable,
    /// Cancel a downgrade in progress.
    Cancel,
}

/// One image of a containerd namespace.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ImageInfo {
    /// The image's name.
    pub name: String,
    /// Its digest.
    pub digest: String,
    /// Its size in bytes.
    pub size: i64,
    /// When it was created.
    #[serde(with = "time::serde::rfc3339::option")]
    pub created: Option<time::OffsetDateTime>,
    /// Its labels, sorted by key.
    pub labels: Vec<(String, String)>,
}

fn timestamp(ts: Option<prost_types::Timestamp>) -> Option<time::OffsetDateTime> {
    let ts = ts?;
    let nanos = i128::from(ts.seconds) * 1_000_000_000 + i128::from(ts.nanos);
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()
}

impl<S: Scope> Client<S> {
    /// Starts, stops or restarts a system service (admin or operator);
    /// returns the node's answer (`Service "kubelet" restarted`). Only
    /// some services allow it: etcd, for one, refuses every action.
    pub async fn service_action(
        &self,
        id: &str,
        action: ServiceAction,
    ) -> Result<S::Output<String>> {
        let id = id.to_string();
        match action {
            ServiceAction::Start => {
                self.unary(
                    Idempotency::Mutation,
                    |t| {
                        let request = machine::ServiceStartRequest { id: id.clone() };
                        async move { machine_stub(t).service_start(request).await }
                    },
                    |m: machine::ServiceStart| Ok(m.resp),
                )
                .await
            }
            ServiceAction::Stop => {
                self.unary(
                    Idempotency::Mutation,
                    |t| {
                        let request = machine::ServiceStopRequest { id: id.clone() };
                        async move { machine_stub(t).service_stop(request).await }
                    },
                    |m: machine::ServiceStop| Ok(m.resp),
                )
                .await
            }
            ServiceAction::Restart => {
                self.unary(
                    Idempotency::Mutation,
                    |t| {
                        let request = machine::ServiceRestartRequest { id: id.clone() };
                        async move { machine_stub(t).service_restart(request).await }
                    },
                    |m: machine::ServiceRestart| Ok(m.resp),
                )
                .await
            }
        }
    }

    /// The node's containers in `namespace` (admin, operator, reader).
    pub async fn containers(
        &self,
        namespace: ContainerNamespace,
    ) -> Result<S::Output<Vec<ContainerInfo>>> {
        let (ns, driver) = namespace.wire();
        self.unary(
            Idempotency::Read,
            |t| {
                let request = machine::ContainersRequest {
                    namespace: ns.to_string(),
                    driver: driver as i32,
                };
                async move { machine_stub(t).containers(request).await }
            },
            |m: machine::Container| Ok(m.containers.into_iter().map(ContainerInfo::from).collect()),
        )
        .await
    }

    /// Validates, enables or cancels a downgrade of etcd's storage to
    /// `version` (`MAJOR.MINOR`, ignored when cancelling; admin only);
    /// returns the cluster version etcd reports.
    pub async fn etcd_downgrade(
        &self,
        action: DowngradeAction,
        version: &str,
    ) -> Result<S::Output<String>> {
        let version = version.to_string();
        fn cluster_version(d: Option<machine::EtcdClusterDowngrade>) -> Result<String> {
            Ok(d.map(|d| d.cluster_version).unwrap_or_default())
        }
        match action {
            DowngradeAction::Validate => {
                self.unary(
                    Idempotency::Mutation,
                    |t| {
                        let request = machine::EtcdDowngradeValidateRequest {
                            version: version.clone(),
                        };
                        async move { machine_stub(t).etcd_downgrade_validate(request).await }
                    },
                    |m: machine::EtcdDowngradeValidate| cluster_version(m.cluster_downgrade),
                )
                .await
            }
            DowngradeAction::Enable => {
                self.unary(
                    Idempotency::Mutation,
                    |t| {
                        let request = machine::EtcdDowngradeEnableRequest {
                            version: version.clone(),
                        };
                        async move { machine_stub(t).etcd_downgrade_enable(request).await }
                    },
                    |m: machine::EtcdDowngradeEnable| cluster_version(m.cluster_downgrade),
                )
                .await
            }
            DowngradeAction::Cancel => {
                self.unary(
                    Idempotency::Mutation,
                    |t| async move { machine_stub(t).etcd_downgrade_cancel(()).await },
                    |m: machine::EtcdDowngradeCancel| cluster_version(m.cluster_downgrade),
                )
                .await
            }
        }
    }
}

impl Client<One> {
    /// The images of a containerd namespace (`ImageService.List`, admin,
    /// operator or reader), in the order the node sends them.
    pub async fn image_list(&self, namespace: ImageNamespace) -> Result<Vec<ImageInfo>> {
        let (_, transport, node) = self.transport(&self.target, None).await?;
        let status = |s: tonic::Status| Error::from_status(&s, Some(&node));
        let mut stream = ImageServiceClient::new(transport)
            .max_decoding_message_size(super::MAX_MESSAGE_SIZE)
            .list(machine::ImageServiceListRequest {
                containerd: Some(namespace.to_wire()),
            })
            .await
            .map_err(status)?
            .into_inner();
        let mut images = Vec::new();
        while let Some(item) = stream.next().await {
            let image = item.map_err(status)?;
            let mut labels: Vec<(String, String)> = image.labels.into_iter().collect();
            labels.sort();
            images.push(ImageInfo {
                name: image.name,
                digest: image.digest,
                size: image.size,
                created: timestamp(image.created_at),
                labels,
            });
        }
        Ok(images)
    }
}
