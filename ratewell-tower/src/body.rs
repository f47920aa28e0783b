//! The response body: the inner service's, or the layer's own (a problem-details document).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of a response through [`RateLimit`](crate::RateLimit): the inner service's
    /// body, or the bytes of the layer's own answer.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        // Boxed: a rejection allocates its body anyway, and the inner service's bodies stay
        // as small as they are (a body is moved with every response).
        Full { data: Option<Box<Bytes>> },
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body.
    pub fn inner(body: B) -> Self {
        ResponseBody { kind: Kind::Inner { body } }
    }

    /// A body of these bytes (none for empty).
    pub fn full(data: Bytes) -> Self {
        ResponseBody { kind: Kind::Full { data: (!data.is_empty()).then(|| Box::new(data)) } }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Full { data } => f.debug_tuple("ResponseBody::Full").field(data).finish(),
        }
    }
}

impl<B: Body<Data = Bytes>> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(*d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
