//! The gRPC service (`opsd.v1.Opsd`) over the [`Manager`]. Every request is
//! audited: who asked (the socket peer's uid and pid, or the client
//! certificate's subject), what, and the result.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use talos_client::ops::{OpRecord, OpSpec, OpsError, StepState};
use talos_client::text::escaped;
use talos_opsd_api::{plan_to_proto, record_to_proto, spec_from_proto, state_name, step_events};
use tonic::{Request, Response, Status};

use crate::accept::Conn;
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
    if let Some(Conn { peer: info, .. }) = request
        .extensions()
        .get::<Conn<tonic::transport::server::UdsConnectInfo>>()
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
    if let Some(Conn { peer, .. }) = request.extensions().get::<Conn<TlsPeer>>() {
        return format!(
            "cert subject {} from {}",
            quoted_path(&peer.subject),
            peer.addr
        );
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
            reason = %escaped(status.message(), 1024)
        ),
    }
}

/// Whether `e` says the storage failed (full, out of quota, failing or
/// read-only), not the input.
pub fn storage_failed(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC | libc::EDQUOT | libc::EIO | libc::EROFS)
    )
}

/// Whether a journal error is its storage's (full, failing, read-only,
/// not openable, held by another process): the daemon cannot serve, the
/// input is not at fault.
fn journal_storage_failed(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode as C;
    matches!(
        e.sqlite_error_code(),
        Some(
            C::DiskFull
                | C::SystemIoFailure
                | C::ReadOnly
                | C::CannotOpen
                | C::DatabaseBusy
                | C::DatabaseLocked
                | C::PermissionDenied
                | C::NoLargeFileSupport
        )
    )
}

/// The gRPC status of an operations-layer error: the daemon's own storage
/// failing (a full disk, an I/O error, a read-only file system, a journal
/// that cannot be written) is `UNAVAILABLE` with the path named; a path
/// the caller gave that cannot be used is `INVALID_ARGUMENT`.
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
        OpsError::Io { ref source, .. } if storage_failed(source) => Status::unavailable(message),
        OpsError::Io { .. } => Status::invalid_argument(message),
        OpsError::Snapshot(talos_client::snapshot::SnapshotError::Io { ref source, .. })
            if storage_failed(source) =>
        {
            Status::unavailable(message)
        }
        OpsError::Journal { ref source, .. } if journal_storage_failed(source) => {
            Status::unavailable(message)
        }
        OpsError::CorruptJournal { .. } | OpsError::LaterFormat { .. } => {
            Status::unavailable(message)
        }
        OpsError::Client(_) => Status::unavailable(message),
        _ => Status::internal(message),
    }
}

