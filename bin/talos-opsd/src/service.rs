//! The gRPC service (`opsd.v1.Opsd`) over the [`Manager`]. Every request is
//! audited: who asked (the socket peer's uid and pid, or the client
//! certificate's subject), what, and the result.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use talos_client::ops::{
    ApplyOptions, JoinOptions, MaintenanceApply, MigrateOptions, OpRecord, OpsError, RetireOptions,
    StepState,
};
use tonic::{Request, Response, Status};

use crate::listen::TlsPeer;
use crate::manager::{self, Manager};
use crate::proto;
use crate::proto::operation_event::Event as Ev;
use crate::proto::start_operation_request::Kind;

/// The service.
pub struct Service {
    manager: Arc<Manager>,
}

impl Service {
    /// A service over `manager`.
    pub fn new(manager: Arc<Manager>) -> Service {
        Service { manager }
    }

    fn record(&self, record: &OpRecord, notes: Vec<String>) -> proto::Operation {
        to_operation(
            record,
            self.manager
                .cluster_of(&record.ca_fingerprint)
                .unwrap_or_default(),
            notes,
        )
    }
}

/// Who sent a request, for the audit log.
pub fn who<T>(request: &Request<T>) -> String {
    if let Some(info) = request
        .extensions()
        .get::<tonic::transport::server::UdsConnectInfo>()
    {
        return match &info.peer_cred {
            Some(cred) => format!(
                "uid={} pid={}",
                cred.uid(),
                cred.pid().map_or("?".to_string(), |p| p.to_string())
            ),
            None => "unix socket peer (no credentials)".into(),
        };
    }
    if let Some(peer) = request.extensions().get::<TlsPeer>() {
        return format!("cert subject {:?} from {}", peer.subject, peer.addr);
    }
    "unknown".into()
}

fn audit<T>(who: &str, what: &str, result: &Result<T, Status>) {
    match result {
        Ok(_) => tracing::info!(target: "audit", who, what, result = "ok"),
        Err(status) => tracing::info!(
            target: "audit",
            who,
            what,
            result = ?status.code(),
            reason = status.message()
        ),
    }
}

/// The gRPC status of an operations-layer error.
pub fn status_of(error: OpsError) -> Status {
    let message = error.to_string();
    match error {
        OpsError::Refused(_) | OpsError::Interrupted { .. } | OpsError::NotResumable { .. } => {
            Status::failed_precondition(message)
        }
        OpsError::Busy { .. } => Status::aborted(message),
        OpsError::UnknownOperation(_) => Status::not_found(message),
        OpsError::AmbiguousOperation(_) => Status::invalid_argument(message),
        OpsError::Client(_) => Status::unavailable(message),
        _ => Status::internal(message),
    }
}

fn secs(value: u32, default: u64) -> Duration {
    Duration::from_secs(if value == 0 { default } else { value.into() })
}

/// A maintenance-mode configuration, read on this host; refused as the CLI
/// refuses it (neither pinned nor explicitly insecure, unreadable).
fn maintenance(
    config: Option<proto::MaintenanceConfig>,
) -> Result<Option<MaintenanceApply>, Status> {
    config
        .map(|c| {
            MaintenanceApply::load(
                std::path::Path::new(&c.config_path),
                c.cert_fingerprints,
                c.insecure,
            )
            .map_err(|e| Status::invalid_argument(e.to_string()))
        })
        .transpose()
}

fn to_request(kind: Kind) -> Result<(manager::Request, String), Status> {
    Ok(match kind {
        Kind::Snapshot(p) => (
            manager::Request::Snapshot {
                keep: p.keep as usize,
            },
            "snapshot".into(),
        ),
        Kind::Retire(p) => (
            manager::Request::Retire(RetireOptions {
                node: p.node.clone(),
                wipe: p.wipe,
                already_left: p.already_left,
                snapshot_dir: Default::default(),
                silence_timeout: secs(p.silence_timeout_s, 120),
            }),
            format!("retire {}", p.node),
        ),
        Kind::Join(p) => {
            let maintenance = maintenance(p.maintenance)?;
            let what = match &maintenance {
                Some(m) => format!("join {} with {}", p.node, m.config_path.display()),
                None => format!("join {}", p.node),
            };
            (
                manager::Request::Join(JoinOptions {
                    node: p.node,
                    timeout: secs(p.timeout_s, 600),
                    maintenance,
                }),
                what,
            )
        }
        Kind::Migrate(p) => (
            manager::Request::Migrate(MigrateOptions {
                maintenance: maintenance(p.maintenance)?,
                join_timeout: secs(p.join_timeout_s, 600),
                wipe: p.wipe,
                snapshot_dir: Default::default(),
                silence_timeout: secs(p.silence_timeout_s, 120),
                from: p.from.clone(),
                to: p.to.clone(),
            }),
            format!("migrate from {} to {}", p.from, p.to),
        ),
        Kind::Apply(p) => {
            let config = std::fs::read(&p.config_path)
                .map_err(|e| Status::invalid_argument(format!("{}: {e}", p.config_path)))?;
            let what = format!("apply {} to {}", p.config_path, p.nodes.join(","));
            (
                manager::Request::Apply(ApplyOptions {
                    nodes: p.nodes,
                    config_path: p.config_path.into(),
                    config,
                    expect_change: p.expect_change,
                    allow_issuer_change: p.allow_issuer_change,
                    allow_reboot: p.allow_reboot,
                    try_timeout: secs(p.try_timeout_s, 60),
                    reboot_timeout: secs(p.reboot_timeout_s, 600),
                    check: None,
                }),
                what,
            )
        }
    })
}

