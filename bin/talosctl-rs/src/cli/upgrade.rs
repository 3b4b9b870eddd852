//! `talosctl-rs upgrade`: talosctl 1.13.9's upgrade (cmd/talosctl/cmd/talos/
//! upgrade.go upstream). On nodes that all run a version in
//! `>1.13.0-alpha.2 <2.0.0` it pulls the image (ImageService.Pull),
//! installs it (LifecycleService.Upgrade) and reboots the nodes; otherwise,
//! or with `--legacy`, it sends the legacy MachineService.Upgrade, which
//! reboots by itself. With `--wait` it follows each node through its reboot
//! until it answers from a new boot (its boot id, read from the node, has
//! changed) and reports the version it runs then.

use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use futures::StreamExt as _;
use serde::Serialize;
use talos_client::client::{
    ImageNamespace, InstallProgress, PullProgress, RebootMode, TalosVersion, UpgradePath,
    UpgradeRequest, upgrade_path,
};
use talos_client::{Client, Many};

use super::apply::parse_go_duration;
use super::table::Table;
use super::{Global, Output, Reported, print_structured};

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

#[derive(clap::Args)]
pub struct UpgradeArgs {
    /// The container image to use for performing the install.
    #[arg(short, long, value_name = "REF")]
    pub image: String,
    /// Stage the upgrade to perform it after a reboot (legacy upgrade only,
    /// as in talosctl).
    #[arg(short, long)]
    pub stage: bool,
    /// Force the upgrade, skipping the node's checks on etcd health and
    /// members (legacy upgrade only, as in talosctl).
    #[arg(short, long)]
    pub force: bool,
    /// Use the legacy MachineService.Upgrade whatever the nodes run.
    #[arg(long)]
    pub legacy: bool,
    /// Reboot mode: default (kexec when possible) or powercycle.
    #[arg(short = 'm', long, default_value = "default", value_parser = parse_reboot_mode)]
    pub reboot_mode: RebootMode,
    /// Containerd namespace to pull into: system, cri or inmem.
    #[arg(long, default_value = "system", value_parser = parse_namespace)]
    pub namespace: ImageNamespace,
    /// Wait for the nodes to come back from their reboot.
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub wait: bool,
    /// How long to wait.
    #[arg(long, default_value = "30m", value_parser = parse_go_duration)]
    pub timeout: Duration,
}

fn parse_reboot_mode(value: &str) -> Result<RebootMode, String> {
    match value.to_ascii_lowercase().as_str() {
        "default" => Ok(RebootMode::Default),
        "powercycle" => Ok(RebootMode::Powercycle),
        other => Err(format!(
            "unknown reboot mode {other:?} (expected default or powercycle)"
        )),
    }
}

fn parse_namespace(value: &str) -> Result<ImageNamespace, String> {
    match value {
        "system" => Ok(ImageNamespace::System),
        "cri" => Ok(ImageNamespace::Cri),
        "inmem" => Ok(ImageNamespace::InMemory),
        other => Err(format!(
            "unsupported namespace {other:?} (expected system, cri or inmem)"
        )),
    }
}

