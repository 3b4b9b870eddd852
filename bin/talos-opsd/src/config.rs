//! The daemon's TOML configuration: where its state, socket and listeners
//! are, and the clusters it manages with their snapshot schedules. Errors
//! name the file, the line and the key at fault.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use talos_client::config::{Overrides, ResolvedContext, TalosConfig};

pub use crate::cadence::{Cadence, CronSchedule};

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A key is malformed, unknown, missing or inconsistent.
    #[error("{}:{line}: {key}: {message}", .path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The line at fault (from 1).
        line: usize,
        /// The key at fault, as a path (`cluster[0].snapshots.interval`).
        key: String,
        /// What is wrong.
        message: String,
    },
    /// The file holds no setting at all (a truncated or emptied file, most
    /// likely): refused unless `--allow-empty` says an empty one is meant.
    #[error(
        "{}: the file holds no setting (empty, or only comments): it would run with no cluster; pass --allow-empty if that is meant",
        .path.display()
    )]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where the journal, locks and default snapshot directories live.
    pub state_dir: Option<PathBuf>,
    /// The Unix socket of the API.
    pub socket: Option<PathBuf>,
    /// Where Prometheus metrics are served (`host:port`); off when absent.
    pub metrics_addr: Option<String>,
    /// An optional TCP listener with mutual TLS.
    pub tcp: Option<TcpConfig>,
    /// How old a leave, removal or reset in flight at a crash may be for
    /// the daemon to resume it unattended at start (default 10m); an older
    /// one is marked needs-attention: a person decides.
    pub resume_within: Option<HumanDuration>,
    /// The clusters managed.
    #[serde(default, rename = "cluster")]
    pub clusters: Vec<ClusterConfig>,
}

/// The TCP listener: mutual TLS with a client CA of its own, never plain.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpConfig {
    /// `host:port` to listen on.
    pub listen: String,
    /// The server's certificate chain (PEM).
    pub cert: PathBuf,
    /// The server's private key (PEM).
    pub key: PathBuf,
    /// The CA that signs client certificates (PEM).
    pub client_ca: PathBuf,
}

/// One managed cluster.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Its name in the API.
    pub name: String,
    /// Its talosconfig.
    pub talosconfig: PathBuf,
    /// The context (default: the talosconfig's current one).
    pub context: Option<String>,
    /// A narrower talosconfig for the work that only reads etcd:
    /// snapshots and restore drills, scheduled or started through the API,
    /// and their resumes. Its client certificate needs `os:etcd:backup`
    /// (Talos gives it exactly EtcdSnapshot, EtcdStatus, EtcdMemberList and
    /// EtcdAlarmList), `os:operator` or `os:admin`; its current context is
    /// used. Absent: `talosconfig` serves them too.
    pub backup_talosconfig: Option<PathBuf>,
    /// A talosconfig for the risk report (GetReport and the report's
    /// metrics), which only reads: its client certificate needs
    /// `os:reader`, `os:operator` or `os:admin` (Talos gives `os:reader`
    /// the etcd reads and Version; `os:etcd:backup` lacks Version). Absent:
    /// `talosconfig` serves the report.
    pub reader_talosconfig: Option<PathBuf>,
    /// Scheduled snapshots; none when absent.
    pub snapshots: Option<SnapshotSchedule>,
    /// Scheduled restore drills; none when absent.
    pub drills: Option<DrillSchedule>,
    /// Scheduled defragmentations; none when absent.
    pub defrag: Option<DefragSchedule>,
    /// Scheduled operations that may change the cluster (a defragmentation)
    /// go on with the state directory's lock alone where the cluster lock
    /// cannot be taken because Kubernetes cannot be reached (a cluster
    /// without Kubernetes); journaled and audited. Default false.
    #[serde(default)]
    pub without_cluster_lock: bool,
}

