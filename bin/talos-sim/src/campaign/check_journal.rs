//! I4: what each operation journaled against what the ledger saw. A step
//! journaled done shows its effect in the ledger; a step never started
//! sent nothing of its kind; a succeeded operation has every step done or
//! skipped and its end state holds; a failed one (not needs-attention)
//! passed no point of no return; nothing is left running.

use super::check::{Known, Violation, members_at_end, retires, rfc3339_ms};
use super::draw::OpKind;
use super::run::Gathered;
use crate::ledger::{CallKind, Entry, Event, MemberChange};

/// I4 for every operation both hosts journaled.
pub(super) fn journal_matches(known: &Known<'_>, gathered: &Gathered) -> Vec<Violation> {
    let mut found = Vec::new();
    for (records, host) in [(&gathered.operator, 0), (&gathered.second, 1)] {
        let subject = known.ours.get(host).cloned().unwrap_or_default();
        for record in records {
            let op = Op::of(known, record, subject.clone());
            found.extend(op.check(known, gathered));
        }
    }
    found
}

/// One journaled operation, as the checks read it.
struct Op<'a> {
    record: &'a serde_json::Value,
    id: String,
    kind: String,
    state: String,
    created_ms: u64,
    /// The host's certificate subject.
    subject: String,
    /// The node a retire or migration retires (its name), a join's or a
    /// migration's new node, a restore's node.
    target: Option<String>,
    joining: Option<String>,
    /// The planned member id of the retired node.
    member: Option<u64>,
}

fn v(what: String) -> Violation {
    Violation {
        invariant: "I4",
        what,
    }
}

