//! `talosctl-rs health`: the server-side cluster health check
//! (cluster.ClusterService/HealthCheck), its progress lines streamed as
//! they come, then the Kubernetes checks talosctl also makes
//! (pkg/cluster/check: the control plane's API servers ready, every
//! registered node ready), from this host with the admin kubeconfig the
//! node serves (kept in memory); exit 1 when a check fails or the wait
//! runs out.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use talos_client::client::HealthCheckRequest;
use talos_client::kube::{KubeClient, KubeConfig, KubeError};
use talos_client::{Client, One};

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
    let started = Instant::now();
    let request = HealthCheckRequest::new(args.wait_timeout)
        .with_control_plane_nodes(control_plane.clone())
        .with_worker_nodes(args.worker_nodes)
        .with_force_endpoint(args.k8s_endpoint.clone());
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
                failure = Some(anyhow::Error::new(error).context("cluster health check failed"));
                break;
            }
        }
    }
    if failure.is_none() {
        let wait = args.wait_timeout.saturating_sub(started.elapsed());
        let mut say = |line: String| {
            if global.output == Output::Table {
                outln!("{line}");
            }
            lines.push(line);
        };
        if let Err(reason) =
            kubernetes(&client, &control_plane, &args.k8s_endpoint, wait, &mut say).await
        {
            failure = Some(anyhow::anyhow!("Kubernetes health check failed: {reason}"));
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
        Some(error) => Err(error),
    }
}

/// How often a Kubernetes check looks again.
const POLL: Duration = Duration::from_millis(500);

/// The Kubernetes checks: each control-plane node's API server (or
/// `endpoint`) ready, then every node the API lists ready, each waited for
/// until `wait` runs out. A node that serves no kubeconfig, or an API
/// server that refuses connections (no Kubernetes there), is reported and
/// skipped.
async fn kubernetes(
    client: &Client<One>,
    control_plane: &[String],
    endpoint: &str,
    wait: Duration,
    say: &mut impl FnMut(String),
) -> Result<(), String> {
    let admin = match client.kubeconfig().await {
        Ok(yaml) => KubeConfig::from_yaml(&yaml).map_err(|e| e.to_string())?,
        Err(e) => {
            say(format!(
                "kubernetes checks skipped: no admin kubeconfig ({e})"
            ));
            return Ok(());
        }
    };
    let servers: Vec<String> = if !endpoint.is_empty() {
        // talosctl takes a host here and adds the port; a URL is taken as
        // it is.
        vec![if endpoint.contains("://") {
            endpoint.trim_end_matches('/').to_string()
        } else {
            api_server_url(endpoint)
        }]
    } else {
        let hosts = if control_plane.is_empty() {
            member_hosts(client).await?
        } else {
            control_plane.to_vec()
        };
        hosts.iter().map(|h| api_server_url(h)).collect()
    };
    let until = Instant::now() + wait;
    let mut ready = None;
    for server in &servers {
        let kube = KubeClient::new(&admin.clone().with_server(server.clone()))
            .map_err(|e| e.to_string())?
            .with_timeout(Duration::from_secs(5));
        let mut answered = false;
        loop {
            match kube.readyz().await {
                Ok(r) if r.is_ready() => {
                    say(format!(
                        "waiting for kube-apiserver {server} to be ready: OK"
                    ));
                    ready.get_or_insert(kube);
                    break;
                }
                // Nothing listens there: no Kubernetes on that node.
                Err(e @ KubeError::Refused { .. }) if !answered => {
                    say(format!("kube-apiserver {e}: skipped"));
                    break;
                }
                outcome => {
                    answered = true;
                    if Instant::now() >= until {
                        return Err(match outcome {
                            Ok(r) => format!(
                                "kube-apiserver {server} is not ready: {}",
                                r.body.replace('\n', "; ")
                            ),
                            Err(e) => format!("kube-apiserver {server}: {e}"),
                        });
                    }
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    }
    let Some(kube) = ready else {
        return Ok(());
    };
    loop {
        let nodes = kube.nodes().await.map_err(|e| e.to_string())?;
        let waiting: Vec<&str> = nodes
            .iter()
            .filter(|n| !n.ready)
            .map(|n| n.name.as_str())
            .collect();
        if nodes.is_empty() {
            say("waiting for all k8s nodes to report ready: none registered".into());
            return Ok(());
        }
        if waiting.is_empty() {
            say(format!(
                "waiting for all k8s nodes to report ready: OK ({} nodes)",
                nodes.len()
            ));
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(format!("k8s nodes not ready: {}", waiting.join(", ")));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The hosts of the etcd members' peer URLs: the control plane.
async fn member_hosts(client: &Client<One>) -> Result<Vec<String>, String> {
    let members = client
        .etcd_member_list(false)
        .await
        .map_err(|e| format!("the control-plane nodes cannot be discovered: {e}"))?;
    Ok(members
        .iter()
        .filter_map(|m| m.peer_urls.first())
        .filter_map(|url| url_host(url))
        .collect())
}

/// The host of `scheme://host:port`, without an IPv6 address's brackets.
fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next()?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']')?.0,
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    (!host.is_empty()).then(|| host.to_string())
}

/// `https://HOST:6443` (`HOST:PORT` keeps its port).
fn api_server_url(host: &str) -> String {
    if host.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("https://[{host}]:6443")
    } else if host.contains(':') {
        format!("https://{host}")
    } else {
        format!("https://{host}:6443")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_peer_urls() {
        assert_eq!(
            url_host("https://10.0.0.2:2380").as_deref(),
            Some("10.0.0.2")
        );
        assert_eq!(
            url_host("http://[fd00::2]:2380").as_deref(),
            Some("fd00::2")
        );
        assert_eq!(url_host("https://cp-1").as_deref(), Some("cp-1"));
        assert_eq!(url_host("https://:2380"), None);
        assert_eq!(api_server_url("fd00::2"), "https://[fd00::2]:6443");
        assert_eq!(api_server_url("10.0.0.2"), "https://10.0.0.2:6443");
        assert_eq!(api_server_url("k8s.example:443"), "https://k8s.example:443");
    }
}
