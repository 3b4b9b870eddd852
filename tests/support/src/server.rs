//! An in-process Talos API server for client tests: real mutual TLS on
//! 127.0.0.1:0 with certificates made at test time, and a MachineService
//! whose answers the tests control and whose received metadata they inspect.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use talos_client::api::{common, google, machine};
use talos_client::tls::Credentials;
use talos_sim::api::server::machine::machine_service_server::{
    MachineService, MachineServiceServer,
};
use talos_sim::pki::{Ca, CertAndKey, LeafSpec};
use talos_sim::serve::{peer_roles, tls_incoming};
use tonic::{Request, Response, Status};

/// A CA with a server certificate for 127.0.0.1 and admin and reader client
/// certificates.
pub struct TestPki {
    pub ca: Ca,
    pub server: CertAndKey,
    pub admin: CertAndKey,
    pub reader: CertAndKey,
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}

impl TestPki {
    pub fn new() -> TestPki {
        let ca = Ca::generate().expect("CA");
        let server = ca
            .issue(&LeafSpec::server(
                &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
                &["localhost"],
            ))
            .expect("server certificate");
        let admin = ca.issue(&LeafSpec::client(&["os:admin"])).expect("admin");
        let reader = ca.issue(&LeafSpec::client(&["os:reader"])).expect("reader");
        TestPki {
            ca,
            server,
            admin,
            reader,
        }
    }

    pub fn server_credentials(&self) -> Credentials {
        Credentials::from_pem(
            self.ca.cert_pem.as_bytes(),
            self.server.cert_pem.as_bytes(),
            self.server.key_pem.as_bytes(),
        )
    }

    pub fn client_credentials(&self, identity: &CertAndKey) -> Credentials {
        Credentials::from_pem(
            self.ca.cert_pem.as_bytes(),
            identity.cert_pem.as_bytes(),
            identity.key_pem.as_bytes(),
        )
    }
}

/// What the server saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: &'static str,
    pub node: Option<String>,
    pub nodes: Vec<String>,
}

/// Shared, inspectable server state.
#[derive(Default)]
pub struct State {
    pub seen: Mutex<Vec<Seen>>,
    /// How many upcoming member-list calls fail with Unavailable.
    pub member_list_failures: AtomicU32,
    /// How many upcoming leave calls fail with Unavailable.
    pub leave_failures: AtomicU32,
    pub leave_calls: AtomicU32,
    pub member_list_calls: AtomicU32,
    /// Bytes the snapshot stream sends.
    pub snapshot_size: Mutex<u64>,
    /// When set, the snapshot stream sends this file's bytes instead.
    pub snapshot_file: Mutex<Option<std::path::PathBuf>>,
    /// Bytes and sha256 received by EtcdRecover.
    pub recovered: Mutex<Option<(u64, String)>>,
}

pub struct TestService {
    pub hostname: String,
    pub state: Arc<State>,
}