/// What happened on one node, as printed with `-o json`.
#[derive(Serialize)]
struct NodeUpgrade {
    node: String,
    path: UpgradePath,
    /// The legacy call's actor id, or the reboot's.
    actor_id: String,
    /// Boot ids before and (with `--wait`) after.
    #[serde(skip_serializing_if = "Option::is_none")]
    boot_id_before: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    boot_id: Option<String>,
    /// The version the node runs once back (with `--wait`).
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

pub async fn run(global: &Global, args: UpgradeArgs) -> anyhow::Result<()> {
    let (client, mut nodes) = global.connect()?;
    if nodes.is_empty() {
        nodes.push(talos_client::config::normalize_endpoint(&global.resolve()?.endpoints[0])?.host);
    }
    let many = client.nodes(nodes.clone());
    let table = global.output == Output::Table;
    let path = if args.legacy {
        UpgradePath::Legacy
    } else {
        choose_path(&many).await?
    };
    if path == UpgradePath::Legacy && !args.legacy && table {
        eprintln!("New upgrade API is not available, falling back to legacy");
    }
    if path == UpgradePath::Lifecycle && (args.stage || args.force) && table {
        eprintln!("warning: --stage and --force apply to the legacy upgrade only; ignored");
    }
    let mut results = Vec::new();
    for node in &nodes {
        let boot_id_before = if args.wait {
            Some(
                boot_id(&client, node)
                    .await
                    .with_context(|| format!("node {node}: reading its boot id"))?,
            )
        } else {
            None
        };
        results.push(NodeUpgrade {
            node: node.clone(),
            path,
            actor_id: String::new(),
            boot_id_before,
            boot_id: None,
            version: None,
            error: None,
        });
    }
    match path {
        UpgradePath::Legacy => legacy(&many, &args, &mut results).await?,
        UpgradePath::Lifecycle => lifecycle(&client, &args, table, &mut results).await?,
    }
    if args.wait {
        let target = image_version(&args.image);
        for result in results.iter_mut().filter(|r| r.error.is_none()) {
            if table {
                eprintln!("{}: waiting for the node to reboot", result.node);
            }
            match wait_back(&client, result, args.timeout).await {
                Ok(()) => check_version(result, target.as_ref()),
                Err(e) => result.error = Some(e.to_string()),
            }
        }
    }
    print(global.output, &results, args.wait)
}

/// The path talosctl 1.13.9 takes for these nodes, from their versions.
async fn choose_path(many: &Client<Many>) -> anyhow::Result<UpgradePath> {
    let replies = many.version().await?;
    let mut versions = Vec::new();
    for reply in &replies {
        match &reply.result {
            Ok(v) => versions.push((reply.node.as_str(), v.tag.as_str())),
            Err(e) => bail!("error checking Talos version compatibility: {e}"),
        }
    }
    Ok(upgrade_path(versions)?)
}

async fn legacy(
    many: &Client<Many>,
    args: &UpgradeArgs,
    results: &mut [NodeUpgrade],
) -> anyhow::Result<()> {
    let request = UpgradeRequest::new(&args.image)
        .with_stage(args.stage)
        .with_force(args.force)
        .with_powercycle(args.reboot_mode == RebootMode::Powercycle);
    let replies = many.upgrade_legacy(&request).await?;
    for (reply, result) in replies.into_iter().zip(results.iter_mut()) {
        match reply.result {
            Ok(ack) => result.actor_id = ack.actor_id,
            Err(e) => result.error = Some(format!("error performing upgrade: {e}")),
        }
    }
    Ok(())
}

/// Pulls and installs on every node, then reboots those that installed.
async fn lifecycle(
    client: &Client,
    args: &UpgradeArgs,
    table: bool,
    results: &mut [NodeUpgrade],
) -> anyhow::Result<()> {
    for result in results.iter_mut() {
        if let Err(e) = install(client, &result.node, args, table).await {
            result.error = Some(e.to_string());
        }
    }
    let installed: Vec<String> = results
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| r.node.clone())
        .collect();
    if installed.is_empty() {
        return Ok(());
    }
    let replies = client
        .nodes(installed)
        .reboot(args.reboot_mode)
        .await
        .context("error during upgrade")?;
    for reply in replies {
        let Some(result) = results.iter_mut().find(|r| r.node == reply.node) else {
            continue;
        };
        match reply.result {
            Ok(actor) => result.actor_id = actor,
            Err(e) => result.error = Some(format!("error executing reboot: {e}")),
        }
    }
    Ok(())
}

