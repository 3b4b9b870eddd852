//! `talosctl-rs config ...`: info, contexts, context, merge, and setting
//! the current context's endpoints and nodes.

use anyhow::Context as _;
use clap::Subcommand;
use serde::Serialize;
use talos_client::config::{
    ConfigError, ConfigPath, Context, TalosConfig, default_paths, normalize_endpoint,
};
use time::OffsetDateTime;

use super::table::Table;
use super::{Global, Output, print_structured};

/// `--crt-ttl`: a Go duration above zero.
fn crt_ttl(text: &str) -> Result<std::time::Duration, String> {
    let ttl = talos_client::input::duration("--crt-ttl", text, talos_client::input::Units::Go)
        .map_err(|e| e.reason)?;
    if ttl.is_zero() {
        return Err("the certificate's lifetime must be above zero".into());
    }
    Ok(ttl)
}

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Show information about the current context.
    Info,
    /// Generate a new client configuration file: a node issues a client
    /// certificate with the given roles from the cluster's OS CA (needs
    /// os:admin; Talos's MachineService.GenerateClientConfiguration).
    New {
        /// Where to write it (refused if it exists).
        #[arg(default_value = "talosconfig")]
        path: std::path::PathBuf,
        /// The roles of the new certificate (os:admin, os:operator,
        /// os:reader, os:etcd:backup, ...).
        #[arg(long, value_delimiter = ',', default_value = "os:admin")]
        roles: Vec<String>,
        /// How long the certificate is valid (default 8760h).
        #[arg(long, value_parser = crt_ttl, default_value = "8760h")]
        crt_ttl: std::time::Duration,
    },
    /// List defined contexts.
    #[command(alias = "get-contexts")]
    Contexts,
    /// Set the current context.
    #[command(alias = "use-context")]
    Context {
        /// The context to make current.
        name: String,
    },
    /// Merge additional contexts from another client configuration file
    /// (contexts with the same name are renamed).
    Merge {
        /// The talosconfig to merge in.
        from: std::path::PathBuf,
    },
    /// Set the endpoint(s) of the current context.
    #[command(alias = "endpoints")]
    Endpoint {
        /// Endpoints (host, IP or host:port).
        endpoints: Vec<String>,
    },
    /// Set the node(s) of the current context.
    #[command(alias = "nodes")]
    Node {
        /// Nodes (hostnames or IPs).
        nodes: Vec<String>,
    },
    /// Add endpoint(s) to the current context (kept once each, in order).
    AddEndpoint {
        /// Endpoints to add.
        #[arg(required = true)]
        endpoints: Vec<String>,
    },
    /// Remove endpoint(s) from the current context.
    RemoveEndpoint {
        /// Endpoints to remove; each must be present.
        #[arg(required = true)]
        endpoints: Vec<String>,
    },
}

pub async fn run(global: &Global, command: ConfigCommand) -> anyhow::Result<()> {
    match command {
        ConfigCommand::Info => info(global),
        ConfigCommand::New {
            path,
            roles,
            crt_ttl,
        } => new(global, &path, &roles, crt_ttl).await,
        ConfigCommand::Contexts => contexts(global),
        ConfigCommand::Context { name } => use_context(global, &name),
        ConfigCommand::Merge { from } => merge(global, &from),
        ConfigCommand::Endpoint { endpoints } => {
            edit_current(global, "endpoints", |c| set_endpoints(c, endpoints))
        }
        ConfigCommand::Node { nodes } => edit_current(global, "nodes", |c| {
            c.nodes = nodes;
            Ok(())
        }),
        ConfigCommand::AddEndpoint { endpoints } => edit_current(global, "endpoints", |c| {
            let mut all = c.endpoints.clone();
            for e in endpoints {
                if !all.contains(&e) {
                    all.push(e);
                }
            }
            set_endpoints(c, all)
        }),
        ConfigCommand::RemoveEndpoint { endpoints } => edit_current(global, "endpoints", |c| {
            if let Some(missing) = endpoints.iter().find(|e| !c.endpoints.contains(e)) {
                anyhow::bail!(
                    "endpoint {missing:?} is not in the context (it has: {})",
                    c.endpoints.join(", ")
                );
            }
            c.endpoints.retain(|e| !endpoints.contains(e));
            Ok(())
        }),
    }
}