/// When and where to take a cluster's snapshots, and what to keep.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotSchedule {
    /// Time between snapshots (`30s`, `15m`, `6h`, `1d`); or `cron`.
    pub interval: Option<HumanDuration>,
    /// A cron expression, evaluated in UTC (`0 */6 * * *`); or `interval`.
    pub cron: Option<CronSchedule>,
    /// Where they go (default: STATE_DIR/snapshots/NAME).
    pub dir: Option<PathBuf>,
    /// Keep the newest N (0: no count limit).
    #[serde(default)]
    pub keep: usize,
    /// Remove catalogued snapshots older than this.
    pub max_age: Option<HumanDuration>,
    /// A store instead of `dir`: `s3://BUCKET/PREFIX` (credentials from
    /// the daemon's AWS_* environment only), or an absolute directory that
    /// holds the same object set as a bucket would.
    pub store: Option<String>,
    /// `path` (self-hosted servers; the default) or `virtual` addressing.
    pub s3_addressing: Option<String>,
    /// The store's region (default: `AWS_REGION`, else `us-east-1`).
    pub s3_region: Option<String>,
    /// The store's endpoint URL (default: `AWS_ENDPOINT_URL`, else AWS).
    pub s3_endpoint: Option<String>,
    /// age recipients (`age1...`) the snapshots are encrypted to (then
    /// stored as `.db.zst.age`, never plaintext, also in a directory).
    #[serde(default)]
    pub encrypt: Vec<String>,
    /// Store a recovery kit beside each (needs `encrypt`).
    #[serde(default)]
    pub kit: bool,
    /// Retention tiers beside `keep`, for a store or a directory: the
    /// newest backup of each of the latest N hours, days and ISO weeks.
    #[serde(default)]
    pub hourly: usize,
    /// See `hourly`.
    #[serde(default)]
    pub daily: usize,
    /// See `hourly`.
    #[serde(default)]
    pub weekly: usize,
    /// Each snapshot starts up to this much later than its schedule says,
    /// at random, so many daemons do not all hit one store at once.
    pub jitter: Option<HumanDuration>,
}

/// Scheduled restore drills of a cluster's newest off-host backup.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrillSchedule {
    /// Time between drills; or `cron`.
    pub interval: Option<HumanDuration>,
    /// A cron expression, evaluated in UTC; or `interval`.
    pub cron: Option<CronSchedule>,
    /// The store (default: the cluster's `snapshots.store`).
    pub from: Option<String>,
    /// Files of age identities that decrypt the backups.
    #[serde(default)]
    pub identity: Vec<PathBuf>,
    /// `path` or `virtual` addressing (default: the snapshots' setting).
    pub s3_addressing: Option<String>,
    /// The store's region (default: the snapshots' setting).
    pub s3_region: Option<String>,
    /// The store's endpoint URL (default: the snapshots' setting).
    pub s3_endpoint: Option<String>,
}

impl DrillSchedule {
    /// How the drilled store is reached: this schedule's keys, else the
    /// snapshots' ones.
    pub fn access(&self, snapshots: Option<&SnapshotSchedule>) -> talos_client::ops::S3Access {
        let from_snapshots = snapshots.map(SnapshotSchedule::access).unwrap_or_default();
        let mut access = talos_client::ops::S3Access::default();
        access.addressing = self.s3_addressing.clone().or(from_snapshots.addressing);
        access.region = self.s3_region.clone().or(from_snapshots.region);
        access.endpoint = self.s3_endpoint.clone().or(from_snapshots.endpoint);
        access
    }
}

/// Scheduled defragmentation of a cluster's etcd members (`ops defrag`):
/// at each time, the members whose in-use share of their database file is
/// below the threshold, one at a time, the leader last after a forfeit.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefragSchedule {
    /// Time between runs; or `cron`.
    pub interval: Option<HumanDuration>,
    /// A cron expression, evaluated in UTC (`0 3 * * 0`); or `interval`.
    pub cron: Option<CronSchedule>,
    /// In-use share below which a member is defragmented, in (0, 1]
    /// (default: `ops defrag`'s, 0.5).
    pub threshold: Option<f64>,
    /// Defragment every member at each run, whatever its share in use.
    #[serde(default)]
    pub all: bool,
    /// Each run starts up to this much later than its schedule says, at
    /// random.
    pub jitter: Option<HumanDuration>,
}

