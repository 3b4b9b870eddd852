//! Upgrades: the legacy `MachineService.Upgrade`, and the path talosctl
//! 1.13 prefers, `ImageService.Pull` followed by the streamed
//! `LifecycleService.Upgrade` (which installs but does not reboot: the
//! caller reboots the node afterwards). [`upgrade_path`] picks one as
//! talosctl 1.13.9 does (cmd/talosctl/cmd/talos/upgrade.go upstream).
//! None of these calls is ever retried.

use futures::{Stream, StreamExt as _};

use super::{Client, Error, Failure, Idempotency, MAX_MESSAGE_SIZE, One, Result, Scope};
use super::{Transport, machine_stub};
use crate::api::common;
use crate::api::machine;
use crate::api::machine::image_service_client::ImageServiceClient;
use crate::api::machine::lifecycle_service_client::LifecycleServiceClient;

mod version;

pub use version::{TalosVersion, UpgradePath, VersionParseError, upgrade_path};

/// What the legacy `MachineService.Upgrade` call is asked to do.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct UpgradeRequest {
    /// The installer image, e.g. `ghcr.io/siderolabs/installer:v1.14.0`.
    pub image: String,
    /// Install at the next reboot instead of now.
    pub stage: bool,
    /// Skip the node's etcd checks before upgrading (quorum, member health).
    pub force: bool,
    /// Power-cycle instead of kexec when rebooting into the new version.
    pub powercycle: bool,
}

impl UpgradeRequest {
    /// An upgrade to `image`, not staged, not forced.
    pub fn new(image: impl Into<String>) -> Self {
        UpgradeRequest {
            image: image.into(),
            ..UpgradeRequest::default()
        }
    }

    /// Stages the upgrade for the next reboot.
    pub fn with_stage(mut self, stage: bool) -> Self {
        self.stage = stage;
        self
    }

    /// Skips the node's etcd checks.
    pub fn with_force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    /// Power-cycles instead of kexec.
    pub fn with_powercycle(mut self, powercycle: bool) -> Self {
        self.powercycle = powercycle;
        self
    }
}

/// A node's answer to the legacy upgrade: it accepted the request and runs
/// the upgrade sequence under `actor_id`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct UpgradeAck {
    /// The node's acknowledgement text.
    pub ack: String,
    /// The actor id of the upgrade sequence's events.
    pub actor_id: String,
}

/// Which containerd an image is pulled into and installed from (talosctl's
/// `--namespace`: `system` by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImageNamespace {
    /// The system namespace through the CRI (talosctl's default).
    #[default]
    System,
    /// The CRI namespace (Kubernetes workloads).
    Cri,
    /// The in-memory containerd instance's system namespace.
    InMemory,
}

impl ImageNamespace {
    // As talosctl maps its --namespace flag (cmd/talosctl/cmd/talos/image.go).
    pub(crate) fn to_wire(self) -> common::ContainerdInstance {
        let (driver, namespace) = match self {
            ImageNamespace::System => (
                common::ContainerDriver::Cri,
                common::ContainerdNamespace::NsSystem,
            ),
            ImageNamespace::Cri => (
                common::ContainerDriver::Cri,
                common::ContainerdNamespace::NsCri,
            ),
            ImageNamespace::InMemory => (
                common::ContainerDriver::Containerd,
                common::ContainerdNamespace::NsSystem,
            ),
        };
        common::ContainerdInstance {
            driver: driver as i32,
            namespace: namespace as i32,
        }
    }
}

/// One message of `ImageService.Pull`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PullProgress {
    /// A layer's progress.
    Layer {
        /// The layer's id.
        layer_id: String,
        /// Its status (`DOWNLOADING`, `EXTRACT_COMPLETE`, ...).
        status: String,
        /// Bytes so far.
        offset: i64,
        /// Bytes in all.
        total: i64,
    },
    /// The pull finished: the image's name, for the upgrade call.
    Done {
        /// The pulled image's name.
        name: String,
    },
}

