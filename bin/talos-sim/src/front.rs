//! The apid front of a simulated node: authenticates the caller, then routes
//! by gRPC metadata as siderolabs/talos
//! internal/app/apid/pkg/director/director.go does:
//!
//! - `proxyfrom` present (a peer apid forwarded the call) or no routing
//!   metadata: the local node answers;
//! - `node: X`: forwarded verbatim to X's apid (X's answer, unchanged);
//! - `nodes: X, Y, ...`: sent to each and merged (see [`super::proxy`]).

use std::convert::Infallible;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use http::HeaderName;
use http_body_util::{BodyExt as _, Full};
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::{Code, Status};
use tower::ServiceExt as _;

use super::auth::{CallRecord, CallerRoles, IMPERSONATOR, READER, authorize};
use super::go_errors;
use super::machined::Machined;
use super::proxy::{self, MethodKind};
use super::serve::{PeerInfo, certificate_roles};
use crate::api::server::cluster::cluster_service_server::ClusterServiceServer;
use crate::api::server::machine::image_service_server::ImageServiceServer;
use crate::api::server::machine::lifecycle_service_server::LifecycleServiceServer;
use crate::api::server::machine::machine_service_server::MachineServiceServer;
use crate::ledger::{CallKind, Caller};
use talos_client::client::MAX_MESSAGE_SIZE;

/// Metadata carrying the caller's roles between apids.
const ROLE_KEY: HeaderName = HeaderName::from_static("talos-role");
/// Routing metadata, parsed once rather than on every lookup.
const NODE: HeaderName = HeaderName::from_static("node");
const NODES: HeaderName = HeaderName::from_static("nodes");
const PROXY_FROM: HeaderName = HeaderName::from_static("proxyfrom");
/// The original caller of a call one of the simulator's apids forwards to
/// another over the network, for the ledger (trusted from a peer apid
/// only, as the roles are).
const CALLER_KEY: HeaderName = HeaderName::from_static("talos-sim-caller");

/// The front service; `S` only selects the gRPC service name it is
/// registered under (tonic routes by name).
pub(crate) struct Front<S> {
    machined: Machined,
    _service: PhantomData<fn() -> S>,
}

impl<S> Clone for Front<S> {
    fn clone(&self) -> Self {
        Front {
            machined: self.machined.clone(),
            _service: PhantomData,
        }
    }
}

impl<S> Front<S> {
    pub(crate) fn new(machined: Machined) -> Self {
        Front {
            machined,
            _service: PhantomData,
        }
    }
}

/// Registers the front as `machine.MachineService`.
pub(crate) struct MachineName;
/// Registers the front as `cluster.ClusterService`.
pub(crate) struct ClusterName;
/// Registers the front as `machine.ImageService`.
pub(crate) struct ImageName;
/// Registers the front as `machine.LifecycleService`.
pub(crate) struct LifecycleName;

impl NamedService for Front<MachineName> {
    const NAME: &'static str = "machine.MachineService";
}

impl NamedService for Front<ClusterName> {
    const NAME: &'static str = "cluster.ClusterService";
}

impl NamedService for Front<ImageName> {
    const NAME: &'static str = "machine.ImageService";
}

impl NamedService for Front<LifecycleName> {
    const NAME: &'static str = "machine.LifecycleService";
}

/// Registers the front under a service machined serves whose calls the
/// simulator does not simulate: each call is judged by the rule table
/// first, as on a Talos node, then answered Unimplemented.
macro_rules! unsimulated_service {
    ($($marker:ident => $name:literal),* $(,)?) => {$(
        #[doc = concat!("Registers the front as `", $name, "` (not simulated).")]
        pub(crate) struct $marker;

        impl NamedService for Front<$marker> {
            const NAME: &'static str = $name;
        }
    )*};
}

unsimulated_service! {
    StorageName => "storage.StorageService",
    TimeName => "time.TimeService",
    InspectName => "inspect.InspectService",
    DebugName => "machine.DebugService",
}

impl<S: Send + 'static> tower::Service<http::Request<Body>> for Front<S> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let machined = self.machined.clone();
        Box::pin(async move { Ok(route(machined, request).await) })
    }
}

fn header_values(request: &http::Request<Body>, key: &HeaderName) -> Vec<String> {
    request
        .headers()
        .get_all(key)
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect()
}

