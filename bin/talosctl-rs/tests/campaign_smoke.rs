//! The fault campaign's smoke (`talos-sim campaign`, docs/campaign.md): a
//! fixed set of runs of one seed, two at a time, each a fresh simulated
//! cluster with Kubernetes, an operation run through this crate's binary
//! (or talos-opsd) and the faults its seed draws; every run must break no
//! invariant the campaign checks (I1, I2, I4, I5, I6) and leave nothing it
//! could not check. Needs talos-opsd built beside talosctl-rs
//! (`cargo build -p talos-opsd`) and the kube-apiserver
//! (`scripts/kube-apiserver.sh`).

use std::collections::BTreeSet;
use std::path::PathBuf;

use futures::StreamExt as _;
use talos_sim::campaign::{self, Draw, FaultKind, OpKind, Options, RunReport};
use talos_test_support::sim::{kube_apiserver_binary, timing_divisor};

/// The campaign's seed.
const SEED: u64 = 7;
/// Its runs: chosen for what they draw (asserted below), and cheap.
const RUNS: [u64; 6] = [2, 5, 12, 18, 25, 27];

fn draws() -> Vec<Draw> {
    RUNS.iter()
        .map(|run| Draw::new(SEED, *run, &OpKind::ALL, &FaultKind::ALL))
        .collect()
}

/// The runs cover what the smoke claims: retire, migrate and snapshot;
/// the daemon and the CLI; a kill of each (a resume, a daemon's recovery);
/// a second admin host, a delayed leave, a new machine at a reset node's
/// address, a freeze and a partition.
#[test]
fn the_smoke_runs_draw_what_they_are_meant_to_cover() {
    let draws = draws();
    let ops: BTreeSet<&str> = draws.iter().map(|d| d.op.name()).collect();
    for op in ["retire", "migrate", "snapshot"] {
        assert!(ops.contains(op), "no {op} among {ops:?}");
    }
    let faults: BTreeSet<&str> = draws
        .iter()
        .flat_map(|d| d.faults.iter().map(|f| f.kind.name()))
        .collect();
    for fault in [
        "kill",
        "second-admin",
        "delay-leave",
        "fresh-node",
        "freeze",
        "partition",
    ] {
        assert!(faults.contains(fault), "no {fault} among {faults:?}");
    }
    let killed = |daemon: bool| {
        draws
            .iter()
            .any(|d| d.daemon == daemon && d.faults.iter().any(|f| f.kind == FaultKind::Kill))
    };
    assert!(
        killed(true) && killed(false),
        "a kill of the daemon and of the CLI"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_smoke_runs_break_no_invariant() {
    let talosctl = PathBuf::from(env!("CARGO_BIN_EXE_talosctl-rs"));
    let opsd = talosctl.with_file_name("talos-opsd");
    assert!(
        opsd.exists(),
        "{} is missing: build it (cargo build -p talos-opsd)",
        opsd.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let mut options = Options::new(SEED, talosctl, dir.path().to_path_buf());
    options.opsd = Some(opsd);
    options.kube_apiserver = Some(kube_apiserver_binary());
    options.timing_divisor = timing_divisor();
    let options = &options;
    let reports: Vec<RunReport> = futures::stream::iter(RUNS)
        .map(|run| campaign::run_one(options, run))
        .buffer_unordered(2)
        .collect()
        .await;
    assert_eq!(reports.len(), RUNS.len());
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| !r.violations.is_empty() || r.setup_error.is_some())
        .map(|r| serde_json::to_string_pretty(r).unwrap())
        .collect();
    // A failed run's directory outlives the temporary one, for its ledger
    // and its processes' output.
    if !failed.is_empty() {
        let kept = dir.keep();
        panic!(
            "{} of {} runs failed (files under {}):\n{}",
            failed.len(),
            RUNS.len(),
            kept.display(),
            failed.join("\n")
        );
    }
    // Each run without a kill ran its operation to an end it journaled (a
    // kill may strike before the operation is journaled: then there is
    // nothing to resume).
    let draws = draws();
    for (r, d) in reports
        .iter()
        .map(|r| (r, &draws[RUNS.iter().position(|k| *k == r.run).unwrap()]))
    {
        if !d.faults.iter().any(|f| f.kind == FaultKind::Kill) {
            assert!(
                r.outcome.is_some(),
                "run {} journaled nothing: {r:?}",
                r.run
            );
        }
    }
}
