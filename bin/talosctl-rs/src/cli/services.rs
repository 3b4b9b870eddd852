//! `service`, `containers` and `image`, with talosctl's arguments, columns
//! and messages (cmd/talosctl/cmd/talos/service.go, containers.go,
//! image.go; pkg/machinery/formatters at v1.13.9).

use std::time::Duration;

use clap::Subcommand;
use talos_client::client::{
    ContainerInfo, ContainerNamespace, ImageInfo, ImageNamespace, ServiceAction, ServiceInfo,
};

use super::table::{Table, tabwrite};
use super::{Global, NodeOutput, Output, Usage, each_target, print_nodes, print_structured};

#[derive(clap::Args)]
pub struct ServiceArgs {
    /// The service; without it, every service is listed.
    pub id: Option<String>,
    /// What to do: status (the default), start, stop or restart.
    pub action: Option<String>,
}

#[derive(clap::Args)]
pub struct ContainersArgs {
    /// Use the k8s.io containerd namespace.
    #[arg(short = 'k', long)]
    pub kubernetes: bool,
}

#[derive(clap::Args)]
pub struct ImageArgs {
    /// Namespace to use: "system" (etcd and kubelet images), "cri" for all
    /// Kubernetes workloads, "inmem" for in-memory containerd instance.
    #[arg(long, global = true, default_value = "cri", value_parser = parse_namespace)]
    pub namespace: ImageNamespace,
    #[command(subcommand)]
    pub command: ImageCommand,
}

#[derive(Subcommand)]
pub enum ImageCommand {
    /// List images in the machine's container runtime.
    #[command(visible_aliases = ["l", "ls"])]
    List,
    /// Pull an image into the machine's container runtime.
    #[command(visible_alias = "p")]
    Pull {
        /// The image reference.
        image: String,
    },
}

fn parse_namespace(value: &str) -> Result<ImageNamespace, String> {
    match value {
        "system" => Ok(ImageNamespace::System),
        "cri" => Ok(ImageNamespace::Cri),
        "inmem" => Ok(ImageNamespace::InMemory),
        other => Err(format!("unsupported namespace {other:?}")),
    }
}

/// A whole-second duration as Go prints it (`1m5s`, `0s`).
pub fn go_seconds(d: Duration) -> String {
    let s = d.as_secs() + u64::from(d.subsec_millis() >= 500);
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec}s"),
        (h, m, sec) => format!("{h}h{m}m{sec}s"),
    }
}

fn since(ts: Option<time::OffsetDateTime>) -> String {
    let elapsed = ts
        .map(|t| time::OffsetDateTime::now_utc() - t)
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default();
    go_seconds(elapsed)
}

fn health(s: &ServiceInfo) -> &'static str {
    if s.health.unknown {
        "?"
    } else if s.health.healthy {
        "OK"
    } else {
        "Fail"
    }
}

pub async fn service(global: &Global, args: ServiceArgs) -> anyhow::Result<()> {
    let action = match args.action.as_deref() {
        None | Some("status") => None,
        Some("start") => Some(ServiceAction::Start),
        Some("stop") => Some(ServiceAction::Stop),
        Some("restart") => Some(ServiceAction::Restart),
        Some(other) => return Err(Usage(format!("unsupported service action: {other:?}")).into()),
    };
    let client = global.connect_many()?;
    let output = global.output;
    let Some(id) = args.id else {
        let replies = client.service_list().await?;
        return print_nodes(output, replies, |rows| {
            list_table(rows).print();
            Ok(())
        });
    };
    let Some(action) = action else {
        let replies = client.service_list().await?;
        return service_info(output, replies, &id);
    };
    let replies = client.service_action(&id, action).await?;
    print_nodes(output, replies, |rows| {
        let mut table = Table::new(&["NODE", "RESPONSE"]);
        for (node, resp) in rows {
            table.row(vec![node.clone(), resp.to_string()]);
        }
        table.print();
        Ok(())
    })
}

