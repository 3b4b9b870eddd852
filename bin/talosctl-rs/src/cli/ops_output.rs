//! How `talosctl-rs ops` shows plans, progress, records and lists: the
//! same for an operation run in this process and one run by talos-opsd.

use std::io::{IsTerminal as _, Write as _};

use anyhow::bail;
use talos_client::ops::{Event, OpRecord, RiskReport, StepState, age_text};
use talos_opsd_api::PlanView;

use super::{Global, Output, print_structured};

/// `NAME` or `NAME NODE`.
fn label(name: &str, node: Option<&str>) -> String {
    match node {
        Some(node) => format!("{name} {node}"),
        None => name.to_string(),
    }
}

/// The plan on stderr (and with `-o json|yaml` on stdout when only the
/// plan was asked for).
pub(super) fn show_plan(plan: &PlanView) {
    eprintln!("plan ({} steps):", plan.steps.len());
    for (i, step) in plan.steps.iter().enumerate() {
        let mark = if step.destructive {
            " [changes the cluster]"
        } else {
            ""
        };
        eprintln!(
            "  {}. {}: {}{mark}",
            i + 1,
            label(&step.name, step.node.as_deref()),
            step.description
        );
    }
    for note in &plan.notes {
        eprintln!("note: {note}");
    }
}

/// `--plan`: the plan alone, structured on stdout when asked.
pub(super) fn print_plan(global: &Global, plan: &PlanView) -> anyhow::Result<()> {
    if global.output != Output::Table {
        print_structured(global.output, plan)?;
    }
    Ok(())
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

/// Step-by-step progress on stderr.
pub(super) fn progress(event: Event<'_>) {
    let point = match event {
        Event::Started { id } => {
            eprintln!("operation {id}");
            None
        }
        Event::StepStarted {
            index, name, node, ..
        } => {
            let step = label(name, node);
            eprintln!("[{}] {step} ...", index + 1);
            Some(format!("started:{step}"))
        }
        Event::StepChecked { name, node, .. } => Some(format!("checked:{}", label(name, node))),
        Event::StepAnswered { name, node, .. } => Some(format!("answered:{}", label(name, node))),
        Event::StepEnded {
            index,
            name,
            node,
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
                "[{}] {} {word} in {duration_ms} ms: {detail}",
                index + 1,
                label(name, node)
            );
            None
        }
        _ => None,
    };
    #[cfg(feature = "test-hooks")]
    if let Some(point) = point {
        crash_hook(&point);
    }
    #[cfg(not(feature = "test-hooks"))]
    let _ = point;
}

/// `TALOSCTL_RS_TEST_CRASH=started:STEP`, `checked:STEP` (a destructive
/// step's check held, nothing sent yet) or `answered:STEP` (STEP as
/// labelled: `leave`, `try NODE`) aborts the process at that point, as a
/// crash would (for the crash-safety tests). Only in a build with the
/// `test-hooks` feature, which release builds leave off.
#[cfg(feature = "test-hooks")]
fn crash_hook(point: &str) {
    if std::env::var("TALOSCTL_RS_TEST_CRASH").is_ok_and(|crash| crash == point) {
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
    if let Some(lock) = &record.cluster_lock {
        outln!("cluster lock: {lock}");
    }
    for step in &record.steps {
        let took = step
            .duration_ms
            .map(|d| format!(" in {d} ms"))
            .unwrap_or_default();
        outln!(
            "  {}. {:<12} {:?}{took}{}",
            step.index + 1,
            step.label(),
            step.state,
            step.detail
                .as_deref()
                .map(|d| format!(": {d}"))
                .unwrap_or_default()
        );
        if let Some(fence) = &step.fence {
            outln!(
                "     fenced: the cluster lock held by {} (transition {}), renewed {}",
                fence.holder,
                fence.transitions,
                fence.renewed
            );
        }
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
            step.label(),
            step.started.as_deref().unwrap_or("?")
        );
    }
    Ok(())
}

