//! `talosctl-rs ops ...`: the safe composite operations of
//! `talos_client::ops`, journaled in the state directory. Progress goes to
//! stderr step by step; the result to stdout (`-o json` for scripts).
//! Refusals exit 1 with the reason and change nothing.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use talos_client::ops::{
    ApplyOptions, DefragOptions, DrillOptions, JoinOptions, MaintenanceApply, MigrateOptions,
    OpSpec, Ops, ReportOptions, RestoreOptions, RetireOptions, SnapshotOptions, Tiers,
    UpgradeOptions,
};
use talos_opsd_api::{PlanView, default_state_dir};

use super::Global;
use super::apply::parse_go_duration;

/// A parser for the duration flag of the operations' option `option`:
/// Go's syntax, within the library's bounds for it (clap names the flag).
fn bounded(option: &'static str) -> impl Fn(&str) -> Result<Duration, String> + Clone {
    move |text| {
        let value = parse_go_duration(text)?;
        if let Some((min, max)) = talos_client::ops::duration_bounds(option) {
            talos_client::input::within(option, value, min, max).map_err(|e| e.reason)?;
        }
        Ok(value)
    }
}

/// `--lease-probe`: an `https://HOST[:PORT]` URL.
fn probe_url(text: &str) -> Result<String, String> {
    talos_client::input::endpoint("--lease-probe", text, &["https"])
        .map(|e| e.url())
        .map_err(|e| e.reason)
}

/// `--s3-endpoint`: an `http(s)://HOST[:PORT]` URL.
fn s3_url(text: &str) -> Result<String, String> {
    talos_client::input::endpoint("--s3-endpoint", text, &["http", "https"])
        .map(|e| e.url())
        .map_err(|e| e.reason)
}

/// `--threshold`: a share in (0, 1].
fn share(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| "not a number: a share in (0, 1]".to_string())?;
    talos_client::input::share("--threshold", value).map_err(|e| e.reason)
}
use super::ops_output::{confirm, list, print_plan, print_report, progress, report, show_plan};

#[derive(clap::Args)]
pub struct OpsArgs {
    /// Where the journal and locks live (default: $XDG_STATE_HOME/talosctl-rs,
    /// else ~/.local/state/talosctl-rs, which talos-opsd uses too).
    #[arg(long, global = true)]
    pub state_dir: Option<PathBuf>,
    /// Print the plan and exit without changing anything.
    #[arg(long, global = true)]
    pub plan: bool,
    /// Do not ask for confirmation (required without a terminal for a
    /// destructive operation).
    #[arg(long, short = 'y', global = true)]
    pub yes: bool,
    /// Run the operations through the talos-opsd daemon listening on this
    /// socket (when it answers).
    #[arg(long, global = true, env = "TALOS_OPSD_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Run in this process even when a daemon socket is given.
    #[arg(long, global = true)]
    pub local: bool,
    /// Go on with this host's lock alone where the cluster lock (the
    /// Lease kube-system/talos-client-operation, which every admin host
    /// sees) cannot be taken because Kubernetes cannot be reached (quorum
    /// lost, a restore, a cluster without Kubernetes); journaled. Where it
    /// can be taken, it is.
    #[arg(long, global = true)]
    pub without_cluster_lock: bool,
    #[command(subcommand)]
    pub command: OpsCommand,
}

/// A Lease renewed during a handover.
#[derive(clap::Args)]
pub struct ReportArgs {
    /// The etcd backend quota the database sizes are measured against, in
    /// bytes (default: etcd's 2 GiB; pass what `quota-backend-bytes` says
    /// when `cluster.etcd.extraArgs` sets it).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    quota: Option<u64>,
    /// The newest verified backup older than this is a warning (default 26h).
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    backup_warn: Option<Duration>,
    /// ... and older than this critical (default 72h).
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    backup_crit: Option<Duration>,
    /// The last good drill older than this is a warning (default 192h).
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    drill_warn: Option<Duration>,
    /// ... and older than this critical (default 744h).
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    drill_crit: Option<Duration>,
    /// A database at this share of the quota is a warning (default 0.7).
    #[arg(long, value_name = "SHARE", value_parser = quota_share)]
    db_warn: Option<f64>,
    /// ... and at this share critical (default 0.9).
    #[arg(long, value_name = "SHARE", value_parser = quota_share)]
    db_crit: Option<f64>,
    /// A learner seen by an earlier report at least this long ago is stuck
    /// (default 10m).
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    learner_window: Option<Duration>,
    /// A certificate expiring within this is a warning (default 720h).
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    cert_warn: Option<Duration>,
    /// ... and within this critical (default 168h).
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    cert_crit: Option<Duration>,
}

