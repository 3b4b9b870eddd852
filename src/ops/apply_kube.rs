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
    /// No check for this node, and why (a worker, no API server listening).
    Skipped(String),
    /// An API server is there but the check cannot be made (not ready, no
    /// answer in time, TLS failure, no token): the change is not sent.
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

/// Before the change: `/readyz`, then a token valid for `lifetime` (at
/// least the API server's minimum).
pub(crate) async fn before(client: &Client, node: &str, lifetime: Duration) -> Before {
    let config = match admin_config(client, node).await {
        Ok(config) => config,
        Err(why) => return Before::Skipped(why),
    };
    let kube = match KubeClient::new(&config) {
        Ok(kube) => kube.with_timeout(TIMEOUT),
        Err(e) => return Before::Refused(e.to_string()),
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
            // Nothing listens: no Kubernetes on this node.
            Err(KubeError::Refused { .. }) => {
                return Before::Skipped(format!("no Kubernetes API server listens on {node}:6443"));
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
) -> Result<String, String> {
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
            ));
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
        ));
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
        )),
        Err(KubeError::Unauthorized { .. }) => Err(format!(
            "{node}'s API server rejects the service-account token minted before the change (401 Unauthorized): the change breaks every token issued so far (its issuer, audiences or key changed); pin them (cluster.apiServer.extraArgs service-account-issuer and api-audiences on 1.13, a KubeServiceAccountConfig on 1.14)"
        )),
        Err(e) => Err(format!("the token check failed: {e}")),
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
