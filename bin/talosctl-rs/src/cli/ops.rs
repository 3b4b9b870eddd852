//! `talosctl-rs ops ...`: the safe composite operations of
//! `talos_client::ops`, journaled in the state directory. Progress goes to
//! stderr step by step; the result to stdout (`-o json` for scripts).
//! Refusals exit 1 with the reason and change nothing.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use talos_client::ops::{
    ApplyOptions, Event, JoinOptions, MaintenanceApply, MigrateOptions, OpRecord, Ops, Plan,
    RetireOptions, SnapshotOptions, StepState, default_state_dir,
};

use super::apply::parse_go_duration;
use super::{Global, Output, print_structured};

#[derive(clap::Args)]
pub struct OpsArgs {
    /// Where the journal and locks live (default: $XDG_STATE_HOME/talosctl-rs,
    /// else ~/.local/state/talosctl-rs).
    #[arg(long, global = true)]
    pub state_dir: Option<PathBuf>,
    /// Print the plan and exit without changing anything.
    #[arg(long, global = true)]
    pub plan: bool,
    /// Do not ask for confirmation (required without a terminal for a
    /// destructive operation).
    #[arg(long, short = 'y', global = true)]
    pub yes: bool,
    /// Run the operations through the talos-opsd daemon listening on this
    /// socket (when it answers).
    #[arg(long, global = true, env = "TALOS_OPSD_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Run in this process even when a daemon socket is given.
    #[arg(long, global = true)]
    pub local: bool,
    #[command(subcommand)]
    pub command: OpsCommand,
}

/// A configuration for a node in maintenance mode.
#[derive(clap::Args)]
pub struct MaintenanceArgs {
    /// Apply this control-plane configuration to the node, which is in
    /// maintenance mode, before waiting for it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Accept the maintenance node's certificate only with this SPKI
    /// fingerprint (as the node prints it).
    #[arg(long = "cert-fingerprint", value_name = "FP", requires = "config")]
    cert_fingerprint: Vec<String>,
    /// Do not verify the maintenance node at all (anyone on the path can
    /// read the configuration and its keys).
    #[arg(long, requires = "config", conflicts_with = "cert_fingerprint")]
    insecure: bool,
}

impl MaintenanceArgs {
    fn load(self) -> anyhow::Result<Option<MaintenanceApply>> {
        self.config
            .map(|path| MaintenanceApply::load(&path, self.cert_fingerprint, self.insecure))
            .transpose()
            .map_err(Into::into)
    }

    /// What talos-opsd needs to apply it: the file (absolute, read on the
    /// daemon's host), the pins and whether verification is skipped.
    pub(super) fn for_daemon(&self) -> Option<(PathBuf, Vec<String>, bool)> {
        self.config.as_ref().map(|path| {
            (
                std::path::absolute(path).unwrap_or_else(|_| path.clone()),
                self.cert_fingerprint.clone(),
                self.insecure,
            )
        })
    }
}

