//! `reboot`, `shutdown` and `bootstrap`, with talosctl's flags
//! (cmd/talosctl/cmd/talos/reboot.go, shutdown.go, bootstrap.go at
//! v1.13.9). With `--wait` (the default) reboot waits until each node
//! booted again (its boot id changed, as talosctl's post check reads it)
//! and shutdown until each node stopped answering.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use talos_client::Client;
use talos_client::client::RebootMode;

use super::apply::parse_go_duration;
use super::{Global, Output, each_target, print_nodes};

/// Where a node's boot id is read (talosctl's BootIDChangedPostCheckFn).
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

#[derive(clap::Args)]
pub struct RebootArgs {
    /// Select the reboot mode: default, powercycle (bypasses kexec) or
    /// force (skips the graceful steps).
    #[arg(short, long, default_value = "default", value_parser = parse_mode)]
    pub mode: RebootMode,
    /// Wait for the operation to complete, tracking its progress.
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub wait: bool,
    /// Time to wait for the operation to complete.
    #[arg(long, default_value = "30m", value_parser = parse_go_duration)]
    pub timeout: Duration,
}

#[derive(clap::Args)]
pub struct ShutdownArgs {
    /// If true, force a node to shutdown without a cordon/drain.
    #[arg(long)]
    pub force: bool,
    /// Wait for the operation to complete, tracking its progress.
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub wait: bool,
    /// Time to wait for the operation to complete.
    #[arg(long, default_value = "30m", value_parser = parse_go_duration)]
    pub timeout: Duration,
}

#[derive(clap::Args)]
pub struct BootstrapArgs {
    /// Recover etcd cluster from the snapshot.
    #[arg(long, value_name = "FILE")]
    pub recover_from: Option<PathBuf>,
    /// Skip integrity check when recovering etcd (use when recovering from
    /// data directory copy).
    #[arg(long)]
    pub recover_skip_hash_check: bool,
}

fn parse_mode(value: &str) -> Result<RebootMode, String> {
    match value.to_ascii_lowercase().as_str() {
        "default" => Ok(RebootMode::Default),
        "powercycle" => Ok(RebootMode::Powercycle),
        "force" => Ok(RebootMode::Force),
        other => Err(format!(
            "{other:?} is not a reboot mode (default, powercycle, force)"
        )),
    }
}

/// The node's boot id, or None while it does not answer.
async fn boot_id(client: &Client) -> Option<String> {
    let mut stream = client.read(BOOT_ID).await.ok()?;
    let mut text = Vec::new();
    while let Some(chunk) = stream.next().await {
        text.extend_from_slice(&chunk.ok()?);
    }
    Some(String::from_utf8_lossy(&text).trim().to_string())
}

