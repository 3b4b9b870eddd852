//! Running the daemon: load the configuration, recover interrupted
//! operations, serve the API on the socket (and TCP with mutual TLS when
//! configured), schedule snapshots, serve metrics; SIGHUP reloads the
//! clusters, SIGTERM/SIGINT park running operations and exit 0.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};

use crate::config::Config;
use crate::manager::Manager;
use crate::metrics::Metrics;
use crate::proto::opsd_server::OpsdServer;
use crate::service::Service;
use crate::{listen, metrics, recover, schedule};

/// Command-line settings that override the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--socket`.
    pub socket: Option<PathBuf>,
    /// `--metrics-addr`.
    pub metrics_addr: Option<String>,
    /// `--state-dir`.
    pub state_dir: Option<PathBuf>,
    /// `--recover-journal`.
    pub recover_journal: bool,
    /// `--allow-empty`: a configuration with no setting, or a reload that
    /// drops every cluster, is taken as meant.
    pub allow_empty: bool,
}

/// The state directory: configured, else `/var/lib/talos-opsd` as root,
/// else the one `talosctl-rs ops --local` uses (so they share the journal
/// and the locks).
pub fn state_dir(config: &Config, overrides: &Overrides) -> anyhow::Result<PathBuf> {
    if let Some(dir) = overrides.state_dir.clone().or(config.state_dir.clone()) {
        return Ok(dir);
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(PathBuf::from("/var/lib/talos-opsd"));
    }
    talos_opsd_api::default_state_dir().context("no state directory: set state_dir")
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(config_path: &Path, overrides: Overrides) -> anyhow::Result<()> {
    // The signals are ours before anything can be reached: a SIGHUP sent
    // as soon as the socket exists (a reload right after a start) would
    // otherwise end the process, SIGHUP's default.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let (config, clusters) = Config::load(config_path, overrides.allow_empty)?;
    let state_dir = state_dir(&config, &overrides)?;
    let socket = overrides
        .socket
        .clone()
        .or(config.socket.clone())
        .or_else(listen::default_socket)
        .context("no socket path: set socket, --socket or $XDG_RUNTIME_DIR")?;
    if overrides.recover_journal {
        recover::recover_journal(&state_dir)?;
    }
    let metrics = Metrics::new();
    let manager = Manager::new(state_dir.clone(), clusters, metrics.clone())?;
    crate::history::restore(&manager);
    tracing::info!(
        config = %config_path.display(),
        state_dir = %state_dir.display(),
        socket = %socket.display(),
        clusters = manager.clusters().len(),
        "talos-opsd starting"
    );

    let unix = listen::bind_unix(&socket)?;
    if let Some(addr) = overrides
        .metrics_addr
        .clone()
        .or(config.metrics_addr.clone())
    {
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("metrics address {addr}"))?;
        tracing::info!(addr = %listener.local_addr()?, "metrics served on /metrics");
        tokio::spawn(metrics::serve(listener, metrics.clone()));
    }
    let tcp = match &config.tcp {
        Some(tcp) => {
            let tls = listen::server_tls(tcp)?;
            let listener = tokio::net::TcpListener::bind(&tcp.listen)
                .await
                .with_context(|| format!("tcp.listen {}", tcp.listen))?;
            tracing::info!(addr = %listener.local_addr()?, "mutual TLS listener");
            Some(listen::tls_incoming(listener, tls))
        }
        None => None,
    };

    let within = config
        .resume_within
        .as_ref()
        .map_or(recover::DEFAULT_RESUME_WITHIN, |d| d.0);
    recover::recover(&manager, within).await;
    let generation = Arc::new(AtomicU64::new(0));
    schedule::start(&manager, &generation);
    tokio::spawn(report_every_interval(Arc::clone(&manager)));

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let service = OpsdServer::new(Service::new(Arc::clone(&manager)))
        .max_decoding_message_size(crate::accept::MAX_REQUEST_BYTES);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let unix_server = tokio::spawn(
        tonic::transport::Server::builder()
            .max_concurrent_streams(crate::accept::MAX_STREAMS_PER_CONNECTION)
            .layer(crate::track::TrackLayer::<
                tonic::transport::server::UdsConnectInfo,
            >::new())
            .layer(tower::util::MapResponseLayer::new(undecodable_is_invalid))
            .add_service(service.clone())
            .serve_with_incoming_shutdown(
                crate::accept::unix_incoming(unix),
                stopped(stop_rx.clone()),
            ),
    );
    let tcp_server = tcp.map(|incoming| {
        tokio::spawn(
            tonic::transport::Server::builder()
                .max_concurrent_streams(crate::accept::MAX_STREAMS_PER_CONNECTION)
                .layer(crate::track::TrackLayer::<listen::TlsPeer>::new())
                .layer(tower::util::MapResponseLayer::new(undecodable_is_invalid))
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, stopped(stop_rx.clone())),
        )
    });
    ready();

    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => reload(config_path, &manager, &generation, overrides.allow_empty),
        }
    }
    // New work is refused from here on, before it is said.
    manager.stop_taking_work();
    tracing::info!("stopping: no new work; running operations park at their next step boundary");
    manager.shutdown().await;
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), unix_server).await;
    if let Some(server) = tcp_server {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), server).await;
    }
    let _ = std::fs::remove_file(&socket);
    tracing::info!("talos-opsd stopped");
    Ok(())
}

