//! talosctl-rs: the command groups, global flags, output formats and error
//! reporting shared by all commands.

/// `println!` for command output: one write, and a closed stdout ends the
/// process as it ends talosctl (see [`emit`]).
macro_rules! outln {
    () => {
        $crate::cli::emit("\n")
    };
    ($($arg:tt)*) => {
        $crate::cli::emit(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` for command output (see [`emit`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::emit(&format!($($arg)*))
    };
}

pub mod apply;
pub mod config;
pub mod etcd;
pub mod get;
pub mod health;
pub mod kubeconfig;
pub mod misc;
pub mod ops;
mod ops_hint;
mod ops_output;
mod opsd_client;
pub mod power;
pub mod reset;
pub mod services;
pub mod snapshot;
pub mod streams;
pub mod table;
pub mod upgrade;

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;
use talos_client::config::{ConfigError, ConfigPath, Overrides, ResolvedContext, TalosConfig};
use talos_client::{Client, Error, Many};

/// talosctl-compatible command line client for the Talos API.
#[derive(Parser)]
#[command(name = "talosctl-rs", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes, as talosctl's persistent flags.
#[derive(Args, Clone, Debug)]
pub struct Global {
    /// The path to the Talos configuration file (default: $TALOSCONFIG,
    /// $TALOS_HOME/config, ~/.talos/config).
    #[arg(long, global = true, env = "TALOSCONFIG", value_name = "PATH")]
    pub talosconfig: Option<PathBuf>,
    /// Context to be used in command.
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// Override default endpoints in Talos configuration.
    #[arg(
        short,
        long,
        global = true,
        value_delimiter = ',',
        value_name = "ENDPOINT"
    )]
    pub endpoints: Vec<String>,
    /// Target the specified nodes.
    #[arg(short, long, global = true, value_delimiter = ',', value_name = "NODE")]
    pub nodes: Vec<String>,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// How results are printed.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Aligned columns, as talosctl prints.
    #[value(alias = "text")]
    Table,
    /// JSON, one document (stable shapes, see docs/cli.md).
    Json,
    /// YAML, one document.
    Yaml,
}

#[derive(Subcommand)]
pub enum Command {
    /// Print the client and server versions.
    Version(misc::VersionArgs),
    /// Manage the client configuration file (talosconfig).
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Manage etcd.
    #[command(subcommand)]
    Etcd(etcd::EtcdCommand),
    /// Get a resource or list resources (COSI), as talosctl get.
    #[command(visible_alias = "g")]
    Get(get::GetArgs),
    /// Apply a new machine configuration to nodes.
    ApplyConfig(apply::ApplyArgs),
    /// Reset a node.
    Reset(reset::ResetArgs),
    /// Upgrade Talos on the target nodes.
    Upgrade(upgrade::UpgradeArgs),
    /// Check the cluster's health (server-side checks, streamed).
    Health(health::HealthArgs),
    /// Download the admin kubeconfig from a control-plane node.
    Kubeconfig(kubeconfig::KubeconfigArgs),
    /// Retrieve logs for a service.
    Logs(streams::LogsArgs),
    /// Stream runtime events.
    Events(streams::EventsArgs),
    /// Retrieve kernel logs.
    Dmesg(streams::DmesgArgs),
    /// Retrieve the state of a service (or all services), control service
    /// state.
    #[command(visible_alias = "services")]
    Service(services::ServiceArgs),
    /// List containers.
    #[command(visible_alias = "c")]
    Containers(services::ContainersArgs),
    /// Manage container images.
    #[command(visible_alias = "images")]
    Image(services::ImageArgs),
    /// Reboot a node.
    Reboot(power::RebootArgs),
    /// Shutdown a node.
    Shutdown(power::ShutdownArgs),
    /// Bootstrap the etcd cluster on the specified node.
    Bootstrap(power::BootstrapArgs),
    /// Safe composite operations, journaled: snapshot, retire, join,
    /// migrate, defrag, upgrade, restore, drill and apply (list, show,
    /// resume, abandon and watch read and drive the journal; report reads
    /// the risks).
    Ops(ops::OpsArgs),
    /// Work with etcd snapshot files.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),
    /// Generate a shell completion script.
    Completion(misc::CompletionArgs),
    /// Print the man page (roff) generated from these definitions.
    Man,
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let global = cli.global;
    match cli.command {
        Command::Version(args) => misc::version(&global, args).await,
        Command::Config(command) => config::run(&global, command).await,
        Command::Etcd(command) => etcd::run(&global, command).await,
        Command::Get(args) => get::run(&global, args).await,
        Command::ApplyConfig(args) => apply::run(&global, args).await,
        Command::Reset(args) => reset::run(&global, args).await,
        Command::Upgrade(args) => upgrade::run(&global, args).await,
        Command::Health(args) => health::run(&global, args).await,
        Command::Kubeconfig(args) => kubeconfig::run(&global, args).await,
        Command::Logs(args) => streams::logs(&global, args).await,
        Command::Events(args) => streams::events(&global, args).await,
        Command::Dmesg(args) => streams::dmesg(&global, args).await,
        Command::Service(args) => services::service(&global, args).await,
        Command::Containers(args) => services::containers(&global, args).await,
        Command::Image(args) => services::image(&global, args).await,
        Command::Reboot(args) => power::reboot(&global, args).await,
        Command::Shutdown(args) => power::shutdown(&global, args).await,
        Command::Bootstrap(args) => power::bootstrap(&global, args).await,
        Command::Ops(args) => ops::run(&global, args).await,
        Command::Snapshot(command) => snapshot::run(&global, command),
        Command::Completion(args) => misc::completion(args),
        Command::Man => misc::man(),
    }
}

impl Global {
    /// Reads the talosconfig (explicit, env or default locations).
    pub fn load_config(&self) -> Result<(TalosConfig, ConfigPath), ConfigError> {
        TalosConfig::load(self.talosconfig.as_deref())
    }

    /// The current (or `--context`) context with `--endpoints`/`--nodes`.
    pub fn resolve(&self) -> anyhow::Result<ResolvedContext> {
        let (config, location) = self.load_config()?;
        let overrides = Overrides::default()
            .with_context(self.context.clone())
            .with_endpoints(self.endpoints.clone())
            .with_nodes(self.nodes.clone());
        Ok(config.resolve(&overrides, &location.path)?)
    }

    /// A client and the nodes to address (the context's when `-n` is not
    /// given; none means the endpoint node answers).
    pub fn connect(&self) -> anyhow::Result<(Client, Vec<String>)> {
        let context = self.resolve()?;
        warn_expiry_once(&context);
        // Leave and reset can take minutes on a busy cluster; talosctl sets
        // no deadline at all. Unreachable endpoints still fail fast.
        let client = Client::builder_from_context(&context)
            .call_timeout(std::time::Duration::from_secs(300))
            .build()?;
        Ok((client, context.nodes))
    }

    /// A client addressing every target node, one call each.
    pub fn connect_many(&self) -> anyhow::Result<Client<Many>> {
        let (client, nodes) = self.connect()?;
        Ok(if nodes.is_empty() {
            // The endpoint node answers; label it by the endpoint.
            let endpoint = client_endpoint_label(&self.resolve()?);
            client.nodes([endpoint])
        } else {
            client.nodes(nodes)
        })
    }

    /// Every target node (`-n`, or the endpoint's node) with a client that
    /// addresses it alone: for streams and calls fanned out one per node.
    pub fn targets(&self) -> anyhow::Result<Vec<(String, Client)>> {
        let (client, nodes) = self.connect()?;
        if !nodes.is_empty() {
            return Ok(nodes.iter().map(|n| (n.clone(), client.node(n))).collect());
        }
        let label = client_endpoint_label(&self.resolve()?);
        Ok(vec![(label, client.endpoint_node())])
    }

    /// A client for exactly one node, as talosctl requires for snapshot,
    /// leave and defrag.
    pub fn connect_one(&self, command: &str) -> anyhow::Result<(talos_client::Client, String)> {
        let (client, nodes) = self.connect()?;
        match nodes.as_slice() {
            [] => {
                let label = client_endpoint_label(&self.resolve()?);
                Ok((client.endpoint_node(), label))
            }
            [one] => Ok((client.node(one.as_str()), one.clone())),
            _ => Err(Usage(format!(
                "command {command:?} is not supported with multiple nodes"
            ))
            .into()),
        }
    }
}

/// Warns on stderr, once per process, when the client certificate in use
/// expires within [`config::EXPIRY_WARNING`] (an expired one is refused
/// when the client is built, with its date).
fn warn_expiry_once(context: &ResolvedContext) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        let Ok(cert) = context.credentials.certificate_info() else {
            return;
        };
        let now = time::OffsetDateTime::now_utc();
        if cert.not_after > now
            && let Some(warning) = config::expiry_warning(&cert, now)
        {
            eprintln!(
                "warning: context {:?} of {}: {warning}",
                context.name,
                context.path.display()
            );
        }
    });
}

fn client_endpoint_label(context: &ResolvedContext) -> String {
    talos_client::config::normalize_endpoint(&context.endpoints[0])
        .map(|e| e.host)
        .unwrap_or_else(|_| context.endpoints[0].clone())
}

/// Runs `call` on every target at once, one call per node (as talosctl
/// 1.14 fans out on the client side), and collects each node's result.
pub async fn each_target<T, F, Fut>(
    targets: &[(String, Client)],
    call: F,
) -> talos_client::NodeResults<T>
where
    F: Fn(Client) -> Fut,
    Fut: std::future::Future<Output = talos_client::client::Result<T>>,
{
    let results = futures::future::join_all(targets.iter().map(|(_, c)| call(c.clone()))).await;
    targets
        .iter()
        .zip(results)
        .map(|((node, _), result)| talos_client::NodeResult::new(node.clone(), result))
        .collect()
}

/// A misuse of the command line (exit code 2).
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// A command that ends with this exit code and has said all it had to say
/// (`ops report`: 1 for a warning, 2 for a critical finding).
#[derive(Debug)]
pub struct Exit(pub u8);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit code {}", self.0)
    }
}

impl std::error::Error for Exit {}

/// A per-node outcome as printed in JSON and YAML: `result` or `error`.
#[derive(Serialize)]
pub struct NodeOutput<T: Serialize> {
    pub node: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorOutput>,
}

/// An error in JSON and YAML output.
#[derive(Serialize)]
pub struct ErrorOutput {
    /// gRPC code name (`PermissionDenied`, ...), or `Error`.
    pub code: String,
    pub message: String,
}

impl ErrorOutput {
    pub fn of(error: &Error) -> ErrorOutput {
        ErrorOutput {
            code: error
                .code()
                .map(|c| format!("{c:?}"))
                .unwrap_or_else(|| "Error".to_string()),
            message: error.to_string(),
        }
    }
}

/// Prints a document in JSON or YAML.
pub fn print_structured<T: Serialize>(output: Output, value: &T) -> anyhow::Result<()> {
    match output {
        Output::Json => outln!("{}", serde_json::to_string_pretty(value)?),
        Output::Yaml => out!("{}", serde_norway::to_string(value)?),
        Output::Table => unreachable!("tables are printed by each command"),
    }
    Ok(())
}

/// Prints per-node results: structured, or as a table with one row per
/// item; node errors go to stderr. Fails (exit 1) if any node failed.
pub fn print_nodes<T: Serialize>(
    output: Output,
    replies: talos_client::NodeResults<T>,
    table: impl FnOnce(&[(String, &T)]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let failed = replies.iter().filter(|r| r.result.is_err()).count();
    if output == Output::Table {
        let ok: Vec<(String, &T)> = replies
            .iter()
            .filter_map(|r| r.result.as_ref().ok().map(|v| (r.node.clone(), v)))
            .collect();
        table(&ok)?;
        let mut hints = Vec::new();
        for reply in &replies {
            if let Err(e) = &reply.result {
                eprintln!("error: {}: {e}", reply.node);
                if let Some(h) = client_hint(e).filter(|h| !hints.contains(h)) {
                    hints.push(h);
                }
            }
        }
        for h in hints {
            eprintln!("hint: {h}");
        }
    } else {
        let out: Vec<NodeOutput<&T>> = replies
            .iter()
            .map(|r| NodeOutput {
                node: r.node.clone(),
                result: r.result.as_ref().ok(),
                error: r.result.as_ref().err().map(ErrorOutput::of),
            })
            .collect();
        print_structured(output, &out)?;
    }
    if failed > 0 {
        anyhow::bail!(Reported(format!(
            "{failed} of {} nodes failed",
            replies.len()
        )));
    }
    Ok(())
}

/// An error whose details were already printed (only the summary remains).
#[derive(Debug)]
pub struct Reported(pub String);

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Reported {}

/// A hint for the operator, chosen from the error's kind.
pub fn hint(error: &anyhow::Error) -> Option<String> {
    if let Some(e) = error.downcast_ref::<Error>() {
        return client_hint(e);
    }
    if let Some(e) = error.downcast_ref::<ConfigError>() {
        return config_hint(e);
    }
    if error
        .downcast_ref::<talos_client::snapshot::SnapshotError>()
        .is_some()
    {
        return Some(
            "nothing was saved under the requested path; see the message for which check failed"
                .into(),
        );
    }
    if error.downcast_ref::<Usage>().is_some() {
        return Some("see --help for the command's usage".into());
    }
    if let Some(e) = error.downcast_ref::<talos_client::ops::OpsError>() {
        return ops_hint::hint(e);
    }
    None
}

fn client_hint(e: &Error) -> Option<String> {
    Some(match e {
        Error::Config(c) => return config_hint(c),
        Error::Connect(_) => "check --endpoints and that the nodes are up and reachable".into(),
        Error::Tls { .. } => {
            "check the ca, crt and key of the talosconfig context (`talosctl-rs config info`)"
                .into()
        }
        Error::PermissionDenied(_) => {
            "the client certificate's roles do not allow this call; see `talosctl-rs config info`"
                .into()
        }
        Error::Unauthenticated(_) => {
            "the server did not accept the client certificate; is the talosconfig for this cluster?"
                .into()
        }
        Error::Unimplemented(_) => {
            "the node does not serve this call (etcd calls need a control-plane node)".into()
        }
        Error::Unavailable(_) => {
            "the node or its service is not reachable right now; retry or pick another node with -n"
                .into()
        }
        Error::NotFound(_) => "check the id or name (e.g. `talosctl-rs etcd members`)".into(),
        Error::UnknownResourceType { .. } => {
            "list the resource types the node knows with `talosctl-rs get rd`".into()
        }
        Error::FailedPrecondition(_) => {
            "the node is busy or not ready for this; check its state and retry".into()
        }
        _ => return None,
    })
}

fn config_hint(e: &ConfigError) -> Option<String> {
    Some(match e {
        ConfigError::NotFound { .. } => "pass --talosconfig PATH or set TALOSCONFIG".into(),
        ConfigError::UnknownContext { .. } => {
            "list contexts with `talosctl-rs config contexts`".into()
        }
        ConfigError::NoCurrentContext { .. } => {
            "choose one with `talosctl-rs config context NAME`".into()
        }
        ConfigError::NoEndpoints { .. } => "pass --endpoints or set them in the talosconfig".into(),
        _ => "fix the file or key named above".into(),
    })
}

/// Reads a file named on the command line, naming the flag at fault.
pub fn read_input(flag: &str, path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("{flag} {}: cannot read", path.display()))
}

/// Writes `text` to stdout in one write. When stdout is a pipe whose reader
/// has gone (`talosctl-rs ... | head`), the process ends by SIGPIPE, as a Go
/// program such as talosctl does, instead of panicking; any other failure is
/// reported and ends it with status 1.
pub fn emit(text: &str) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let Err(e) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    else {
        return;
    };
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        // SAFETY: restoring a signal's default action and raising it in this
        // thread; no handler runs, the default action ends the process.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::raise(libc::SIGPIPE);
        }
    }
    eprintln!("error: writing to stdout: {e}");
    std::process::exit(1);
}
