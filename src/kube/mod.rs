//! A small Kubernetes API client, for the checks an operation makes on the
//! cluster it changes: `/readyz`, a service-account token
//! (TokenRequest), who a token authenticates as (SelfSubjectReview), the
//! nodes, and a Lease renewed as a leader-elected controller renews it
//! ([`LeaseRenewer`]).
//!
//! Why not kube-rs: these five requests are all an operation needs, and
//! kube-rs would bring k8s-openapi (all of Kubernetes' types, a long
//! build), a second HTTP stack configuration and its own kubeconfig
//! loader. This client is HTTP/1.1 over the hyper and rustls the crate
//! already links, with JSON read into `serde_json` values. One connection
//! is kept alive and reused, as client-go keeps its connection, so a
//! client behind a TCP balancer stays on the API server it reached (which
//! is what makes a renewal through KubePrism fail when that server has
//! lost its etcd).
//!
//! Credentials come from a kubeconfig held in memory
//! ([`KubeConfig::from_yaml`], e.g. the one a node serves through
//! [`Client::kubeconfig`](crate::Client::kubeconfig)); nothing is written
//! to disk.

mod config;
mod election;
mod lease;

pub use config::KubeConfig;
pub use election::{Confirmed, ElectionError, ElectionOptions, HeldLease, LeaseState};
pub use lease::{LeaseRenewer, LeaseRenewerOptions, RenewalStats};

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio_rustls::TlsConnector;

use config::Auth;

/// What went wrong talking to a Kubernetes API server; each names it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubeError {
    /// The kubeconfig cannot be used.
    #[error("kubeconfig: {reason}")]
    Config {
        /// What is wrong with it.
        reason: String,
    },
    /// Its CA, certificate or key cannot be used.
    #[error("kubeconfig: {0}")]
    Tls(#[from] crate::tls::TlsError),
    /// Nothing listens there (connection refused): no API server.
    #[error("{server}: connection refused: no API server listens there")]
    Refused {
        /// The server.
        server: String,
    },
    /// No connection (unreachable, reset, TLS failure).
    #[error("{server}: {reason}")]
    Connect {
        /// The server.
        server: String,
        /// Why.
        reason: String,
    },
    /// No answer in time.
    #[error("{server}: no answer to {what} within {:.1} s", .timeout.as_secs_f64())]
    Timeout {
        /// The server.
        server: String,
        /// The request.
        what: String,
        /// How long it waited.
        timeout: Duration,
    },
    /// The credentials were not accepted (HTTP 401).
    #[error("{server}: {what}: 401 Unauthorized: the credentials were not accepted")]
    Unauthorized {
        /// The server.
        server: String,
        /// The request.
        what: String,
    },
    /// Any other answer than the one expected.
    #[error("{server}: {what}: {status}: {message}")]
    Status {
        /// The server.
        server: String,
        /// The request.
        what: String,
        /// The HTTP status.
        status: u16,
        /// The server's message (its `Status` object's, or the body).
        message: String,
    },
    /// An answer that does not say what it should.
    #[error("{server}: {what}: unexpected answer: {reason}")]
    Protocol {
        /// The server.
        server: String,
        /// The request.
        what: String,
        /// What is missing or wrong.
        reason: String,
    },
}