fn md_value<T>(request: &Request<T>, key: &str) -> Option<String> {
    request
        .metadata()
        .get(key)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

impl TestService {
    fn record<T>(&self, method: &'static str, request: &Request<T>) -> Seen {
        let seen = Seen {
            method,
            node: md_value(request, "node"),
            nodes: request
                .metadata()
                .get_all("nodes")
                .iter()
                .filter_map(|v| v.to_str().ok().map(str::to_string))
                .collect(),
        };
        self.state.seen.lock().unwrap().push(seen.clone());
        seen
    }
}

/// Snapshot chunk size used by Talos.
pub const CHUNK: usize = 1024;

/// A file's bytes in `CHUNK`-sized messages, read as the transport asks.
fn file_chunks(path: std::path::PathBuf) -> impl Stream<Item = Result<common::Data, Status>> {
    use std::io::Read as _;
    let file = std::fs::File::open(&path).expect("the snapshot file to serve");
    futures::stream::unfold(file, |mut file| async move {
        let mut buf = vec![0u8; CHUNK];
        let n = file.read(&mut buf).expect("read the snapshot file");
        (n > 0).then(|| {
            buf.truncate(n);
            let data = common::Data {
                metadata: None,
                bytes: Bytes::from(buf),
            };
            (Ok(data), file)
        })
    })
}

/// The deterministic byte at `offset` of the test snapshot.
pub fn snapshot_byte(offset: u64) -> u8 {
    (offset.wrapping_mul(2_654_435_761) >> 13) as u8
}

type DataStream = Pin<Box<dyn Stream<Item = Result<common::Data, Status>> + Send>>;

#[tonic::async_trait]
impl MachineService for TestService {
    async fn version(
        &self,
        request: Request<()>,
    ) -> Result<Response<machine::VersionResponse>, Status> {
        let seen = self.record("Version", &request);
        Ok(Response::new(machine::VersionResponse {
            messages: vec![machine::Version {
                metadata: None,
                version: Some(machine::VersionInfo {
                    tag: "v1.13.9".into(),
                    sha: "abc".into(),
                    os: "linux".into(),
                    arch: "amd64".into(),
                    ..Default::default()
                }),
                platform: Some(machine::PlatformInfo {
                    name: self.hostname.clone(),
                    mode: seen.node.unwrap_or_default(),
                }),
                features: Some(machine::FeaturesInfo { rbac: true }),
            }],
        }))
    }

    async fn hostname(
        &self,
        request: Request<()>,
    ) -> Result<Response<machine::HostnameResponse>, Status> {
        self.record("Hostname", &request);
        Ok(Response::new(machine::HostnameResponse {
            messages: vec![machine::Hostname {
                metadata: None,
                hostname: self.hostname.clone(),
            }],
        }))
    }

    /// Answers like apid: with `nodes` metadata, one message per node, and a
    /// node named `down` contributes a message carrying only an error.
    async fn etcd_member_list(
        &self,
        request: Request<machine::EtcdMemberListRequest>,
    ) -> Result<Response<machine::EtcdMemberListResponse>, Status> {
        let seen = self.record("EtcdMemberList", &request);
        self.state.member_list_calls.fetch_add(1, Ordering::SeqCst);
        if self
            .state
            .member_list_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Status::unavailable("etcd is restarting"));
        }
        let member = |node: &str| machine::EtcdMembers {
            metadata: Some(common::Metadata {
                hostname: node.to_string(),
                ..Default::default()
            }),
            legacy_members: vec![],
            members: vec![machine::EtcdMember {
                id: 0xabcdef0123456789,
                hostname: format!("member-of-{node}"),
                peer_urls: vec!["https://127.0.0.1:2380".into()],
                client_urls: vec!["https://127.0.0.1:2379".into()],
                is_learner: request.get_ref().query_local,
            }],
        };
        let messages = if seen.nodes.is_empty() {
            let mut m = member("");
            m.metadata = None;
            vec![m]
        } else {
            seen.nodes
                .iter()
                .map(|node| {
                    if node == "down" {
                        machine::EtcdMembers {
                            metadata: Some(common::Metadata {
                                hostname: node.clone(),
                                error: "rpc error: code = Unavailable desc = connection refused"
                                    .into(),
                                status: Some(google::rpc::Status {
                                    code: tonic::Code::Unavailable as i32,
                                    message: "connection refused".into(),
                                    details: vec![],
                                }),
                            }),
                            ..Default::default()
                        }
                    } else {
                        member(node)
                    }
                })
                .collect()
        };
        Ok(Response::new(machine::EtcdMemberListResponse { messages }))
    }

    async fn etcd_leave_cluster(
        &self,
        request: Request<machine::EtcdLeaveClusterRequest>,
    ) -> Result<Response<machine::EtcdLeaveClusterResponse>, Status> {
        self.record("EtcdLeaveCluster", &request);
        if !peer_roles(&request).iter().any(|r| r == "os:admin") {
            return Err(Status::permission_denied("not authorized"));
        }
        self.state.leave_calls.fetch_add(1, Ordering::SeqCst);
        if self
            .state
            .leave_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Status::unavailable("etcd is restarting"));
        }
        Ok(Response::new(machine::EtcdLeaveClusterResponse {
            messages: vec![machine::EtcdLeaveCluster { metadata: None }],
        }))
    }

    async fn etcd_remove_member_by_id(
        &self,
        request: Request<machine::EtcdRemoveMemberByIdRequest>,
    ) -> Result<Response<machine::EtcdRemoveMemberByIdResponse>, Status> {
        self.record("EtcdRemoveMemberByID", &request);
        Err(Status::not_found(format!(
            "member {:016x} not found",
            request.get_ref().member_id
        )))
    }

    async fn etcd_snapshot(
        &self,
        request: Request<machine::EtcdSnapshotRequest>,
    ) -> Result<Response<DataStream>, Status> {
        self.record("EtcdSnapshot", &request);
        if let Some(path) = self.state.snapshot_file.lock().unwrap().clone() {
            return Ok(Response::new(Box::pin(file_chunks(path))));
        }
        let size = *self.state.snapshot_size.lock().unwrap();
        // Chunks are produced lazily, as the transport asks for them.
        let chunks = futures::stream::unfold(0u64, move |offset| async move {
            if offset >= size {
                return None;
            }
            let len = (size - offset).min(CHUNK as u64);
            let bytes: Vec<u8> = (offset..offset + len).map(snapshot_byte).collect();
            let data = common::Data {
                metadata: None,
                bytes: Bytes::from(bytes),
            };
            Some((Ok(data), offset + len))
        });
        Ok(Response::new(Box::pin(chunks)))
    }

    async fn etcd_recover(
        &self,
        request: Request<tonic::Streaming<common::Data>>,
    ) -> Result<Response<machine::EtcdRecoverResponse>, Status> {
        use sha2::Digest as _;
        self.record("EtcdRecover", &request);
        let mut stream = request.into_inner();
        let mut hasher = sha2::Sha256::new();
        let mut total = 0u64;
        while let Some(data) = stream.next().await {
            let data = data?;
            total += data.bytes.len() as u64;
            hasher.update(&data.bytes);
        }
        let digest = hex(&hasher.finalize());
        *self.state.recovered.lock().unwrap() = Some((total, digest));
        Ok(Response::new(machine::EtcdRecoverResponse {
            messages: vec![machine::EtcdRecover { metadata: None }],
        }))
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A running in-process server; stops when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    pub state: Arc<State>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    cut: tokio_util::sync::CancellationToken,
}

impl TestServer {
    pub async fn start(pki: &TestPki, hostname: &str) -> TestServer {
        TestServer::start_with(pki.server_credentials(), hostname).await
    }

    /// A server presenting the given server identity.
    pub async fn start_with(server: Credentials, hostname: &str) -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().unwrap();
        let config = talos_sim::tls::server_config(&server).expect("server TLS");
        let state = Arc::new(State::default());
        let service = TestService {
            hostname: hostname.to_string(),
            state: state.clone(),
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let cut = tokio_util::sync::CancellationToken::new();
        let incoming = tls_incoming(listener, config, cut.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(MachineServiceServer::new(service))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await
                .expect("server");
        });
        TestServer {
            addr,
            state,
            shutdown: Some(tx),
            cut,
        }
    }

    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// Breaks every open connection and stops listening, as a node whose
    /// network went away: a client's next request on its channel fails
    /// before any answer.
    pub fn cut(&self) {
        self.cut.cancel();
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// An address on which nothing listens (bound, then released).
pub fn dead_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr.to_string()
}
