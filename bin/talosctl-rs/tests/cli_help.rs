//! The help an operator reads first: `ops --help` names every operation
//! (its first lines are what `talosctl-rs --help` shows for `ops`), and
//! the top level lists talosctl's maintenance commands.

use talos_test_support::cli::binary;

fn help(args: &[&str]) -> String {
    let out = std::process::Command::new(binary())
        .args(args)
        .output()
        .expect("the CLI runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands a help text lists (first word of each line indented by
/// two spaces under `Commands:`).
fn commands(text: &str) -> Vec<String> {
    text.split("Commands:\n")
        .nth(1)
        .unwrap_or_default()
        .lines()
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .map(|w| w.trim_end_matches(',').to_string())
        .filter(|w| w != "help")
        .collect()
}

#[test]
fn ops_help_names_every_operation() {
    let text = help(&["ops", "--help"]);
    let about: String = text.split("\n\nUsage:").next().unwrap().replace('\n', " ");
    let listed = commands(&text);
    assert!(listed.len() >= 14, "{text}");
    let words: Vec<&str> = about
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '-')
        .collect();
    let missing: Vec<&String> = listed
        .iter()
        .filter(|c| !words.contains(&c.as_str()))
        .collect();
    assert!(missing.is_empty(), "not named in {about:?}: {missing:?}");
}

#[test]
fn the_maintenance_commands_are_listed() {
    let listed = commands(&help(&["--help"]));
    for command in [
        "logs",
        "events",
        "dmesg",
        "service",
        "containers",
        "image",
        "reboot",
        "shutdown",
        "bootstrap",
    ] {
        assert!(
            listed.iter().any(|c| c == command),
            "{command} not in {listed:?}"
        );
    }
    let etcd = commands(&help(&["etcd", "--help"]));
    assert!(etcd.iter().any(|c| c == "downgrade"), "{etcd:?}");
    let downgrade = commands(&help(&["etcd", "downgrade", "--help"]));
    assert_eq!(downgrade, ["validate", "enable", "cancel"]);
}
