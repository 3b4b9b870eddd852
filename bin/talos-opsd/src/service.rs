//! The gRPC service (`opsd.v1.Opsd`) over the [`Manager`]. Every request is
//! audited: who asked (the socket peer's uid and pid, or the client
//! certificate's subject), what, and the result.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use talos_client::ops::{OpRecord, OpSpec, OpsError, StepState};
use talos_opsd_api::{plan_to_proto, record_to_proto, spec_from_proto, state_name, step_events};
use tonic::{Request, Response, Status};

use crate::input;
use crate::listen::TlsPeer;
use crate::manager::{self, Manager, StartError};
use crate::proto;
use crate::proto::operation_event::Event as Ev;

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
        let record = &self.manager.as_recorded(record.clone());
        record_to_proto(
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
            reason = %input::truncated(status.message(), 1024)
        ),
    }
}

/// The gRPC status of an operations-layer error.
pub fn status_of(error: OpsError) -> Status {
    let message = error.to_string();
    match error {
        OpsError::Refused(refusal) => talos_opsd_api::refusal_status(&refusal, message),
        OpsError::Interrupted { .. }
        | OpsError::AwaitsAttention { .. }
        | OpsError::NotResumable { .. }
        | OpsError::EarlierFormat { .. } => Status::failed_precondition(message),
        OpsError::Busy { .. } => Status::aborted(message),
        OpsError::UnknownOperation(_) => Status::not_found(message),
        OpsError::AmbiguousOperation(_) => Status::invalid_argument(message),
        OpsError::Io { .. } => Status::invalid_argument(message),
        OpsError::Client(_) => Status::unavailable(message),
        _ => Status::internal(message),
    }
}

/// Refuses an id that cannot be an operation's (`INVALID_ARGUMENT`): ids
/// are ASCII letters, digits and `-`, at most [`MAX_ID_LEN`] bytes. A
/// unique leading part of an id is accepted; it is compared literally.
pub fn check_id(id: &str) -> Result<(), Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument("no operation id given"));
    }
    if id.len() > MAX_ID_LEN || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(Status::invalid_argument(format!(
            "{} is not an operation id (letters, digits and '-', at most {MAX_ID_LEN} bytes)",
            quoted(id)
        )));
    }
    Ok(())
}

/// The longest operation id (or leading part of one) accepted.
pub const MAX_ID_LEN: usize = 64;

/// `text` quoted and escaped for a log line or an error, cut to its first
/// 64 characters (with its length in bytes when cut).
pub fn quoted(text: &str) -> String {
    const KEEP: usize = 64;
    match text.char_indices().nth(KEEP) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &text[..cut], text.len()),
    }
}

/// The operation `id` names: exactly, or by a unique leading part compared
/// byte for byte (never as a pattern, never ignoring case); else
/// `NOT_FOUND`.
fn lookup(manager: &Manager, id: &str) -> Result<OpRecord, Status> {
    check_id(id)?;
    let record = manager
        .journal()
        .and_then(|j| j.get(id))
        .map_err(status_of)?;
    if !record.id.starts_with(id) {
        return Err(Status::not_found(format!("no operation {}", quoted(id))));
    }
    Ok(record)
}

/// Refuses an unknown state filter (`INVALID_ARGUMENT`).
fn check_state(state: &str) -> Result<(), Status> {
    if state.is_empty()
        || serde_json::from_value::<talos_client::ops::OpState>(serde_json::Value::from(state))
            .is_ok()
    {
        return Ok(());
    }
    Err(Status::invalid_argument(format!(
        "unknown state {} (running, succeeded, failed, abandoned, cancelled, needs-attention)",
        quoted(state)
    )))
}

fn status_of_start(error: StartError) -> Status {
    match error {
        StartError::Ops(e) => status_of(e),
        e @ StartError::UnknownCluster(_) => Status::not_found(e.to_string()),
        e @ (StartError::ShuttingDown | StartError::JournalUnwritable { .. }) => {
            Status::unavailable(e.to_string())
        }
    }
}

/// The spec a request asks for, and the request in words for the audit.
fn spec_of(request: &proto::StartOperationRequest) -> Result<(OpSpec, String), Status> {
    input::check_name(&request.cluster)?;
    input::check_fingerprint(&request.plan_fingerprint)?;
    let kind = request
        .kind
        .clone()
        .ok_or_else(|| Status::invalid_argument("no operation kind given"))?;
    let spec = spec_from_proto(kind);
    let params = serde_json::to_value(&spec).unwrap_or_default();
    input::check_fields(&params)?;
    let what = format!(
        "{} {} on cluster {}",
        spec.kind(),
        input::truncated(&params.to_string(), 1024),
        quoted(&request.cluster)
    );
    Ok((spec, what))
}

type EventStream = Pin<Box<dyn Stream<Item = Result<proto::OperationEvent, Status>> + Send>>;

#[tonic::async_trait]
impl proto::opsd_server::Opsd for Service {
    async fn plan_operation(
        &self,
        request: Request<proto::StartOperationRequest>,
    ) -> Result<Response<proto::Plan>, Status> {
        let who = who(&request);
        let request = request.into_inner();
        let mut what = format!("plan on cluster {}", quoted(&request.cluster));
        let result = async {
            let (spec, described) = spec_of(&request)?;
            what = format!("plan {described}");
            let plan = self
                .manager
                .plan(&request.cluster, &spec)
                .await
                .map_err(status_of_start)?;
            Ok(Response::new(plan_to_proto(&plan)))
        }
        .await;
        audit(&who, &what, &result);
        result.map_err(input::bounded)
    }

