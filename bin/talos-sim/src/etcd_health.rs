//! The etcd service's health, as machined checks it: a linearizable read
//! of a key from the local member, first `health_initial_delay` after the
//! service starts, then every `health_period`
//! (internal/app/machined/pkg/system/services/etcd.go, HealthFunc and
//! HealthSettings; internal/app/machined/pkg/system/health/check.go, Run;
//! internal/pkg/etcd/etcd.go, ValidateQuorum). Until the first check the
//! health is unknown; a learner, which refuses linearizable reads, stays
//! unhealthy until it is promoted and checked again.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::TalosTiming;
use super::etcd_client::EtcdClient;
use super::etcd_tls::EtcdPki;
use super::node::{ServiceEvent, record_event};

/// The health of a service as its last check left it.
#[derive(Debug, Clone, Default)]
pub(crate) struct HealthState {
    /// No check has run yet.
    pub unknown: bool,
    /// The last check passed.
    pub healthy: bool,
    /// The last check's error, when it failed.
    pub message: String,
    /// When `healthy` last changed.
    pub last_change: Option<SystemTime>,
}

/// The etcd service's health checker: a task while etcd runs.
pub(crate) struct EtcdHealth {
    state: Arc<Mutex<HealthState>>,
    task: Mutex<Option<tokio::task::AbortHandle>>,
}

impl EtcdHealth {
    pub(crate) fn new() -> EtcdHealth {
        EtcdHealth {
            state: Arc::new(Mutex::new(HealthState {
                unknown: true,
                ..HealthState::default()
            })),
            task: Mutex::new(None),
        }
    }

    /// Starts checking the member at `url` on upstream's schedule.
    pub(crate) fn start(
        &self,
        url: String,
        pki: Arc<EtcdPki>,
        timing: TalosTiming,
        events: Arc<Mutex<Vec<ServiceEvent>>>,
    ) {
        self.stop();
        let state = self.state.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(timing.health_initial_delay).await;
            let mut ticker = tokio::time::interval(
                timing
                    .health_period
                    .max(std::time::Duration::from_millis(1)),
            );
            loop {
                ticker.tick().await;
                let outcome = check(&url, &pki, timing).await;
                update(&state, &events, outcome);
            }
        });
        *self.task.lock().expect("health task lock") = Some(task.abort_handle());
    }

    /// Stops checking: the service is down, its health unknown again.
    pub(crate) fn stop(&self) {
        if let Some(task) = self.task.lock().expect("health task lock").take() {
            task.abort();
        }
        let mut state = self.state.lock().expect("health lock");
        *state = HealthState {
            unknown: true,
            last_change: state.last_change,
            ..HealthState::default()
        };
    }

    /// The health as the last check left it.
    pub(crate) fn state(&self) -> HealthState {
        self.state.lock().expect("health lock").clone()
    }

    /// Whether the last check passed.
    pub(crate) fn is_healthy(&self) -> bool {
        self.state.lock().expect("health lock").healthy
    }
}

async fn check(url: &str, pki: &EtcdPki, timing: TalosTiming) -> Result<(), String> {
    let client = EtcdClient::connect(&[url.to_string()], pki)
        .await
        .map_err(|s| s.message().to_string())?;
    let deadline = timing
        .health_timeout
        .max(std::time::Duration::from_millis(100));
    match tokio::time::timeout(deadline, client.get_linearizable(url, b"health", deadline)).await {
        Ok(Ok(())) => Ok(()),
        // Permission denied went through consensus: healthy (ValidateQuorum).
        Ok(Err(s)) if s.code() == tonic::Code::PermissionDenied => Ok(()),
        // As the Go client's error reads: a deadline is the context's.
        Ok(Err(s)) => Err(super::go_errors::EtcdError::from_status(&s).text()),
        Err(_) => Err("context deadline exceeded".to_string()),
    }
}

fn update(
    state: &Mutex<HealthState>,
    events: &Mutex<Vec<ServiceEvent>>,
    outcome: Result<(), String>,
) {
    let mut state = state.lock().expect("health lock");
    let healthy = outcome.is_ok();
    let message = outcome.err().unwrap_or_default();
    let changed = state.unknown || state.healthy != healthy || state.message != message;
    if changed {
        if healthy {
            record_event(events, "Health check successful", "Running");
        } else {
            record_event(events, format!("Health check failed: {message}"), "Running");
        }
    }
    if state.unknown || state.healthy != healthy {
        state.last_change = Some(SystemTime::now());
    }
    state.unknown = false;
    state.healthy = healthy;
    state.message = message;
}
