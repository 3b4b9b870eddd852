//! The typed Talos API client.
//!
//! A [`Client`] holds the endpoints, TLS identity and connection; clones are
//! cheap and share the connection. Targeting decides which node answers and
//! what a call returns:
//!
//! | client                         | gRPC metadata        | each call returns            |
//! |--------------------------------|----------------------|------------------------------|
//! | `client` (as built)            | none: endpoint node  | `Result<T>`                  |
//! | `client.node("10.0.0.2")`      | `node: 10.0.0.2`     | `Result<T>`                  |
//! | `client.nodes(["a", "b"])`     | `node` per call      | `Result<NodeResults<T>>`     |
//! | `client.aggregate(["a", "b"])` | `nodes: a, b` (apid) | `Result<NodeResults<T>>`     |
//!
//! `nodes` fans out on the client side, one concurrent call per node, like
//! talosctl 1.14. `aggregate` asks apid to fan out (the older style) and
//! decodes its concatenated answer; a node that failed there shows up as that
//! node's error, not as a failed call.
//!
//! Reads that are safe to repeat (member list, status, version, ...) are
//! retried on `Unavailable`, failing over to the next endpoint. Calls that
//! change state (leave, remove-member, forfeit, reset, apply-config, reboot,
//! ...) are never retried.

mod apply_reset;
mod client_config;
mod data_stream;
mod error;
mod etcd;
mod kubeconfig;
mod node_streams;
mod read;
mod reply;
pub mod resources;
mod resources_specs;
mod services;
mod system;
pub(crate) mod transport;
mod upgrade;

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

pub use apply_reset::{
    ApplyMode, ApplyRequest, ApplyResult, RebootMode, ResetRequest, UnknownVariant, WipeMode,
};
pub use client_config::GeneratedConfig;
pub use error::{ConnectAttempt, Error, Failure};
pub use etcd::{AlarmType, ByteStream, EtcdMember, EtcdMemberStatus, MemberAlarm, MemberId};
pub use node_streams::{
    Event, EventPayload, EventStream, EventsRequest, LogsRequest, NodeDataStream,
};
pub use reply::{NodeResult, NodeResults};
pub use services::{ContainerInfo, ContainerNamespace, DowngradeAction, ImageInfo, ServiceAction};
pub use system::{HealthCheckRequest, ServiceEvent, ServiceHealth, ServiceInfo, VersionInfo};
pub use upgrade::{
    ImageNamespace, InstallProgress, PullProgress, TalosVersion, UpgradeAck, UpgradePath,
    UpgradeRequest, VersionParseError, upgrade_path,
};

use crate::api::cluster::cluster_service_client::ClusterServiceClient;
use crate::api::machine::machine_service_client::MachineServiceClient;
use crate::config::{ResolvedContext, normalize_endpoint};
use crate::tls::Credentials;
use reply::Messages;
use transport::{Connection, Settings};

/// Result of a client call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Largest message the client accepts or sends, as apid (32 MiB).
pub const MAX_MESSAGE_SIZE: usize = 32 * 1024 * 1024;

/// Which nodes a [`Client`] addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The node behind the endpoint answers.
    Endpoint,
    /// One node, by `node` metadata.
    Node(String),
    /// Several nodes, one call each, concurrently.
    FanOut(Vec<String>),
    /// Several nodes in one call, by `nodes` metadata (apid fans out).
    Aggregate(Vec<String>),
}

mod sealed {
    pub trait Sealed {}
}

/// How many answers a call returns: [`One`] or [`Many`].
pub trait Scope: sealed::Sealed + Send + Sync + 'static {
    /// What a call returns for a success value `T`.
    type Output<T: Send>: Send;
    #[doc(hidden)]
    fn finish<T: Send>(replies: NodeResults<T>) -> Result<Self::Output<T>>;
}

/// A client scope that expects one answer: calls return `Result<T>`.
#[derive(Debug, Clone, Copy)]
pub struct One;

/// A client scope that expects one answer per node: calls return
/// `Result<NodeResults<T>>`, where each node has its own result.
#[derive(Debug, Clone, Copy)]
pub struct Many;

impl sealed::Sealed for One {}
impl sealed::Sealed for Many {}

impl Scope for One {
    type Output<T: Send> = T;

    fn finish<T: Send>(mut replies: NodeResults<T>) -> Result<T> {
        match replies.len() {
            1 => replies.pop().expect("one reply").result,
            0 => Err(Error::protocol(None, "the server sent no response message")),
            n => Err(Error::protocol(
                None,
                format!("expected one response message, got {n} (use a multi-node client)"),
            )),
        }
    }
}