impl DefragSchedule {
    /// The defragmentation each run plans.
    pub fn defrag_options(&self) -> talos_client::ops::DefragOptions {
        let mut options = talos_client::ops::DefragOptions::new();
        if let Some(threshold) = self.threshold {
            options.threshold = threshold;
        }
        options.all = self.all;
        options
    }
}

impl SnapshotSchedule {
    /// How the store is reached, as configured.
    pub fn access(&self) -> talos_client::ops::S3Access {
        let mut access = talos_client::ops::S3Access::default();
        access.addressing = self.s3_addressing.clone();
        access.region = self.s3_region.clone();
        access.endpoint = self.s3_endpoint.clone();
        access
    }

    /// The snapshot the schedule (and a caller who names no place) takes:
    /// into the configured store with its encryption, kit and tiers, or
    /// into the snapshot directory.
    pub fn snapshot_options(&self) -> talos_client::ops::SnapshotOptions {
        let mut options = talos_client::ops::SnapshotOptions::default();
        if let Some(store) = &self.store {
            options.store = Some(store.clone());
            if store.starts_with("s3://") {
                options.s3 = self.access();
            }
        }
        options.encrypt = self.encrypt.clone();
        options.kit = self.kit;
        options.tiers = talos_client::ops::Tiers::new(self.hourly, self.daily, self.weekly);
        options
    }
}

/// A duration written as a number and a unit: `500ms`, `30s`, `15m`, `6h`,
/// `1h30m`, `7d` ([`parse_duration`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text)
            .map(HumanDuration)
            .map_err(serde::de::Error::custom)
    }
}

/// The longest duration the configuration accepts (3650 days, about ten
/// years): enough for any schedule or retention, and far from the limits of
/// date and clock arithmetic.
pub const MAX_DURATION: Duration = Duration::from_secs(3650 * 86400);

/// Parses a duration as the library's one parser reads it (Go's syntax,
/// `1h30m`, `500ms`, and `d` for days: `7d`); zero and anything above
/// [`MAX_DURATION`] are refused.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    use talos_client::input::{Units, duration};
    let text = text.trim();
    let longer = || format!("{text:?} is longer than the maximum, 3650d");
    let d = duration("duration", text, Units::WithDays).map_err(|e| {
        if e.reason.starts_with("longer than") {
            longer()
        } else {
            format!("{text:?}: {}", e.reason)
        }
    })?;
    if d > MAX_DURATION {
        return Err(longer());
    }
    if d.is_zero() {
        return Err(format!("{text:?} is zero"));
    }
    Ok(d)
}

/// A cluster ready to use: its configuration and its resolved context.
#[derive(Debug, Clone)]
pub struct ResolvedCluster {
    /// As configured.
    pub config: ClusterConfig,
    /// The talosconfig context.
    pub context: ResolvedContext,
    /// `backup_talosconfig`'s current context, when configured.
    pub backup: Option<ResolvedContext>,
    /// `reader_talosconfig`'s current context, when configured.
    pub reader: Option<ResolvedContext>,
}

/// The roles Talos lets take an etcd snapshot (the `rules` map of
/// internal/app/machined/pkg/system/services/machined.go, EtcdSnapshot; the
/// other calls a snapshot makes allow these and `os:reader`).
pub const SNAPSHOT_ROLES: &[&str] = &["os:admin", "os:operator", "os:etcd:backup"];

/// The roles Talos lets make every call of the risk report: the etcd
/// reads and Version (the same `rules` map; Kubeconfig, which the
/// cluster lock's Lease needs, is `os:admin`'s alone, so a reader's report
/// says the lock is unknown).
pub const REPORT_ROLES: &[&str] = &["os:admin", "os:operator", "os:reader"];