/// ImageService.Pull then LifecycleService.Upgrade on one node.
async fn install(
    client: &Client,
    node: &str,
    args: &UpgradeArgs,
    table: bool,
) -> anyhow::Result<()> {
    let target = client.node(node);
    let mut pull = target
        .image_pull(&args.image, args.namespace)
        .await
        .context("error pulling upgrade image")?;
    let mut name = None;
    while let Some(item) = pull.next().await {
        match item.context("error pulling upgrade image")? {
            PullProgress::Done { name: n } => name = Some(n),
            PullProgress::Layer {
                layer_id, status, ..
            } if table => eprintln!("{node}: {layer_id}: {status}"),
            _ => {}
        }
    }
    let name =
        name.ok_or_else(|| anyhow!("node {node}: the image pull ended without the image's name"))?;
    let mut progress = target
        .lifecycle_upgrade(&name, args.namespace)
        .await
        .context("error during upgrade")?;
    let mut exit_code = None;
    while let Some(item) = progress.next().await {
        match item.context("error during upgrade")? {
            InstallProgress::Message(line) if table => eprintln!("{node}: {line}"),
            InstallProgress::ExitCode(code) => exit_code = Some(code),
            _ => {}
        }
    }
    match exit_code {
        Some(0) => {
            if table {
                eprintln!("{node}: upgrade completed");
            }
            Ok(())
        }
        Some(code) => bail!("node {node}: upgrade failed with exit code {code}"),
        None => bail!("node {node}: the upgrade ended without an exit code"),
    }
}

/// The node's boot id, read from the node.
async fn boot_id(client: &Client, node: &str) -> Result<String, talos_client::Error> {
    let mut stream = client.node(node).read(BOOT_ID).await?;
    let mut text = Vec::new();
    while let Some(chunk) = stream.next().await {
        text.extend_from_slice(&chunk?);
    }
    Ok(String::from_utf8_lossy(&text).trim().to_string())
}

/// Waits until the node answers from a boot other than the one before the
/// upgrade, then records the boot id and the version it runs.
async fn wait_back(
    client: &Client,
    result: &mut NodeUpgrade,
    timeout: Duration,
) -> anyhow::Result<()> {
    let node = result.node.clone();
    let before = result.boot_id_before.clone().unwrap_or_default();
    let deadline = Instant::now() + timeout;
    loop {
        let last = match boot_id(client, &node).await {
            Ok(now) if now != before => match client.node(node.as_str()).version().await {
                Ok(version) => {
                    result.boot_id = Some(now);
                    result.version = Some(version.tag);
                    return Ok(());
                }
                Err(e) => e.to_string(),
            },
            Ok(_) => "it kept its boot id".to_string(),
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            bail!(
                "node {node}: not back from a new boot within {} (last: {last})",
                humanize(timeout)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The version an installer image's tag names, if it names one.
fn image_version(image: &str) -> Option<TalosVersion> {
    let name = image.rsplit('/').next()?;
    let tag = name.split_once(':')?.1.split('@').next()?;
    tag.parse().ok()
}

/// A node back on another version than the image's tag did not upgrade
/// (its boot loader fell back, say): that is an error, not a success.
fn check_version(result: &mut NodeUpgrade, target: Option<&TalosVersion>) {
    let (Some(target), Some(running)) = (target, result.version.as_deref()) else {
        return;
    };
    if running.parse::<TalosVersion>().ok().as_ref() != Some(target) {
        result.error = Some(format!(
            "node {}: back from its reboot on {running}, not v{target}: the upgrade did not take",
            result.node
        ));
    }
}

fn humanize(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

fn print(output: Output, results: &[NodeUpgrade], waited: bool) -> anyhow::Result<()> {
    if output == Output::Table {
        let mut table = if waited {
            Table::new(&["NODE", "VERSION", "BOOT ID"])
        } else {
            Table::new(&["NODE", "PATH", "ACTOR ID"])
        };
        for r in results.iter().filter(|r| r.error.is_none()) {
            let path = match r.path {
                UpgradePath::Lifecycle => "lifecycle",
                UpgradePath::Legacy => "legacy",
            };
            table.row(if waited {
                vec![
                    r.node.clone(),
                    r.version.clone().unwrap_or_default(),
                    r.boot_id.clone().unwrap_or_default(),
                ]
            } else {
                vec![r.node.clone(), path.to_string(), r.actor_id.clone()]
            });
        }
        table.print();
        for r in results {
            match &r.error {
                Some(e) if e.contains(&r.node) => eprintln!("error: {e}"),
                Some(e) => eprintln!("error: node {}: {e}", r.node),
                None => {}
            }
        }
    } else {
        print_structured(output, &results)?;
    }
    let failed = results.iter().filter(|r| r.error.is_some()).count();
    if failed > 0 {
        bail!(Reported(format!(
            "{failed} of {} nodes failed to upgrade",
            results.len()
        )));
    }
    Ok(())
}
