//! `snapshot`: a verified snapshot from a healthy voting member (never a
//! learner, never one whose status reports errors) into a directory, named
//! with the cluster, time and revision, then retention.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt as _};

use serde::{Deserialize, Serialize};

use super::cluster::{VOTER_CALL_TIMEOUT, member_address, member_list_any};
use super::plan::{Facts, Plan, PlannedStep, Step, StepInfo, need};
use super::policy::{Source, pick_source};
use super::{Journal, OpSpec, OpState, Ops, OpsError, Outcome};
use crate::client::{ByteStream, MemberId};

/// Options of a snapshot ([`OpSpec::Snapshot`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct SnapshotOptions {
    /// Where snapshots go (`None`: the operations layer's snapshot
    /// directory, [`Ops::set_snapshot_defaults`]).
    pub dir: Option<PathBuf>,
    /// Keep the newest N verified snapshots of this cluster; 0 keeps all
    /// (`None`: the operations layer's retention).
    pub keep: Option<usize>,
    /// Off-host instead of `dir`: `s3://BUCKET/PREFIX` (feature `backup`),
    /// compressed with zstd, and with `encrypt` age-encrypted, streamed
    /// with no plaintext on disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// age recipients (`age1...`) of an off-host snapshot.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub encrypt: Vec<String>,
    /// How the S3 store is reached (addressing, region, endpoint).
    #[serde(flatten)]
    pub s3: super::S3Access,
    /// Store a recovery kit beside an encrypted off-host snapshot: the
    /// cluster's secret-encryption keys, members, CA fingerprints and
    /// configuration digests, encrypted to the same recipients.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kit: bool,
    /// Retention tiers of an off-host store, beside `keep` (the newest N).
    #[serde(skip_serializing_if = "Tiers::is_empty")]
    pub tiers: Tiers,
}

/// Besides the newest N: the newest backup of each of the latest `hourly`
/// hours, `daily` days and `weekly` ISO weeks that have one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Tiers {
    /// Hours.
    pub hourly: usize,
    /// Days.
    pub daily: usize,
    /// ISO weeks.
    pub weekly: usize,
}

impl Tiers {
    /// These tiers.
    pub fn new(hourly: usize, daily: usize, weekly: usize) -> Tiers {
        Tiers {
            hourly,
            daily,
            weekly,
        }
    }

    /// Whether no tier keeps anything.
    pub fn is_empty(&self) -> bool {
        *self == Tiers::default()
    }
}

impl SnapshotOptions {
    /// Into `dir` (or the default directory), keeping `keep` (or the
    /// default retention).
    pub fn new(dir: Option<PathBuf>, keep: Option<usize>) -> SnapshotOptions {
        SnapshotOptions {
            dir,
            keep,
            ..SnapshotOptions::default()
        }
    }
}

/// The steps of a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SnapshotStep {
    /// Take the verified snapshot.
    Snapshot,
    /// Remove the oldest beyond the retention.
    Retention,
}

impl StepInfo for SnapshotStep {
    fn name(&self) -> &'static str {
        match self {
            SnapshotStep::Snapshot => "snapshot",
            SnapshotStep::Retention => "retention",
        }
    }

    fn destructive(&self) -> bool {
        false
    }

    fn precondition(&self) -> Option<super::fresh::CheckKind> {
        None
    }
}

