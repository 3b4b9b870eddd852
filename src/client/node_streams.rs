//! What a node shows as it happens: a service's or container's log, the
//! kernel's messages and machined's runtime events (server streams of
//! `common.Data` and `machine.Event`; v1alpha1_server.go upstream: Logs,
//! Dmesg, Events). Each stream reads one node; a caller that follows
//! several merges their streams.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use prost::Message as _;

use super::reply::metadata_error;
use super::services::ContainerNamespace;
use super::{Client, Error, One, Result, machine_stub};
use crate::api::{common, machine};

/// What [`Client::logs`] asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogsRequest {
    id: String,
    namespace: ContainerNamespace,
    follow: bool,
    tail_lines: Option<u32>,
}

impl LogsRequest {
    /// The whole log of service (or, in the Kubernetes namespace,
    /// container) `id`, then the end of the stream.
    pub fn new(id: impl Into<String>) -> Self {
        LogsRequest {
            id: id.into(),
            namespace: ContainerNamespace::System,
            follow: false,
            tail_lines: None,
        }
    }

    /// Where `id` lives (talosctl's `-k` picks the Kubernetes namespace).
    pub fn with_namespace(mut self, namespace: ContainerNamespace) -> Self {
        self.namespace = namespace;
        self
    }

    /// Keep streaming what the log appends (talosctl's `-f`).
    pub fn with_follow(mut self, follow: bool) -> Self {
        self.follow = follow;
        self
    }

    /// Only the last `lines` lines of what is there (talosctl's `--tail`).
    pub fn with_tail_lines(mut self, lines: Option<u32>) -> Self {
        self.tail_lines = lines;
        self
    }
}

/// What [`Client::events`] asks for: at most one of the three ways to
/// choose past events (none: new events only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventsRequest {
    tail_events: i32,
    tail_id: String,
    tail_seconds: i32,
    actor_id: String,
}

impl EventsRequest {
    /// New events only.
    pub fn new() -> Self {
        EventsRequest::default()
    }

    /// The last `count` past events first (-1: every one the node keeps).
    pub fn with_tail_events(mut self, count: i32) -> Self {
        self.tail_events = count;
        self
    }

    /// The past events after the one with this id first.
    pub fn with_since_id(mut self, id: impl Into<String>) -> Self {
        self.tail_id = id.into();
        self
    }

    /// The events of the last `duration` first (whole seconds).
    pub fn with_duration(mut self, duration: std::time::Duration) -> Self {
        self.tail_seconds = i32::try_from(duration.as_secs()).unwrap_or(i32::MAX);
        self
    }

    /// Only the events of this actor (the id a reboot or reset returns).
    pub fn with_actor_id(mut self, actor: impl Into<String>) -> Self {
        self.actor_id = actor.into();
        self
    }
}

/// The bytes of a log or of the kernel's messages as the node sends them
/// (not split into lines); a failure the node reports in the stream ends it
/// as an error item.
pub struct NodeDataStream {
    node: String,
    inner: tonic::Streaming<common::Data>,
}

impl NodeDataStream {
    /// The node the stream comes from.
    pub fn node(&self) -> &str {
        &self.node
    }
}

impl Stream for NodeDataStream {
    type Item = Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        Pin::new(&mut this.inner).poll_next(cx).map(|item| {
            item.map(|item| match item {
                Ok(data) => match metadata_error(data.metadata.as_ref()) {
                    Some(error) => Err(error.with_node(&this.node)),
                    None => Ok(data.bytes),
                },
                Err(status) => Err(Error::from_status(&status, Some(&this.node))),
            })
        })
    }
}

/// A runtime event of a node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Event {
    /// The node it comes from.
    pub node: String,
    /// Its id (sortable: a later event has a greater id).
    pub id: String,
    /// The actor that caused it (a reboot's or reset's actor id), if any.
    pub actor_id: String,
    /// The payload's type URL (`talos/runtime/machine.SequenceEvent`, ...).
    pub type_url: String,
    /// The payload.
    pub payload: EventPayload,
}

/// What an event says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
#[non_exhaustive]
pub enum EventPayload {
    /// A sequence (boot, reboot, reset, ...) started, stopped or failed.
    Sequence {
        /// The sequence.
        sequence: String,
        /// `START`, `STOP` or `NOOP`.
        action: String,
        /// Why it failed, if it did.
        error: Option<String>,
    },
    /// A phase of a sequence started or stopped.
    Phase {
        /// The phase.
        phase: String,
        /// `START` or `STOP`.
        action: String,
    },
    /// A task of a phase started or stopped.
    Task {
        /// The task.
        task: String,
        /// `START` or `STOP`.
        action: String,
    },
    /// A service changed state.
    ServiceState {
        /// The service.
        service: String,
        /// Its new state (`RUNNING`, `FINISHED`, ...).
        action: String,
        /// What it says.
        message: String,
    },
    /// The machine entered a stage.
    MachineStatus {
        /// The stage (`BOOTING`, `RUNNING`, ...).
        stage: String,
        /// Whether the machine is ready.
        ready: bool,
        /// The conditions not yet met.
        unmet_conditions: Vec<String>,
    },
    /// An event of a type this library does not decode (the stream's first
    /// event, which says it started, has none).
    Other,
}

