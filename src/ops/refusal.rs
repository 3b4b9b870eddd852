//! Why an operation is refused before anything changes, as a typed value a
//! caller can match. The messages speak of the cluster, never of a tool's
//! flags: the CLI adds its own hint.

/// A preflight's (or a plain reset's guard's) reason to refuse. It
/// serializes with its name in `refusal`, so a daemon can hand it
/// to its caller as a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(tag = "refusal", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Refusal {
    /// The node to retire is not an etcd member.
    #[error("{node} is not an etcd member (members: {})", .members.join(", "), node = crate::text::shown(.node))]
    NotMember {
        /// The node as given.
        node: String,
        /// The members' names.
        members: Vec<String>,
    },
    /// Asked to only reset a node that is still a member.
    #[error("{node} is said to have left etcd, but it is still etcd member {member_id}", node = crate::text::shown(.node))]
    StillMember {
        /// The node as given.
        node: String,
        /// Its member id.
        member_id: String,
    },
    /// The node is the last voting member.
    #[error("{node} is the last voting member", node = crate::text::shown(.node))]
    LastVoter {
        /// Its name.
        node: String,
    },
    /// A learner is still catching up.
    #[error("learner {learner} is still catching up: wait until it is a voter")]
    LearnerCatchingUp {
        /// Its name.
        learner: String,
    },
    /// The members' lists differ between nodes.
    #[error("the members' lists disagree: {}", .details.join("; "))]
    ListsDisagree {
        /// Which node sees what.
        details: Vec<String>,
    },
    /// Voters the operation relies on are unhealthy.
    #[error("voters are unhealthy: {}", .voters.join(", "))]
    UnhealthyVoters {
        /// Each with its reason.
        voters: Vec<String>,
    },
    /// Too few healthy voters would remain.
    #[error("only {healthy} healthy voters would remain, fewer than a quorum of {quorum}")]
    BelowQuorum {
        /// Healthy voters after the removal.
        healthy: usize,
        /// The quorum of the remaining voters.
        quorum: usize,
    },
    /// No healthy voter to take a snapshot from.
    #[error("no healthy voting member to take a snapshot from")]
    NoSnapshotSource,
    /// A member without a peer or client URL.
    #[error("member {member} has no address")]
    NoAddress {
        /// Its name.
        member: String,
    },
    /// The node is the only API endpoint of the client's context.
    #[error(
        "{node} is the only endpoint of talosconfig context {context:?}: retiring it loses the API; add another endpoint first",
        node = crate::text::shown(.node)
    )]
    OnlyEndpoint {
        /// The node.
        node: String,
        /// The context.
        context: String,
    },
    /// The node to migrate from is a learner.
    #[error("{node} is a learner, not a voter", node = crate::text::shown(.node))]
    Learner {
        /// The node.
        node: String,
    },
    /// The node to migrate to already votes.
    #[error("{node} is already a voting member: retire {old} on its own", node = crate::text::shown(.node), old = crate::text::shown(.old))]
    AlreadyVoter {
        /// The new node.
        node: String,
        /// The old node.
        old: String,
    },
    /// A maintenance-mode apply neither pins nor explicitly skips the
    /// node's certificate check.
    #[error(
        "{file} is applied in maintenance mode, where the node has no certificate from the cluster's CA: pin the node's certificate fingerprint (the node prints it) or skip its verification explicitly",
        file = crate::text::shown_path(.file)
    )]
    MaintenanceUnverified {
        /// The configuration file.
        file: String,
    },
    /// Pins and an explicit skip of verification together.
    #[error("a pinned certificate and skipping verification exclude each other")]
    PinsAndInsecure,
    /// The node to join with a configuration is already a member.
    #[error(
        "{node} is already etcd member {member_id} ({hostname}): it is not in maintenance mode",
        node = crate::text::shown(.node)
    )]
    AlreadyMember {
        /// The node.
        node: String,
        /// Its member id.
        member_id: String,
        /// Its member name.
        hostname: String,
    },
    /// A configuration file does not parse.
    #[error("{file}: {error}", file = crate::text::shown_path(.file))]
    BadConfig {
        /// The file (or node).
        file: String,
        /// Why.
        error: String,
    },
    /// The node does not answer in maintenance mode.
    #[error("{node} does not answer in maintenance mode: {error}", node = crate::text::shown(.node))]
    NotInMaintenance {
        /// The node.
        node: String,
        /// The error.
        error: String,
    },
    /// No node to apply to.
    #[error("no node to apply to")]
    NoNodes,
    /// A changed path outside the expected ones.
    #[error(
        "{node}: {file} changes {}, outside the expected changes {}: stop and find out why before applying",
        .paths.join(", "), .expected.join(", "), node = crate::text::shown(.node), file = crate::text::shown_path(.file)
    )]
    UnexpectedChange {
        /// The node.
        node: String,
        /// The file.
        file: String,
        /// The unexpected paths.
        paths: Vec<String>,
        /// The expected ones.
        expected: Vec<String>,
    },
    /// The API server's service-account validation would stop accepting
    /// an issuer, audience or key it accepts now.
    #[error(
        "{node} (Talos {version}, {role}): {}: every service-account token issued so far (the projected tokens of pods such as CoreDNS, the CNI agents and operators, and tokens held outside the cluster) is rejected as Unauthorized until it is renewed. Keep them accepted: {}",
        .lost.join("; "), pin_advice(.version, .old), node = crate::text::shown(.node)
    )]
    IssuerChange {
        /// The node.
        node: String,
        /// The Talos version it runs.
        version: String,
        /// Its role.
        role: String,
        /// What would no longer be accepted, in words.
        lost: Vec<String>,
        /// The current signing issuer.
        old: String,
    },
    /// The file holds a document the node's Talos version does not know.
    #[error("{node} runs Talos {version}, which refuses {file}: {message}", node = crate::text::shown(.node), file = crate::text::shown_path(.file))]
    UnknownDocument {
        /// The node.
        node: String,
        /// The Talos version it runs.
        version: String,
        /// The file.
        file: String,
        /// Upstream's words.
        message: String,
    },
    /// A change while no change was expected.
    #[error(
        "{node}: {file} changes {}, and no change was expected: name each path expected to change",
        .paths.join(", "), node = crate::text::shown(.node), file = crate::text::shown_path(.file)
    )]
    ChangeNotExpected {
        /// The node.
        node: String,
        /// The file.
        file: String,
        /// The changed paths.
        paths: Vec<String>,
    },
    /// A secret (CA, key, token, encryption secret) changes without being
    /// named itself.
    #[error(
        "{node}: {file} changes the secret(s) {}: a secret must be named itself as an expected change, even inside an expected document or section",
        .paths.join(", "), node = crate::text::shown(.node), file = crate::text::shown_path(.file)
    )]
    SecretChange {
        /// The node.
        node: String,
        /// The file.
        file: String,
        /// The secret paths not named.
        paths: Vec<String>,
    },
    /// The change needs a reboot, so it cannot be tried.
    #[error(
        "{node}: {file} cannot be applied without a reboot, so it cannot be tried and rolled back. The node says: {reason}",
        node = crate::text::shown(.node), file = crate::text::shown_path(.file)
    )]
    NeedsReboot {
        /// The node.
        node: String,
        /// The file.
        file: String,
        /// The node's words.
        reason: String,
    },
    /// The node's saved configuration is not the one it runs: a STAGED
    /// apply waits for a reboot, or a TRY awaits confirmation or rollback.
    #[error(
        "{node} saved a configuration that differs from the one it runs ({}): a staged apply waits for a reboot, or a try-mode apply for its confirmation or rollback; applying now would replace one of them unseen",
        paths.join(", "), node = crate::text::shown(.node)
    )]
    PendingConfig {
        /// The node.
        node: String,
        /// Paths that differ between the running and the saved configuration.
        paths: Vec<String>,
    },
    /// The node rejects the file.
    #[error("{node} rejects {file}: {message}", node = crate::text::shown(.node), file = crate::text::shown_path(.file))]
    NodeRejects {
        /// The node.
        node: String,
        /// The file.
        file: String,
        /// The node's words.
        message: String,
    },
    /// The planned configuration file changed since the plan.
    #[error(
        "{path} changed since the operation was planned: put the planned file back, or abandon the operation",
        path = crate::text::shown_path(.path)
    )]
    FileChanged {
        /// The file.
        path: String,
    },
    /// A non-graceful reset of a voting member.
    #[error(
        "a non-graceful reset of {node} ({hostname}): it is still a voting etcd member. Wiping it without leaving etcd leaves a dead member that still counts: {voters} voters need {quorum} healthy, and one more failure would stop the cluster",
        node = crate::text::shown(.node)
    )]
    ResetOfVoter {
        /// The node.
        node: String,
        /// Its hostname.
        hostname: String,
        /// Voters now.
        voters: usize,
        /// Their quorum.
        quorum: usize,
    },
    /// A reset whose target's membership cannot be read.
    #[error("a non-graceful reset of {node}: cannot tell whether it is an etcd member ({error})", node = crate::text::shown(.node))]
    MembershipUnknown {
        /// The node.
        node: String,
        /// Why.
        error: String,
    },
    /// The cluster changed since the plan that was confirmed.
    #[error(
        "the cluster no longer matches the plan that was confirmed (fingerprint {confirmed}, now {now}): plan again"
    )]
    PlanChanged {
        /// The confirmed plan's fingerprint.
        confirmed: String,
        /// The fingerprint of a plan made now.
        now: String,
    },
    /// A label to wipe names no volume the node can wipe.
    #[error(
        "{node} has no located volume {label} to wipe (its volumes: {})",
        .volumes.join(", "), node = crate::text::shown(.node), label = crate::text::shown(.label)
    )]
    UnknownWipeLabel {
        /// The node.
        node: String,
        /// The label at fault.
        label: String,
        /// The node's located volumes.
        volumes: Vec<String>,
    },
    /// An off-host store cannot be used as named.
    #[error("store {store}: {error}", store = crate::text::shown_path(.store))]
    BadStore {
        /// The store as named.
        store: String,
        /// Why.
        error: String,
    },
    /// A duration option lies outside its documented bounds.
    #[error("{option} of {value:?} is outside {min:?}..={max:?}")]
    OutOfBounds {
        /// The option (`timeout`, `silence_timeout`, ...).
        option: String,
        /// The value given.
        value: std::time::Duration,
        /// The least it may be.
        min: std::time::Duration,
        /// The most it may be.
        max: std::time::Duration,
    },
    /// The cluster lock (a Lease in the cluster's Kubernetes) cannot be
    /// taken: Kubernetes cannot be reached.
    #[error(
        "the cluster lock (Lease kube-system/talos-client-operation) cannot be taken, so no other admin host would see this operation: {reason}"
    )]
    ClusterLockUnavailable {
        /// Why.
        reason: String,
    },
    /// An option's value cannot be used (a malformed URL, say).
    #[error("{option} {value:?}: {reason}")]
    BadOption {
        /// The option (`lease_probe.server`, ...).
        option: String,
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The snapshot to restore does not verify.
    #[error("{file} cannot be restored: {error}", file = crate::text::shown_path(.file))]
    BadSnapshot {
        /// The file.
        file: String,
        /// Why.
        error: String,
    },
    /// A member's etcd answers with a leader: the cluster has quorum, and a
    /// restore would throw away what was written since the snapshot.
    #[error(
        "{node}'s etcd answers with leader {leader}: the cluster has quorum, and a restore would throw away everything written since the snapshot",
        node = crate::text::shown(.node)
    )]
    LiveEtcd {
        /// The node.
        node: String,
        /// The leader it reports.
        leader: String,
    },
    /// The node to restore onto cannot take the restore.
    #[error("{node} cannot be restored onto: {reason}", node = crate::text::shown(.node))]
    RestoreTarget {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
    /// A defragmentation threshold outside (0, 1].
    #[error(
        "a threshold of {value} is outside (0, 1]: it is the share of a member's database in use below which it is defragmented"
    )]
    BadThreshold {
        /// The value given.
        value: String,
    },
    /// The node's volumes could not be read, so its wipe labels cannot be
    /// checked.
    #[error("cannot read {node}'s volumes to check the labels to wipe: {error}", node = crate::text::shown(.node))]
    VolumesUnknown {
        /// The node.
        node: String,
        /// Why.
        error: String,
    },
    /// An upgrade image whose tag names no release, so nothing could tell
    /// whether a node came back on it.
    #[error(
        "{image}: its tag names no Talos release (as in ghcr.io/siderolabs/installer:v1.14.0), so a node's return on it cannot be checked",
        image = crate::text::shown(.image)
    )]
    ImageWithoutRelease {
        /// The image given.
        image: String,
    },
    /// etcd alarms are raised.
    #[error("etcd alarms are raised: {}", .alarms.join(", "))]
    AlarmsRaised {
        /// Each alarm and its member.
        alarms: Vec<String>,
    },
    /// An upgrade step Talos does not support, not accepted knowingly.
    #[error("{node} runs {from}; going to {to} is refused: {reason}", node = crate::text::shown(.node))]
    UnsupportedStep {
        /// The node.
        node: String,
        /// Its release.
        from: String,
        /// The target release.
        to: String,
        /// Why.
        reason: String,
    },
}

/// How to keep the old issuer and audience, on the node's version.
fn pin_advice(version: &str, old: &str) -> String {
    match super::sa_validation::Derivation::of(version) {
        super::sa_validation::Derivation::V1_13 => format!(
            "on Talos {version} set both cluster.apiServer.extraArgs.service-account-issuer and api-audiences to {old} (KubeServiceAccountConfig does not exist before 1.14), and keep cluster.serviceAccount.key"
        ),
        super::sa_validation::Derivation::V1_14 => format!(
            "on Talos {version} a KubeServiceAccountConfig document with issuer.issuerURL {old} (or the new URL with {old} under accepted.issuers and accepted.audiences), with the same issuer.privateKey"
        ),
    }
}
