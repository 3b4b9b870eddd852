//! The risk report: what would hurt on the night, read before it. Per
//! cluster: the newest verified backup's age (on this host and off it),
//! the last drill's age and result, each etcd member's database against
//! its quota and the cluster's alarms, the voter count, learners that stay
//! learners, members with no node behind them, Talos and etcd version
//! skew across the control plane, each credential's certificate expiry,
//! the cluster lock's holder, and operations left needing a person.
//!
//! Nothing here writes to a cluster: the calls are reads (etcd member
//! list, status and alarms; Version; the admin kubeconfig and the lock's
//! Lease when the credential may read them). What two looks need (a
//! learner's age, an orphan seen twice, as Omni's etcd audit waits for
//! before it acts) is kept in the state directory
//! (`STATE_DIR/report/FINGERPRINT.json`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::cluster::{ClusterView, VOTER_CALL_TIMEOUT, member_address};
use super::{Facts, OpKind, OpRecord, OpState, Ops, OpsError, StepState};
use crate::client::MemberId;
use crate::tls::Credentials;

/// etcd's own default `--quota-backend-bytes` (2 GiB), which Talos keeps
/// unless `cluster.etcd.extraArgs` sets another.
pub const DEFAULT_QUOTA_BYTES: u64 = 2 << 30;

/// When a finding is a warning and when it is critical.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Thresholds {
    /// The newest verified backup older than this is a warning (26 h: a
    /// daily schedule and its slack).
    pub backup_warn: Duration,
    /// ... and older than this critical (72 h).
    pub backup_crit: Duration,
    /// The last successful drill older than this is a warning (8 days).
    pub drill_warn: Duration,
    /// ... and older than this critical (31 days).
    pub drill_crit: Duration,
    /// A member's database at this share of the quota is a warning (0.7).
    pub db_warn: f64,
    /// ... and at this share critical (0.9; etcd raises NOSPACE at 1).
    pub db_crit: f64,
    /// A learner first seen longer ago than this is stuck (10 minutes;
    /// Talos promotes a caught-up learner within seconds).
    pub learner_window: Duration,
    /// A certificate expiring within this is a warning (30 days).
    pub cert_warn: Duration,
    /// ... and within this critical (7 days).
    pub cert_crit: Duration,
}

impl Default for Thresholds {
    fn default() -> Thresholds {
        const HOUR: u64 = 3600;
        const DAY: u64 = 24 * HOUR;
        Thresholds {
            backup_warn: Duration::from_secs(26 * HOUR),
            backup_crit: Duration::from_secs(3 * DAY),
            drill_warn: Duration::from_secs(8 * DAY),
            drill_crit: Duration::from_secs(31 * DAY),
            db_warn: 0.7,
            db_crit: 0.9,
            learner_window: Duration::from_secs(600),
            cert_warn: Duration::from_secs(30 * DAY),
            cert_crit: Duration::from_secs(7 * DAY),
        }
    }
}

/// What [`Ops::report`] reads beside the cluster.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReportOptions {
    /// The thresholds.
    pub thresholds: Thresholds,
    /// The members' backend quota in bytes (default
    /// [`DEFAULT_QUOTA_BYTES`]).
    pub quota_bytes: u64,
    /// The credentials whose certificates are reported, by purpose
    /// (`admin`, `backup`, ...).
    pub credentials: Vec<(String, Credentials)>,
}

impl Default for ReportOptions {
    fn default() -> ReportOptions {
        ReportOptions {
            thresholds: Thresholds::default(),
            quota_bytes: DEFAULT_QUOTA_BYTES,
            credentials: Vec::new(),
        }
    }
}

/// How bad a finding, or the whole report, is. The CLI's exit code is its
/// number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Nothing to do.
    Ok,
    /// Look at it before the next change.
    Warning,
    /// It would hurt tonight.
    Critical,
}