/// As [`status_of`], for an error about `state_dir` (the daemon's own
/// files: its locks, its journal): a file there that cannot be used is
/// never the caller's fault, so `UNAVAILABLE`, not `INVALID_ARGUMENT`.
fn status_in(state_dir: &std::path::Path, error: OpsError) -> Status {
    match &error {
        OpsError::Io { path, .. } if path.starts_with(state_dir) => {
            Status::unavailable(error.to_string())
        }
        _ => status_of(error),
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

/// `text` quoted and escaped for a log line or an error, cut after its
/// first 64 characters (with its length in bytes when cut): the one
/// escaping function, the library's ([`talos_client::text`]).
pub use talos_client::text::quoted;

/// A path (or a certificate's subject) quoted, escaped and cut as
/// [`quoted`], at the bound of a path.
fn quoted_path(text: &str) -> String {
    let mut out = String::new();
    let _ = talos_client::text::escape_into(&mut out, text, talos_client::text::PATH_BOUND, true);
    out
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

fn status_of_start(state_dir: &std::path::Path, error: StartError) -> Status {
    match error {
        StartError::Ops(e) => status_in(state_dir, e),
        e @ StartError::UnknownCluster(_) => Status::not_found(e.to_string()),
        e @ (StartError::ShuttingDown | StartError::JournalUnwritable { .. }) => {
            Status::unavailable(e.to_string())
        }
        e @ (StartError::RecordChanged { .. } | StartError::NotConfigured { .. }) => {
            Status::failed_precondition(e.to_string())
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
    input::check_lists(&kind)?;
    let spec = spec_from_proto(kind);
    let params = serde_json::to_value(&spec).unwrap_or_default();
    input::check_fields(&params)?;
    let what = format!(
        "{} {} on cluster {}",
        spec.kind(),
        input::described(&params),
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
                .map_err(|e| status_of_start(&self.manager.state_dir, e))?;
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
                .map_err(|e| status_of_start(&self.manager.state_dir, e))?;
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
                // The catalogue is the daemon's own journal database.
                .map_err(|e| Status::unavailable(e.to_string()))
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

    async fn plan_resume(
        &self,
        request: Request<proto::PlanResumeRequest>,
    ) -> Result<Response<proto::ResumePlan>, Status> {
        let who = who(&request);
        let id = request.into_inner().id;
        let result = check_id(&id).and_then(|()| {
            self.manager
                .plan_resume(&id)
                .map(Response::new)
                .map_err(|e| status_of_start(&self.manager.state_dir, e))
        });
        audit(&who, &format!("plan resume {}", quoted(&id)), &result);
        result.map_err(input::bounded)
    }

    async fn resume_operation(
        &self,
        request: Request<proto::ResumeOperationRequest>,
    ) -> Result<Response<proto::Operation>, Status> {
        let who = who(&request);
        let request = request.into_inner();
        let result = async {
            check_confirmed(&request.id, &request.plan_fingerprint)?;
            let record = self
                .manager
                .resume_confirmed(&request.id, &request.plan_fingerprint)
                .await
                .map_err(|e| status_of_start(&self.manager.state_dir, e))?;
            Ok(Response::new(self.record(&record, Vec::new())))
        }
        .await;
        audit(&who, &format!("resume {}", quoted(&request.id)), &result);
        result.map_err(input::bounded)
    }

    async fn abandon_operation(
        &self,
        request: Request<proto::AbandonOperationRequest>,
    ) -> Result<Response<proto::Operation>, Status> {
        let who = who(&request);
        let request = request.into_inner();
        let result = check_confirmed(&request.id, &request.plan_fingerprint).and_then(|()| {
            let record = self
                .manager
                .abandon_confirmed(&request.id, &request.plan_fingerprint)
                .map_err(|e| status_of_start(&self.manager.state_dir, e))?;
            Ok(Response::new(self.record(&record, Vec::new())))
        });
        audit(&who, &format!("abandon {}", quoted(&request.id)), &result);
        result.map_err(input::bounded)
    }

    async fn get_report(
        &self,
        request: Request<proto::GetReportRequest>,
    ) -> Result<Response<proto::Report>, Status> {
        let who = who(&request);
        let cluster = request.into_inner().cluster;
        let result = match input::check_name(&cluster) {
            Err(e) => Err(e),
            Ok(()) => self
                .manager
                .report(&cluster)
                .await
                .map_err(|e| status_of_start(&self.manager.state_dir, e))
                .map(|report| Response::new(report_message(&cluster, &report))),
        };
        audit(
            &who,
            &format!("report cluster={}", quoted(&cluster)),
            &result,
        );
        result.map_err(input::bounded)
    }
}

fn report_level(level: talos_client::ops::Level) -> i32 {
    use talos_client::ops::Level;
    (match level {
        Level::Ok => proto::ReportLevel::Ok,
        Level::Warning => proto::ReportLevel::Warning,
        Level::Critical => proto::ReportLevel::Critical,
    }) as i32
}

fn report_message(cluster: &str, report: &talos_client::ops::RiskReport) -> proto::Report {
    proto::Report {
        cluster: cluster.to_string(),
        level: report_level(report.level),
        findings: report
            .findings
            .iter()
            .map(|f| proto::ReportFinding {
                check: f.check.clone(),
                level: report_level(f.level),
                subject: f.subject.clone().unwrap_or_default(),
                message: f.message.clone(),
            })
            .collect(),
        json: serde_json::to_string(report).unwrap_or_default(),
    }
}

/// Refuses a resume or abandon without a well-formed id and the
/// fingerprint of the resume plan it confirms (`INVALID_ARGUMENT`).
fn check_confirmed(id: &str, fingerprint: &str) -> Result<(), Status> {
    check_id(id)?;
    input::check_fingerprint(fingerprint)?;
    if fingerprint.is_empty() {
        return Err(Status::invalid_argument(
            "no plan_fingerprint: a resume or an abandon is confirmed with the fingerprint PlanResume answered",
        ));
    }
    Ok(())
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
