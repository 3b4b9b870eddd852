//! The apply gate's Kubernetes check: before a control-plane node gets the
//! file, a service-account token is minted (TokenRequest for
//! `kube-system/default`) and the node's API server's `/readyz` recorded;
//! in the gate, the node's API server must be ready again and still
//! accept that token (SelfSubjectReview). A change of the service-account
//! issuer, audiences or key that the configuration guard did not catch (or
//! was told to allow) is then caught before the confirmation: the token
//! every pod holds is rejected, and the node rolls back.
//!
//! The admin kubeconfig comes from the node (MachineService Kubeconfig)
//! and the token stays in memory: neither is written anywhere.

use std::net::IpAddr;
use std::time::Duration;

use super::MachineRole;
use super::OpsError;
use crate::Client;
use crate::kube::{KubeClient, KubeConfig, KubeError};

/// The service account whose token the check mints (every cluster has
/// it: kube-controller-manager creates `default` in each namespace).
pub(crate) const NAMESPACE: &str = "kube-system";
pub(crate) const ACCOUNT: &str = "default";
/// The user that token authenticates as.
const USER: &str = "system:serviceaccount:kube-system:default";
/// How long each Kubernetes request may take.
const TIMEOUT: Duration = Duration::from_secs(5);
/// How long an API server that answers may take to be ready before the
/// change.
const READY_WAIT: Duration = Duration::from_secs(30);
/// What an apply journals for a node whose Kubernetes check was skipped.
pub(crate) const SKIPPED_KUBE_CHECK: &str = "the Kubernetes check was skipped (--skip-kube-check)";
/// The shortest token the API server issues.
const MIN_TOKEN_LIFETIME: Duration = Duration::from_secs(600);

/// `https://ADDRESS:6443`.
fn api_server_url(node: &str) -> String {
    match node.parse::<IpAddr>() {
        Ok(IpAddr::V6(ip)) => format!("https://[{ip}]:6443"),
        _ => format!("https://{node}:6443"),
    }
}

/// What the check found before the change.
pub(crate) enum Before {
    /// The API server is ready and minted this token.
    Token(String),
    /// No check for this node, and why: a worker, or no API server
    /// listening on any control-plane node (no Kubernetes).
    Skipped(String),
    /// Kubernetes is there but the check cannot be made (no kubeconfig
    /// served, not ready, no answer in time, a TLS failure, no token, this
    /// node's API server refusing connections while another's accepts):
    /// the change is not sent.
    Refused(String),
}

/// The node's admin kubeconfig, pointed at its own API server.
async fn admin_config(client: &Client, node: &str) -> Result<KubeConfig, String> {
    let yaml = client
        .node(node)
        .kubeconfig()
        .await
        .map_err(|e| format!("{node} serves no kubeconfig ({e})"))?;
    Ok(KubeConfig::from_yaml(&yaml)
        .map_err(|e| format!("{node}'s kubeconfig: {e}"))?
        .with_server(api_server_url(node)))
}