impl ReportArgs {
    /// Whether any threshold or the quota was given.
    pub(super) fn any_given(&self) -> bool {
        self.quota.is_some()
            || self.db_warn.is_some()
            || self.db_crit.is_some()
            || [
                self.backup_warn,
                self.backup_crit,
                self.drill_warn,
                self.drill_crit,
                self.learner_window,
                self.cert_warn,
                self.cert_crit,
            ]
            .iter()
            .any(Option::is_some)
    }

    fn options(&self, credentials: talos_client::tls::Credentials) -> ReportOptions {
        let mut o = ReportOptions::default();
        let t = &mut o.thresholds;
        for (target, given) in [
            (&mut t.backup_warn, self.backup_warn),
            (&mut t.backup_crit, self.backup_crit),
            (&mut t.drill_warn, self.drill_warn),
            (&mut t.drill_crit, self.drill_crit),
            (&mut t.learner_window, self.learner_window),
            (&mut t.cert_warn, self.cert_warn),
            (&mut t.cert_crit, self.cert_crit),
        ] {
            if let Some(d) = given {
                *target = d;
            }
        }
        if let Some(share) = self.db_warn {
            t.db_warn = share;
        }
        if let Some(share) = self.db_crit {
            t.db_crit = share;
        }
        if let Some(quota) = self.quota {
            o.quota_bytes = quota;
        }
        o.credentials = vec![("talosconfig".to_string(), credentials)];
        o
    }
}

fn quota_share(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| "not a number: a share of the quota in (0, 1]".to_string())?;
    talos_client::input::share("--db-warn/--db-crit", value).map_err(|e| e.reason)
}

#[derive(clap::Args)]
pub struct LeaseProbeArgs {
    /// Renew a Lease through this Kubernetes API endpoint
    /// (https://HOST:PORT: a load balancer over the API servers, or on
    /// talos-sim a node's KubePrism) while the node is handed over, and
    /// report the renewals that failed, as a leader-elected controller
    /// behind it would see them.
    #[arg(long, value_name = "URL", value_parser = probe_url)]
    lease_probe: Option<String>,
    /// The name the lease probe endpoint's certificate is checked
    /// against (e.g. localhost for a KubePrism).
    #[arg(long, value_name = "NAME", requires = "lease_probe")]
    lease_probe_tls_server_name: Option<String>,
    /// The lease probe's renew deadline (default 10s, client-go's); it
    /// renews every fifth of it.
    #[arg(long, value_parser = bounded("lease_probe_deadline"), requires = "lease_probe")]
    lease_probe_deadline: Option<Duration>,
}

impl LeaseProbeArgs {
    fn spec(&self) -> Option<talos_client::ops::LeaseProbe> {
        let server = self.lease_probe.as_ref()?;
        let mut probe = talos_client::ops::LeaseProbe::new(server.clone());
        probe.tls_server_name = self.lease_probe_tls_server_name.clone();
        if let Some(deadline) = self.lease_probe_deadline {
            probe.renew_deadline = deadline;
            probe.retry_period = deadline / 5;
        }
        Some(probe)
    }
}

/// A configuration for a node in maintenance mode.
#[derive(clap::Args)]
pub struct MaintenanceArgs {
    /// Apply this control-plane configuration to the node, which is in
    /// maintenance mode, before waiting for it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Accept the maintenance node's certificate only with this SPKI
    /// fingerprint (as the node prints it).
    #[arg(long = "cert-fingerprint", value_name = "FP", requires = "config")]
    cert_fingerprint: Vec<String>,
    /// Do not verify the maintenance node at all (anyone on the path can
    /// read the configuration and its keys).
    #[arg(long, requires = "config", conflicts_with = "cert_fingerprint")]
    insecure: bool,
}