#[derive(Subcommand)]
pub enum OpsCommand {
    /// A verified snapshot from a healthy voting member, with retention.
    Snapshot {
        /// Where snapshots go (default: STATE_DIR/snapshots).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Keep the newest N verified snapshots of this cluster (0: all).
        #[arg(long, default_value_t = 0)]
        keep: usize,
    },
    /// Retire a control-plane node: snapshot, forfeit, leave, reset at once.
    Retire {
        /// The node: hostname or address.
        node: String,
        /// A system label to wipe (repeatable; default STATE and EPHEMERAL).
        #[arg(long = "wipe", value_name = "LABEL")]
        wipe: Vec<String>,
        /// The node already left etcd: only reset it.
        #[arg(long)]
        already_left: bool,
        /// Where the verified snapshot goes (default: STATE_DIR/snapshots).
        #[arg(long)]
        snapshot_dir: Option<PathBuf>,
        /// How long to wait for the node to go silent.
        #[arg(long, default_value = "2m", value_parser = parse_go_duration)]
        timeout: Duration,
    },
    /// Wait until a new node is a voting etcd member and all are healthy;
    /// with --config, first apply it to the node in maintenance mode.
    Join {
        /// The node: hostname or address (host:port for a maintenance node
        /// on another port).
        node: String,
        /// How long to wait.
        #[arg(long, default_value = "10m", value_parser = parse_go_duration)]
        timeout: Duration,
        #[command(flatten)]
        maintenance: MaintenanceArgs,
    },
    /// Join NEW (from maintenance mode with --config), then retire OLD: the
    /// seeds' night as one operation.
    Migrate {
        /// The node to retire.
        #[arg(long, value_name = "OLD")]
        from: String,
        /// The node that takes its place.
        #[arg(long, value_name = "NEW")]
        to: String,
        #[command(flatten)]
        maintenance: MaintenanceArgs,
        /// How long NEW may take to become a healthy voter.
        #[arg(long, default_value = "10m", value_parser = parse_go_duration)]
        join_timeout: Duration,
        /// A system label to wipe on OLD (repeatable; default STATE and
        /// EPHEMERAL).
        #[arg(long = "wipe", value_name = "LABEL")]
        wipe: Vec<String>,
        /// Where the verified snapshot goes (default: STATE_DIR/snapshots).
        #[arg(long)]
        snapshot_dir: Option<PathBuf>,
        /// How long to wait for OLD to go silent.
        #[arg(long, default_value = "2m", value_parser = parse_go_duration)]
        timeout: Duration,
    },
    /// Apply a configuration safely to the nodes given with -n, one at a
    /// time: dry run and guards, TRY, health gate, then confirm (or a
    /// verified rollback).
    Apply {
        /// The machine configuration file.
        #[arg(long, short = 'f', value_name = "FILE")]
        file: PathBuf,
        /// A path that may change (repeatable); any other changed path
        /// refuses. E.g. cluster.controlPlane.endpoint, Layer2VIPConfig.
        #[arg(long = "expect-change", value_name = "PATH")]
        expect_change: Vec<String>,
        /// Allow a change of the service-account issuer (it breaks every
        /// token issued so far).
        #[arg(long)]
        allow_issuer_change: bool,
        /// Allow a change that needs a reboot: applied in REBOOT mode, with
        /// no automatic rollback.
        #[arg(long)]
        allow_reboot: bool,
        /// The try window: the node rolls back after it unless confirmed.
        #[arg(long, default_value = "2m", value_parser = parse_go_duration)]
        try_timeout: Duration,
        /// How long a node may take to come back from a reboot.
        #[arg(long, default_value = "10m", value_parser = parse_go_duration)]
        reboot_timeout: Duration,
        /// A command (run with sh -c, TALOS_NODE set) that must exit 0 for
        /// the health gate to pass.
        #[arg(long, value_name = "CMD")]
        check: Option<String>,
    },
    /// List this cluster's operations.
    List,
    /// Show one operation and its steps.
    Show {
        /// Its id (a unique prefix is enough).
        id: String,
    },
    /// Continue an interrupted operation, reconciling the step in flight.
    Resume {
        /// Its id.
        id: String,
    },
    /// End an interrupted or failed operation without further action.
    Abandon {
        /// Its id.
        id: String,
    },
    /// Follow an operation run by the talos-opsd daemon, step by step.
    Watch {
        /// Its id.
        id: String,
    },
}

pub async fn run(global: &Global, args: OpsArgs) -> anyhow::Result<()> {
    if super::opsd_client::dispatch(global, &args).await? {
        return Ok(());
    }
    let state_dir = match args.state_dir.clone() {
        Some(dir) => dir,
        None => default_state_dir().context("no state directory: pass --state-dir")?,
    };
    let context = global.resolve()?;
    let (client, nodes) = global.connect()?;
    let mut ops = Ops::open(&context, client, &state_dir)?;
    let snapshots = |dir: Option<PathBuf>| dir.unwrap_or_else(|| state_dir.join("snapshots"));
    let plan = match args.command {
        OpsCommand::Snapshot { dir, keep } => {
            ops.plan_snapshot(&SnapshotOptions {
                dir: snapshots(dir),
                keep,
            })
            .await?
        }
        OpsCommand::Retire {
            node,
            wipe,
            already_left,
            snapshot_dir,
            timeout,
        } => {
            ops.plan_retire(&RetireOptions {
                node,
                wipe,
                already_left,
                snapshot_dir: snapshots(snapshot_dir),
                silence_timeout: timeout,
            })
            .await?
        }
        OpsCommand::Join {
            node,
            timeout,
            maintenance,
        } => {
            ops.plan_join(&JoinOptions {
                node,
                timeout,
                maintenance: maintenance.load()?,
            })
            .await?
        }
        OpsCommand::Migrate {
            from,
            to,
            maintenance,
            join_timeout,
            wipe,
            snapshot_dir,
            timeout,
        } => {
            ops.plan_migrate(&MigrateOptions {
                from,
                to,
                maintenance: maintenance.load()?,
                join_timeout,
                wipe,
                snapshot_dir: snapshots(snapshot_dir),
                silence_timeout: timeout,
            })
            .await?
        }
        OpsCommand::Apply {
            file,
            expect_change,
            allow_issuer_change,
            allow_reboot,
            try_timeout,
            reboot_timeout,
            check,
        } => {
            let config = std::fs::read(&file)
                .with_context(|| format!("reading the configuration {}", file.display()))?;
            ops.plan_apply(&ApplyOptions {
                nodes,
                config_path: std::path::absolute(&file).unwrap_or(file),
                config,
                expect_change,
                allow_issuer_change,
                allow_reboot,
                try_timeout,
                reboot_timeout,
                check,
            })
            .await?
        }
        OpsCommand::List => return list(global, ops.list()?),
        OpsCommand::Show { id } => return report(global, &ops.show(&id)?),
        OpsCommand::Resume { id } => {
            let record = ops.resume(&id, &mut progress).await?;
            return report(global, &record);
        }
        OpsCommand::Abandon { id } => {
            let record = ops.abandon(&id)?;
            eprintln!("operation {} abandoned", record.id);
            return report(global, &record);
        }
        OpsCommand::Watch { .. } => bail!("ops watch follows a daemon's operation: pass --socket"),
    };
    show_plan(&plan);
    if args.plan {
        if global.output != Output::Table {
            print_structured(global.output, &plan)?;
        }
        return Ok(());
    }
    if plan.is_destructive() && !args.yes {
        confirm()?;
    }
    let record = ops.run(plan, &mut progress).await?;
    report(global, &record)
}