/// SIGHUP: the clusters and their schedules from the file again; a bad
/// file keeps the running configuration. Listeners need a restart.
fn reload(path: &Path, manager: &Arc<Manager>, generation: &Arc<AtomicU64>, allow_empty: bool) {
    match Config::load(path, allow_empty) {
        Ok((_, clusters))
            if clusters.is_empty() && !manager.clusters().is_empty() && !allow_empty =>
        {
            tracing::error!(target: "audit", who = "SIGHUP", clusters = manager.clusters().len(), "configuration not reloaded: {} configures no cluster, which would drop all {} running ones (their schedules and API); pass --allow-empty if that is meant", path.display(), manager.clusters().len())
        }
        Ok((_, clusters)) => {
            manager.set_clusters(clusters);
            generation.fetch_add(1, Ordering::SeqCst);
            schedule::start(manager, generation);
            tracing::info!(target: "audit", who = "SIGHUP", clusters = manager.clusters().len(), "configuration reloaded");
        }
        Err(e) => {
            tracing::error!(target: "audit", who = "SIGHUP", "configuration not reloaded: {}", talos_client::text::escaped(&e.to_string(), 2048))
        }
    }
}

/// Tells systemd (Type=notify) the daemon is ready, when it asked.
fn ready() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let socket = std::os::unix::net::UnixDatagram::unbound();
    let sent = socket.and_then(|s| {
        let bytes = path.as_encoded_bytes();
        if let Some(abstract_name) = bytes.strip_prefix(b"@") {
            use std::os::linux::net::SocketAddrExt as _;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name)?;
            s.send_to_addr(b"READY=1", &addr)
        } else {
            s.send_to(b"READY=1", &path)
        }
    });
    if let Err(e) = sent {
        tracing::warn!("sd_notify: {e}");
    }
}

/// A request whose message does not decode is the caller's error: tonic
/// answers it `INTERNAL` ("failed to decode Protobuf message"), which this
/// turns into `INVALID_ARGUMENT`, one code for malformed input in every
/// call. The status of such a refusal is in the response's headers (a
/// trailers-only response, sent before any handler runs).
fn undecodable_is_invalid<B>(
    mut response: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    use tonic::codegen::http::HeaderValue;
    let headers = response.headers_mut();
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .map(|m| m.replace("%20", " "))
        .unwrap_or_default();
    let status = headers.get("grpc-status");
    // A message that does not decode (INTERNAL) or is larger than any
    // request may be (OUT_OF_RANGE, before it is decoded).
    let undecodable = status.is_some_and(|s| s == "13") && message.starts_with("failed to decode");
    let too_large = status.is_some_and(|s| s == "11")
        && message.starts_with("Error, decoded message length too large");
    if undecodable || too_large {
        headers.insert("grpc-status", HeaderValue::from_static("3"));
    }
    response
}

/// How often the daemon makes each cluster's risk report for its metrics
/// (GetReport makes one at once, and sets them too).
pub const REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(300);

/// Makes every configured cluster's risk report each [`REPORT_INTERVAL`],
/// the first one interval after the start, so `/metrics` carries the
/// report's gauges without anyone asking.
async fn report_every_interval(manager: Arc<Manager>) {
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + REPORT_INTERVAL,
        REPORT_INTERVAL,
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if manager.is_stopping() {
            return;
        }
        for cluster in manager.clusters() {
            let name = &cluster.config.name;
            if let Err(e) = manager.report(name).await {
                tracing::warn!(cluster = %name, "risk report: {e}");
            }
        }
    }
}
