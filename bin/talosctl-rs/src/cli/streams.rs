//! `logs`, `dmesg` and `events`: streams from every target node, merged as
//! they arrive, each line labelled with its node as talosctl labels it
//! (cmd/talosctl/cmd/talos/logs.go, dmesg.go, events.go at v1.13.9). A
//! node that fails is reported on stderr and the others go on; the command
//! then fails. Ctrl-C ends the streams, prints what was received and exits
//! 0, as talosctl does.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::{BoxStream, SelectAll};
use talos_client::client::{ContainerNamespace, Event, EventPayload, EventsRequest, LogsRequest};
use talos_client::{Client, Error};

use super::apply::parse_go_duration;
use super::table::tabwrite;
use super::{Global, Output, Reported, Usage};

#[derive(clap::Args)]
pub struct LogsArgs {
    /// The service (or, with -k, the container) whose log to show.
    pub id: String,
    /// Use the k8s.io containerd namespace.
    #[arg(short = 'k', long)]
    pub kubernetes: bool,
    /// Specify if the logs should be streamed.
    #[arg(short, long)]
    pub follow: bool,
    /// Lines of log file to display (default is to show from the beginning).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub tail: i32,
}

#[derive(clap::Args)]
pub struct DmesgArgs {
    /// Specify if the kernel log should be streamed.
    #[arg(short, long)]
    pub follow: bool,
    /// Specify if only new messages should be sent (makes sense only when
    /// combined with --follow).
    #[arg(long)]
    pub tail: bool,
}

#[derive(clap::Args)]
pub struct EventsArgs {
    /// Show specified number of past events (use -1 to show full history,
    /// default is to show no history).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub tail: i32,
    /// Show events after the specified event ID (default is to show no
    /// history).
    #[arg(long, value_name = "ID")]
    pub since: Option<String>,
    /// Show events for the past duration interval (one second resolution,
    /// default is to show no history).
    #[arg(long, value_parser = parse_go_duration)]
    pub duration: Option<Duration>,
    /// Filter events by the specified actor ID (default is no filter).
    #[arg(long, value_name = "ID")]
    pub actor_id: Option<String>,
}

fn text_only(global: &Global, command: &str) -> anyhow::Result<()> {
    if global.output != Output::Table {
        return Err(Usage(format!(
            "{command} prints the node's text as it comes; -o {:?} is not supported",
            global.output
        ))
        .into());
    }
    Ok(())
}

type Labelled<T> = BoxStream<'static, (String, Result<T, Error>)>;

/// Opens one stream per node with `open`; a node whose stream does not
/// open contributes its error as its only item.
async fn open_all<T, S, F, Fut>(targets: &[(String, Client)], open: F) -> SelectAll<Labelled<T>>
where
    T: Send + 'static,
    S: futures::Stream<Item = Result<T, Error>> + Send + 'static,
    F: Fn(Client) -> Fut,
    Fut: Future<Output = Result<S, Error>>,
{
    let mut all = SelectAll::new();
    for (node, client) in targets {
        let label = node.clone();
        let stream: Labelled<T> = match open(client.clone()).await {
            Ok(stream) => stream.map(move |item| (label.clone(), item)).boxed(),
            Err(e) => futures::stream::iter([(label, Err(e))]).boxed(),
        };
        all.push(stream);
    }
    all
}

/// Drains `streams` into `each` until they end or Ctrl-C; returns how many
/// nodes failed (their errors printed).
async fn drain<T>(mut streams: SelectAll<Labelled<T>>, mut each: impl FnMut(&str, T)) -> usize {
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut failed = 0;
    loop {
        // Ctrl-C's handler is installed when its future is first polled:
        // polled first, it is there before the first line is printed (a
        // stream ready at once could otherwise win every turn, and a
        // Ctrl-C then ended the process by the default action, no exit 0).
        tokio::select! {
            biased;
            _ = &mut interrupted => break,
            item = streams.next() => match item {
                None => break,
                Some((node, Ok(value))) => each(&node, value),
                Some((node, Err(e))) => {
                    failed += 1;
                    eprintln!("error: {node}: {e}");
                }
            },
        }
    }
    failed
}

fn finish(failed: usize, nodes: usize) -> anyhow::Result<()> {
    if failed > 0 {
        anyhow::bail!(Reported(format!("{failed} of {nodes} nodes failed")));
    }
    Ok(())
}

