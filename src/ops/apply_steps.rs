//! The steps of an apply (`try`, `gate`, `confirm`; `reboot`, `wait-back`
//! when a reboot is allowed), each named `STEP:NODE`, and how a step in
//! flight at a crash is reconciled with the node.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::apply::{
    ApplyFacts, ApplyOptions, ApplyPhase, ApplyStep, DryRun, no_changes, read_config, read_planned,
    try_dry_run,
};
use super::apply_kube::{GateFailed, SKIPPED_KUBE_CHECK};
use super::apply_vip::check_vips;
use super::config_diff::Documents;
use super::fresh::{Guard, Guarded};
use super::plan::label;
use super::{Ops, OpsError, Outcome};
use crate::client::resources::ConfigId;
use crate::client::{ApplyMode, ApplyRequest};

/// The kernel's id of the current boot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// How long after the try window a rollback must be visible.
const ROLLBACK_GRACE: Duration = Duration::from_secs(30);
/// How often the gate and the waits look again.
const POLL: Duration = Duration::from_millis(250);
/// The fewest passes in a row that make a gate pass, whatever the soak.
const MIN_PASSES: u32 = 3;

/// What the gate asks Kubernetes.
enum KubeGate {
    /// Nothing (a worker, no API server, or the check is off).
    Off,
    /// Its API server is ready.
    Ready,
    /// Ready, and the token minted before the change still authenticates.
    Token(String),
}

/// The gate's checks beyond the node and etcd: the VIPs of a changed
/// `Layer2VIPConfig`, and what it asks Kubernetes.
#[derive(Clone, Copy)]
struct GateExtras<'a> {
    vips: &'a [String],
    kube: &'a KubeGate,
    /// The API server must have started after this (ms since the epoch):
    /// the change restarts it with new service-account flags.
    restarted_after: Option<u64>,
}

/// What every apply step needs: the file read again (checked against its
/// planned hash) and the options.
struct Params<'a> {
    config: Vec<u8>,
    options: &'a ApplyOptions,
}

impl<'a> Params<'a> {
    fn load(options: &'a ApplyOptions, facts: &ApplyFacts) -> Result<Params<'a>, OpsError> {
        Ok(Params {
            config: read_planned(&facts.config_path, &facts.config_sha256)?,
            options,
        })
    }

    /// Time kept free at the end of the try window for the confirmation.
    fn confirm_margin(&self) -> Duration {
        (self.options.try_timeout / 5).clamp(Duration::from_secs(1), Duration::from_secs(15))
    }

    /// How long the gate must hold, pass after pass, before it counts: a
    /// third of the try window.
    fn soak(&self) -> Duration {
        self.options.try_timeout / 3
    }
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// An RFC 3339 time as ms since the epoch (now when it does not parse).
fn rfc3339_ms(text: Option<&str>) -> u64 {
    text.and_then(|t| {
        time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
    })
    .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as u64)
    .unwrap_or_else(now_ms)
}

/// Time left until `deadline_ms` (zero when past).
fn left(deadline_ms: u64) -> Duration {
    Duration::from_millis(deadline_ms.saturating_sub(now_ms()))
}

fn step_name(phase: &str, node: &str) -> String {
    label(phase, Some(node))
}

impl Ops {
    pub(super) async fn apply_step(
        &mut self,
        options: &ApplyOptions,
        step: &ApplyStep,
        facts: &mut ApplyFacts,
        guard: &mut Guard<'_>,
    ) -> Result<Outcome, OpsError> {
        let params = Params::load(options, facts)?;
        let node = step.node.as_str();
        match step.phase {
            ApplyPhase::Try => self.try_apply(node, &params, facts, guard).await,
            ApplyPhase::Gate => self.gate(node, &params, facts).await,
            ApplyPhase::Confirm => self.confirm(node, &params, guard).await,
            ApplyPhase::Reboot => self.reboot_apply(node, &params, facts, guard).await,
            ApplyPhase::WaitBack => self.wait_back(node, &params, facts).await,
        }
    }

