//! A lock held in a Kubernetes Lease, taken and renewed as client-go's
//! leader election does (k8s.io/client-go tools/leaderelection,
//! `tryAcquireOrRenew`): a Lease is taken only when it is missing,
//! released (no holder), expired or already ours; taking one from another
//! holder adds one to `leaseTransitions`; the holder renews every retry
//! period and counts the lease lost when a renewal keeps failing for the
//! renew deadline. Expiry is judged by this process's own clock: a holder
//! whose record has not changed for a whole lease duration while watched
//! is gone, so clocks need not agree.
//!
//! [`HeldLease::confirm`] is the fencing check: the Lease still names this
//! holder with the transition count it was taken at, and is renewed on
//! the spot, so nobody else can take it for a lease duration.
//!
//! Requests go to the first of several API servers that answers (any of a
//! cluster's control-plane nodes serves the same Lease from etcd), failing
//! over when one refuses, times out or answers 5xx.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{KubeClient, KubeError};

/// How a [`HeldLease`] is taken and renewed (client-go's defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ElectionOptions {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This holder's identity.
    pub holder: String,
    /// `spec.leaseDurationSeconds` (15 s).
    pub lease_duration: Duration,
    /// How long renewals may keep failing before the lease counts as lost
    /// (10 s).
    pub renew_deadline: Duration,
    /// How often it renews and retries (2 s).
    pub retry_period: Duration,
}

impl ElectionOptions {
    /// client-go's timing for `namespace/name`, held as `holder`.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        holder: impl Into<String>,
    ) -> ElectionOptions {
        ElectionOptions {
            namespace: namespace.into(),
            name: name.into(),
            holder: holder.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    fn path(&self) -> String {
        format!(
            "/apis/coordination.k8s.io/v1/namespaces/{}/leases",
            self.namespace
        )
    }

    fn item(&self) -> String {
        format!("{}/{}", self.path(), self.name)
    }
}

/// The Lease as read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseState {
    /// `spec.holderIdentity` (empty: released).
    pub holder: String,
    /// `spec.leaseTransitions`.
    pub transitions: u64,
    /// `spec.renewTime`, as written by its holder.
    pub renew_time: String,
    /// `spec.leaseDurationSeconds`.
    pub lease_duration_s: u64,
    resource_version: String,
}

impl LeaseState {
    fn of(lease: &Value) -> LeaseState {
        let spec = &lease["spec"];
        LeaseState {
            holder: spec["holderIdentity"].as_str().unwrap_or("").to_string(),
            transitions: spec["leaseTransitions"].as_u64().unwrap_or(0),
            renew_time: spec["renewTime"].as_str().unwrap_or("").to_string(),
            lease_duration_s: spec["leaseDurationSeconds"].as_u64().unwrap_or(0),
            resource_version: lease["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        }
    }
}

/// Why a lease was not taken, or no longer is ours.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ElectionError {
    /// Another holder has it and renews it.
    #[error("Lease {lease} is held by {holder} (renewed {renewed}, for {duration_s} s at a time)")]
    Held {
        /// `namespace/name`.
        lease: String,
        /// Its holder's identity.
        holder: String,
        /// When it was last renewed, by its holder's clock.
        renewed: String,
        /// Its lease duration.
        duration_s: u64,
    },
    /// The Lease names another holder or transition count than the one it
    /// was taken with: it was taken away.
    #[error(
        "Lease {lease} was taken over: it names {holder} (transition {transitions}), not {ours} (transition {our_transitions})"
    )]
    TakenOver {
        /// `namespace/name`.
        lease: String,
        /// Who holds it now ("" when released).
        holder: String,
        /// Its transition count now.
        transitions: u64,
        /// This holder.
        ours: String,
        /// The transition count it was taken at.
        our_transitions: u64,
    },
    /// No API server could be asked.
    #[error("Lease {lease}: {source}")]
    Kube {
        /// `namespace/name`.
        lease: String,
        /// The last server's error.
        #[source]
        source: KubeError,
    },
}

