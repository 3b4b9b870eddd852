//! Prometheus metrics (prometheus-client), served as text on
//! `--metrics-addr` when given: operations by kind and result, their
//! duration, the last successful snapshot's time, size and duration per
//! cluster, snapshot failures, the last leave-to-reset gap, and restore
//! drills: the last passed drill's time, duration and revision, and the
//! drills that failed; and defragmentations: the last successful one's time
//! and bytes given back, each member's bytes and duration in it, and the
//! defragmentations that failed; and upgrades: the last successful one's
//! time, each node's duration in it, and the upgrades that failed.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    cluster: String,
    kind: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    cluster: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    cluster: String,
    check: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PurposeLabels {
    cluster: String,
    purpose: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberLabels {
    cluster: String,
    member: String,
}

/// One member's part in a defragmentation: its hostname, the bytes it gave
/// back and how long its step ran.
#[derive(Debug, Clone, PartialEq)]
pub struct DefragMemberResult {
    /// The member's hostname.
    pub member: String,
    /// Bytes its database file shrank by.
    pub reclaimed: i64,
    /// How long its defragmentation step ran (wait for health included).
    pub took: Option<Duration>,
}

type F64Gauge = Gauge<f64, AtomicU64>;

/// The daemon's metrics; cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    operations: Family<OpLabels, Counter>,
    duration: Family<KindLabels, Histogram>,
    snapshot_time: Family<ClusterLabels, F64Gauge>,
    snapshot_size: Family<ClusterLabels, Gauge>,
    snapshot_duration: Family<ClusterLabels, F64Gauge>,
    snapshot_failures: Family<ClusterLabels, Counter>,
    gap: Family<ClusterLabels, F64Gauge>,
    drill_time: Family<ClusterLabels, F64Gauge>,
    drill_duration: Family<ClusterLabels, F64Gauge>,
    drill_revision: Family<ClusterLabels, Gauge>,
    drill_failures: Family<ClusterLabels, Counter>,
    defrag_time: Family<ClusterLabels, F64Gauge>,
    defrag_reclaimed: Family<ClusterLabels, Gauge>,
    defrag_member_reclaimed: Family<MemberLabels, Gauge>,
    defrag_member_duration: Family<MemberLabels, F64Gauge>,
    defrag_failures: Family<ClusterLabels, Counter>,
    upgrade_time: Family<ClusterLabels, F64Gauge>,
    upgrade_node_duration: Family<MemberLabels, F64Gauge>,
    upgrade_failures: Family<ClusterLabels, Counter>,
    report_level: Family<ClusterLabels, Gauge>,
    report_check: Family<CheckLabels, Gauge>,
    report_time: Family<ClusterLabels, F64Gauge>,
    certificate_remaining: Family<PurposeLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every series.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("talos_opsd");
        let operations = Family::<OpLabels, Counter>::default();
        let duration = Family::<KindLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0])
        });
        let snapshot_time = Family::<ClusterLabels, F64Gauge>::default();
        let snapshot_size = Family::<ClusterLabels, Gauge>::default();
        let snapshot_duration = Family::<ClusterLabels, F64Gauge>::default();
        let snapshot_failures = Family::<ClusterLabels, Counter>::default();
        let gap = Family::<ClusterLabels, F64Gauge>::default();
        let drill_time = Family::<ClusterLabels, F64Gauge>::default();
        let drill_duration = Family::<ClusterLabels, F64Gauge>::default();
        let drill_revision = Family::<ClusterLabels, Gauge>::default();
        let drill_failures = Family::<ClusterLabels, Counter>::default();
        registry.register(
            "operations",
            "Operations ended, by cluster, kind and result",
            operations.clone(),
        );
        registry.register(
            "operation_duration_seconds",
            "How long operations' steps ran, interruptions not counted",
            duration.clone(),
        );
        registry.register(
            "snapshot_last_success_timestamp_seconds",
            "When the last verified snapshot was taken: its snapshot step ended (Unix time)",
            snapshot_time.clone(),
        );
        registry.register(
            "snapshot_last_size_bytes",
            "Size of the last verified snapshot",
            snapshot_size.clone(),
        );
        registry.register(
            "snapshot_last_duration_seconds",
            "How long the last verified snapshot's snapshot step ran",
            snapshot_duration.clone(),
        );
        registry.register(
            "snapshot_failures",
            "Snapshot operations that failed",
            snapshot_failures.clone(),
        );
        registry.register(
            "leave_to_reset_gap_seconds",
            "The last retire's time between the leave's answer and the reset",
            gap.clone(),
        );
        registry.register(
            "drill_last_success_timestamp_seconds",
            "When the last restore drill that passed ended (Unix time)",
            drill_time.clone(),
        );
        registry.register(
            "drill_last_duration_seconds",
            "How long the last restore drill that passed ran",
            drill_duration.clone(),
        );
        registry.register(
            "drill_last_revision",
            "The etcd revision the last restore drill that passed restored",
            drill_revision.clone(),
        );
        registry.register(
            "drill_failures",
            "Restore drills that failed or could not start",
            drill_failures.clone(),
        );
        let defrag_time = Family::<ClusterLabels, F64Gauge>::default();
        let defrag_reclaimed = Family::<ClusterLabels, Gauge>::default();
        let defrag_member_reclaimed = Family::<MemberLabels, Gauge>::default();
        let defrag_member_duration = Family::<MemberLabels, F64Gauge>::default();
        let defrag_failures = Family::<ClusterLabels, Counter>::default();
        registry.register(
            "defrag_last_success_timestamp_seconds",
            "When the last defragmentation that succeeded ended, whether or not a member needed one (Unix time)",
            defrag_time.clone(),
        );
        registry.register(
            "defrag_last_reclaimed_bytes",
            "Bytes the last successful defragmentation that defragmented a member gave back, all members",
            defrag_reclaimed.clone(),
        );
        registry.register(
            "defrag_member_reclaimed_bytes",
            "Bytes each member gave back in the last defragmentation that included it",
            defrag_member_reclaimed.clone(),
        );
        registry.register(
            "defrag_member_duration_seconds",
            "How long each member's defragmentation step ran, the last time it had one",
            defrag_member_duration.clone(),
        );
        registry.register(
            "defrag_failures",
            "Defragmentations that failed or could not start",
            defrag_failures.clone(),
        );
        let upgrade_time = Family::<ClusterLabels, F64Gauge>::default();
        let upgrade_node_duration = Family::<MemberLabels, F64Gauge>::default();
        let upgrade_failures = Family::<ClusterLabels, Counter>::default();
        registry.register(
            "upgrade_last_success_timestamp_seconds",
            "When the last upgrade that succeeded ended (Unix time)",
            upgrade_time.clone(),
        );
        registry.register(
            "upgrade_node_duration_seconds",
            "How long each node's upgrade took in the last upgrade that included it, from sending it to passing its gate",
            upgrade_node_duration.clone(),
        );
        registry.register(
            "upgrade_failures",
            "Upgrades that failed or need attention",
            upgrade_failures.clone(),
        );
        let report_level = Family::<ClusterLabels, Gauge>::default();
        let report_check = Family::<CheckLabels, Gauge>::default();
        let report_time = Family::<ClusterLabels, F64Gauge>::default();
        let certificate_remaining = Family::<PurposeLabels, Gauge>::default();
        registry.register(
            "report_level",
            "The last risk report's level: 0 ok, 1 warning, 2 critical",
            report_level.clone(),
        );
        registry.register(
            "report_check_level",
            "The last risk report's worst finding per check (0 ok, 1 warning, 2 critical)",
            report_check.clone(),
        );
        registry.register(
            "report_last_timestamp_seconds",
            "When the last risk report was made (Unix time)",
            report_time.clone(),
        );
        registry.register(
            "certificate_remaining_seconds",
            "Seconds until each configured credential's client certificate expires (negative: expired)",
            certificate_remaining.clone(),
        );
        Metrics {
            registry: Arc::new(Mutex::new(registry)),
            operations,
            duration,
            snapshot_time,
            snapshot_size,
            snapshot_duration,
            snapshot_failures,
            gap,
            drill_time,
            drill_duration,
            drill_revision,
            drill_failures,
            defrag_time,
            defrag_reclaimed,
            defrag_member_reclaimed,
            defrag_member_duration,
            defrag_failures,
            upgrade_time,
            upgrade_node_duration,
            upgrade_failures,
            report_level,
            report_check,
            report_time,
            certificate_remaining,
        }
    }

    /// A risk report of `cluster` was made: its level, each check's worst
    /// level (every check is set, so one that cleared reads 0) and each
    /// credential's remaining time.
    pub fn report(&self, cluster: &str, report: &talos_client::ops::RiskReport) {
        let labels = ClusterLabels {
            cluster: cluster.into(),
        };
        self.report_level
            .get_or_create(&labels)
            .set(i64::from(report.level.exit_code()));
        let at = time::OffsetDateTime::now_utc().unix_timestamp_nanos() as f64 / 1e9;
        self.report_time.get_or_create(&labels).set(at);
        for check in talos_client::ops::REPORT_CHECKS {
            let worst = report
                .findings
                .iter()
                .filter(|f| f.check == *check)
                .map(|f| f.level.exit_code())
                .max()
                .unwrap_or(0);
            self.report_check
                .get_or_create(&CheckLabels {
                    cluster: cluster.into(),
                    check: (*check).into(),
                })
                .set(i64::from(worst));
        }
        for c in &report.certificates {
            self.certificate_remaining
                .get_or_create(&PurposeLabels {
                    cluster: cluster.into(),
                    purpose: c.purpose.clone(),
                })
                .set(c.remaining_seconds);
        }
    }

    /// An operation ended.
    pub fn operation(&self, cluster: &str, kind: &str, result: &str, took: Duration) {
        self.operations
            .get_or_create(&OpLabels {
                cluster: cluster.into(),
                kind: kind.into(),
                result: result.into(),
            })
            .inc();
        self.duration
            .get_or_create(&KindLabels {
                cluster: cluster.into(),
                kind: kind.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// A verified snapshot (of `size` bytes, when known) was taken at `at`
    /// (Unix seconds), its snapshot step having run for `took`.
    pub fn snapshot_succeeded(&self, cluster: &str, size: Option<u64>, took: Duration, at: f64) {
        let labels = ClusterLabels {
            cluster: cluster.into(),
        };
        self.snapshot_time.get_or_create(&labels).set(at);
        if let Some(size) = size {
            self.snapshot_size
                .get_or_create(&labels)
                .set(i64::try_from(size).unwrap_or(i64::MAX));
        }
        self.snapshot_duration
            .get_or_create(&labels)
            .set(took.as_secs_f64());
    }

    /// A snapshot failed.
    pub fn snapshot_failed(&self, cluster: &str) {
        self.snapshot_failures
            .get_or_create(&ClusterLabels {
                cluster: cluster.into(),
            })
            .inc();
    }

    /// A restore drill passed at `at` (Unix seconds) after `took`, having
    /// restored `revision`.
    pub fn drill_succeeded(&self, cluster: &str, at: f64, took: Duration, revision: Option<i64>) {
        let labels = ClusterLabels {
            cluster: cluster.into(),
        };
        self.drill_time.get_or_create(&labels).set(at);
        self.drill_duration
            .get_or_create(&labels)
            .set(took.as_secs_f64());
        if let Some(revision) = revision {
            self.drill_revision.get_or_create(&labels).set(revision);
        }
    }

    /// A restore drill failed (or could not start).
    pub fn drill_failed(&self, cluster: &str) {
        self.drill_failures
            .get_or_create(&ClusterLabels {
                cluster: cluster.into(),
            })
            .inc();
    }

    /// A defragmentation succeeded at `at` (Unix seconds); `members` are
    /// those it defragmented (none when no member needed it).
    pub fn defrag_succeeded(&self, cluster: &str, at: f64, members: &[DefragMemberResult]) {
        let labels = ClusterLabels {
            cluster: cluster.into(),
        };
        self.defrag_time.get_or_create(&labels).set(at);
        // A run that found no member to defragment leaves the last
        // reclaimed figures as they were.
        if members.is_empty() {
            return;
        }
        self.defrag_reclaimed
            .get_or_create(&labels)
            .set(members.iter().map(|m| m.reclaimed).sum());
        for m in members {
            let labels = MemberLabels {
                cluster: cluster.into(),
                member: m.member.clone(),
            };
            self.defrag_member_reclaimed
                .get_or_create(&labels)
                .set(m.reclaimed);
            if let Some(took) = m.took {
                self.defrag_member_duration
                    .get_or_create(&labels)
                    .set(took.as_secs_f64());
            }
        }
    }

    /// A defragmentation failed (or could not start).
    pub fn defrag_failed(&self, cluster: &str) {
        self.defrag_failures
            .get_or_create(&ClusterLabels {
                cluster: cluster.into(),
            })
            .inc();
    }

    /// An upgrade succeeded at `at` (Unix seconds); `nodes` are each
    /// node's hostname and how long its upgrade took.
    pub fn upgrade_succeeded(&self, cluster: &str, at: f64, nodes: &[(String, Duration)]) {
        self.upgrade_time
            .get_or_create(&ClusterLabels {
                cluster: cluster.into(),
            })
            .set(at);
        for (member, took) in nodes {
            self.upgrade_node_duration
                .get_or_create(&MemberLabels {
                    cluster: cluster.into(),
                    member: member.clone(),
                })
                .set(took.as_secs_f64());
        }
    }

    /// An upgrade failed (or could not start).
    pub fn upgrade_failed(&self, cluster: &str) {
        self.upgrade_failures
            .get_or_create(&ClusterLabels {
                cluster: cluster.into(),
            })
            .inc();
    }

    /// A retire's leave-to-reset gap.
    pub fn leave_to_reset_gap(&self, cluster: &str, seconds: f64) {
        self.gap
            .get_or_create(&ClusterLabels {
                cluster: cluster.into(),
            })
            .set(seconds);
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

/// Serves `GET /metrics` and `HEAD /metrics` (and nothing else) on
/// `listener`, HTTP/1.0 style: one request per connection.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Metrics) {
    let listener = std::sync::Arc::new(listener);
    let accept = || {
        let listener = std::sync::Arc::clone(&listener);
        async move {
            let (conn, addr) = listener.accept().await?;
            Ok((conn, addr.ip().to_string()))
        }
    };
    crate::accept::run(
        "metrics",
        crate::slots::Slots::new("metrics", crate::accept::MAX_METRICS_CONNECTIONS),
        accept,
        |conn, slot| {
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let state = std::sync::Arc::clone(&slot.state);
                tokio::select! {
                    () = answer(conn, &slot, &metrics) => {}
                    // Its slot was taken by a newer connection while it
                    // had not sent its request yet.
                    () = state.until_closed() => {}
                }
            });
        },
    )
    .await;
}

/// Reads one request (its head within [`crate::accept::HEADER_TIMEOUT`])
/// and answers it.
async fn answer(mut conn: tokio::net::TcpStream, slot: &crate::slots::Slot, metrics: &Metrics) {
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    let read = tokio::time::timeout(crate::accept::HEADER_TIMEOUT, async {
        while len < buf.len() {
            let n = conn.read(&mut buf[len..]).await?;
            if n == 0 {
                break;
            }
            len += n;
            if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    if !matches!(read, Ok(Ok(()))) {
        return;
    }
    slot.state.begin();
    let request = String::from_utf8_lossy(&buf[..len]);
    let (head, body) = respond(&request, metrics);
    let _ = conn.write_all(head.as_bytes()).await;
    let _ = conn.write_all(body.as_bytes()).await;
    let _ = conn.shutdown().await;
    slot.state.end();
}

/// The response to `request`: its head, and its body (empty for `HEAD`,
/// whose head is the one `GET` would have, `content-length` included).
fn respond(request: &str, metrics: &Metrics) -> (String, String) {
    let mut words = request.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (status, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", metrics.encode()),
        _ => ("404 Not Found", "not found: try /metrics\n".to_string()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let body = if method == "HEAD" {
        String::new()
    } else {
        body
    };
    (head, body)
}
