//! `version`, `completion` and `man`.

use clap::CommandFactory as _;
use serde::Serialize;
use talos_client::client::VersionInfo;

use super::{Cli, Global, Output, print_nodes, print_structured};

#[derive(clap::Args)]
pub struct VersionArgs {
    /// Print the client version only.
    #[arg(long)]
    pub client: bool,
    /// Print the short version.
    #[arg(long)]
    pub short: bool,
}

#[derive(clap::Args)]
pub struct CompletionArgs {
    /// The shell: bash, zsh or fish.
    pub shell: CompletionShell,
}

#[derive(clap::ValueEnum, Clone, Copy)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Serialize)]
struct ClientVersion {
    tag: &'static str,
    name: &'static str,
}

const CLIENT: ClientVersion = ClientVersion {
    tag: env!("CARGO_PKG_VERSION"),
    name: "talosctl-rs",
};

pub async fn version(global: &Global, args: VersionArgs) -> anyhow::Result<()> {
    let output = global.output;
    if output == Output::Table {
        outln!("Client:");
        if args.short {
            outln!("\t{} v{}", CLIENT.name, CLIENT.tag);
        } else {
            outln!("\tTag:         v{}", CLIENT.tag);
            outln!("\tName:        {}", CLIENT.name);
            outln!(
                "\tOS/Arch:     {}/{}",
                std::env::consts::OS,
                std::env::consts::ARCH
            );
        }
    }
    if args.client {
        if output != Output::Table {
            print_structured(output, &serde_json::json!({ "client": CLIENT }))?;
        }
        return Ok(());
    }
    let replies = global.connect_many()?.version().await?;
    if output == Output::Table {
        outln!("Server:");
    }
    print_nodes(output, replies, |rows| {
        let mut text = String::new();
        for (node, v) in rows {
            server_lines(&mut text, node, v, args.short);
        }
        out!("{text}");
        Ok(())
    })
}

/// One node's part of `version`, as talosctl prints it.
fn server_lines(text: &mut String, node: &str, v: &VersionInfo, short: bool) {
    use std::fmt::Write as _;
    // Writing to a String cannot fail.
    let _ = writeln!(text, "\tNODE:        {node}");
    let _ = writeln!(text, "\tTag:         {}", v.tag);
    if short {
        return;
    }
    let _ = writeln!(text, "\tSHA:         {}", v.sha);
    let _ = writeln!(text, "\tBuilt:       {}", v.built);
    let _ = writeln!(text, "\tGo version:  {}", v.go_version);
    let _ = writeln!(text, "\tOS/Arch:     {}/{}", v.os, v.arch);
    if v.rbac {
        let _ = writeln!(text, "\tEnabled:     RBAC");
    }
}

pub fn completion(args: CompletionArgs) -> anyhow::Result<()> {
    let mut command = Cli::command();
    let shell = match args.shell {
        CompletionShell::Bash => clap_complete::Shell::Bash,
        CompletionShell::Zsh => clap_complete::Shell::Zsh,
        CompletionShell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut command, "talosctl-rs", &mut std::io::stdout());
    Ok(())
}

pub fn man() -> anyhow::Result<()> {
    clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?;
    Ok(())
}
