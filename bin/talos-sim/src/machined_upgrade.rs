//! Upgrades, as machined answers them: the legacy `MachineService.Upgrade`
//! (internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go,
//! Upgrade), `ImageService.Pull` (internal/app/images/images.go) and the
//! streamed `LifecycleService.Upgrade` (internal/app/lifecycle/
//! lifecycle.go). Both 1.13.9 and 1.14 serve all three. The simulated
//! registry holds an installer for every version the simulator runs:
//! `<any repository>:v1.13.9` and `:v1.14.0`.

use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tonic::{Request, Response, Status};

use super::machined::{Machined, actor_id};
use super::node::Action;
use super::upgrade_state::{image_version, normalized};
use crate::api::machine;
use crate::api::server::machine::image_service_server::ImageService;
use crate::api::server::machine::lifecycle_service_server::LifecycleService;

type BoxStream<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

/// How long each member's quorum read may take in the upgrade's etcd
/// check (QuorumCheckTimeout, internal/pkg/etcd/etcd.go).
const QUORUM_CHECK_TIMEOUT: Duration = Duration::from_secs(15);

/// The legacy upgrade: validates the image and (on a control-plane node,
/// unless forced) etcd, then answers and queues the upgrade sequence.
pub(crate) async fn legacy(
    machined: &Machined,
    request: Request<machine::UpgradeRequest>,
) -> Result<Response<machine::UpgradeResponse>, Status> {
    let request = request.into_inner();
    let node = &machined.node;
    tracing::info!(
        node = %node.name,
        image = %request.image,
        stage = request.stage,
        force = request.force,
        "upgrade request received"
    );
    let Some(target) = image_version(&request.image) else {
        return Err(Status::unknown(format!(
            "error validating installer image {:?}: {}",
            request.image,
            not_found(&request.image)
        )));
    };
    if node.is_control_plane() && !request.force && !request.preserve {
        validate_etcd(machined)
            .await
            .map_err(|e| Status::unknown(format!("error validating etcd for upgrade: {e}")))?;
    }
    let actor = actor_id();
    node.queue(Action::Upgrade {
        target,
        stage: request.stage,
        actor: actor.clone(),
    });
    Ok(Response::new(machine::UpgradeResponse {
        messages: vec![machine::Upgrade {
            metadata: None,
            ack: "Upgrade request received".into(),
            actor_id: actor,
        }],
    }))
}

/// etcd's check before an upgrade (internal/pkg/etcd/etcd.go,
/// ValidateForUpgrade): not two members, every member started and able
/// to read with quorum.
async fn validate_etcd(machined: &Machined) -> Result<(), String> {
    let (client, _) = machined
        .node
        .local_etcd_now("etcd")
        .await
        .map_err(|e| format!("failed to create etcd client: {}", e.message()))?;
    let members = client
        .member_list()
        .await
        .map_err(|e| e.message().to_string())?;
    if members.len() == 2 {
        return Err(format!(
            "etcd member count({}) is insufficient to maintain quorum if upgrade commences",
            members.len()
        ));
    }
    for member in &members {
        if member.name.is_empty() {
            return Err(format!(
                "etcd member {:016x} is not started, all members must be running to perform an upgrade",
                member.id
            ));
        }
        let url = member.client_ur_ls.first().cloned().unwrap_or_default();
        if let Err(e) = client
            .get_linearizable(&url, b"health", QUORUM_CHECK_TIMEOUT)
            .await
        {
            return Err(format!(
                "etcd member {:016x} is not healthy; all members must be healthy to perform an upgrade: {}",
                member.id,
                e.message()
            ));
        }
    }
    Ok(())
}

/// How long 1.14 keeps trying an image the registry does not have before
/// it answers NotFound: five retries after the first failure, paced by
/// go-retry's exponential ticker (`units * floor((2^c - 1) / 2)` for
/// c = 1, 2, ...: 0, 1, 3, 7 and 15 units). 1.13.9's handler allows no
/// retry (images.go, WithMaxNotFoundRetries(0)); 1.14 dropped that option,
/// so the default of five applies (internal/pkg/containers/image).
fn not_found_backoff(unit: Duration) -> Duration {
    [0, 1, 3, 7, 15].iter().map(|n| unit * *n).sum()
}

/// What containerd's resolver says of a reference no registry holds.
fn not_found(image: &str) -> String {
    format!("failed to resolve reference {image:?}: {image}: not found")
}