    async fn start_operation(
        &self,
        request: Request<proto::StartOperationRequest>,
    ) -> Result<Response<proto::Operation>, Status> {
        let who = who(&request);
        let request = request.into_inner();
        let mut what = format!("start on cluster {}", quoted(&request.cluster));
        let result = async {
            let (spec, described) = spec_of(&request)?;
            what = format!("start {described}");
            if request.without_cluster_lock {
                what.push_str(" without the cluster lock where Kubernetes cannot hold it");
            }
            let confirmed = Some(request.plan_fingerprint.clone()).filter(|f| !f.is_empty());
            let (record, notes) = self
                .manager
                .start(
                    &request.cluster,
                    spec,
                    confirmed,
                    request.without_cluster_lock,
                )
                .await
                .map_err(status_of_start)?;
            Ok(Response::new(self.record(&record, notes)))
        }
        .await;
        audit(&who, &what, &result);
        result.map_err(input::bounded)
    }

    async fn get_operation(
        &self,
        request: Request<proto::GetOperationRequest>,
    ) -> Result<Response<proto::Operation>, Status> {
        let who = who(&request);
        let id = request.into_inner().id;
        let result = lookup(&self.manager, &id).map(|r| Response::new(self.record(&r, Vec::new())));
        audit(&who, &format!("get {}", quoted(&id)), &result);
        result.map_err(input::bounded)
    }

    async fn list_operations(
        &self,
        request: Request<proto::ListOperationsRequest>,
    ) -> Result<Response<proto::ListOperationsResponse>, Status> {
        let who = who(&request);
        let filter = request.into_inner();
        let result = (|| {
            input::check_name(&filter.cluster)?;
            check_state(&filter.state)?;
            let fingerprint = match filter.cluster.as_str() {
                "" => None,
                name => Some(manager::fingerprint_of(
                    &self.manager.cluster(name).ok_or_else(|| {
                        Status::not_found(format!("no cluster {} is configured", quoted(name)))
                    })?,
                )),
            };
            let records = self
                .manager
                .journal()
                .and_then(|j| j.list(fingerprint.as_deref()))
                .map_err(status_of)?;
            let operations = records
                .into_iter()
                .map(|r| self.manager.as_recorded(r))
                .filter(|r| filter.state.is_empty() || state_name(r.state) == filter.state)
                .map(|r| self.record(&r, Vec::new()))
                .collect();
            Ok(Response::new(proto::ListOperationsResponse { operations }))
        })();
        audit(
            &who,
            &format!(
                "list cluster={} state={}",
                quoted(&filter.cluster),
                quoted(&filter.state)
            ),
            &result,
        );
        result.map_err(input::bounded)
    }

    type WatchOperationStream = EventStream;

    async fn watch_operation(
        &self,
        request: Request<proto::WatchOperationRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let who = who(&request);
        let id = request.into_inner().id;
        let result = self.watch(&id);
        audit(&who, &format!("watch {}", quoted(&id)), &result);
        result.map_err(input::bounded)
    }

    async fn list_snapshots(
        &self,
        request: Request<proto::ListSnapshotsRequest>,
    ) -> Result<Response<proto::ListSnapshotsResponse>, Status> {
        let who = who(&request);
        let cluster = request.into_inner().cluster;
        let configured = cluster.is_empty() || self.manager.cluster(&cluster).is_some();
        let result = if let Err(e) = input::check_name(&cluster) {
            Err(e)
        } else if configured {
            Ok(())
        } else {
            Err(Status::not_found(format!(
                "no cluster {} is configured",
                quoted(&cluster)
            )))
        }
        .and_then(|()| {
            self.manager
                .catalogue()
                .list((!cluster.is_empty()).then_some(cluster.as_str()))
                .map_err(|e| Status::internal(e.to_string()))
        })
        .map(|entries| {
            entries
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
                    ..Default::default()
                })
                .collect::<Vec<_>>()
        });
        let result = match result {
            Ok(mut snapshots) => {
                let (stored, errors) = self
                    .manager
                    .stored_backups((!cluster.is_empty()).then_some(cluster.as_str()))
                    .await;
                snapshots.extend(stored);
                // Newest first, files and stored objects alike.
                snapshots.sort_by(|a, b| b.taken.cmp(&a.taken));
                Ok(Response::new(proto::ListSnapshotsResponse {
                    snapshots,
                    errors,
                }))
            }
            Err(e) => Err(e),
        };
        audit(
            &who,
            &format!("list snapshots cluster={}", quoted(&cluster)),
            &result,
        );
        result.map_err(input::bounded)
    }

    async fn cancel_operation(
        &self,
        request: Request<proto::CancelOperationRequest>,
    ) -> Result<Response<proto::Operation>, Status> {
        let who = who(&request);
        let id = request.into_inner().id;
        let result = (|| {
            let record = lookup(&self.manager, &id)?;
            let running = self.manager.running(&record.id).ok_or_else(|| {
                Status::failed_precondition(format!(
                    "operation {} is not running in this daemon (it is {})",
                    record.id,
                    state_name(record.state)
                ))
            })?;
            running.stop.cancel().map_err(|refused| {
                let step = record
                    .steps
                    .iter()
                    .rfind(|s| s.destructive && s.state != StepState::Pending)
                    .map(|s| format!(" (step {:?})", s.label()))
                    .unwrap_or_default();
                Status::failed_precondition(format!("{refused}{step}"))
            })?;
            Ok(Response::new(self.record(&record, Vec::new())))
        })();
        audit(&who, &format!("cancel {}", quoted(&id)), &result);
        result.map_err(input::bounded)
    }
}

impl Service {
    fn watch(&self, id: &str) -> Result<Response<EventStream>, Status> {
        let record = lookup(&self.manager, id)?;
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
        let events = step_events(&record);
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
