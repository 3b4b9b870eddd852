//! A run's world: its simulated cluster, the admin hosts' talosconfigs
//! and state directories, and what its operation needs before it starts
//! (a new machine for a join, free space for a defragmentation, a
//! snapshot and a cluster without etcd for a restore, a stored backup for
//! a drill), and the operation's command line.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use talos_client::Client;
use talos_client::config::{Context, Overrides, TalosConfig};

use super::Options;
use super::draw::{Draw, OpKind};
use crate::ledger::{Cause, with_cause};
use crate::pki::LeafSpec;
use crate::{Cluster, SimConfig, TalosTiming, TalosVersion};

/// The certificate subject of each admin host the campaign plays, as the
/// ledger records callers: the operator's host (its CLI and its daemon),
/// a second admin host, and the campaign's own preparation.
pub const OPERATOR: &str = "campaign-operator";
/// See [`OPERATOR`].
pub const SECOND_ADMIN: &str = "campaign-second-admin";
/// See [`OPERATOR`].
pub const PREPARATION: &str = "campaign-preparation";

/// The installer image upgrades go to (the simulator's registry has it).
const UPGRADE_IMAGE: &str = "ghcr.io/siderolabs/installer:v1.14.0";

/// One admin host: its talosconfig, state directory and certificate.
#[derive(Debug, Clone)]
pub struct Host {
    /// Its talosconfig.
    pub talosconfig: PathBuf,
    /// Its state directory.
    pub state_dir: PathBuf,
    /// Its certificate's subject, as the ledger writes it.
    pub subject: String,
}

/// A run's cluster and hosts.
pub struct World {
    /// The simulated cluster.
    pub cluster: Cluster,
    /// The run's directory.
    pub dir: PathBuf,
    /// Where the processes' output goes.
    pub procs: PathBuf,
    /// The operator's host.
    pub operator: Host,
    /// The second admin host.
    pub second: Host,
    /// The campaign's own preparation.
    pub preparation: Host,
    /// A client with the preparation's certificate.
    pub client: Client,
    /// Control-plane addresses and names, in order.
    pub control_plane: Vec<(String, String)>,
    /// The `talosctl-rs` binary.
    pub talosctl: PathBuf,
}

/// An error while preparing a run: the campaign's, not the operation's.
pub type SetupError = String;

impl World {
    /// Starts the cluster `draw` asks for under `dir`, writes the hosts'
    /// talosconfigs and waits until etcd and Kubernetes are ready.
    pub async fn start(dir: &Path, draw: &Draw, options: &Options) -> Result<World, SetupError> {
        let procs = dir.join("procs");
        std::fs::create_dir_all(&procs).map_err(|e| format!("{}: {e}", procs.display()))?;
        let mut cfg = SimConfig::isolated(dir.join("cluster"), draw.nodes);
        cfg.workers = draw.workers;
        cfg.talos_version = draw.version;
        cfg.timing = TalosTiming::scaled_down(options.timing_divisor);
        if draw.op == OpKind::Restore {
            // The nodes wait to join from their boot until the restore
            // gives them a cluster: upstream's own limits.
            cfg.timing.join_limit = TalosTiming::UPSTREAM.join_limit;
            cfg.timing.promote_limit = TalosTiming::UPSTREAM.promote_limit;
        }
        cfg.kube_apiserver = options.kube_apiserver.clone();
        let cluster = Cluster::up(cfg)
            .await
            .map_err(|e| format!("starting the cluster: {e}"))?;
        let control_plane: Vec<(String, String)> = cluster
            .nodes()
            .into_iter()
            .filter(|n| !n.worker)
            .map(|n| (n.ip.to_string(), n.name))
            .collect();
        let host = |name: &str, cn: &str| -> Result<Host, SetupError> {
            let talosconfig = dir.join(format!("talosconfig-{name}"));
            write_talosconfig(&cluster, &talosconfig, cn)?;
            let state_dir = dir.join(format!("state-{name}"));
            std::fs::create_dir_all(&state_dir).map_err(|e| e.to_string())?;
            Ok(Host {
                talosconfig,
                state_dir,
                subject: format!("CN={cn},O=os:admin"),
            })
        };
        let operator = host("operator", OPERATOR)?;
        let second = host("second", SECOND_ADMIN)?;
        let preparation = host("preparation", PREPARATION)?;
        let client = client_of(&preparation.talosconfig)?;
        let world = World {
            cluster,
            dir: dir.to_path_buf(),
            procs,
            operator,
            second,
            preparation,
            client,
            control_plane,
            talosctl: options.talosctl.clone(),
        };
        world.write_controlplane().await?;
        world.wait_ready(Duration::from_secs(240)).await?;
        Ok(world)
    }