fn list_table(rows: &[(String, &Vec<ServiceInfo>)]) -> Table {
    let mut table = Table::new(&[
        "NODE",
        "SERVICE",
        "STATE",
        "HEALTH",
        "LAST CHANGE",
        "LAST EVENT",
    ]);
    for (node, services) in rows {
        for s in services.iter() {
            let last = s.events.last();
            table.row(vec![
                node.clone(),
                s.id.clone(),
                s.state.clone(),
                health(s).into(),
                format!("{} ago", last.map(|e| since(e.ts)).unwrap_or_default()),
                last.map_or("<none>".into(), |e| e.msg.clone()),
            ]);
        }
    }
    table
}

/// One service on every node, as talosctl's RenderServicesInfo shows it.
fn service_info(
    output: Output,
    replies: talos_client::NodeResults<Vec<ServiceInfo>>,
    id: &str,
) -> anyhow::Result<()> {
    let replies: talos_client::NodeResults<ServiceInfo> = replies
        .into_iter()
        .filter_map(|r| match r.result {
            Ok(services) => services
                .into_iter()
                .find(|s| s.id == id)
                .map(|s| talos_client::NodeResult::new(r.node, Ok(s))),
            Err(e) => Some(talos_client::NodeResult::new(r.node, Err(e))),
        })
        .collect();
    if !replies.iter().any(|r| r.result.is_ok()) && replies.iter().all(|r| r.result.is_ok()) {
        anyhow::bail!("service {id:?} is not registered on any nodes");
    }
    print_nodes(output, replies, |rows| {
        out!("{}", info_text(rows));
        Ok(())
    })
}

/// talosctl's RenderServicesInfo: a block of label and value per service,
/// its events newest first.
fn info_text(rows: &[(String, &ServiceInfo)]) -> String {
    let mut lines = Vec::new();
    for (node, s) in rows {
        lines.push(format!("NODE\t{node}"));
        lines.push(format!("ID\t{}", s.id));
        lines.push(format!("STATE\t{}", s.state));
        lines.push(format!("HEALTH\t{}", health(s)));
        if !s.health.last_message.is_empty() {
            lines.push(format!("LAST HEALTH MESSAGE\t{}", s.health.last_message));
        }
        let mut label = "EVENTS";
        for e in s.events.iter().rev() {
            lines.push(format!(
                "{label}\t[{}]: {} ({} ago)",
                e.state,
                e.msg,
                since(e.ts)
            ));
            label = "";
        }
    }
    tabwrite(&lines)
}

pub async fn containers(global: &Global, args: ContainersArgs) -> anyhow::Result<()> {
    let namespace = if args.kubernetes {
        ContainerNamespace::Kubernetes
    } else {
        ContainerNamespace::System
    };
    let replies = global.connect_many()?.containers(namespace).await?;
    print_nodes(global.output, replies, |rows| {
        let mut table = Table::new(&["NODE", "NAMESPACE", "ID", "IMAGE", "PID", "STATUS"]);
        for (node, containers) in rows {
            let mut sorted: Vec<&ContainerInfo> = containers.iter().collect();
            sorted.sort_by(|a, b| a.id.cmp(&b.id));
            for c in sorted {
                let id = if c.in_pod() {
                    format!("└─ {}", c.id)
                } else {
                    c.id.clone()
                };
                table.row(vec![
                    node.clone(),
                    c.namespace.clone(),
                    id,
                    c.image.clone(),
                    c.pid.to_string(),
                    c.status.clone(),
                ]);
            }
        }
        // talosctl prints the header even with no containers.
        out!("{}", table.render());
        Ok(())
    })
}

pub async fn image(global: &Global, args: ImageArgs) -> anyhow::Result<()> {
    let targets = global.targets()?;
    let namespace = args.namespace;
    match args.command {
        ImageCommand::List => {
            let replies =
                each_target(&targets, |c| async move { c.image_list(namespace).await }).await;
            print_nodes(global.output, replies, |rows| {
                image_table(rows).print();
                Ok(())
            })
        }
        ImageCommand::Pull { image } => {
            let replies = each_target(&targets, |c| {
                let image = image.clone();
                async move { c.pull_image(&image, namespace).await }
            })
            .await;
            pulled(global.output, replies)
        }
    }
}