/// The caller's roles: its certificate's Organization values, or, for a
/// peer apid holding the impersonator role, the roles it forwarded
/// (upstream's authz.Injector in Enabled mode).
fn caller_roles(request: &http::Request<Body>) -> Vec<String> {
    let certificate_roles = certificate_roles(request.extensions());
    if certificate_roles.iter().any(|r| r == IMPERSONATOR) {
        let forwarded = header_values(request, &ROLE_KEY);
        if !forwarded.is_empty() {
            return forwarded;
        }
    }
    certificate_roles
}

async fn route(machined: Machined, mut request: http::Request<Body>) -> http::Response<Body> {
    if !machined.node.is_configured() {
        // Maintenance mode: every caller is a reader (ApplyConfiguration
        // allows it there) and nothing is routed to other nodes
        // (runtime/api_service_config.go: ReadonlyRoleMode,
        // NodeRoutingDisabled).
        return local(&machined, request, vec![READER.to_string()]).await;
    }
    let roles = caller_roles(&request);
    if request.headers().contains_key(PROXY_FROM) {
        adopt_forwarded_caller(&mut request);
        return local(&machined, request, roles).await;
    }
    // The call enters the cluster here: who sent it goes with it.
    let caller = Caller::of_peer(request.extensions().get::<PeerInfo>(), &machined.node.name);
    request.extensions_mut().insert(caller);
    let nodes = header_values(&request, &NODES);
    let node = header_values(&request, &NODE);
    if node.len() > 1 {
        return Status::invalid_argument("node metadata must be single-valued").into_http();
    }
    if !nodes.is_empty() {
        return Box::pin(one_to_many(&machined, request, nodes, roles)).await;
    }
    if let Some(Err(status)) = node.first().map(|t| check_target(t)) {
        return status.into_http();
    }
    match node.first() {
        Some(target) if !machined.shared.is_self(&machined.node, target) => {
            prepare_forward(&machined, &mut request, &roles);
            let unary = proxy::method_kind(request.uri().path()) == MethodKind::Unary;
            let answer = if unary {
                forward_unary(&machined, target, request).await
            } else {
                forward(&machined, target, request).await
            };
            answer.unwrap_or_else(Status::into_http)
        }
        _ => local(&machined, request, roles).await,
    }
}

/// The caller a peer apid forwarded over the network with the call, unless
/// the call came in-process with its caller already.
fn adopt_forwarded_caller(request: &mut http::Request<Body>) {
    if request.extensions().get::<Caller>().is_some() {
        return;
    }
    let from_peer_apid = certificate_roles(request.extensions())
        .iter()
        .any(|r| r == IMPERSONATOR);
    let forwarded = request
        .headers()
        .get(CALLER_KEY)
        .and_then(Caller::from_header);
    if let (true, Some(caller)) = (from_peer_apid, forwarded) {
        request.extensions_mut().insert(caller);
    }
}

/// The services machined registers: a call to any of their methods is
/// judged by the rule table before anything else, as machined's authorizer
/// interceptor judges it (a method it serves or not); a call to any other
/// service is unknown to the server, which answers Unimplemented first.
const AUTHORIZED_SERVICES: &[&str] = &[
    "/machine.",
    "/cluster.",
    "/cosi.resource.",
    "/storage.",
    "/time.",
    "/inspect.",
];

/// Answers on this node once the caller's roles pass the rule table (the
/// call is logged either way; a refused call reaches no handler and is no
/// call in the ledger). A call the ledger records is recorded here, where it
/// is handled, and everything it causes carries it. Boxed, so that the
/// futures holding it stay small (every forwarded call moves one).
fn local(
    machined: &Machined,
    request: http::Request<Body>,
    roles: Vec<String>,
) -> BoxFuture<'static, http::Response<Body>> {
    let path = request.uri().path().to_string();
    if AUTHORIZED_SERVICES.iter().any(|s| path.starts_with(s)) {
        let verdict = authorize(&roles, &path, machined.node.talos_version());
        machined.shared.calls.record(CallRecord {
            node: machined.node.name.clone(),
            method: path.clone(),
            roles: roles.clone(),
            allowed: verdict.is_ok(),
        });
        if let Err(status) = verdict {
            return Box::pin(async move { status.into_http() });
        }
    }
    let Some(kind) = CallKind::of_method(&path) else {
        return answer_here(machined, request, roles);
    };
    let node = &machined.node.name;
    let caller = request
        .extensions()
        .get::<Caller>()
        .cloned()
        .unwrap_or_else(|| Caller::of_peer(request.extensions().get::<PeerInfo>(), node));
    let cause = machined.shared.ledger.call(node, &path, kind, caller);
    Box::pin(crate::ledger::with_cause(
        cause,
        answer_here(machined, request, roles),
    ))
}

