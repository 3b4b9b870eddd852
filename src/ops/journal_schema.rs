//! The journal's own schema, checked where it is opened: both tables there
//! with every column this format reads, each declared with its type, and
//! `user_version` agreeing with the columns. A new file gets the tables; a
//! journal of format 1 is upgraded; anything else (a table dropped or
//! altered, a version set by hand) is refused naming the table and column,
//! never recreated empty nor met by a failure in every later read. The
//! columns added within format 2 (the cluster lock's) are added where
//! missing, after this check. The values' own types are checked with the
//! whole file, at start ([`check_values`]).

use std::path::Path;

use rusqlite::Connection;

use super::{CLUSTER_LOCK_COLUMNS, FORMAT, SCHEMA, UPGRADE_TO_2};
use crate::ops::OpsError;

/// A column: its name, its declared type and the value types it may hold
/// (as SQLite's `typeof` names them).
type Column = (&'static str, &'static str, &'static [&'static str]);

const TEXT: &[&str] = &["text"];
const TEXT_OR_NULL: &[&str] = &["text", "null"];
const INTEGER: &[&str] = &["integer"];
const INTEGER_OR_NULL: &[&str] = &["integer", "null"];

/// The columns of `operations`, format 1's first.
const OPERATIONS: &[Column] = &[
    ("id", "TEXT", TEXT),
    ("kind", "TEXT", TEXT),
    ("context", "TEXT", TEXT),
    ("ca_fingerprint", "TEXT", TEXT),
    ("params", "TEXT", TEXT),
    ("facts", "TEXT", TEXT),
    ("state", "TEXT", TEXT),
    ("created", "TEXT", TEXT),
    ("updated", "TEXT", TEXT),
    ("format", "INTEGER", INTEGER),
];

/// The columns of `steps`, format 1's first.
const STEPS: &[Column] = &[
    ("op_id", "TEXT", TEXT),
    ("idx", "INTEGER", INTEGER),
    ("name", "TEXT", TEXT),
    ("description", "TEXT", TEXT),
    ("destructive", "INTEGER", INTEGER),
    ("state", "TEXT", TEXT),
    ("started", "TEXT", TEXT_OR_NULL),
    ("finished", "TEXT", TEXT_OR_NULL),
    ("duration_ms", "INTEGER", INTEGER_OR_NULL),
    ("detail", "TEXT", TEXT_OR_NULL),
    ("node", "TEXT", TEXT_OR_NULL),
    ("step", "TEXT", TEXT_OR_NULL),
];

/// The columns format 2 added (table, column).
const ADDED_BY_2: &[(&str, &str)] = &[
    ("operations", "format"),
    ("steps", "node"),
    ("steps", "step"),
];

const TABLES: [(&str, &[Column]); 2] = [("operations", OPERATIONS), ("steps", STEPS)];