impl Level {
    /// 0, 1 or 2: the exit code monitoring reads (as Nagios plugins do).
    pub fn exit_code(self) -> i32 {
        match self {
            Level::Ok => 0,
            Level::Warning => 1,
            Level::Critical => 2,
        }
    }

    /// `ok`, `warning` or `critical`.
    pub fn name(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warning => "warning",
            Level::Critical => "critical",
        }
    }
}

/// Every check a report makes, by the name its findings carry.
pub const REPORT_CHECKS: &[&str] = &[
    "backup",
    "off-host-backup",
    "drill",
    "operation",
    "db-size",
    "alarm",
    "voters",
    "learner",
    "orphan",
    "etcd",
    "version-skew",
    "certificate",
    "lock",
];

/// One thing the report flags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Which check: one of [`REPORT_CHECKS`].
    pub check: String,
    /// How bad.
    pub level: Level,
    /// What it is about (a member, a credential, an operation), if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// What is wrong and what to do, in words.
    pub message: String,
}

/// A verified backup, as the journal records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackupSeen {
    /// Where it is: a file, or `STORE/KEY`.
    pub location: String,
    /// When its snapshot was taken (RFC 3339).
    pub at: String,
    /// Its age in seconds.
    pub age_seconds: u64,
    /// The operation that took it.
    pub op: String,
}

/// The last drill that ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrillSeen {
    /// When it ended (RFC 3339).
    pub at: String,
    /// Its age in seconds.
    pub age_seconds: u64,
    /// Whether it succeeded.
    pub ok: bool,
    /// The operation.
    pub op: String,
}

/// One etcd member, as the report read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberSeen {
    /// Its id (hex).
    pub id: String,
    /// Its name (the node's hostname).
    pub name: String,
    /// The node's address, from the member's peer URL.
    pub address: Option<String>,
    /// Whether it is a learner.
    pub learner: bool,
    /// The Talos version the node at its address reports.
    pub talos_version: Option<String>,
    /// The etcd version its status reports.
    pub etcd_version: Option<String>,
    /// Its database's size in bytes.
    pub db_size: Option<i64>,
    /// The share of the quota it takes.
    pub quota_share: Option<f64>,
    /// Whether a node answers for it (its etcd status names this member).
    pub node_behind: bool,
    /// What the calls to it answered, when one failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A credential's certificate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CertificateSeen {
    /// Its purpose (`admin`, `backup`, ...).
    pub purpose: String,
    /// Its roles.
    pub roles: Vec<String>,
    /// When it expires (RFC 3339).
    pub not_after: String,
    /// Seconds until then (negative: expired).
    pub remaining_seconds: i64,
}

/// The cluster lock (the Lease every admin host sees).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LockSeen {
    /// `free`, `held`, `expired` (a holder that stopped renewing: the next
    /// operation takes it over) or `unknown`.
    pub state: String,
    /// Its holder (`OPID@HOST:STATE_DIR`), when held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Seconds since it was taken, when held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_seconds: Option<u64>,
    /// Why it could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The risk report of one cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RiskReport {
    /// The talosconfig context.
    pub context: String,
    /// sha256 of the cluster's CA certificate (hex).
    pub ca_fingerprint: String,
    /// When it was made (RFC 3339).
    pub generated: String,
    /// The worst finding's level.
    pub level: Level,
    /// What it flags, worst first.
    pub findings: Vec<Finding>,
    /// The newest verified snapshot kept on this host.
    pub backup_on_host: Option<BackupSeen>,
    /// The newest verified backup stored off the host.
    pub backup_off_host: Option<BackupSeen>,
    /// The last drill.
    pub drill: Option<DrillSeen>,
    /// The etcd members.
    pub members: Vec<MemberSeen>,
    /// The members' alarms (`MEMBER: ALARM`).
    pub alarms: Vec<String>,
    /// The credentials' certificates.
    pub certificates: Vec<CertificateSeen>,
    /// The cluster lock.
    pub lock: LockSeen,
    /// The quota the database sizes are measured against, in bytes.
    pub quota_bytes: u64,
}