/// `config new`: as talosctl's, unknown roles and an existing file refused
/// before anything is sent; the new context gets the endpoints in use.
async fn new(
    global: &Global,
    path: &std::path::Path,
    roles: &[String],
    ttl: std::time::Duration,
) -> anyhow::Result<()> {
    let unknown: Vec<&str> = roles
        .iter()
        .map(|r| r.trim())
        .filter(|r| !r.is_empty() && !talos_client::tls::KNOWN_ROLES.contains(r))
        .collect();
    if !unknown.is_empty() {
        return Err(super::Usage(format!(
            "--roles: unknown roles: {} (known: {})",
            unknown.join(", "),
            talos_client::tls::KNOWN_ROLES.join(", ")
        ))
        .into());
    }
    if path.exists() {
        anyhow::bail!(
            "talosconfig file already exists: {:?}",
            path.display().to_string()
        );
    }
    let context = global.resolve()?;
    let (client, _) = global.connect_one("config new")?;
    let generated = client.generate_client_configuration(roles, ttl).await?;
    let mut config = TalosConfig::from_yaml(generated.talosconfig_yaml(), path)
        .context("the node's talosconfig")?;
    let name = config.context.clone();
    let new_context = config
        .contexts
        .get_mut(&name)
        .context("the node's talosconfig has no current context")?;
    new_context.endpoints = context.endpoints.clone();
    config.save(&ConfigPath::new(path.to_path_buf()))?;
    let info = talos_client::tls::Credentials::from_pem(
        generated.ca_pem.clone(),
        generated.crt_pem.clone(),
        generated.key_pem().to_vec(),
    )
    .certificate_info()?;
    eprintln!(
        "talosconfig saved to {} (context {name:?}, roles {}, certificate expires {})",
        path.display(),
        info.roles.join(", "),
        info.not_after.date()
    );
    Ok(())
}

/// Checks every endpoint as the client would read it, then sets them.
fn set_endpoints(context: &mut Context, endpoints: Vec<String>) -> anyhow::Result<()> {
    for endpoint in &endpoints {
        normalize_endpoint(endpoint).with_context(|| format!("endpoint {endpoint:?}"))?;
    }
    context.endpoints = endpoints;
    Ok(())
}

/// Changes the current context with `edit` and writes the file back
/// atomically (mode 0600), every other field and unknown key kept. Nothing
/// is written when `edit` fails.
fn edit_current(
    global: &Global,
    what: &str,
    edit: impl FnOnce(&mut Context) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let (mut config, location) = global.load_config()?;
    let name = match &global.context {
        Some(name) => name.clone(),
        None if config.context.is_empty() => {
            anyhow::bail!("{}: no current context is set", location.path.display())
        }
        None => config.context.clone(),
    };
    let available: Vec<String> = config.contexts.keys().cloned().collect();
    let context = config
        .contexts
        .get_mut(&name)
        .ok_or_else(|| ConfigError::UnknownContext {
            path: location.path.clone(),
            name: name.clone(),
            available,
        })?;
    edit(context)?;
    let now = if what == "nodes" {
        context.nodes.join(", ")
    } else {
        context.endpoints.join(", ")
    };
    config.save(&location)?;
    eprintln!(
        "context {name:?} {what}: {now} ({})",
        location.path.display()
    );
    Ok(())
}

/// What `config info` reports; the first six keys are talosctl's.
#[derive(Serialize)]
struct Info {
    context: String,
    nodes: Vec<String>,
    endpoints: Vec<String>,
    roles: Vec<String>,
    #[serde(rename = "certTTL")]
    cert_ttl: String,
    #[serde(rename = "certNotAfter")]
    cert_not_after: String,
    warnings: Vec<String>,
}

/// Relative time as go-humanize's RelTime prints it.
fn relative(then: OffsetDateTime, now: OffsetDateTime) -> String {
    let (seconds, suffix) = if then >= now {
        ((then - now).whole_seconds(), "from now")
    } else {
        ((now - then).whole_seconds(), "ago")
    };
    const MINUTE: i64 = 60;
    const HOUR: i64 = 60 * MINUTE;
    const DAY: i64 = 24 * HOUR;
    const WEEK: i64 = 7 * DAY;
    const MONTH: i64 = 30 * DAY;
    const YEAR: i64 = 12 * MONTH;
    let text = match seconds {
        s if s < 1 => return "now".into(),
        s if s < 2 => "1 second".into(),
        s if s < MINUTE => format!("{s} seconds"),
        s if s < 2 * MINUTE => "1 minute".into(),
        s if s < HOUR => format!("{} minutes", s / MINUTE),
        s if s < 2 * HOUR => "1 hour".into(),
        s if s < DAY => format!("{} hours", s / HOUR),
        s if s < 2 * DAY => "1 day".into(),
        s if s < WEEK => format!("{} days", s / DAY),
        s if s < 2 * WEEK => "1 week".into(),
        s if s < MONTH => format!("{} weeks", s / WEEK),
        s if s < 2 * MONTH => "1 month".into(),
        s if s < YEAR => format!("{} months", s / MONTH),
        s if s < 18 * MONTH => "1 year".into(),
        s if s < 2 * YEAR => "2 years".into(),
        s if s < 37 * YEAR => format!("{} years", s / YEAR),
        _ => "a long while".into(),
    };
    format!("{text} {suffix}")
}

/// A client certificate expiring within this is warned about, by `config
/// info` and once by every command that connects.
pub const EXPIRY_WARNING: time::Duration = time::Duration::days(30);

