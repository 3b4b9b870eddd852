//! Which API connections have a request in progress: each request counts
//! on its connection ([`crate::accept::Conn`]) from its start until its
//! response's body ends (a `WatchOperation` stream until it ends), so that
//! only idle connections are ever closed to make room or for idleness.

use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tonic::codegen::http;

use crate::accept::Conn;
use crate::slots::ConnState;

/// Counts a request on its connection while it lives.
struct Active(Arc<ConnState>);

impl Active {
    fn new(state: Arc<ConnState>) -> Active {
        state.begin();
        Active(state)
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// A response body that keeps its request counted until it ends.
pub struct Tracked<B> {
    inner: B,
    _active: Option<Active>,
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The layer: `T` is the listener's connection info inside [`Conn`].
pub struct TrackLayer<T>(PhantomData<fn() -> T>);

impl<T> TrackLayer<T> {
    /// The layer for connections whose info is `Conn<T>`.
    pub fn new() -> Self {
        TrackLayer(PhantomData)
    }
}

impl<T> Default for TrackLayer<T> {
    fn default() -> Self {
        TrackLayer::new()
    }
}

impl<T> Clone for TrackLayer<T> {
    fn clone(&self) -> Self {
        TrackLayer::new()
    }
}

impl<S, T> tower::Layer<S> for TrackLayer<T> {
    type Service = Track<S, T>;
    fn layer(&self, inner: S) -> Track<S, T> {
        Track {
            inner,
            _info: PhantomData,
        }
    }
}

/// The service of [`TrackLayer`].
pub struct Track<S, T> {
    inner: S,
    _info: PhantomData<fn() -> T>,
}

impl<S: Clone, T> Clone for Track<S, T> {
    fn clone(&self) -> Self {
        Track {
            inner: self.inner.clone(),
            _info: PhantomData,
        }
    }
}

impl<S, T, ReqB, ResB> tower::Service<http::Request<ReqB>> for Track<S, T>
where
    S: tower::Service<http::Request<ReqB>, Response = http::Response<ResB>>,
    S::Future: Send + 'static,
    T: Clone + Send + Sync + 'static,
{
    type Response = http::Response<Tracked<ResB>>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqB>) -> Self::Future {
        let active = request
            .extensions()
            .get::<Conn<T>>()
            .map(|conn| Active::new(Arc::clone(&conn.state)));
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|inner| Tracked {
                inner,
                _active: active,
            }))
        })
    }
}