/// Whether a node answers for an etcd member at its address.
enum Behind {
    /// Its etcd answers as this member.
    Yes,
    /// The node there is another member now (the address was reused).
    Other(MemberId),
    /// A Talos node answers there, its etcd does not.
    EtcdSilent(String),
    /// Nothing answers there.
    Silent(String),
    /// The member has no peer URL.
    NoAddress,
}

impl Behind {
    fn detail(&self) -> Option<String> {
        match self {
            Behind::Yes => None,
            Behind::Other(id) => Some(format!("the node at its address is member {id}")),
            Behind::EtcdSilent(e) => Some(format!("its node answers, its etcd does not: {e}")),
            Behind::Silent(e) => Some(format!("no node answers at its address: {e}")),
            Behind::NoAddress => Some("no peer URL".into()),
        }
    }
}

/// What one report leaves for the next (two looks).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Looks {
    /// Learners by member id (hex): when first seen (Unix seconds).
    #[serde(default)]
    learners: BTreeMap<String, i64>,
    /// Members seen with no node behind them: when first seen.
    #[serde(default)]
    orphans: BTreeMap<String, i64>,
}

impl Looks {
    fn path(state_dir: &Path, fingerprint: &str) -> PathBuf {
        state_dir.join("report").join(format!("{fingerprint}.json"))
    }

