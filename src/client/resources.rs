//! COSI resources (`cosi.resource.State`): a node's state as talosctl
//! `get` reads it — its running and saved machine configuration, machine
//! status, members, addresses, volumes, and any other resource type.
//!
//! ```no_run
//! # async fn run(client: talos_client::Client) -> talos_client::Result<()> {
//! use talos_client::client::resources::ConfigId;
//!
//! let node = client.node("10.0.0.2");
//! let running = node.resources().machine_config(ConfigId::Active).await?;
//! let status = node.resources().machine_status().await?;
//! println!("{} ready={} ({} bytes of config)", status.stage, status.ready, running.yaml.len());
//! # Ok(()) }
//! ```
//!
//! Talos serves the state with the same `node` routing as the machine API;
//! apid cannot merge COSI answers of several nodes, so a multi-node client
//! sends one call per node (for [`Target::Aggregate`] too).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use time::OffsetDateTime;
use tonic::Code;

use super::{Client, Error, Failure, MAX_MESSAGE_SIZE, NodeResult, One, Result, Scope, Target};
use crate::api::cosi::resource as pb;
use crate::api::cosi::resource::state_client::StateClient;

pub use super::resources_specs::{
    AddressStatus, ClusterMember, ConfigId, EtcdLocalMember, MachineConfig, MachineStatus,
    NodeIdentity, ResourceDefinition, ServiceStatus, TalosVersion, UnmetCondition, VolumeStatus,
    types,
};

/// The stub of `cosi.resource.State` over a client transport.
fn state_stub(transport: super::Transport) -> StateClient<super::Transport> {
    StateClient::new(transport)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE)
}

/// A resource's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
#[non_exhaustive]
pub struct ResourceMetadata {
    /// Namespace, e.g. `config`.
    pub namespace: String,
    /// Resource type, e.g. `MachineConfigs.config.talos.dev`.
    #[serde(rename = "type")]
    pub resource_type: String,
    /// Id within namespace and type, e.g. `v1alpha1`.
    pub id: String,
    /// Version, increased by every change.
    pub version: String,
    /// The controller that owns it, if any.
    pub owner: String,
    /// `running` or `tearingDown`.
    pub phase: String,
    /// When it was created.
    #[serde(with = "time::serde::rfc3339::option")]
    pub created: Option<OffsetDateTime>,
    /// When it last changed.
    #[serde(with = "time::serde::rfc3339::option")]
    pub updated: Option<OffsetDateTime>,
    /// Labels.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Finalizers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub finalizers: Vec<String>,
}

/// One resource as the node sent it: metadata and the spec in both of its
/// encodings (YAML always; protobuf for types upstream defines a message for).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Resource {
    /// Metadata.
    pub metadata: ResourceMetadata,
    /// The spec as YAML.
    pub spec_yaml: String,
    /// The spec as protobuf bytes (empty when the type has none).
    pub spec_proto: Vec<u8>,
}

impl Resource {
    /// The spec as a YAML value (any type).
    pub fn spec_value(&self) -> Result<serde_norway::Value> {
        serde_norway::from_str(&self.spec_yaml).map_err(|e| self.bad_spec(e.to_string()))
    }

    /// Decodes the YAML spec into `T`.
    pub fn decode_yaml<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        serde_norway::from_str(&self.spec_yaml).map_err(|e| self.bad_spec(e.to_string()))
    }

    pub(crate) fn bad_spec(&self, why: impl std::fmt::Display) -> Error {
        Error::protocol(
            None,
            format!(
                "resource {}/{}/{}: cannot decode its spec: {why}",
                self.metadata.namespace, self.metadata.resource_type, self.metadata.id
            ),
        )
    }

    fn from_wire(r: pb::Resource) -> Resource {
        let md = r.metadata.unwrap_or_default();
        let spec = r.spec.unwrap_or_default();
        Resource {
            metadata: ResourceMetadata {
                namespace: md.namespace,
                resource_type: md.r#type,
                id: md.id,
                version: md.version,
                owner: md.owner,
                phase: md.phase,
                created: md.created.and_then(timestamp),
                updated: md.updated.and_then(timestamp),
                labels: md.labels.into_iter().collect(),
                annotations: md.annotations.into_iter().collect(),
                finalizers: md.finalizers,
            },
            spec_yaml: spec.yaml_spec,
            spec_proto: spec.proto_spec,
        }
    }
}

