//! An answer given before the request's body was read to its end says `connection: close`.
//!
//! The services refuse a caller, a body too large or over the budget from the headers alone,
//! before reading a byte of the body (see [`crate::budget`] and the services' doors). The
//! connection cannot carry another request then: the unread rest of the body sits where the
//! next request's head would be, so hyper closes it once the answer is written, unless the body
//! happened to arrive with the head. Without saying so in the answer, a client that keeps
//! connections alive (Prometheus, ureq, an SDK's pool) sends its next request on a connection
//! the service is closing and sees it cut off, or not, depending on how its packets fell. Saying
//! `connection: close` makes it the same every time: the client opens a new connection.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Body as HttpBody, Frame, SizeHint};

/// The middleware: runs the request with its body watched, and marks the answer
/// `connection: close` when the body was not read to its end by the time it is given.
pub async fn close_when_body_unread(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let read = Arc::new(AtomicBool::new(body.is_end_stream()));
    let watched = Body::new(Watched {
        inner: body,
        read: Arc::clone(&read),
    });
    let mut response = next.run(Request::from_parts(parts, watched)).await;
    if !read.load(Ordering::Acquire) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request body that notes when it has been read to its end.
struct Watched {
    inner: Body,
    read: Arc<AtomicBool>,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => self.inner.is_end_stream(),
            Poll::Ready(Some(Err(_))) | Poll::Pending => false,
        };
        if ended {
            self.read.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
