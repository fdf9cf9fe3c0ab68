//! A body that keeps something alive (a counted stream, a permit, a count
//! of local work) until it has streamed to its end or is dropped.

use std::pin::Pin;
use std::task::{Context, Poll};

/// `body`, holding `hold` for as long as it lives.
pub(crate) struct Holding<B, H> {
    body: B,
    _hold: H,
}

impl<B, H> Holding<B, H> {
    pub(crate) fn new(body: B, hold: H) -> Self {
        Self { body, _hold: hold }
    }
}

impl<B, H> http_body::Body for Holding<B, H>
where
    B: http_body::Body + Unpin,
    H: Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