impl SnapshotStep {
    fn describe(self, facts: &SnapshotFacts) -> String {
        match self {
            SnapshotStep::Snapshot => match &facts.off_host {
                Some(o) => format!(
                    "verified snapshot from {} ({}), zstd{}, streamed to {}",
                    facts.source.name,
                    facts.source.address,
                    if o.recipients.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " then age for {} recipient(s), no plaintext on disk",
                            o.recipients.len()
                        )
                    },
                    o.store
                ),
                None => format!(
                    "verified snapshot from {} ({}) into {}",
                    facts.source.name,
                    facts.source.address,
                    facts.dir.display()
                ),
            },
            SnapshotStep::Retention => {
                let tiers = facts.off_host.as_ref().map_or(facts.tiers, |o| o.tiers);
                let mut keep = match (facts.keep, tiers.is_empty()) {
                    (0, true) => "keep every snapshot".to_string(),
                    (0, false) => "keep the newest".to_string(),
                    (n, _) => format!("keep the newest {n} verified snapshots"),
                };
                if !tiers.is_empty() {
                    let each: Vec<String> = [
                        (tiers.hourly, "hours"),
                        (tiers.daily, "days"),
                        (tiers.weekly, "ISO weeks"),
                    ]
                    .into_iter()
                    .filter(|(n, _)| *n > 0)
                    .map(|(n, unit)| format!("{n} {unit}"))
                    .collect();
                    keep += &format!(", and the newest of each of the latest {}", each.join(", "));
                }
                let place = facts
                    .off_host
                    .as_ref()
                    .map_or_else(|| facts.dir.display().to_string(), |o| o.store.clone());
                format!("{keep} in {place}; nothing else is touched")
            }
        }
    }
}

/// What a snapshot's preflight chose and its steps recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SnapshotFacts {
    /// The member it is taken from.
    pub source: Source,
    /// The directory (resolved).
    pub dir: PathBuf,
    /// The retention (resolved).
    pub keep: usize,
    /// Retention tiers beside `keep` for the directory.
    #[serde(default, skip_serializing_if = "Tiers::is_empty")]
    pub tiers: Tiers,
    /// The verified snapshot, once taken.
    pub snapshot: Option<PathBuf>,
    /// Where an off-host snapshot goes, and how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_host: Option<OffHost>,
}

/// An off-host snapshot's store, as planned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OffHost {
    /// `s3://BUCKET/PREFIX`, or a directory (absolute).
    pub store: String,
    /// `path` or `virtual`; empty for a directory.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub addressing: String,
    /// The region given (else the environment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The endpoint given (else the environment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// age recipients (public keys).
    pub recipients: Vec<String>,
    /// The stored object's key, once stored.
    pub key: Option<String>,
    /// The stored object's size, once stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Whether a recovery kit goes beside it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kit: bool,
    /// Retention tiers beside the newest N.
    #[serde(default, skip_serializing_if = "Tiers::is_empty")]
    pub tiers: Tiers,
}

/// Suffix of our snapshot files; the sidecar adds `.json`.
const EXT: &str = ".db";

impl Ops {
    /// Preflight of a snapshot: picks the member to take it from.
    pub(super) async fn plan_snapshot(&self, options: &SnapshotOptions) -> Result<Plan, OpsError> {
        let view = self.read_view().await?;
        let source = pick_source(&view, None)?;
        let dir = self.snapshot_dir(options.dir.as_ref());
        let dir = std::path::absolute(&dir).unwrap_or(dir);
        let off_host = match &options.store {
            Some(store) => Some(self.plan_off_host(store, options)?),
            // Encrypted (or with a kit) in a directory: the same pipeline
            // as off-host, into that directory.
            None if !options.encrypt.is_empty() || options.kit => {
                Some(self.plan_off_host(&dir.display().to_string(), options)?)
            }
            None => None,
        };
        let facts = SnapshotFacts {
            source,
            dir,
            keep: options.keep.unwrap_or(self.snapshot_keep),
            tiers: if off_host.is_some() {
                Tiers::default()
            } else {
                options.tiers
            },
            snapshot: None,
            off_host,
        };
        let steps = [SnapshotStep::Snapshot, SnapshotStep::Retention]
            .into_iter()
            .map(|s| PlannedStep::new(Step::Snapshot(s), s.describe(&facts)))
            .collect();
        Ok(Plan::new(
            OpSpec::Snapshot(options.clone()),
            steps,
            Vec::new(),
            Facts::Snapshot(facts),
            &view.basis(),
        ))
    }