fn timestamp(ts: prost_types::Timestamp) -> Option<OffsetDateTime> {
    let nanos = i128::from(ts.seconds) * 1_000_000_000 + i128::from(ts.nanos);
    OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()
}

/// What happened to a watched resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// It appeared (or existed when the watch started).
    Created,
    /// It changed.
    Updated,
    /// It went away.
    Destroyed,
    /// Everything that existed when a watch of a whole type started has been
    /// sent.
    Bootstrapped,
    /// The watch failed on the server.
    Errored,
    /// Nothing (a marker the server may send).
    Noop,
}

/// One event of a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResourceEvent {
    /// What happened.
    pub kind: EventKind,
    /// The resource after the event (before it, for `Destroyed`); none for
    /// markers.
    pub resource: Option<Resource>,
    /// The resource before an update, when the server sends it.
    pub old: Option<Resource>,
    /// The server's error, for `Errored`.
    pub error: Option<String>,
}

impl ResourceEvent {
    fn from_wire(e: pb::Event) -> ResourceEvent {
        let kind = match pb::EventType::try_from(e.event_type) {
            Ok(pb::EventType::Created) => EventKind::Created,
            Ok(pb::EventType::Updated) => EventKind::Updated,
            Ok(pb::EventType::Destroyed) => EventKind::Destroyed,
            Ok(pb::EventType::Bootstrapped) => EventKind::Bootstrapped,
            Ok(pb::EventType::Errored) => EventKind::Errored,
            Ok(pb::EventType::Noop) | Err(_) => EventKind::Noop,
        };
        ResourceEvent {
            kind,
            resource: e.resource.map(Resource::from_wire),
            old: e.old.map(Resource::from_wire),
            error: e.error,
        }
    }
}

/// The events of one watch, in order; ends when the node ends the watch.
pub type WatchStream = std::pin::Pin<Box<dyn Stream<Item = Result<ResourceEvent>> + Send>>;

/// COSI resource calls of a [`Client`]; see [the module docs](self).
#[derive(Debug, Clone)]
pub struct Resources<S: Scope = One> {
    client: Client<S>,
}

impl<S: Scope> Client<S> {
    /// The node's COSI resources (`talosctl get`).
    pub fn resources(&self) -> Resources<S> {
        Resources {
            client: self.clone(),
        }
    }
}

/// Maps a failed COSI call: an unknown type (upstream's access filter,
/// internal/app/resources/access.go, answers PermissionDenied `resource type
/// "X" is not supported`) becomes [`Error::UnknownResourceType`].
fn map_status(status: &tonic::Status, node: Option<&str>, resource_type: &str) -> Error {
    let message = status.message();
    if status.code() == Code::PermissionDenied
        && message.starts_with("resource type ")
        && message.ends_with(" is not supported")
    {
        return Error::UnknownResourceType {
            resource_type: resource_type.to_string(),
            failure: Failure {
                node: node.map(str::to_string),
                message: message.to_string(),
            },
        };
    }
    Error::from_status(status, node)
}

impl<S: Scope> Resources<S> {
    /// The single-node targets of this client, with the label of each.
    fn targets(&self) -> Vec<(Target, Option<String>)> {
        match &self.client.target {
            Target::FanOut(nodes) | Target::Aggregate(nodes) => nodes
                .iter()
                .map(|n| (Target::Node(n.clone()), Some(n.clone())))
                .collect(),
            Target::Node(n) => vec![(Target::Node(n.clone()), Some(n.clone()))],
            Target::Endpoint => vec![(Target::Endpoint, None)],
        }
    }

    /// Runs `call` on every addressed node, concurrently.
    pub(crate) async fn per_node<T, F, Fut>(&self, call: F) -> Result<S::Output<T>>
    where
        T: Send,
        F: Fn(Resources<One>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let calls = self.targets().into_iter().map(|(target, label)| {
            let one = Resources {
                client: self.client.retarget::<One>(target),
            };
            let call = &call;
            async move {
                let result = call(one.clone()).await;
                let node = match label {
                    Some(n) => n,
                    None => one.endpoint_label().await,
                };
                NodeResult {
                    result: result.map_err(|e| e.with_node(&node)),
                    node,
                }
            }
        });
        S::finish(futures::future::join_all(calls).await)
    }