impl MaintenanceArgs {
    fn spec(&self) -> Option<MaintenanceApply> {
        let path = self.config.as_ref()?;
        let mut apply = MaintenanceApply::pinned(path, self.cert_fingerprint.clone());
        apply.insecure = self.insecure;
        Some(apply)
    }
}

/// How an S3 store is reached. Credentials come from the environment only
/// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), never from
/// flags, so they stay out of shell history and the journal.
#[derive(clap::Args, Debug, Clone)]
pub struct S3Flags {
    /// How S3 requests address the bucket: `path` (self-hosted servers)
    /// or `virtual` (AWS).
    #[arg(long, value_name = "path|virtual", default_value = "path")]
    s3_addressing: String,
    /// The S3 region (default: AWS_REGION, else us-east-1).
    #[arg(long, value_name = "REGION")]
    s3_region: Option<String>,
    /// The S3 endpoint URL, e.g. http://10.0.0.5:8333 (default:
    /// AWS_ENDPOINT_URL, else AWS's for the region).
    #[arg(long, value_name = "URL", value_parser = s3_url)]
    s3_endpoint: Option<String>,
}

impl S3Flags {
    fn access(&self) -> talos_client::ops::S3Access {
        let mut access = talos_client::ops::S3Access::default();
        access.addressing = Some(self.s3_addressing.clone());
        access.region = self.s3_region.clone();
        access.endpoint = self.s3_endpoint.clone();
        access
    }
}

