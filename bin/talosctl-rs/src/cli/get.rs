//! `get TYPE [ID]`: COSI resources, as talosctl prints them
//! (cmd/talosctl/cmd/talos/get.go and its output package, v1.13.9): the
//! type is resolved by name or alias against the first node's resource
//! definitions, then read on every node in turn; `--watch` streams changes.

use anyhow::Context as _;
use futures::StreamExt as _;
use serde_json::{Map, Value, json};
use talos_client::client::resources::{EventKind, Resource, ResourceDefinition};
use talos_client::{Client, Target};

use super::table::Table;
use super::{Global, Output, Reported};

#[derive(clap::Args)]
pub struct GetArgs {
    /// Resource type, or one of its aliases (`mc`, `members`, `addresses`, ...).
    pub resource_type: String,
    /// Resource id (all resources of the type when omitted).
    pub id: Option<String>,
    /// Resource namespace (default: the type's own).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Watch resource changes.
    #[arg(short, long)]
    pub watch: bool,
}

pub async fn run(global: &Global, args: GetArgs) -> anyhow::Result<()> {
    let many = global.connect_many()?;
    let nodes = match many.target() {
        Target::FanOut(nodes) => nodes.clone(),
        _ => unreachable!("connect_many fans out"),
    };
    // Like talosctl, the first node's definitions decide the type.
    let rd = many
        .node(&nodes[0])
        .resources()
        .resolve(&args.resource_type)
        .await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| rd.default_namespace.clone());
    let mut printer = Printer::new(global.output, &rd, args.watch);
    if args.watch {
        return watch(
            &many.node(&nodes[0]),
            &nodes,
            &rd,
            &namespace,
            args.id.as_deref(),
            printer,
        )
        .await;
    }
    let resources = many.resources();
    let replies = match &args.id {
        Some(id) => resources
            .get(&namespace, &rd.resource_type, id)
            .await?
            .into_iter()
            .map(|r| r.map(|one| vec![one]))
            .collect::<Vec<_>>(),
        None => resources.list(&namespace, &rd.resource_type).await?,
    };
    let mut failed = 0;
    for reply in replies {
        match reply.result {
            Ok(items) => items
                .iter()
                .try_for_each(|r| printer.resource(&reply.node, r, None))?,
            Err(e) => {
                failed += 1;
                eprintln!("error: {}: {e}", reply.node);
            }
        }
    }
    printer.flush();
    if failed > 0 {
        anyhow::bail!(Reported(format!(
            "{failed} of {} nodes failed",
            nodes.len()
        )));
    }
    Ok(())
}

async fn watch(
    first: &Client,
    nodes: &[String],
    rd: &ResourceDefinition,
    namespace: &str,
    id: Option<&str>,
    mut printer: Printer,
) -> anyhow::Result<()> {
    let mut streams = Vec::new();
    for node in nodes {
        let stream = first
            .node(node.as_str())
            .resources()
            .watch(namespace, &rd.resource_type, id)
            .await
            .with_context(|| format!("error setting up watch on node {node}"))?;
        let node = node.clone();
        streams.push(stream.map(move |event| (node.clone(), event)).boxed());
    }
    let mut events = futures::stream::select_all(streams);
    // The initial contents are printed together once every node has sent
    // them (a watch of one resource has no marker: at its first event).
    let mut pending = if id.is_some() { 0 } else { nodes.len() };
    while let Some((node, event)) = events.next().await {
        let event = event?;
        match event.kind {
            EventKind::Errored => {
                anyhow::bail!(
                    "error watching resource: {}",
                    event.error.unwrap_or_default()
                )
            }
            EventKind::Bootstrapped => {
                pending = pending.saturating_sub(1);
                if pending == 0 {
                    printer.flush();
                }
                continue;
            }
            EventKind::Noop => continue,
            _ => {}
        }
        if let Some(resource) = &event.resource {
            printer.resource(&node, resource, Some(event.kind))?;
            if pending == 0 {
                printer.flush();
            }
        }
    }
    printer.flush();
    Ok(())
}

/// talosctl's output writers: table (header from the definition's print
/// columns), YAML documents, indented JSON.
struct Printer {
    output: Output,
    display_type: String,
    columns: Vec<(String, String)>,
    with_events: bool,
    /// Rows not yet printed, aligned with the header; `None` once printed.
    table: Option<Table>,
    documents: usize,
}

impl Printer {
    fn new(output: Output, rd: &ResourceDefinition, with_events: bool) -> Printer {
        let mut header: Vec<String> = vec!["NODE".into()];
        if with_events {
            header.push("*".into());
        }
        header.extend(["NAMESPACE", "TYPE", "ID", "VERSION"].map(String::from));
        header.extend(rd.print_columns.iter().map(|(name, _)| name.to_uppercase()));
        let table = (output == Output::Table)
            .then(|| Table::new(&header.iter().map(String::as_str).collect::<Vec<_>>()));
        Printer {
            output,
            display_type: rd.display_type.clone(),
            columns: rd.print_columns.clone(),
            with_events,
            table,
            documents: 0,
        }
    }