    /// One resource by namespace, type and id.
    pub async fn get(
        &self,
        namespace: &str,
        resource_type: &str,
        id: &str,
    ) -> Result<S::Output<Resource>> {
        self.per_node(|one| async move { one.get_one(namespace, resource_type, id).await })
            .await
    }

    /// Every resource of a type in a namespace.
    pub async fn list(
        &self,
        namespace: &str,
        resource_type: &str,
    ) -> Result<S::Output<Vec<Resource>>> {
        self.per_node(|one| async move { one.list_one(namespace, resource_type).await })
            .await
    }

    /// The resource types the node knows (namespace `meta`).
    pub async fn definitions(&self) -> Result<S::Output<Vec<ResourceDefinition>>> {
        self.per_node(|one| async move { one.definitions_one().await })
            .await
    }
}

impl Resources<One> {
    async fn endpoint_label(&self) -> String {
        match self.client.conn.channel().await {
            Ok((index, _)) => self.client.conn.endpoint_host(index).to_string(),
            Err(_) => String::new(),
        }
    }

    fn node_label(&self) -> Option<&str> {
        match &self.client.target {
            Target::Node(n) => Some(n),
            _ => None,
        }
    }

    /// Runs a unary COSI call, retried on `Unavailable` like other reads.
    async fn unary<T, F, Fut>(&self, resource_type: &str, call: F) -> Result<T>
    where
        F: Fn(StateClient<super::Transport>) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let options = &self.client.options;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let deadline = options.call_timeout;
            let (index, transport, _) = self
                .client
                .transport(&self.client.target, Some(deadline))
                .await?;
            let status = match tokio::time::timeout(deadline, call(state_stub(transport))).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(status)) => status,
                Err(_) => tonic::Status::deadline_exceeded(format!(
                    "no answer within {}s",
                    deadline.as_secs_f64()
                )),
            };
            if status.code() == Code::Unavailable {
                self.client.conn.mark_failed(index).await;
                if attempt < options.read_attempts {
                    tokio::time::sleep(Duration::from_millis(100 << attempt.min(5))).await;
                    continue;
                }
            }
            return Err(map_status(&status, self.node_label(), resource_type));
        }
    }

    pub(crate) async fn get_one(
        &self,
        namespace: &str,
        resource_type: &str,
        id: &str,
    ) -> Result<Resource> {
        let request = pb::GetRequest {
            namespace: namespace.to_string(),
            r#type: resource_type.to_string(),
            id: id.to_string(),
            options: None,
        };
        let answer = self
            .unary(resource_type, |mut stub| {
                let request = request.clone();
                async move { stub.get(request).await.map(tonic::Response::into_inner) }
            })
            .await?;
        answer
            .resource
            .map(Resource::from_wire)
            .ok_or_else(|| Error::protocol(None, "Get answered without a resource"))
    }

    pub(crate) async fn list_one(
        &self,
        namespace: &str,
        resource_type: &str,
    ) -> Result<Vec<Resource>> {
        let request = pb::ListRequest {
            namespace: namespace.to_string(),
            r#type: resource_type.to_string(),
            options: None,
        };
        self.unary(resource_type, |mut stub| {
            let request = request.clone();
            async move {
                let mut stream = stub.list(request).await?.into_inner();
                let mut items = Vec::new();
                while let Some(message) = stream.message().await? {
                    items.extend(message.resource.map(Resource::from_wire));
                }
                Ok(items)
            }
        })
        .await
    }

    async fn definitions_one(&self) -> Result<Vec<ResourceDefinition>> {
        self.list_one(types::META_NAMESPACE, types::RESOURCE_DEFINITION)
            .await?
            .iter()
            .map(ResourceDefinition::decode)
            .collect()
    }

    /// Resolves a type name or alias (`mc`, `members`, `Services`, ...) as
    /// talosctl does (pkg/machinery/client/resources.go,
    /// ResolveResourceKind): against the node's resource definitions, by id
    /// or any alias, ignoring case. Unknown: [`Error::UnknownResourceType`];
    /// ambiguous: [`Error::InvalidArgument`].
    pub async fn resolve(&self, name: &str) -> Result<ResourceDefinition> {
        let definitions = self.definitions_one().await?;
        let mut matched: Vec<ResourceDefinition> = definitions
            .into_iter()
            .filter(|rd| {
                rd.id.eq_ignore_ascii_case(name)
                    || rd.all_aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
            })
            .collect();
        let failure = |message: String| Failure {
            node: self.node_label().map(str::to_string),
            message,
        };
        match matched.len() {
            1 => Ok(matched.remove(0)),
            0 => Err(Error::UnknownResourceType {
                resource_type: name.to_string(),
                failure: failure(format!("resource {name:?} is not registered")),
            }),
            _ => Err(Error::InvalidArgument(failure(format!(
                "resource type {name:?} is ambiguous: {:?}",
                matched.iter().map(|rd| rd.id.as_str()).collect::<Vec<_>>()
            )))),
        }
    }

    /// Watches one resource (`id` given) or every resource of a type. The
    /// stream starts with the current state (a `Created` event per resource;
    /// for a whole type then a `Bootstrapped` marker) and goes on with every
    /// change until the node ends it (a reset or power-off does) or the
    /// stream is dropped. No deadline applies.
    pub async fn watch(
        &self,
        namespace: &str,
        resource_type: &str,
        id: Option<&str>,
    ) -> Result<WatchStream> {
        let (_, transport, _) = self.client.transport(&self.client.target, None).await?;
        let request = pb::WatchRequest {
            namespace: namespace.to_string(),
            r#type: resource_type.to_string(),
            id: id.map(str::to_string),
            options: Some(pb::WatchOptions {
                bootstrap_contents: id.is_none(),
                ..Default::default()
            }),
            api_version: 1,
        };
        let node = self.node_label().map(str::to_string);
        let kind = resource_type.to_string();
        let stream = state_stub(transport)
            .watch(request)
            .await
            .map_err(|s| map_status(&s, node.as_deref(), &kind))?
            .into_inner();
        let events = stream.flat_map(move |item| {
            let items: Vec<Result<ResourceEvent>> = match item {
                Ok(response) => response
                    .event
                    .into_iter()
                    .map(|e| Ok(ResourceEvent::from_wire(e)))
                    .collect(),
                Err(status) => vec![Err(map_status(&status, node.as_deref(), &kind))],
            };
            futures::stream::iter(items)
        });
        Ok(Box::pin(events))
    }
}

