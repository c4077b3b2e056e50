//! Early answers that reach the client: a request answered before its body
//! was read (a `401`, a `403` of the role or `Host` check, a `429`, a `405`,
//! a handler that takes no body) has that body read and discarded before
//! the answer goes out.
//!
//! Left unread, the body is still in the socket when hyper closes the
//! connection (it cannot keep a connection whose request it did not read to
//! the end), and closing a socket with unread bytes in its receive buffer
//! sends a TCP reset instead of a FIN. The reset can overtake the answer
//! already written: the client's stack drops what it had not handed to the
//! client yet, or the client is still writing the body and fails with a
//! broken pipe. Either way the client sees a network error where a typed
//! refusal was sent, and the SDK takes a definitive `401`/`403`/`429` for a
//! lost answer (a few in 40 were lost at 2 MB on loopback). Read to its end,
//! the body leaves nothing in the socket, and the connection stays open for
//! the client's next request.
//!
//! The draining is bounded as reading a body is: by `--max-body-bytes` in
//! all (what a handler read of it counts) and by `--read-timeout-ms` from
//! when the body was first read (by the handler, or by the drain when the
//! handler read none). A body that would pass either bound is left unread
//! and the answer carries `Connection: close`, as before: such a client may
//! still see the reset, but it sent a body no endpoint would have taken
//! (over the limit: `413` whoever sent it) or took longer than a body may
//! take. A request with `Expect: 100-continue` is not drained either: its
//! client waits for a `100 Continue` before sending the body, so answering
//! at once spares it sending the body at all (hyper then closes the
//! connection, and nothing is unread in it).
//!
//! What this costs: a request whose body is read to its end (every accepted
//! request with a body) pays one small allocation and a wrapper around its
//! body, no copy; a request without a body nothing. A refused client may
//! make the server read up to `--max-body-bytes` in at most
//! `--read-timeout-ms` before the refusal, chunk by chunk into no buffer:
//! that is what any client may make it read with an acceptable request
//! (enroll reads its body after its rate limit admits it), so a rate limit's
//! `429` still costs the server no database work and no memory, only the
//! bytes the client chose to send, which the kernel had received already.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::Instant;

/// The bounds of a drain: the flags that bound reading a body.
#[derive(Debug, Clone, Copy)]
pub struct Drain {
    /// `--max-body-bytes`: the most a request body may have in all.
    pub limit: usize,
    /// `--read-timeout-ms`: how long a whole body may take to arrive.
    pub read_timeout: Duration,
}

/// A body its handler did not read to the end, handed back when dropped.
struct Unread {
    body: Body,
    /// Data bytes the handler read of it.
    seen: usize,
    /// When it was first read, if it was.
    first_read: Option<Instant>,
}

/// Where a [`Tracked`] body leaves what was not read of it.
type Slot = Arc<Mutex<Option<Unread>>>;

/// A request body that counts what is read of it and, dropped before its
/// end, leaves the rest in its [`Slot`] for the middleware to drain.
struct Tracked {
    /// `None` once read to its end (or failed: a broken connection has
    /// nothing left to drain).
    body: Option<Body>,
    seen: usize,
    first_read: Option<Instant>,
    slot: Slot,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        this.first_read.get_or_insert_with(Instant::now);
        let polled = Pin::new(body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                this.seen += frame.data_ref().map_or(0, Bytes::len);
            }
            Poll::Ready(None | Some(Err(_))) => this.body = None,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some(body) = self.body.take().filter(|b| !b.is_end_stream()) {
            *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(Unread {
                body,
                seen: self.seen,
                first_read: self.first_read,
            });
        }
    }
}

/// The client waits for `100 Continue` before it sends the body.
fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Middleware (outside every other, so that every answer passes it): once
/// the inner service has answered, reads and discards what it left unread
/// of the request body, within [`Drain`]'s bounds, before the answer goes
/// out; past them the answer carries `Connection: close` (see the module
/// docs).
pub async fn drain_unread(State(drain): State<Drain>, req: Request, next: Next) -> Response {
    if req.body().is_end_stream() || expects_continue(req.headers()) {
        return next.run(req).await;
    }
    let slot = Slot::default();
    let req = req.map(|body| {
        Body::new(Tracked {
            body: Some(body),
            seen: 0,
            first_read: None,
            slot: slot.clone(),
        })
    });
    let mut resp = next.run(req).await;
    // The inner service dropped the body by the time it answered (a
    // handler's extractors are dropped with its future).
    let unread = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some(unread) = unread {
        if !drain.discard(unread).await {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }
    resp
}

impl Drain {
    /// Reads `unread` to its end, keeping nothing; `false` when it would
    /// pass the byte limit or the read deadline first (it is left unread).
    async fn discard(self, mut unread: Unread) -> bool {
        let deadline = unread.first_read.unwrap_or_else(Instant::now) + self.read_timeout;
        let read = async {
            loop {
                // A length the client declared is known before it is read.
                let coming = usize::try_from(unread.body.size_hint().lower()).unwrap_or(usize::MAX);
                if unread.seen.saturating_add(coming) > self.limit {
                    return false;
                }
                let frame = std::future::poll_fn(|cx| Pin::new(&mut unread.body).poll_frame(cx));
                match frame.await {
                    None => return true,
                    Some(Ok(frame)) => unread.seen += frame.data_ref().map_or(0, Bytes::len),
                    Some(Err(_)) => return false,
                }
            }
        };
        tokio::time::timeout_at(deadline, read)
            .await
            .unwrap_or(false)
    }
}