fn corrupt(path: &Path, reason: impl Into<String>) -> OpsError {
    OpsError::CorruptJournal {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

fn sql(path: &Path) -> impl Fn(rusqlite::Error) -> OpsError + '_ {
    move |e| super::corrupt_or(path, e)
}

/// The shape of the tables found.
#[derive(Debug, PartialEq, Eq)]
enum Shape {
    /// No table at all.
    Empty,
    /// Format 1's columns only.
    One,
    /// Format 2's.
    Two,
}

/// Reads the schema of `conn` and checks it: every column each table must
/// have, declared with its type; the format it is in.
fn shape(conn: &Connection, path: &Path) -> Result<Shape, OpsError> {
    let mut present = Vec::new();
    for (table, columns) in TABLES {
        let found: Vec<(String, String)> = conn
            .prepare("SELECT name, type FROM pragma_table_info(?1)")
            .and_then(|mut s| {
                s.query_map([table], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()
            })
            .map_err(sql(path))?;
        present.push((table, columns, found));
    }
    let missing: Vec<&str> = present
        .iter()
        .filter(|(_, _, found)| found.is_empty())
        .map(|(table, _, _)| *table)
        .collect();
    match missing.len() {
        2 => return Ok(Shape::Empty),
        1 => {
            return Err(corrupt(
                path,
                format!(
                    "its table {} is missing (dropped?), so the history it held is gone",
                    missing[0]
                ),
            ));
        }
        _ => {}
    }
    let mut added = Vec::new();
    for (table, columns, found) in &present {
        for (name, declared, _) in columns.iter() {
            let new_in_2 = ADDED_BY_2.contains(&(*table, *name));
            match found.iter().find(|(n, _)| n == name) {
                None if new_in_2 => {}
                None => {
                    return Err(corrupt(
                        path,
                        format!("its table {table} has no column {name} (the table was altered)"),
                    ));
                }
                Some((_, ty)) if !ty.eq_ignore_ascii_case(declared) => {
                    return Err(corrupt(
                        path,
                        format!(
                            "column {table}.{name} is declared {:?}, not {declared} (the table was altered)",
                            ty
                        ),
                    ));
                }
                Some(_) if new_in_2 => added.push(format!("{table}.{name}")),
                Some(_) => {}
            }
        }
    }
    match added.len() {
        0 => Ok(Shape::One),
        n if n == ADDED_BY_2.len() => Ok(Shape::Two),
        _ => Err(corrupt(
            path,
            format!(
                "its tables are half upgraded to format 2 (only {} of {} present)",
                added.join(", "),
                ADDED_BY_2
                    .iter()
                    .map(|(t, c)| format!("{t}.{c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

fn user_version(conn: &Connection, path: &Path) -> Result<u32, OpsError> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sql(path))
}

/// Makes the tables of a new journal, upgrades one of format 1, and
/// refuses any other schema than this format's, naming what is wrong.
/// Runs under the journal's setup lock.
pub(super) fn prepare(conn: &Connection, path: &Path) -> Result<(), OpsError> {
    let version = user_version(conn, path)?;
    if version > FORMAT {
        return Err(OpsError::LaterFormat {
            path: path.to_owned(),
            format: version,
        });
    }
    let shape = shape(conn, path)?;
    match (version, shape) {
        (0, Shape::Empty) => conn
            .execute_batch(SCHEMA)
            .and_then(|()| conn.execute_batch(UPGRADE_TO_2))
            .map_err(sql(path)),
        (_, Shape::Empty) => Err(corrupt(
            path,
            format!(
                "its tables operations and steps are gone while its user_version is {version}: the history it held is lost"
            ),
        )),
        (0 | 1, Shape::One) => conn.execute_batch(UPGRADE_TO_2).map_err(sql(path)),
        (FORMAT, Shape::Two) => Ok(()),
        (0 | 1, Shape::Two) => Err(corrupt(
            path,
            format!(
                "its user_version is {version} while its tables are those of format {FORMAT} (the version was changed by hand); talos-opsd --recover-journal sets it back to {FORMAT}"
            ),
        )),
        (_, _) => Err(corrupt(
            path,
            format!(
                "its user_version is {version} while its tables lack the columns of format {FORMAT}"
            ),
        )),
    }
}

/// Every value of every column of a type the journal reads there: a BLOB
/// where text is due, say, is refused naming the table, the column and
/// the row, not met as a failure of every list.
pub(super) fn check_values(conn: &Connection, path: &Path) -> Result<(), OpsError> {
    // The columns added within format 2 hold text or nothing.
    let added: Vec<(&str, Vec<Column>)> = CLUSTER_LOCK_COLUMNS
        .iter()
        .map(|(table, column)| (*table, vec![(*column, "TEXT", TEXT_OR_NULL)]))
        .collect();
    let all = TABLES
        .iter()
        .map(|(table, columns)| (*table, columns.to_vec()))
        .chain(added);
    for (table, columns) in all {
        for (name, _, types) in columns {
            let allowed = types
                .iter()
                .map(|t| format!("'{t}'"))
                .collect::<Vec<_>>()
                .join(", ");
            // Names from the constants above, never from input.
            let query = format!(
                "SELECT rowid, typeof({name}) FROM {table} WHERE typeof({name}) NOT IN ({allowed}) LIMIT 1"
            );
            let found: Option<(i64, String)> = conn
                .prepare(&query)
                .and_then(|mut s| {
                    s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                        .next()
                        .transpose()
                })
                .map_err(sql(path))?;
            if let Some((row, ty)) = found {
                return Err(corrupt(
                    path,
                    format!(
                        "column {table}.{name} holds a {ty} in row {row}, where {} is due",
                        types.join(" or ")
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// What `--recover-journal` can put right in place: a `user_version` set
/// back (to 0 or 1) on tables of this format is set to this format again.
/// Returns what was done, `None` when nothing needed it (or nothing could
/// be done in place).
pub(super) fn repair(conn: &Connection, path: &Path) -> Result<Option<String>, OpsError> {
    let version = user_version(conn, path)?;
    if !matches!(version, 0 | 1) || shape(conn, path).ok() != Some(Shape::Two) {
        return Ok(None);
    }
    conn.execute_batch(&format!("PRAGMA user_version = {FORMAT}"))
        .map_err(sql(path))?;
    Ok(Some(format!(
        "its user_version was {version} on tables of format {FORMAT}: set back to {FORMAT}"
    )))
}
