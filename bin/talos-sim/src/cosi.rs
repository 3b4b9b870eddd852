//! `cosi.resource.State` on a simulated node, as machined serves it
//! (siderolabs/talos internal/app/machined/internal/server/v1alpha1/
//! v1alpha1_server.go registers cosi-project/runtime's protobuf state
//! server over the node's resources, behind the access filter of
//! internal/app/resources/access.go):
//!
//! - roles per method as machined.go's rule table: Get, List and Watch for
//!   admin, operator and reader; Create, Update and Destroy admin only, and
//!   then refused by the filter ("write access is not allowed");
//! - a type without a definition: PermissionDenied `resource type "X" is
//!   not supported`; a sensitive type (MachineConfig) without `os:admin`:
//!   PermissionDenied "not authorized"; an unknown namespace:
//!   PermissionDenied `namespace "X" is not supported`;
//! - a missing resource: NotFound `resource T(ns/id@undefined) doesn't
//!   exist` (runtime's inmem state);
//! - Watch first sends an empty message (ready), then the events
//!   (pkg/state/protobuf/server/server.go).
//!
//! Resources are derived from the node's state (in the `cosi_state` module)
//! whenever they are read; a version store per node gives each resource a
//! version that grows with every change, and a watch compares successive
//! readings. The stream ends when the node goes down.
//!
//! Also here: the switch that decides whether `Read /system/state/...`
//! serves files. By default it answers NotFound, as Talos 1.13.9 does
//! (STATE is not mounted since v1.12.0, upstream commit "feat: stop
//! mounting state partition"); a test of `Read` itself turns it on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use futures::Stream;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};

use crate::api::cosi::resource as pb;
use crate::api::cosi_server::cosi::resource::state_server::{State, StateServer};
use crate::auth::CallerRoles;
use crate::cosi_state::{self, Item};
use crate::front::Front;
use crate::machined::Machined;
use crate::node::{Node, Power};
use talos_client::client::MAX_MESSAGE_SIZE;

type BoxStream<T> = std::pin::Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// How often a watch looks at the node's state again.
const WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// Registers the front as `cosi.resource.State`.
pub(crate) struct CosiName;

impl NamedService for Front<CosiName> {
    const NAME: &'static str = "cosi.resource.State";
}

/// The front service for COSI calls (routed like every other call).
pub(crate) fn front(machined: Machined) -> Front<CosiName> {
    Front::new(machined)
}

/// Answers a COSI call on this node (after the front's routing).
pub(crate) fn server(machined: Machined) -> StateServer<Machined> {
    StateServer::new(machined)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE)
}

/// Per-node bookkeeping: resource versions, and the STATE switch.
#[derive(Default)]
struct NodeCosi {
    versions: Mutex<HashMap<(String, String, String), Versioned>>,
    state_mounted: std::sync::atomic::AtomicBool,
}

#[derive(Clone)]
struct Versioned {
    version: u64,
    created: SystemTime,
    updated: SystemTime,
    item: Item,
}

/// Nodes' bookkeeping, found by the node's address in memory and checked
/// against a weak reference (a freed node's slot is never reused).
static REGISTRY: Mutex<Vec<(Weak<Node>, Arc<NodeCosi>)>> = Mutex::new(Vec::new());

fn lookup(node: &Node) -> Option<Arc<NodeCosi>> {
    let mut registry = REGISTRY.lock().expect("cosi registry");
    registry.retain(|(weak, _)| weak.strong_count() > 0);
    registry
        .iter()
        .find(|(weak, _)| std::ptr::eq(weak.as_ptr(), node))
        .map(|(_, state)| state.clone())
}

fn bookkeeping(node: &Arc<Node>) -> Arc<NodeCosi> {
    if let Some(state) = lookup(node) {
        return state;
    }
    let state = Arc::new(NodeCosi::default());
    let mut registry = REGISTRY.lock().expect("cosi registry");
    registry.push((Arc::downgrade(node), state.clone()));
    state
}

/// Whether `Read /system/state/...` on `node` serves the STATE volume's
/// files (`mounted = true`, as Talos did before v1.12.0) or answers
/// NotFound (`false`, the default, as Talos 1.13.9 does: its configuration
/// is read through COSI).
pub fn set_state_partition_mounted(node: &Arc<Node>, mounted: bool) {
    bookkeeping(node)
        .state_mounted
        .store(mounted, std::sync::atomic::Ordering::Relaxed);
}

/// Whether `Read` may serve files of STATE on `node` (see
/// [`set_state_partition_mounted`]).
pub(crate) fn state_partition_mounted(node: &Node) -> bool {
    lookup(node).is_some_and(|s| s.state_mounted.load(std::sync::atomic::Ordering::Relaxed))
}