impl ResolvedCluster {
    /// The context an operation of `kind` runs with: the backup credential
    /// for snapshots and drills where one is configured, else the
    /// cluster's talosconfig.
    pub fn context_for(&self, kind: talos_client::ops::OpKind) -> &ResolvedContext {
        use talos_client::ops::OpKind;
        match (&self.backup, kind) {
            (Some(backup), OpKind::Snapshot | OpKind::Drill) => backup,
            _ => &self.context,
        }
    }

    /// The context the risk report reads with: the reader credential where
    /// one is configured, else the cluster's talosconfig.
    pub fn report_context(&self) -> &ResolvedContext {
        self.reader.as_ref().unwrap_or(&self.context)
    }
}

impl Config {
    /// Reads and checks `path`: syntax, keys, durations, cron expressions
    /// that fire within a year, unique cluster names, each talosconfig and
    /// its context. A file with no setting at all is refused unless
    /// `allow_empty`.
    pub fn load(
        path: &Path,
        allow_empty: bool,
    ) -> Result<(Config, Vec<ResolvedCluster>), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let settings = text
            .lines()
            .map(str::trim)
            .any(|l| !l.is_empty() && !l.starts_with('#'));
        if !settings && !allow_empty {
            return Err(ConfigError::Empty {
                path: path.to_owned(),
            });
        }
        Config::parse(&text, path)
    }

    /// As [`Config::load`], from text read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<(Config, Vec<ResolvedCluster>), ConfigError> {
        let invalid = |line: usize, key: String, message: String| ConfigError::Invalid {
            path: path.to_owned(),
            line,
            key,
            message,
        };
        let config: Config = {
            let de = toml::Deserializer::parse(text).map_err(|e| {
                let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(1);
                invalid(line, String::new(), e.message().to_string())
            })?;
            serde_path_to_error::deserialize(de).map_err(|e| {
                let key = e.path().to_string();
                let inner = e.into_inner();
                let line = inner
                    .span()
                    .map(|s| line_of(text, s.start))
                    .unwrap_or_else(|| find_key_line(text, &key));
                invalid(line, key, inner.message().to_string())
            })?
        };
        let mut resolved = Vec::new();
        for (i, cluster) in config.clusters.iter().enumerate() {
            let key = |k: &str| format!("cluster[{i}].{k}");
            let from = cluster_section(text, i);
            let name_line = find_key_line(&text[from..], "name") + line_of(text, from) - 1;
            if cluster.name.is_empty()
                || !cluster
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(invalid(
                    name_line,
                    key("name"),
                    "a cluster name is letters, digits, '-' and '_'".into(),
                ));
            }
            if config.clusters[..i].iter().any(|c| c.name == cluster.name) {
                return Err(invalid(
                    name_line,
                    key("name"),
                    format!("cluster {:?} is configured twice", cluster.name),
                ));
            }
            if let Some(schedule) = &cluster.snapshots
                && schedule.interval.is_some() == schedule.cron.is_some()
            {
                let line = text[from..]
                    .lines()
                    .position(|l| l.trim() == "[cluster.snapshots]")
                    .map_or(1, |i| i + line_of(text, from));
                return Err(invalid(
                    line,
                    key("snapshots"),
                    "give exactly one of interval and cron".into(),
                ));
            }
            let line_in_cluster =
                |k: &str| find_key_line(&text[from..], k) + line_of(text, from) - 1;
            let section_line = |header: &str| {
                text[from..]
                    .lines()
                    .position(|l| l.trim() == header)
                    .map_or(1, |i| i + line_of(text, from))
            };
            if let Some(schedule) = &cluster.snapshots {
                check_snapshot_store(schedule).map_err(|(k, message)| {
                    invalid(line_in_cluster(k), key(&format!("snapshots.{k}")), message)
                })?;
            }
            if let Some(drills) = &cluster.drills {
                if drills.interval.is_some() == drills.cron.is_some() {
                    return Err(invalid(
                        section_line("[cluster.drills]"),
                        key("drills"),
                        "give exactly one of interval and cron".into(),
                    ));
                }
                check_drills(drills, cluster.snapshots.as_ref()).map_err(|(k, message)| {
                    let line = if k.is_empty() {
                        section_line("[cluster.drills]")
                    } else {
                        line_in_cluster(k)
                    };
                    let at = if k.is_empty() {
                        key("drills")
                    } else {
                        key(&format!("drills.{k}"))
                    };
                    invalid(line, at, message)
                })?;
            }
            if let Some(defrag) = &cluster.defrag {
                if defrag.interval.is_some() == defrag.cron.is_some() {
                    return Err(invalid(
                        section_line("[cluster.defrag]"),
                        key("defrag"),
                        "give exactly one of interval and cron".into(),
                    ));
                }
                if let Some(t) = defrag.threshold
                    && !(t > 0.0 && t <= 1.0)
                {
                    return Err(invalid(
                        line_in_cluster("threshold"),
                        key("defrag.threshold"),
                        format!("{t} is not an in-use share in (0, 1]"),
                    ));
                }
            }
            let now = chrono::Utc::now();
            for (section, cron) in [
                (
                    "snapshots",
                    cluster.snapshots.as_ref().and_then(|s| s.cron.as_ref()),
                ),
                (
                    "drills",
                    cluster.drills.as_ref().and_then(|s| s.cron.as_ref()),
                ),
                (
                    "defrag",
                    cluster.defrag.as_ref().and_then(|s| s.cron.as_ref()),
                ),
            ] {
                if let Some(Err(message)) = cron.map(|c| c.check(now)) {
                    let header = section_line(&format!("[cluster.{section}]"));
                    let line = text
                        .lines()
                        .enumerate()
                        .skip(header)
                        .find(|(_, l)| {
                            l.trim_start()
                                .strip_prefix("cron")
                                .is_some_and(|r| r.trim_start().starts_with('='))
                        })
                        .map_or(header, |(i, _)| i + 1);
                    return Err(invalid(line, key(&format!("{section}.cron")), message));
                }
            }
            let tc_line = line_in_cluster("talosconfig");
            let context = TalosConfig::read(&cluster.talosconfig)
                .and_then(|tc| {
                    let overrides = Overrides::default().with_context(cluster.context.clone());
                    tc.resolve(&overrides, &cluster.talosconfig)
                })
                .map_err(|e| invalid(tc_line, key("talosconfig"), e.to_string()))?;
            let narrower = |file: &Option<PathBuf>,
                            name: &str,
                            allowed: &[&str],
                            purpose: &str,
                            suggested: &str| {
                let Some(file) = file else {
                    return Ok(None);
                };
                let at_fault = |message: String| invalid(line_in_cluster(name), key(name), message);
                let context = TalosConfig::read(file)
                    .and_then(|tc| tc.resolve(&Overrides::default(), file))
                    .map_err(|e| at_fault(e.to_string()))?;
                let roles = context
                    .credentials
                    .certificate_info()
                    .map_err(|e| at_fault(format!("{}: {e}", file.display())))?
                    .roles;
                if !roles.iter().any(|r| allowed.contains(&r.as_str())) {
                    return Err(at_fault(format!(
                        "{}: its client certificate's roles ({}) cannot {purpose}: Talos allows it to {} (issue one with `talosctl-rs config new --roles {suggested} PATH`)",
                        file.display(),
                        if roles.is_empty() {
                            "none".to_string()
                        } else {
                            roles.join(", ")
                        },
                        allowed.join(", ")
                    )));
                }
                Ok(Some(context))
            };
            let backup = narrower(
                &cluster.backup_talosconfig,
                "backup_talosconfig",
                SNAPSHOT_ROLES,
                "take a snapshot",
                "os:etcd:backup",
            )?;
            let reader = narrower(
                &cluster.reader_talosconfig,
                "reader_talosconfig",
                REPORT_ROLES,
                "read the risk report",
                "os:reader",
            )?;
            resolved.push(ResolvedCluster {
                config: cluster.clone(),
                context,
                backup,
                reader,
            });
        }
        Ok((config, resolved))
    }
}

