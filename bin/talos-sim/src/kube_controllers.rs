//! What a real control plane has in its API besides what kube-apiserver
//! creates itself, written by the simulator in place of the controllers
//! it does not run: the `default` ServiceAccount of `kube-system` (on a
//! real cluster kube-controller-manager's serviceaccounts controller
//! creates one in every namespace). Gates that mint a token for it
//! (TokenRequest) need it to exist.

use std::time::{Duration, Instant};

use serde_json::json;
use talos_client::kube::{KubeClient, KubeConfig};

use crate::node::Node;

/// How long the API server may take to be ready for it.
const READY_WITHIN: Duration = Duration::from_secs(180);
/// How often it looks again meanwhile.
const POLL: Duration = Duration::from_millis(200);

/// Once `node`'s API server answers, makes sure `kube-system/default`
/// exists (in the background; an existing one is left alone).
pub(crate) fn create_default_accounts(node: &Node) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let Ok(yaml) = crate::kubeconfig::admin_kubeconfig(&node.active_config()) else {
        return;
    };
    let server = format!("https://{}:{}", node.ip, crate::kube_apiserver::PORT);
    let name = node.name.clone();
    runtime.spawn(async move {
        let client = KubeConfig::from_yaml(yaml.as_bytes())
            .and_then(|config| KubeClient::new(&config.with_server(server)));
        let client = match client {
            Ok(client) => client.with_timeout(Duration::from_secs(2)),
            Err(e) => {
                tracing::warn!(node = %name, error = %e, "no client for the default service account");
                return;
            }
        };
        let account = json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": "kube-system"},
        });
        let until = Instant::now() + READY_WITHIN;
        while Instant::now() < until {
            match client
                .post("/api/v1/namespaces/kube-system/serviceaccounts", &account)
                .await
            {
                Ok(_) => return,
                Err(e) if e.status() == Some(409) => return,
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
        tracing::warn!(node = %name, "kube-system/default was not created: the API server never took it");
    });
}
