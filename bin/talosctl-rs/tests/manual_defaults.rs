//! The defaults and bounds the manual states (`docs/ops/*.md`, "Defaults
//! and bounds"; `docs/ops/journal.md`, "Bounds and stops") and the ones
//! `talosctl-rs ops ... --help` prints are the library's: each table is
//! built here from the constants and must appear on its page as written,
//! and each flag's help must name the same default. A constant that
//! changes fails this test until the page and the help say so too.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use talos_client::ops::{
    ApplyOptions, DURATION_BOUNDS, DefragOptions, JoinOptions, LeaseProbe, MigrateOptions, Ops,
    RestoreOptions, RetireOptions, UpgradeOptions,
};

/// A duration as the manual and the help write it: `2m`, `5m30s`, `24h`,
/// `10ms`.
fn short(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{}ms", d.as_millis());
    }
    let parts = [
        (secs / 3600, "h"),
        (secs % 3600 / 60, "m"),
        (secs % 60, "s"),
    ];
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect()
}

/// `DURATION_BOUNDS` of `option`, as the manual writes them.
fn bounds(option: &str) -> String {
    let (_, min, max) = DURATION_BOUNDS
        .iter()
        .find(|(name, _, _)| *name == option)
        .unwrap_or_else(|| panic!("DURATION_BOUNDS has no {option}"));
    format!("{} to {}", short(*min), short(*max))
}