    fn load(path: &Path) -> Looks {
        std::fs::read(path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    fn save(&self, path: &Path) -> Result<(), OpsError> {
        let io = |e: std::io::Error| OpsError::Io {
            path: path.to_owned(),
            source: e,
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(io)?;
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        std::fs::write(&tmp, bytes).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
}

/// `value` seconds as a short age: `40s`, `12m`, `5h`, `3d`.
pub fn age_text(seconds: u64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn parse_time(text: Option<&str>) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text?, &Rfc3339).ok()
}

fn seconds_since(at: OffsetDateTime, now: OffsetDateTime) -> u64 {
    u64::try_from((now - at).whole_seconds()).unwrap_or(0)
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap_or_default()
}

/// When step `name` of `record` ended, if it finished.
fn step_done(record: &OpRecord, name: &str) -> Option<OffsetDateTime> {
    let step = record
        .steps
        .iter()
        .find(|s| s.name == name && s.state == StepState::Done)?;
    parse_time(step.finished.as_deref())
}

/// The newest verified snapshot on this host and off it, newest first in
/// `records`: a snapshot operation's, or the one a retire or migration
/// took before its leave, while its file is still there.
fn backups(records: &[OpRecord], now: OffsetDateTime) -> (Option<BackupSeen>, Option<BackupSeen>) {
    let mut on_host = None;
    let mut off_host = None;
    for record in records {
        if on_host.is_some() && off_host.is_some() {
            break;
        }
        let Some(at) = step_done(record, "snapshot") else {
            continue;
        };
        let seen = |location: String| BackupSeen {
            location,
            at: rfc3339(at),
            age_seconds: seconds_since(at, now),
            op: record.id.clone(),
        };
        let (file, stored) = match record.typed_facts() {
            // A snapshot operation's backup counts once it succeeded (its
            // retention and upload come after the snapshot step).
            Ok(Facts::Snapshot(_)) if record.state != OpState::Succeeded => continue,
            Ok(Facts::Snapshot(f)) => {
                let stored = f.off_host.as_ref().and_then(|o| {
                    let key = o.key.as_ref()?;
                    Some(format!("{}/{key}", o.store.trim_end_matches('/')))
                });
                (f.snapshot, stored)
            }
            Ok(Facts::Retire(f)) => (f.snapshot, None),
            Ok(Facts::Migrate(f)) => (f.retire.snapshot, None),
            _ => (None, None),
        };
        if let Some(stored) = stored {
            if off_host.is_none() {
                off_host = Some(seen(stored));
            }
        } else if let Some(file) = file.filter(|f| f.is_file())
            && on_host.is_none()
        {
            on_host = Some(seen(file.display().to_string()));
        }
    }
    (on_host, off_host)
}

/// The newest drill that ended.
fn last_drill(records: &[OpRecord], now: OffsetDateTime) -> Option<DrillSeen> {
    records
        .iter()
        .filter(|r| r.kind == OpKind::Drill.name())
        .find_map(|record| {
            let ok = match record.state {
                OpState::Succeeded => true,
                OpState::Failed => false,
                _ => return None,
            };
            let at = parse_time(Some(&record.updated))?;
            Some(DrillSeen {
                at: rfc3339(at),
                age_seconds: seconds_since(at, now),
                ok,
                op: record.id.clone(),
            })
        })
}

/// The level of an age against a warning and a critical bound.
fn age_level(age: u64, warn: Duration, crit: Duration) -> Level {
    if age > crit.as_secs() {
        Level::Critical
    } else if age > warn.as_secs() {
        Level::Warning
    } else {
        Level::Ok
    }
}

/// `v1.13.9` as (1, 13).
fn minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.trim_start_matches('v').split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The findings of a version skew: more than one minor among `versions`
/// (member name, version).
fn skew(what: &str, versions: &[(String, String)]) -> Option<Finding> {
    let minors: std::collections::BTreeSet<(u32, u32)> =
        versions.iter().filter_map(|(_, v)| minor(v)).collect();
    if minors.len() < 2 {
        return None;
    }
    let list: Vec<String> = versions.iter().map(|(n, v)| format!("{n} {v}")).collect();
    Some(Finding {
        check: "version-skew".into(),
        level: Level::Warning,
        subject: None,
        message: format!(
            "{what} minors differ across the control plane ({}): finish the upgrade before another change",
            list.join(", ")
        ),
    })
}

/// The findings of a report, as they are found.
#[derive(Default)]
struct Findings(Vec<Finding>);

impl Findings {
    fn add(&mut self, check: &str, level: Level, subject: Option<String>, message: String) {
        debug_assert!(REPORT_CHECKS.contains(&check), "{check}");
        self.0.push(Finding {
            check: check.into(),
            level,
            subject,
            message,
        });
    }
}

/// The journal's part: the newest backups on and off the host, the last
/// drill, and operations left for a person.
fn journal_findings(
    records: &[OpRecord],
    now: OffsetDateTime,
    t: &Thresholds,
    f: &mut Findings,
) -> (Option<BackupSeen>, Option<BackupSeen>, Option<DrillSeen>) {
    let (on_host, off_host) = backups(records, now);
    match on_host
        .iter()
        .chain(off_host.iter())
        .min_by_key(|b| b.age_seconds)
    {
        None => f.add(
            "backup",
            Level::Critical,
            None,
            "no verified snapshot on record: take one (`ops snapshot`) before any change".into(),
        ),
        Some(newest) => {
            let level = age_level(newest.age_seconds, t.backup_warn, t.backup_crit);
            if level > Level::Ok {
                f.add(
                    "backup",
                    level,
                    Some(newest.location.clone()),
                    format!(
                        "the newest verified backup is {} old (op {})",
                        age_text(newest.age_seconds),
                        newest.op
                    ),
                );
            }
        }
    }
    match &off_host {
            None => f.add(
                "off-host-backup",
                Level::Warning,
                None,
                "no backup stored off this host: a lost admin host loses every snapshot (`ops snapshot --to s3://...`)".into(),
            ),
            Some(b) if b.age_seconds > t.backup_crit.as_secs() => f.add(
                "off-host-backup",
                Level::Warning,
                Some(b.location.clone()),
                format!(
                    "the newest off-host backup is {} old",
                    age_text(b.age_seconds)
                ),
            ),
            Some(_) => {}
        }
    let drill = last_drill(records, now);
    match &drill {
        None => f.add(
            "drill",
            Level::Warning,
            None,
            "no restore drill on record: a backup never restored is no backup (`ops drill`)".into(),
        ),
        Some(d) if !d.ok => f.add(
            "drill",
            Level::Critical,
            Some(d.op.clone()),
            format!(
                "the last drill failed {} ago: `ops show {}` says why",
                age_text(d.age_seconds),
                d.op
            ),
        ),
        Some(d) => {
            let level = age_level(d.age_seconds, t.drill_warn, t.drill_crit);
            if level > Level::Ok {
                f.add(
                    "drill",
                    level,
                    Some(d.op.clone()),
                    format!("the last drill is {} old", age_text(d.age_seconds)),
                );
            }
        }
    }
    for record in records {
        if matches!(record.state, OpState::Running | OpState::NeedsAttention) {
            f.add(
                "operation",
                Level::Critical,
                Some(record.id.clone()),
                format!(
                    "{} operation {} is {}: `ops show {}`, then resume or abandon it",
                    record.kind,
                    record.id,
                    if record.state == OpState::Running {
                        "running or interrupted"
                    } else {
                        "waiting for a person"
                    },
                    record.id
                ),
            );
        }
    }

    (on_host, off_host, drill)
}

/// The credentials' certificates and how soon they expire.
fn certificate_findings(
    options: &ReportOptions,
    now: OffsetDateTime,
    f: &mut Findings,
) -> Vec<CertificateSeen> {
    let t = &options.thresholds;
    let mut certificates = Vec::new();
    for (purpose, credentials) in &options.credentials {
        let info = match credentials.certificate_info() {
            Ok(info) => info,
            Err(e) => {
                f.add(
                    "certificate",
                    Level::Critical,
                    Some(purpose.clone()),
                    format!("the {purpose} certificate cannot be read: {e}"),
                );
                continue;
            }
        };
        let remaining = (info.not_after - now).whole_seconds();
        let days = remaining.div_euclid(86400);
        let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
        let level = if remaining < secs(t.cert_crit) {
            Level::Critical
        } else if remaining < secs(t.cert_warn) {
            Level::Warning
        } else {
            Level::Ok
        };
        if level > Level::Ok {
            let when = if remaining < 0 {
                "has expired".to_string()
            } else {
                format!("expires in {days} days")
            };
            f.add(
                    "certificate",
                    level,
                    Some(purpose.clone()),
                    format!(
                        "the {purpose} certificate ({}) {when} ({}): an admin issues a new one with `talosctl-rs config new --roles {} PATH`",
                        info.roles.join(","),
                        info.not_after.date(),
                        info.roles.join(",")
                    ),
                );
        }
        certificates.push(CertificateSeen {
            purpose: purpose.clone(),
            roles: info.roles.clone(),
            not_after: rfc3339(info.not_after),
            remaining_seconds: remaining,
        });
    }

    certificates
}

impl Ops {
    /// Builds the risk report of this cluster: reads only, from the journal,
    /// the state directory and the cluster (see the module's text). A
    /// cluster whose etcd does not answer still gets a report, its etcd
    /// findings saying so.
    pub async fn report(&self, options: &ReportOptions) -> Result<RiskReport, OpsError> {
        let now = OffsetDateTime::now_utc();
        let mut f = Findings::default();
        let records = self.list()?;
        let (backup_on_host, backup_off_host, drill) =
            journal_findings(&records, now, &options.thresholds, &mut f);
        let certificates = certificate_findings(options, now, &mut f);
        let (members, alarms) = self.etcd_findings(options, now, &mut f).await?;
        let lock = self.lock_seen(now).await;
        if lock.state == "held" && lock.age_seconds.is_some_and(|a| a > 6 * 3600) {
            f.add(
                "lock",
                Level::Warning,
                lock.holder.clone(),
                format!(
                    "the cluster lock has been held for {} by {}",
                    age_text(lock.age_seconds.unwrap_or(0)),
                    lock.holder.as_deref().unwrap_or("?")
                ),
            );
        }

        let mut findings = f.0;
        findings.sort_by_key(|f| std::cmp::Reverse(f.level));
        let level = findings.iter().map(|f| f.level).max().unwrap_or(Level::Ok);
        Ok(RiskReport {
            context: self.context.clone(),
            ca_fingerprint: self.fingerprint.clone(),
            generated: rfc3339(now),
            level,
            findings,
            backup_on_host,
            backup_off_host,
            drill,
            members,
            alarms,
            certificates,
            lock,
            quota_bytes: options.quota_bytes,
        })
    }

    /// The etcd members as read now, with the findings about them, their
    /// databases, versions and alarms; what two looks need is kept in the
    /// state directory.
    async fn etcd_findings(
        &self,
        options: &ReportOptions,
        now: OffsetDateTime,
        f: &mut Findings,
    ) -> Result<(Vec<MemberSeen>, Vec<String>), OpsError> {
        let t = &options.thresholds;
        let looks_path = Looks::path(&self.state_dir, &self.fingerprint);
        let previous = Looks::load(&looks_path);
        let mut looks = Looks::default();
        let mut members = Vec::new();
        let mut alarms = Vec::new();
        match ClusterView::read_via(&self.client, VOTER_CALL_TIMEOUT, &self.endpoint_hosts()).await
        {
            Err(e) => f.add(
                "etcd",
                Level::Critical,
                None,
                format!("no member list: {e}"),
            ),
            Ok(view) => {
                let voters = view.voters().count();
                if voters < 3 {
                    f.add(
                        "voters",
                        Level::Warning,
                        None,
                        format!(
                            "{voters} voting member{}: {}",
                            if voters == 1 { "" } else { "s" },
                            if voters == 1 {
                                "any failure stops the cluster".to_string()
                            } else {
                                "fewer than three tolerate no failure".to_string()
                            }
                        ),
                    );
                } else if voters % 2 == 0 {
                    f.add(
                        "voters",
                        Level::Warning,
                        None,
                        format!(
                            "{voters} voting members: an even count tolerates no more failures than {}",
                            voters - 1
                        ),
                    );
                }
                let client = self.client.with_call_timeout(VOTER_CALL_TIMEOUT);
                for member in &view.members {
                    let address = member_address(member);
                    let id = member.id.to_string();
                    // A member that never started has no name yet.
                    let name = match (&member.hostname, &address) {
                        (h, _) if !h.is_empty() => h.clone(),
                        (_, Some(address)) => address.clone(),
                        _ => id.clone(),
                    };
                    let mut seen = MemberSeen {
                        id: id.clone(),
                        name: name.clone(),
                        address: address.clone(),
                        learner: member.is_learner,
                        talos_version: None,
                        etcd_version: None,
                        db_size: None,
                        quota_share: None,
                        node_behind: false,
                        detail: None,
                    };
                    let voter_status = view
                        .statuses
                        .iter()
                        .find(|(m, _)| m.id == member.id)
                        .map(|(_, s)| s.as_ref().cloned().map_err(ToString::to_string));
                    let node = address.as_deref().map(|a| client.node(a));
                    let status = match (voter_status, &node) {
                        (Some(status), _) => Some(status),
                        (None, Some(node)) => {
                            Some(node.etcd_status().await.map_err(|e| e.to_string()))
                        }
                        (None, None) => None,
                    };
                    if let Some(node) = &node {
                        seen.talos_version = node.version().await.ok().map(|v| v.tag);
                    }
                    let behind = match status {
                        None => Behind::NoAddress,
                        Some(Ok(status)) if status.member_id == member.id => {
                            seen.etcd_version = Some(status.protocol_version.clone());
                            seen.db_size = Some(status.db_size);
                            let share = status.db_size as f64 / options.quota_bytes.max(1) as f64;
                            seen.quota_share = Some(share);
                            let level = if share >= t.db_crit {
                                Level::Critical
                            } else if share >= t.db_warn {
                                Level::Warning
                            } else {
                                Level::Ok
                            };
                            if level > Level::Ok {
                                f.add(
                                    "db-size",
                                    level,
                                    Some(name.clone()),
                                    format!(
                                        "{}'s etcd database is {} bytes, {:.0}% of its {} byte quota: defragment (`ops defrag`) or raise the quota before NOSPACE stops writes",
                                        name,
                                        status.db_size,
                                        share * 100.0,
                                        options.quota_bytes
                                    ),
                                );
                            }
                            Behind::Yes
                        }
                        Some(Ok(status)) => Behind::Other(status.member_id),
                        // A Talos node answering at the address with its
                        // etcd silent is an unhealthy member, not an orphan.
                        Some(Err(e)) if seen.talos_version.is_some() => Behind::EtcdSilent(e),
                        Some(Err(e)) => Behind::Silent(e),
                    };
                    seen.node_behind = matches!(behind, Behind::Yes);
                    seen.detail = behind.detail();
                    match &behind {
                        Behind::Yes => {}
                        Behind::EtcdSilent(e) => {
                            if !member.is_learner {
                                f.add(
                                    "etcd",
                                    Level::Warning,
                                    Some(name.clone()),
                                    format!("{}'s etcd does not answer: {e}", name),
                                );
                            }
                        }
                        Behind::Other(_) | Behind::Silent(_) | Behind::NoAddress => {
                            let first = previous.orphans.get(&id).copied();
                            looks
                                .orphans
                                .insert(id.clone(), first.unwrap_or(now.unix_timestamp()));
                            let (level, looked) = match first {
                                Some(_) => (Level::Critical, "seen on two looks"),
                                None => (Level::Warning, "first look; the next report confirms it"),
                            };
                            f.add(
                                "orphan",
                                level,
                                Some(name.clone()),
                                format!(
                                    "etcd member {} ({id}) has no node behind it ({}; {looked}): if its machine is gone, remove it (`talosctl-rs etcd remove-member {id}`)",
                                    name,
                                    seen.detail.as_deref().unwrap_or("no answer")
                                ),
                            );
                        }
                    }
                    if member.is_learner {
                        let first = previous.learners.get(&id).copied();
                        let since = first.unwrap_or(now.unix_timestamp());
                        looks.learners.insert(id.clone(), since);
                        let age = u64::try_from(now.unix_timestamp() - since).unwrap_or(0);
                        if first.is_some() && age >= t.learner_window.as_secs() {
                            f.add(
                                "learner",
                                Level::Warning,
                                Some(name.clone()),
                                format!(
                                    "{} ({id}) has been a learner for {} at least: Talos promotes a caught-up learner within seconds; look at its etcd log (`talosctl-rs -n {} logs etcd`)",
                                    name,
                                    age_text(age),
                                    address.as_deref().unwrap_or(&name)
                                ),
                            );
                        }
                    }
                    members.push(seen);
                }
                let talos: Vec<(String, String)> = members
                    .iter()
                    .filter_map(|m| Some((m.name.clone(), m.talos_version.clone()?)))
                    .collect();
                let etcd: Vec<(String, String)> = members
                    .iter()
                    .filter_map(|m| Some((m.name.clone(), m.etcd_version.clone()?)))
                    .collect();
                f.0.extend(
                    [skew("Talos", &talos), skew("etcd", &etcd)]
                        .into_iter()
                        .flatten(),
                );
                match self.client.etcd_alarm_list().await {
                    Ok(list) => {
                        for alarm in list {
                            let name = view
                                .find_id_member(alarm.member_id)
                                .map(|m| m.hostname.clone())
                                .unwrap_or_else(|| alarm.member_id.to_string());
                            let text = format!("{name}: {:?}", alarm.alarm);
                            f.add(
                                "alarm",
                                Level::Critical,
                                Some(name.clone()),
                                format!(
                                    "etcd alarm {text}: writes are refused until it is disarmed (`talosctl-rs etcd alarm disarm`)"
                                ),
                            );
                            alarms.push(text);
                        }
                    }
                    Err(e) => f.add(
                        "alarm",
                        Level::Warning,
                        None,
                        format!("the alarms could not be read: {e}"),
                    ),
                }
            }
        }
        looks.save(&looks_path)?;

        Ok((members, alarms))
    }

    /// The cluster lock's Lease, read (never taken).
    async fn lock_seen(&self, now: OffsetDateTime) -> LockSeen {
        let unknown = |detail: String| LockSeen {
            state: "unknown".into(),
            holder: None,
            age_seconds: None,
            detail: Some(detail),
        };
        let clients = match self.lease_clients().await {
            Ok(clients) => clients,
            Err(e) => return unknown(e),
        };
        let path = format!(
            "/apis/coordination.k8s.io/v1/namespaces/{}/leases/{}",
            super::LEASE_NAMESPACE,
            super::LEASE_NAME
        );
        let mut last = String::from("no API server answered");
        for client in clients {
            let lease = match client.get(&path).await {
                Ok(lease) => lease,
                Err(e) if e.status() == Some(404) => {
                    return LockSeen {
                        state: "free".into(),
                        holder: None,
                        age_seconds: None,
                        detail: None,
                    };
                }
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let spec = &lease["spec"];
            let holder = spec["holderIdentity"].as_str().unwrap_or_default();
            if holder.is_empty() {
                return LockSeen {
                    state: "free".into(),
                    holder: None,
                    age_seconds: None,
                    detail: None,
                };
            }
            let renewed = parse_time(spec["renewTime"].as_str());
            let acquired = parse_time(spec["acquireTime"].as_str());
            let duration = spec["leaseDurationSeconds"].as_i64().unwrap_or(15);
            let expired = renewed.is_none_or(|r| (now - r).whole_seconds() > duration);
            return LockSeen {
                state: if expired { "expired" } else { "held" }.into(),
                holder: Some(holder.to_string()),
                age_seconds: acquired.map(|a| seconds_since(a, now)),
                detail: None,
            };
        }
        unknown(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_are_judged_against_both_bounds() {
        let (warn, crit) = (Duration::from_secs(10), Duration::from_secs(20));
        assert_eq!(age_level(10, warn, crit), Level::Ok);
        assert_eq!(age_level(11, warn, crit), Level::Warning);
        assert_eq!(age_level(21, warn, crit), Level::Critical);
        // An absurd bound is a bound, not an overflow.
        assert_eq!(age_level(u64::MAX, Duration::MAX, Duration::MAX), Level::Ok);
    }

    #[test]
    fn a_skew_is_a_difference_of_minors_not_of_patches() {
        let v = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect()
        };
        assert!(skew("Talos", &v(&[("a", "v1.13.9"), ("b", "v1.13.2")])).is_none());
        let found = skew("Talos", &v(&[("a", "v1.13.9"), ("b", "v1.14.0")])).unwrap();
        assert!(
            found.message.contains("a v1.13.9, b v1.14.0"),
            "{}",
            found.message
        );
        assert!(skew("etcd", &v(&[("a", "3.6.12"), ("b", "3.7.1")])).is_some());
        assert_eq!(minor("unknown"), None);
    }

    #[test]
    fn levels_order_and_exit_codes() {
        assert!(Level::Critical > Level::Warning && Level::Warning > Level::Ok);
        assert_eq!(
            [Level::Ok, Level::Warning, Level::Critical].map(Level::exit_code),
            [0, 1, 2]
        );
        assert_eq!(age_text(59), "59s");
        assert_eq!(age_text(3 * 3600), "3h");
        assert_eq!(age_text(5 * 86400), "5d");
    }
}