/// Polls `check` every half second until it holds or `timeout` passes.
async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        if Instant::now() > deadline {
            anyhow::bail!(
                "{what}: not done within {}",
                super::services::go_seconds(timeout)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

pub async fn reboot(global: &Global, args: RebootArgs) -> anyhow::Result<()> {
    let targets = global.targets()?;
    let mut before = Vec::new();
    if args.wait {
        for (_, client) in &targets {
            before.push(boot_id(client).await);
        }
    }
    let mode = args.mode;
    let replies = each_target(&targets, |c| async move { c.reboot(mode).await }).await;
    let accepted: Vec<String> = replies
        .iter()
        .filter(|r| r.result.is_ok())
        .map(|r| r.node.clone())
        .collect();
    let printed = report(global.output, replies, "reboot");
    if args.wait {
        for ((node, client), before) in targets.iter().zip(before) {
            if !accepted.contains(node) {
                continue;
            }
            progress(global.output, node, "waiting for the node to reboot");
            wait_until(&format!("{node}: reboot"), args.timeout, || async {
                match boot_id(client).await {
                    Some(now) => before.as_ref().is_none_or(|b| *b != now),
                    None => false,
                }
            })
            .await?;
            progress(global.output, node, "rebooted (boot id changed)");
        }
    }
    printed
}

pub async fn shutdown(global: &Global, args: ShutdownArgs) -> anyhow::Result<()> {
    let targets = global.targets()?;
    let force = args.force;
    let replies = each_target(&targets, |c| async move { c.shutdown(force).await }).await;
    let accepted: Vec<String> = replies
        .iter()
        .filter(|r| r.result.is_ok())
        .map(|r| r.node.clone())
        .collect();
    let printed = report(global.output, replies, "shutdown");
    if args.wait {
        for (node, client) in &targets {
            if !accepted.contains(node) {
                continue;
            }
            progress(global.output, node, "waiting for the node to power off");
            wait_until(&format!("{node}: shutdown"), args.timeout, || async {
                client.version().await.is_err()
            })
            .await?;
            progress(global.output, node, "powered off");
        }
    }
    printed
}

/// The per-node answers: nothing on stdout in table mode (as talosctl),
/// the actor ids otherwise.
fn report(
    output: Output,
    replies: talos_client::NodeResults<String>,
    what: &str,
) -> anyhow::Result<()> {
    print_nodes(output, replies, |rows| {
        for (node, actor) in rows {
            eprintln!("{node}: {what} accepted (actor id {actor})");
        }
        Ok(())
    })
}

fn progress(output: Output, node: &str, message: &str) {
    if output == Output::Table {
        eprintln!("{node}: {message}");
    }
}

pub async fn bootstrap(global: &Global, args: BootstrapArgs) -> anyhow::Result<()> {
    let (client, node) = global.connect_one("bootstrap")?;
    if let Some(path) = &args.recover_from {
        let status = recovery_status(path, args.recover_skip_hash_check)?;
        outln!(
            "recovering from snapshot {:?}: hash {:08x}, revision {}, total keys {}, total size {}",
            path.display().to_string(),
            status.hash,
            status.revision,
            status.total_keys,
            status.total_size
        );
        let file = tokio::fs::File::open(path)
            .await
            .with_context(|| format!("--recover-from {}: cannot open", path.display()))?;
        let chunks = futures::stream::unfold(Some(file), |file| async move {
            use tokio::io::AsyncReadExt as _;
            let mut file = file?;
            let mut buf = vec![0u8; 1 << 20];
            match file.read(&mut buf).await {
                Ok(0) | Err(_) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((bytes::Bytes::from(buf), Some(file)))
                }
            }
        });
        client
            .etcd_recover(chunks)
            .await
            .context("error uploading snapshot")?;
    }
    client
        .bootstrap(args.recover_from.is_some(), args.recover_skip_hash_check)
        .await
        .context("error executing bootstrap")?;
    if global.output == Output::Table {
        eprintln!("{node}: bootstrap accepted");
        Ok(())
    } else {
        super::print_structured(
            global.output,
            &serde_json::json!([{ "node": node, "result": {} }]),
        )
    }
}

/// The snapshot's status as talosctl prints it before the upload. A
/// snapshot must pass every check of `snapshot verify` (its sha256 trailer
/// against its contents included: talosctl only lets etcd check it, on the
/// node, after the upload); with `--recover-skip-hash-check` (a copy of a
/// data directory, which has no trailer) only the bbolt file is read.
fn recovery_status(
    path: &std::path::Path,
    skip_hash_check: bool,
) -> anyhow::Result<talos_client::snapshot::Status> {
    if !skip_hash_check {
        return Ok(talos_client::snapshot::verify_file(path)?.status);
    }
    let len = std::fs::metadata(path)
        .with_context(|| format!("--recover-from {}: cannot read", path.display()))?
        .len();
    let db = talos_client::snapshot::bbolt::Db::open(path, len)
        .with_context(|| format!("--recover-from {}: not an etcd database", path.display()))?;
    talos_client::snapshot::status::status(&db)
        .with_context(|| format!("--recover-from {}: not an etcd database", path.display()))
}