impl Scope for Many {
    type Output<T: Send> = NodeResults<T>;

    fn finish<T: Send>(replies: NodeResults<T>) -> Result<NodeResults<T>> {
        Ok(replies)
    }
}

/// A Talos API client. See the [module docs](self) for targeting.
pub struct Client<S: Scope = One> {
    conn: Arc<Connection>,
    options: Arc<CallOptions>,
    target: Target,
    _scope: PhantomData<S>,
}

impl<S: Scope> Clone for Client<S> {
    fn clone(&self) -> Self {
        Client {
            conn: self.conn.clone(),
            options: self.options.clone(),
            target: self.target.clone(),
            _scope: PhantomData,
        }
    }
}

impl<S: Scope> std::fmt::Debug for Client<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct CallOptions {
    call_timeout: Duration,
    read_attempts: u32,
}

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    endpoints: Vec<String>,
    credentials: Option<Credentials>,
    origin: String,
    settings: Settings,
    call_timeout: Duration,
    read_attempts: u32,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            endpoints: Vec::new(),
            credentials: None,
            origin: "client credentials".to_string(),
            settings: Settings {
                connect_timeout: Duration::from_secs(10),
                keepalive_interval: Duration::from_secs(30),
                keepalive_timeout: Duration::from_secs(20),
            },
            call_timeout: Duration::from_secs(60),
            read_attempts: 3,
        }
    }
}

impl ClientBuilder {
    /// apid endpoints, tried in order (`host`, `host:port`, `https://host`).
    pub fn endpoints<I, E>(mut self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = E>,
        E: Into<String>,
    {
        self.endpoints = endpoints.into_iter().map(Into::into).collect();
        self
    }

    /// The CA, client certificate and key.
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Time allowed for TCP connect plus TLS handshake per endpoint (default 10s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// Deadline of each unary call (default 60s). Streams are not limited;
    /// HTTP/2 keepalive detects a dead peer.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// HTTP/2 keepalive ping interval and ack timeout (default 30s, 20s).
    pub fn keepalive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.settings.keepalive_interval = interval;
        self.settings.keepalive_timeout = timeout;
        self
    }

    /// How many times an idempotent read is attempted when the server is
    /// unavailable (default 3; 1 disables retries).
    pub fn read_attempts(mut self, attempts: u32) -> Self {
        self.read_attempts = attempts.max(1);
        self
    }

    /// Validates the endpoints and TLS material. Connecting happens on the
    /// first call.
    pub fn build(self) -> Result<Client> {
        let credentials = self
            .credentials
            .clone()
            .ok_or(Error::Builder("no credentials given"))?;
        let tls = credentials.client_config().map_err(|source| Error::Tls {
            origin: self.origin.clone(),
            source: Box::new(source),
        })?;
        self.build_with_tls(tls)
    }

    /// Builds with a TLS configuration made elsewhere (maintenance mode).
    pub(crate) fn build_with_tls(self, tls: Arc<rustls::ClientConfig>) -> Result<Client> {
        if self.endpoints.is_empty() {
            return Err(Error::Builder("no endpoints given"));
        }
        let endpoints = self
            .endpoints
            .iter()
            .map(|e| normalize_endpoint(e))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Client {
            conn: Arc::new(Connection::new(endpoints, tls, self.settings)),
            options: Arc::new(CallOptions {
                call_timeout: self.call_timeout,
                read_attempts: self.read_attempts,
            }),
            target: Target::Endpoint,
            _scope: PhantomData,
        })
    }
}

impl Client {
    /// Starts building a client.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// A builder preset from a resolved talosconfig context (endpoints and
    /// credentials); errors name the file and context.
    pub fn builder_from_context(context: &ResolvedContext) -> ClientBuilder {
        ClientBuilder {
            endpoints: context.endpoints.clone(),
            credentials: Some(context.credentials.clone()),
            origin: format!(
                "talosconfig {} context {:?}",
                context.path.display(),
                context.name
            ),
            ..ClientBuilder::default()
        }
    }

    /// A client for a resolved talosconfig context with default settings.
    pub fn from_context(context: &ResolvedContext) -> Result<Client> {
        Client::builder_from_context(context).build()
    }

