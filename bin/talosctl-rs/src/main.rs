//! talosctl-rs: a talosctl-compatible command line client for the Talos API,
//! with verified etcd snapshots.

mod cli;

use std::process::ExitCode;

use clap::Parser as _;

// One thread: a command is one conversation with the API, and a second
// worker only adds start-up time and hand-offs between threads. Blocking
// work (a snapshot's writes and checks) runs on tokio's blocking pool.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TALOSCTL_RS_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    // clap exits with 2 on usage errors.
    let cli = cli::Cli::parse();
    match cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.downcast_ref::<cli::Exit>().is_some() => {
            ExitCode::from(error.downcast_ref::<cli::Exit>().map_or(1, |e| e.0))
        }
        Err(error) => {
            // One line: the error and those causes its text does not
            // already include.
            let mut message = String::new();
            for cause in error.chain().map(ToString::to_string) {
                if !message.contains(&cause) {
                    if !message.is_empty() {
                        message.push_str(": ");
                    }
                    message.push_str(&cause);
                }
            }
            eprintln!("error: {message}");
            if let Some(hint) = cli::hint(&error) {
                eprintln!("hint: {hint}");
            }
            if error.downcast_ref::<cli::Usage>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