/// One message of the streamed `LifecycleService.Upgrade`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum InstallProgress {
    /// A line of the installer's output.
    Message(String),
    /// The installer's exit code, last; not zero means the upgrade failed
    /// (the server reports that in the stream, not as a gRPC error).
    ExitCode(i32),
}

impl<S: Scope> Client<S> {
    /// The legacy upgrade (`MachineService.Upgrade`, admin only): the node
    /// answers at once and runs the upgrade sequence, rebooting into the
    /// new image unless staged. Deprecated upstream but served by 1.13 and
    /// 1.14; see [`upgrade_path`] for when talosctl uses it.
    pub async fn upgrade_legacy(&self, request: &UpgradeRequest) -> Result<S::Output<UpgradeAck>> {
        use machine::upgrade_request::RebootMode;
        let wire = machine::UpgradeRequest {
            image: request.image.clone(),
            preserve: false,
            stage: request.stage,
            force: request.force,
            reboot_mode: if request.powercycle {
                RebootMode::Powercycle
            } else {
                RebootMode::Default
            } as i32,
        };
        self.unary(
            Idempotency::Mutation,
            |t| {
                let wire = wire.clone();
                async move { machine_stub(t).upgrade(wire).await }
            },
            |m: machine::Upgrade| {
                Ok(UpgradeAck {
                    ack: m.ack,
                    actor_id: m.actor_id,
                })
            },
        )
        .await
    }
}

impl Client<One> {
    /// Pulls `image` into the node's containerd (`ImageService.Pull`, admin
    /// or operator), streaming the layers' progress and, last, the name.
    pub async fn image_pull(
        &self,
        image: &str,
        namespace: ImageNamespace,
    ) -> Result<impl Stream<Item = Result<PullProgress>> + Send + Unpin + use<>> {
        let (_, transport, node) = self.transport(&self.target, None).await?;
        let response = image_stub(transport)
            .pull(machine::ImageServicePullRequest {
                containerd: Some(namespace.to_wire()),
                image_ref: image.to_string(),
            })
            .await
            .map_err(|s| Error::from_status(&s, Some(&node)))?;
        Ok(response.into_inner().map(move |item| {
            use machine::image_service_pull_response::Response;
            let item = item.map_err(|s| Error::from_status(&s, Some(&node)))?;
            match item.response {
                Some(Response::Name(name)) => Ok(PullProgress::Done { name }),
                Some(Response::PullProgress(p)) => {
                    let progress = p.progress.unwrap_or_default();
                    Ok(PullProgress::Layer {
                        layer_id: p.layer_id,
                        status: progress.status().as_str_name().to_string(),
                        offset: progress.offset,
                        total: progress.total,
                    })
                }
                None => Err(protocol(&node, "an image pull message without content")),
            }
        }))
    }

    /// Pulls `image` and returns the pulled image's name (see
    /// [`image_pull`](Client::image_pull)).
    pub async fn pull_image(&self, image: &str, namespace: ImageNamespace) -> Result<String> {
        let node = self.target_label();
        let mut stream = self.image_pull(image, namespace).await?;
        let mut name = None;
        while let Some(item) = stream.next().await {
            if let PullProgress::Done { name: n } = item? {
                name = Some(n);
            }
        }
        name.ok_or_else(|| protocol(&node, "the image pull ended without the image's name"))
    }