    /// Connects as talosctl does without flags: the talosconfig found by the
    /// default lookup ([`default_paths`](crate::config::default_paths):
    /// `$TALOSCONFIG`, `$TALOS_HOME/config`, `~/.talos/config`, the in-pod
    /// path), its current context, default settings. Errors name the file
    /// and context at fault.
    ///
    /// ```no_run
    /// # async fn run() -> talos_client::Result<()> {
    /// let client = talos_client::Client::infer()?;
    /// println!("{}", client.version().await?.tag);
    /// # Ok(()) }
    /// ```
    pub fn infer() -> Result<Client> {
        let (config, location) = crate::config::TalosConfig::load(None)?;
        let context = config.resolve(&crate::config::Overrides::default(), &location.path)?;
        Client::from_context(&context)
    }
}

impl<S: Scope> Client<S> {
    fn retarget<T: Scope>(&self, target: Target) -> Client<T> {
        Client {
            conn: self.conn.clone(),
            options: self.options.clone(),
            target,
            _scope: PhantomData,
        }
    }

    /// The same client (connection and target) with another deadline per
    /// call. A Talos node whose etcd service is down does not fail its etcd
    /// calls: they wait for etcd until the deadline, so a caller that only
    /// looks (a preflight) wants a shorter one than the default.
    pub fn with_call_timeout(&self, timeout: Duration) -> Client<S> {
        Client {
            conn: self.conn.clone(),
            options: Arc::new(CallOptions {
                call_timeout: timeout,
                read_attempts: self.options.read_attempts,
            }),
            target: self.target.clone(),
            _scope: PhantomData,
        }
    }

    /// Addresses one node (gRPC metadata `node`), proxied by apid.
    pub fn node(&self, node: impl Into<String>) -> Client<One> {
        self.retarget(Target::Node(node.into()))
    }

    /// Addresses the node behind the endpoint (no node metadata).
    pub fn endpoint_node(&self) -> Client<One> {
        self.retarget(Target::Endpoint)
    }

    /// Addresses several nodes, one concurrent call per node.
    pub fn nodes<I, N>(&self, nodes: I) -> Client<Many>
    where
        I: IntoIterator<Item = N>,
        N: Into<String>,
    {
        self.retarget(Target::FanOut(nodes.into_iter().map(Into::into).collect()))
    }

    /// Addresses several nodes in one call through apid (`nodes` metadata).
    pub fn aggregate<I, N>(&self, nodes: I) -> Client<Many>
    where
        I: IntoIterator<Item = N>,
        N: Into<String>,
    {
        self.retarget(Target::Aggregate(
            nodes.into_iter().map(Into::into).collect(),
        ))
    }

    /// Which nodes this client addresses.
    pub fn target(&self) -> &Target {
        &self.target
    }
}

/// Whether a call may be repeated safely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Idempotency {
    /// Reads: retried on `Unavailable`.
    Read,
    /// Anything that changes state: never retried.
    Mutation,
}

/// Adds the targeting metadata (and the deadline) to every request; the one
/// place where `node`/`nodes` are set.
#[derive(Clone)]
pub struct TargetInterceptor {
    node: Option<AsciiMetadataValue>,
    nodes: Vec<AsciiMetadataValue>,
    timeout: Option<Duration>,
}

impl tonic::service::Interceptor for TargetInterceptor {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(node) = &self.node {
            request.metadata_mut().insert("node", node.clone());
        }
        for node in &self.nodes {
            request.metadata_mut().append("nodes", node.clone());
        }
        if let Some(timeout) = self.timeout {
            request.set_timeout(timeout);
        }
        Ok(request)
    }
}

/// The transport of the generated stubs: a channel whose requests carry this
/// client's targeting metadata.
pub type Transport = InterceptedService<Channel, TargetInterceptor>;

fn metadata_value(node: &str) -> Result<AsciiMetadataValue> {
    MetadataValue::try_from(node).map_err(|_| Error::Builder("node names must be printable ASCII"))
}

pub(crate) fn machine_stub(transport: Transport) -> MachineServiceClient<Transport> {
    MachineServiceClient::new(transport)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE)
}

pub(crate) fn cluster_stub(transport: Transport) -> ClusterServiceClient<Transport> {
    ClusterServiceClient::new(transport)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE)
}

impl Client<One> {
    /// The generated `machine.MachineService` stub, addressing this client's
    /// target: the escape hatch for calls and fields the typed methods do not
    /// cover. Requests get no deadline and are never retried.
    pub async fn machine_service(&self) -> Result<MachineServiceClient<Transport>> {
        let (_, transport, _) = self.transport(&self.target, None).await?;
        Ok(machine_stub(transport))
    }

