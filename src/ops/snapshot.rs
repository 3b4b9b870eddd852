//! `snapshot`: a verified snapshot from a healthy voting member (never a
//! learner, never one whose status reports errors) into a directory, named
//! with the cluster, time and revision, then retention.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::cluster::{ClusterView, member_address};
use super::{OpKind, Ops, OpsError, Outcome, Plan, PlannedStep, fact};

/// Options of [`Ops::plan_snapshot`].
#[derive(Debug, Clone)]
pub struct SnapshotOptions {
    /// Where snapshots go.
    pub dir: PathBuf,
    /// Keep the newest N verified snapshots of this cluster (0: keep all).
    pub keep: usize,
}

/// Suffix of our snapshot files; the sidecar adds `.json`.
const EXT: &str = ".db";

impl Ops {
    /// Preflight of a snapshot: picks the member to take it from.
    pub async fn plan_snapshot(&self, options: &SnapshotOptions) -> Result<Plan, OpsError> {
        let view = ClusterView::read(&self.client).await?;
        let source = pick_source(&view, None)?;
        let mut facts = serde_json::Map::new();
        facts.insert("source".into(), json!(source.1));
        let keep = if options.keep == 0 {
            "keep every snapshot".to_string()
        } else {
            format!("keep the newest {} verified snapshots", options.keep)
        };
        Ok(Plan {
            kind: OpKind::Snapshot,
            params: json!({ "dir": options.dir, "keep": options.keep }),
            steps: vec![
                PlannedStep {
                    name: "snapshot".into(),
                    description: format!(
                        "verified snapshot from {} ({}) into {}",
                        source.0,
                        source.1,
                        options.dir.display()
                    ),
                    destructive: false,
                },
                PlannedStep {
                    name: "retention".into(),
                    description: format!(
                        "{keep} in {}; nothing else is touched",
                        options.dir.display()
                    ),
                    destructive: false,
                },
            ],
            notes: Vec::new(),
            facts,
        })
    }

    pub(super) async fn snapshot_step(
        &mut self,
        step: &str,
        facts: &mut serde_json::Map<String, serde_json::Value>,
    ) -> Result<Outcome, OpsError> {
        let params = self.current_params(facts);
        let dir = PathBuf::from(params["dir"].as_str().unwrap_or("."));
        match step {
            "snapshot" => {
                let source = fact(facts, "source").to_string();
                let path = self.take_snapshot(&source, &dir).await?;
                facts.insert("snapshot".into(), json!(path));
                Ok(Outcome::done(format!("{} (from {source})", path.display())))
            }
            "retention" => {
                let keep = params["keep"].as_u64().unwrap_or(0) as usize;
                let newest = PathBuf::from(fact(facts, "snapshot"));
                let removed = retain(&dir, &self.context, keep, &newest)?;
                Ok(Outcome::done(if removed.is_empty() {
                    "nothing to remove".to_string()
                } else {
                    format!("removed {}", removed.join(", "))
                }))
            }
            other => Err(OpsError::step(other, "unknown step")),
        }
    }

    /// The parameters of the operation being run (kept in its facts).
    fn current_params(
        &self,
        facts: &serde_json::Map<String, serde_json::Value>,
    ) -> serde_json::Value {
        facts.get("params").cloned().unwrap_or_default()
    }

    /// Takes a verified snapshot from the node at `address` into `dir` as
    /// `CONTEXT-TIME-revREVISION.db` (with its `.json` sidecar).
    pub(super) async fn take_snapshot(
        &self,
        address: &str,
        dir: &Path,
    ) -> Result<PathBuf, OpsError> {
        std::fs::create_dir_all(dir).map_err(|source| OpsError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let now = time::OffsetDateTime::now_utc();
        let stamp = format!("{}Z", super::compact_utc(now, true));
        let base = format!("{}-{stamp}", safe_name(&self.context));
        let taking = dir.join(format!("{base}{EXT}"));
        let stream = self.client.node(address).etcd_snapshot().await?;
        let saved = crate::snapshot::save(stream).to(&taking).await?;
        let path = dir.join(format!("{base}-rev{}{EXT}", saved.report.status.revision));
        let sidecar = PathBuf::from(format!("{}.json", path.display()));
        let io = |source| OpsError::Io {
            path: path.clone(),
            source,
        };
        std::fs::rename(&saved.sidecar, &sidecar).map_err(io)?;
        std::fs::rename(&saved.path, &path).map_err(io)?;
        crate::files::sync_parent(&path).map_err(io)?;
        Ok(path)
    }
}

/// Picks a healthy voter to snapshot from, avoiding `exclude`; prefers a
/// follower so the leader is spared the load. Returns (name, address).
pub(super) fn pick_source(
    view: &ClusterView,
    exclude: Option<crate::client::MemberId>,
) -> Result<(String, String), OpsError> {
    let leader = view.leader();
    let mut candidates: Vec<_> = view
        .voters()
        .filter(|m| Some(m.id) != exclude && view.healthy(m.id))
        .collect();
    candidates.sort_by_key(|m| Some(m.id) == leader);
    let member = candidates.first().ok_or_else(|| {
        OpsError::Refused("no healthy voting member to take a snapshot from".into())
    })?;
    let address = member_address(member)
        .ok_or_else(|| OpsError::Refused(format!("member {} has no address", member.hostname)))?;
    Ok((member.hostname.clone(), address))
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

/// Keeps the newest `keep` of this cluster's verified snapshots in `dir`
/// (ours: `CONTEXT-TIME-revN.db` with a sidecar, TIME in UTC to the millisecond); never removes `newest`
/// nor any other file. Returns the names removed.
fn retain(dir: &Path, context: &str, keep: usize, newest: &Path) -> Result<Vec<String>, OpsError> {
    if keep == 0 {
        return Ok(Vec::new());
    }
    let prefix = format!("{}-", safe_name(context));
    let io = |source| OpsError::Io {
        path: dir.to_owned(),
        source,
    };
    let mut ours: Vec<String> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| is_ours(name, &prefix) && dir.join(format!("{name}.json")).exists())
        .collect();
    // The timestamp in the name sorts chronologically.
    ours.sort();
    ours.reverse();
    let newest = newest
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let mut removed = Vec::new();
    for name in ours.iter().skip(keep).filter(|n| *n != newest) {
        for file in [name.clone(), format!("{name}.json")] {
            std::fs::remove_file(dir.join(&file)).map_err(io)?;
        }
        removed.push(name.clone());
    }
    Ok(removed)
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
        let removed = retain(dir.path(), "c", 1, &dir.path().join(names[2])).unwrap();
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
}
