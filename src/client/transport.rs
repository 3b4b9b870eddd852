//! Connections to apid: TCP + rustls, HTTP/2 settings, and failover across
//! the configured endpoints.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio_rustls::client::TlsStream;
use tonic::transport::{Channel, Endpoint};

use super::error::{ConnectAttempt, Error};
use crate::config::EndpointAddr;
use crate::tls::describe_connect_error;

/// The largest HTTP/2 frame the client accepts (SETTINGS_MAX_FRAME_SIZE;
/// the protocol's default is 16 KiB). A server that sends larger DATA
/// frames when allowed (a long stream of small messages) then needs fewer
/// writes, and the client fewer reads and wake-ups. grpc-go servers, Talos
/// among them, keep to 16 KiB whatever the client allows.
pub(crate) const MAX_FRAME_SIZE: u32 = 256 * 1024;

/// Connection settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub connect_timeout: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
}

/// Shared by every clone of a client: the endpoints, the TLS configuration
/// and the channel currently in use.
pub(crate) struct Connection {
    endpoints: Vec<EndpointAddr>,
    tls: Arc<ClientConfig>,
    settings: Settings,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The endpoint index and channel in use.
    current: Option<(usize, Channel)>,
    /// Where the next connection attempt starts.
    next: usize,
}

impl Connection {
    pub(crate) fn new(
        endpoints: Vec<EndpointAddr>,
        tls: Arc<ClientConfig>,
        settings: Settings,
    ) -> Self {
        Connection {
            endpoints,
            tls,
            settings,
            state: Mutex::new(State::default()),
        }
    }

    /// The first endpoint's host, used to label answers from the default node.
    pub(crate) fn endpoint_host(&self, index: usize) -> &str {
        &self.endpoints[index].host
    }

    /// Returns the channel in use, connecting if there is none: endpoints are
    /// tried in order, starting after the last one that failed, and the first
    /// that completes a TLS handshake is kept.
    pub(crate) async fn channel(&self) -> Result<(usize, Channel), Error> {
        let mut state = self.state.lock().await;
        if let Some((index, channel)) = &state.current {
            return Ok((*index, channel.clone()));
        }
        let count = self.endpoints.len();
        let mut attempts = Vec::with_capacity(count);
        for offset in 0..count {
            let index = (state.next + offset) % count;
            match self.connect(index).await {
                Ok(channel) => {
                    state.current = Some((index, channel.clone()));
                    return Ok((index, channel));
                }
                Err(reason) => {
                    tracing::debug!(endpoint = %self.endpoints[index], %reason, "endpoint unreachable");
                    attempts.push(ConnectAttempt {
                        endpoint: self.endpoints[index].to_string(),
                        reason,
                    });
                }
            }
        }
        Err(Error::Connect(attempts))
    }

    /// Forgets the channel to `index` after it failed, so the next call
    /// connects again, starting with the following endpoint.
    pub(crate) async fn mark_failed(&self, index: usize) {
        let mut state = self.state.lock().await;
        if matches!(state.current, Some((i, _)) if i == index) {
            state.current = None;
            state.next = (index + 1) % self.endpoints.len();
        }
    }

    async fn connect(&self, index: usize) -> Result<Channel, String> {
        let addr = &self.endpoints[index];
        let uri = format!("https://{addr}");
        let endpoint = Endpoint::from_shared(uri)
            .map_err(|e| e.to_string())?
            .connect_timeout(self.settings.connect_timeout)
            .http2_keep_alive_interval(self.settings.keepalive_interval)
            .keep_alive_timeout(self.settings.keepalive_timeout)
            .keep_alive_while_idle(true)
            .initial_stream_window_size(Some(2 * 1024 * 1024))
            .initial_connection_window_size(Some(4 * 1024 * 1024))
            .max_frame_size(MAX_FRAME_SIZE)
            .tcp_nodelay(true);
        let connector = TlsConnector {
            tls: self.tls.clone(),
            addr: addr.clone(),
        };
        endpoint
            .connect_with_connector(connector)
            .await
            .map_err(|e| describe_connect_error(&e, &addr.host))
    }
}

/// Dials TCP and performs the TLS handshake, verifying the server name (an IP
/// address or DNS name) against the certificate's SANs.
#[derive(Clone)]
struct TlsConnector {
    tls: Arc<ClientConfig>,
    addr: EndpointAddr,
}

impl tower::Service<Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        let addr = self.addr.clone();
        Box::pin(async move {
            let server_name = ServerName::try_from(addr.host.clone())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let tcp = TcpStream::connect((addr.host.as_str(), addr.port)).await?;
            tcp.set_nodelay(true)?;
            let stream = tokio_rustls::TlsConnector::from(tls)
                .connect(server_name, tcp)
                .await?;
            Ok(TokioIo::new(stream))
        })
    }
}
