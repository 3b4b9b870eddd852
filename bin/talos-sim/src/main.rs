//! talos-sim: a simulated Talos control plane on loopback, each node backed
//! by a real etcd member.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use talos_client::config::{Context, TalosConfig};
use talos_sim::control::{self, Reply, Request};
use talos_sim::pki::{Ca, LeafSpec};
use talos_sim::{Cluster, DEFAULT_BASE_IP, SimConfig};
use time::OffsetDateTime;

mod campaign_cmd;

#[derive(Parser)]
#[command(
    name = "talos-sim",
    version,
    about = "A simulated Talos control plane backed by real etcd"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// A fault `talos-sim fault` injects.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Fault {
    /// Stop the node's etcd process (SIGSTOP).
    FreezeEtcd,
    /// Let it run again (SIGCONT).
    ThawEtcd,
    /// Cut the node's API off the network while it keeps running: callers
    /// connect and hear nothing (its etcd still reaches its peers).
    Partition,
    /// End a partition.
    Heal,
    /// Power the node off (its API and etcd stop at once, as a pulled plug;
    /// it stays off until the simulator restarts): a dead node.
    PowerOff,
    /// Make the node's next EtcdLeaveCluster land only after `--delay-secs`,
    /// even when the caller gave up by then.
    DelayLeave,
    /// Make the node's next upgrade boot its old partition: it comes back,
    /// with a new boot id, on the version it ran before.
    UpgradeBootsOldPartition,
    /// Make the node's next upgrade never come back: it goes down and stays
    /// down.
    UpgradeNeverComesBack,
}

#[derive(Subcommand)]
enum Command {
    /// Start a cluster and run until SIGINT or SIGTERM.
    Up(UpArgs),
    /// Run COUNT stand-ins for leader-elected controllers against the
    /// cluster running in DIR: each renews its own Lease on its own
    /// connection through URL (default: the first node's KubePrism), as
    /// client-go's leader election does, until SIGINT or SIGTERM; then
    /// prints what they saw as JSON (a failed renewal is a lease lost).
    Controllers {
        /// The directory `talos-sim up` runs in.
        dir: PathBuf,
        /// The Kubernetes API endpoint they go through (https://HOST:PORT;
        /// its certificate is checked as localhost, as KubePrism's clients
        /// on the node check it).
        #[arg(long, value_name = "URL")]
        through: Option<String>,
        /// How many controllers.
        #[arg(long, default_value_t = 3)]
        count: usize,
        /// Seconds a renewal may keep failing before the lease is lost
        /// (client-go's default: 10); they renew every fifth of it.
        #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
        renew_deadline: f64,
    },
    /// Add a control-plane node to the cluster running in DIR.
    AddNode {
        /// The directory `talos-sim up` runs in.
        dir: PathBuf,
        /// Start it in maintenance mode: no configuration, an API that
        /// takes no client certificate (prints its certificate fingerprint
        /// for `apply-config --insecure --cert-fingerprint`).
        #[arg(long)]
        maintenance: bool,
    },
    /// Write COUNT keys of VALUE_SIZE bytes into the cluster running in DIR.
    Fill {
        /// The directory `talos-sim up` runs in.
        dir: PathBuf,
        /// How many keys.
        #[arg(long, default_value_t = 100)]
        count: usize,
        /// Bytes per value (etcd accepts up to about 1.5 MiB).
        #[arg(long, default_value_t = 1024)]
        value_size: usize,
        /// Instead: delete the keys `fill` wrote and compact etcd's
        /// history, leaving space for a defragmentation to reclaim.
        #[arg(long)]
        clear: bool,
    },
    /// Inject a fault into NODE of the cluster running in DIR: freeze its
    /// etcd (its API keeps answering, as on a stalled disk), partition its
    /// API (it keeps running, nobody reaches it), or delay its next leave.
    Fault {
        /// The directory `talos-sim up` runs in.
        dir: PathBuf,
        /// What to do.
        #[arg(value_enum)]
        fault: Fault,
        /// The node's name (`cp-2`) or address.
        node: String,
        /// For `delay-leave`: how many seconds the leave takes.
        #[arg(long, default_value_t = 360)]
        delay_secs: u64,
    },
    /// A randomized fault campaign: each run a fresh cluster, one operation
    /// through the real talosctl-rs (or talos-opsd), faults at random
    /// instants, and the invariants checked against the cluster's ledger.
    Campaign(campaign_cmd::CampaignArgs),
    /// Write an example Talos PKI and talosconfig into DIR.
    GenCerts {
        /// Where to write them.
        dir: PathBuf,
    },
}