    /// The transport the generated stubs use, addressing this client's
    /// target: for a call this crate has no stub for, through
    /// `tonic::client::Grpc::new(transport)`. Requests get no deadline and
    /// are never retried.
    pub async fn grpc_transport(&self) -> Result<Transport> {
        let (_, transport, _) = self.transport(&self.target, None).await?;
        Ok(transport)
    }

    /// The generated `cluster.ClusterService` stub (see
    /// [`machine_service`](Client::machine_service)).
    pub async fn cluster_service(&self) -> Result<ClusterServiceClient<Transport>> {
        let (_, transport, _) = self.transport(&self.target, None).await?;
        Ok(cluster_stub(transport))
    }
}

impl<S: Scope> Client<S> {
    /// Opens a transport for one single-target request; returns it with the
    /// endpoint index (for failover) and the node label for its answers.
    async fn transport(
        &self,
        target: &Target,
        timeout: Option<Duration>,
    ) -> Result<(usize, Transport, String)> {
        let (index, channel) = self.conn.channel().await?;
        let (node, nodes, label) = match target {
            Target::Endpoint => (None, Vec::new(), self.conn.endpoint_host(index).to_string()),
            Target::Node(n) => (Some(metadata_value(n)?), Vec::new(), n.clone()),
            Target::Aggregate(list) => (
                None,
                list.iter()
                    .map(|n| metadata_value(n))
                    .collect::<Result<_>>()?,
                String::new(),
            ),
            Target::FanOut(_) => unreachable!("fan-out is split into single-node calls"),
        };
        let interceptor = TargetInterceptor {
            node,
            nodes,
            timeout,
        };
        Ok((index, InterceptedService::new(channel, interceptor), label))
    }

    /// Runs a unary call on every addressed node and decodes the per-node
    /// messages with `convert`.
    pub(crate) async fn unary<R, T, F, Fut>(
        &self,
        idempotency: Idempotency,
        call: F,
        convert: fn(R::Item) -> Result<T>,
    ) -> Result<S::Output<T>>
    where
        R: Messages,
        T: Send,
        F: Fn(Transport) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let replies = match &self.target {
            Target::FanOut(nodes) => {
                let calls = nodes.iter().map(|node| {
                    let target = Target::Node(node.clone());
                    let call = &call;
                    async move {
                        match self.unary_once(&target, idempotency, call, convert).await {
                            Ok(replies) => replies,
                            Err(error) => vec![NodeResult {
                                node: node.clone(),
                                result: Err(error.with_node(node)),
                            }],
                        }
                    }
                });
                futures::future::join_all(calls)
                    .await
                    .into_iter()
                    .flatten()
                    .collect()
            }
            target => self.unary_once(target, idempotency, &call, convert).await?,
        };
        S::finish(replies)
    }

    async fn unary_once<R, T, F, Fut>(
        &self,
        target: &Target,
        idempotency: Idempotency,
        call: &F,
        convert: fn(R::Item) -> Result<T>,
    ) -> Result<NodeResults<T>>
    where
        R: Messages,
        F: Fn(Transport) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let attempts = match idempotency {
            Idempotency::Read => self.options.read_attempts,
            Idempotency::Mutation => 1,
        };
        let deadline = self.options.call_timeout;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (index, transport, label) = self.transport(target, Some(deadline)).await?;
            let outcome = tokio::time::timeout(deadline, call(transport)).await;
            let status = match outcome {
                Ok(Ok(response)) => {
                    return Ok(reply::decode(response.into_inner(), &label, convert));
                }
                // tonic's channel enforces the grpc-timeout it sends and
                // reports its expiry as Cancelled "Timeout expired"; it is
                // this call's deadline all the same.
                Ok(Err(status))
                    if status.code() == tonic::Code::Cancelled
                        && status.message() == tonic::TimeoutExpired(()).to_string() =>
                {
                    no_answer(deadline)
                }
                Ok(Err(status)) => status,
                Err(_) => no_answer(deadline),
            };
            let node = match target {
                Target::Node(n) => Some(n.as_str()),
                _ => None,
            };
            if status.code() == tonic::Code::Unavailable {
                self.conn.mark_failed(index).await;
                if attempt < attempts {
                    tracing::debug!(attempt, error = %status.message(), "retrying read");
                    tokio::time::sleep(Duration::from_millis(100 << attempt.min(5))).await;
                    continue;
                }
            }
            return Err(Error::from_status(&status, node));
        }
    }
}

/// The status of a call that got no answer within its deadline.
fn no_answer(deadline: Duration) -> tonic::Status {
    tonic::Status::deadline_exceeded(format!("no answer within {}s", deadline.as_secs_f64()))
}