impl NodeCosi {
    /// Versions a fresh reading: a changed spec gets the next version, a
    /// vanished resource is forgotten (a new one starts at 1 again).
    fn record(&self, items: Vec<Item>) -> Vec<Versioned> {
        let now = SystemTime::now();
        let mut versions = self.versions.lock().expect("versions");
        let keys: std::collections::HashSet<_> = items.iter().map(key).collect();
        versions.retain(|k, _| keys.contains(k));
        items
            .into_iter()
            .map(|item| {
                let entry = versions.entry(key(&item)).or_insert_with(|| Versioned {
                    version: 1,
                    created: now,
                    updated: now,
                    item: item.clone(),
                });
                if entry.item != item {
                    entry.version += 1;
                    entry.updated = now;
                    entry.item = item;
                }
                entry.clone()
            })
            .collect()
    }
}

fn key(item: &Item) -> (String, String, String) {
    (
        item.namespace.to_string(),
        item.resource_type.to_string(),
        item.id.clone(),
    )
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: 0,
    }
}

fn to_wire(v: &Versioned) -> pb::Resource {
    pb::Resource {
        metadata: Some(pb::Metadata {
            namespace: v.item.namespace.into(),
            r#type: v.item.resource_type.into(),
            id: v.item.id.clone(),
            version: v.version.to_string(),
            owner: String::new(),
            phase: "running".into(),
            created: Some(timestamp(v.created)),
            updated: Some(timestamp(v.updated)),
            finalizers: Vec::new(),
            labels: HashMap::new(),
            annotations: v.item.annotations.iter().cloned().collect(),
        }),
        spec: Some(pb::Spec {
            proto_spec: v.item.proto.clone(),
            yaml_spec: v.item.yaml.clone(),
        }),
    }
}

fn roles<T>(request: &Request<T>) -> Vec<String> {
    request
        .extensions()
        .get::<CallerRoles>()
        .map(|r| r.0.clone())
        .unwrap_or_default()
}

/// The method rule (machined.go) and the access filter (access.go).
fn check_read<T>(request: &Request<T>, namespace: &str, resource_type: &str) -> Result<(), Status> {
    let roles = roles(request);
    let has = |role: &str| roles.iter().any(|r| r == role);
    if !(has("os:admin") || has("os:operator") || has("os:reader")) {
        return Err(Status::permission_denied("not authorized"));
    }
    let Some(def) = cosi_state::definition(resource_type) else {
        return Err(Status::permission_denied(format!(
            "resource type {resource_type:?} is not supported"
        )));
    };
    if def.sensitive && !has("os:admin") {
        return Err(Status::permission_denied("not authorized"));
    }
    if !cosi_state::NAMESPACES
        .iter()
        .any(|(ns, _)| *ns == namespace)
    {
        return Err(Status::permission_denied(format!(
            "namespace {namespace:?} is not supported"
        )));
    }
    Ok(())
}

fn check_write<T>(request: &Request<T>) -> Status {
    if roles(request).iter().any(|r| r == "os:admin") {
        Status::permission_denied("write access is not allowed")
    } else {
        Status::permission_denied("not authorized")
    }
}

impl Machined {
    /// The node's resources of one namespace and type, versioned.
    async fn cosi_read(&self, namespace: &str, resource_type: &str) -> Vec<Versioned> {
        let items = cosi_state::snapshot(&self.shared, &self.node).await;
        bookkeeping(&self.node)
            .record(items)
            .into_iter()
            .filter(|v| v.item.namespace == namespace && v.item.resource_type == resource_type)
            .collect()
    }
}

fn not_found(namespace: &str, resource_type: &str, id: &str) -> Status {
    Status::not_found(format!(
        "resource {resource_type}({namespace}/{id}@undefined) doesn't exist"
    ))
}