type EventStream = Pin<Box<dyn Stream<Item = Result<proto::OperationEvent, Status>> + Send>>;

#[tonic::async_trait]
impl proto::opsd_server::Opsd for Service {
    async fn start_operation(
        &self,
        request: Request<proto::StartOperationRequest>,
    ) -> Result<Response<proto::Operation>, Status> {
        let who = who(&request);
        let request = request.into_inner();
        let mut what = format!("start on cluster {:?}", request.cluster);
        let result = async {
            let kind = request
                .kind
                .ok_or_else(|| Status::invalid_argument("no operation kind given"))?;
            let (req, described) = to_request(kind)?;
            what = format!("start {described} on cluster {:?}", request.cluster);
            let (record, notes) = self
                .manager
                .start(&request.cluster, req)
                .await
                .map_err(status_of)?;
            Ok(Response::new(self.record(&record, notes)))
        }
        .await;
        audit(&who, &what, &result);
        result
    }

    async fn get_operation(
        &self,
        request: Request<proto::GetOperationRequest>,
    ) -> Result<Response<proto::Operation>, Status> {
        let who = who(&request);
        let id = request.into_inner().id;
        let result = self
            .manager
            .journal()
            .and_then(|j| j.get(&id))
            .map(|r| Response::new(self.record(&r, Vec::new())))
            .map_err(status_of);
        audit(&who, &format!("get {id}"), &result);
        result
    }

    async fn list_operations(
        &self,
        request: Request<proto::ListOperationsRequest>,
    ) -> Result<Response<proto::ListOperationsResponse>, Status> {
        let who = who(&request);
        let filter = request.into_inner();
        let result = (|| {
            let fingerprint = match filter.cluster.as_str() {
                "" => None,
                name => Some(manager::fingerprint_of(
                    &self.manager.cluster(name).ok_or_else(|| {
                        Status::not_found(format!("no cluster {name:?} is configured"))
                    })?,
                )),
            };
            let records = self
                .manager
                .journal()
                .and_then(|j| j.list(fingerprint.as_deref()))
                .map_err(status_of)?;
            let operations = records
                .iter()
                .filter(|r| filter.state.is_empty() || manager::state_name(r.state) == filter.state)
                .map(|r| self.record(r, Vec::new()))
                .collect();
            Ok(Response::new(proto::ListOperationsResponse { operations }))
        })();
        audit(
            &who,
            &format!("list cluster={:?} state={:?}", filter.cluster, filter.state),
            &result,
        );
        result
    }

    type WatchOperationStream = EventStream;

    async fn watch_operation(
        &self,
        request: Request<proto::WatchOperationRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let who = who(&request);
        let id = request.into_inner().id;
        let result = self.watch(&id);
        audit(&who, &format!("watch {id}"), &result);
        result
    }

    async fn list_snapshots(
        &self,
        request: Request<proto::ListSnapshotsRequest>,
    ) -> Result<Response<proto::ListSnapshotsResponse>, Status> {
        let who = who(&request);
        let cluster = request.into_inner().cluster;
        let result = self
            .manager
            .catalogue()
            .list((!cluster.is_empty()).then_some(cluster.as_str()))
            .map(|entries| {
                Response::new(proto::ListSnapshotsResponse {
                    snapshots: entries
                        .into_iter()
                        .map(|e| proto::Snapshot {
                            cluster: e.cluster,
                            operation_id: e.operation_id,
                            node: e.node,
                            taken: e.taken,
                            revision: e.revision,
                            sha256: e.sha256,
                            size: e.size,
                            path: e.path.display().to_string(),
                        })
                        .collect(),
                })
            })
            .map_err(|e| Status::internal(e.to_string()));
        audit(
            &who,
            &format!("list snapshots cluster={cluster:?}"),
            &result,
        );
        result
    }

