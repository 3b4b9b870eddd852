//! What an operation is asked to do, as one typed value: [`OpSpec`]. The
//! CLI's arguments and the daemon's API convert into it, the journal stores
//! it as the operation's parameters, and the planner reads only it. Each
//! options type owns its defaults (a constructor; `None` where the
//! operations layer fills in its configured default, such as the snapshot
//! directory).

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use super::apply::ApplyOptions;
pub use super::defrag::DefragOptions;
pub use super::drill::DrillOptions;
pub use super::join::{JoinOptions, MaintenanceApply};
pub use super::migrate::MigrateOptions;
pub use super::restore::RestoreOptions;
pub use super::retire::{LeaseProbe, RetireOptions};
pub use super::snapshot::SnapshotOptions;
pub use super::upgrade::UpgradeOptions;

/// One operation with its options: what is planned, journaled and run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum OpSpec {
    /// A verified snapshot with retention.
    Snapshot(SnapshotOptions),
    /// Retire a control-plane node.
    Retire(RetireOptions),
    /// Wait for a new member to become a healthy voter.
    Join(JoinOptions),
    /// Join a new node, then retire an old one.
    Migrate(MigrateOptions),
    /// Apply a configuration on trial, gate it on health, then confirm.
    Apply(ApplyOptions),
    /// Prove a stored backup restores (the cluster is not touched).
    Drill(DrillOptions),
    /// Defragment etcd's members one at a time, the leader last.
    Defrag(DefragOptions),
    /// Upgrade the control plane one node at a time, the leader last.
    Upgrade(UpgradeOptions),
    /// Bring a cluster that lost quorum back from a snapshot.
    Restore(RestoreOptions),
}

/// The kinds of operation (an [`OpSpec`] without its options).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum OpKind {
    /// A verified snapshot with retention.
    Snapshot,
    /// Retire a control-plane node.
    Retire,
    /// Wait for a new member to become a healthy voter.
    Join,
    /// Join a new node, then retire an old one.
    Migrate,
    /// Apply a configuration on trial, gate it on health, then confirm.
    Apply,
    /// Prove a stored backup restores.
    Drill,
    /// Defragment etcd's members.
    Defrag,
    /// Restore etcd from a snapshot.
    Restore,
    /// Upgrade Talos on the control plane.
    Upgrade,
}

impl OpKind {
    /// The kind's name as journaled (`snapshot`, `retire`, ...).
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Snapshot => "snapshot",
            OpKind::Retire => "retire",
            OpKind::Join => "join",
            OpKind::Migrate => "migrate",
            OpKind::Apply => "apply",
            OpKind::Drill => "drill",
            OpKind::Defrag => "defrag",
            OpKind::Restore => "restore",
            OpKind::Upgrade => "upgrade",
        }
    }
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl OpSpec {
    /// Its kind.
    pub fn kind(&self) -> OpKind {
        match self {
            OpSpec::Snapshot(_) => OpKind::Snapshot,
            OpSpec::Retire(_) => OpKind::Retire,
            OpSpec::Join(_) => OpKind::Join,
            OpSpec::Migrate(_) => OpKind::Migrate,
            OpSpec::Apply(_) => OpKind::Apply,
            OpSpec::Drill(_) => OpKind::Drill,
            OpSpec::Defrag(_) => OpKind::Defrag,
            OpSpec::Restore(_) => OpKind::Restore,
            OpSpec::Upgrade(_) => OpKind::Upgrade,
        }
    }

    /// Whether running it may change the cluster (a confirmation is due
    /// before it starts, whatever its plan turns out to be).
    pub fn may_change_cluster(&self) -> bool {
        match self {
            OpSpec::Snapshot(_) | OpSpec::Drill(_) => false,
            OpSpec::Join(o) => o.maintenance.is_some(),
            OpSpec::Retire(_)
            | OpSpec::Migrate(_)
            | OpSpec::Apply(_)
            | OpSpec::Defrag(_)
            | OpSpec::Restore(_)
            | OpSpec::Upgrade(_) => true,
        }
    }
}

/// The bounds of every duration option: a wait that cannot end (a timeout
/// of 4294967295 s) or a trial that rolls back before anything is checked
/// is refused when planned, before anything changes.
pub const DURATION_BOUNDS: &[(&str, Duration, Duration)] = &[
    (
        "timeout",
        Duration::from_secs(1),
        Duration::from_secs(24 * 3600),
    ),
    (
        "join_timeout",
        Duration::from_secs(1),
        Duration::from_secs(24 * 3600),
    ),
    (
        "silence_timeout",
        Duration::from_secs(1),
        Duration::from_secs(3600),
    ),
    (
        "try_timeout",
        Duration::from_secs(1),
        Duration::from_secs(3600),
    ),
    (
        "rejoin_timeout",
        Duration::from_secs(1),
        Duration::from_secs(24 * 3600),
    ),
    (
        "reboot_timeout",
        Duration::from_secs(10),
        Duration::from_secs(4 * 3600),
    ),
    (
        "lease_probe_deadline",
        Duration::from_millis(500),
        Duration::from_secs(60),
    ),
];

