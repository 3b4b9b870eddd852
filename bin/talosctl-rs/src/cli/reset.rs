//! `talosctl-rs reset`, with talosctl's flags and defaults, plus a quorum
//! guard: a non-graceful reset of a voting etcd member is refused unless
//! `--force`.

use std::time::{Duration, Instant};

use anyhow::bail;
use talos_client::Client;
use talos_client::client::{ResetRequest, WipeMode};

use super::apply::parse_go_duration;
use super::{Global, Output, print_nodes};

#[derive(clap::Args)]
pub struct ResetArgs {
    /// If true, attempt to cordon/drain node and leave etcd (if applicable).
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub graceful: bool,
    /// If true, reboot the node after resetting instead of shutting down.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub reboot: bool,
    /// If set, just wipe selected system disk partitions by label but keep
    /// other partitions intact.
    #[arg(long, value_delimiter = ',', value_name = "LABEL")]
    pub system_labels_to_wipe: Vec<String>,
    /// If set, wipes defined devices in the list.
    #[arg(long, value_delimiter = ',', value_name = "DISK")]
    pub user_disks_to_wipe: Vec<String>,
    /// Disk reset mode: all, system-disk, user-disks.
    #[arg(long, default_value = "all", value_parser = parse_wipe_mode)]
    pub wipe_mode: WipeMode,
    /// Wait for the reset to finish (the node powers off, or comes back when
    /// rebooting).
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub wait: bool,
    /// How long to wait.
    #[arg(long, default_value = "30m", value_parser = parse_go_duration)]
    pub timeout: Duration,
    /// Reset even a voting etcd member without leaving etcd first.
    #[arg(long)]
    pub force: bool,
}

fn parse_wipe_mode(value: &str) -> Result<WipeMode, String> {
    value
        .parse()
        .map_err(|e: talos_client::client::UnknownVariant| e.to_string())
}

/// Waits until the node stops answering, then (when rebooting) until it
/// answers again.
async fn wait_for_node(
    client: &Client,
    node: &str,
    reboot: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    let target = client.node(node);
    let deadline = Instant::now() + timeout;
    let answers = || async { target.version().await.is_ok() };
    while answers().await {
        if Instant::now() > deadline {
            bail!("{node} still answers after {}s", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if reboot {
        while !answers().await {
            if Instant::now() > deadline {
                bail!("{node} did not come back within {}s", timeout.as_secs());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(())
}

pub async fn run(global: &Global, args: ResetArgs) -> anyhow::Result<()> {
    let (client, mut nodes) = global.connect()?;
    if nodes.is_empty() {
        nodes.push(talos_client::config::normalize_endpoint(&global.resolve()?.endpoints[0])?.host);
    }
    if !args.graceful && !args.force {
        for node in &nodes {
            talos_client::ops::check_plain_reset(&client, node).await?;
        }
    }
    let request = ResetRequest::default()
        .with_graceful(args.graceful)
        .with_reboot(args.reboot)
        .with_system_labels_to_wipe(args.system_labels_to_wipe.clone())
        .with_user_disks_to_wipe(args.user_disks_to_wipe.clone())
        .with_mode(args.wipe_mode);
    let replies = client.nodes(nodes.clone()).reset(request).await?;
    let accepted: Vec<String> = replies
        .iter()
        .filter(|r| r.result.is_ok())
        .map(|r| r.node.clone())
        .collect();
    let output = global.output;
    let printed = print_nodes(output, replies, |rows| {
        for (node, actor) in rows {
            eprintln!("{node}: reset accepted (actor id {actor})");
        }
        Ok(())
    });
    if args.wait {
        for node in &accepted {
            if output == Output::Table {
                eprintln!(
                    "{node}: waiting for the node to {}",
                    if args.reboot { "reboot" } else { "power off" }
                );
            }
            wait_for_node(&client, node, args.reboot, args.timeout).await?;
            if output == Output::Table {
                eprintln!("{node}: done");
            }
        }
    }
    printed
}
