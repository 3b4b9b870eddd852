//! A stand-in for a leader-elected controller: it holds a Lease and
//! renews it the way client-go's leader election does (leaderelection.go:
//! a renewal is retried every retry period until it succeeds or the renew
//! deadline passes; a renewal that misses its deadline is leadership lost).
//! It counts those failed renewals, so an operation can say whether a
//! controller behind a balancer would have lost its lease (the symptom
//! the field reports on moving the control plane to new machines saw), and keeps renewing afterwards to see when it recovers.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::macros::format_description;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{KubeClient, KubeError};

/// How a [`LeaseRenewer`] renews.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseRenewerOptions {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// The holder identity written in it.
    pub holder: String,
    /// `spec.leaseDurationSeconds` (client-go's default: 15 s).
    pub lease_duration: Duration,
    /// How long a renewal may keep failing before the lease counts as lost
    /// (client-go's default: 10 s).
    pub renew_deadline: Duration,
    /// How often it renews, and retries a failed attempt (client-go's
    /// default: 2 s).
    pub retry_period: Duration,
}

impl LeaseRenewerOptions {
    /// client-go's defaults for `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> LeaseRenewerOptions {
        LeaseRenewerOptions {
            namespace: namespace.into(),
            name: name.into(),
            holder: format!("talos-client-{}", std::process::id()),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// The same with every period divided by `divisor` (for short tests
    /// and demos), never below 50 ms.
    pub fn scaled_down(mut self, divisor: u32) -> LeaseRenewerOptions {
        let scale = |d: Duration| (d / divisor.max(1)).max(Duration::from_millis(50));
        self.lease_duration = scale(self.lease_duration).max(Duration::from_secs(1));
        self.renew_deadline = scale(self.renew_deadline);
        self.retry_period = scale(self.retry_period);
        self
    }
}

/// What a renewer saw.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RenewalStats {
    /// Renewals that succeeded.
    pub renewed: u64,
    /// Renewals that missed their deadline: each one is a lease a
    /// controller would have lost.
    pub failed: u64,
    /// Attempts that failed (a failed attempt retried in time is no failed
    /// renewal).
    pub failed_attempts: u64,
    /// The longest time without a successful renewal, in milliseconds.
    pub longest_gap_ms: u64,
    /// The last attempt's error, if any failed.
    pub last_error: Option<String>,
}

/// A Lease renewed in the background until [`LeaseRenewer::stop`].
#[derive(Debug)]
pub struct LeaseRenewer {
    stats: Arc<Mutex<RenewalStats>>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<Lease>>,
}

impl Drop for LeaseRenewer {
    /// A renewer dropped without [`LeaseRenewer::stop`] stops at once.
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl LeaseRenewer {
    /// Takes the Lease (creating it when missing) and starts renewing it.
    /// Fails when the Lease cannot be taken at all.
    pub async fn start(
        client: KubeClient,
        options: LeaseRenewerOptions,
    ) -> Result<LeaseRenewer, KubeError> {
        let mut lease = Lease {
            client,
            options,
            resource_version: None,
        };
        lease.take().await?;
        let stats = Arc::new(Mutex::new(RenewalStats::default()));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(lease, stats.clone(), stopped));
        Ok(LeaseRenewer {
            stats,
            stop,
            task: Some(task),
        })
    }

