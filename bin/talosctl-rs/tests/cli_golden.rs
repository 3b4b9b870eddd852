//! The CLI's output shapes, held to committed golden files in
//! tests/golden/: `etcd members`, `etcd status`, `config info` and `config
//! contexts`, each as table, json and yaml, from a one-node simulator (one
//! node, so row order is fixed). Values that differ from run to run
//! (member ids, addresses, ports, dates, sizes, raft counters) are
//! normalised first; table columns are compared with their spacing folded,
//! since address widths vary.
//!
//! After an intended change of output: `UPDATE_GOLDEN=1 cargo test -p
//! talosctl-rs --test cli_golden`, then review the diff of tests/golden/.

use std::path::PathBuf;

use regex::Regex;
use talos_test_support::cli::run;
use talos_test_support::sim::SimCluster;

const COMMANDS: &[(&str, &[&str])] = &[
    ("etcd-members", &["etcd", "members"]),
    ("etcd-status", &["etcd", "status"]),
    ("config-info", &["config", "info"]),
    ("config-contexts", &["config", "contexts"]),
    ("containers", &["containers"]),
    (
        "etcd-downgrade-validate",
        &["etcd", "downgrade", "validate", "3.5"],
    ),
    ("image-list", &["image", "list", "--namespace", "system"]),
];

/// Commands that print the node's text as it comes (no -o json or yaml).
const TEXT_ONLY: &[(&str, &[&str])] = &[("dmesg", &["dmesg"])];

#[tokio::test]
async fn output_matches_the_golden_files() {
    let sim = SimCluster::start(1).await;
    // Services' events settle once etcd's first health check passed.
    sim.wait_etcd_healthy(1).await;
    let talosconfig = sim.dir.path().join("talosconfig");
    let mut mismatches = Vec::new();
    let runs = COMMANDS
        .iter()
        .flat_map(|(name, args)| ["table", "json", "yaml"].map(|f| (*name, *args, f)))
        .chain(TEXT_ONLY.iter().map(|(name, args)| (*name, *args, "table")));
    for (name, args, format) in runs {
        let mut argv = vec!["-o", format];
        argv.extend_from_slice(args);
        let out = run(&talosconfig, &argv).await.ok();
        let got = normalise(&out.stdout, format == "table");
        let path = golden_dir().join(format!("{name}.{format}"));
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
        if got != want {
            mismatches.push(format!(
                "{}:\n--- want\n{want}--- got\n{got}",
                path.display()
            ));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Replaces run-dependent values with placeholders.
fn normalise(text: &str, table: bool) -> String {
    let rules = [
        (r"\b[0-9a-f]{16}\b", "<ID>"),
        (r"127(\.\d+){3}", "<IP>"),
        (r"<IP>:\d+", "<IP>:<PORT>"),
        (r"\d{4}-\d{2}-\d{2}", "<DATE>"),
        (r"T\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", "T<TIME>"),
        (r"sha256:[0-9a-f]{64}", "sha256:<DIGEST>"),
        (r"\b(\d+h)?(\d+m)?\d+s ago", "<AGO> ago"),
        (r"\d+ [kMG]?B\b", "<SIZE>"),
        (r"\(\d+\.\d+%\)", "(<PCT>)"),
        // JSON and YAML integers (sizes and raft counters).
        (r"(: )\d+(,?)$", "${1}<N>${2}"),
    ];
    let mut out = String::new();
    for line in text.lines() {
        let mut line = line.to_string();
        for (pattern, with) in rules {
            line = Regex::new(pattern)
                .unwrap()
                .replace_all(&line, with)
                .into_owned();
        }
        if table {
            // Fold column padding; bare integers (raft counters) become <N>.
            line = line
                .split_whitespace()
                .map(|w| {
                    if w.chars().all(|c| c.is_ascii_digit()) {
                        "<N>"
                    } else {
                        w
                    }
                })
                .collect::<Vec<_>>()
                .join(" ");
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}