    /// A step of an apply that was in flight at a crash (journaled as
    /// started at `started`): `try` is done when the node runs the file (a
    /// TRY dry run reports no changes), otherwise sent again; `confirm` and
    /// `reboot` are done when the node persisted the file (if the reboot
    /// was not journaled, `wait-back` counts from the reboot step's start).
    pub(super) async fn reconcile_apply(
        &mut self,
        options: &ApplyOptions,
        step: &ApplyStep,
        facts: &mut ApplyFacts,
        started: Option<&str>,
    ) -> Result<Option<Outcome>, OpsError> {
        let params = Params::load(options, facts)?;
        let node = step.node.as_str();
        match step.phase {
            ApplyPhase::Try => {
                let runs_it = matches!(
                    try_dry_run(&self.client, node, &params.config).await?,
                    DryRun::InPlace(s) if no_changes(&s)
                );
                if !runs_it {
                    return Ok(None);
                }
                // The try was sent after its step was journaled as started,
                // so that time plus the window is no later than the node's
                // rollback.
                let deadline = rfc3339_ms(started) + options.try_timeout.as_millis() as u64;
                facts.try_deadline_ms.entry(node.into()).or_insert(deadline);
                Ok(Some(Outcome::done(format!(
                    "the try had reached {node} before the interruption: it runs the file"
                ))))
            }
            ApplyPhase::Confirm | ApplyPhase::Reboot if self.persisted(node, &params).await? => {
                if step.phase == ApplyPhase::Reboot {
                    facts
                        .reboot_sent_ms
                        .entry(node.into())
                        .or_insert(rfc3339_ms(started));
                }
                Ok(Some(Outcome::done(format!(
                    "{node} had persisted the file before the interruption"
                ))))
            }
            _ => Ok(None),
        }
    }

    async fn try_apply(
        &mut self,
        node: &str,
        params: &Params<'_>,
        facts: &mut ApplyFacts,
        guard: &mut Guard<'_>,
    ) -> Result<Outcome, OpsError> {
        if let Ok(boot) = self.boot_id(node).await {
            facts.boot_ids.insert(node.into(), boot);
        }
        let kube_note = match params.options.kube_check {
            true => {
                self.kube_before(node, &params.config, params.options.try_timeout, facts)
                    .await?
            }
            false => {
                facts
                    .kube_check
                    .insert(node.into(), SKIPPED_KUBE_CHECK.into());
                format!("; {SKIPPED_KUBE_CHECK}")
            }
        };
        let fresh = guard.proof(self).await?;
        // The node starts its rollback timer after this instant, so the
        // deadline counted from here is never later than the rollback.
        let sent = now_ms();
        let request = ApplyRequest::new(params.config.clone(), ApplyMode::Try)
            .with_try_timeout(params.options.try_timeout);
        let result = self
            .send_apply(fresh, &self.client.node(node), request)
            .await?;
        if result.mode != ApplyMode::Try {
            return Err(OpsError::step(
                &step_name("try", node),
                format!(
                    "{node} applied the file in mode {} instead of try",
                    result.mode
                ),
            ));
        }
        let deadline = sent + params.options.try_timeout.as_millis() as u64;
        facts.try_deadline_ms.insert(node.into(), deadline);
        Ok(Outcome::done(format!(
            "{node} runs the file on trial: {}{kube_note}",
            result.mode_details.replace('\n', "; ")
        )))
    }