fn enum_name<E: TryFrom<i32>>(value: i32, name: impl Fn(&E) -> &'static str) -> String {
    E::try_from(value)
        .map(|e| name(&e))
        .map(str::to_string)
        .unwrap_or_else(|_| value.to_string())
}

impl EventPayload {
    fn decode(any: Option<&prost_types::Any>) -> EventPayload {
        use machine::{
            MachineStatusEvent, PhaseEvent, SequenceEvent, ServiceStateEvent, TaskEvent,
            machine_status_event, phase_event, sequence_event, service_state_event, task_event,
        };
        let Some(any) = any else {
            return EventPayload::Other;
        };
        let value = &any.value[..];
        let kind = any.type_url.rsplit('.').next().unwrap_or_default();
        let decoded = match kind {
            "SequenceEvent" => SequenceEvent::decode(value).map(|e| EventPayload::Sequence {
                action: enum_name(e.action, sequence_event::Action::as_str_name),
                error: e.error.map(|e| e.message),
                sequence: e.sequence,
            }),
            "PhaseEvent" => PhaseEvent::decode(value).map(|e| EventPayload::Phase {
                action: enum_name(e.action, phase_event::Action::as_str_name),
                phase: e.phase,
            }),
            "TaskEvent" => TaskEvent::decode(value).map(|e| EventPayload::Task {
                action: enum_name(e.action, task_event::Action::as_str_name),
                task: e.task,
            }),
            "ServiceStateEvent" => {
                ServiceStateEvent::decode(value).map(|e| EventPayload::ServiceState {
                    action: enum_name(e.action, service_state_event::Action::as_str_name),
                    service: e.service,
                    message: e.message,
                })
            }
            "MachineStatusEvent" => MachineStatusEvent::decode(value).map(|e| {
                let status = e.status.unwrap_or_default();
                EventPayload::MachineStatus {
                    stage: enum_name(e.stage, machine_status_event::MachineStage::as_str_name),
                    ready: status.ready,
                    unmet_conditions: status
                        .unmet_conditions
                        .into_iter()
                        .map(|c| c.name)
                        .collect(),
                }
            }),
            _ => return EventPayload::Other,
        };
        decoded.unwrap_or(EventPayload::Other)
    }
}

/// A node's runtime events; a failure ends it as an error item.
pub struct EventStream {
    node: String,
    inner: tonic::Streaming<machine::Event>,
}

impl EventStream {
    /// The node the stream comes from.
    pub fn node(&self) -> &str {
        &self.node
    }
}

impl Stream for EventStream {
    type Item = Result<Event>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        Pin::new(&mut this.inner).poll_next(cx).map(|item| {
            item.map(|item| match item {
                Ok(event) => match metadata_error(event.metadata.as_ref()) {
                    Some(error) => Err(error.with_node(&this.node)),
                    None => Ok(Event {
                        node: this.node.clone(),
                        payload: EventPayload::decode(event.data.as_ref()),
                        type_url: event.data.map(|d| d.type_url).unwrap_or_default(),
                        id: event.id,
                        actor_id: event.actor_id,
                    }),
                },
                Err(status) => Err(Error::from_status(&status, Some(&this.node))),
            })
        })
    }
}

impl Client<One> {
    /// A service's or container's log (admin, operator, reader): what is
    /// there (its last lines, when asked), then, when following, what is
    /// appended until the caller drops the stream.
    pub async fn logs(&self, request: &LogsRequest) -> Result<NodeDataStream> {
        let (namespace, driver) = request.namespace.wire();
        let message = machine::LogsRequest {
            namespace: namespace.to_string(),
            id: request.id.clone(),
            driver: driver as i32,
            follow: request.follow,
            tail_lines: request
                .tail_lines
                .map_or(-1, |n| i32::try_from(n).unwrap_or(i32::MAX)),
        };
        let (_, transport, node) = self.transport(&self.target, None).await?;
        let inner = machine_stub(transport)
            .logs(message)
            .await
            .map_err(|s| Error::from_status(&s, Some(&node)))?
            .into_inner();
        Ok(NodeDataStream { node, inner })
    }

    /// The kernel's messages (admin, operator, reader), one line per
    /// message: those kept since boot (none with `tail`), then, when
    /// following, new ones.
    pub async fn dmesg(&self, follow: bool, tail: bool) -> Result<NodeDataStream> {
        let (_, transport, node) = self.transport(&self.target, None).await?;
        let inner = machine_stub(transport)
            .dmesg(machine::DmesgRequest { follow, tail })
            .await
            .map_err(|s| Error::from_status(&s, Some(&node)))?
            .into_inner();
        Ok(NodeDataStream { node, inner })
    }

    /// machined's runtime events (admin, operator, reader): the past
    /// events asked for, then new ones until the caller drops the stream.
    /// The node sends an empty event first ([`EventPayload::Other`]).
    pub async fn events(&self, request: &EventsRequest) -> Result<EventStream> {
        let (_, transport, node) = self.transport(&self.target, None).await?;
        let inner = machine_stub(transport)
            .events(machine::EventsRequest {
                tail_events: request.tail_events,
                tail_id: request.tail_id.clone(),
                tail_seconds: request.tail_seconds,
                with_actor_id: request.actor_id.clone(),
            })
            .await
            .map_err(|s| Error::from_status(&s, Some(&node)))?
            .into_inner();
        Ok(EventStream { node, inner })
    }
}