/// The bounds `(min, max)` of the duration option `option` (its name in
/// [`DURATION_BOUNDS`]), for a caller to check a value before it plans.
pub fn duration_bounds(option: &str) -> Option<(Duration, Duration)> {
    DURATION_BOUNDS
        .iter()
        .find(|(name, _, _)| *name == option)
        .map(|(_, min, max)| (*min, *max))
}

impl OpSpec {
    /// Refuses a duration option outside its bounds (`DURATION_BOUNDS`).
    pub fn check_bounds(&self) -> Result<(), super::Refusal> {
        let durations: Vec<(&str, Duration)> = match self {
            OpSpec::Snapshot(_) | OpSpec::Drill(_) | OpSpec::Defrag(_) => Vec::new(),
            OpSpec::Restore(o) => vec![("rejoin_timeout", o.rejoin_timeout)],
            OpSpec::Upgrade(o) => vec![("reboot_timeout", o.reboot_timeout)],
            OpSpec::Retire(o) => {
                check_probe(o.lease_probe.as_ref())?;
                let mut d = vec![("silence_timeout", o.silence_timeout)];
                d.extend(probe_deadline(o.lease_probe.as_ref()));
                d
            }
            OpSpec::Join(o) => vec![("timeout", o.timeout)],
            OpSpec::Migrate(o) => {
                check_probe(o.lease_probe.as_ref())?;
                let mut d = vec![
                    ("join_timeout", o.join_timeout),
                    ("silence_timeout", o.silence_timeout),
                ];
                d.extend(probe_deadline(o.lease_probe.as_ref()));
                d
            }
            OpSpec::Apply(o) => vec![
                ("try_timeout", o.try_timeout),
                ("reboot_timeout", o.reboot_timeout),
            ],
        };
        for (option, value) in durations {
            if let Some((option, min, max)) = DURATION_BOUNDS
                .iter()
                .find(|(name, _, _)| *name == option)
                .filter(|(_, min, max)| value < *min || value > *max)
            {
                return Err(super::Refusal::OutOfBounds {
                    option: option.to_string(),
                    value,
                    min: *min,
                    max: *max,
                });
            }
        }
        Ok(())
    }
}

/// The lease probe's renew deadline, as a bounded duration.
fn probe_deadline(probe: Option<&LeaseProbe>) -> Option<(&'static str, Duration)> {
    probe.map(|p| ("lease_probe_deadline", p.renew_deadline))
}

/// Refuses a lease probe whose endpoint is not an `https://HOST[:PORT]`
/// URL, or whose retry period is zero.
fn check_probe(probe: Option<&LeaseProbe>) -> Result<(), super::Refusal> {
    let Some(probe) = probe else { return Ok(()) };
    crate::input::endpoint("lease_probe.server", &probe.server, &["https"]).map_err(|e| {
        super::Refusal::BadOption {
            option: e.what,
            value: e.value,
            reason: e.reason,
        }
    })?;
    if probe.retry_period.is_zero() || probe.retry_period > probe.renew_deadline {
        return Err(super::Refusal::BadOption {
            option: "lease_probe.retry_period".into(),
            value: crate::input::format_duration(probe.retry_period),
            reason: "must be more than zero and at most the renew deadline".into(),
        });
    }
    Ok(())
}

/// A [`std::time::Duration`] journaled as whole milliseconds.
pub(crate) mod millis {
    use std::time::Duration;

    use serde::{Deserialize as _, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The journal's parameters are the spec itself: every variant comes
    /// back equal, and the JSON names its kind.
    #[test]
    fn every_spec_round_trips_through_its_journal_form() {
        let mut apply = ApplyOptions::new(vec!["10.5.0.2".into()], "/tmp/cp.yaml".into());
        apply.try_timeout = Duration::from_millis(1500);
        apply.check = Some("true".into());
        let mut join = JoinOptions::new("10.5.0.9");
        join.maintenance = Some(MaintenanceApply::pinned("/tmp/cp.yaml", vec!["ab".into()]));
        let specs = [
            OpSpec::Snapshot(SnapshotOptions::default()),
            OpSpec::Retire(RetireOptions::new("cp-1")),
            OpSpec::Join(join.clone()),
            OpSpec::Migrate(MigrateOptions::new("cp-1", "10.5.0.9")),
            OpSpec::Apply(apply),
        ];
        for spec in specs {
            let json = serde_json::to_value(&spec).unwrap();
            assert_eq!(json["op"], spec.kind().name(), "{json}");
            let back: OpSpec = serde_json::from_value(json).unwrap();
            assert_eq!(back, spec);
        }
    }

    /// One default per option: the TRY window is the library's wherever
    /// the spec comes from.
    #[test]
    fn defaults_live_in_the_options_types() {
        let apply = ApplyOptions::new(vec!["n".into()], "f".into());
        assert_eq!(apply.try_timeout, ApplyOptions::DEFAULT_TRY_TIMEOUT);
        let retire = RetireOptions::new("n");
        assert_eq!(retire.wipe, super::super::retire::default_wipe());
        assert_eq!(retire.snapshot_dir, None);
        let minimal: OpSpec =
            serde_json::from_str(r#"{"op":"apply","nodes":["n"],"config_path":"f"}"#).unwrap();
        assert_eq!(minimal, OpSpec::Apply(apply));
    }
}