#[derive(Subcommand)]
pub enum OpsCommand {
    /// A verified snapshot from a healthy voting member, with retention.
    Snapshot {
        /// Where snapshots go (default: STATE_DIR/snapshots).
        #[arg(long, conflicts_with = "to")]
        dir: Option<PathBuf>,
        /// A directory, or off-host object storage `s3://BUCKET/PREFIX`
        /// (credentials, region and endpoint from AWS_ACCESS_KEY_ID,
        /// AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL).
        #[arg(long, value_name = "DIR|s3://BUCKET/PREFIX")]
        to: Option<String>,
        /// Encrypt the snapshot for this age recipient (`age1...`;
        /// repeatable): zstd then age, no plaintext anywhere, not even a
        /// temporary file; in a directory as in s3://.
        #[arg(long = "encrypt", value_name = "RECIPIENT")]
        encrypt: Vec<String>,
        /// Store a recovery kit beside the encrypted snapshot: Kubernetes'
        /// secret-encryption keys, the members, CA fingerprints and each
        /// member's configuration digest (needs --encrypt).
        #[arg(long, requires = "encrypt")]
        kit: bool,
        #[command(flatten)]
        s3: S3Flags,
        /// Keep the newest N verified snapshots of this cluster (0: all;
        /// default: all, or the daemon's configured retention).
        #[arg(long)]
        keep: Option<usize>,
        /// Retention tiers beside --keep: the newest snapshot of each of
        /// the latest N hours, days and ISO weeks (in a directory or a
        /// store alike).
        #[arg(long, value_name = "N")]
        keep_hourly: Option<usize>,
        /// See --keep-hourly.
        #[arg(long, value_name = "N")]
        keep_daily: Option<usize>,
        /// See --keep-hourly.
        #[arg(long, value_name = "N")]
        keep_weekly: Option<usize>,
    },
    /// Retire a control-plane node: snapshot, forfeit, leave, reset at once.
    Retire {
        /// The node: hostname or address.
        node: String,
        /// A system label to wipe (repeatable; default STATE and EPHEMERAL).
        #[arg(long = "wipe", value_name = "LABEL")]
        wipe: Vec<String>,
        /// The node already left etcd: only reset it.
        #[arg(long)]
        already_left: bool,
        /// Where the verified snapshot goes (default: STATE_DIR/snapshots).
        #[arg(long)]
        snapshot_dir: Option<PathBuf>,
        /// How long to wait for the node to go silent (default 2m).
        #[arg(long, value_parser = bounded("silence_timeout"))]
        timeout: Option<Duration>,
        #[command(flatten)]
        lease_probe: LeaseProbeArgs,
    },
    /// Wait until a new node is a voting etcd member and all are healthy;
    /// with --config, first apply it to the node in maintenance mode.
    Join {
        /// The node: hostname or address (host:port for a maintenance node
        /// on another port).
        node: String,
        /// How long to wait (default 10m).
        #[arg(long, value_parser = bounded("timeout"))]
        timeout: Option<Duration>,
        #[command(flatten)]
        maintenance: MaintenanceArgs,
    },
    /// Join NEW (from maintenance mode with --config), then retire OLD:
    /// moving the control plane to new machines as one operation.
    Migrate {
        /// The node to retire.
        #[arg(long, value_name = "OLD")]
        from: String,
        /// The node that takes its place.
        #[arg(long, value_name = "NEW")]
        to: String,
        #[command(flatten)]
        maintenance: MaintenanceArgs,
        /// How long NEW may take to become a healthy voter (default 10m).
        #[arg(long, value_parser = bounded("join_timeout"))]
        join_timeout: Option<Duration>,
        /// A system label to wipe on OLD (repeatable; default STATE and
        /// EPHEMERAL).
        #[arg(long = "wipe", value_name = "LABEL")]
        wipe: Vec<String>,
        /// Where the verified snapshot goes (default: STATE_DIR/snapshots).
        #[arg(long)]
        snapshot_dir: Option<PathBuf>,
        /// How long to wait for OLD to go silent (default 2m).
        #[arg(long, value_parser = bounded("silence_timeout"))]
        timeout: Option<Duration>,
        #[command(flatten)]
        lease_probe: LeaseProbeArgs,
    },
    /// Defragment etcd's members whose database is mostly free space, one
    /// at a time, followers first and the leader last (after handing its
    /// leadership over); -n limits it to those members.
    Defrag {
        /// Defragment a member when the share of its database in use is
        /// below this.
        #[arg(long, default_value_t = DefragOptions::DEFAULT_THRESHOLD, value_parser = share)]
        threshold: f64,
        /// Defragment every member considered, whatever its share in use.
        #[arg(long)]
        all: bool,
    },
    /// Upgrade Talos on the control plane to the release the image's tag
    /// names: a verified snapshot, then one node at a time, followers first
    /// and the leader last (after handing its leadership over); each must
    /// come back from a new boot on that release, its etcd member a healthy
    /// voter caught up and its services healthy, before the next is
    /// touched. -n limits it to those nodes.
    Upgrade {
        /// The installer image (ghcr.io/siderolabs/installer:v1.14.0).
        #[arg(long)]
        image: String,
        /// Then the workers too (every worker discovery lists; -n names
        /// workers as well as control-plane nodes).
        #[arg(long)]
        workers: bool,
        /// How many workers go at once (control-plane nodes always go one
        /// at a time).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        parallel: u16,
        /// Accept a step of more than one Talos minor release.
        #[arg(long)]
        allow_minor_skip: bool,
        /// Accept a downgrade to an earlier Talos minor release.
        #[arg(long)]
        allow_downgrade: bool,
        /// How long each node may take to come back and pass its gate
        /// (default 15m).
        #[arg(long, value_parser = bounded("reboot_timeout"))]
        reboot_timeout: Option<Duration>,
    },
    /// Bring a cluster that lost etcd's quorum back from a snapshot, onto
    /// NODE (whose etcd data was wiped): verify, upload, bootstrap with
    /// recovery, check, wait for the other control-plane nodes to rejoin.
    /// Refused while any member's etcd has a leader.
    Restore {
        /// The snapshot file, or an off-host store s3://BUCKET/PREFIX (its
        /// newest complete backup of this cluster, or --key).
        #[arg(long, value_name = "SNAPSHOT|s3://BUCKET/PREFIX")]
        from: String,
        /// The backup's key in an off-host store.
        #[arg(long, requires = "from")]
        key: Option<String>,
        /// A file of age identities that decrypt the backup (repeatable).
        #[arg(long = "identity", short = 'i', value_name = "FILE")]
        identity: Vec<PathBuf>,
        #[command(flatten)]
        s3: S3Flags,
        /// The control-plane node to restore onto (address or name).
        node: String,
        /// How long the other control-plane nodes may take to rejoin
        /// (default 10m).
        #[arg(long, value_parser = bounded("rejoin_timeout"))]
        rejoin_timeout: Option<Duration>,
    },
    /// Prove that a stored backup restores: fetch, decrypt, verify,
    /// restore into a throwaway etcd on this host, compare with its
    /// sidecar. The cluster is not touched.
    Drill {
        /// The store: a directory or s3://BUCKET/PREFIX.
        #[arg(long, value_name = "DIR|s3://BUCKET/PREFIX")]
        from: String,
        /// The backup's key (default: the newest of this cluster's).
        key: Option<String>,
        /// A file of age identities to decrypt with (repeatable).
        #[arg(long = "identity", short = 'i', value_name = "FILE")]
        identity: Vec<PathBuf>,
        #[command(flatten)]
        s3: S3Flags,
    },
    /// Apply a configuration safely to the nodes given with -n, one at a
    /// time: dry run and guards, TRY, health gate, then confirm (or a
    /// verified rollback).
    Apply {
        /// The machine configuration file.
        #[arg(long, short = 'f', value_name = "FILE")]
        file: PathBuf,
        /// A path that may change (repeatable); any other changed path
        /// refuses. E.g. cluster.controlPlane.endpoint, Layer2VIPConfig.
        #[arg(long = "expect-change", value_name = "PATH")]
        expect_change: Vec<String>,
        /// Allow the API servers of nodes of ROLE (controlplane, init) to
        /// stop accepting a service-account issuer, audience or key: it
        /// breaks every token issued so far (repeatable; workers are never
        /// judged).
        #[arg(long = "allow-issuer-change", value_name = "ROLE")]
        allow_issuer_change: Vec<talos_client::ops::MachineRole>,
        /// Allow a change that needs a reboot: applied in REBOOT mode, with
        /// no automatic rollback.
        #[arg(long)]
        allow_reboot: bool,
        /// The try window: the node rolls back after it unless confirmed
        /// (default 2m).
        #[arg(long, value_parser = bounded("try_timeout"))]
        try_timeout: Option<Duration>,
        /// How long a node may take to come back from a reboot (default
        /// 10m).
        #[arg(long, value_parser = bounded("reboot_timeout"))]
        reboot_timeout: Option<Duration>,
        /// A command (run with sh -c, TALOS_NODE set) that must exit 0 for
        /// the health gate to pass.
        #[arg(long, value_name = "CMD")]
        check: Option<String>,
        /// When the file changes a Layer2VIPConfig document, the gate also
        /// waits until each of its VIPs is held by exactly one
        /// control-plane node, which answers the Talos API (default true;
        /// --vip-check=false turns it off).
        #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
        vip_check: Option<bool>,
        /// On a control-plane node, mint a service-account token before the
        /// change; the gate then requires the API server ready and the
        /// token still accepted (default true). Kubernetes that is there
        /// but cannot be checked refuses the apply.
        #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
        kube_check: Option<bool>,
        /// Apply without the Kubernetes check (journaled with the
        /// operation): what --kube-check=false does.
        #[arg(long, conflicts_with = "kube_check")]
        skip_kube_check: bool,
    },
    /// A risk report of this cluster, read only: the newest verified
    /// backup's age (on this host and off it), the last drill, each etcd
    /// member's database against its quota, alarms, the voter count,
    /// learners that stay learners, members with no node behind them,
    /// Talos and etcd version skew, the certificate's expiry, the cluster
    /// lock. Exit code 0, 1 or 2: ok, warning, critical.
    Report(ReportArgs),
    /// List this cluster's operations.
    List,
    /// Show one operation and its steps.
    Show {
        /// Its id (a unique prefix is enough).
        id: String,
    },
    /// Continue an interrupted operation, reconciling the step in flight.
    Resume {
        /// Its id.
        id: String,
    },
    /// End an interrupted or failed operation without further action.
    Abandon {
        /// Its id.
        id: String,
    },
    /// Follow an operation run by the talos-opsd daemon, step by step.
    Watch {
        /// Its id.
        id: String,
    },
}

