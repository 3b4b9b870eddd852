//! `talosctl-rs health`: the server-side cluster health check
//! (cluster.ClusterService/HealthCheck), its progress lines streamed as
//! they come; exit 1 when a check fails or the wait runs out.

use std::time::Duration;

use futures::StreamExt as _;
use talos_client::client::HealthCheckRequest;

use super::apply::parse_go_duration;
use super::{Global, Output, print_structured};

#[derive(clap::Args)]
pub struct HealthArgs {
    /// How long the server waits for the cluster to become healthy.
    #[arg(long, default_value = "20m", value_parser = parse_go_duration)]
    pub wait_timeout: Duration,
    /// The control-plane nodes to expect (default: discovered).
    #[arg(long, value_delimiter = ',')]
    pub control_plane_nodes: Vec<String>,
    /// The worker nodes to expect (default: discovered).
    #[arg(long, value_delimiter = ',')]
    pub worker_nodes: Vec<String>,
    /// Deprecated by talosctl; counted as a control-plane node.
    #[arg(long)]
    pub init_node: Option<String>,
    /// The Kubernetes API endpoint to check instead of the discovered one.
    #[arg(long, default_value = "")]
    pub k8s_endpoint: String,
}

pub async fn run(global: &Global, args: HealthArgs) -> anyhow::Result<()> {
    let (client, node) = global.connect_one("health")?;
    let mut control_plane = args.control_plane_nodes;
    if let Some(init) = args.init_node
        && !control_plane.contains(&init)
    {
        control_plane.insert(0, init);
    }
    let request = HealthCheckRequest::new(args.wait_timeout)
        .with_control_plane_nodes(control_plane)
        .with_worker_nodes(args.worker_nodes)
        .with_force_endpoint(args.k8s_endpoint);
    let mut lines = Vec::new();
    let mut stream = client.health_check(request).await?;
    let mut failure = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(line) => {
                if global.output == Output::Table {
                    outln!("{line}");
                }
                lines.push(line);
            }
            Err(error) => {
                failure = Some(error);
                break;
            }
        }
    }
    if global.output != Output::Table {
        print_structured(
            global.output,
            &serde_json::json!({
                "node": node,
                "healthy": failure.is_none(),
                "messages": lines,
                "error": failure.as_ref().map(ToString::to_string),
            }),
        )?;
    }
    match failure {
        None => Ok(()),
        Some(error) => Err(anyhow::Error::new(error).context("cluster health check failed")),
    }
}