/// Splits each node's bytes into lines and prints them as `NODE: line`,
/// as talosctl's line slicer does; what is left at the end goes out too.
#[derive(Default)]
struct Lines {
    partial: HashMap<String, Vec<u8>>,
}

impl Lines {
    fn push(&mut self, node: &str, bytes: &Bytes) {
        let buffer = self.partial.entry(node.to_string()).or_default();
        buffer.extend_from_slice(bytes);
        let mut out = String::new();
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            out.push_str(&format!(
                "{node}: {}\n",
                String::from_utf8_lossy(&line[..line.len() - 1])
            ));
        }
        if !out.is_empty() {
            out!("{out}");
        }
    }

    fn flush(self) {
        for (node, rest) in self.partial {
            if !rest.is_empty() {
                outln!("{node}: {}", String::from_utf8_lossy(&rest));
            }
        }
    }
}

pub async fn logs(global: &Global, args: LogsArgs) -> anyhow::Result<()> {
    text_only(global, "logs")?;
    let targets = global.targets()?;
    let request = LogsRequest::new(&args.id)
        .with_namespace(if args.kubernetes {
            ContainerNamespace::Kubernetes
        } else {
            ContainerNamespace::System
        })
        .with_follow(args.follow)
        .with_tail_lines(u32::try_from(args.tail).ok());
    let streams = open_all(&targets, |c| {
        let request = request.clone();
        async move { c.logs(&request).await }
    })
    .await;
    let mut lines = Lines::default();
    let failed = drain(streams, |node, bytes| lines.push(node, &bytes)).await;
    lines.flush();
    finish(failed, targets.len())
}

pub async fn dmesg(global: &Global, args: DmesgArgs) -> anyhow::Result<()> {
    text_only(global, "dmesg")?;
    let targets = global.targets()?;
    let streams = open_all(&targets, |c| async move {
        c.dmesg(args.follow, args.tail).await
    })
    .await;
    let mut lines = Lines::default();
    let failed = drain(streams, |node, bytes| lines.push(node, &bytes)).await;
    lines.flush();
    finish(failed, targets.len())
}

pub async fn events(global: &Global, args: EventsArgs) -> anyhow::Result<()> {
    let targets = global.targets()?;
    let mut request = EventsRequest::new().with_tail_events(args.tail);
    if let Some(id) = &args.since {
        request = request.with_since_id(id);
    }
    if let Some(duration) = args.duration {
        request = request.with_duration(duration);
    }
    if let Some(actor) = &args.actor_id {
        request = request.with_actor_id(actor);
    }
    let streams = open_all(&targets, |c| {
        let request = request.clone();
        async move { c.events(&request).await }
    })
    .await;
    let output = global.output;
    // talosctl's header goes out with the first event it prints (its
    // tabwriter is flushed after each event, and not before).
    let mut header = Some("NODE\tID\tEVENT\tACTOR\tSOURCE\tMESSAGE".to_string());
    let failed = drain(streams, |_, event: Event| match output {
        Output::Table => {
            if let Some(lines) = event_lines(&event) {
                let block: Vec<String> = header.take().into_iter().chain(lines).collect();
                out!("{}", tabwrite(&block));
            }
        }
        _ => {
            if !matches!(event.payload, EventPayload::Other) {
                outln!("{}", serde_json::to_string(&event).unwrap_or_default());
            }
        }
    })
    .await;
    finish(failed, targets.len())
}

/// talosctl's two lines for an event: node, id and type; actor, source and
/// message. None for an event talosctl skips (types it does not know, the
/// stream's first, empty event).
fn event_lines(event: &Event) -> Option<Vec<String>> {
    let (source, message) = match &event.payload {
        EventPayload::Sequence {
            sequence,
            action,
            error,
        } => (
            sequence.clone(),
            match error {
                Some(e) => format!("error: {e}"),
                None => action.clone(),
            },
        ),
        EventPayload::Phase { phase, action } => (phase.clone(), action.clone()),
        EventPayload::Task { task, action } => (task.clone(), action.clone()),
        EventPayload::ServiceState {
            service,
            action,
            message,
        } => (service.clone(), format!("{action}: {message}")),
        EventPayload::MachineStatus {
            stage,
            ready,
            unmet_conditions,
        } => (
            stage.clone(),
            format!(
                "ready: {ready}, unmet conditions: [{}]",
                unmet_conditions.join(" ")
            ),
        ),
        _ => return None,
    };
    Some(vec![
        format!("{}\t{}\t{}", event.node, event.id, event.type_url),
        format!("{}\t{source}\t{message}", event.actor_id),
    ])
}
