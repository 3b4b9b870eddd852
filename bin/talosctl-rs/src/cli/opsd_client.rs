//! `talosctl-rs ops ...` through the talos-opsd daemon: when `--socket` (or
//! `$TALOS_OPSD_SOCKET`) names a socket that answers and `--local` is not
//! given, operations are started, listed, shown, watched, resumed and
//! abandoned through the daemon's API, with the same output and exit codes
//! as in-process runs. A resume or an abandon is planned by the daemon
//! (PlanResume), shown and confirmed as a start is, then sent with the
//! plan's fingerprint.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use talos_client::ops::Event;
use talos_opsd_api::proto::operation_event::Event as Ev;
use talos_opsd_api::proto::opsd_client::OpsdClient;
use talos_opsd_api::{PlanView, parse_step_state, proto, record_from_proto, spec_to_proto};
use tonic::transport::{Channel, Endpoint, Uri};

use super::Global;
use super::ops::{OpsArgs, OpsCommand};
use super::ops_output::{confirm, list, print_plan, progress, report, show_plan};

/// Runs the command through the daemon; `false` when it is to run in this
/// process (`--local`, no socket, or no daemon answering). A socket that
/// this user may not use (EACCES, EPERM) is an error naming it, never taken
/// for "no daemon". An operation is
/// planned by the daemon first (PlanOperation), shown and confirmed as an
/// in-process one is, then started with the plan's fingerprint: the daemon
/// refuses it if the cluster changed in between.
pub async fn dispatch(global: &Global, args: &OpsArgs) -> anyhow::Result<bool> {
    let watch = matches!(args.command, OpsCommand::Watch { .. });
    let socket = match (&args.socket, args.local) {
        (Some(socket), false) => socket,
        _ if watch => bail!("ops watch follows a daemon's operation: pass --socket, not --local"),
        _ => return Ok(false),
    };
    let mut client = match connect(socket).await {
        Ok(client) => client,
        // A socket this user may not use is a daemon that is there: running
        // in this process instead would bypass it (and its lock on the
        // cluster, when the state directories differ).
        Err(e) if permission_denied(&e).is_some() => bail!(
            "talos-opsd socket {}: {}: this user may not use the daemon's socket (it is the daemon user's only, mode 0600): run as that user, or pass --local to run in this process",
            socket.display(),
            permission_denied(&e)
                .map(ToString::to_string)
                .unwrap_or_default()
        ),
        Err(e) if !watch => {
            eprintln!(
                "note: no talos-opsd answers at {} ({e:#}): running in this process",
                socket.display()
            );
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    let cluster = global.resolve()?.name;
    if let OpsCommand::Report(report) = &args.command {
        if report.any_given() {
            bail!(
                "talos-opsd makes its report with the default thresholds: pass --local to use yours"
            );
        }
        let answer = client
            .get_report(proto::GetReportRequest { cluster })
            .await
            .map_err(status)?
            .into_inner();
        let report: talos_client::ops::RiskReport = serde_json::from_str(&answer.json)
            .map_err(|e| anyhow::anyhow!("talos-opsd's report cannot be read: {e}"))?;
        super::ops_output::print_report(global, &report)?;
        return match report.level.exit_code() {
            0 => Ok(true),
            code => Err(super::Exit(code as u8).into()),
        };
    }
    let nodes = match args.command {
        OpsCommand::Apply { .. } => global.connect()?.1,
        _ => Vec::new(),
    };
    let Some(spec) = args.command.spec(nodes) else {
        journal_command(global, &mut client, &cluster, &args.command, args.yes).await?;
        return Ok(true);
    };
    let kind = spec_to_proto(&spec).map_err(|e| anyhow::anyhow!("{e}: pass --local"))?;
    let mut request = proto::StartOperationRequest {
        cluster,
        kind: Some(kind),
        plan_fingerprint: String::new(),
        without_cluster_lock: args.without_cluster_lock,
    };
    let plan = PlanView::from(
        client
            .plan_operation(request.clone())
            .await
            .map_err(status)?
            .into_inner(),
    );
    show_plan(&plan);
    if args.plan {
        print_plan(global, &plan)?;
        return Ok(true);
    }
    if plan.is_destructive() && !args.yes {
        confirm()?;
    }
    request.plan_fingerprint = plan.fingerprint.clone();
    let started = client
        .start_operation(request)
        .await
        .map_err(status)?
        .into_inner();
    follow(global, &mut client, &started.id).await?;
    Ok(true)
}

async fn journal_command(
    global: &Global,
    client: &mut OpsdClient<Channel>,
    cluster: &str,
    command: &OpsCommand,
    yes: bool,
) -> anyhow::Result<()> {
    match command {
        OpsCommand::List => {
            let ops = client
                .list_operations(proto::ListOperationsRequest {
                    cluster: cluster.into(),
                    state: String::new(),
                })
                .await
                .map_err(status)?
                .into_inner()
                .operations;
            let records = ops
                .into_iter()
                .map(record_from_proto)
                .collect::<Result<_, _>>()?;
            list(global, records)
        }
        OpsCommand::Show { id } => {
            let op = get(client, id).await?;
            report(global, &record_from_proto(op)?)
        }
        OpsCommand::Watch { id } => follow(global, client, id).await,
        OpsCommand::Resume { id } => {
            let (id, fingerprint) = plan_resume(client, id, yes, "resume").await?;
            let resumed = client
                .resume_operation(proto::ResumeOperationRequest {
                    id,
                    plan_fingerprint: fingerprint,
                })
                .await
                .map_err(status)?
                .into_inner();
            follow(global, client, &resumed.id).await
        }
        OpsCommand::Abandon { id } => {
            let (id, fingerprint) = plan_resume(client, id, yes, "abandon").await?;
            let abandoned = client
                .abandon_operation(proto::AbandonOperationRequest {
                    id,
                    plan_fingerprint: fingerprint,
                })
                .await
                .map_err(status)?
                .into_inner();
            eprintln!("operation {} abandoned", abandoned.id);
            report(global, &record_from_proto(abandoned)?)
        }
        _ => bail!("not a journal command"),
    }
}

/// What resuming operation `id` would do, from the daemon, shown as a plan
/// is; confirmed (`what`: resume or abandon) as a start is. Returns the
/// full id and the fingerprint to confirm with.
async fn plan_resume(
    client: &mut OpsdClient<Channel>,
    id: &str,
    yes: bool,
    what: &str,
) -> anyhow::Result<(String, String)> {
    let plan = client
        .plan_resume(proto::PlanResumeRequest { id: id.into() })
        .await
        .map_err(status)?
        .into_inner();
    let id = plan
        .operation
        .as_ref()
        .map(|op| op.id.clone())
        .unwrap_or_else(|| id.to_string());
    let view = PlanView::from(plan);
    show_plan(&view);
    // An abandon changes no node, but ends the operation for good where
    // it stands: it is confirmed as a destructive step is.
    if (what == "abandon" || view.is_destructive()) && !yes {
        eprintln!("{what} operation {id}:");
        confirm()?;
    }
    Ok((id, view.fingerprint))
}

/// Prints the operation's steps as they happen, then its record; fails
/// (exit 1) unless it succeeded.
async fn follow(global: &Global, client: &mut OpsdClient<Channel>, id: &str) -> anyhow::Result<()> {
    let full = get(client, id).await?.id;
    let mut stream = client
        .watch_operation(proto::WatchOperationRequest { id: full.clone() })
        .await
        .map_err(status)?
        .into_inner();
    progress(Event::Started { id: &full });
    let mut error = String::new();
    while let Some(event) = stream.message().await.map_err(status)? {
        match event.event {
            Some(Ev::StepStarted(s)) => progress(Event::StepStarted {
                index: s.index as usize,
                name: &s.name,
                node: (!s.node.is_empty()).then_some(s.node.as_str()),
                destructive: s.destructive,
            }),
            Some(Ev::StepEnded(s)) => progress(Event::StepEnded {
                index: s.index as usize,
                name: &s.name,
                node: (!s.node.is_empty()).then_some(s.node.as_str()),
                state: parse_step_state(&s.state)?,
                duration_ms: s.duration_ms,
                detail: &s.detail,
            }),
            Some(Ev::Finished(f)) => error = f.error,
            None => {}
        }
    }
    let record = record_from_proto(get(client, &full).await?)?;
    if !error.is_empty() {
        bail!("{error}");
    }
    report(global, &record)
}

async fn get(client: &mut OpsdClient<Channel>, id: &str) -> anyhow::Result<proto::Operation> {
    Ok(client
        .get_operation(proto::GetOperationRequest { id: id.into() })
        .await
        .map_err(status)?
        .into_inner())
}

/// A daemon's refusal as the CLI reports refusals: the typed refusal when
/// the daemon sent one (so the same hint follows), else its message.
fn status(status: tonic::Status) -> anyhow::Error {
    match talos_opsd_api::refusal_of(&status) {
        Some(refusal) => talos_client::ops::OpsError::Refused(refusal).into(),
        None => anyhow::anyhow!("{}", status.message()),
    }
}

/// The refusal (EACCES, EPERM) behind a failed connection, if that is
/// what failed.
fn permission_denied(e: &anyhow::Error) -> Option<&std::io::Error> {
    e.chain()
        .filter_map(|cause| cause.downcast_ref::<std::io::Error>())
        .find(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
}

async fn connect(path: &Path) -> anyhow::Result<OpsdClient<Channel>> {
    let path = path.to_owned();
    let channel = Endpoint::try_from("http://talos-opsd")?
        .connect_timeout(Duration::from_secs(2))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .context("connecting")?;
    Ok(OpsdClient::new(channel))
}
