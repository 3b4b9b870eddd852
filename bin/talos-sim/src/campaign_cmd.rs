//! `talos-sim campaign`: the fault campaign's command line.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use talos_sim::campaign::{self, FaultKind, OpKind, draw::parse_list};

/// `talos-sim campaign` options.
#[derive(clap::Args)]
pub struct CampaignArgs {
    /// How many runs.
    #[arg(long, default_value_t = 10)]
    runs: u64,
    /// The campaign's seed: each run draws from it and its number.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The first run's number (split a campaign into ranges).
    #[arg(long, default_value_t = 0)]
    first_run: u64,
    /// Run only this run (replays it exactly, with the same --ops and
    /// --faults).
    #[arg(long, value_name = "K", conflicts_with_all = ["runs", "first_run"])]
    run: Option<u64>,
    /// The operations to draw from (comma-separated; default: all).
    #[arg(long, value_name = "LIST")]
    ops: Option<String>,
    /// The faults to draw from (comma-separated; default: all).
    #[arg(long, value_name = "LIST")]
    faults: Option<String>,
    /// Runs at once (each runs its own cluster; they mostly wait).
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// One JSON object per run on stdout, then the summary as one.
    #[arg(long)]
    json: bool,
    /// The talosctl-rs binary (default: beside talos-sim).
    #[arg(long, value_name = "PATH")]
    talosctl_rs: Option<PathBuf>,
    /// The talos-opsd binary (default: beside talos-sim).
    #[arg(long, value_name = "PATH")]
    talos_opsd: Option<PathBuf>,
    /// The kube-apiserver every control-plane node runs (default: the one
    /// scripts/kube-apiserver.sh builds).
    #[arg(long, env = "TALOS_SIM_KUBE_APISERVER", value_name = "PATH")]
    kube_apiserver: Option<PathBuf>,
    /// Where the runs keep their files (default: a new temporary
    /// directory); a failed run's directory is kept.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Keep every run's directory.
    #[arg(long)]
    keep: bool,
    /// Divide Talos's fixed waits by N.
    #[arg(long, default_value_t = 10, value_name = "N")]
    timing_divisor: u32,
}

/// A binary beside this one.
fn beside(name: &str) -> Option<PathBuf> {
    let path = std::env::current_exe().ok()?.parent()?.join(name);
    path.exists().then_some(path)
}

pub async fn campaign(args: CampaignArgs, kube: Option<PathBuf>) -> anyhow::Result<()> {
    let talosctl = match args.talosctl_rs.or_else(|| beside("talosctl-rs")) {
        Some(path) => path,
        None => bail!(
            "talosctl-rs is not beside talos-sim: build it (cargo build -p talosctl-rs) or pass --talosctl-rs"
        ),
    };
    let work_dir = match args.dir {
        Some(dir) => dir,
        None => tempfile::Builder::new()
            .prefix("talos-sim-campaign-")
            .tempdir()?
            .keep(),
    };
    std::fs::create_dir_all(&work_dir).with_context(|| format!("{}", work_dir.display()))?;
    let mut options = campaign::Options::new(args.seed, talosctl, work_dir.clone());
    options.runs = args.runs;
    options.first_run = args.first_run;
    options.only = args.run;
    if let Some(ops) = &args.ops {
        options.ops = parse_list(ops, &OpKind::ALL, OpKind::name)
            .map_err(|e| anyhow::anyhow!("--ops: {e}"))?;
    }
    if let Some(faults) = &args.faults {
        options.faults = parse_list(faults, &FaultKind::ALL, FaultKind::name)
            .map_err(|e| anyhow::anyhow!("--faults: {e}"))?;
    }
    if options.ops.is_empty() {
        bail!("--ops: name at least one operation");
    }
    if args.jobs == 0 || args.timing_divisor == 0 {
        bail!("--jobs and --timing-divisor: at least 1");
    }
    options.jobs = args.jobs;
    options.opsd = args.talos_opsd.or_else(|| beside("talos-opsd"));
    options.kube_apiserver = args.kube_apiserver.or(kube);
    options.keep_all = args.keep;
    options.timing_divisor = args.timing_divisor;
    let json = args.json;
    let summary = campaign::run_all(&options, &mut |report| {
        if json {
            println!(
                "{}",
                serde_json::to_string(report).expect("reports serialize")
            );
        } else {
            let verdict = if !report.violations.is_empty() {
                "VIOLATED"
            } else if report.setup_error.is_some() {
                "SETUP ERROR"
            } else {
                "ok"
            };
            eprintln!(
                "run {:>5} {:<15} {:<9} faults [{}] {verdict}",
                report.run,
                report.op,
                report.outcome.as_deref().unwrap_or("-"),
                report.faults.join(", ")
            );
            for v in &report.violations {
                eprintln!("    {}: {}", v.invariant, v.what);
            }
            if let Some(e) = &report.setup_error {
                eprintln!("    setup: {e}");
            }
        }
    })
    .await;
    if json {
        println!(
            "{}",
            serde_json::json!({ "summary": summary, "dir": work_dir })
        );
    } else {
        print!("{}", summary.table());
        println!("directory: {}", work_dir.display());
    }
    if summary.violations > 0 || summary.setup_errors > 0 {
        std::process::exit(1);
    }
    Ok(())
}