    /// Installs the pulled image `image_name` as the node's next boot
    /// (`LifecycleService.Upgrade`, admin only), streaming the installer's
    /// output and its exit code. The node does not reboot: reboot it to run
    /// the new version.
    pub async fn lifecycle_upgrade(
        &self,
        image_name: &str,
        namespace: ImageNamespace,
    ) -> Result<impl Stream<Item = Result<InstallProgress>> + Send + Unpin + use<>> {
        let (_, transport, node) = self.transport(&self.target, None).await?;
        let response = lifecycle_stub(transport)
            .upgrade(machine::LifecycleServiceUpgradeRequest {
                containerd: Some(namespace.to_wire()),
                source: Some(machine::InstallArtifactsSource {
                    image_name: image_name.to_string(),
                }),
            })
            .await
            .map_err(|s| Error::from_status(&s, Some(&node)))?;
        Ok(response.into_inner().map(move |item| {
            use machine::lifecycle_service_install_progress::Response;
            let item = item.map_err(|s| Error::from_status(&s, Some(&node)))?;
            match item.progress.and_then(|p| p.response) {
                Some(Response::Message(m)) => Ok(InstallProgress::Message(m)),
                Some(Response::ExitCode(code)) => Ok(InstallProgress::ExitCode(code)),
                None => Err(protocol(
                    &node,
                    "an upgrade progress message without content",
                )),
            }
        }))
    }

    fn target_label(&self) -> String {
        match &self.target {
            super::Target::Node(n) => n.clone(),
            _ => String::new(),
        }
    }
}

fn protocol(node: &str, message: &str) -> Error {
    Error::Protocol(Failure {
        node: (!node.is_empty()).then(|| node.to_string()),
        message: message.to_string(),
    })
}

fn image_stub(transport: Transport) -> ImageServiceClient<Transport> {
    ImageServiceClient::new(transport)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE)
}

fn lifecycle_stub(transport: Transport) -> LifecycleServiceClient<Transport> {
    LifecycleServiceClient::new(transport)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE)
}

#[cfg(test)]
mod wire {
    use prost::Message as _;

    use crate::api::{common, machine};

    // Field numbers and types as upstream's api/machine/machine.proto,
    // image.proto and lifecycle.proto (v1.13.9) declare them.
    #[test]
    fn requests_use_upstream_field_numbers() {
        let upgrade = machine::UpgradeRequest {
            image: "i".into(),
            preserve: true,
            stage: true,
            force: true,
            reboot_mode: 1,
        };
        assert_eq!(
            upgrade.encode_to_vec(),
            [0x0a, 1, b'i', 0x10, 1, 0x18, 1, 0x20, 1, 0x28, 1]
        );
        let pull = machine::ImageServicePullRequest {
            containerd: Some(common::ContainerdInstance {
                driver: 1,
                namespace: 2,
            }),
            image_ref: "r".into(),
        };
        assert_eq!(
            pull.encode_to_vec(),
            [0x0a, 4, 0x08, 1, 0x10, 2, 0x1a, 1, b'r']
        );
        let lifecycle = machine::LifecycleServiceUpgradeRequest {
            containerd: None,
            source: Some(machine::InstallArtifactsSource {
                image_name: "n".into(),
            }),
        };
        assert_eq!(lifecycle.encode_to_vec(), [0x12, 3, 0x0a, 1, b'n']);
    }

    #[test]
    fn answers_decode_from_upstream_field_numbers() {
        let ack = machine::Upgrade::decode(&[0x12, 1, b'a', 0x1a, 1, b'x'][..]).unwrap();
        assert_eq!((ack.ack.as_str(), ack.actor_id.as_str()), ("a", "x"));
        // progress(1) { exit_code(2) = 3 }
        let progress = machine::LifecycleServiceUpgradeResponse::decode(&[0x0a, 2, 0x10, 3][..])
            .unwrap()
            .progress
            .unwrap();
        assert_eq!(
            progress.response,
            Some(machine::lifecycle_service_install_progress::Response::ExitCode(3))
        );
        // name(1) = "n"
        let pulled = machine::ImageServicePullResponse::decode(&[0x0a, 1, b'n'][..]).unwrap();
        assert_eq!(
            pulled.response,
            Some(machine::image_service_pull_response::Response::Name(
                "n".into()
            ))
        );
    }
}