    /// What it saw so far.
    pub fn stats(&self) -> RenewalStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits until a renewal round ends after this call (renewed, or
    /// failed past its deadline), or `limit` passes: a check that the Lease
    /// can still be renewed now, as a controller would need to.
    pub async fn next_round(&self, limit: Duration) {
        let rounds = |s: &RenewalStats| s.renewed + s.failed;
        let seen = rounds(&self.stats());
        let deadline = Instant::now() + limit;
        while rounds(&self.stats()) <= seen && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops renewing (a renewal in progress finishes first), deletes the
    /// Lease (best effort: a stale one expires on its own), and returns what
    /// it saw.
    pub async fn stop(mut self) -> RenewalStats {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take()
            && let Ok(lease) = task.await
        {
            let path = format!("{}/{}", lease.path(), lease.options.name);
            let _ = lease.client.delete(&path).await;
        }
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

#[derive(Debug)]
struct Lease {
    client: KubeClient,
    options: LeaseRenewerOptions,
    resource_version: Option<String>,
}

impl Lease {
    fn path(&self) -> String {
        format!(
            "/apis/coordination.k8s.io/v1/namespaces/{}/leases",
            self.options.namespace
        )
    }

    fn body(&self, now: &str) -> Value {
        let mut metadata = json!({
            "name": self.options.name,
            "namespace": self.options.namespace,
        });
        if let Some(rv) = &self.resource_version {
            metadata["resourceVersion"] = json!(rv);
        }
        json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.options.holder,
                "leaseDurationSeconds": self.options.lease_duration.as_secs().max(1),
                "acquireTime": now,
                "renewTime": now,
            },
        })
    }

    fn remember(&mut self, answer: &Value) {
        self.resource_version = answer["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string);
    }

    /// Creates the Lease, or takes the existing one.
    async fn take(&mut self) -> Result<(), KubeError> {
        let now = micro_time();
        match self.client.post(&self.path(), &self.body(&now)).await {
            Ok(answer) => {
                self.remember(&answer);
                Ok(())
            }
            Err(e) if e.status() == Some(409) => self.renew().await,
            Err(e) => Err(e),
        }
    }

    /// One renewal attempt: an update at the last resource version (after
    /// reading it again when someone else wrote in between).
    async fn renew(&mut self) -> Result<(), KubeError> {
        let path = format!("{}/{}", self.path(), self.options.name);
        if self.resource_version.is_none() {
            let current = self.client.get(&path).await?;
            self.remember(&current);
        }
        match self.client.put(&path, &self.body(&micro_time())).await {
            Ok(answer) => {
                self.remember(&answer);
                Ok(())
            }
            Err(e) => {
                if e.status() == Some(409) {
                    self.resource_version = None;
                }
                Err(e)
            }
        }
    }
}

/// Kubernetes' MicroTime: RFC 3339 with microseconds, UTC.
pub(super) fn micro_time() -> String {
    OffsetDateTime::now_utc()
        .format(format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
        ))
        .unwrap_or_default()
}

async fn run(
    mut lease: Lease,
    stats: Arc<Mutex<RenewalStats>>,
    mut stopped: watch::Receiver<bool>,
) -> Lease {
    let retry = lease.options.retry_period;
    let deadline = lease.options.renew_deadline;
    let mut last_success = Instant::now();
    let record = |f: &dyn Fn(&mut RenewalStats)| {
        if let Ok(mut s) = stats.lock() {
            f(&mut s)
        }
    };
    'renewing: loop {
        // The next renewal is due one retry period after the last one.
        tokio::select! {
            _ = stopped.changed() => break 'renewing,
            _ = tokio::time::sleep(retry) => {}
        }
        let round_end = Instant::now() + deadline;
        loop {
            let left = round_end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                record(&|s| s.failed += 1);
                break;
            }
            let error = match tokio::time::timeout(left, lease.renew()).await {
                Ok(Ok(())) => {
                    let gap = last_success.elapsed().as_millis() as u64;
                    last_success = Instant::now();
                    record(&|s| {
                        s.renewed += 1;
                        s.longest_gap_ms = s.longest_gap_ms.max(gap);
                    });
                    break;
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!(
                    "no answer within the {:.1} s renew deadline",
                    deadline.as_secs_f64()
                ),
            };
            record(&|s| {
                s.failed_attempts += 1;
                s.last_error = Some(error.clone());
            });
            let pause = retry.min(round_end.saturating_duration_since(Instant::now()));
            tokio::select! {
                _ = stopped.changed() => break 'renewing,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
    // A failure still going on when it stops counts in the longest gap.
    let gap = last_success.elapsed().as_millis() as u64;
    record(&|s| s.longest_gap_ms = s.longest_gap_ms.max(gap));
    lease
}