/// API servers tried in turn, the one that answered last first.
struct Servers {
    clients: Vec<KubeClient>,
    current: Mutex<usize>,
}

/// Whether a failure says nothing about the Lease (the server did not
/// answer, or failed itself): the next server is asked.
fn unanswered(e: &KubeError) -> bool {
    match e {
        KubeError::Refused { .. } | KubeError::Connect { .. } | KubeError::Timeout { .. } => true,
        other => other.status().is_some_and(|s| s >= 500),
    }
}

impl Servers {
    async fn call<'a, F, Fut>(&'a self, call: F) -> Result<Value, KubeError>
    where
        F: Fn(&'a KubeClient) -> Fut,
        Fut: std::future::Future<Output = Result<Value, KubeError>>,
    {
        let start = *self.current.lock().unwrap_or_else(|e| e.into_inner());
        let mut last = None;
        for offset in 0..self.clients.len() {
            let index = (start + offset) % self.clients.len();
            match call(&self.clients[index]).await {
                Err(e) if unanswered(&e) => last = Some(e),
                answer => {
                    *self.current.lock().unwrap_or_else(|e| e.into_inner()) = index;
                    return answer;
                }
            }
        }
        Err(last.unwrap_or_else(|| KubeError::Config {
            reason: "no API server to ask".into(),
        }))
    }
}

/// A lease held, renewed in the background until [`HeldLease::release`]
/// (or dropped: then it simply expires).
pub struct HeldLease {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for HeldLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLease")
            .field("lease", &self.shared.lease())
            .field("holder", &self.shared.options.holder)
            .field("transitions", &self.shared.transitions)
            .finish_non_exhaustive()
    }
}

struct Shared {
    servers: Servers,
    options: ElectionOptions,
    /// The transition count it was taken at.
    transitions: u64,
    /// The last resource version written or read, and when it was renewed.
    observed: Mutex<(String, Instant)>,
    /// Why it counts as lost, once it does.
    lost: Mutex<Option<String>>,
}

impl Shared {
    fn lease(&self) -> String {
        format!("{}/{}", self.options.namespace, self.options.name)
    }

    fn kube(&self, source: KubeError) -> ElectionError {
        ElectionError::Kube {
            lease: self.lease(),
            source,
        }
    }

    fn body(&self, resource_version: Option<&str>, transitions: u64, acquired: &str) -> Value {
        let now = super::lease::micro_time();
        let mut metadata = json!({
            "name": self.options.name,
            "namespace": self.options.namespace,
        });
        if let Some(rv) = resource_version {
            metadata["resourceVersion"] = json!(rv);
        }
        json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.options.holder,
                "leaseDurationSeconds": self.options.lease_duration.as_secs().max(1),
                "acquireTime": if acquired.is_empty() { now.clone() } else { acquired.to_string() },
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        })
    }

    async fn get(&self) -> Result<Option<(LeaseState, Value)>, KubeError> {
        let path = self.options.item();
        match self.servers.call(|c| c.get(&path)).await {
            Ok(lease) => Ok(Some((LeaseState::of(&lease), lease))),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One renewal: the Lease read, checked to be ours at our transition
    /// count, and written with a new renew time at the version read.
    async fn renew(&self) -> Result<LeaseState, ElectionError> {
        let (state, lease) = self
            .get()
            .await
            .map_err(|e| self.kube(e))?
            .ok_or_else(|| self.taken_over("", 0))?;
        if state.holder != self.options.holder || state.transitions != self.transitions {
            return Err(self.taken_over(&state.holder, state.transitions));
        }
        let acquired = lease["spec"]["acquireTime"].as_str().unwrap_or("");
        let body = self.body(Some(&state.resource_version), self.transitions, acquired);
        let path = self.options.item();
        let written = self
            .servers
            .call(|c| c.put(&path, &body))
            .await
            .map_err(|e| self.kube(e))?;
        let state = LeaseState::of(&written);
        *self.observed.lock().unwrap_or_else(|e| e.into_inner()) =
            (state.resource_version.clone(), Instant::now());
        Ok(state)
    }

    fn taken_over(&self, holder: &str, transitions: u64) -> ElectionError {
        ElectionError::TakenOver {
            lease: self.lease(),
            holder: holder.to_string(),
            transitions,
            ours: self.options.holder.clone(),
            our_transitions: self.transitions,
        }
    }
}

/// What a fencing check saw: the Lease still ours, renewed just now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Confirmed {
    /// The holder it names (ours).
    pub holder: String,
    /// Its transition count (the one it was taken at).
    pub transitions: u64,
    /// The renew time written.
    pub renewed: String,
}