    /// The control-plane configuration the runs use (joins, applies):
    /// the simulator's; where a 1.14 one carries no service-account key
    /// (neither a `KubeServiceAccountConfig` document nor
    /// `cluster.serviceAccount`, so that its API servers would not start),
    /// with the key under `cluster.serviceAccount`, applied to every
    /// control-plane node there first.
    async fn write_controlplane(&self) -> Result<(), SetupError> {
        let dir = self.cluster.dir();
        let read =
            |p: PathBuf| std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()));
        let mut config = read(dir.join("controlplane.yaml"))?;
        let has_key = config.contains("kind: KubeServiceAccountConfig")
            || config.contains("  serviceAccount:\n");
        if self.cluster.config().talos_version.at_least_1_14()
            && self.cluster.config().kube_apiserver.is_some()
            && !has_key
        {
            use base64::Engine as _;
            let key = read(dir.join("pki/service-account.key"))?;
            let key = base64::engine::general_purpose::STANDARD.encode(key);
            config = config.replacen(
                "  etcd:\n",
                &format!("  serviceAccount:\n    key: {key}\n  etcd:\n"),
                1,
            );
            for (ip, name) in &self.control_plane {
                let request = talos_client::client::ApplyRequest::new(
                    config.clone(),
                    talos_client::client::ApplyMode::NoReboot,
                );
                with_cause(
                    Cause::fault("campaign preparation"),
                    self.client.node(ip.as_str()).apply_configuration(request),
                )
                .await
                .map_err(|e| format!("giving {name} its service-account key: {e}"))?;
            }
        }
        let path = self.controlplane();
        std::fs::write(&path, config).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The control-plane configuration the runs use.
    pub fn controlplane(&self) -> PathBuf {
        self.dir.join("controlplane.yaml")
    }

    /// The address of control-plane node `i` (from 1).
    pub fn ip(&self, i: usize) -> &str {
        &self.control_plane[i - 1].0
    }

    /// The name of control-plane node `i` (from 1).
    pub fn name(&self, i: usize) -> &str {
        &self.control_plane[i - 1].1
    }

    /// The name of the node at `address` (or named so).
    pub fn name_of(&self, address: &str) -> Option<String> {
        self.cluster.node(address).map(|n| n.name.clone())
    }

    /// Waits until every control-plane node's etcd service is healthy and
    /// every API server ready, with `kube-system/default` made.
    async fn wait_ready(&self, limit: Duration) -> Result<(), SetupError> {
        let deadline = Instant::now() + limit;
        for (ip, name) in &self.control_plane {
            let node = self.client.node(ip.as_str());
            poll(
                deadline,
                &format!("{name}'s etcd to be healthy"),
                || async {
                    let services = node.service_list().await.ok()?;
                    services
                        .into_iter()
                        .find(|s| s.id == "etcd" && s.health.healthy)
                        .map(|_| ())
                },
            )
            .await?;
            if self.cluster.config().kube_apiserver.is_none() {
                continue;
            }
            let kube = self.kube(ip).await?;
            poll(deadline, &format!("{name}'s API server"), || async {
                kube.readyz()
                    .await
                    .ok()
                    .filter(|r| r.is_ready())
                    .map(|_| ())
            })
            .await?;
            poll(deadline, "kube-system/default", || async {
                kube.get("/api/v1/namespaces/kube-system/serviceaccounts/default")
                    .await
                    .ok()
                    .map(|_| ())
            })
            .await?;
        }
        Ok(())
    }

    async fn kube(&self, ip: &str) -> Result<talos_client::kube::KubeClient, SetupError> {
        let yaml = self
            .client
            .node(ip)
            .kubeconfig()
            .await
            .map_err(|e| format!("kubeconfig of {ip}: {e}"))?;
        let config = talos_client::kube::KubeConfig::from_yaml(&yaml)
            .map_err(|e| e.to_string())?
            .with_server(format!("https://{ip}:6443"));
        talos_client::kube::KubeClient::new(&config).map_err(|e| e.to_string())
    }

    /// What the operation needs before it starts; returns its `ops`
    /// arguments (after `ops --state-dir D --yes`).
    pub async fn prepare(&self, draw: &Draw) -> Result<Vec<String>, SetupError> {
        let cause = Cause::fault("campaign preparation");
        with_cause(cause, self.prepare_in_scope(draw)).await
    }

    async fn prepare_in_scope(&self, draw: &Draw) -> Result<Vec<String>, SetupError> {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let target = self.ip(draw.target).to_string();
        Ok(match draw.op {
            OpKind::Snapshot => s(&["snapshot"]),
            OpKind::Retire => s(&["retire", &target, "--timeout", "30s"]),
            OpKind::Migrate | OpKind::Join => {
                let new = self
                    .cluster
                    .add_maintenance_node()
                    .await
                    .map_err(|e| format!("adding a maintenance node: {e}"))?;
                let fingerprint = new.maintenance_fingerprint.clone().unwrap_or_default();
                let config = self.controlplane().display().to_string();
                let mut args = if draw.op == OpKind::Join {
                    s(&["join", &new.api, "--timeout", "90s"])
                } else {
                    s(&["migrate", "--from", &target, "--to", &new.api])
                };
                args.extend(s(&[
                    "--config",
                    &config,
                    "--cert-fingerprint",
                    &fingerprint,
                ]));
                if draw.op == OpKind::Migrate {
                    args.extend(s(&["--join-timeout", "90s", "--timeout", "30s"]));
                }
                args
            }
            OpKind::ApplyHarmless | OpKind::ApplyBreaking => self.apply_args(draw)?,
            OpKind::Upgrade => s(&[
                "upgrade",
                "--image",
                UPGRADE_IMAGE,
                "--reboot-timeout",
                "90s",
            ]),
            OpKind::Defrag => {
                self.cluster
                    .fill("/talos-sim/fill/", 200, 1024)
                    .await
                    .map_err(|e| format!("filling etcd: {e}"))?;
                self.cluster
                    .clear("/talos-sim/fill/")
                    .await
                    .map_err(|e| format!("clearing etcd: {e}"))?;
                s(&["defrag", "--all"])
            }
            OpKind::Restore => {
                let snapshot = self.snapshot_for_restore().await?;
                s(&[
                    "restore",
                    "--from",
                    &snapshot,
                    &target,
                    "--rejoin-timeout",
                    "90s",
                ])
            }
            OpKind::Drill => {
                let (store, key) = self.backup_for_drill().await?;
                s(&["drill", "--from", &store, "-i", &key])
            }
        })
    }

    fn apply_args(&self, draw: &Draw) -> Result<Vec<String>, SetupError> {
        let original = std::fs::read_to_string(self.controlplane())
            .map_err(|e| format!("controlplane.yaml: {e}"))?;
        let (edited, extra): (String, &[&str]) = if draw.op == OpKind::ApplyHarmless {
            (
                original.replace("certSANs: []", "certSANs: [vip.example]"),
                &["--expect-change", "machine.certSANs"],
            )
        } else {
            let endpoint = format!("https://{}:6443", self.ip(1));
            (
                original.replace(&endpoint, "https://k8s.example:6443"),
                &[
                    "--expect-change",
                    "cluster.controlPlane.endpoint",
                    "--allow-issuer-change",
                    "controlplane",
                ],
            )
        };
        if edited == original {
            return Err("the apply's edit changed nothing in controlplane.yaml".into());
        }
        let file = self.dir.join("apply.yaml");
        std::fs::write(&file, edited).map_err(|e| format!("{}: {e}", file.display()))?;
        let mut args = Vec::new();
        for i in &draw.apply_nodes {
            args.extend(["-n".to_string(), self.ip(*i).to_string()]);
        }
        args.extend(["apply", "-f"].map(String::from));
        args.push(file.display().to_string());
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(["--try-timeout", "60s"].map(String::from));
        Ok(args)
    }

    /// Runs `talosctl-rs ops ARGS` as the preparation host, to its end.
    async fn preparation_ops(&self, args: &[String]) -> Result<serde_json::Value, SetupError> {
        let mut full = base_args(&self.preparation, None);
        full.extend(args.iter().cloned());
        let mut proc =
            super::procs::Proc::start(&self.procs, "preparation", &self.talosctl, &full, &[])
                .map_err(|e| format!("running talosctl-rs: {e}"))?;
        proc.wait_until(Instant::now() + Duration::from_secs(120))
            .await;
        let ended = proc.ended();
        if ended.code != Some(0) {
            return Err(format!("ops {}: {}", args.join(" "), ended.output));
        }
        serde_json::from_str(&proc.stdout_text()).map_err(|e| format!("ops output: {e}"))
    }

    /// A verified snapshot, then every control-plane node reset with its
    /// etcd data wiped and rebooted, as Talos's disaster recovery has it:
    /// each waits to join a cluster that is gone.
    async fn snapshot_for_restore(&self) -> Result<String, SetupError> {
        let taken = self.preparation_ops(&["snapshot".to_string()]).await?;
        let snapshot = taken["facts"]["snapshot"]
            .as_str()
            .ok_or("the snapshot's facts name no file")?
            .to_string();
        let mut labels = vec!["EPHEMERAL".to_string()];
        if self.cluster.config().talos_version == TalosVersion::V1_14_0 {
            labels.push("ETCD".into());
        }
        for (ip, _) in &self.control_plane {
            let request = talos_client::client::ResetRequest::default()
                .with_graceful(false)
                .with_reboot(true)
                .with_system_labels_to_wipe(labels.clone());
            self.client
                .node(ip.as_str())
                .reset(request)
                .await
                .map_err(|e| format!("resetting {ip} for the restore: {e}"))?;
        }
        let deadline = Instant::now() + Duration::from_secs(90);
        for (ip, name) in &self.control_plane {
            let node = self.client.node(ip.as_str());
            poll(deadline, &format!("{name} back without etcd"), || async {
                let booted = node.version().await.is_ok();
                (booted && node.etcd_status().await.is_err()).then_some(())
            })
            .await?;
        }
        Ok(snapshot)
    }

    /// An encrypted backup in a directory and the identity that opens it.
    async fn backup_for_drill(&self) -> Result<(String, String), SetupError> {
        let key = self.dir.join("drill.key");
        let made = tokio::process::Command::new("age-keygen")
            .arg("-o")
            .arg(&key)
            .output()
            .await
            .map_err(|e| format!("age-keygen: {e}"))?;
        let text = String::from_utf8_lossy(&made.stderr).to_string();
        let recipient = text
            .split_whitespace()
            .find(|w| w.starts_with("age1"))
            .ok_or_else(|| format!("age-keygen printed no public key: {text}"))?
            .to_string();
        let store = self.dir.join("backups");
        let store = store.display().to_string();
        self.preparation_ops(
            &["snapshot", "--to", &store, "--encrypt", &recipient].map(String::from),
        )
        .await?;
        Ok((store, key.display().to_string()))
    }
}

