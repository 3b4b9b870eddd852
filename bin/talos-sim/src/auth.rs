//! Roles and permissions, as apid and machined apply them: the front
//! checks every call it answers against [`crate::rules`] before any
//! handler runs, and remembers who called what (see [`CallLog`]).

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tonic::Status;

use crate::rules::{ADMIN, permits};
pub(crate) use crate::rules::{IMPERSONATOR, READER};

/// The roles a request was authenticated with, placed in the request's
/// extensions by the front.
#[derive(Debug, Clone, Default)]
pub(crate) struct CallerRoles(pub Vec<String>);

impl CallerRoles {
    fn has(&self, role: &str) -> bool {
        self.0.iter().any(|r| r == role)
    }
}

/// Whether the caller holds the admin role.
pub(crate) fn is_admin<T>(request: &tonic::Request<T>) -> bool {
    request
        .extensions()
        .get::<CallerRoles>()
        .is_some_and(|r| r.has(ADMIN))
}

/// Fails with PermissionDenied ("not authorized", as upstream's authorizer)
/// unless `roles` include one the rule table allows for `path` on a node
/// of `version`.
pub(crate) fn authorize(
    roles: &[String],
    path: &str,
    version: crate::TalosVersion,
) -> Result<(), Status> {
    if permits(roles, path, version) {
        Ok(())
    } else {
        Err(Status::permission_denied("not authorized"))
    }
}

/// One call a node answered (or refused): which node, which method, and the
/// roles it was judged by (the client certificate's, or those a peer apid
/// forwarded for the original caller).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    /// The node that answered.
    pub node: String,
    /// The full gRPC path (`/machine.MachineService/EtcdSnapshot`).
    pub method: String,
    /// The caller's roles.
    pub roles: Vec<String>,
    /// Whether the rule table let it through.
    pub allowed: bool,
}

/// The most recent calls of a cluster, oldest first (bounded, so a long
/// run does not grow without end).
#[derive(Debug, Default)]
pub(crate) struct CallLog {
    calls: Mutex<VecDeque<CallRecord>>,
}

/// How many calls [`CallLog`] keeps.
pub(crate) const CALL_LOG_LIMIT: usize = 20_000;

impl CallLog {
    /// Records one call, dropping the oldest beyond the limit.
    pub(crate) fn record(&self, call: CallRecord) {
        let mut calls = self.calls.lock().expect("call log lock");
        if calls.len() == CALL_LOG_LIMIT {
            calls.pop_front();
        }
        calls.push_back(call);
    }

    /// The calls kept, oldest first.
    pub(crate) fn calls(&self) -> Vec<CallRecord> {
        self.calls
            .lock()
            .expect("call log lock")
            .iter()
            .cloned()
            .collect()
    }
}