/// The digest the simulated registry gives an image: stable per reference.
fn digest(image: &str) -> String {
    let hash = Sha256::digest(image.as_bytes());
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[tonic::async_trait]
impl ImageService for Machined {
    /// The images of a containerd namespace (see
    /// [`crate::machined_control::images`]).
    async fn list(
        &self,
        request: Request<machine::ImageServiceListRequest>,
    ) -> Result<Response<BoxStream<machine::ImageServiceListResponse>>, Status> {
        let namespace = request
            .into_inner()
            .containerd
            .map(|c| c.namespace)
            .unwrap_or_default();
        let images = super::machined_control::images(&self.node, namespace, digest)?;
        Ok(Response::new(Box::pin(futures::stream::iter(
            images.into_iter().map(Ok),
        ))))
    }

    /// Pulls an installer the simulated registry holds: one layer's
    /// progress (none when already pulled), then the name pinned to its
    /// digest, as upstream answers a reference that is not canonical.
    async fn pull(
        &self,
        request: Request<machine::ImageServicePullRequest>,
    ) -> Result<Response<BoxStream<machine::ImageServicePullResponse>>, Status> {
        use machine::image_service_pull_layer_progress::Status as Layer;
        use machine::image_service_pull_response::Response as Pulled;
        let request = request.into_inner();
        let namespace = request.containerd.map(|c| c.namespace).unwrap_or_default();
        let image = request.image_ref;
        let Some(version) = image_version(&image) else {
            if self.node.talos_version().at_least_1_14() {
                tokio::time::sleep(not_found_backoff(self.node.timing.image_pull_retry_unit)).await;
            }
            return Err(Status::not_found(format!(
                "error pulling image: {}",
                not_found(&image)
            )));
        };
        let (full, name) = normalized(&image);
        let digest = digest(&full);
        let pinned = format!("{name}@{digest}");
        let mut messages = Vec::new();
        if self.node.upgrade.pulled(&pinned).is_none() {
            for (status, offset) in [
                (Layer::Downloading, 0),
                (Layer::DownloadComplete, 1),
                (Layer::ExtractComplete, 1),
            ] {
                messages.push(Ok(machine::ImageServicePullResponse {
                    response: Some(Pulled::PullProgress(machine::ImageServicePullProgress {
                        layer_id: digest.clone(),
                        progress: Some(machine::ImageServicePullLayerProgress {
                            status: status as i32,
                            elapsed: Some(prost_types::Duration::default()),
                            offset,
                            total: 1,
                        }),
                    })),
                }));
            }
        }
        self.node
            .upgrade
            .note_pulled(&[&image, &full, &pinned], version);
        self.node.upgrade.note_listed(namespace, &pinned);
        messages.push(Ok(machine::ImageServicePullResponse {
            response: Some(Pulled::Name(pinned)),
        }));
        Ok(Response::new(Box::pin(futures::stream::iter(messages))))
    }
}

#[tonic::async_trait]
impl LifecycleService for Machined {
    /// Runs the pulled installer: it installs the image's version on the
    /// other boot partition, which the next reboot boots. Its output and
    /// exit code stream back; one install or upgrade at a time.
    async fn upgrade(
        &self,
        request: Request<machine::LifecycleServiceUpgradeRequest>,
    ) -> Result<Response<BoxStream<machine::LifecycleServiceUpgradeResponse>>, Status> {
        use machine::lifecycle_service_install_progress::Response as Progress;
        let request = request.into_inner();
        let Ok(_lock) = self.node.upgrade.lifecycle_lock.try_lock() else {
            return Err(Status::failed_precondition(
                "another installation/upgrade is already in progress",
            ));
        };
        let image = request.source.map(|s| s.image_name).unwrap_or_default();
        if image.is_empty() {
            return Err(Status::invalid_argument("installer image name is required"));
        }
        let Some(version) = self.node.upgrade.pulled(&image) else {
            return Err(Status::internal(format!(
                "upgrade failed: image {image:?}: not found"
            )));
        };
        tracing::info!(node = %self.node.name, %image, "starting upgrade");
        let lines = [
            format!("running installer {image}"),
            format!("installing Talos {} on the system disk", version.tag()),
            "upgrade of the boot partition done".to_string(),
        ];
        let mut messages: Vec<_> = lines
            .into_iter()
            .map(|line| {
                Ok(machine::LifecycleServiceUpgradeResponse {
                    progress: Some(machine::LifecycleServiceInstallProgress {
                        response: Some(Progress::Message(line)),
                    }),
                })
            })
            .collect();
        self.node.upgrade.install(version);
        messages.push(Ok(machine::LifecycleServiceUpgradeResponse {
            progress: Some(machine::LifecycleServiceInstallProgress {
                response: Some(Progress::ExitCode(0)),
            }),
        }));
        Ok(Response::new(Box::pin(futures::stream::iter(messages))))
    }
}