#[derive(clap::Args)]
struct UpArgs {
    /// Number of control-plane nodes.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Number of worker nodes (an API, no etcd), after the control plane.
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Directory for talosconfigs, PKI, logs and node data (default: a new
    /// temporary directory, removed on exit).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Node i listens on this address + i.
    #[arg(long, default_value_t = DEFAULT_BASE_IP)]
    base_ip: Ipv4Addr,
    /// Give node i a second interface at this address + i, which etcd does
    /// not advertise (a multi-homed machine); requests may name either.
    #[arg(long)]
    second_base_ip: Option<Ipv4Addr>,
    /// apid port shared by all nodes.
    #[arg(long, default_value_t = 50000)]
    api_port: u16,
    /// etcd client port on every node.
    #[arg(long, default_value_t = 2379)]
    etcd_client_port: u16,
    /// etcd peer port on every node.
    #[arg(long, default_value_t = 2380)]
    etcd_peer_port: u16,
    /// etcd's HTTP port (health, metrics) on every node that runs etcd 3.7
    /// (Talos 1.14).
    #[arg(long, default_value_t = 2383)]
    etcd_http_port: u16,
    /// The directory scripts/etcd.sh builds the etcd releases into (one
    /// etcd-vX.Y.Z/ each): each node runs the release its Talos runs,
    /// v3.6.12 for 1.13.9, v3.7.1 for 1.14.0 (default: ~/.cache/talos-client).
    #[arg(long, env = "TALOS_SIM_ETCD_CACHE", value_name = "DIR")]
    etcd_cache: Option<PathBuf>,
    /// Use a random 127.x.y.0/24 and free ports instead of the above.
    #[arg(long)]
    isolated: bool,
    /// Print the node list as JSON.
    #[arg(long)]
    json: bool,
    /// Divide Talos's fixed waits and retry schedules (EtcdLeaveCluster's
    /// 10 s retry interval and 5 min limit, the 3 min wait for the local etcd
    /// member, the learner promotion's 15 s retry, member add's 3 s retry,
    /// the etcd health check's 5 s delay and 20 s period, kubelet's 20 s
    /// poll of the static pods, KubePrism's health checks) by N. The
    /// default, 1, keeps upstream's values.
    #[arg(long, default_value_t = 1, value_name = "N")]
    timing_divisor: u32,
    /// The Talos release the nodes behave as: 1.13.9 (the default) or
    /// 1.14.0.
    #[arg(long, default_value = "1.13.9", value_name = "VERSION")]
    talos_version: String,
    /// Run this kube-apiserver on every control-plane node, as Talos runs
    /// its static pod (default: the one scripts/kube-apiserver.sh builds,
    /// when it is there).
    #[arg(long, env = "TALOS_SIM_KUBE_APISERVER", value_name = "PATH")]
    kube_apiserver: Option<PathBuf>,
    /// Run no Kubernetes, even with a kube-apiserver at hand (wins over
    /// --kube-apiserver and TALOS_SIM_KUBE_APISERVER).
    #[arg(long)]
    no_kubernetes: bool,
}

/// Where scripts/kube-apiserver.sh caches the binary it builds.
fn cached_kube_apiserver() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let path = cache.join("talos-client/kube-apiserver-v1.34.4/kube-apiserver");
    path.exists().then_some(path)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TALOS_SIM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().command {
        Command::Up(args) => up(args).await,
        Command::AddNode { dir, maintenance } => add_node(&dir, maintenance).await,
        Command::Controllers {
            dir,
            through,
            count,
            renew_deadline,
        } => controllers(&dir, through.as_deref(), count, renew_deadline).await,
        Command::Fill { dir, clear, .. } if clear => control::send(&dir, &Request::Clear)
            .await
            .map(|reply| match reply {
                control::Reply::Cleared { deleted } => {
                    println!("deleted {deleted} keys and compacted")
                }
                other => println!("{other:?}"),
            })
            .map_err(Into::into),
        Command::Fill {
            dir,
            count,
            value_size,
            ..
        } => control::send(&dir, &Request::Fill { count, value_size })
            .await
            .map(|_| println!("wrote {count} keys of {value_size} bytes"))
            .map_err(Into::into),
        Command::Fault {
            dir,
            fault,
            node,
            delay_secs,
        } => {
            let node_name = node.clone();
            let request = match fault {
                Fault::FreezeEtcd => Request::FreezeEtcd { node },
                Fault::ThawEtcd => Request::ThawEtcd { node },
                Fault::Partition => Request::Partition { node },
                Fault::Heal => Request::Heal { node },
                Fault::PowerOff => Request::PowerOff { node },
                Fault::DelayLeave => Request::DelayLeave {
                    node,
                    millis: delay_secs.saturating_mul(1000),
                },
                Fault::UpgradeBootsOldPartition => Request::FailNextUpgrade {
                    node,
                    fault: talos_sim::UpgradeFault::BootsOldPartition,
                },
                Fault::UpgradeNeverComesBack => Request::FailNextUpgrade {
                    node,
                    fault: talos_sim::UpgradeFault::NeverComesBack,
                },
            };
            let node = node_name;
            control::send(&dir, &request)
                .await
                .map(|_| println!("{node}: {fault:?} done"))
                .map_err(Into::into)
        }
        Command::GenCerts { dir } => gen_certs(&dir),
        Command::Campaign(args) => campaign_cmd::campaign(args, cached_kube_apiserver()).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("talos-sim: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Holds an exclusive lock on `DIR/talos-sim.lock` while a cluster runs there.
fn lock_dir(dir: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("talos-sim.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a file descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!("another talos-sim is already running in {}", dir.display());
    }
    Ok(file)
}

async fn up(args: UpArgs) -> anyhow::Result<()> {
    let talos_version: talos_sim::TalosVersion =
        args.talos_version.parse().context("--talos-version")?;
    let (dir, _temporary) = match args.dir {
        Some(dir) => (dir, None),
        None => {
            let temp = tempfile::Builder::new().prefix("talos-sim-").tempdir()?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    let _lock = lock_dir(&dir)?;
    let mut cfg = if args.isolated {
        SimConfig::isolated(&dir, args.nodes)
    } else {
        SimConfig {
            base_ip: args.base_ip,
            api_port: args.api_port,
            etcd_client_port: args.etcd_client_port,
            etcd_peer_port: args.etcd_peer_port,
            etcd_http_port: args.etcd_http_port,
            ..SimConfig::new(&dir, args.nodes)
        }
    };
    cfg.workers = args.workers;
    if let Some(cache) = args.etcd_cache {
        cfg.etcd_cache = cache;
    }
    cfg.second_base_ip = args.second_base_ip;
    if cfg.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    cfg.timing = talos_sim::TalosTiming::scaled_down(args.timing_divisor);
    cfg.talos_version = talos_version;
    if !args.no_kubernetes {
        cfg.kube_apiserver = args.kube_apiserver.or_else(cached_kube_apiserver);
    }
    if let Some(path) = &cfg.kube_apiserver
        && !path.exists()
    {
        bail!(
            "--kube-apiserver {}: no such file (scripts/kube-apiserver.sh builds one)",
            path.display()
        );
    }
    let kubernetes = cfg.kube_apiserver.is_some();
    let cluster = Cluster::up(cfg).await.context("starting the cluster")?;
    cluster.serve_control(&dir.join("control.sock"))?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "dir": dir, "talosconfig": cluster.talosconfig_path(), "nodes": cluster.nodes(), "kubernetes": kubernetes })
        );
    } else {
        let nodes = cluster.nodes();
        let workers = nodes.iter().filter(|n| n.worker).count();
        println!(
            "talos-sim: {} control-plane nodes{} running",
            nodes.len() - workers,
            if workers > 0 {
                format!(" and {workers} workers")
            } else {
                String::new()
            }
        );
        for node in &nodes {
            if node.worker {
                println!("  {:<9} {:<16} worker (no etcd)", node.name, node.api);
            } else {
                println!(
                    "  {:<9} {:<16} etcd {}",
                    node.name, node.api, node.etcd_client_url
                );
            }
        }
        if kubernetes {
            println!(
                "kubernetes:  kube-apiserver on each control-plane node at https://ADDRESS:6443 (talosctl-rs kubeconfig)"
            );
        } else {
            println!("kubernetes:  off (scripts/kube-apiserver.sh builds kube-apiserver)");
        }
        println!("directory:   {}", dir.display());
        println!("talosconfig: {}", cluster.talosconfig_path().display());
        println!(
            "try: talosctl-rs --talosconfig {} etcd members",
            cluster.talosconfig_path().display()
        );
        println!("stop with Ctrl-C");
    }
    wait_for_signal().await?;
    eprintln!("talos-sim: stopping");
    cluster.shutdown().await;
    Ok(())
}

async fn controllers(
    dir: &std::path::Path,
    through: Option<&str>,
    count: usize,
    renew_deadline: f64,
) -> anyhow::Result<()> {
    let deadline = std::time::Duration::try_from_secs_f64(renew_deadline)
        .ok()
        .filter(|d| *d >= std::time::Duration::from_millis(250))
        .ok_or_else(|| anyhow::anyhow!("--renew-deadline {renew_deadline}: at least 0.25 s"))?;
    let controllers = talos_sim::controllers::Controllers::start(
        dir,
        through,
        count,
        deadline,
        std::time::Duration::from_secs(300),
    )
    .await
    .map_err(|e| anyhow::anyhow!(e))?;
    eprintln!(
        "{count} controllers renewing their leases through {}",
        controllers.through()
    );
    wait_for_signal().await?;
    println!(
        "{}",
        serde_json::to_string_pretty(&controllers.stop().await)?
    );
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    Ok(())
}

/// `add-node DIR [--maintenance]`: one more node in the running cluster.
async fn add_node(dir: &Path, maintenance: bool) -> anyhow::Result<()> {
    let request = if maintenance {
        Request::AddMaintenanceNode
    } else {
        Request::AddNode
    };
    match control::send(dir, &request).await? {
        Reply::Added { node } => {
            match &node.maintenance_fingerprint {
                Some(fingerprint) => println!(
                    "added {} at {} in maintenance mode\ncertificate fingerprint: {fingerprint}\napply a configuration: talosctl-rs apply-config --insecure --cert-fingerprint '{fingerprint}' -n {} -f controlplane.yaml",
                    node.name, node.api, node.api
                ),
                None => println!(
                    "added {} at {} (etcd learner, promoted once caught up)",
                    node.name, node.api
                ),
            }
            Ok(())
        }
        other => bail!("unexpected reply to add-node: {other:?}"),
    }
}

/// Writes the example PKI: CA, a server certificate for 127.0.0.1 and the
/// default node addresses, admin, reader and etcd-backup client
/// certificates, and talosconfigs using them.
fn gen_certs(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let ca = Ca::generate()?;
    let now = OffsetDateTime::now_utc();
    let ten_years = now + Duration::from_secs(10 * 365 * 24 * 3600);
    let mut ips = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
    let mut names = vec!["localhost".to_string()];
    for i in 1..=9 {
        ips.push(IpAddr::V4(Ipv4Addr::from(u32::from(DEFAULT_BASE_IP) + i)));
        names.push(format!("cp-{i}"));
    }
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let server = ca.issue(&LeafSpec::server(&ips, &name_refs).valid(now, ten_years))?;
    let write = |name: &str, text: &str| -> anyhow::Result<()> {
        let path = dir.join(name);
        // Keys and talosconfigs among them: 0600, written whole.
        talos_client::write_private_file(&path, text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))
    };
    write("ca.crt", &ca.cert_pem)?;
    write("ca.key", ca.key_pem())?;
    write("server.crt", &server.cert_pem)?;
    write("server.key", &server.key_pem)?;
    let endpoints: Vec<String> = (1..=3)
        .map(|i| Ipv4Addr::from(u32::from(DEFAULT_BASE_IP) + i).to_string())
        .collect();
    for (stem, role, config) in [
        ("admin", "os:admin", "talosconfig"),
        ("reader", "os:reader", "talosconfig-reader"),
        ("etcd-backup", "os:etcd:backup", "talosconfig-backup"),
    ] {
        let identity = ca.issue(&LeafSpec::client(&[role]).valid(now, ten_years))?;
        write(&format!("{stem}.crt"), &identity.cert_pem)?;
        write(&format!("{stem}.key"), &identity.key_pem)?;
        let mut context = Context::new(
            endpoints.clone(),
            ca.cert_pem.as_bytes(),
            identity.cert_pem.as_bytes(),
            identity.key_pem.as_bytes(),
        );
        context.nodes = vec![endpoints[0].clone()];
        write(config, &TalosConfig::with_context("sim", context).to_yaml())?;
    }
    println!(
        "wrote an example Talos PKI and talosconfigs to {}",
        dir.display()
    );
    Ok(())
}
