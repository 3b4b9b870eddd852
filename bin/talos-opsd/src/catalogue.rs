//! The snapshot catalogue: every verified snapshot the daemon took, in a
//! table of the operations journal (same SQLite file, WAL): cluster,
//! operation, node, time, revision, sha256, size and path. Rows follow the
//! files: retention removes both.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, params};
use talos_client::snapshot::SnapshotMetadata;

/// One catalogued snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The cluster's configured name.
    pub cluster: String,
    /// The operation that took it.
    pub operation_id: String,
    /// The member it was taken from.
    pub node: String,
    /// When (RFC 3339, UTC).
    pub taken: String,
    /// etcd revision.
    pub revision: i64,
    /// sha256 of the contents, hex.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
    /// The file.
    pub path: PathBuf,
}

/// Catalogue errors.
#[derive(Debug, thiserror::Error)]
#[error("snapshot catalogue {}: {source}", .path.display())]
pub struct CatalogueError {
    path: PathBuf,
    #[source]
    source: rusqlite::Error,
}

/// The catalogue table in the journal database.
pub struct Catalogue {
    conn: Connection,
    path: PathBuf,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS snapshots (
  path TEXT PRIMARY KEY, cluster TEXT NOT NULL, op_id TEXT NOT NULL,
  node TEXT NOT NULL, taken TEXT NOT NULL, revision INTEGER NOT NULL,
  sha256 TEXT NOT NULL, size INTEGER NOT NULL);
";

impl Catalogue {
    /// Opens the catalogue in `state_dir`'s journal (created by the
    /// operations layer first).
    pub fn open(state_dir: &Path) -> Result<Catalogue, CatalogueError> {
        let path = state_dir.join("journal.sqlite");
        let err = |source| CatalogueError {
            path: path.clone(),
            source,
        };
        let conn = Connection::open(&path).map_err(err)?;
        // The journal is already in WAL mode (Journal::open made it so).
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .and_then(|()| conn.execute_batch(SCHEMA))
            .map_err(err)?;
        Ok(Catalogue { conn, path })
    }

    fn err(&self, source: rusqlite::Error) -> CatalogueError {
        CatalogueError {
            path: self.path.clone(),
            source,
        }
    }

    /// Catalogues the snapshot at `path`, from its verified sidecar.
    pub fn add(
        &self,
        cluster: &str,
        operation_id: &str,
        path: &Path,
        meta: &SnapshotMetadata,
    ) -> Result<Entry, CatalogueError> {
        let taken = meta
            .time
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let entry = Entry {
            cluster: cluster.into(),
            operation_id: operation_id.into(),
            node: meta.node.clone(),
            taken,
            revision: meta.report.status.revision,
            sha256: meta.report.sha256.clone(),
            size: meta.report.size,
            path: path.to_owned(),
        };
        self.conn
            .execute(
                "INSERT OR REPLACE INTO snapshots VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    entry.path.to_string_lossy(),
                    entry.cluster,
                    entry.operation_id,
                    entry.node,
                    entry.taken,
                    entry.revision,
                    entry.sha256,
                    entry.size as i64
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(entry)
    }

    /// Entries, newest first; optionally one cluster's.
    pub fn list(&self, cluster: Option<&str>) -> Result<Vec<Entry>, CatalogueError> {
        self.conn
            .prepare(
                "SELECT cluster, op_id, node, taken, revision, sha256, size, path FROM snapshots
                 WHERE ?1 IS NULL OR cluster = ?1 ORDER BY taken DESC, path DESC",
            )
            .and_then(|mut s| {
                s.query_map([cluster], |r| {
                    Ok(Entry {
                        cluster: r.get(0)?,
                        operation_id: r.get(1)?,
                        node: r.get(2)?,
                        taken: r.get(3)?,
                        revision: r.get(4)?,
                        sha256: r.get(5)?,
                        size: r.get::<_, i64>(6)? as u64,
                        path: PathBuf::from(r.get::<_, String>(7)?),
                    })
                })?
                .collect()
            })
            .map_err(|e| self.err(e))
    }

    /// Forgets entries whose file is gone (removed by retention).
    pub fn prune_missing(&self, cluster: &str) -> Result<usize, CatalogueError> {
        let mut gone = 0;
        for entry in self.list(Some(cluster))? {
            if !entry.path.exists() {
                self.remove(&entry.path)?;
                gone += 1;
            }
        }
        Ok(gone)
    }

    /// Removes one entry (not the file).
    pub fn remove(&self, path: &Path) -> Result<(), CatalogueError> {
        self.conn
            .execute(
                "DELETE FROM snapshots WHERE path = ?1",
                [path.to_string_lossy()],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }
}

/// Removes `cluster`'s catalogued snapshots (file, sidecar, row) taken
/// before `cutoff` (RFC 3339), never `keep_path`, the newest catalogued one
/// (whatever its age) nor one in `held` (an operation that has not
/// succeeded took it: `talos_client::ops::held_snapshots`). Returns the
/// paths removed.
pub fn expire(
    catalogue: &Catalogue,
    cluster: &str,
    cutoff: &str,
    keep_path: &Path,
    held: &[PathBuf],
) -> Result<Vec<PathBuf>, String> {
    let mut removed = Vec::new();
    // Newest first: the first is the cluster's newest verified snapshot.
    for entry in catalogue
        .list(Some(cluster))
        .map_err(|e| e.to_string())?
        .into_iter()
        .skip(1)
    {
        if entry.taken.as_str() >= cutoff || entry.path == keep_path || held.contains(&entry.path) {
            continue;
        }
        for file in [
            entry.path.clone(),
            PathBuf::from(format!("{}.json", entry.path.display())),
        ] {
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("{}: {e}", file.display())),
            }
        }
        catalogue.remove(&entry.path).map_err(|e| e.to_string())?;
        removed.push(entry.path);
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(node: &str, time: &str) -> SnapshotMetadata {
        serde_json::from_value(serde_json::json!({
            "node": node,
            "time": time,
            "sha256": "00", "size": 1, "hash": 0, "revision": 1,
            "total_keys": 1, "total_entries": 1, "total_size": 1
        }))
        .unwrap()
    }

    /// Past `max_age`, what an unfinished operation holds and the newest
    /// catalogued snapshot stay; only the others go.
    #[test]
    fn expiry_spares_held_snapshots_and_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let catalogue = Catalogue::open(dir.path()).unwrap();
        let mut paths = Vec::new();
        for (i, time) in [
            "2026-01-01T00:00:00Z",
            "2026-01-02T00:00:00Z",
            "2026-01-03T00:00:00Z",
        ]
        .into_iter()
        .enumerate()
        {
            let path = dir.path().join(format!("s{i}.db"));
            std::fs::write(&path, b"x").unwrap();
            catalogue.add("a", "op", &path, &meta("n", time)).unwrap();
            paths.push(path);
        }
        let held = [paths[0].clone()];
        let removed = expire(
            &catalogue,
            "a",
            "2027-01-01T00:00:00Z",
            Path::new("/none"),
            &held,
        )
        .unwrap();
        assert_eq!(removed, [paths[1].clone()]);
        assert!(paths[0].exists() && paths[2].exists());
    }
}