fn answer_here(
    machined: &Machined,
    mut request: http::Request<Body>,
    roles: Vec<String>,
) -> BoxFuture<'static, http::Response<Body>> {
    request.extensions_mut().insert(CallerRoles(roles));
    let machined = machined.clone();
    let answer = |result: Result<http::Response<Body>, Infallible>| match result {
        Ok(response) => response,
        Err(never) => match never {},
    };
    if request.uri().path().starts_with("/cosi.resource.State/") {
        return Box::pin(crate::cosi::server(machined).oneshot(request).map(answer));
    }
    if request.uri().path().starts_with("/machine.ImageService/") {
        return Box::pin(
            ImageServiceServer::new(machined)
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .oneshot(request)
                .map(answer),
        );
    }
    if request
        .uri()
        .path()
        .starts_with("/machine.LifecycleService/")
    {
        return Box::pin(
            LifecycleServiceServer::new(machined)
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .oneshot(request)
                .map(answer),
        );
    }
    if request.uri().path().starts_with("/cluster.ClusterService/") {
        Box::pin(
            ClusterServiceServer::new(machined)
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .oneshot(request)
                .map(answer),
        )
    } else {
        Box::pin(
            MachineServiceServer::new(machined)
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE)
                .oneshot(request)
                .map(answer),
        )
    }
}

/// Marks a request as forwarded by this apid, with the caller's roles, as
/// upstream's backend.APID.GetConnection does.
fn prepare_forward(machined: &Machined, request: &mut http::Request<Body>, roles: &[String]) {
    let headers = request.headers_mut();
    headers.remove(NODE);
    headers.remove(NODES);
    headers.remove(ROLE_KEY);
    if let Ok(from) = http::HeaderValue::from_str(&machined.node.ip.to_string()) {
        headers.insert(PROXY_FROM, from);
    }
    for role in roles {
        if let Ok(value) = http::HeaderValue::from_str(role) {
            headers.append(ROLE_KEY, value);
        }
    }
    let caller = request
        .extensions()
        .get::<Caller>()
        .and_then(Caller::to_header);
    let headers = request.headers_mut();
    headers.remove(CALLER_KEY);
    if let Some(caller) = caller {
        headers.insert(CALLER_KEY, caller);
    }
}

/// Sends a request to another node's apid and returns its answer as is.
/// Boxed, as [`local`] is.
fn forward<'a>(
    machined: &'a Machined,
    target: &'a str,
    request: http::Request<Body>,
) -> BoxFuture<'a, Result<http::Response<Body>, Status>> {
    Box::pin(async move {
        let channel = machined.shared.backend(target).await?;
        channel
            .oneshot(request)
            .await
            .map_err(|e| crate::dial::connection_error(&crate::dial::innermost(&e)))
    })
}

/// Sends a unary call to another node's apid. A node of this simulator
/// whose API is up with the cluster's certificate (not a node in
/// maintenance mode, whose certificate the proxy refuses) gets it straight
/// at its front, as if it had come over the proxy identity's connection, without the TLS and HTTP/2 hop (the
/// answer is the same; the hop only costs CPU, which 50 nodes on 2 cores
/// cannot spare). Should the node go down before it answers, the call fails
/// as grpc-go's does when the connection breaks mid-call: Unavailable,
/// `error reading from server: EOF`. Any other target goes over the network.
fn forward_unary<'a>(
    machined: &'a Machined,
    target: &'a str,
    mut request: http::Request<Body>,
) -> BoxFuture<'a, Result<http::Response<Body>, Status>> {
    // Boxed, and `Send` by its signature: the peer's `route` may forward
    // again, so this future contains itself.
    Box::pin(async move {
        let Some((peer, up)) = machined
            .shared
            .find(target)
            .and_then(|peer| peer.cluster_front().map(|up| (peer, up)))
        else {
            if let Some(node) = machined.shared.find(target)
                && node.is_partitioned()
            {
                node.note_unanswered();
            }
            return forward(machined, target, request).await;
        };
        request
            .extensions_mut()
            .insert(machined.shared.proxy_peer.clone());
        let peer = Machined {
            node: peer,
            shared: machined.shared.clone(),
        };
        tokio::select! {
            answer = route(peer, request) => Ok(answer),
            () = up.cancelled() => Err(Status::unavailable("error reading from server: EOF")),
        }
    })
}