impl KubeError {
    /// The HTTP status of an answer that was not the one expected.
    pub fn status(&self) -> Option<u16> {
        match self {
            KubeError::Unauthorized { .. } => Some(401),
            KubeError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A Kubernetes API client for one server, keeping one connection alive.
pub struct KubeClient {
    server: String,
    authority: String,
    host: String,
    port: u16,
    server_name: ServerName<'static>,
    tls: TlsConnector,
    authorization: Option<String>,
    timeout: Duration,
    connection: Mutex<Option<SendRequest<Full<Bytes>>>>,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("server", &self.server)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What `/readyz` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readyz {
    /// HTTP status.
    pub status: u16,
    /// The body (`ok`, or the failing checks).
    pub body: String,
}

impl Readyz {
    /// Whether the server is ready.
    pub fn is_ready(&self) -> bool {
        self.status == 200
    }
}

/// A node as the API lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KubeNode {
    /// `metadata.name`.
    pub name: String,
    /// Its `Ready` condition is `True`.
    pub ready: bool,
    /// It carries the `node-role.kubernetes.io/control-plane` label.
    pub control_plane: bool,
    /// Its InternalIP addresses.
    pub addresses: Vec<String>,
}

impl KubeClient {
    /// How long a request may take unless told otherwise.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

    /// A client for `config`'s server and credentials.
    pub fn new(config: &KubeConfig) -> Result<KubeClient, KubeError> {
        let url: http::Uri = config.server.parse().map_err(|e| KubeError::Config {
            reason: format!("server {:?} is not a URL: {e}", config.server),
        })?;
        if url.scheme_str() != Some("https") {
            return Err(KubeError::Config {
                reason: format!("server {:?} is not https", config.server),
            });
        }
        let host = url
            .host()
            .ok_or_else(|| KubeError::Config {
                reason: format!("server {:?} has no host", config.server),
            })?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = url.port_u16().unwrap_or(443);
        let name = config
            .tls_server_name
            .clone()
            .unwrap_or_else(|| host.clone());
        let server_name = ServerName::try_from(name.clone()).map_err(|_| KubeError::Config {
            reason: format!("{name:?} is not a server name"),
        })?;
        let (client, authorization) = match &config.auth {
            Auth::Certificate { crt_pem, key_pem } => {
                (Some((crt_pem.as_slice(), key_pem.as_slice())), None)
            }
            Auth::Bearer(token) => (None, Some(format!("Bearer {token}"))),
            Auth::Anonymous => (None, None),
        };
        let tls = crate::tls::http1_client_config(&config.ca_pem, client)?;
        Ok(KubeClient {
            server: config.server.clone(),
            authority: url
                .authority()
                .map(|a| a.to_string())
                .unwrap_or_else(|| host.clone()),
            host,
            port,
            server_name,
            tls: TlsConnector::from(tls),
            authorization,
            timeout: Self::DEFAULT_TIMEOUT,
            connection: Mutex::new(None),
        })
    }

    /// The same client with another per-request timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> KubeClient {
        self.timeout = timeout;
        self
    }

    /// The server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, Failed> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::ConnectionRefused => Failed::Refused,
                _ => Failed::Other(format!("cannot connect: {e}")),
            })?;
        let _ = tcp.set_nodelay(true);
        let tls = self
            .tls
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| {
                Failed::Other(match crate::tls::describe_tls_cause(&e) {
                    Some(why) => format!("TLS handshake failed: {why}"),
                    None => format!("TLS handshake failed: {e}"),
                })
            })?;
        let (send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| Failed::Other(format!("HTTP handshake failed: {e}")))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(send)
    }

    /// One request on the kept connection (made when there is none or it
    /// closed); any failure drops the connection, so the next request
    /// dials again.
    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Bytes), KubeError> {
        let what = format!("{method} {path}");
        match tokio::time::timeout(self.timeout, self.request_once(method, path, body)).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(Failed::Refused)) => {
                *self.connection.lock().await = None;
                Err(KubeError::Refused {
                    server: self.server.clone(),
                })
            }
            Ok(Err(Failed::Other(reason))) => {
                *self.connection.lock().await = None;
                Err(KubeError::Connect {
                    server: self.server.clone(),
                    reason: format!("{what}: {reason}"),
                })
            }
            Err(_) => {
                // The request may still be on the connection: it is not
                // reused.
                *self.connection.lock().await = None;
                Err(KubeError::Timeout {
                    server: self.server.clone(),
                    what,
                    timeout: self.timeout,
                })
            }
        }
    }

    async fn request_once(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Bytes), Failed> {
        let mut slot = self.connection.lock().await;
        let mut send = match slot.take() {
            Some(send) if !send.is_closed() => send,
            _ => self.connect().await?,
        };
        send.ready()
            .await
            .map_err(|e| Failed::Other(format!("connection lost: {e}")))?;
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.authority)
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, "talos-client");
        if let Some(authorization) = &self.authorization {
            request = request.header(header::AUTHORIZATION, authorization);
        }
        let payload = match body {
            Some(value) => {
                request = request.header(header::CONTENT_TYPE, "application/json");
                Bytes::from(value.to_string())
            }
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(payload))
            .map_err(|e| Failed::Other(format!("bad request: {e}")))?;
        let response = send
            .send_request(request)
            .await
            .map_err(|e| Failed::Other(format!("no answer: {e}")))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| Failed::Other(format!("answer cut short: {e}")))?
            .to_bytes();
        *slot = Some(send);
        Ok((status, body))
    }

    /// A JSON request expecting one of `ok` statuses.
    async fn json(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        ok: &[u16],
    ) -> Result<Value, KubeError> {
        let what = format!("{method} {path}");
        let (status, bytes) = self.request(method, path, body).await?;
        if status == StatusCode::UNAUTHORIZED {
            return Err(KubeError::Unauthorized {
                server: self.server.clone(),
                what,
            });
        }
        if !ok.contains(&status.as_u16()) {
            let text = String::from_utf8_lossy(&bytes);
            let message = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| text.trim().chars().take(300).collect());
            return Err(KubeError::Status {
                server: self.server.clone(),
                what,
                status: status.as_u16(),
                message,
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| KubeError::Protocol {
            server: self.server.clone(),
            what,
            reason: format!("not JSON: {e}"),
        })
    }

    fn protocol(&self, what: &str, reason: &str) -> KubeError {
        KubeError::Protocol {
            server: self.server.clone(),
            what: what.to_string(),
            reason: reason.to_string(),
        }
    }

    /// `GET /readyz`: any HTTP answer is returned (a not-ready server
    /// answers 500 with the failing checks); no answer is an error.
    pub async fn readyz(&self) -> Result<Readyz, KubeError> {
        let (status, body) = self.request(Method::GET, "/readyz", None).await?;
        Ok(Readyz {
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body).trim().to_string(),
        })
    }

    /// When the API server's process started, in seconds since the epoch
    /// (`process_start_time_seconds` of its `/metrics`, which the admin
    /// may read): a restart shows as a later start.
    pub async fn process_start_time(&self) -> Result<f64, KubeError> {
        const METRIC: &str = "process_start_time_seconds";
        let what = "GET /metrics";
        let (status, body) = self.request(Method::GET, "/metrics", None).await?;
        match status.as_u16() {
            200 => {}
            401 => {
                return Err(KubeError::Unauthorized {
                    server: self.server.clone(),
                    what: what.into(),
                });
            }
            other => {
                return Err(KubeError::Status {
                    server: self.server.clone(),
                    what: what.into(),
                    status: other,
                    message: String::from_utf8_lossy(&body).chars().take(300).collect(),
                });
            }
        }
        String::from_utf8_lossy(&body)
            .lines()
            .find_map(|line| {
                let value = line.strip_prefix(METRIC)?.strip_prefix(' ')?;
                value.trim().parse::<f64>().ok()
            })
            .ok_or_else(|| self.protocol(what, &format!("no {METRIC}")))
    }

    /// A token for the service account `namespace/name` (TokenRequest),
    /// valid `expiration` (the API server's minimum is 10 minutes), for the
    /// API server's own audiences.
    pub async fn token_request(
        &self,
        namespace: &str,
        name: &str,
        expiration: Duration,
    ) -> Result<String, KubeError> {
        let path = format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token");
        let body = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": expiration.as_secs()},
        });
        let answer = self
            .json(Method::POST, &path, Some(&body), &[200, 201])
            .await?;
        answer["status"]["token"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| self.protocol(&format!("POST {path}"), "no status.token"))
    }

    /// Who this client's credentials authenticate as (SelfSubjectReview):
    /// the user name. A rejected token is [`KubeError::Unauthorized`].
    pub async fn self_subject_review(&self) -> Result<String, KubeError> {
        let path = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
        let body = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "SelfSubjectReview",
        });
        let answer = self
            .json(Method::POST, path, Some(&body), &[200, 201])
            .await?;
        answer["status"]["userInfo"]["username"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| self.protocol(&format!("POST {path}"), "no status.userInfo.username"))
    }

    /// The nodes the API knows.
    pub async fn nodes(&self) -> Result<Vec<KubeNode>, KubeError> {
        let answer = self
            .json(Method::GET, "/api/v1/nodes", None, &[200])
            .await?;
        let items = answer["items"]
            .as_array()
            .ok_or_else(|| self.protocol("GET /api/v1/nodes", "no items"))?;
        Ok(items.iter().map(node_of).collect())
    }

    /// A JSON GET (for what the typed calls do not cover).
    pub async fn get(&self, path: &str) -> Result<Value, KubeError> {
        self.json(Method::GET, path, None, &[200]).await
    }

    /// A JSON POST expecting 200 or 201.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, KubeError> {
        self.json(Method::POST, path, Some(body), &[200, 201]).await
    }

    /// A JSON PUT expecting 200 or 201.
    pub async fn put(&self, path: &str, body: &Value) -> Result<Value, KubeError> {
        self.json(Method::PUT, path, Some(body), &[200, 201]).await
    }

    /// A DELETE expecting 200 or 202 (404: already gone, also fine).
    pub async fn delete(&self, path: &str) -> Result<(), KubeError> {
        match self.json(Method::DELETE, path, None, &[200, 202]).await {
            Ok(_) => Ok(()),
            Err(e) if e.status() == Some(404) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Why a request got no answer.
enum Failed {
    /// The connection was refused.
    Refused,
    /// Anything else, in words.
    Other(String),
}

fn node_of(item: &Value) -> KubeNode {
    let ready = item["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    let control_plane = item["metadata"]["labels"]
        .get("node-role.kubernetes.io/control-plane")
        .is_some();
    let addresses = item["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["type"] == "InternalIP")
        .filter_map(|a| a["address"].as_str().map(str::to_string))
        .collect();
    KubeNode {
        name: item["metadata"]["name"].as_str().unwrap_or("").to_string(),
        ready,
        control_plane,
        addresses,
    }
}