/// Checks the store settings of a snapshot schedule as the snapshot will
/// use them; the error names the key at fault. `store` is `s3://...` or an
/// absolute directory; encryption, kits and tiers go with either, and with
/// a plain `dir`; the S3 keys only with an `s3://` store.
fn check_snapshot_store(s: &SnapshotSchedule) -> Result<(), (&'static str, String)> {
    let access = s.access();
    let addressing = access
        .addressing()
        .parse::<talos_client::backup::Addressing>()
        .map_err(|e| ("s3_addressing", e.to_string()))?;
    let remote = s.store.as_deref().filter(|st| st.starts_with("s3://"));
    if remote.is_none() {
        for (k, set) in [
            ("s3_addressing", s.s3_addressing.is_some()),
            ("s3_region", s.s3_region.is_some()),
            ("s3_endpoint", s.s3_endpoint.is_some()),
        ] {
            if set {
                return Err((
                    k,
                    "is for an S3 store: set `store = \"s3://BUCKET/PREFIX\"`".into(),
                ));
            }
        }
    }
    if let Some(store) = &s.store {
        if s.dir.is_some() {
            return Err(("store", "give one of dir and store".into()));
        }
        match remote {
            Some(store) => check_access(store, addressing, &access)?,
            None if !Path::new(store).is_absolute() => {
                return Err((
                    "store",
                    format!("{store:?}: a store is s3://BUCKET/PREFIX or an absolute directory"),
                ));
            }
            None => {}
        }
    }
    for r in &s.encrypt {
        r.parse::<talos_client::backup::Recipient>()
            .map_err(|e| ("encrypt", format!("{r:?}: {e}")))?;
    }
    if s.kit && s.encrypt.is_empty() {
        return Err((
            "kit",
            "a recovery kit holds the cluster's secret-encryption keys and is only stored encrypted: set `encrypt`".into(),
        ));
    }
    Ok(())
}