pub(super) fn list(global: &Global, records: Vec<OpRecord>) -> anyhow::Result<()> {
    if global.output != Output::Table {
        return print_structured(global.output, &records);
    }
    let mut table = super::table::Table::new(&[
        "ID",
        "KIND",
        "STATE",
        "CREATED",
        "AT STEP",
        "CLUSTER LOCK HOLDER",
    ]);
    for r in records {
        let at = r
            .in_flight()
            .or_else(|| r.steps.iter().find(|s| s.state == StepState::Failed))
            .map(|s| s.label())
            .unwrap_or_default();
        let holder = match &r.cluster_lock {
            Some(talos_client::ops::ClusterLockRecord::Held { holder, .. }) => holder.clone(),
            Some(_) => "none (--without-cluster-lock)".into(),
            None => String::new(),
        };
        table.row(vec![
            r.id.clone(),
            r.kind.clone(),
            format!("{:?}", r.state),
            r.created.clone(),
            at,
            holder,
        ]);
    }
    out!("{}", table.render());
    Ok(())
}

/// The risk report: structured, or the findings worst first, then what was
/// read.
pub(super) fn print_report(global: &Global, report: &RiskReport) -> anyhow::Result<()> {
    if global.output != Output::Table {
        return print_structured(global.output, report);
    }
    outln!(
        "context {:?}: {} ({} finding{})",
        report.context,
        report.level.name().to_uppercase(),
        report.findings.len(),
        if report.findings.len() == 1 { "" } else { "s" }
    );
    for f in &report.findings {
        outln!("  {:<8} {:<16} {}", f.level.name(), f.check, f.message);
    }
    let backup = |b: &Option<talos_client::ops::BackupSeen>| match b {
        Some(b) => format!(
            "{} old ({}, op {})",
            age_text(b.age_seconds),
            b.location,
            b.op
        ),
        None => "none".into(),
    };
    outln!("backup on this host: {}", backup(&report.backup_on_host));
    outln!("backup off this host: {}", backup(&report.backup_off_host));
    match &report.drill {
        Some(d) => outln!(
            "last drill: {} {} ago (op {})",
            if d.ok { "succeeded" } else { "FAILED" },
            age_text(d.age_seconds),
            d.op
        ),
        None => outln!("last drill: none"),
    }
    let mut table = super::table::Table::new(&[
        "MEMBER", "ID", "ROLE", "TALOS", "ETCD", "DB", "OF QUOTA", "NODE",
    ]);
    for m in &report.members {
        table.row(vec![
            m.name.clone(),
            m.id.clone(),
            if m.learner { "learner" } else { "voter" }.into(),
            m.talos_version.clone().unwrap_or_else(|| "-".into()),
            m.etcd_version.clone().unwrap_or_else(|| "-".into()),
            m.db_size.map_or("-".into(), |s| s.to_string()),
            m.quota_share
                .map_or("-".into(), |s| format!("{:.1}%", s * 100.0)),
            if m.node_behind {
                "yes".into()
            } else {
                format!("no: {}", m.detail.as_deref().unwrap_or("?"))
            },
        ]);
    }
    out!("{}", table.render());
    for c in &report.certificates {
        outln!(
            "certificate {} ({}): expires {} ({})",
            c.purpose,
            c.roles.join(","),
            c.not_after,
            if c.remaining_seconds < 0 {
                "expired".to_string()
            } else {
                format!("in {}", age_text(c.remaining_seconds as u64))
            }
        );
    }
    let lock = &report.lock;
    outln!(
        "cluster lock: {}{}{}",
        lock.state,
        lock.holder
            .as_deref()
            .map(|h| format!(" by {h}"))
            .unwrap_or_default(),
        lock.detail
            .as_deref()
            .map(|d| format!(" ({d})"))
            .unwrap_or_default()
    );
    Ok(())
}