fn page(path: &str) -> String {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// A "Defaults and bounds" table with these rows (option cell, default,
/// bounds).
fn table(rows: &[(&str, String, String)]) -> String {
    let mut out = String::from("| option | default | bounds |\n|--------|---------|--------|\n");
    for (option, default, bounds) in rows {
        let line = format!("| {option} | {default} | {bounds} |\n");
        out.push_str(&line.replace("|  |", "| |"));
    }
    out
}

/// What each operation's page must show.
fn expected_tables() -> Vec<(&'static str, String)> {
    let probe = short(LeaseProbe::new("https://x").renew_deadline);
    let migrate = MigrateOptions::new("old", "new");
    vec![
        (
            "docs/ops/join.md",
            table(&[(
                "`--timeout`",
                short(JoinOptions::DEFAULT_TIMEOUT),
                bounds("timeout"),
            )]),
        ),
        (
            "docs/ops/retire.md",
            table(&[
                (
                    "`--timeout`",
                    short(RetireOptions::DEFAULT_SILENCE_TIMEOUT),
                    bounds("silence_timeout"),
                ),
                (
                    "`--lease-probe-deadline`",
                    probe.clone(),
                    bounds("lease_probe_deadline"),
                ),
                (
                    "`Ops::set_snapshot_stall` (library)",
                    short(Ops::DEFAULT_SNAPSHOT_STALL),
                    String::new(),
                ),
                (
                    "`Ops::set_leave_timeouts` (library): the leave's deadline",
                    short(Ops::DEFAULT_LEAVE_DEADLINE),
                    String::new(),
                ),
                (
                    "`Ops::set_leave_timeouts` (library): asking a survivor after it",
                    short(Ops::DEFAULT_LEAVE_SETTLE),
                    String::new(),
                ),
            ]),
        ),
        (
            "docs/ops/migrate.md",
            table(&[
                (
                    "`--join-timeout`",
                    short(migrate.join_timeout),
                    bounds("join_timeout"),
                ),
                (
                    "`--timeout`",
                    short(migrate.silence_timeout),
                    bounds("silence_timeout"),
                ),
                (
                    "`--lease-probe-deadline`",
                    probe,
                    bounds("lease_probe_deadline"),
                ),
            ]),
        ),
        (
            "docs/ops/apply.md",
            table(&[
                (
                    "`--try-timeout`",
                    short(ApplyOptions::DEFAULT_TRY_TIMEOUT),
                    bounds("try_timeout"),
                ),
                (
                    "`--reboot-timeout`",
                    short(ApplyOptions::DEFAULT_REBOOT_TIMEOUT),
                    bounds("reboot_timeout"),
                ),
                (
                    "`--vip-check`",
                    ApplyOptions::DEFAULT_VIP_CHECK.to_string(),
                    String::new(),
                ),
                (
                    "`--kube-check`",
                    ApplyOptions::DEFAULT_KUBE_CHECK.to_string(),
                    String::new(),
                ),
            ]),
        ),
        (
            "docs/ops/upgrade.md",
            table(&[
                (
                    "`--reboot-timeout`",
                    short(UpgradeOptions::DEFAULT_REBOOT_TIMEOUT),
                    bounds("reboot_timeout"),
                ),
                // The CLI's own default (clap's default_value_t), held to
                // its help below.
                ("`--parallel`", "1".into(), "1 or more".into()),
            ]),
        ),
        (
            "docs/ops/defrag.md",
            table(&[(
                "`--threshold`",
                DefragOptions::DEFAULT_THRESHOLD.to_string(),
                "(0, 1]".into(),
            )]),
        ),
        (
            "docs/ops/restore.md",
            table(&[(
                "`--rejoin-timeout`",
                short(RestoreOptions::DEFAULT_REJOIN_TIMEOUT),
                bounds("rejoin_timeout"),
            )]),
        ),
    ]
}

#[test]
fn each_operation_page_states_the_library_defaults_and_bounds() {
    let mut wrong = Vec::new();
    for (path, expected) in expected_tables() {
        if !page(path).contains(&expected) {
            wrong.push(format!("{path} must hold this table:\n{expected}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_journal_page_states_every_duration_bound() {
    let text = page("docs/ops/journal.md");
    for (name, min, max) in DURATION_BOUNDS {
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}` ")))
            .unwrap_or_else(|| panic!("docs/ops/journal.md has no row for `{name}`"));
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(
            cells[1..],
            [short(*min), short(*max)],
            "docs/ops/journal.md: the bounds of `{name}`"
        );
    }
    let rows = text
        .lines()
        .skip_while(|l| !l.starts_with("| option | from | to |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .count();
    assert_eq!(
        rows,
        DURATION_BOUNDS.len(),
        "docs/ops/journal.md lists a bound the library does not have"
    );
}

/// The help of `talosctl-rs ops SUB`, flag by flag: each flag's text with
/// its lines joined.
fn help(sub: &str) -> Vec<(String, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_talosctl-rs"))
        .args(["ops", sub, "--help"])
        .output()
        .expect("talosctl-rs runs");
    assert!(out.status.success(), "ops {sub} --help: {out:?}");
    let text = String::from_utf8(out.stdout).expect("UTF-8 help");
    let mut flags: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("--") || trimmed.starts_with('-') && trimmed.contains(", --") {
            let name = trimmed[trimmed.find("--").unwrap_or(0)..]
                .split(|c: char| c.is_whitespace() || c == '=' || c == '[' || c == '<')
                .next()
                .unwrap_or_default()
                .to_string();
            flags.push((name, String::new()));
        } else if let Some((_, body)) = flags.last_mut() {
            body.push(' ');
            body.push_str(trimmed);
        }
    }
    flags
}

#[test]
fn the_help_names_the_library_defaults() {
    let cases: &[(&str, &str, String)] = &[
        ("join", "--timeout", short(JoinOptions::DEFAULT_TIMEOUT)),
        (
            "retire",
            "--timeout",
            short(RetireOptions::DEFAULT_SILENCE_TIMEOUT),
        ),
        (
            "retire",
            "--lease-probe-deadline",
            short(LeaseProbe::new("https://x").renew_deadline),
        ),
        (
            "migrate",
            "--join-timeout",
            short(MigrateOptions::new("a", "b").join_timeout),
        ),
        (
            "migrate",
            "--timeout",
            short(MigrateOptions::new("a", "b").silence_timeout),
        ),
        (
            "apply",
            "--try-timeout",
            short(ApplyOptions::DEFAULT_TRY_TIMEOUT),
        ),
        (
            "apply",
            "--reboot-timeout",
            short(ApplyOptions::DEFAULT_REBOOT_TIMEOUT),
        ),
        (
            "apply",
            "--vip-check",
            ApplyOptions::DEFAULT_VIP_CHECK.to_string(),
        ),
        (
            "apply",
            "--kube-check",
            ApplyOptions::DEFAULT_KUBE_CHECK.to_string(),
        ),
        (
            "upgrade",
            "--reboot-timeout",
            short(UpgradeOptions::DEFAULT_REBOOT_TIMEOUT),
        ),
        ("upgrade", "--parallel", "1".into()),
        (
            "defrag",
            "--threshold",
            DefragOptions::DEFAULT_THRESHOLD.to_string(),
        ),
        (
            "restore",
            "--rejoin-timeout",
            short(RestoreOptions::DEFAULT_REJOIN_TIMEOUT),
        ),
    ];
    let mut wrong = Vec::new();
    for (sub, flag, default) in cases {
        let flags = help(sub);
        let Some((_, body)) = flags.iter().find(|(name, _)| name == flag) else {
            wrong.push(format!("ops {sub} --help has no {flag}"));
            continue;
        };
        let said = [
            format!("(default {default})"),
            format!("(default {default};"),
            format!("(default {default},"),
            format!("[default: {default}]"),
        ];
        if !said.iter().any(|s| body.contains(s.as_str())) {
            wrong.push(format!(
                "ops {sub} --help: {flag} must say its default {default}: {body}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn durations_are_written_as_the_manual_writes_them() {
    assert_eq!(short(Duration::from_secs(120)), "2m");
    assert_eq!(short(Duration::from_secs(330)), "5m30s");
    assert_eq!(short(Duration::from_secs(24 * 3600)), "24h");
    assert_eq!(short(Duration::from_millis(10)), "10ms");
}
