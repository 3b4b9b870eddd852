//! `talosctl-rs ops ...` through the talos-opsd daemon: when `--socket` (or
//! `$TALOS_OPSD_SOCKET`) names a socket that answers and `--local` is not
//! given, operations are started, listed, shown and watched through the
//! daemon's API, with the same output and exit codes as in-process runs.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::json;
use talos_client::ops::{Event, OpRecord, StepState};
use talos_opsd::proto::operation_event::Event as Ev;
use talos_opsd::proto::opsd_client::OpsdClient;
use talos_opsd::proto::{self, start_operation_request::Kind};
use tonic::transport::{Channel, Endpoint, Uri};

use super::Global;
use super::ops::{OpsArgs, OpsCommand, confirm, list, progress, report};

/// Runs the command through the daemon; `false` when it is to run in this
/// process (`--local`, no socket, no daemon answering, or `--plan`).
pub async fn dispatch(global: &Global, args: &OpsArgs) -> anyhow::Result<bool> {
    let watch = matches!(args.command, OpsCommand::Watch { .. });
    let socket = match (&args.socket, args.local) {
        (Some(socket), false) if !args.plan => socket,
        _ if watch => bail!("ops watch follows a daemon's operation: pass --socket, not --local"),
        _ => return Ok(false),
    };
    let mut client = match connect(socket).await {
        Ok(client) => client,
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
    let local_only = |what: &str| -> anyhow::Result<bool> {
        bail!("{what} is not available through talos-opsd: pass --local")
    };
    let kind = match &args.command {
        OpsCommand::Snapshot { dir: Some(_), .. } => {
            return local_only("--dir (the daemon uses its configured snapshot directory)");
        }
        OpsCommand::Snapshot { keep, .. } => Kind::Snapshot(proto::SnapshotParams {
            keep: u32::try_from(*keep).unwrap_or(u32::MAX),
        }),
        OpsCommand::Retire {
            snapshot_dir: Some(_),
            ..
        } => return local_only("--snapshot-dir"),
        OpsCommand::Retire {
            node,
            wipe,
            already_left,
            timeout,
            ..
        } => {
            if !args.yes {
                eprintln!("talos-opsd will retire {node} (snapshot, forfeit, leave, reset)");
                confirm()?;
            }
            Kind::Retire(proto::RetireParams {
                node: node.clone(),
                wipe: wipe.clone(),
                already_left: *already_left,
                silence_timeout_s: secs(*timeout),
            })
        }
        OpsCommand::Join {
            node,
            timeout,
            maintenance,
        } => Kind::Join(proto::JoinParams {
            node: node.clone(),
            timeout_s: secs(*timeout),
            maintenance: maintenance_config(maintenance),
        }),
        OpsCommand::Apply { check: Some(_), .. } => return local_only("apply --check"),
        OpsCommand::Apply {
            file,
            expect_change,
            allow_issuer_change,
            allow_reboot,
            try_timeout,
            reboot_timeout,
            ..
        } => {
            if !args.yes {
                eprintln!("talos-opsd will apply {} on trial", file.display());
                confirm()?;
            }
            let path = std::path::absolute(file).unwrap_or_else(|_| file.clone());
            Kind::Apply(proto::ApplyParams {
                nodes: global.connect()?.1,
                config_path: path.display().to_string(),
                expect_change: expect_change.clone(),
                allow_issuer_change: *allow_issuer_change,
                allow_reboot: *allow_reboot,
                try_timeout_s: secs(*try_timeout),
                reboot_timeout_s: secs(*reboot_timeout),
            })
        }
        OpsCommand::Migrate {
            snapshot_dir: Some(_),
            ..
        } => return local_only("--snapshot-dir"),
        OpsCommand::Migrate {
            from,
            to,
            maintenance,
            join_timeout,
            wipe,
            timeout,
            ..
        } => {
            if !args.yes {
                eprintln!(
                    "talos-opsd will join {to}, then retire {from} (snapshot, forfeit, leave, reset)"
                );
                confirm()?;
            }
            Kind::Migrate(proto::MigrateParams {
                from: from.clone(),
                to: to.clone(),
                maintenance: maintenance_config(maintenance),
                join_timeout_s: secs(*join_timeout),
                wipe: wipe.clone(),
                silence_timeout_s: secs(*timeout),
            })
        }
        OpsCommand::Resume { .. } | OpsCommand::Abandon { .. } => {
            return local_only(
                "resume and abandon (the daemon resumes interrupted operations when it starts)",
            );
        }
        OpsCommand::List => {
            let ops = client
                .list_operations(proto::ListOperationsRequest {
                    cluster,
                    state: String::new(),
                })
                .await
                .map_err(status)?
                .into_inner()
                .operations;
            list(
                global,
                ops.into_iter().map(record).collect::<Result<_, _>>()?,
            )?;
            return Ok(true);
        }
        OpsCommand::Show { id } => {
            let op = get(&mut client, id).await?;
            report(global, &record(op)?)?;
            return Ok(true);
        }
        OpsCommand::Watch { id } => {
            follow(global, &mut client, id).await?;
            return Ok(true);
        }
    };
    let started = client
        .start_operation(proto::StartOperationRequest {
            cluster,
            kind: Some(kind),
        })
        .await
        .map_err(status)?
        .into_inner();
    for note in &started.notes {
        eprintln!("note: {note}");
    }
    follow(global, &mut client, &started.id).await?;
    Ok(true)
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
                destructive: s.destructive,
            }),
            Some(Ev::StepEnded(s)) => progress(Event::StepEnded {
                index: s.index as usize,
                name: &s.name,
                state: parse_state(&s.state)?,
                duration_ms: s.duration_ms,
                detail: &s.detail,
            }),
            Some(Ev::Finished(f)) => error = f.error,
            None => {}
        }
    }
    let record = record(get(client, &full).await?)?;
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

/// A daemon's refusal as the CLI reports refusals: its message.
fn status(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", status.message())
}

fn maintenance_config(args: &super::ops::MaintenanceArgs) -> Option<proto::MaintenanceConfig> {
    args.for_daemon().map(
        |(path, cert_fingerprints, insecure)| proto::MaintenanceConfig {
            config_path: path.display().to_string(),
            cert_fingerprints,
            insecure,
        },
    )
}

fn secs(d: Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX).max(1)
}

fn parse_state(state: &str) -> anyhow::Result<StepState> {
    serde_json::from_value(json!(state)).with_context(|| format!("step state {state:?}"))
}

/// The daemon's view of an operation as the journal's record.
fn record(op: proto::Operation) -> anyhow::Result<OpRecord> {
    let opt = |s: String| (!s.is_empty()).then_some(s);
    let steps: Vec<_> = op
        .steps
        .into_iter()
        .map(|s| {
            let ended = !s.finished.is_empty();
            json!({
                "index": s.index,
                "name": s.name,
                "description": s.description,
                "destructive": s.destructive,
                "state": s.state,
                "started": opt(s.started),
                "finished": opt(s.finished),
                "duration_ms": ended.then_some(s.duration_ms),
                "detail": opt(s.detail),
            })
        })
        .collect();
    let parse = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap_or_default();
    serde_json::from_value(json!({
        "id": op.id,
        "kind": op.kind,
        "context": op.context,
        "ca_fingerprint": op.ca_fingerprint,
        "params": parse(&op.params_json),
        "facts": parse(&op.facts_json),
        "state": op.state,
        "created": op.created,
        "updated": op.updated,
        "steps": steps,
    }))
    .context("the daemon's operation record")
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
