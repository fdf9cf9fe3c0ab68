//! A response body watched while it streams, for what is written about a
//! request once it has ended (its access log line, its trace span): the
//! watcher sees each data frame and is dropped when the body ends, fails,
//! or is let go of.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;

/// What watches a body: told of each data frame; its `Drop` is the end.
pub(crate) trait Watcher: Send + 'static {
    /// `n` bytes of data went to the client.
    fn data(&mut self, _n: usize) {}
}

/// `resp` with `watcher` on its body (dropped at once if it has none).
pub(crate) fn watch<W: Watcher>(resp: http::Response<Body>, watcher: W) -> http::Response<Body> {
    use http_body::Body as _;
    if resp.body().is_end_stream() {
        drop(watcher);
        return resp;
    }
    resp.map(|body| {
        Body::new(Watched {
            body,
            watcher: Some(watcher),
        })
    })
}

struct Watched<W> {
    body: Body,
    watcher: Option<W>,
}

impl<W: Watcher> http_body::Body for Watched<W> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(w)) = (frame.data_ref(), self.watcher.as_mut()) {
                    w.data(data.len());
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                // Ended now, not when the connection lets go of the body.
                self.watcher = None;
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

// `Watched<W>` is `Unpin` (a `Body` and an `Option<W>` of an owned value).
impl<W> Unpin for Watched<W> {}
