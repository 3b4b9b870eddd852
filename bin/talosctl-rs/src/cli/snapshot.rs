//! `etcd snapshot PATH` (verified save) and `snapshot verify PATH`.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Subcommand;
use talos_client::snapshot::{self, SnapshotReport};

use super::{Global, Output, print_structured};

#[derive(Subcommand)]
pub enum SnapshotCommand {
    /// Verify a snapshot file offline: sha256 trailer, bbolt consistency,
    /// etcd status.
    Verify {
        /// The snapshot file.
        path: PathBuf,
    },
}

pub fn run(global: &Global, command: SnapshotCommand) -> anyhow::Result<()> {
    match command {
        SnapshotCommand::Verify { path } => {
            let report = snapshot::verify_file(&path)?;
            if global.output == Output::Table {
                outln!("{}: OK", path.display());
                print_info(&report);
                outln!("{}", verified_line(&report));
                Ok(())
            } else {
                print_structured(global.output, &report)
            }
        }
    }
}

/// talosctl's line (`cmd/talosctl/cmd/talos/etcd.go`, v1.13.9), with its
/// numbers: total keys as etcd 3.6's `etcdutl` counts them (live keys), not
/// etcd 3.4's every-entry count, which only the JSON output carries.
fn print_info(report: &SnapshotReport) {
    outln!(
        "snapshot info: hash {:08x}, revision {}, total keys {}, total size {}",
        report.status.hash,
        report.status.revision,
        report.status.total_keys,
        report.status.total_size
    );
}

fn verified_line(report: &SnapshotReport) -> String {
    format!(
        "verified: sha256 {} matches etcd's trailer; bbolt consistency check passed",
        report.sha256
    )
}

/// A progress bar on a terminal (bytes and rate), nothing otherwise.
fn progress_bar() -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {bytes} received ({bytes_per_sec}) {elapsed}",
        )
        .expect("valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    Some(bar)
}

/// `etcd snapshot PATH`: exactly one node, streamed to `PATH.part`, kept
/// under PATH only once verified.
pub async fn save(global: &Global, path: &Path) -> anyhow::Result<()> {
    let (client, node) = global.connect_one("etcd snapshot")?;
    let stream = client.etcd_snapshot().await?;
    let bar = progress_bar();
    let mut save = snapshot::save(stream);
    if let Some(bar) = bar.clone() {
        save = save.progress(move |bytes| bar.set_position(bytes));
    }
    let saved = save.to(path).await;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let saved = saved?;
    let report = &saved.report;
    if global.output == Output::Table {
        outln!(
            "etcd snapshot saved to {:?} ({} bytes)",
            saved.path.display().to_string(),
            report.size
        );
        print_info(report);
        outln!(
            "{}; facts in {}",
            verified_line(report),
            saved.sidecar.display()
        );
        Ok(())
    } else {
        print_structured(
            global.output,
            &serde_json::json!({
                "node": node,
                "path": saved.path,
                "sidecar": saved.sidecar,
                "snapshot": report,
            }),
        )
    }
}
