//! `join NODE`: wait until a new control-plane node is a voting etcd member
//! (its learner promoted) and every member is healthy. Changes nothing.

use std::time::{Duration, Instant};

use serde_json::json;

use super::cluster::{ClusterView, names};
use super::{OpKind, Ops, OpsError, Outcome, Plan, PlannedStep, fact};

/// Options of [`Ops::plan_join`].
#[derive(Debug, Clone)]
pub struct JoinOptions {
    /// The new node: hostname or address.
    pub node: String,
    /// How long to wait.
    pub timeout: Duration,
}

impl Ops {
    /// Plans the wait; notes when the join makes the member count even (an
    /// even count survives no more failures than one fewer).
    pub async fn plan_join(&self, options: &JoinOptions) -> Result<Plan, OpsError> {
        let view = ClusterView::read(&self.client).await?;
        let mut notes = Vec::new();
        let after = view.members.len() + usize::from(view.find(&options.node).is_none());
        if after % 2 == 0 {
            notes.push(format!(
                "with {} the cluster has {after} members, an even count: it survives no more failures than {}",
                options.node,
                after - 1
            ));
        }
        let mut facts = serde_json::Map::new();
        facts.insert("node".into(), json!(options.node));
        Ok(Plan {
            kind: OpKind::Join,
            params: json!({ "node": options.node, "timeout_s": options.timeout.as_secs() }),
            steps: vec![PlannedStep {
                name: "wait-voter".into(),
                description: format!(
                    "wait up to {} s until {} is a voting member and every member is healthy",
                    options.timeout.as_secs(),
                    options.node
                ),
                destructive: false,
            }],
            notes,
            facts,
        })
    }

    pub(super) async fn join_step(
        &mut self,
        step: &str,
        facts: &mut serde_json::Map<String, serde_json::Value>,
    ) -> Result<Outcome, OpsError> {
        if step != "wait-voter" {
            return Err(OpsError::step(step, "unknown step"));
        }
        let node = fact(facts, "node").to_string();
        let timeout = Duration::from_secs(
            facts
                .get("params")
                .and_then(|p| p["timeout_s"].as_u64())
                .unwrap_or(600),
        );
        let started = Instant::now();
        let mut last;
        loop {
            last = match ClusterView::read(&self.client).await {
                Ok(view) => match view.find(&node) {
                    None => format!(
                        "{node} is not a member yet ({})",
                        names(&view.members).join(", ")
                    ),
                    Some(m) if m.is_learner => format!("{node} is still a learner"),
                    Some(_) => {
                        let unhealthy: Vec<_> = view
                            .voters()
                            .filter(|m| !view.healthy(m.id))
                            .map(|m| m.hostname.clone())
                            .collect();
                        if unhealthy.is_empty() && view.disagreements.is_empty() {
                            let took = started.elapsed().as_secs_f64();
                            facts.insert("join_seconds".into(), json!(took));
                            let count = view.members.len();
                            let even = if count % 2 == 0 {
                                " (an even count)"
                            } else {
                                ""
                            };
                            return Ok(Outcome::done(format!(
                                "{node} is a healthy voter after {took:.1} s; {count} members{even}"
                            )));
                        }
                        format!(
                            "unhealthy: {} {}",
                            unhealthy.join(", "),
                            view.disagreements.join("; ")
                        )
                    }
                },
                Err(e) => e.to_string(),
            };
            if started.elapsed() > timeout {
                return Err(OpsError::step("wait-voter", format!("timed out: {last}")));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