impl OpsCommand {
    /// The operation these arguments ask for (`None` for the journal
    /// commands); `nodes` are the global `-n` nodes. The only mapping from
    /// the CLI's arguments to an operation: in-process and through the
    /// daemon alike.
    pub(super) fn spec(&self, nodes: Vec<String>) -> Option<OpSpec> {
        let set = |target: &mut Duration, given: &Option<Duration>| {
            if let Some(d) = given {
                *target = *d;
            }
        };
        Some(match self {
            OpsCommand::Snapshot {
                dir,
                to,
                encrypt,
                kit,
                s3,
                keep,
                keep_hourly,
                keep_daily,
                keep_weekly,
            } => {
                let (dir, store) = match to {
                    Some(to) if to.starts_with("s3://") => (dir.clone(), Some(to.clone())),
                    Some(to) => (Some(absolute(&PathBuf::from(to))), None),
                    None => (dir.as_ref().map(|d| absolute(d)), None),
                };
                let mut o = SnapshotOptions::new(dir, *keep);
                o.encrypt = encrypt.clone();
                o.kit = *kit;
                o.tiers = Tiers::new(
                    keep_hourly.unwrap_or(0),
                    keep_daily.unwrap_or(0),
                    keep_weekly.unwrap_or(0),
                );
                if store.is_some() {
                    o.store = store;
                    o.s3 = s3.access();
                }
                OpSpec::Snapshot(o)
            }
            OpsCommand::Retire {
                node,
                wipe,
                already_left,
                snapshot_dir,
                timeout,
                lease_probe,
            } => {
                let mut o = RetireOptions::new(node);
                if !wipe.is_empty() {
                    o.wipe = wipe.clone();
                }
                o.already_left = *already_left;
                o.snapshot_dir = snapshot_dir.clone();
                set(&mut o.silence_timeout, timeout);
                o.lease_probe = lease_probe.spec();
                OpSpec::Retire(o)
            }
            OpsCommand::Join {
                node,
                timeout,
                maintenance,
            } => {
                let mut o = JoinOptions::new(node);
                set(&mut o.timeout, timeout);
                o.maintenance = maintenance.spec();
                OpSpec::Join(o)
            }
            OpsCommand::Migrate {
                from,
                to,
                maintenance,
                join_timeout,
                wipe,
                snapshot_dir,
                timeout,
                lease_probe,
            } => {
                let mut o = MigrateOptions::new(from, to);
                o.lease_probe = lease_probe.spec();
                o.maintenance = maintenance.spec();
                set(&mut o.join_timeout, join_timeout);
                if !wipe.is_empty() {
                    o.wipe = wipe.clone();
                }
                o.snapshot_dir = snapshot_dir.clone();
                set(&mut o.silence_timeout, timeout);
                OpSpec::Migrate(o)
            }
            OpsCommand::Apply {
                file,
                expect_change,
                allow_issuer_change,
                allow_reboot,
                try_timeout,
                reboot_timeout,
                check,
                vip_check,
                kube_check,
                skip_kube_check,
            } => {
                let path = std::path::absolute(file).unwrap_or_else(|_| file.clone());
                let mut o = ApplyOptions::new(nodes, path);
                o.expect_change = expect_change.clone();
                o.allow_issuer_change = allow_issuer_change.clone();
                o.allow_reboot = *allow_reboot;
                set(&mut o.try_timeout, try_timeout);
                set(&mut o.reboot_timeout, reboot_timeout);
                o.check = check.clone();
                if let Some(on) = vip_check {
                    o.vip_check = *on;
                }
                if let Some(on) = kube_check {
                    o.kube_check = *on;
                }
                if *skip_kube_check {
                    o.kube_check = false;
                }
                OpSpec::Apply(o)
            }
            OpsCommand::Restore {
                from,
                key,
                identity,
                s3,
                node,
                rejoin_timeout,
            } => {
                let mut o = if from.starts_with("s3://") || std::path::Path::new(from).is_dir() {
                    let from = if from.starts_with("s3://") {
                        from.clone()
                    } else {
                        absolute(std::path::Path::new(from)).display().to_string()
                    };
                    let mut o = RestoreOptions::new(from, node);
                    o.key = key.clone();
                    o.identity_files = identity.iter().map(|f| absolute(f)).collect();
                    o.s3 = s3.access();
                    o
                } else {
                    let file = absolute(&PathBuf::from(from));
                    RestoreOptions::new(file.display().to_string(), node)
                };
                set(&mut o.rejoin_timeout, rejoin_timeout);
                OpSpec::Restore(o)
            }
            OpsCommand::Upgrade {
                image,
                workers,
                parallel,
                allow_minor_skip,
                allow_downgrade,
                reboot_timeout,
            } => {
                let mut o = UpgradeOptions::new(image);
                o.nodes = nodes;
                o.workers = *workers;
                o.parallel = usize::from(*parallel);
                o.allow_minor_skip = *allow_minor_skip;
                o.allow_downgrade = *allow_downgrade;
                set(&mut o.reboot_timeout, reboot_timeout);
                OpSpec::Upgrade(o)
            }
            OpsCommand::Defrag { threshold, all } => {
                let mut o = DefragOptions::new();
                o.nodes = nodes;
                o.threshold = *threshold;
                o.all = *all;
                OpSpec::Defrag(o)
            }
            OpsCommand::Drill {
                from,
                key,
                identity,
                s3,
            } => {
                let mut o = DrillOptions::new(from);
                o.key = key.clone();
                o.identity_files = identity
                    .iter()
                    .map(|f| std::path::absolute(f).unwrap_or_else(|_| f.clone()))
                    .collect();
                o.s3 = s3.access();
                OpSpec::Drill(o)
            }
            OpsCommand::List
            | OpsCommand::Report(_)
            | OpsCommand::Show { .. }
            | OpsCommand::Resume { .. }
            | OpsCommand::Abandon { .. }
            | OpsCommand::Watch { .. } => return None,
        })
    }
}

