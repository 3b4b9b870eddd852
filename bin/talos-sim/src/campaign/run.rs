//! One run's timeline: the operation's process (or the daemon running it)
//! starts, the drawn faults strike at their instants (and end after their
//! hold), a killed operation is resumed (a killed daemon restarted, its
//! recovery resuming), a second admin's operation runs beside it, all
//! within the run's time bound; then what the hosts journaled and what
//! the cluster's ledger holds are gathered for the checks.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::draw::{Draw, FaultKind, OpKind, PlannedFault};
use super::procs::{Ended, Proc, wait_for_socket};
use super::setup::{Host, World, base_args};
use crate::ledger::{Cause, Entry, with_cause};
use crate::node::Power;

/// What a run left for the checks.
pub struct Gathered {
    /// The faults that struck, by name (with their node).
    pub faults: Vec<String>,
    /// Every process the run started, as it ended.
    pub procs: Vec<Ended>,
    /// The operator's journal (`ops list -o json`), newest first.
    pub operator: Vec<serde_json::Value>,
    /// The second admin's journal.
    pub second: Vec<serde_json::Value>,
    /// The cluster's ledger.
    pub ledger: Vec<Entry>,
    /// The run's declared time bound.
    pub bound: Duration,
    /// Whether a process had to be stopped at the bound.
    pub overran: Vec<String>,
    /// Journals that could not be read (the checks then cannot stand).
    pub unreadable: Vec<String>,
}

/// How long a run may take once its operation starts: the operation's
/// own waits as the campaign sets them, with room for resumes.
pub fn bound(draw: &Draw) -> Duration {
    let base = match draw.op {
        OpKind::Snapshot | OpKind::Drill => 60,
        OpKind::Retire => 120,
        OpKind::Migrate | OpKind::Join => 240,
        OpKind::ApplyHarmless | OpKind::ApplyBreaking => 200,
        OpKind::Upgrade => 90 + 100 * draw.nodes as u64,
        OpKind::Defrag => 90,
        OpKind::Restore => 240,
    };
    let kills = draw
        .faults
        .iter()
        .filter(|f| f.kind == FaultKind::Kill)
        .count() as u64;
    Duration::from_secs(base + 60 * kills)
}

/// Something the timeline does at an instant.
#[derive(Debug, Clone)]
enum Action {
    Strike(PlannedFault),
    Thaw(String),
    Heal(String),
    Resume,
    RestartDaemon,
    FreshNode(String),
}

/// The operator's side: the process that runs the operation now.
struct Operator {
    /// The CLI (a run, a resume, or the watcher of the daemon's run).
    proc: Option<Proc>,
    /// The daemon, in the daemon variant.
    daemon: Option<Daemon>,
    /// A resume or a daemon restart is due: the operation is not over.
    pending: bool,
}

struct Daemon {
    proc: Option<Proc>,
    config: PathBuf,
    socket: PathBuf,
}

/// Runs `draw`'s operation (`args`) on `world` with its faults.
pub async fn run(
    world: &World,
    draw: &Draw,
    args: Vec<String>,
    opsd: Option<&PathBuf>,
) -> Gathered {
    let bound = bound(draw);
    let started = Instant::now();
    let deadline = started + bound;
    let mut timeline = Timeline {
        world,
        draw,
        args,
        opsd: opsd.cloned(),
        started,
        procs: Vec::new(),
        seconds: Vec::new(),
        faults: Vec::new(),
        actions: Vec::new(),
        overran: Vec::new(),
        unreadable: Vec::new(),
    };
    let mut operator = timeline.start_operator().await;
    for fault in &draw.faults {
        timeline.actions.push((
            started + Duration::from_millis(fault.at_ms),
            Action::Strike(fault.clone()),
        ));
    }
    timeline.drive(&mut operator, deadline).await;
    timeline.finish(operator, deadline).await;
    let mut unreadable = timeline.unreadable;
    let mut read = |host: &Host, result: Result<Vec<serde_json::Value>, String>| {
        result.unwrap_or_else(|e| {
            unreadable.push(format!("{}: {e}", host.state_dir.display()));
            Vec::new()
        })
    };
    let operator = read(&world.operator, journal(world, &world.operator).await);
    let second = read(&world.second, journal(world, &world.second).await);
    Gathered {
        faults: timeline.faults,
        procs: timeline.procs,
        operator,
        second,
        ledger: world.cluster.ledger().entries(),
        bound,
        overran: timeline.overran,
        unreadable,
    }
}

