//! `talosctl-rs etcd ...`, with talosctl's columns and rules.

use clap::Subcommand;
use talos_client::client::{DowngradeAction, EtcdMember, EtcdMemberStatus, MemberAlarm, MemberId};

use super::table::Table;
use super::{Global, Output, Usage, print_nodes, print_structured};

#[derive(Subcommand)]
pub enum EtcdCommand {
    /// Get the list of etcd cluster members.
    Members,
    /// Get the status of etcd cluster member (use several nodes for all).
    Status,
    /// Manage etcd alarms.
    #[command(subcommand)]
    Alarm(AlarmCommand),
    /// Defragment etcd database on the node (one node at a time).
    Defrag,
    /// Tell the node to forfeit etcd cluster leadership.
    ForfeitLeadership,
    /// Tell the node to leave the etcd cluster.
    Leave,
    /// Remove a member that has no working node any more (prefer `leave`).
    RemoveMember {
        /// The member id, hex as `etcd members` prints it.
        member_id: String,
    },
    /// Stream a verified snapshot of the node's etcd database to PATH.
    Snapshot {
        /// Where to save the snapshot.
        path: std::path::PathBuf,
    },
    /// Manage etcd storage system downgrades.
    #[command(subcommand)]
    Downgrade(DowngradeCommand),
}

#[derive(Subcommand)]
pub enum DowngradeCommand {
    /// Validate if the etcd storage system can be downgraded to the
    /// specified version.
    Validate {
        /// MAJOR.MINOR, e.g. 3.5.
        #[arg(value_name = "VERSION")]
        target: String,
    },
    /// Enable etcd storage system downgrade to the specified version.
    Enable {
        /// MAJOR.MINOR, e.g. 3.5.
        #[arg(value_name = "VERSION")]
        target: String,
    },
    /// Cancel etcd storage system downgrade.
    Cancel,
}

#[derive(Subcommand)]
pub enum AlarmCommand {
    /// List the etcd alarms for the node.
    List,
    /// Disarm the etcd alarms for the node.
    Disarm,
}

pub async fn run(global: &Global, command: EtcdCommand) -> anyhow::Result<()> {
    let output = global.output;
    match command {
        EtcdCommand::Members => {
            let replies = global.connect_many()?.etcd_member_list(true).await?;
            print_nodes(output, replies, |rows| {
                members_table(rows).print();
                Ok(())
            })
        }
        EtcdCommand::Status => {
            let replies = global.connect_many()?.etcd_status().await?;
            print_nodes(output, replies, |rows| {
                status_table(rows).print();
                Ok(())
            })
        }
        EtcdCommand::Alarm(AlarmCommand::List) => {
            let replies = global.connect_many()?.etcd_alarm_list().await?;
            print_nodes(output, replies, |rows| {
                alarm_table(rows).print();
                Ok(())
            })
        }
        EtcdCommand::Alarm(AlarmCommand::Disarm) => {
            let replies = global.connect_many()?.etcd_alarm_disarm().await?;
            print_nodes(output, replies, |rows| {
                alarm_table(rows).print();
                Ok(())
            })
        }
        EtcdCommand::Defrag => {
            let (client, node) = global.connect_one("etcd defrag")?;
            client.etcd_defragment().await?;
            done(output, &node, "defragmented")
        }
        EtcdCommand::ForfeitLeadership => {
            let replies = global.connect_many()?.etcd_forfeit_leadership().await?;
            print_nodes(output, replies, |rows| {
                for (node, new_leader) in rows {
                    match new_leader {
                        Some(leader) => eprintln!("{node}: leadership moved to {leader}"),
                        None => eprintln!("{node}: not the leader, nothing to forfeit"),
                    }
                }
                Ok(())
            })
        }
        EtcdCommand::Leave => {
            let (client, node) = global.connect_one("etcd leave")?;
            client.etcd_leave_cluster().await?;
            done(output, &node, "left the etcd cluster")
        }
        EtcdCommand::RemoveMember { member_id } => {
            let id: MemberId = member_id.parse().map_err(|e| {
                Usage(format!("error parsing member ID {member_id:?}: {e} (expected hex, as `etcd members` prints it)"))
            })?;
            let replies = global.connect_many()?.etcd_remove_member_by_id(id).await?;
            print_nodes(output, replies, |rows| {
                for (node, ()) in rows {
                    eprintln!("{node}: removed member {id}");
                }
                Ok(())
            })
        }
        EtcdCommand::Snapshot { path } => super::snapshot::save(global, &path).await,
        EtcdCommand::Downgrade(command) => downgrade(global, command).await,
    }
}