/// Before the change on `node` (of `role`): `/readyz`, then a token valid
/// for `lifetime` (at least the API server's minimum). `control_plane`
/// are the cluster's control-plane nodes: a refused connection counts as
/// "no Kubernetes" only when every one of them refuses.
pub(crate) async fn before(
    client: &Client,
    node: &str,
    role: MachineRole,
    control_plane: &[String],
    lifetime: Duration,
) -> Before {
    if !role.runs_api_server() {
        return Before::Skipped(format!("{node} is a worker: it runs no API server"));
    }
    // Kubernetes is asked first: a kubeconfig the node cannot serve says
    // nothing about whether Kubernetes is there.
    let kube = match admin_config(client, node).await {
        Ok(config) => match KubeClient::new(&config) {
            Ok(kube) => kube.with_timeout(TIMEOUT),
            Err(e) => return Before::Refused(e.to_string()),
        },
        Err(why) => {
            return match listening(node, control_plane).await {
                None => Before::Skipped(format!(
                    "no Kubernetes API server listens on any control-plane node ({why})"
                )),
                Some(_) => Before::Refused(format!(
                    "{why}, while Kubernetes is there: its token cannot be minted"
                )),
            };
        }
    };
    // An API server that answers but is not ready yet (it restarted a
    // moment ago) is given a while; one that does not answer at all (no
    // Kubernetes on this node) is not waited for.
    let until = tokio::time::Instant::now() + READY_WAIT;
    loop {
        match kube.readyz().await {
            Ok(r) if r.is_ready() => break,
            Ok(r) if tokio::time::Instant::now() >= until => {
                return Before::Refused(format!(
                    "{node}'s API server was not ready within {} s before the change ({}: {})",
                    READY_WAIT.as_secs(),
                    r.status,
                    first_line(&r.body)
                ));
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            Err(KubeError::Refused { .. }) => {
                return match listening(node, control_plane).await {
                    None => Before::Skipped(format!(
                        "no Kubernetes API server listens on {node}:6443 nor on any other control-plane node"
                    )),
                    Some(other) => Before::Refused(format!(
                        "{node}'s API server refuses connections while {other}'s accepts them: Kubernetes is there, but {node}'s cannot be checked before the change"
                    )),
                };
            }
            Err(e) => {
                return Before::Refused(format!(
                    "{node}'s API server cannot be checked before the change: {e}"
                ));
            }
        }
    }
    match kube
        .token_request(NAMESPACE, ACCOUNT, lifetime.max(MIN_TOKEN_LIFETIME))
        .await
    {
        Ok(token) => Before::Token(token),
        Err(e) => Before::Refused(format!(
            "no token for {NAMESPACE}/{ACCOUNT} from {node}'s API server: {e}"
        )),
    }
}

/// The first of `node` and `others` whose port 6443 accepts a connection
/// (anything but a refused connection counts: an API server that does not
/// answer in time is still there).
async fn listening(node: &str, others: &[String]) -> Option<String> {
    let hosts = std::iter::once(node.to_string()).chain(others.iter().cloned());
    let mut seen = std::collections::BTreeSet::new();
    for host in hosts.filter(|h| seen.insert(h.clone())) {
        let address = api_server_url(&host);
        let address = address.trim_start_matches("https://");
        let connect = tokio::net::TcpStream::connect(address);
        match tokio::time::timeout(TIMEOUT, connect).await {
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => continue,
            _ => return Some(host),
        }
    }
    None
}

/// When the node's API server process started (ms since the epoch), read
/// before the change when the change alters its service-account flags.
pub(crate) async fn started_ms(client: &Client, node: &str) -> Result<u64, String> {
    let config = admin_config(client, node).await?;
    let kube = KubeClient::new(&config)
        .map_err(|e| e.to_string())?
        .with_timeout(TIMEOUT);
    start_ms(&kube, node).await
}

async fn start_ms(kube: &KubeClient, node: &str) -> Result<u64, String> {
    let seconds = kube
        .process_start_time()
        .await
        .map_err(|e| format!("{node}'s API server's start time cannot be read: {e}"))?;
    Ok((seconds * 1000.0).round() as u64)
}

/// Why a gate's Kubernetes check failed. A definitive failure cannot pass
/// later in the try window: the API server that runs the change (restarted
/// with it, when it alters the service-account flags) is ready and rejects
/// the token minted before the change.
pub(crate) struct GateFailed {
    /// What failed.
    pub reason: String,
    /// Whether waiting longer can change it.
    pub definitive: bool,
}

impl From<String> for GateFailed {
    fn from(reason: String) -> GateFailed {
        GateFailed {
            reason,
            definitive: false,
        }
    }
}

/// In the gate: the API server is ready and accepts `token` (when there
/// is one); when `restarted_after` is given (the change alters the
/// service-account flags), its process started later than that, so the
/// checks reach the API server that runs the new flags and not the old one,
/// which answers until kubelet restarts the static pod. A summary, or what
/// failed.
pub(crate) async fn gate(
    client: &Client,
    node: &str,
    token: Option<&str>,
    restarted_after: Option<u64>,
) -> Result<String, GateFailed> {
    let config = admin_config(client, node).await?;
    let kube = KubeClient::new(&config)
        .map_err(|e| e.to_string())?
        .with_timeout(TIMEOUT);
    if let Some(before) = restarted_after {
        let now = start_ms(&kube, node).await?;
        if now <= before {
            return Err(format!(
                "{node}'s API server still runs from before the change (started {}): the new service-account flags are not in effect until kubelet restarts it",
                started_text(now)
            )
            .into());
        }
    }
    let ready = kube
        .readyz()
        .await
        .map_err(|e| format!("{node}'s API server does not answer: {e}"))?;
    if !ready.is_ready() {
        return Err(format!(
            "{node}'s API server is not ready ({}: {})",
            ready.status,
            first_line(&ready.body)
        )
        .into());
    }
    let Some(token) = token else {
        return Ok(format!("{node}'s API server is ready"));
    };
    let bearer = KubeClient::new(&config.with_bearer_token(token))
        .map_err(|e| e.to_string())?
        .with_timeout(TIMEOUT);
    match bearer.self_subject_review().await {
        Ok(user) if user == USER => Ok(format!(
            "{node}'s API server is ready and still accepts the token minted before the change"
        )),
        Ok(user) => Err(format!(
            "the token minted before the change authenticates as {user:?}, not {USER:?}"
        )
        .into()),
        // The API server running the change is ready and says no: no
        // later pass in the window can say otherwise.
        Err(KubeError::Unauthorized { .. }) => Err(GateFailed {
            reason: format!(
                "{node}'s API server{} rejects the service-account token minted before the change (401 Unauthorized): the change breaks every token issued so far (its issuer, audiences or key changed); pin them (cluster.apiServer.extraArgs service-account-issuer and api-audiences on 1.13, a KubeServiceAccountConfig on 1.14)",
                if restarted_after.is_some() {
                    ", restarted with the change,"
                } else {
                    ""
                }
            ),
            definitive: true,
        }),
        Err(e) => Err(format!("the token check failed: {e}").into()),
    }
}

impl super::Ops {
    /// The Kubernetes check before `node`'s change: a token minted (kept
    /// in memory) and, when the change restarts the API server, its start
    /// time; or why the node has none. Refuses (nothing sent) where
    /// Kubernetes is there but cannot be checked.
    pub(super) async fn kube_before(
        &mut self,
        node: &str,
        config: &[u8],
        try_timeout: Duration,
        facts: &mut super::ApplyFacts,
    ) -> Result<String, OpsError> {
        let refused = |why: String| {
            OpsError::step(
                &super::plan::label("try", Some(node)),
                format!(
                    "{why}; nothing was sent (--skip-kube-check applies without the Kubernetes check)"
                ),
            )
        };
        let role = super::config_diff::Documents::parse(config)
            .map(|d| super::MachineRole::of(&d))
            .map_err(|e| OpsError::step(&super::plan::label("try", Some(node)), e))?;
        let control_plane = self.control_plane_hosts().await;
        // Valid through the whole window, with time to spare.
        let lifetime = try_timeout + Duration::from_secs(300);
        match before(&self.client, node, role, &control_plane, lifetime).await {
            Before::Token(token) => {
                if facts.sa_changes.contains(node) {
                    // The gate waits for a later start: the restart with
                    // the new flags.
                    let started = started_ms(&self.client, node).await.map_err(refused)?;
                    facts.kube_started_ms.insert(node.into(), started);
                }
                self.kube_tokens.insert(node.into(), token);
                facts.kube_check.insert(node.into(), "token".into());
                Ok(format!(
                    "; a token of {NAMESPACE}/{ACCOUNT} minted for the gate"
                ))
            }
            Before::Skipped(why) => {
                let note = format!("; no Kubernetes check: {why}");
                facts.kube_check.insert(node.into(), why);
                Ok(note)
            }
            Before::Refused(why) => Err(refused(why)),
        }
    }

    /// The control-plane nodes: the etcd members' addresses and the
    /// talosconfig's endpoints (best effort: a member list that cannot be
    /// read leaves the endpoints).
    async fn control_plane_hosts(&self) -> Vec<String> {
        let mut hosts = self.endpoint_hosts();
        if let Ok(members) = self.client.etcd_member_list(false).await {
            hosts.extend(members.iter().filter_map(super::cluster::member_address));
        }
        hosts.sort();
        hosts.dedup();
        hosts
    }
}

/// `ms` since the epoch as RFC 3339.
fn started_text(ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .map(crate::tls::rfc3339)
        .unwrap_or_else(|_| format!("{ms} ms after the epoch"))
}

/// The failing checks of a `/readyz` answer (its `[-]` lines), or its
/// first line.
fn first_line(text: &str) -> String {
    let failing: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("[-]"))
        .map(|l| l.split_whitespace().next().unwrap_or(l))
        .collect();
    if failing.is_empty() {
        text.lines().next().unwrap_or("").to_string()
    } else {
        format!("failing: {}", failing.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::first_line;

    #[test]
    fn a_readyz_answer_names_its_failing_checks() {
        let body = "[+]ping ok\n[-]etcd failed: reason withheld\n[+]log ok\n[-]etcd-readiness failed: reason withheld\nreadyz check failed";
        assert_eq!(first_line(body), "failing: etcd, etcd-readiness");
        assert_eq!(first_line("ok"), "ok");
    }
}
