//! Stand-ins for leader-elected controllers (kube-controller-manager,
//! kube-scheduler, an operator): each renews its own Lease on its own
//! connection, the way client-go's leader election does, through an
//! endpoint such as a node's KubePrism. Run by `talos-sim controllers`,
//! the demo and the benchmark, so a handover can be judged by what it
//! cost them: a failed renewal is a lease a controller lost.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use talos_client::kube::{KubeClient, KubeConfig, LeaseRenewer, LeaseRenewerOptions, RenewalStats};

/// Controllers renewing through one endpoint.
pub struct Controllers {
    through: String,
    renewers: Vec<(String, LeaseRenewer)>,
}

impl Controllers {
    /// Starts `count` controllers for the cluster whose configuration is
    /// `DIR/controlplane.yaml`, through `through` (default: the first
    /// node's KubePrism, `https://ENDPOINT_HOST:7445`, its certificate
    /// checked as `localhost`), renewing every fifth of `renew_deadline`.
    /// Waits (up to `ready_within`) for the API to take their Leases.
    pub async fn start(
        dir: &Path,
        through: Option<&str>,
        count: usize,
        renew_deadline: Duration,
        ready_within: Duration,
    ) -> Result<Controllers, String> {
        let path = dir.join("controlplane.yaml");
        let config =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let yaml =
            crate::kubeconfig::admin_kubeconfig(&config).map_err(|e| e.message().to_string())?;
        let admin = KubeConfig::from_yaml(yaml.as_bytes()).map_err(|e| e.to_string())?;
        let through = match through {
            Some(url) => url.trim_end_matches('/').to_string(),
            None => {
                let host = crate::kube_apiserver::endpoint_host(admin.server());
                format!("https://{host}:7445")
            }
        };
        let config = admin
            .with_server(through.clone())
            .with_tls_server_name("localhost");
        let until = Instant::now() + ready_within;
        let mut renewers = Vec::new();
        for i in 1..=count {
            let name = format!("controller-{i}");
            let mut options = LeaseRenewerOptions::new("kube-system", name.clone());
            options.renew_deadline = renew_deadline;
            options.retry_period = renew_deadline / 5;
            options.lease_duration = (renew_deadline * 3 / 2).max(Duration::from_secs(1));
            let renewer = loop {
                let client = KubeClient::new(&config)
                    .map_err(|e| e.to_string())?
                    .with_timeout(renew_deadline);
                match LeaseRenewer::start(client, options.clone()).await {
                    Ok(renewer) => break renewer,
                    Err(e) if Instant::now() >= until => {
                        return Err(format!(
                            "{name} cannot take its Lease through {through}: {e}"
                        ));
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
                }
            };
            renewers.push((name, renewer));
        }
        Ok(Controllers { through, renewers })
    }

    /// The endpoint they renew through.
    pub fn through(&self) -> &str {
        &self.through
    }

    /// Stops them; what each saw, and the sums, as JSON.
    pub async fn stop(self) -> Value {
        let mut total = RenewalStats::default();
        let mut each = Vec::new();
        for (name, renewer) in self.renewers {
            let stats = renewer.stop().await;
            total.renewed += stats.renewed;
            total.failed += stats.failed;
            total.failed_attempts += stats.failed_attempts;
            total.longest_gap_ms = total.longest_gap_ms.max(stats.longest_gap_ms);
            each.push(json!({"lease": format!("kube-system/{name}"), "renewals": stats}));
        }
        json!({
            "through": self.through,
            "controllers": each,
            "renewed": total.renewed,
            "failed_renewals": total.failed,
            "failed_attempts": total.failed_attempts,
            "longest_gap_ms": total.longest_gap_ms,
        })
    }
}