    /// The health gate, retried until it passes or the try window (less the
    /// time kept for the confirmation) runs out; on failure nothing more is
    /// sent and the rollback is verified.
    async fn gate(
        &mut self,
        node: &str,
        params: &Params<'_>,
        facts: &mut ApplyFacts,
    ) -> Result<Outcome, OpsError> {
        let deadline =
            *super::plan::need(&facts.try_deadline_ms.get(node).copied(), "try_deadline_ms")?;
        let gate_end = deadline.saturating_sub(params.confirm_margin().as_millis() as u64);
        let vips = facts.vips.get(node).map(Vec::as_slice).unwrap_or_default();
        // From here on the gate's end is on the monotonic clock: a wall
        // clock stepped during the window moves nothing.
        let gate_until = Instant::now() + left(gate_end);
        let soak = params.soak();
        let tried = Documents::parse(&params.config)
            .map_err(|e| OpsError::step(&step_name("gate", node), e))?;
        let boot = facts.boot_ids.get(node).cloned();
        let boot = boot.as_deref();
        let kube = match facts.kube_check.get(node).map(String::as_str) {
            Some("token") => match self.kube_tokens.get(node) {
                Some(token) => KubeGate::Token(token.clone()),
                // Minted by a run that ended (a crash, a daemon restart):
                // readiness is still checked.
                None => KubeGate::Ready,
            },
            _ => KubeGate::Off,
        };
        // A change that drops an issuer, audience or key, let through by
        // allow_issuer_change, is shown harmless by the lost token alone:
        // without it the change is not confirmed and rolls back.
        let unverifiable = match (&kube, facts.sa_loss_allowed.get(node)) {
            (KubeGate::Ready, Some(loss)) => Some(format!(
                "{node}'s change stops accepting {} (allowed), and the service-account token minted before it was lost with the run that stopped: nothing can show that tokens issued so far still authenticate, so the change is not confirmed; apply it again to check it with a new token, or with --skip-kube-check to confirm it unchecked",
                loss.join("; ")
            )),
            _ => None,
        };
        let restarted_after = facts.kube_started_ms.get(node).copied();
        let mut attempts = 0;
        let gate_started = Instant::now();
        // The first pass of the current run of passes, and how many.
        let mut streak: Option<(Instant, u32)> = None;
        let mut failure = String::new();
        let reason = loop {
            if let Some(why) = &unverifiable {
                break why.clone();
            }
            attempts += 1;
            let started = Instant::now();
            let budget = gate_until.saturating_duration_since(started);
            let pass = match tokio::time::timeout(
                budget,
                self.gate_once(
                    node,
                    params,
                    &tried,
                    boot,
                    GateExtras {
                        vips,
                        kube: &kube,
                        restarted_after,
                    },
                    budget,
                ),
            )
            .await
            {
                Ok(Ok(summary)) if Instant::now() <= gate_until => Ok(summary),
                Ok(Ok(_)) => Err("a pass ended after the gate's end".to_string()),
                // No later pass can say otherwise: the gate fails now,
                // and the rest of the window is the node's rollback.
                Ok(Err(GateFailed {
                    reason,
                    definitive: true,
                })) => {
                    break format!(
                        "{reason} (a definitive answer, {:.1} s into the gate at attempt {attempts}: the gate ends at once)",
                        gate_started.elapsed().as_secs_f64()
                    );
                }
                Ok(Err(GateFailed { reason, .. })) => Err(reason),
                // A pass the gate's end cut short says nothing new: the
                // reason an earlier pass failed stands.
                Err(_) if !failure.is_empty() => Err(format!(
                    "{failure} (the last pass was cut short by the gate's end)"
                )),
                Err(_) => Err(format!(
                    "a pass did not end within the {:.1} s left",
                    budget.as_secs_f64()
                )),
            };
            match pass {
                Ok(summary) => {
                    let (since, passes) = streak.get_or_insert((started, 0));
                    *passes += 1;
                    let held = since.elapsed();
                    if *passes >= MIN_PASSES && held >= soak {
                        return Ok(Outcome::done(format!(
                            "passed {passes} times in a row over {:.1} s (attempt {attempts}): {summary}",
                            held.as_secs_f64()
                        )));
                    }
                    failure = format!(
                        "it held {passes} passes over {:.1} s, not the {:.1} s soak",
                        held.as_secs_f64(),
                        soak.as_secs_f64()
                    );
                }
                Err(reason) => {
                    streak = None;
                    failure = reason;
                }
            }
            if gate_until.saturating_duration_since(Instant::now()) <= POLL {
                break failure;
            }
            tokio::time::sleep(POLL).await;
        };
        let rollback = self.verify_rollback(node, params, deadline).await;
        Err(OpsError::step(
            &step_name("gate", node),
            match rollback {
                Ok(()) => format!(
                    "the health gate failed: {reason}; nothing more was sent and {node} rolled back to its previous configuration (verified)"
                ),
                Err(state) => format!(
                    "the health gate failed: {reason}; nothing more was sent, but {node} did NOT show its previous configuration within {} s of the try window: {state}",
                    ROLLBACK_GRACE.as_secs()
                ),
            },
        ))
    }