/// Checks a store's URL, region and endpoint as the store will take them;
/// the error names the key at fault (`store`, `s3_region`, `s3_endpoint`).
fn check_access(
    store: &str,
    addressing: talos_client::backup::Addressing,
    access: &talos_client::ops::S3Access,
) -> Result<(), (&'static str, String)> {
    let mut settings = talos_client::backup::S3Settings::parse(store, addressing)
        .map_err(|e| ("store", e.to_string()))?;
    settings.region = access.region.clone();
    settings.check().map_err(|e| ("s3_region", e.to_string()))?;
    settings.region = None;
    settings.endpoint = access.endpoint.clone();
    settings
        .check()
        .map_err(|e| ("s3_endpoint", e.to_string()))?;
    Ok(())
}

/// Checks a drill schedule: a store to drill and the identities that open
/// what is stored there.
fn check_drills(
    d: &DrillSchedule,
    snapshots: Option<&SnapshotSchedule>,
) -> Result<(), (&'static str, String)> {
    let from = d
        .from
        .as_deref()
        .or_else(|| snapshots.and_then(|s| s.store.as_deref()))
        .ok_or((
            "",
            "no store to drill: set `from`, or `store` under [cluster.snapshots]".to_string(),
        ))?;
    let access = d.access(snapshots);
    let addressing = access
        .addressing()
        .parse::<talos_client::backup::Addressing>()
        .map_err(|e| ("s3_addressing", e.to_string()))?;
    if from.starts_with("s3://") {
        check_access(from, addressing, &access)
            .map_err(|(k, e)| (if k == "store" { "from" } else { k }, e))?;
    } else if !Path::new(from).is_absolute() {
        return Err((
            "from",
            format!("{from:?}: drills read a store, s3://BUCKET/PREFIX or an absolute directory"),
        ));
    } else if let Some(k) = [
        ("s3_addressing", d.s3_addressing.is_some()),
        ("s3_region", d.s3_region.is_some()),
        ("s3_endpoint", d.s3_endpoint.is_some()),
    ]
    .into_iter()
    .find_map(|(k, set)| set.then_some(k))
    {
        return Err((k, "is for an S3 store, not a directory".into()));
    }
    for file in &d.identity {
        talos_client::backup::read_identities(file).map_err(|e| ("identity", e.to_string()))?;
    }
    let encrypted = snapshots.is_some_and(|s| !s.encrypt.is_empty());
    if encrypted && d.identity.is_empty() {
        return Err((
            "identity",
            "the snapshots are encrypted: give the file of an age identity that opens them".into(),
        ));
    }
    Ok(())
}