fn pulled(output: Output, replies: talos_client::NodeResults<String>) -> anyhow::Result<()> {
    if output != Output::Table {
        let out: Vec<NodeOutput<&String>> = replies
            .iter()
            .map(|r| NodeOutput {
                node: r.node.clone(),
                result: r.result.as_ref().ok(),
                error: r.result.as_ref().err().map(super::ErrorOutput::of),
            })
            .collect();
        return print_structured(output, &out);
    }
    print_nodes(output, replies, |rows| {
        for (node, name) in rows {
            outln!("{node}: pulled image {name}");
        }
        Ok(())
    })
}

fn image_table(rows: &[(String, &Vec<ImageInfo>)]) -> Table {
    let mut table = Table::new(&["NODE", "IMAGE", "DIGEST", "SIZE", "LABELS", "CREATED"]);
    for (node, images) in rows {
        for i in images.iter() {
            // Go's time.RFC3339: whole seconds, UTC as Z.
            let created = i
                .created
                .and_then(|t| {
                    t.to_offset(time::UtcOffset::UTC)
                        .format(time::macros::format_description!(
                            "[year]-[month]-[day]T[hour]:[minute]:[second]Z"
                        ))
                        .ok()
                })
                .unwrap_or_default();
            table.row(vec![
                node.clone(),
                i.name.clone(),
                i.digest.clone(),
                super::etcd::human_bytes(i.size.max(0) as u64),
                i.labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(","),
                created,
            ]);
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::{go_seconds, info_text, list_table};
    use std::time::Duration;
    use talos_client::api::machine;
    use talos_client::client::ServiceInfo;

    fn service(id: &str, healthy: bool, message: &str, events: &[(&str, &str)]) -> ServiceInfo {
        ServiceInfo::from(machine::ServiceInfo {
            id: id.into(),
            state: "Running".into(),
            events: Some(machine::ServiceEvents {
                events: events
                    .iter()
                    .map(|(msg, state)| machine::ServiceEvent {
                        msg: (*msg).into(),
                        state: (*state).into(),
                        ts: None,
                    })
                    .collect(),
            }),
            health: Some(machine::ServiceHealth {
                unknown: false,
                healthy,
                last_message: message.into(),
                last_change: None,
            }),
        })
    }

    /// The service list and one service's details as talosctl 1.13.9
    /// prints them (`talosctl service`, `talosctl service etcd`).
    #[test]
    fn services_render_as_talosctl_renders_them() {
        let etcd = service(
            "etcd",
            false,
            "context deadline exceeded",
            &[
                ("Starting service", "Preparing"),
                ("Health check failed: context deadline exceeded", "Running"),
            ],
        );
        let apid = service("apid", true, "", &[]);
        let list = vec![apid.clone(), etcd.clone()];
        assert_eq!(
            list_table(&[("10.0.0.2".to_string(), &list)]).render(),
            "NODE       SERVICE   STATE     HEALTH   LAST CHANGE   LAST EVENT\n\
             10.0.0.2   apid      Running   OK        ago          <none>\n\
             10.0.0.2   etcd      Running   Fail     0s ago        Health check failed: context deadline exceeded\n"
        );
        assert_eq!(
            info_text(&[("10.0.0.2".to_string(), &etcd)]),
            "NODE                  10.0.0.2\n\
             ID                    etcd\n\
             STATE                 Running\n\
             HEALTH                Fail\n\
             LAST HEALTH MESSAGE   context deadline exceeded\n\
             EVENTS                [Running]: Health check failed: context deadline exceeded (0s ago)\n                      \
             [Preparing]: Starting service (0s ago)\n"
        );
    }

    #[test]
    fn durations_print_as_go_rounds_them() {
        assert_eq!(go_seconds(Duration::from_millis(400)), "0s");
        assert_eq!(go_seconds(Duration::from_millis(24_600)), "25s");
        assert_eq!(go_seconds(Duration::from_secs(65)), "1m5s");
        assert_eq!(go_seconds(Duration::from_secs(3600 + 2)), "1h0m2s");
    }
}