/// Decodes a protobuf spec message.
pub(crate) fn decode_proto<M: prost::Message + Default>(resource: &Resource) -> Result<Option<M>> {
    if resource.spec_proto.is_empty() {
        return Ok(None);
    }
    M::decode(resource.spec_proto.as_slice())
        .map(Some)
        .map_err(|e| resource.bad_spec(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_type_is_recognised_from_the_access_filter_answer() {
        let status =
            tonic::Status::permission_denied("resource type \"Foos.x.dev\" is not supported");
        match map_status(&status, Some("10.5.0.2"), "Foos.x.dev") {
            Error::UnknownResourceType {
                resource_type,
                failure,
            } => {
                assert_eq!(resource_type, "Foos.x.dev");
                assert_eq!(failure.node.as_deref(), Some("10.5.0.2"));
            }
            other => panic!("unexpected {other:?}"),
        }
        let denied = tonic::Status::permission_denied("not authorized");
        assert!(matches!(
            map_status(&denied, None, "X"),
            Error::PermissionDenied(_)
        ));
    }

    #[test]
    fn wire_resources_keep_both_spec_encodings() {
        let wire = pb::Resource {
            metadata: Some(pb::Metadata {
                namespace: "config".into(),
                r#type: types::MACHINE_CONFIG.into(),
                id: "v1alpha1".into(),
                version: "3".into(),
                ..Default::default()
            }),
            spec: Some(pb::Spec {
                proto_spec: vec![10, 1, b'a'],
                yaml_spec: "a".into(),
            }),
        };
        let r = Resource::from_wire(wire.clone());
        assert_eq!(
            (r.metadata.version.as_str(), r.spec_yaml.as_str()),
            ("3", "a")
        );
        assert_eq!(r.spec_proto, vec![10, 1, b'a']);
    }
}