/// What to say about a client certificate that expired or expires within
/// [`EXPIRY_WARNING`] of `now`; nothing otherwise.
pub fn expiry_warning(
    cert: &talos_client::tls::CertificateInfo,
    now: OffsetDateTime,
) -> Option<String> {
    let remaining = cert.not_after - now;
    let date = cert.not_after.date();
    let roles = cert.roles.join(",");
    if remaining.is_negative() {
        Some(format!(
            "the client certificate expired {} ({date}); Talos will refuse it: issue a new talosconfig (an admin runs `talosctl-rs config new --roles {roles} PATH`)",
            relative(cert.not_after, now)
        ))
    } else if remaining < EXPIRY_WARNING {
        Some(format!(
            "the client certificate expires {} ({date}); renew it soon (an admin runs `talosctl-rs config new --roles {roles} PATH`)",
            relative(cert.not_after, now)
        ))
    } else {
        None
    }
}

fn info(global: &Global) -> anyhow::Result<()> {
    let context = global.resolve()?;
    let now = OffsetDateTime::now_utc();
    let cert = context.credentials.certificate_info()?;
    let mut warnings: Vec<String> = expiry_warning(&cert, now).into_iter().collect();
    let date = cert.not_after.date().to_string();
    if !cert.client_auth_only {
        warnings.push(
            "the client certificate's extended key usage is not exactly ClientAuth; current Talos releases refuse it".into(),
        );
    }
    let info = Info {
        context: context.name.clone(),
        nodes: context.nodes.clone(),
        endpoints: context.endpoints.clone(),
        roles: cert.roles.clone(),
        cert_ttl: relative(cert.not_after, now),
        cert_not_after: date,
        warnings,
    };
    if global.output != Output::Table {
        return print_structured(global.output, &info);
    }
    let or_undefined = |v: &[String]| {
        if v.is_empty() {
            "not defined".to_string()
        } else {
            v.join(", ")
        }
    };
    outln!("Current context:     {}", info.context);
    outln!("Nodes:               {}", or_undefined(&info.nodes));
    outln!("Endpoints:           {}", or_undefined(&info.endpoints));
    if !info.roles.is_empty() {
        outln!("Roles:               {}", info.roles.join(", "));
    }
    outln!(
        "Certificate expires: {} ({})",
        info.cert_ttl,
        info.cert_not_after
    );
    for warning in &info.warnings {
        eprintln!("WARNING: {warning}");
    }
    Ok(())
}

#[derive(Serialize)]
struct ContextRow {
    current: bool,
    name: String,
    endpoints: Vec<String>,
    nodes: Vec<String>,
}

fn contexts(global: &Global) -> anyhow::Result<()> {
    let (config, _) = global.load_config()?;
    let rows: Vec<ContextRow> = config
        .contexts
        .iter()
        .map(|(name, c)| ContextRow {
            current: *name == config.context,
            name: name.clone(),
            endpoints: c.endpoints.clone(),
            nodes: c.nodes.clone(),
        })
        .collect();
    if global.output != Output::Table {
        return print_structured(global.output, &rows);
    }
    let mut table = Table::new(&["CURRENT", "NAME", "ENDPOINTS", "NODES"]);
    for row in rows {
        let nodes = if row.nodes.len() > 3 {
            format!("{}...", row.nodes[..3].join(","))
        } else {
            row.nodes.join(",")
        };
        table.row(vec![
            if row.current {
                "*".into()
            } else {
                String::new()
            },
            row.name,
            row.endpoints.join(","),
            nodes,
        ]);
    }
    out!("{}", table.render());
    Ok(())
}

fn use_context(global: &Global, name: &str) -> anyhow::Result<()> {
    let (mut config, location) = global.load_config()?;
    if !config.contexts.contains_key(name) {
        return Err(ConfigError::UnknownContext {
            path: location.path.clone(),
            name: name.to_string(),
            available: config.contexts.keys().cloned().collect(),
        }
        .into());
    }
    config.context = name.to_string();
    config.save(&location)?;
    eprintln!(
        "current context is now {name:?} ({})",
        location.path.display()
    );
    Ok(())
}

/// The file to merge into: the one in use, or (like talosctl) the first
/// writable default location when none exists yet.
fn merge_target(global: &Global) -> anyhow::Result<(TalosConfig, ConfigPath)> {
    match global.load_config() {
        Ok(found) => Ok(found),
        Err(ConfigError::NotFound { .. }) => {
            let location = default_paths()
                .into_iter()
                .find(|p| p.write_allowed)
                .context("no writable talosconfig location (set TALOSCONFIG)")?;
            Ok((TalosConfig::default(), location))
        }
        Err(ConfigError::Read { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound && global.talosconfig.is_some() =>
        {
            let path = global.talosconfig.clone().expect("checked");
            Ok((TalosConfig::default(), ConfigPath::new(path)))
        }
        Err(e) => Err(e.into()),
    }
}

fn merge(global: &Global, from: &std::path::Path) -> anyhow::Result<()> {
    let incoming = TalosConfig::read(from)?;
    let (mut config, location) = merge_target(global)?;
    for rename in config.merge(incoming) {
        eprintln!("renamed talosconfig context {rename}");
    }
    config.save(&location)?;
    eprintln!("merged {} into {}", from.display(), location.path.display());
    Ok(())
}