    async fn cancel_operation(
        &self,
        request: Request<proto::CancelOperationRequest>,
    ) -> Result<Response<proto::Operation>, Status> {
        let who = who(&request);
        let id = request.into_inner().id;
        let result = (|| {
            let record = self
                .manager
                .journal()
                .and_then(|j| j.get(&id))
                .map_err(status_of)?;
            let running = self.manager.running(&record.id).ok_or_else(|| {
                Status::failed_precondition(format!(
                    "operation {} is not running in this daemon (it is {})",
                    record.id,
                    manager::state_name(record.state)
                ))
            })?;
            running.stop.cancel().map_err(|refused| {
                let step = record
                    .steps
                    .iter()
                    .rfind(|s| s.destructive && s.state != StepState::Pending)
                    .map(|s| format!(" (step {:?})", s.name))
                    .unwrap_or_default();
                Status::failed_precondition(format!("{refused}{step}"))
            })?;
            Ok(Response::new(self.record(&record, Vec::new())))
        })();
        audit(&who, &format!("cancel {id}"), &result);
        result
    }
}

impl Service {
    fn watch(&self, id: &str) -> Result<Response<EventStream>, Status> {
        let record = self
            .manager
            .journal()
            .and_then(|j| j.get(id))
            .map_err(status_of)?;
        if let Some(running) = self.manager.running(&record.id) {
            let mut rx = running.events.subscribe();
            let stream = async_stream(move |tx| async move {
                let mut sent = 0;
                loop {
                    let events: Vec<_> = rx.borrow_and_update()[sent..].to_vec();
                    for event in events {
                        sent += 1;
                        let last = matches!(event.event, Some(Ev::Finished(_)));
                        if tx.send(Ok(event)).await.is_err() || last {
                            return;
                        }
                    }
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            });
            return Ok(Response::new(stream));
        }
        // Not running here: its journaled steps, then its state.
        let events = journaled_events(&record);
        Ok(Response::new(Box::pin(futures::stream::iter(
            events.into_iter().map(Ok),
        ))))
    }
}

/// A stream fed by a task through a channel.
fn async_stream<F, Fut>(body: F) -> EventStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<proto::OperationEvent, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(body(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

fn journaled_events(record: &OpRecord) -> Vec<proto::OperationEvent> {
    let event = |ev| proto::OperationEvent {
        operation_id: record.id.clone(),
        event: Some(ev),
    };
    let mut events = Vec::new();
    for step in record
        .steps
        .iter()
        .filter(|s| s.state != StepState::Pending)
    {
        events.push(event(Ev::StepStarted(proto::StepStarted {
            index: step.index as u32,
            name: step.name.clone(),
            destructive: step.destructive,
        })));
        if step.state != StepState::Running {
            events.push(event(Ev::StepEnded(proto::StepEnded {
                index: step.index as u32,
                name: step.name.clone(),
                state: manager::step_state_name(step.state),
                duration_ms: step.duration_ms.unwrap_or_default(),
                detail: step.detail.clone().unwrap_or_default(),
            })));
        }
    }
    events.push(event(Ev::Finished(proto::Finished {
        state: manager::state_name(record.state),
        error: String::new(),
    })));
    events
}

/// The API's view of a journaled operation.
pub fn to_operation(record: &OpRecord, cluster: String, notes: Vec<String>) -> proto::Operation {
    proto::Operation {
        id: record.id.clone(),
        cluster,
        kind: record.kind.clone(),
        context: record.context.clone(),
        state: manager::state_name(record.state),
        created: record.created.clone(),
        updated: record.updated.clone(),
        steps: record
            .steps
            .iter()
            .map(|s| proto::Step {
                index: s.index as u32,
                name: s.name.clone(),
                description: s.description.clone(),
                destructive: s.destructive,
                state: manager::step_state_name(s.state),
                started: s.started.clone().unwrap_or_default(),
                finished: s.finished.clone().unwrap_or_default(),
                duration_ms: s.duration_ms.unwrap_or_default(),
                detail: s.detail.clone().unwrap_or_default(),
            })
            .collect(),
        params_json: record.params.to_string(),
        facts_json: record.facts.to_string(),
        notes,
        ca_fingerprint: record.ca_fingerprint.clone(),
    }
}
