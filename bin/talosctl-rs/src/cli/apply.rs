//! `talosctl-rs apply-config`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use talos_client::client::{ApplyMode, ApplyRequest};

use super::{Global, Output, Usage, print_nodes, read_input};

#[derive(clap::Args)]
pub struct ApplyArgs {
    /// The filename of the updated configuration.
    #[arg(short, long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Apply config mode: auto, no-reboot, reboot, staged, try.
    #[arg(short, long, default_value = "auto", value_parser = parse_mode)]
    pub mode: ApplyMode,
    /// Check how the config change will be applied in dry-run mode.
    #[arg(long)]
    pub dry_run: bool,
    /// The config will be rolled back after this timeout (try mode).
    #[arg(long, default_value = "1m", value_parser = parse_go_duration)]
    pub timeout: Duration,
    /// Apply to a node in maintenance mode: no client certificate, the
    /// nodes (-n) are the endpoints. The server is not verified unless
    /// --cert-fingerprint is given.
    #[arg(short, long)]
    pub insecure: bool,
    /// With --insecure: accept the node only if its certificate's SPKI
    /// fingerprint (base64 SHA-256, as the node prints it) is this one.
    #[arg(long = "cert-fingerprint", value_name = "FP", requires = "insecure")]
    pub cert_fingerprint: Vec<String>,
}

fn parse_mode(value: &str) -> Result<ApplyMode, String> {
    value
        .parse()
        .map_err(|e: talos_client::client::UnknownVariant| e.to_string())
}

/// Parses a Go duration (`1m`, `30s`, `1m30s`, `1.5s`, `500ms`, `2h`), as
/// talosctl's duration flags take it, through the library's one parser:
/// overflow and negative durations are refused (clap names the flag).
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    talos_client::input::duration("duration", text, talos_client::input::Units::Go)
        .map_err(|e| e.reason)
}

pub async fn run(global: &Global, args: ApplyArgs) -> anyhow::Result<()> {
    let file = args
        .file
        .ok_or_else(|| Usage("no filename supplied for configuration (-f FILE)".into()))?;
    let config = read_input("--file", &file)?;
    if config.is_empty() {
        return Err(Usage(format!(
            "--file {}: no configuration data read",
            file.display()
        ))
        .into());
    }
    let request = ApplyRequest::new(config, args.mode)
        .with_dry_run(args.dry_run)
        .with_try_timeout(args.timeout);
    if args.insecure {
        return apply_insecure(global, request, &args.cert_fingerprint).await;
    }
    let replies = global
        .connect_many()?
        .apply_configuration(request)
        .await
        .context("error applying new configuration")?;
    let output = global.output;
    print_nodes(output, replies, |rows| {
        for (node, result) in rows {
            let prefix = if rows.len() > 1 {
                format!("{node}: ")
            } else {
                String::new()
            };
            for warning in &result.warnings {
                eprintln!("{prefix}WARNING: {warning}");
            }
            if !result.mode_details.is_empty() {
                eprintln!("{prefix}{}", result.mode_details);
            }
        }
        Ok(())
    })?;
    if output == Output::Table && args.mode == ApplyMode::Try && !args.dry_run {
        eprintln!(
            "confirm with a non-try apply (e.g. -m no-reboot) before {} passes, or it rolls back",
            humanize_duration(args.timeout)
        );
    }
    Ok(())
}

/// `--insecure`: each node (-n) is its own endpoint, in maintenance mode.
async fn apply_insecure(
    global: &Global,
    request: ApplyRequest,
    fingerprints: &[String],
) -> anyhow::Result<()> {
    use talos_client::maintenance::MaintenanceClient;
    if global.nodes.is_empty() {
        return Err(Usage("--insecure needs the node to apply to (-n NODE)".into()).into());
    }
    let pins: Vec<&str> = fingerprints.iter().map(String::as_str).collect();
    let mut results = Vec::new();
    for node in &global.nodes {
        let client = if pins.is_empty() {
            MaintenanceClient::dangerous_unverified(node)
        } else {
            MaintenanceClient::pinned(node, &pins)
        }
        .with_context(|| format!("node {node}"))?;
        let result = client
            .apply_configuration(request.clone())
            .await
            .with_context(|| format!("error applying new configuration to {node}"))?;
        if global.output == Output::Table {
            let prefix = if global.nodes.len() > 1 {
                format!("{node}: ")
            } else {
                String::new()
            };
            for warning in &result.warnings {
                eprintln!("{prefix}WARNING: {warning}");
            }
            eprintln!("{prefix}{}", result.mode_details);
        }
        results.push(serde_json::json!({
            "node": node,
            "mode": result.mode,
            "mode_details": result.mode_details,
            "warnings": result.warnings,
        }));
    }
    if global.output != Output::Table {
        super::print_structured(global.output, &results)?;
    }
    Ok(())
}

fn humanize_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 && secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::parse_go_duration;
    use std::time::Duration;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_go_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_go_duration("500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(
            parse_go_duration("1.5s").unwrap(),
            Duration::from_millis(1500)
        );
        assert!(parse_go_duration("10").is_err());
        assert!(parse_go_duration("1x").is_err());
        let e = parse_go_duration("99999999999999999999s").unwrap_err();
        assert!(e.contains("longer than any duration"), "{e}");
    }
}