struct Timeline<'a> {
    world: &'a World,
    draw: &'a Draw,
    args: Vec<String>,
    opsd: Option<PathBuf>,
    started: Instant,
    procs: Vec<Ended>,
    seconds: Vec<Proc>,
    faults: Vec<String>,
    actions: Vec<(Instant, Action)>,
    overran: Vec<String>,
    unreadable: Vec<String>,
}

impl Timeline<'_> {
    fn spawn(
        &self,
        role: &str,
        host: &Host,
        socket: Option<&std::path::Path>,
        args: &[String],
    ) -> Option<Proc> {
        let mut full = base_args(host, socket);
        full.extend(args.iter().cloned());
        Proc::start(&self.world.procs, role, &self.world.talosctl, &full, &[])
            .map_err(|e| tracing::error!("campaign: starting talosctl-rs: {e}"))
            .ok()
    }

    async fn start_operator(&mut self) -> Operator {
        let daemon = match (&self.opsd, self.draw.daemon) {
            (Some(opsd), true) => Some(self.start_daemon(opsd).await),
            _ => None,
        };
        let socket = daemon.as_ref().map(|d| d.socket.clone());
        let proc = self.spawn(
            self.draw.op.name(),
            &self.world.operator,
            socket.as_deref(),
            &self.args,
        );
        Operator {
            proc,
            daemon,
            pending: false,
        }
    }

    async fn start_daemon(&self, opsd: &std::path::Path) -> Daemon {
        let dir = &self.world.dir;
        let socket = dir.join("opsd").join("opsd.sock");
        let _ = std::fs::create_dir_all(dir.join("opsd"));
        let config = dir.join("opsd.toml");
        let text = format!(
            "state_dir = {:?}\nsocket = {:?}\n\n[[cluster]]\nname = \"sim\"\ntalosconfig = {:?}\n",
            self.world.operator.state_dir, socket, self.world.operator.talosconfig
        );
        let _ = std::fs::write(&config, text);
        let mut daemon = Daemon {
            proc: None,
            config,
            socket,
        };
        self.spawn_daemon(&mut daemon, opsd).await;
        daemon
    }

    async fn spawn_daemon(&self, daemon: &mut Daemon, opsd: &std::path::Path) {
        let args = vec!["--config".to_string(), daemon.config.display().to_string()];
        daemon.proc = Proc::start(
            &self.world.procs,
            "talos-opsd",
            opsd,
            &args,
            &[("TALOS_OPSD_LOG", "info".into())],
        )
        .map_err(|e| tracing::error!("campaign: starting talos-opsd: {e}"))
        .ok();
        wait_for_socket(&daemon.socket, Duration::from_secs(30)).await;
    }

    /// Whether the operation is over: nothing runs it and nothing is due.
    async fn operation_over(&self, operator: &mut Operator) -> bool {
        if operator.pending {
            return false;
        }
        if operator.proc.as_mut().is_some_and(Proc::running) {
            return false;
        }
        // The daemon may go on after its watcher left (a restart's
        // recovery): over once its journal shows nothing running (not
        // while it cannot be read).
        if operator.daemon.is_some() {
            return journal(self.world, &self.world.operator)
                .await
                .is_ok_and(|records| !records.iter().any(|r| r["state"] == "running"));
        }
        true
    }

    /// Carries out the actions in time order while the operation lasts.
    async fn drive(&mut self, operator: &mut Operator, deadline: Instant) {
        loop {
            self.actions.sort_by_key(|(at, _)| *at);
            if self.operation_over(operator).await {
                // What is left undoes faults; new ones would hit nothing.
                let rest = std::mem::take(&mut self.actions);
                for (_, action) in rest {
                    if matches!(action, Action::Thaw(_) | Action::Heal(_)) {
                        self.act(action, operator).await;
                    }
                }
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            match self.actions.first() {
                Some((at, _)) if *at <= now => {
                    let (_, action) = self.actions.remove(0);
                    self.act(action, operator).await;
                }
                Some((at, _)) => {
                    let nap = (*at - now).min(Duration::from_millis(100));
                    tokio::time::sleep(nap).await;
                }
                None => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    fn later(&mut self, ms: u64, action: Action) {
        self.actions
            .push((Instant::now() + Duration::from_millis(ms), action));
    }

    async fn act(&mut self, action: Action, operator: &mut Operator) {
        let cluster = &self.world.cluster;
        match action {
            Action::Strike(fault) => self.strike(fault, operator).await,
            Action::Thaw(node) => {
                if let Some(n) = cluster.node(&node) {
                    with_cause(Cause::fault("thaw-etcd"), n.thaw_etcd()).await;
                }
            }
            Action::Heal(node) => {
                let _ = with_cause(Cause::fault("heal"), cluster.heal(&node)).await;
            }
            Action::Resume => {
                operator.pending = false;
                self.resume(operator).await;
            }
            Action::RestartDaemon => {
                operator.pending = false;
                if let (Some(daemon), Some(opsd)) = (operator.daemon.as_mut(), self.opsd.clone()) {
                    cluster.ledger().note_fault("restart-daemon", None);
                    self.spawn_daemon(daemon, &opsd).await;
                }
            }
            Action::FreshNode(node) => {
                let off = cluster.node(&node).is_some_and(|n| n.power() == Power::Off);
                if !off {
                    self.later(200, Action::FreshNode(node));
                    return;
                }
                cluster.ledger().note_fault("fresh-node", Some(&node));
                match with_cause(Cause::fault("fresh-node"), cluster.boot_fresh(&node)).await {
                    Ok(()) => self.faults.push(format!("fresh-node {node}")),
                    Err(e) => tracing::warn!("campaign: fresh node at {node}: {e}"),
                }
            }
        }
    }

    /// `ops resume ID` of the operation a kill interrupted, if one was
    /// journaled and is still running (a kill before the journal had it
    /// leaves nothing to resume).
    async fn resume(&mut self, operator: &mut Operator) {
        let records = match journal(self.world, &self.world.operator).await {
            Ok(records) => records,
            Err(e) => {
                // Not known yet whether there is one: try again shortly.
                tracing::warn!("campaign: before the resume: {e}");
                operator.pending = true;
                self.later(500, Action::Resume);
                return;
            }
        };
        let Some(id) = records
            .iter()
            .find(|r| r["state"] == "running")
            .and_then(|r| r["id"].as_str())
        else {
            return;
        };
        let args = ["resume".to_string(), id.to_string()];
        operator.proc = self.spawn("resume", &self.world.operator, None, &args);
    }

    async fn strike(&mut self, fault: PlannedFault, operator: &mut Operator) {
        let cluster = &self.world.cluster;
        let node_ip = self.world.ip(fault.node).to_string();
        let node_name = self.world.name(fault.node).to_string();
        let name = fault.kind.name();
        let note = |node: Option<&str>| cluster.ledger().note_fault(name, node);
        let cause = Cause::fault(name);
        let struck = match fault.kind {
            FaultKind::Kill => {
                note(None);
                self.kill(operator, fault.hold_ms.min(3_000)).await
            }
            FaultKind::Freeze => {
                note(Some(&node_name));
                let frozen = match cluster.node(&node_name) {
                    Some(n) => with_cause(cause, n.freeze_etcd()).await,
                    None => false,
                };
                if frozen {
                    self.later(fault.hold_ms, Action::Thaw(node_name.clone()));
                }
                frozen
            }
            FaultKind::Partition => {
                note(Some(&node_name));
                let cut = with_cause(cause, cluster.partition(&node_name))
                    .await
                    .unwrap_or(false);
                if cut {
                    self.later(fault.hold_ms, Action::Heal(node_name.clone()));
                }
                cut
            }
            FaultKind::PowerOff => {
                note(Some(&node_name));
                with_cause(cause, cluster.power_off(&node_name))
                    .await
                    .is_ok()
            }
            FaultKind::DelayLeave => {
                let target = self.world.name(self.draw.target).to_string();
                note(Some(&target));
                cluster
                    .node(&target)
                    .map(|n| n.delay_next_leave(Duration::from_millis(fault.hold_ms)))
                    .is_some()
            }
            FaultKind::UpgradeBootsOld | FaultKind::UpgradeNeverBack => {
                note(Some(&node_name));
                let kind = if fault.kind == FaultKind::UpgradeBootsOld {
                    crate::UpgradeFault::BootsOldPartition
                } else {
                    crate::UpgradeFault::NeverComesBack
                };
                cluster.fail_next_upgrade(&node_name, kind).is_ok()
            }
            FaultKind::SecondAdmin => {
                note(None);
                let args: Vec<String> = if fault.retire {
                    vec![
                        "retire".into(),
                        node_ip.clone(),
                        "--timeout".into(),
                        "30s".into(),
                    ]
                } else {
                    vec!["snapshot".into()]
                };
                let proc = self.spawn("second-admin", &self.world.second, None, &args);
                let started = proc.is_some();
                self.seconds.extend(proc);
                started
            }
            FaultKind::FreshNode => {
                let target = self.world.name(self.draw.target).to_string();
                self.later(0, Action::FreshNode(target));
                // Named once it strikes (when the target is off).
                return;
            }
        };
        if struck {
            let on = match fault.kind {
                FaultKind::Kill | FaultKind::SecondAdmin => String::new(),
                FaultKind::DelayLeave => format!(" {}", self.world.name(self.draw.target)),
                _ => format!(" {node_name}"),
            };
            self.faults.push(format!("{name}{on}"));
        }
    }

    /// SIGKILL of what runs the operation; a resume (or the daemon's
    /// restart) follows after `resume_after_ms`.
    async fn kill(&mut self, operator: &mut Operator, resume_after_ms: u64) -> bool {
        if let Some(daemon) = operator.daemon.as_mut() {
            let Some(proc) = daemon.proc.as_mut() else {
                return false;
            };
            if !proc.running() {
                return false;
            }
            proc.kill().await;
            self.procs.push(proc.ended());
            operator.pending = true;
            self.later(resume_after_ms, Action::RestartDaemon);
            return true;
        }
        let Some(mut proc) = operator.proc.take_if(|p| p.running()) else {
            return false;
        };
        proc.kill().await;
        self.procs.push(proc.ended());
        operator.pending = true;
        self.later(resume_after_ms, Action::Resume);
        true
    }

    /// Ends the run: waits for every process up to the deadline (stopping
    /// those still running then), and stops the daemon.
    async fn finish(&mut self, mut operator: Operator, deadline: Instant) {
        let mut all: Vec<Proc> = operator.proc.take().into_iter().collect();
        all.append(&mut self.seconds);
        for mut proc in all {
            if !proc.wait_until(deadline).await {
                self.overran.push(proc.role.clone());
            }
            self.procs.push(proc.ended());
        }
        if let Some(mut daemon) = operator.daemon.take()
            && let Some(mut proc) = daemon.proc.take()
        {
            match journal(self.world, &self.world.operator).await {
                Ok(still) if still.iter().any(|r| r["state"] == "running") => {
                    self.overran.push("talos-opsd".into());
                }
                Ok(_) => {}
                Err(e) => self.unreadable.push(format!("at the bound: {e}")),
            }
            proc.kill().await;
            let mut ended = proc.ended();
            ended.killed = false;
            self.procs.push(ended);
        }
        let _ = self.started;
    }
}

/// A host's journal (`ops list -o json`, read in this process's view of
/// its state directory, never through a daemon), newest first; empty
/// before the host journaled anything.
pub async fn journal(world: &World, host: &Host) -> Result<Vec<serde_json::Value>, String> {
    let mut args = base_args(host, None);
    args.extend(["--local".into(), "list".into()]);
    let out = tokio::process::Command::new(&world.talosctl)
        .args(&args)
        .env_remove("TALOSCONFIG")
        .env_remove("TALOS_OPSD_SOCKET")
        .output()
        .await
        .map_err(|e| format!("{}: {e}", world.talosctl.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("ops list: {}: {}", out.status, stderr.trim()));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        let stdout = String::from_utf8_lossy(&out.stdout);
        format!("ops list: {e}: {} {}", stdout.trim(), stderr.trim())
    })
}