impl HeldLease {
    /// Takes the Lease through the first of `clients` that answers: creates
    /// it when missing, takes it when released, ours or expired (watched
    /// unchanged for its lease duration), or fails naming its holder.
    pub async fn acquire(
        clients: Vec<KubeClient>,
        options: ElectionOptions,
    ) -> Result<HeldLease, ElectionError> {
        let servers = Servers {
            clients,
            current: Mutex::new(0),
        };
        let mut shared = Shared {
            servers,
            options,
            transitions: 0,
            observed: Mutex::new((String::new(), Instant::now())),
            lost: Mutex::new(None),
        };
        take(&mut shared).await?;
        let shared = Arc::new(shared);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(renew_until(Arc::clone(&shared), stopped));
        Ok(HeldLease {
            shared,
            stop,
            task: Mutex::new(Some(task)),
        })
    }

    /// This holder's identity.
    pub fn holder(&self) -> &str {
        &self.shared.options.holder
    }

    /// `namespace/name`.
    pub fn lease(&self) -> String {
        self.shared.lease()
    }

    /// The transition count it was taken at.
    pub fn transitions(&self) -> u64 {
        self.shared.transitions
    }

    /// Why the background renewals count it lost, if they do.
    pub fn lost(&self) -> Option<String> {
        self.shared
            .lost
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The fencing check: reads the Lease, requires this holder and the
    /// transition count it was taken at, and renews it. A lease whose
    /// renewals missed their deadline while nobody took it is ours again.
    pub async fn confirm(&self) -> Result<Confirmed, ElectionError> {
        let state = self.shared.renew().await?;
        *self.shared.lost.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(Confirmed {
            holder: state.holder,
            transitions: state.transitions,
            renewed: state.renew_time,
        })
    }

    /// Stops renewing and releases the Lease as client-go's
    /// `ReleaseOnCancel` does (no holder, a lease of 1 s), when it is still
    /// ours; best effort: an unreleased lease expires by itself.
    pub async fn release(&self) {
        let _ = self.stop.send(true);
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
        let shared = &self.shared;
        let Ok(Some((state, _))) = shared.get().await else {
            return;
        };
        if state.holder != shared.options.holder || state.transitions != shared.transitions {
            return;
        }
        let mut body = shared.body(Some(&state.resource_version), shared.transitions, "");
        body["spec"]["holderIdentity"] = json!("");
        body["spec"]["leaseDurationSeconds"] = json!(1);
        let path = shared.options.item();
        let _ = shared.servers.call(|c| c.put(&path, &body)).await;
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            task.abort();
        }
    }
}