    pub(super) async fn snapshot_step(
        &mut self,
        step: SnapshotStep,
        facts: &mut SnapshotFacts,
    ) -> Result<Outcome, OpsError> {
        match step {
            SnapshotStep::Snapshot if facts.off_host.is_some() => {
                self.snapshot_off_host(facts).await
            }
            SnapshotStep::Retention if facts.off_host.is_some() => {
                self.retain_off_host(facts).await
            }
            SnapshotStep::Snapshot => {
                let (path, source, note) = self
                    .take_snapshot_retrying(&facts.source, None, &facts.dir)
                    .await?;
                let detail = format!("{} (from {}){note}", path.display(), source.address);
                facts.source = source;
                facts.snapshot = Some(path);
                Ok(Outcome::done(detail))
            }
            SnapshotStep::Retention => {
                let newest = need(&facts.snapshot, "snapshot")?;
                let held = held_snapshots(&self.journal, &self.fingerprint)?;
                let removed = retain(
                    &facts.dir,
                    &self.context,
                    facts.keep,
                    facts.tiers,
                    newest,
                    &held,
                )?;
                Ok(Outcome::done(if removed.is_empty() {
                    "nothing to remove".to_string()
                } else {
                    format!("removed {}", removed.join(", "))
                }))
            }
        }
    }

