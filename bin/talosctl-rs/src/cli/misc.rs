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
        println!("Client:");
        if args.short {
            println!("\t{} v{}", CLIENT.name, CLIENT.tag);
        } else {
            println!("\tTag:         v{}", CLIENT.tag);
            println!("\tName:        {}", CLIENT.name);
            println!(
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
        println!("Server:");
    }
    print_nodes(output, replies, |rows| {
        for (node, v) in rows {
            print_server(node, v, args.short);
        }
        Ok(())
    })
}

fn print_server(node: &str, v: &VersionInfo, short: bool) {
    println!("\tNODE:        {node}");
    if short {
        println!("\tTag:         {}", v.tag);
        return;
    }
    println!("\tTag:         {}", v.tag);
    println!("\tSHA:         {}", v.sha);
    println!("\tBuilt:       {}", v.built);
    println!("\tGo version:  {}", v.go_version);
    println!("\tOS/Arch:     {}/{}", v.os, v.arch);
    if v.rbac {
        println!("\tEnabled:     RBAC");
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