/// The line (from 1) of byte offset `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at.min(text.len())].matches('\n').count() + 1
}

/// The first line that sets the last segment of `key` (best effort: a
/// missing key is reported at line 1).
fn find_key_line(text: &str, key: &str) -> usize {
    let last = key
        .rsplit('.')
        .next()
        .unwrap_or(key)
        .split('[')
        .next()
        .unwrap_or(key);
    text.lines()
        .position(|l| {
            let l = l.trim_start();
            l.strip_prefix(last)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map(|i| i + 1)
        .unwrap_or(1)
}

/// The byte offset of the `i`th `[[cluster]]` header (0 when not found).
fn cluster_section(text: &str, i: usize) -> usize {
    let mut offset = 0;
    let mut seen = 0;
    for line in text.split_inclusive('\n') {
        if line.trim() == "[[cluster]]" {
            if seen == i {
                return offset;
            }
            seen += 1;
        }
        offset += line.len();
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> (usize, String, String) {
        match Config::parse(text, Path::new("c.toml")).unwrap_err() {
            ConfigError::Invalid {
                line, key, message, ..
            } => (line, key, message),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn the_example_parses() {
        let text = include_str!("../dist/config.example.toml");
        let config: Config = toml::from_str(text).unwrap();
        assert_eq!(config.clusters.len(), 2);
        let schedule = config.clusters[0].snapshots.as_ref().unwrap();
        assert_eq!(schedule.interval.unwrap().0, Duration::from_secs(6 * 3600));
        assert_eq!(schedule.keep, 28);
    }

    #[test]
    fn cron_schedules() {
        let text = "[[cluster]]\nname = \"a\"\ntalosconfig = \"/x\"\n[cluster.snapshots]\ncron = \"*/5 * * * *\"\n";
        let config: Config = toml::from_str(text).unwrap();
        let next = config.clusters[0].snapshots.as_ref().unwrap().until_next();
        assert!(next.unwrap() <= Duration::from_secs(300), "{next:?}");
        let (line, key, message) = err(&text.replace("*/5 * * * *", "every tuesday"));
        assert_eq!(
            (line, key.as_str()),
            (5, "cluster[0].snapshots.cron"),
            "{message}"
        );
        let both = text.replace("cron =", "interval = \"1h\"\ncron =");
        let (line, key, message) = err(&both);
        assert_eq!(
            (line, key.as_str()),
            (4, "cluster[0].snapshots"),
            "{message}"
        );
    }

    /// A cron expression that never fires (or not within a year) is
    /// refused with its key and line, like any other bad value.
    #[test]
    fn a_cron_that_never_fires_is_refused_with_its_line() {
        let text = "[[cluster]]\nname = \"a\"\ntalosconfig = \"/x\"\n[cluster.snapshots]\ninterval = \"1h\"\n[cluster.defrag]\ncron = \"0 0 31 2 *\"\n";
        let (line, key, message) = err(text);
        assert_eq!(
            (line, key.as_str()),
            (7, "cluster[0].defrag.cron"),
            "{message}"
        );
        assert!(message.contains("never fires"), "{message}");
    }

    #[test]
    fn an_empty_file_is_refused_unless_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "# nothing here\n\n").unwrap();
        let e = Config::load(&path, false).unwrap_err();
        assert!(matches!(e, ConfigError::Empty { .. }), "{e}");
        assert!(e.to_string().contains("--allow-empty"), "{e}");
        let (_, clusters) = Config::load(&path, true).unwrap();
        assert!(clusters.is_empty());
    }

    #[test]
    fn defrag_schedules() {
        let text = "[[cluster]]\nname = \"a\"\ntalosconfig = \"/x\"\n[cluster.defrag]\ncron = \"0 3 * * 0\"\nthreshold = 0.3\n";
        let config: Config = toml::from_str(text).unwrap();
        let options = config.clusters[0].defrag.as_ref().unwrap().defrag_options();
        assert_eq!((options.threshold, options.all), (0.3, false));
        let default = text.replace("threshold = 0.3\n", "all = true\n");
        let config: Config = toml::from_str(&default).unwrap();
        let options = config.clusters[0].defrag.as_ref().unwrap().defrag_options();
        assert_eq!(
            (options.threshold, options.all),
            (talos_client::ops::DefragOptions::DEFAULT_THRESHOLD, true)
        );
        for bad in ["0.0", "1.5", "-0.2", "nan"] {
            let (line, key, message) = err(&text.replace("0.3", bad));
            assert_eq!(
                (line, key.as_str()),
                (6, "cluster[0].defrag.threshold"),
                "{bad}: {message}"
            );
            assert!(message.contains("(0, 1]"), "{message}");
        }
        let both = text.replace("cron =", "interval = \"1d\"\ncron =");
        let (line, key, message) = err(&both);
        assert_eq!((line, key.as_str()), (4, "cluster[0].defrag"), "{message}");
        let (_, key, _) = err(&text.replace("threshold", "treshold"));
        assert_eq!(key, "cluster[0].defrag.treshold");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(172800));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5y").is_err());
        assert_eq!(parse_duration("3650d").unwrap(), MAX_DURATION);
    }

    /// Values that once passed and then panicked in date or clock
    /// arithmetic are refused at parse time, naming the maximum.
    #[test]
    fn extreme_durations_are_refused_with_the_maximum() {
        for text in [
            "3651d",
            "5000000d",
            "18446744073709551615d",
            "18446744073709551615s",
            "99999999999999999999999s",
            "18446744073709551615ms",
        ] {
            let e = parse_duration(text).unwrap_err();
            assert!(e.contains("maximum, 3650d"), "{text}: {e}");
        }
        let text = "[[cluster]]\nname = \"a\"\ntalosconfig = \"/x\"\n[cluster.snapshots]\ninterval = \"1h\"\nmax_age = \"5000000d\"\n";
        let (line, key, message) = err(text);
        assert_eq!(
            (line, key.as_str()),
            (6, "cluster[0].snapshots.max_age"),
            "{message}"
        );
    }

    #[test]
    fn a_bad_duration_names_line_and_key() {
        let text = "state_dir = \"/tmp/x\"\n\n[[cluster]]\nname = \"a\"\ntalosconfig = \"/nonexistent\"\n[cluster.snapshots]\ninterval = \"soon\"\n";
        let (line, key, message) = err(text);
        assert_eq!(line, 7);
        assert_eq!(key, "cluster[0].snapshots.interval");
        assert!(message.contains("soon"), "{message}");
    }

    #[test]
    fn an_unknown_key_is_refused() {
        let (line, key, message) = err("state_dir = \"/x\"\nsockett = \"/y\"\n");
        assert_eq!(line, 2);
        assert!(message.contains("sockett"), "{key}: {message}");
    }

    #[test]
    fn a_syntax_error_names_the_line() {
        let (line, _, _) = err("state_dir = \"/x\"\n[[cluster]\n");
        assert_eq!(line, 2);
    }

    #[test]
    fn a_missing_talosconfig_names_the_key() {
        let (line, key, _) = err("[[cluster]]\nname = \"a\"\ntalosconfig = \"/nonexistent/tc\"\n");
        assert_eq!((line, key.as_str()), (3, "cluster[0].talosconfig"));
    }
}