    fn resource(
        &mut self,
        node: &str,
        r: &Resource,
        event: Option<EventKind>,
    ) -> anyhow::Result<()> {
        let spec: Value = spec_value(r)?;
        match self.output {
            Output::Table => {
                let mut row = vec![node.to_string()];
                if self.with_events {
                    row.push(
                        match event {
                            Some(EventKind::Created) => "+",
                            Some(EventKind::Destroyed) => "-",
                            _ => " ",
                        }
                        .into(),
                    );
                }
                let md = &r.metadata;
                row.extend([
                    md.namespace.clone(),
                    self.display_type.clone(),
                    md.id.clone(),
                    md.version.clone(),
                ]);
                row.extend(self.columns.iter().map(|(_, path)| jsonpath(&spec, path)));
                match &mut self.table {
                    Some(table) => table.row(row),
                    // After the first flush each row goes out alone, as
                    // tabwriter aligns a single line: three spaces apart.
                    None => outln!("{}", row.join("   ")),
                }
            }
            Output::Yaml => {
                let mut text = String::new();
                if self.documents > 0 {
                    text.push_str("---\n");
                }
                text.push_str(&format!("node: {node}\n"));
                if let (true, Some(kind)) = (self.with_events, event) {
                    text.push_str(&format!("event: {}\n", event_name(kind)));
                }
                // A struct, not a map: fields in the order upstream writes them.
                #[derive(serde::Serialize)]
                struct Document<'a> {
                    metadata: &'a talos_client::client::resources::ResourceMetadata,
                    spec: Value,
                }
                text.push_str(&serde_norway::to_string(&Document {
                    metadata: &r.metadata,
                    spec,
                })?);
                out!("{text}");
            }
            Output::Json => {
                let mut doc = Map::new();
                if let (true, Some(kind)) = (self.with_events, event) {
                    doc.insert("event".into(), event_name(kind).into());
                }
                doc.insert("metadata".into(), metadata(r));
                doc.insert("node".into(), node.into());
                doc.insert("spec".into(), spec);
                outln!("{}", json_indented(&Value::Object(doc))?);
            }
        }
        self.documents += 1;
        Ok(())
    }

    /// Prints the header and the rows gathered so far (once; later rows
    /// are printed as they come).
    fn flush(&mut self) {
        if let Some(table) = self.table.take() {
            out!("{}", table.render());
        }
    }
}

fn event_name(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Created => "created",
        EventKind::Updated => "updated",
        EventKind::Destroyed => "destroyed",
        EventKind::Bootstrapped => "bootstrapped",
        EventKind::Errored => "errored",
        EventKind::Noop => "noop",
    }
}

/// The spec as a value: the YAML the node sent.
fn spec_value(r: &Resource) -> anyhow::Result<Value> {
    let yaml: serde_norway::Value = r.spec_value()?;
    Ok(serde_json::to_value(yaml)?)
}

/// Metadata as cosi-project/runtime marshals it to YAML
/// (pkg/resource/metadata.go, MarshalYAML).
fn metadata(r: &Resource) -> Value {
    let md = &r.metadata;
    let time = |t: Option<time::OffsetDateTime>| {
        t.and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
    };
    let mut map = Map::new();
    map.insert("namespace".into(), md.namespace.clone().into());
    map.insert("type".into(), md.resource_type.clone().into());
    map.insert("id".into(), md.id.clone().into());
    map.insert("version".into(), md.version.clone().into());
    map.insert("owner".into(), md.owner.clone().into());
    map.insert("phase".into(), md.phase.clone().into());
    map.insert("created".into(), time(md.created).into());
    map.insert("updated".into(), time(md.updated).into());
    if !md.labels.is_empty() {
        map.insert("labels".into(), json!(md.labels));
    }
    if !md.annotations.is_empty() {
        map.insert("annotations".into(), json!(md.annotations));
    }
    if !md.finalizers.is_empty() {
        map.insert("finalizers".into(), json!(md.finalizers));
    }
    Value::Object(map)
}

fn json_indented(value: &Value) -> anyhow::Result<String> {
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    serde::Serialize::serialize(value, &mut serializer)?;
    Ok(String::from_utf8(out)?)
}

/// The subset of Kubernetes JSONPath that resource definitions use:
/// `{.a.b}` and `{.a[:]}`; a missing key prints nothing, a list prints as
/// Go's fmt prints a slice (`[a b]`), a range prints its items with spaces.
fn jsonpath(spec: &Value, path: &str) -> String {
    let inner = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut current = vec![spec.clone()];
    for part in inner.split('.').filter(|p| !p.is_empty()) {
        let (key, range) = match part.strip_suffix("[:]") {
            Some(key) => (key, true),
            None => (part, false),
        };
        current = current
            .iter()
            .filter_map(|v| v.get(key).cloned())
            .flat_map(|v| match (range, v) {
                (true, Value::Array(items)) => items,
                (_, v) => vec![v],
            })
            .collect();
    }
    current.iter().map(go_print).collect::<Vec<_>>().join(" ")
}

/// A value as Go's `fmt.Sprint` shows what YAML decoded into `any`.
fn go_print(value: &Value) -> String {
    match value {
        Value::Null => "<nil>".into(),
        Value::String(s) => s.clone(),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(go_print).collect::<Vec<_>>().join(" ")
        ),
        Value::Object(map) => format!(
            "map[{}]",
            map.iter()
                .map(|(k, v)| format!("{k}:{}", go_print(v)))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonpath_prints_like_talosctl() {
        let spec = json!({"stage": "running", "status": {"ready": true}, "addresses": ["10.0.0.1", "10.0.0.2"], "aliases": ["a", "b"]});
        assert_eq!(jsonpath(&spec, "{.stage}"), "running");
        assert_eq!(jsonpath(&spec, "{.status.ready}"), "true");
        assert_eq!(jsonpath(&spec, "{.addresses}"), "[10.0.0.1 10.0.0.2]");
        assert_eq!(jsonpath(&spec, "{.aliases[:]}"), "a b");
        assert_eq!(jsonpath(&spec, "{.missing}"), "");
    }
}
