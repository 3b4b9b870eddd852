//! A randomized fault campaign: each run draws from its seed a fresh
//! simulated cluster, one operation run through the real `talosctl-rs ops`
//! binary (or `talos-opsd`), and faults at random instants; after it, the
//! invariants are checked against the cluster's ledger (ground truth) and
//! the journals (`check.rs`). `talos-sim campaign` runs it; a run
//! replays exactly from its seed and number (the same draws).

mod check;
mod check_journal;
#[cfg(test)]
mod check_tests;
pub mod draw;
mod procs;
mod run;
mod setup;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use futures::StreamExt as _;
use serde::Serialize;

pub use check::{FRESH_BOUND_MS, Violation};
pub use draw::{Draw, FaultKind, OpKind};
pub use setup::{OPERATOR, PREPARATION, SECOND_ADMIN};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// How many runs.
    pub runs: u64,
    /// The campaign's seed.
    pub seed: u64,
    /// The first run's number.
    pub first_run: u64,
    /// Only this run (a replay).
    pub only: Option<u64>,
    /// The operations to draw from.
    pub ops: Vec<OpKind>,
    /// The faults to draw from.
    pub faults: Vec<FaultKind>,
    /// Runs at once.
    pub jobs: usize,
    /// The `talosctl-rs` binary.
    pub talosctl: PathBuf,
    /// The `talos-opsd` binary (the daemon variant; without it, runs that
    /// draw the daemon report a setup error).
    pub opsd: Option<PathBuf>,
    /// The kube-apiserver each control-plane node runs (None: no
    /// Kubernetes).
    pub kube_apiserver: Option<PathBuf>,
    /// Where runs keep their clusters and state directories.
    pub work_dir: PathBuf,
    /// Keep every run's directory, not only those of failed runs.
    pub keep_all: bool,
    /// Talos's timings divided by this.
    pub timing_divisor: u32,
}

impl Options {
    /// The defaults for `seed`: every operation and fault, one run at a
    /// time, timings ten times faster than Talos's.
    pub fn new(seed: u64, talosctl: PathBuf, work_dir: PathBuf) -> Options {
        Options {
            runs: 1,
            seed,
            first_run: 0,
            only: None,
            ops: OpKind::ALL.to_vec(),
            faults: FaultKind::ALL.to_vec(),
            jobs: 1,
            talosctl,
            opsd: None,
            kube_apiserver: None,
            work_dir,
            keep_all: false,
            timing_divisor: 10,
        }
    }

    /// The command that replays run `run` exactly.
    pub fn replay(&self, run: u64) -> String {
        let mut line = format!("talos-sim campaign --seed {} --run {run}", self.seed);
        if self.ops.len() != OpKind::ALL.len() {
            let names: Vec<_> = self.ops.iter().map(|o| o.name()).collect();
            line.push_str(&format!(" --ops {}", names.join(",")));
        }
        if self.faults.len() != FaultKind::ALL.len() {
            let names: Vec<_> = self.faults.iter().map(|f| f.name()).collect();
            match names.is_empty() {
                true => line.push_str(" --faults ''"),
                false => line.push_str(&format!(" --faults {}", names.join(","))),
            }
        }
        if self.timing_divisor != 10 {
            line.push_str(&format!(" --timing-divisor {}", self.timing_divisor));
        }
        line
    }
}

/// One run, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Its number.
    pub run: u64,
    /// The campaign's seed.
    pub seed: u64,
    /// The operation.
    pub op: &'static str,
    /// The faults that struck (a fault drawn after the operation ended
    /// does not).
    pub faults: Vec<String>,
    /// Broken invariants (empty when none).
    pub violations: Vec<Violation>,
    /// The command that replays it.
    pub replay: String,
    /// Control-plane nodes.
    pub nodes: usize,
    /// Workers.
    pub workers: usize,
    /// The Talos release simulated.
    pub version: &'static str,
    /// Run through talos-opsd.
    pub daemon: bool,
    /// How the operation ended, as journaled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// The run's wall time, cluster included.
    pub elapsed_ms: u64,
    /// The campaign could not prepare the run, or not read what the
    /// checks need (not found to be the operation's doing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub setup_error: Option<String>,
    /// Where the run's files were kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
}

/// A campaign's totals.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Summary {
    /// Runs done.
    pub runs: u64,
    /// Runs with a violation.
    pub failed_runs: u64,
    /// Violations in all.
    pub violations: u64,
    /// Runs the campaign could not prepare.
    pub setup_errors: u64,
    /// Runs per operation.
    pub per_op: BTreeMap<String, u64>,
    /// Strikes per fault.
    pub per_fault: BTreeMap<String, u64>,
    /// Violations per invariant.
    pub per_invariant: BTreeMap<String, u64>,
    /// Outcomes as journaled.
    pub outcomes: BTreeMap<String, u64>,
    /// Wall time, milliseconds.
    pub wall_ms: u64,
    /// The failed runs' replay commands.
    pub replays: Vec<String>,
}