impl<'a> Op<'a> {
    fn of(known: &Known<'_>, record: &'a serde_json::Value, subject: String) -> Op<'a> {
        let facts = &record["facts"];
        let kind = record["kind"].as_str().unwrap_or_default().to_string();
        let host = |s: &str| s.rsplit_once(':').map_or(s, |(h, _)| h).to_string();
        let target = match kind.as_str() {
            "retire" | "migrate" | "restore" => {
                let field = if kind == "restore" { "node" } else { "address" };
                facts[field].as_str().map(|a| known.name(a))
            }
            _ => None,
        };
        let joining = match kind.as_str() {
            "join" | "migrate" => facts["node"].as_str().map(|a| known.name(&host(a))),
            _ => None,
        };
        Op {
            record,
            id: record["id"].as_str().unwrap_or_default().to_string(),
            state: record["state"].as_str().unwrap_or_default().to_string(),
            created_ms: record["created"]
                .as_str()
                .and_then(rfc3339_ms)
                .unwrap_or_default(),
            member: facts["member"]["member_id"]
                .as_str()
                .and_then(|h| u64::from_str_radix(h, 16).ok()),
            kind,
            subject,
            target,
            joining,
        }
    }

    fn label(&self) -> String {
        format!("{} {}", self.kind, self.id)
    }

    /// The ledger from this operation's creation on.
    fn since<'l>(&self, ledger: &'l [Entry]) -> impl Iterator<Item = &'l Entry> + use<'l> {
        let created = self.created_ms;
        ledger.iter().filter(move |e| e.at_ms + 1 >= created)
    }

    fn check(&self, known: &Known<'_>, gathered: &Gathered) -> Vec<Violation> {
        let mut found = Vec::new();
        if self.state == "running" && gathered.overran.is_empty() {
            found.push(v(format!(
                "{} is still journaled running after the run",
                self.label()
            )));
        }
        let steps = self.record["steps"].as_array().cloned().unwrap_or_default();
        for step in &steps {
            found.extend(self.check_step(known, gathered, step));
        }
        match self.state.as_str() {
            "succeeded" => found.extend(self.check_succeeded(gathered, &steps)),
            "failed" => found.extend(self.check_failed(gathered)),
            _ => {}
        }
        found
    }

    fn check_step(
        &self,
        known: &Known<'_>,
        gathered: &Gathered,
        step: &serde_json::Value,
    ) -> Option<Violation> {
        let name = step["name"].as_str()?;
        let state = step["state"].as_str()?;
        let node = step["node"]
            .as_str()
            .map(|a| known.name(a))
            .or_else(|| self.target.clone());
        let label = match step["node"].as_str() {
            Some(n) => format!("{name} {n}"),
            None => name.to_string(),
        };
        let effect = Effect::of(&self.kind, name, node, self.joining.clone())?;
        let ledger = &gathered.ledger;
        match state {
            "done" if !self.since(ledger).any(|e| effect.done_by(e)) => Some(v(format!(
                "{}: step {label} is journaled done, but the ledger shows no {}",
                self.label(),
                effect.describe()
            ))),
            "pending" => self
                .since(ledger)
                .find(|e| effect.sent_by(e, &self.subject))
                .map(|e| {
                    v(format!(
                        "{}: step {label} is journaled as never started, but the ledger shows {} (entry {})",
                        self.label(),
                        effect.describe(),
                        e.seq
                    ))
                }),
            _ => None,
        }
    }

    fn check_succeeded(&self, gathered: &Gathered, steps: &[serde_json::Value]) -> Vec<Violation> {
        let mut found = Vec::new();
        let open: Vec<String> = steps
            .iter()
            .filter(|s| !matches!(s["state"].as_str(), Some("done" | "skipped")))
            .map(|s| s["name"].as_str().unwrap_or("?").to_string())
            .collect();
        if !open.is_empty() {
            found.push(v(format!(
                "{} succeeded with steps neither done nor skipped: {open:?}",
                self.label()
            )));
        }
        let members = members_at_end(&gathered.ledger);
        let kind = OpKind::ALL.iter().find(|k| k.name() == self.kind);
        if kind.is_some_and(|k| retires(*k))
            && let Some(id) = self.member
            && members.iter().any(|(m, _, _)| *m == id)
        {
            found.push(v(format!(
                "{} succeeded, but member {id:016x} is still in the cluster",
                self.label()
            )));
        }
        if let Some(new) = &self.joining
            && !members.iter().any(|(_, n, voter)| n == new && *voter)
        {
            found.push(v(format!(
                "{} succeeded, but {new} is no voting member",
                self.label()
            )));
        }
        found
    }

    /// A failed operation (not needs-attention) must not have passed a
    /// point of no return: its member removed, its node reset, a release
    /// installed, a cluster bootstrapped.
    fn check_failed(&self, gathered: &Gathered) -> Vec<Violation> {
        let ledger = &gathered.ledger;
        let mine = |e: &Entry, kinds: &[CallKind]| {
            matches!(&e.event, Event::Call { kind, caller, node, .. }
                if kinds.contains(kind) && caller.subject == self.subject
                    && (self.target.is_none() || self.target.as_deref() == Some(node.as_str())
                        || *kind != CallKind::Reset))
        };
        let passed = self.since(ledger).find(|e| match self.kind.as_str() {
            "retire" | "migrate" => {
                mine(e, &[CallKind::Reset])
                    || matches!(&e.event, Event::Member { change: MemberChange::Removed, id, .. }
                        if Some(*id) == self.member && e.cause.as_ref().and_then(|c| c.subject()) == Some(self.subject.as_str()))
            }
            "upgrade" => mine(e, &[CallKind::Upgrade, CallKind::LifecycleUpgrade]),
            "restore" => mine(e, &[CallKind::Bootstrap]),
            _ => false,
        });
        passed
            .map(|e| {
                v(format!(
                    "{} is journaled failed, but it passed a point of no return (ledger entry {}): it should need attention",
                    self.label(),
                    e.seq
                ))
            })
            .into_iter()
            .collect()
    }
}

/// What a step's effect looks like in the ledger.
struct Effect {
    step: &'static str,
    node: Option<String>,
    calls: &'static [CallKind],
}