pub async fn run(global: &Global, args: OpsArgs) -> anyhow::Result<()> {
    if super::opsd_client::dispatch(global, &args).await? {
        return Ok(());
    }
    let state_dir = match args.state_dir.clone() {
        Some(dir) => dir,
        None => default_state_dir().context("no state directory: pass --state-dir")?,
    };
    let context = global.resolve()?;
    let (client, nodes) = global.connect()?;
    let mut ops = Ops::open(&context, client, &state_dir)?;
    if args.without_cluster_lock {
        ops.set_cluster_lock_policy(talos_client::ops::ClusterLockPolicy::AllowWithout);
    }
    // A defragmentation covers every voter unless -n names some: the
    // talosconfig's default nodes do not narrow it.
    let nodes = match args.command {
        OpsCommand::Defrag { .. } | OpsCommand::Upgrade { .. } => global.nodes.clone(),
        _ => nodes,
    };
    let Some(spec) = args.command.spec(nodes) else {
        return journal_command(global, &mut ops, args.command).await;
    };
    // The lock is taken here and held by the plan through the prompt.
    let plan = ops.plan(&spec).await?;
    let view = PlanView::from(&plan);
    show_plan(&view);
    if args.plan {
        return print_plan(global, &view);
    }
    if plan.is_destructive() && !args.yes {
        confirm()?;
    }
    let record = ops.run(plan, &mut progress).await?;
    report(global, &record)
}

async fn journal_command(
    global: &Global,
    ops: &mut Ops,
    command: OpsCommand,
) -> anyhow::Result<()> {
    match command {
        OpsCommand::List => list(global, ops.list()?),
        OpsCommand::Report(args) => {
            let context = global.resolve()?;
            let report = ops.report(&args.options(context.credentials)).await?;
            print_report(global, &report)?;
            match report.level.exit_code() {
                0 => Ok(()),
                code => Err(super::Exit(code as u8).into()),
            }
        }
        OpsCommand::Show { id } => report(global, &ops.show(&id)?),
        OpsCommand::Resume { id } => {
            let record = ops.resume(&id, &mut progress).await?;
            report(global, &record)
        }
        OpsCommand::Abandon { id } => {
            let record = ops.abandon(&id)?;
            eprintln!("operation {} abandoned", record.id);
            report(global, &record)
        }
        OpsCommand::Watch { .. } => bail!("ops watch follows a daemon's operation: pass --socket"),
        _ => bail!("not a journal command"),
    }
}

/// `path` made absolute against the working directory (a journaled
/// operation may be resumed from elsewhere).
fn absolute(path: &std::path::Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}