    /// One pass of the gate (with the VIP check of `vips`, when any); the
    /// error says what failed.
    async fn gate_once(
        &self,
        node: &str,
        params: &Params<'_>,
        tried: &Documents,
        boot: Option<&str>,
        extra: GateExtras<'_>,
        budget: Duration,
    ) -> Result<String, GateFailed> {
        let GateExtras {
            vips,
            kube,
            restarted_after,
        } = extra;
        let target = self.client.node(node);
        target
            .version()
            .await
            .map_err(|e| format!("{node} does not answer: {e}"))?;
        if let Some(before) = boot {
            let now = self
                .boot_id(node)
                .await
                .map_err(|e| format!("{node}'s boot id cannot be read: {e}"))?;
            if now != before {
                return Err(format!(
                    "{node} rebooted inside the try window (boot id {before} is now {now})"
                )
                .into());
            }
        }
        // A node that rebooted (or rolled back) inside the window runs its
        // previous configuration: a pass on that would confirm a file that
        // was never tried.
        let running = read_config(&self.client, node, ConfigId::Active)
            .await
            .map_err(|e| format!("{node}'s running configuration cannot be read: {e}"))?;
        let running = Documents::parse(&running)
            .map_err(|e| format!("{node}'s running configuration does not parse: {e}"))?;
        let drift = running.changed_paths(tried);
        if !drift.is_empty() {
            return Err(format!(
                "{node} no longer runs the tried file (it rebooted or rolled back): {}",
                drift.join(", ")
            )
            .into());
        }
        let view = self
            .read_view()
            .await
            .map_err(|e| format!("the etcd members cannot be read: {e}"))?;
        if !view.disagreements.is_empty() {
            return Err(format!(
                "the members' lists disagree: {}",
                view.disagreements.join("; ")
            )
            .into());
        }
        if let Some(m) = view.members.iter().find(|m| m.is_learner) {
            return Err(format!("{} is still a learner", m.hostname).into());
        }
        if let Some(m) = view.members.iter().find(|m| !view.healthy(m.id)) {
            return Err(format!(
                "etcd member {} is unhealthy: {}",
                m.hostname,
                view.unhealthy_reason(m.id)
            )
            .into());
        }
        let services = target
            .service_list()
            .await
            .map_err(|e| format!("{node}'s services cannot be read: {e}"))?;
        let bad: Vec<String> = services.iter().filter_map(|s| s.problem()).collect();
        if !bad.is_empty() {
            return Err(format!("{node}'s services are not healthy: {}", bad.join(", ")).into());
        }
        let mut summary = format!(
            "{node} answers; {} etcd members healthy; {} services running",
            view.members.len(),
            services.len()
        );
        match kube {
            KubeGate::Off => {}
            KubeGate::Ready => {
                let ready =
                    super::apply_kube::gate(&self.client, node, None, restarted_after).await?;
                summary.push_str(&format!(
                    "; {ready} (no token check: the token was minted by an earlier run)"
                ));
            }
            KubeGate::Token(token) => {
                let checked =
                    super::apply_kube::gate(&self.client, node, Some(token), restarted_after)
                        .await?;
                summary.push_str(&format!("; {checked}"));
            }
        }
        if !vips.is_empty() {
            let held = check_vips(&self.client, &view, vips).await?;
            summary.push_str(&format!("; {held}"));
        }
        if let Some(cmd) = &params.options.check {
            run_check(cmd, node, budget).await?;
            summary.push_str(&format!("; `{cmd}` exited 0"));
        }
        Ok(summary)
    }

