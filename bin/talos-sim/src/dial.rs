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
/// server certificate for `host`. The error is the innermost cause's text.
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

fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
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
            let tcp = TcpStream::connect((this.host.as_str(), this.port)).await?;
            tcp.set_nodelay(true)?;
            let stream = tokio_rustls::TlsConnector::from(this.tls)
                .connect(name, tcp)
                .await?;
            Ok(TokioIo::new(stream))
        })
    }
}
