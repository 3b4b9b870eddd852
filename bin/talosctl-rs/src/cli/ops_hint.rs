//! The `hint:` line under an operation's refusal: the flags and commands of
//! this CLI that answer it (the library's messages name none).

use talos_client::ops::{OpsError, Refusal};

/// The hint for an operations error, if this CLI has one.
pub fn hint(error: &OpsError) -> Option<String> {
    let text = match error {
        OpsError::Refused(refusal) => return refusal_hint(refusal).map(str::to_string),
        OpsError::Busy { holder } if holder.contains("the cluster lock") => {
            "it runs from the admin host and state directory its holder names (OPID@HOST:STATE_DIR): wait until it ends, then plan again"
        }
        OpsError::Busy { .. } => {
            "wait until it ends (`talosctl-rs ops list` shows it), then plan again"
        }
        OpsError::Interrupted { id, .. } | OpsError::AwaitsAttention { id, .. } => {
            return Some(format!(
                "`talosctl-rs ops resume {id}` or `talosctl-rs ops abandon {id}`"
            ));
        }
        OpsError::EarlierFormat { id, .. } => {
            return Some(format!(
                "`talosctl-rs ops abandon {id}`, or finish it with the talosctl-rs that started it"
            ));
        }
        OpsError::LaterFormat { .. } => "pass another --state-dir, or use the newer talosctl-rs",
        OpsError::NeedsAttention { .. } => {
            "look at the node and the cluster, then `talosctl-rs ops resume ID` or `talosctl-rs ops abandon ID` (`ops list` shows the id)"
        }
        _ => return None,
    };
    Some(text.to_string())
}

fn refusal_hint(refusal: &Refusal) -> Option<&'static str> {
    Some(match refusal {
        Refusal::NotMember { .. } => {
            "if the node already left etcd, pass --already-left to only reset it"
        }
        Refusal::StillMember { .. } => "drop --already-left: the retire leaves etcd first",
        Refusal::LearnerCatchingUp { .. } => {
            "`talosctl-rs ops join NODE` waits until the learner is a voter"
        }
        Refusal::OnlyEndpoint { .. } => {
            "add another endpoint first: `talosctl-rs config add-endpoint`"
        }
        Refusal::AlreadyVoter { .. } => "use `talosctl-rs ops retire OLD`",
        Refusal::MaintenanceUnverified { .. } => {
            "pin the node with --cert-fingerprint FP (the node prints it), or pass --insecure to skip verification"
        }
        Refusal::PinsAndInsecure => "pass either --cert-fingerprint or --insecure",
        Refusal::AlreadyMember { .. } => "drop --config: the node already runs a configuration",
        Refusal::NoNodes => "pass the nodes with --nodes (-n)",
        Refusal::UnexpectedChange { .. } => {
            "add the path with --expect-change once the change is understood"
        }
        Refusal::IssuerChange { .. } => {
            "keep the old issuer, audiences and key accepted in the file (see above), or pass --allow-issuer-change controlplane to break the existing tokens on the control plane"
        }
        Refusal::UnknownDocument { .. } => {
            "remove the document the node's Talos version does not know, or upgrade the node first"
        }
        Refusal::ChangeNotExpected { .. } => {
            "name each changed path with --expect-change PATH once the change is understood"
        }
        Refusal::SecretChange { .. } => {
            "name each secret path itself with --expect-change PATH (a document or section does not cover its secrets)"
        }
        Refusal::PendingConfig { .. } => {
            "let the pending change finish first: reboot the node for a staged apply, or wait for a try-mode apply's confirmation or rollback (`talosctl-rs -n NODE get mc persistent -o yaml` shows the saved one)"
        }
        Refusal::NeedsReboot { .. } => {
            "pass --allow-reboot to apply it with a reboot and no automatic rollback"
        }
        Refusal::ResetOfVoter { .. } => {
            "use --graceful to leave etcd first, or `talosctl-rs ops retire NODE` (verified snapshot, forfeit, leave, reset); --force resets anyway"
        }
        Refusal::MembershipUnknown { .. } => "pass --force to reset anyway",
        Refusal::PlanChanged { .. } => "run the command again to see the new plan",
        Refusal::ClusterLockUnavailable { .. } => {
            "pass --without-cluster-lock to go on with this host's lock alone (journaled), once you know no other admin host runs an operation on this cluster"
        }
        Refusal::OutOfBounds { .. } => {
            "give the timeout within the bounds (e.g. --timeout 10m, --try-timeout 2m)"
        }
        Refusal::UnsupportedStep { reason, .. } if reason.contains("downgrade") => {
            "upgrade to the same minor release, or pass --allow-downgrade to accept it knowingly"
        }
        Refusal::UnsupportedStep { .. } => {
            "upgrade one minor release at a time, or pass --allow-minor-skip to accept it knowingly"
        }
        Refusal::ImageWithoutRelease { .. } => {
            "name the installer by its release tag (--image ghcr.io/siderolabs/installer:v1.14.0)"
        }
        Refusal::AlarmsRaised { .. } => {
            "clear the alarm first (a NOSPACE alarm: `talosctl-rs ops defrag`)"
        }
        _ => return None,
    })
}