/// client-go's `acquire`: tries every retry period until the Lease is
/// taken, or refuses once a live holder is seen.
async fn take(shared: &mut Shared) -> Result<(), ElectionError> {
    let options = shared.options.clone();
    // Since when the other holder's record has been seen unchanged.
    let mut watched: Option<(String, Instant)> = None;
    loop {
        let current = shared.get().await.map_err(|e| shared.kube(e))?;
        let Some((state, lease)) = current else {
            let body = shared.body(None, 0, "");
            let path = options.path();
            match shared.servers.call(|c| c.post(&path, &body)).await {
                Ok(created) => {
                    shared.transitions = 0;
                    let rv = LeaseState::of(&created).resource_version;
                    *shared.observed.lock().unwrap_or_else(|e| e.into_inner()) =
                        (rv, Instant::now());
                    return Ok(());
                }
                // Created by someone else meanwhile: read it again.
                Err(e) if e.status() == Some(409) => continue,
                Err(e) => return Err(shared.kube(e)),
            }
        };
        let ours = state.holder == options.holder;
        if !ours && !state.holder.is_empty() {
            let duration = Duration::from_secs(state.lease_duration_s.max(1));
            let since = match &watched {
                Some((rv, since)) if *rv == state.resource_version => *since,
                Some(_) => return Err(held(&options, &state)),
                None if fresh(&state, duration) => return Err(held(&options, &state)),
                None => {
                    watched = Some((state.resource_version.clone(), Instant::now()));
                    Instant::now()
                }
            };
            if since.elapsed() < duration {
                tokio::time::sleep(options.retry_period).await;
                continue;
            }
        }
        let transitions = if ours {
            state.transitions
        } else {
            state.transitions + 1
        };
        let acquired = if ours {
            lease["spec"]["acquireTime"].as_str().unwrap_or("")
        } else {
            ""
        };
        let body = shared.body(Some(&state.resource_version), transitions, acquired);
        let path = options.item();
        match shared.servers.call(|c| c.put(&path, &body)).await {
            Ok(written) => {
                shared.transitions = transitions;
                let rv = LeaseState::of(&written).resource_version;
                *shared.observed.lock().unwrap_or_else(|e| e.into_inner()) = (rv, Instant::now());
                return Ok(());
            }
            // Written by someone else in between: look again.
            Err(e) if e.status() == Some(409) => {
                watched = None;
                continue;
            }
            Err(e) => return Err(shared.kube(e)),
        }
    }
}

fn held(options: &ElectionOptions, state: &LeaseState) -> ElectionError {
    ElectionError::Held {
        lease: format!("{}/{}", options.namespace, options.name),
        holder: state.holder.clone(),
        renewed: state.renew_time.clone(),
        duration_s: state.lease_duration_s,
    }
}

/// Whether the holder's own renew time says the lease is still running
/// (by this clock; an unreadable time says nothing).
fn fresh(state: &LeaseState, duration: Duration) -> bool {
    use time::format_description::well_known::Rfc3339;
    let Ok(renewed) = time::OffsetDateTime::parse(&state.renew_time, &Rfc3339) else {
        return false;
    };
    let age = time::OffsetDateTime::now_utc() - renewed;
    age < time::Duration::try_from(duration).unwrap_or(time::Duration::MAX)
}

/// client-go's `renew`: every retry period, a renewal retried until the
/// renew deadline; a round that misses it, or a Lease taken over, marks
/// the lease lost (the renewals go on, so a fencing check can see whether
/// anyone else took it).
async fn renew_until(shared: Arc<Shared>, mut stopped: watch::Receiver<bool>) {
    let options = shared.options.clone();
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            _ = tokio::time::sleep(options.retry_period) => {}
        }
        let round_end = Instant::now() + options.renew_deadline;
        let mut last = String::new();
        let renewed = loop {
            let left = round_end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break false;
            }
            match tokio::time::timeout(left, shared.renew()).await {
                Ok(Ok(_)) => break true,
                Ok(Err(e @ ElectionError::TakenOver { .. })) => {
                    last = e.to_string();
                    break false;
                }
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "no answer within the renew deadline".into(),
            }
            tokio::select! {
                _ = stopped.changed() => return,
                _ = tokio::time::sleep(options.retry_period.min(left)) => {}
            }
        };
        if !renewed {
            *shared.lost.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!(
                "no renewal within the {} s renew deadline: {last}",
                options.renew_deadline.as_secs()
            ));
        }
    }
}