/// Refuses a target apid cannot dial, failing the whole call as upstream's
/// director does when its backend factory refuses one (director.go; the
/// rule is backend.NewAPID's in internal/app/apid/pkg/backend/apid.go):
/// Internal `invalid target "..."` for an empty target or one with a port.
fn check_target(target: &str) -> Result<(), Status> {
    if target.is_empty() || go_errors::contains_port(target) {
        return Err(Status::internal(format!(
            "invalid target {}",
            go_errors::quote(target)
        )));
    }
    Ok(())
}

async fn one_to_many(
    machined: &Machined,
    request: http::Request<Body>,
    targets: Vec<String>,
    roles: Vec<String>,
) -> http::Response<Body> {
    let path = request.uri().path().to_string();
    if !(path.starts_with("/machine.MachineService/")
        || path.starts_with("/cluster.ClusterService/"))
    {
        return Status::invalid_argument(format!(
            "one-2-many proxying is not supported for method {path}"
        ))
        .into_http();
    }
    if let Err(status) = targets.iter().try_for_each(|t| check_target(t)) {
        return status.into_http();
    }
    let kind = proxy::method_kind(&path);
    if kind == MethodKind::ClientStreaming {
        return Status::unimplemented(format!(
            "one-2-many proxying of client streams is not supported for method {path}"
        ))
        .into_http();
    }
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Status::new(Code::Internal, e.to_string()).into_http(),
    };
    let copy_for = |target: &str| {
        let mut request =
            http::Request::from_parts(parts.clone(), Body::new(Full::new(body.clone())));
        *request.extensions_mut() = http::Extensions::new();
        if let Some(caller) = parts.extensions.get::<Caller>() {
            request.extensions_mut().insert(caller.clone());
        }
        prepare_forward(machined, &mut request, &roles);
        (target.to_string(), request)
    };
    let requests: Vec<_> = targets.iter().map(|t| copy_for(t)).collect();
    match kind {
        MethodKind::ServerStreaming => {
            let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
            for (target, request) in requests {
                let machined = machined.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let response = forward(&machined, &target, request).await;
                    proxy::pump_stream(target, response, tx).await;
                });
            }
            drop(tx);
            proxy::grpc_response(tokio_stream::wrappers::ReceiverStream::new(rx))
        }
        _ => {
            // One task per target, as apid runs one goroutine per backend:
            // the calls spread over the runtime's threads.
            let calls = requests.into_iter().map(|(target, request)| {
                let machined = machined.clone();
                tokio::spawn(async move {
                    let outcome = match forward_unary(&machined, &target, request).await {
                        Ok(response) => proxy::read_unary(response).await,
                        Err(status) => Err(status),
                    };
                    proxy::unary_part(&target, outcome)
                })
            });
            let parts = futures::future::join_all(calls).await;
            let merged: Vec<u8> = parts
                .into_iter()
                .map(|part| part.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())))
                .collect::<Vec<_>>()
                .concat();
            proxy::grpc_response(futures::stream::once(async move { proxy::frame(&merged) }))
        }
    }
}

/// The front services for one node, sharing its machined.
pub(crate) struct Services {
    pub machine: Front<MachineName>,
    pub cluster: Front<ClusterName>,
    pub image: Front<ImageName>,
    pub lifecycle: Front<LifecycleName>,
    pub storage: Front<StorageName>,
    pub time: Front<TimeName>,
    pub inspect: Front<InspectName>,
    pub debug: Front<DebugName>,
}

/// The front services for one node, sharing its machined.
pub(crate) fn services(machined: Machined) -> Services {
    Services {
        machine: Front::new(machined.clone()),
        cluster: Front::new(machined.clone()),
        image: Front::new(machined.clone()),
        lifecycle: Front::new(machined.clone()),
        storage: Front::new(machined.clone()),
        time: Front::new(machined.clone()),
        inspect: Front::new(machined.clone()),
        debug: Front::new(machined),
    }
}