/// `etcd downgrade validate|enable|cancel`, one node at a time as talosctl
/// (cmd/talosctl/cmd/talos/etcd.go): a `MESSAGE` column, and a `NODE`
/// column when a node was named.
async fn downgrade(global: &Global, command: DowngradeCommand) -> anyhow::Result<()> {
    let (action, version, name) = match command {
        DowngradeCommand::Validate { target } => (DowngradeAction::Validate, target, "validate"),
        DowngradeCommand::Enable { target } => (DowngradeAction::Enable, target, "enable"),
        DowngradeCommand::Cancel => (DowngradeAction::Cancel, String::new(), "cancel"),
    };
    let (client, node) = global.connect_one(&format!("etcd downgrade {name}"))?;
    let named = !global.connect()?.1.is_empty();
    let cluster_version = client.etcd_downgrade(action, &version).await?;
    if global.output != Output::Table {
        return print_structured(
            global.output,
            &serde_json::json!([{ "node": node, "result": { "cluster_version": cluster_version } }]),
        );
    }
    let message = format!("downgrade {name} success, cluster version {cluster_version}");
    let mut table = if named {
        Table::new(&["NODE", "MESSAGE"])
    } else {
        Table::new(&["MESSAGE"])
    };
    table.row(if named {
        vec![node, message]
    } else {
        vec![message]
    });
    table.print();
    Ok(())
}

/// Reports a single-node action: nothing on stdout in table mode (like
/// talosctl), a small document otherwise.
fn done(output: Output, node: &str, what: &str) -> anyhow::Result<()> {
    if output == Output::Table {
        eprintln!("{node}: {what}");
        Ok(())
    } else {
        print_structured(output, &serde_json::json!([{ "node": node, "result": {} }]))
    }
}

fn members_table(rows: &[(String, &Vec<EtcdMember>)]) -> Table {
    let mut table = Table::new(&[
        "NODE",
        "ID",
        "HOSTNAME",
        "PEER URLS",
        "CLIENT URLS",
        "LEARNER",
    ]);
    for (node, members) in rows {
        for m in members.iter() {
            table.row(vec![
                node.clone(),
                m.id.to_string(),
                m.hostname.clone(),
                m.peer_urls.join(","),
                m.client_urls.join(","),
                m.is_learner.to_string(),
            ]);
        }
    }
    table
}

/// Bytes as Go's humanize.Bytes prints them (SI units, one decimal).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if n < 10 {
        return format!("{n} B");
    }
    let exp = ((n as f64).ln() / 1000f64.ln()).floor() as usize;
    let value = n as f64 / 1000f64.powi(exp as i32);
    if value < 10.0 {
        format!("{value:.1} {}", UNITS[exp])
    } else {
        format!("{value:.0} {}", UNITS[exp])
    }
}

fn status_table(rows: &[(String, &EtcdMemberStatus)]) -> Table {
    let mut table = Table::new(&[
        "NODE",
        "MEMBER",
        "DB SIZE",
        "IN USE",
        "LEADER",
        "RAFT INDEX",
        "RAFT TERM",
        "RAFT APPLIED INDEX",
        "LEARNER",
        "PROTOCOL",
        "STORAGE",
        "ERRORS",
    ]);
    for (node, s) in rows {
        let ratio = if s.db_size > 0 {
            s.db_size_in_use as f64 / s.db_size as f64 * 100.0
        } else {
            0.0
        };
        table.row(vec![
            node.clone(),
            s.member_id.to_string(),
            human_bytes(s.db_size.max(0) as u64),
            format!(
                "{} ({ratio:.2}%)",
                human_bytes(s.db_size_in_use.max(0) as u64)
            ),
            s.leader.to_string(),
            s.raft_index.to_string(),
            s.raft_term.to_string(),
            s.raft_applied_index.to_string(),
            s.is_learner.to_string(),
            s.protocol_version.clone(),
            s.storage_version.clone(),
            s.errors.join(", "),
        ]);
    }
    table
}

fn alarm_table(rows: &[(String, &Vec<MemberAlarm>)]) -> Table {
    let mut table = Table::new(&["NODE", "MEMBER", "ALARM"]);
    for (node, alarms) in rows {
        for a in alarms.iter() {
            table.row(vec![
                node.clone(),
                a.member_id.to_string(),
                a.alarm.to_string(),
            ]);
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn bytes_like_go_humanize() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(20480), "20 kB");
        assert_eq!(human_bytes(1_500_000), "1.5 MB");
    }
}