impl Summary {
    fn add(&mut self, report: &RunReport) {
        self.runs += 1;
        *self.per_op.entry(report.op.into()).or_default() += 1;
        for fault in &report.faults {
            let name = fault.split_whitespace().next().unwrap_or_default();
            *self.per_fault.entry(name.into()).or_default() += 1;
        }
        for v in &report.violations {
            *self.per_invariant.entry(v.invariant.into()).or_default() += 1;
        }
        self.violations += report.violations.len() as u64;
        if !report.violations.is_empty() {
            self.failed_runs += 1;
            self.replays.push(report.replay.clone());
        }
        if report.setup_error.is_some() {
            self.setup_errors += 1;
        }
        let outcome = report.outcome.clone().unwrap_or_else(|| "none".into());
        *self.outcomes.entry(outcome).or_default() += 1;
    }

    /// The summary as a table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "runs: {}  failed runs: {}  violations: {}  setup errors: {}  wall: {:.1} s\n",
            self.runs,
            self.failed_runs,
            self.violations,
            self.setup_errors,
            self.wall_ms as f64 / 1000.0
        );
        for (title, map) in [
            ("operation", &self.per_op),
            ("fault", &self.per_fault),
            ("outcome", &self.outcomes),
            ("invariant", &self.per_invariant),
        ] {
            if map.is_empty() {
                continue;
            }
            out.push_str(&format!("{title:<20} count\n"));
            for (name, count) in map {
                out.push_str(&format!("  {name:<18} {count}\n"));
            }
        }
        for replay in &self.replays {
            out.push_str(&format!("replay: {replay}\n"));
        }
        out
    }
}

/// Runs the campaign, `jobs` runs at once, handing each run's report to
/// `each` as it ends; returns the totals.
pub async fn run_all(options: &Options, each: &mut (dyn FnMut(&RunReport) + Send)) -> Summary {
    let started = Instant::now();
    let runs: Vec<u64> = match options.only {
        Some(run) => vec![run],
        None => (options.first_run..options.first_run + options.runs).collect(),
    };
    let mut summary = Summary::default();
    let mut stream = futures::stream::iter(runs)
        .map(|run| run_one(options, run))
        .buffer_unordered(options.jobs.max(1));
    while let Some(report) = stream.next().await {
        summary.add(&report);
        each(&report);
    }
    summary.wall_ms = started.elapsed().as_millis() as u64;
    summary
}

/// One run: draw, prepare, run, check.
pub async fn run_one(options: &Options, run: u64) -> RunReport {
    let started = Instant::now();
    let draw = Draw::new(options.seed, run, &options.ops, &options.faults);
    let dir = options.work_dir.join(format!("run-{run}"));
    let _ = std::fs::remove_dir_all(&dir);
    let mut report = RunReport {
        run,
        seed: options.seed,
        op: draw.op.name(),
        faults: Vec::new(),
        violations: Vec::new(),
        replay: options.replay(run),
        nodes: draw.nodes,
        workers: draw.workers,
        version: draw.version.tag(),
        daemon: draw.daemon,
        outcome: None,
        elapsed_ms: 0,
        setup_error: None,
        dir: None,
    };
    let opsd = options.opsd.as_ref();
    let result = async {
        if draw.daemon && opsd.is_none() {
            return Err("the run draws talos-opsd, which was not found".to_string());
        }
        let world = setup::World::start(&dir, &draw, options).await?;
        let args = match world.prepare(&draw).await {
            Ok(args) => args,
            Err(e) => {
                world.cluster.shutdown().await;
                return Err(e);
            }
        };
        let gathered = run::run(&world, &draw, args, opsd).await;
        let name_of = |address: &str| world.name_of(address);
        let known = check::Known {
            ours: vec![world.operator.subject.clone(), world.second.subject.clone()],
            name_of: &name_of,
        };
        let violations = check::check(&known, &gathered);
        let outcome = gathered
            .operator
            .first()
            .and_then(|r| r["state"].as_str())
            .map(str::to_string);
        world.cluster.shutdown().await;
        let unreadable = match gathered.unreadable.is_empty() {
            true => None,
            false => Some(format!(
                "journal unreadable, the checks are incomplete: {}",
                gathered.unreadable.join("; ")
            )),
        };
        Ok((gathered.faults, violations, outcome, unreadable))
    }
    .await;
    match result {
        Ok((faults, violations, outcome, unreadable)) => {
            report.faults = faults;
            report.violations = violations;
            report.outcome = outcome;
            report.setup_error = unreadable;
        }
        Err(e) => report.setup_error = Some(e),
    }
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    let failed = !report.violations.is_empty() || report.setup_error.is_some();
    if failed || options.keep_all {
        report.dir = Some(dir);
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    report
}