#[tonic::async_trait]
impl State for Machined {
    async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        check_read(
            &request,
            &request.get_ref().namespace,
            &request.get_ref().r#type,
        )?;
        let r = request.into_inner();
        let found = self
            .cosi_read(&r.namespace, &r.r#type)
            .await
            .into_iter()
            .find(|v| v.item.id == r.id);
        match found {
            Some(v) => Ok(Response::new(pb::GetResponse {
                resource: Some(to_wire(&v)),
            })),
            None => Err(not_found(&r.namespace, &r.r#type, &r.id)),
        }
    }

    async fn list(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<BoxStream<pb::ListResponse>>, Status> {
        check_read(
            &request,
            &request.get_ref().namespace,
            &request.get_ref().r#type,
        )?;
        let r = request.into_inner();
        let mut items = self.cosi_read(&r.namespace, &r.r#type).await;
        items.sort_by(|a, b| a.item.id.cmp(&b.item.id));
        let answers: Vec<_> = items
            .iter()
            .map(|v| {
                Ok(pb::ListResponse {
                    resource: Some(to_wire(v)),
                })
            })
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(answers))))
    }

    async fn create(
        &self,
        request: Request<pb::CreateRequest>,
    ) -> Result<Response<pb::CreateResponse>, Status> {
        Err(check_write(&request))
    }

    async fn update(
        &self,
        request: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        Err(check_write(&request))
    }

    async fn destroy(
        &self,
        request: Request<pb::DestroyRequest>,
    ) -> Result<Response<pb::DestroyResponse>, Status> {
        Err(check_write(&request))
    }

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<BoxStream<pb::WatchResponse>>, Status> {
        check_read(
            &request,
            &request.get_ref().namespace,
            &request.get_ref().r#type,
        )?;
        let r = request.into_inner();
        let options = r.options.clone().unwrap_or_default();
        if r.id.is_some() && options.bootstrap_contents {
            return Err(Status::unimplemented(
                "bootstrap contents is not implemented for resource watch",
            ));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let machined = self.clone();
        tokio::spawn(async move { watch_loop(machined, r, options, tx).await });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

type Sender = tokio::sync::mpsc::Sender<Result<pb::WatchResponse, Status>>;

fn event(kind: pb::EventType, resource: &Versioned, old: Option<&Versioned>) -> pb::WatchResponse {
    pb::WatchResponse {
        event: vec![pb::Event {
            resource: Some(to_wire(resource)),
            event_type: kind as i32,
            old: old.map(to_wire),
            error: None,
            bookmark: None,
        }],
    }
}

/// Sends the watch's events until the caller goes away or the node goes
/// down (then the stream fails as a broken connection would).
async fn watch_loop(
    machined: Machined,
    r: pb::WatchRequest,
    options: pb::WatchOptions,
    tx: Sender,
) {
    let pick = |items: Vec<Versioned>| -> HashMap<String, Versioned> {
        items
            .into_iter()
            .filter(|v| r.id.as_ref().is_none_or(|id| *id == v.item.id))
            .map(|v| (v.item.id.clone(), v))
            .collect()
    };
    if tx.send(Ok(pb::WatchResponse::default())).await.is_err() {
        return;
    }
    let mut seen = pick(machined.cosi_read(&r.namespace, &r.r#type).await);
    // A watch of one resource starts with its state; a watch of a type
    // with its contents only when asked to (then a bootstrapped marker).
    if r.id.is_some() || options.bootstrap_contents {
        let mut initial: Vec<_> = seen.values().collect();
        initial.sort_by(|a, b| a.item.id.cmp(&b.item.id));
        for v in initial {
            if tx
                .send(Ok(event(pb::EventType::Created, v, None)))
                .await
                .is_err()
            {
                return;
            }
        }
    }
    if r.id.is_none() && options.bootstrap_contents && r.api_version >= 1 {
        let marker = pb::WatchResponse {
            event: vec![pb::Event {
                event_type: pb::EventType::Bootstrapped as i32,
                ..Default::default()
            }],
        };
        if tx.send(Ok(marker)).await.is_err() {
            return;
        }
    }
    loop {
        tokio::select! {
            () = tokio::time::sleep(WATCH_INTERVAL) => {}
            () = tx.closed() => return,
        }
        if machined.node.power() != Power::On {
            let _ = tx
                .send(Err(Status::unavailable("error reading from server: EOF")))
                .await;
            return;
        }
        let now = pick(machined.cosi_read(&r.namespace, &r.r#type).await);
        let mut events = Vec::new();
        for (id, v) in &now {
            match seen.get(id) {
                None => events.push(event(pb::EventType::Created, v, None)),
                Some(old) if old.version != v.version => {
                    events.push(event(pb::EventType::Updated, v, Some(old)))
                }
                Some(_) => {}
            }
        }
        for (id, old) in &seen {
            if !now.contains_key(id) {
                events.push(event(pb::EventType::Destroyed, old, None));
            }
        }
        for e in events {
            if tx.send(Ok(e)).await.is_err() {
                return;
            }
        }
        seen = now;
    }
}

impl crate::Cluster {
    /// Sets, on the node `target` (hostname or address), whether `Read`
    /// serves files of STATE; see [`set_state_partition_mounted`].
    pub fn set_state_partition_mounted(
        &self,
        target: &str,
        mounted: bool,
    ) -> Result<(), crate::SimError> {
        let node = self.node(target).ok_or_else(|| {
            crate::SimError::Refused(format!("no node {target:?} in the simulated cluster"))
        })?;
        set_state_partition_mounted(&node, mounted);
        Ok(())
    }
}
