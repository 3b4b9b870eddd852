//! After a crash: operations left running in the journal are reconciled
//! and continued through `Ops::resume` where every step has a reconciler;
//! the others are marked needs-attention with their exact state.

use std::sync::Arc;

use talos_client::ops::{OpRecord, OpState};

use crate::manager::{Manager, fingerprint_of};

/// Whether an interrupted operation can be continued unattended. An apply
/// with a step in flight may have outlived its TRY window while nobody
/// watched: a person decides.
fn safe_to_resume(record: &OpRecord) -> bool {
    match record.kind.as_str() {
        "snapshot" | "retire" | "join" | "migrate" => true,
        "apply" => record.in_flight().is_none_or(|s| !s.destructive),
        _ => false,
    }
}

/// Resumes or flags every interrupted operation of the configured clusters.
pub async fn recover(manager: &Arc<Manager>) {
    let journal = match manager.journal() {
        Ok(j) => j,
        Err(e) => {
            tracing::error!("reading the journal: {e}");
            return;
        }
    };
    for cluster in manager.clusters() {
        let name = cluster.config.name.clone();
        let interrupted = match journal.list(Some(&fingerprint_of(&cluster))) {
            Ok(ops) => ops.into_iter().filter(|op| op.state == OpState::Running),
            Err(e) => {
                tracing::error!(cluster = %name, "reading the journal: {e}");
                continue;
            }
        };
        for op in interrupted {
            let at = op
                .in_flight()
                .map(|s| format!("step {:?} in flight", s.name))
                .unwrap_or_else(|| "between steps".into());
            if safe_to_resume(&op) {
                match manager.resume(&name, &op.id).await {
                    Ok(id) => {
                        tracing::info!(target: "audit", who = "talos-opsd", cluster = %name, op = %id, "resuming an interrupted {} ({at})", op.kind)
                    }
                    Err(e) => {
                        tracing::warn!(cluster = %name, op = %op.id, "not resumed ({at}): {e}")
                    }
                }
            } else {
                match manager.needs_attention(&name, &op.id) {
                    Ok(_) => {
                        tracing::warn!(target: "audit", who = "talos-opsd", cluster = %name, op = %op.id, "needs attention: {} interrupted with {at}", op.kind)
                    }
                    Err(e) => tracing::warn!(cluster = %name, op = %op.id, "{e}"),
                }
            }
        }
    }
}