impl Effect {
    fn of(kind: &str, name: &str, node: Option<String>, joining: Option<String>) -> Option<Effect> {
        let (step, calls, node): (&'static str, &'static [CallKind], _) = match name {
            "snapshot" => ("snapshot", &[CallKind::Snapshot], None),
            "forfeit" => ("forfeit", &[CallKind::Forfeit], node),
            "leave" => ("leave", &[CallKind::Leave], node),
            "remove" => ("remove", &[CallKind::RemoveMember], node),
            "reset" => ("reset", &[CallKind::Reset], node),
            "upgrade" => (
                "upgrade",
                &[CallKind::Upgrade, CallKind::LifecycleUpgrade],
                node,
            ),
            "defrag" => ("defrag", &[CallKind::Defrag], node),
            "disarm" => ("disarm", &[CallKind::AlarmDisarm], None),
            "try" => ("try", &[CallKind::Apply], node),
            // A retire's confirm is a read; an apply's confirms its TRY.
            "confirm" if kind == "apply" => ("confirm", &[CallKind::Apply], node),
            "apply-config" => ("apply-config", &[CallKind::Apply], joining),
            "wait-voter" => ("wait-voter", &[], joining),
            "bootstrap" => ("bootstrap", &[CallKind::Bootstrap], node),
            "upload" => ("upload", &[CallKind::Recover], node),
            _ => return None,
        };
        Some(Effect { step, node, calls })
    }

    fn describe(&self) -> String {
        let on = self
            .node
            .as_deref()
            .filter(|n| !n.is_empty())
            .map(|n| format!(" on {n}"))
            .unwrap_or_default();
        match self.step {
            "leave" | "remove" => format!("removal of the member{on}"),
            "wait-voter" => format!("voting member{on}"),
            "bootstrap" => format!("cluster bootstrapped{on}"),
            "try" => format!("TRY apply{on}"),
            "confirm" => format!("confirming apply{on}"),
            step => format!("{step} call{on}"),
        }
    }

    fn on_node(&self, node: &str) -> bool {
        self.node
            .as_deref()
            .is_none_or(|n| n.is_empty() || n == node)
    }

    /// Whether `e` shows the step's effect.
    fn done_by(&self, e: &Entry) -> bool {
        match (&e.event, self.step) {
            (
                Event::Member {
                    change: MemberChange::Removed,
                    name,
                    ..
                },
                "leave" | "remove",
            ) => self.on_node(name),
            (
                Event::Member {
                    change,
                    name,
                    learner,
                    ..
                },
                "wait-voter",
            ) => {
                let voter = matches!(change, MemberChange::Promoted)
                    || (matches!(change, MemberChange::Added) && !learner);
                voter && self.on_node(name)
            }
            (
                Event::Member {
                    change: MemberChange::Bootstrapped,
                    name,
                    ..
                },
                "bootstrap",
            ) => self.on_node(name),
            (
                Event::Apply {
                    node,
                    mode,
                    dry_run: false,
                },
                "try",
            ) => mode == "try" && self.on_node(node),
            (
                Event::Apply {
                    node,
                    mode,
                    dry_run: false,
                },
                "confirm",
            ) => mode != "try" && self.on_node(node),
            (Event::Call { kind, node, .. }, _) => {
                !matches!(
                    self.step,
                    "try" | "confirm" | "leave" | "remove" | "bootstrap"
                ) && self.calls.contains(kind)
                    && self.on_node(node)
            }
            _ => false,
        }
    }

    /// Whether `e` is the step's call, sent by `subject`.
    fn sent_by(&self, e: &Entry, subject: &str) -> bool {
        match (&e.event, self.step) {
            (
                Event::Apply {
                    node,
                    mode,
                    dry_run: false,
                },
                "try" | "confirm",
            ) => {
                (mode == "try") == (self.step == "try")
                    && self.on_node(node)
                    && e.cause.as_ref().and_then(|c| c.subject()) == Some(subject)
            }
            (
                Event::Call {
                    kind, node, caller, ..
                },
                _,
            ) => {
                // A removal goes through a survivor, not to its node.
                !matches!(self.step, "try" | "confirm")
                    && self.calls.contains(kind)
                    && (self.step == "remove" || self.on_node(node))
                    && caller.subject == subject
            }
            _ => false,
        }
    }
}
