//! A local response body that ends with its term (see
//! [`crate::lease::LocalWork`]): the gate wraps the body of every local
//! response that is still streaming in it, in the gateway and the layers
//! (an empty body ends the work at once; a 101's tunnel takes the work).

use std::pin::Pin;
use std::task::{Context, Poll};

/// A local response body that ends with its term: once the term it was
/// admitted under is over (ended at a drain bound, lost, or past its trust
/// deadline), the next poll fails the body, so no byte of the ended term's
/// work is sent after that point. hyper then closes an HTTP/1.1 connection
/// after the last complete chunk, and resets an HTTP/2 stream with `CANCEL`.
/// The count of local work lives until the body ends or is dropped.
pub(crate) struct TermBody {
    body: axum::body::Body,
    work: crate::lease::LocalWork,
    /// Armed while the inner body waits, so an idle stream ends on time too.
    waiter: Option<Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
    over: bool,
}

impl TermBody {
    pub(crate) fn new(body: axum::body::Body, work: crate::lease::LocalWork) -> Self {
        Self {
            body,
            work,
            waiter: None,
            over: false,
        }
    }

    /// Whether the term is over now, judged at this poll.
    fn check(&mut self) -> bool {
        self.over = self.over || self.work.watch().is_over();
        self.over
    }

    fn end(&mut self) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, axum::Error>>> {
        self.over = true;
        let role = self.work.watch().metric_label();
        let reason = self.work.watch().reason().map_or("lost", |r| r.as_str());
        metrics::counter!(crate::telemetry::STREAMS_ENDED, "role" => role, "reason" => reason)
            .increment(1);
        Poll::Ready(Some(Err(term_over_error())))
    }
}

/// The error a body fails with when its term is over: an HTTP/2 stream is
/// reset with `CANCEL` (hyper takes the reason from an `h2::Error` in the chain).
pub(crate) fn term_over_error() -> axum::Error {
    axum::Error::new(h2::Error::from(h2::Reason::CANCEL))
}

impl http_body::Body for TermBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if this.check() {
            return this.end();
        }
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Pending => {
                let watch = this.work.watch();
                let waiter = this.waiter.get_or_insert_with(|| watch.over_boxed());
                if waiter.as_mut().poll(cx).is_ready() {
                    return this.end();
                }
                Poll::Pending
            }
            ready => ready,
        }
    }

    fn is_end_stream(&self) -> bool {
        !self.over && self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