fn show_plan(plan: &Plan) {
    eprintln!("plan ({} steps):", plan.steps.len());
    for (i, step) in plan.steps.iter().enumerate() {
        let mark = if step.destructive {
            " [changes the cluster]"
        } else {
            ""
        };
        eprintln!("  {}. {}: {}{mark}", i + 1, step.name, step.description);
    }
    for note in &plan.notes {
        eprintln!("note: {note}");
    }
}

pub(super) fn confirm() -> anyhow::Result<()> {
    if !std::io::stdin().is_terminal() {
        bail!("this operation changes the cluster: pass --yes to run it without a terminal");
    }
    eprint!("proceed? [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    if !matches!(answer.trim(), "y" | "Y" | "yes") {
        bail!("not confirmed: nothing was changed");
    }
    Ok(())
}

/// Step-by-step progress on stderr. `TALOSCTL_RS_TEST_CRASH=started:STEP`
/// or `answered:STEP` aborts the process at that point, as a crash would
/// (for the crash-safety tests).
pub(super) fn progress(event: Event<'_>) {
    let crash_at = std::env::var("TALOSCTL_RS_TEST_CRASH").ok();
    let point = match event {
        Event::Started { id } => {
            eprintln!("operation {id}");
            None
        }
        Event::StepStarted { index, name, .. } => {
            eprintln!("[{}] {name} ...", index + 1);
            Some(format!("started:{name}"))
        }
        Event::StepAnswered { name, .. } => Some(format!("answered:{name}")),
        Event::StepEnded {
            index,
            name,
            state,
            duration_ms,
            detail,
        } => {
            let word = match state {
                StepState::Done => "done",
                StepState::Skipped => "skipped",
                StepState::Failed => "FAILED",
                _ => "?",
            };
            eprintln!(
                "[{}] {name} {word} in {duration_ms} ms: {detail}",
                index + 1
            );
            None
        }
        _ => None,
    };
    if let (Some(point), Some(crash)) = (point, crash_at.as_deref())
        && point == crash
    {
        std::process::abort();
    }
}

pub(super) fn report(global: &Global, record: &OpRecord) -> anyhow::Result<()> {
    if global.output != Output::Table {
        return print_structured(global.output, record);
    }
    outln!(
        "operation {} ({}) {:?} on context {:?}",
        record.id,
        record.kind,
        record.state,
        record.context
    );
    for step in &record.steps {
        let took = step
            .duration_ms
            .map(|d| format!(" in {d} ms"))
            .unwrap_or_default();
        outln!(
            "  {}. {:<12} {:?}{took}{}",
            step.index + 1,
            step.name,
            step.state,
            step.detail
                .as_deref()
                .map(|d| format!(": {d}"))
                .unwrap_or_default()
        );
    }
    if let Some(gap) = record
        .facts
        .get("leave_to_reset_gap_ms")
        .and_then(|g| g.as_f64())
    {
        outln!("leave_to_reset_gap_ms: {gap:.1}");
    }
    if let Some(step) = record.in_flight() {
        outln!(
            "in flight: {} (started {})",
            step.name,
            step.started.as_deref().unwrap_or("?")
        );
    }
    Ok(())
}

pub(super) fn list(global: &Global, records: Vec<OpRecord>) -> anyhow::Result<()> {
    if global.output != Output::Table {
        return print_structured(global.output, &records);
    }
    let mut table = super::table::Table::new(&["ID", "KIND", "STATE", "CREATED", "AT STEP"]);
    for r in records {
        let at = r
            .in_flight()
            .or_else(|| r.steps.iter().find(|s| s.state == StepState::Failed))
            .map(|s| s.name.clone())
            .unwrap_or_default();
        table.row(vec![
            r.id.clone(),
            r.kind.clone(),
            format!("{:?}", r.state),
            r.created.clone(),
            at,
        ]);
    }
    out!("{}", table.render());
    Ok(())
}
