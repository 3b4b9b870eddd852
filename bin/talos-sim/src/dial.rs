//! How one simulated apid reaches another when it proxies a call: TCP to the
//! node's API port, TLS with the cluster's proxy identity, HTTP/2.

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
use tokio_rustls::client::TlsStream;
use tonic::transport::{Channel, Endpoint};

/// Connects to `host:port` and completes the TLS handshake, verifying the
/// server certificate for `host`. The error is the description grpc-go
/// gives such a failure (internal/transport/http2_client.go): `transport:
/// Error while dialing: dial tcp HOST:PORT: connect: ...` or `transport:
/// authentication handshake failed: ...`.
pub(crate) async fn dial(host: &str, port: u16, tls: Arc<ClientConfig>) -> Result<Channel, String> {
    let endpoint = Endpoint::from_shared(format!("https://{host}:{port}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20))
        .tcp_nodelay(true);
    let connector = Connector {
        tls,
        host: host.to_string(),
        port,
    };
    endpoint
        .connect_with_connector(connector)
        .await
        .map_err(|e| innermost(&e))
}

/// The innermost cause's text (the connector's Go-style description).
pub(crate) fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

#[derive(Clone)]
struct Connector {
    tls: Arc<ClientConfig>,
    host: String,
    port: u16,
}

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let name = ServerName::try_from(this.host.clone())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let address = format!("{}:{}", this.host, this.port);
            let tcp = TcpStream::connect(address.as_str()).await.map_err(|e| {
                std::io::Error::other(format!(
                    "transport: Error while dialing: dial tcp {address}: {}",
                    go_connect_error(&e)
                ))
            })?;
            tcp.set_nodelay(true)?;
            let stream = tokio_rustls::TlsConnector::from(this.tls)
                .connect(name, tcp)
                .await
                .map_err(|e| {
                    std::io::Error::other(format!(
                        "transport: authentication handshake failed: {e}"
                    ))
                })?;
            Ok(TokioIo::new(stream))
        })
    }
}

/// A failed connect(2) as Go's net package words it.
fn go_connect_error(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => "connect: connection refused".into(),
        Some(libc::EHOSTUNREACH) => "connect: no route to host".into(),
        Some(libc::ENETUNREACH) => "connect: network is unreachable".into(),
        Some(libc::ETIMEDOUT) => "connect: connection timed out".into(),
        Some(libc::EADDRNOTAVAIL) => "connect: cannot assign requested address".into(),
        _ if e.kind() == std::io::ErrorKind::TimedOut => "i/o timeout".into(),
        _ => format!("connect: {}", e.kind()),
    }
}

/// grpc-go's status for a connection that failed (transport.ConnectionError).
pub(crate) fn connection_error(desc: &str) -> tonic::Status {
    tonic::Status::unavailable(format!(
        "connection error: desc = {}",
        crate::go_errors::quote(desc)
    ))
}
