//! `talos-opsd`: the daemon, and `talos-opsd check-config`.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use talos_opsd::config::Config;
use talos_opsd::daemon::{self, Overrides};

#[derive(Parser)]
#[command(
    version,
    about = "Runs the safe Talos operations for an admin host: API, schedule, metrics, audit"
)]
struct Args {
    /// The configuration file.
    #[arg(
        long,
        global = true,
        default_value = "/etc/talos-opsd/config.toml",
        env = "TALOS_OPSD_CONFIG"
    )]
    config: PathBuf,
    /// The API's Unix socket (default: the file's `socket`, else
    /// $XDG_RUNTIME_DIR/talos-opsd.sock, or /run/talos-opsd/talos-opsd.sock as root).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Serve Prometheus metrics on HOST:PORT (off by default).
    #[arg(long)]
    metrics_addr: Option<String>,
    /// Where the journal and locks live (default: the file's `state_dir`).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// When the journal is empty or corrupt (the daemon refuses to start):
    /// move it aside as `journal.sqlite.corrupt-TIME` (kept, with its WAL
    /// files) and start a new one, without the history. A sound journal is
    /// left as it is.
    #[arg(long)]
    recover_journal: bool,
    /// Take a configuration file with no setting at all, and a reload
    /// (SIGHUP) that configures no cluster while some run, as meant;
    /// without it both are refused (an emptied file is a mistake more
    /// often than not).
    #[arg(long, global = true)]
    allow_empty: bool,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the configuration file and exit.
    CheckConfig,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("TALOS_OPSD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal: never in a file or the
    // journal (systemd), where they would be escape codes in every line.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    match args.log_format {
        LogFormat::Text => builder
            .with_writer(talos_opsd::logline::OneLine::new(ansi))
            .init(),
        LogFormat::Json => builder.with_writer(std::io::stderr).json().init(),
    }
    let result = match args.command {
        Some(Command::CheckConfig) => Config::load(&args.config, args.allow_empty)
            .map_err(anyhow::Error::from)
            .and_then(|(config, clusters)| {
                // The TCP files as the daemon loads them: a key that does
                // not match its certificate is refused here, not at start.
                if let Some(tcp) = &config.tcp {
                    talos_opsd::listen::server_tls(tcp)?;
                }
                Ok(clusters)
            })
            .map(|clusters| {
                println!(
                    "{}: ok ({} cluster{})",
                    args.config.display(),
                    clusters.len(),
                    if clusters.len() == 1 { "" } else { "s" }
                );
            }),
        None => tokio::runtime::Runtime::new()
            .map_err(anyhow::Error::from)
            .and_then(|rt| {
                rt.block_on(daemon::run(
                    &args.config,
                    Overrides {
                        socket: args.socket,
                        metrics_addr: args.metrics_addr,
                        state_dir: args.state_dir,
                        recover_journal: args.recover_journal,
                        allow_empty: args.allow_empty,
                    },
                ))
            }),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