    /// Takes a verified snapshot from the node at `address` into `dir` as
    /// `CONTEXT-TIME-revREVISION.db` (with its `.json` sidecar); returns
    /// its path and what the verification found.
    pub(super) async fn take_snapshot(
        &self,
        address: &str,
        dir: &Path,
    ) -> Result<(PathBuf, crate::snapshot::SnapshotReport), OpsError> {
        std::fs::create_dir_all(dir).map_err(|source| OpsError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let now = time::OffsetDateTime::now_utc();
        let stamp = format!("{}Z", super::compact_utc(now, true));
        let base = format!("{}-{stamp}", safe_name(&self.context));
        let taking = dir.join(format!("{base}{EXT}"));
        let stall = self.snapshot_stall;
        let stalled = || OpsError::SnapshotStalled {
            node: address.to_string(),
            seconds: stall.as_secs(),
        };
        let stream = tokio::time::timeout(stall, self.client.node(address).etcd_snapshot())
            .await
            .map_err(|_| stalled())??;
        let node = stream.node().to_string();
        let flag = Arc::new(AtomicBool::new(false));
        let guarded = stall_guard(stream, stall, flag.clone());
        let saved = match crate::snapshot::Save::from_chunks(guarded, node)
            .to(&taking)
            .await
        {
            Ok(saved) => saved,
            Err(_) if flag.load(Ordering::Relaxed) => return Err(stalled()),
            Err(e) => return Err(e.into()),
        };
        let path = dir.join(format!("{base}-rev{}{EXT}", saved.report.status.revision));
        let sidecar = PathBuf::from(format!("{}.json", path.display()));
        let io = |source| OpsError::Io {
            path: path.clone(),
            source,
        };
        std::fs::rename(&saved.sidecar, &sidecar).map_err(io)?;
        std::fs::rename(&saved.path, &path).map_err(io)?;
        crate::atomic::sync_parent(&path).map_err(io)?;
        Ok((path, saved.report))
    }
}

impl Ops {
    /// A verified snapshot from `first`; when its stream stalls, once more
    /// from another healthy voter (never `exclude`, the member leaving).
    /// Returns the path, the source used, and a note of the retry.
    pub(super) async fn take_snapshot_retrying(
        &self,
        first: &Source,
        exclude: Option<MemberId>,
        dir: &Path,
    ) -> Result<(PathBuf, Source, String), OpsError> {
        let stalled = match self.take_snapshot(&first.address, dir).await {
            Ok((path, _)) => return Ok((path, first.clone(), String::new())),
            Err(e @ OpsError::SnapshotStalled { .. }) => e,
            Err(e) => return Err(e),
        };
        let Some(source) = self.other_source(&first.address, exclude).await else {
            return Err(stalled);
        };
        let (path, _) = self.take_snapshot(&source.address, dir).await?;
        let note = format!("; {stalled}, taken from {} instead", source.name);
        Ok((path, source, note))
    }
}

impl Ops {
    /// A healthy voter other than the one at `avoid` (whose etcd may hang)
    /// and `exclude`: the member list is asked of the endpoint, then of
    /// each endpoint's node in turn, each call bounded.
    async fn other_source(&self, avoid: &str, exclude: Option<MemberId>) -> Option<Source> {
        let client = self.client.with_call_timeout(VOTER_CALL_TIMEOUT);
        let hosts: Vec<String> = self
            .endpoint_hosts()
            .into_iter()
            .filter(|h| h != avoid)
            .collect();
        let members = member_list_any(&client, &hosts).await.ok()?;
        for member in members {
            let Some(address) = member_address(&member) else {
                continue;
            };
            if member.is_learner || Some(member.id) == exclude || address == avoid {
                continue;
            }
            let status = client.node(address.as_str()).etcd_status().await;
            if matches!(status, Ok(s) if s.errors.is_empty()) {
                return Some(Source {
                    name: member.hostname,
                    address,
                });
            }
        }
        None
    }
}

/// `stream` with every chunk (the first included) due within `idle`: a
/// source that stops sending ends the stream with an error, and `stalled`
/// is set.
pub(super) fn stall_guard(
    stream: ByteStream,
    idle: Duration,
    stalled: Arc<AtomicBool>,
) -> impl Stream<Item = Result<Bytes, crate::Error>> + Unpin + Send {
    let node = stream.node().to_string();
    Box::pin(futures::stream::unfold(Some(stream), move |state| {
        let (node, stalled) = (node.clone(), stalled.clone());
        async move {
            let mut stream = state?;
            match tokio::time::timeout(idle, stream.next()).await {
                Ok(Some(item)) => Some((item, Some(stream))),
                Ok(None) => None,
                Err(_) => {
                    stalled.store(true, Ordering::Relaxed);
                    let failure = crate::client::Failure {
                        node: Some(node),
                        message: format!("no snapshot bytes for {} s", idle.as_secs()),
                    };
                    Some((Err(crate::Error::DeadlineExceeded(failure)), None))
                }
            }
        }
    }))
}

fn safe_name(context: &str) -> String {
    context
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The snapshots retention leaves alone on the cluster of `fingerprint`:
/// each one an operation took (a retire's or a migration's safety copy, a
/// snapshot operation's own) while that operation has not succeeded
/// (running, failed, needs attention, abandoned or cancelled): a person may
/// need it to repair what the operation left. Read from the journal's
/// `snapshot` fact, which every format and kind that takes one records.
pub fn held_snapshots(journal: &Journal, fingerprint: &str) -> Result<Vec<PathBuf>, OpsError> {
    Ok(journal
        .list(Some(fingerprint))?
        .into_iter()
        .filter(|op| op.state != OpState::Succeeded)
        .filter_map(|op| op.facts["snapshot"].as_str().map(PathBuf::from))
        .collect())
}

/// Keeps the newest `keep` of this cluster's verified snapshots in `dir`
/// (ours: `CONTEXT-TIME-revN.db` with a sidecar, TIME in UTC to the
/// millisecond); never removes `newest`, the newest of them all, any in
/// `held` (by file name: [`held_snapshots`]) nor any other file. Returns
/// the names removed.
fn retain(
    dir: &Path,
    context: &str,
    keep: usize,
    tiers: Tiers,
    newest: &Path,
    held: &[PathBuf],
) -> Result<Vec<String>, OpsError> {
    // keep 0 keeps everything, unless tiers say what to keep.
    if keep == 0 && tiers.is_empty() {
        return Ok(Vec::new());
    }
    let prefix = format!("{}-", safe_name(context));
    let io = |source| OpsError::Io {
        path: dir.to_owned(),
        source,
    };
    let mut ours: Vec<(String, time::OffsetDateTime)> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| dir.join(format!("{name}.json")).exists())
        .filter_map(|name| {
            let taken = taken_at(&name, &prefix)?;
            Some((name, taken))
        })
        .collect();
    // The timestamp in the name sorts chronologically; newest first.
    ours.sort();
    ours.reverse();
    let newest = newest
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let is_held = |name: &str| {
        held.iter()
            .any(|h| h.file_name().and_then(|n| n.to_str()) == Some(name))
    };
    let times: Vec<_> = ours.iter().map(|(_, t)| *t).collect();
    let counts = crate::tiers::Counts {
        keep_last: keep,
        hourly: tiers.hourly,
        daily: tiers.daily,
        weekly: tiers.weekly,
    };
    let mut removed = Vec::new();
    // The newest of all always has a reason to stay.
    for ((name, _), why) in ours.iter().zip(crate::tiers::reasons(counts, &times)) {
        if !why.is_empty() || name == newest || is_held(name) {
            continue;
        }
        for file in [name.clone(), format!("{name}.json")] {
            std::fs::remove_file(dir.join(&file)).map_err(io)?;
        }
        removed.push(name.clone());
    }
    Ok(removed)
}

/// When a snapshot of ours was taken, from its name: `PREFIX` +
/// `YYYYMMDDTHHMMSS.mmmZ` + `-rev` + digits + `.db`; `None` for any other
/// file.
fn taken_at(name: &str, prefix: &str) -> Option<time::OffsetDateTime> {
    if !is_ours(name, prefix) {
        return None;
    }
    let stamp = &name[prefix.len()..prefix.len() + 20];
    let format = time::macros::format_description!(
        "[year][month][day]T[hour][minute][second].[subsecond digits:3]Z"
    );
    time::PrimitiveDateTime::parse(stamp, &format)
        .ok()
        .map(time::PrimitiveDateTime::assume_utc)
}

/// `PREFIX` + `YYYYMMDDTHHMMSS.mmmZ` + `-rev` + digits + `.db`.
fn is_ours(name: &str, prefix: &str) -> bool {
    let Some(rest) = name.strip_prefix(prefix).and_then(|r| r.strip_suffix(EXT)) else {
        return false;
    };
    let Some((stamp, rev)) = rest.split_once("-rev") else {
        return false;
    };
    stamp.len() == 20
        && stamp.ends_with('Z')
        && !rev.is_empty()
        && rev.chars().all(|c| c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_keeps_the_newest_and_touches_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let names = [
            "c-20260101T000000.000Z-rev1.db",
            "c-20260102T000000.000Z-rev2.db",
            "c-20260103T000000.000Z-rev3.db",
        ];
        for n in names {
            std::fs::write(dir.path().join(n), b"x").unwrap();
            std::fs::write(dir.path().join(format!("{n}.json")), b"{}").unwrap();
        }
        // Not ours, or not verified (no sidecar), or another cluster's.
        for other in [
            "notes.txt",
            "c-20250101T000000.000Z-rev9.db",
            "d-20250101T000000.000Z-rev1.db",
        ] {
            std::fs::write(dir.path().join(other), b"x").unwrap();
        }
        std::fs::write(
            dir.path().join("d-20250101T000000.000Z-rev1.db.json"),
            b"{}",
        )
        .unwrap();
        let removed = retain(
            dir.path(),
            "c",
            1,
            Tiers::default(),
            &dir.path().join(names[2]),
            &[],
        )
        .unwrap();
        assert_eq!(removed, [names[1], names[0]]);
        let mut left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "c-20250101T000000.000Z-rev9.db",
                "c-20260103T000000.000Z-rev3.db",
                "c-20260103T000000.000Z-rev3.db.json",
                "d-20250101T000000.000Z-rev1.db",
                "d-20250101T000000.000Z-rev1.db.json",
                "notes.txt"
            ]
        );
    }

    /// keep=1 with a failed retire's safety snapshot in the same directory:
    /// the retire's copy stays (the journal holds it), and so does the
    /// newest; only an unheld older one goes.
    #[test]
    fn retention_keeps_what_an_unfinished_operation_took() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(&dir.path().join("state")).unwrap();
        let snaps = dir.path().join("snaps");
        std::fs::create_dir(&snaps).unwrap();
        let names = [
            "c-20260101T000000.000Z-rev1.db",
            "c-20260102T000000.000Z-rev2.db",
            "c-20260103T000000.000Z-rev3.db",
            "c-20260104T000000.000Z-rev4.db",
        ];
        for n in names {
            std::fs::write(snaps.join(n), b"x").unwrap();
            std::fs::write(snaps.join(format!("{n}.json")), b"{}").unwrap();
        }
        let record = |id: &str, kind: &str, state: OpState, snapshot: &str, ca: &str| {
            let now = super::super::journal::now();
            super::super::OpRecord {
                id: id.into(),
                kind: kind.into(),
                context: "c".into(),
                ca_fingerprint: ca.into(),
                params: serde_json::json!({}),
                facts: serde_json::json!({ "op": kind, "snapshot": snaps.join(snapshot) }),
                format: super::super::journal::FORMAT,
                state,
                created: now.clone(),
                updated: now,
                steps: Vec::new(),
                cluster_lock: None,
            }
        };
        for op in [
            record("r1", "retire", OpState::Failed, names[0], "fp"),
            record("r2", "retire", OpState::Succeeded, names[1], "fp"),
            record(
                "r3",
                "retire",
                OpState::NeedsAttention,
                names[2],
                "other-cluster",
            ),
        ] {
            journal.create(&op).unwrap();
            journal.set_state(&op.id, op.state).unwrap();
        }
        let held = held_snapshots(&journal, "fp").unwrap();
        assert_eq!(held, [snaps.join(names[0])]);
        let removed = retain(
            &snaps,
            "c",
            1,
            Tiers::default(),
            &snaps.join(names[3]),
            &held,
        )
        .unwrap();
        assert_eq!(removed, [names[2], names[1]]);
        assert!(snaps.join(names[0]).exists(), "the failed retire's copy");
        assert!(snaps.join(format!("{}.json", names[0])).exists());
        assert!(snaps.join(names[3]).exists(), "the newest");
    }

    /// A directory kept by tiers: keep 0 with daily 2 keeps the newest of
    /// each of the two latest days; other clusters' files are not touched.
    #[test]
    fn directory_retention_by_tiers() {
        let dir = tempfile::tempdir().unwrap();
        let names = [
            "c-20260104T180000.000Z-rev6.db",
            "c-20260104T090000.000Z-rev5.db",
            "c-20260103T230000.000Z-rev4.db",
            "c-20260103T010000.000Z-rev3.db",
            "c-20260102T120000.000Z-rev2.db",
        ];
        for n in names
            .iter()
            .chain(["d-20250101T000000.000Z-rev1.db"].iter())
        {
            std::fs::write(dir.path().join(n), b"x").unwrap();
            std::fs::write(dir.path().join(format!("{n}.json")), b"{}").unwrap();
        }
        let tiers = Tiers {
            daily: 2,
            ..Tiers::default()
        };
        let mut removed =
            retain(dir.path(), "c", 0, tiers, &dir.path().join(names[0]), &[]).unwrap();
        removed.sort();
        assert_eq!(removed, [names[4], names[3], names[1]]);
        for kept in [names[0], names[2], "d-20250101T000000.000Z-rev1.db"] {
            assert!(dir.path().join(kept).exists(), "{kept}");
        }
        // A name that is ours in shape but not a date is never read as one.
        assert!(taken_at("c-20261340T000000.000Z-rev1.db", "c-").is_none());
        assert_eq!(
            taken_at(names[0], "c-"),
            Some(time::macros::datetime!(2026-01-04 18:00 UTC))
        );
    }
}