    /// Waits for the try window to close and checks that the node runs its
    /// persisted (previous) configuration again: its `v1alpha1` matches its
    /// `persistent` one (saved before the try, which never touches it) and
    /// no longer the tried file.
    async fn verify_rollback(
        &self,
        node: &str,
        params: &Params<'_>,
        deadline: u64,
    ) -> Result<(), String> {
        let previous = read_config(&self.client, node, ConfigId::Persistent)
            .await
            .map_err(|e| format!("its persisted configuration cannot be read: {e}"))?;
        let previous = Documents::parse(&previous)
            .map_err(|e| format!("its persisted configuration does not parse: {e}"))?;
        let tried = Documents::parse(&params.config).ok();
        tokio::time::sleep(left(deadline)).await;
        let until = Instant::now() + ROLLBACK_GRACE;
        let mut last = String::from("not checked");
        while Instant::now() < until {
            match read_config(&self.client, node, ConfigId::Active).await {
                Ok(running) => match Documents::parse(&running) {
                    Ok(running) if running.changed_paths(&previous).is_empty() => return Ok(()),
                    Ok(running)
                        if tried
                            .as_ref()
                            .is_some_and(|t| running.changed_paths(t).is_empty()) =>
                    {
                        last = "it still runs the tried file".into()
                    }
                    Ok(_) => {
                        last =
                            "it runs neither the tried file nor its persisted configuration".into()
                    }
                    Err(e) => last = format!("its running configuration does not parse: {e}"),
                },
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(POLL).await;
        }
        Err(last)
    }

    /// The confirmation, once its check found the TRY of the file pending
    /// (same boot, the file running, the window open).
    async fn confirm(
        &mut self,
        node: &str,
        params: &Params<'_>,
        guard: &mut Guard<'_>,
    ) -> Result<Outcome, OpsError> {
        let step = step_name("confirm", node);
        let request = ApplyRequest::new(params.config.clone(), ApplyMode::NoReboot);
        let fresh = match guard.verdict(self).await? {
            Guarded::Fresh(fresh) => fresh,
            Guarded::Done(saw) => {
                return Ok(Outcome::done(format!(
                    "{saw}; nothing was sent (check try-pending)"
                )));
            }
        };
        self.send_apply(fresh, &self.client.node(node), request)
            .await?;
        if !self.persisted(node, params).await? {
            return Err(OpsError::step(
                &step,
                format!(
                    "{node} answered the confirmation but its persisted configuration is not the file"
                ),
            ));
        }
        Ok(Outcome::done(format!(
            "{node} persisted the file; its try rollback is cancelled"
        )))
    }

    /// Whether the node's persisted configuration (COSI `MachineConfigs`
    /// `persistent`) is the file (by content).
    async fn persisted(&self, node: &str, params: &Params<'_>) -> Result<bool, OpsError> {
        let current = read_config(&self.client, node, ConfigId::Persistent).await?;
        let (Ok(current), Ok(file)) =
            (Documents::parse(&current), Documents::parse(&params.config))
        else {
            return Ok(false);
        };
        Ok(current.changed_paths(&file).is_empty())
    }

    async fn reboot_apply(
        &mut self,
        node: &str,
        params: &Params<'_>,
        facts: &mut ApplyFacts,
        guard: &mut Guard<'_>,
    ) -> Result<Outcome, OpsError> {
        if let Ok(boot) = self.boot_id(node).await {
            facts.boot_ids.insert(node.into(), boot);
        }
        let fresh = guard.proof(self).await?;
        facts.reboot_sent_ms.insert(node.into(), now_ms());
        let request = ApplyRequest::new(params.config.clone(), ApplyMode::Reboot);
        let result = self
            .send_apply(fresh, &self.client.node(node), request)
            .await?;
        Ok(Outcome::done(format!(
            "{node}: {}",
            result.mode_details.replace('\n', "; ")
        )))
    }

    /// Waits until the node has booted since the reboot was sent (its etcd
    /// service started after that time: reads are retried through a short
    /// outage, so not answering is no proof), holds the file, and passes
    /// the gate.
    async fn wait_back(
        &self,
        node: &str,
        params: &Params<'_>,
        facts: &ApplyFacts,
    ) -> Result<Outcome, OpsError> {
        let since = *super::plan::need(&facts.reboot_sent_ms.get(node).copied(), "reboot_sent_ms")?;
        let vips = facts.vips.get(node).map(Vec::as_slice).unwrap_or_default();
        let applied = Documents::parse(&params.config)
            .map_err(|e| OpsError::step(&step_name("wait-back", node), e))?;
        let started = Instant::now();
        let until = started + params.options.reboot_timeout;
        let mut last = String::from("not answering yet");
        while Instant::now() < until {
            let before = facts.boot_ids.get(node).map(String::as_str);
            match self.booted_since(node, since, before).await {
                Ok(true) => match self
                    .gate_once(
                        node,
                        params,
                        &applied,
                        None,
                        GateExtras {
                            vips,
                            kube: &KubeGate::Off,
                            restarted_after: None,
                        },
                        until - Instant::now(),
                    )
                    .await
                {
                    Ok(summary) if self.persisted(node, params).await.unwrap_or(false) => {
                        return Ok(Outcome::done(format!(
                            "back after {} ms with the file: {summary}",
                            started.elapsed().as_millis()
                        )));
                    }
                    Ok(_) => last = format!("{node} is back but does not hold the file"),
                    Err(failed) => last = failed.reason,
                },
                Ok(false) => last = format!("{node} has not rebooted yet"),
                Err(e) => last = format!("{node}: {e}"),
            }
            tokio::time::sleep(POLL).await;
        }
        Err(OpsError::step(
            &step_name("wait-back", node),
            format!(
                "{node} not back and healthy within {} s: {last}",
                params.options.reboot_timeout.as_secs()
            ),
        ))
    }

    /// Whether the node's etcd service started after `since_ms`: a
    /// `Waiting` or `Preparing` event, which only a start records (health
    /// check results are recorded in the `Running` state, and one may come
    /// after the reboot was sent but before the node went down).
    /// The node's boot id, read from the node.
    pub(super) async fn boot_id(&self, node: &str) -> Result<String, crate::Error> {
        use futures::StreamExt as _;
        let mut stream = self.client.node(node).read(BOOT_ID).await?;
        let mut text = Vec::new();
        while let Some(chunk) = stream.next().await {
            text.extend_from_slice(&chunk?);
        }
        Ok(String::from_utf8_lossy(&text).trim().to_string())
    }

    /// Whether the node booted since the reboot was sent: by its boot id
    /// when one was read before, else by its etcd service's events.
    async fn booted_since(
        &self,
        node: &str,
        since_ms: u64,
        boot_before: Option<&str>,
    ) -> Result<bool, crate::Error> {
        if let Some(before) = boot_before {
            return Ok(self.boot_id(node).await? != before);
        }
        let services = self.client.node(node).service_list().await?;
        let since = time::OffsetDateTime::UNIX_EPOCH + Duration::from_millis(since_ms);
        Ok(services.iter().filter(|s| s.id == "etcd").any(|s| {
            s.events.iter().any(|e| {
                e.ts.is_some_and(|ts| ts > since)
                    && matches!(e.state.as_str(), "Waiting" | "Preparing")
            })
        }))
    }
}

/// Runs the user's check through `sh -c` with `TALOS_NODE` set; it must
/// exit 0 within `budget`.
async fn run_check(cmd: &str, node: &str, budget: Duration) -> Result<(), String> {
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("TALOS_NODE", node)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(budget.max(Duration::from_millis(100)), child).await {
        Err(_) => return Err(format!("`{cmd}` did not finish within the try window")),
        Ok(Err(e)) => return Err(format!("`{cmd}` could not run: {e}")),
        Ok(Ok(output)) => output,
    };
    if output.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(if output.stderr.is_empty() {
        &output.stdout
    } else {
        &output.stderr
    })
    .lines()
    .last()
    .unwrap_or_default()
    .to_string();
    Err(format!(
        "`{cmd}` failed ({}){}",
        output.status,
        if said.is_empty() {
            String::new()
        } else {
            format!(": {said}")
        }
    ))
}