/// `--talosconfig TC -o json ops --state-dir D [--socket S] --yes`.
pub fn base_args(host: &Host, socket: Option<&Path>) -> Vec<String> {
    let mut args = vec![
        "--talosconfig".to_string(),
        host.talosconfig.display().to_string(),
        "-o".into(),
        "json".into(),
        "ops".into(),
        "--state-dir".into(),
        host.state_dir.display().to_string(),
    ];
    if let Some(socket) = socket {
        args.push("--socket".into());
        args.push(socket.display().to_string());
    }
    args.push("--yes".into());
    args
}

/// A talosconfig for the cluster with an admin certificate whose common
/// name is `cn`.
fn write_talosconfig(cluster: &Cluster, path: &Path, cn: &str) -> Result<(), SetupError> {
    let mut spec = LeafSpec::client(&["os:admin"]);
    spec.common_name = Some(cn.to_string());
    let identity = cluster.issue_client(&spec).map_err(|e| e.to_string())?;
    let endpoints: Vec<String> = cluster
        .nodes()
        .iter()
        .filter(|n| !n.worker)
        .map(|n| n.api.clone())
        .collect();
    let mut context = Context::new(
        endpoints.clone(),
        identity.ca_pem(),
        identity.crt_pem(),
        identity.key_pem(),
    );
    context.nodes = vec![
        endpoints[0]
            .split(':')
            .next()
            .unwrap_or_default()
            .to_string(),
    ];
    let yaml = TalosConfig::with_context("sim", context).to_yaml();
    talos_client::write_private_file(path, yaml.as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn client_of(path: &Path) -> Result<Client, SetupError> {
    let config = TalosConfig::read(path).map_err(|e| e.to_string())?;
    let context = config
        .resolve(&Overrides::default(), path)
        .map_err(|e| e.to_string())?;
    Client::builder_from_context(&context)
        .connect_timeout(Duration::from_secs(5))
        .call_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())
}

/// Polls `check` until it returns `Some`, or fails naming `what` at
/// `deadline`.
pub async fn poll<T, F, Fut>(deadline: Instant, what: &str, mut check: F) -> Result<T, SetupError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
