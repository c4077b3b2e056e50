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
//! lost answer (18-33 of 320 were lost at 2 MiB on loopback). Read to its end,
//! the body leaves nothing in the socket, and the connection stays open for
//! the client's next request.
//!
//! The draining is bounded as reading a body is: by `--max-body-bytes` in
//! all (what a handler read of it counts) and by `--read-timeout-ms` from
//! when the body was first read (by the handler, or by the drain when the
//! handler read none). A body that would pass the byte limit (its declared
//! length, or what arrived) is not drained before the answer: the answer
//! (a refusal, or the `413` of a handler that read up to the limit) goes
//! out at once with `Connection: close`, and then the connection closes
//! lingering ([`Lingering`], Apache's and nginx's lingering close): its
//! sending side is shut (a FIN after the answer) and what still arrives is
//! read and discarded until the client closes its side or the body's read
//! deadline passes, so that the close is no reset under the answer (without
//! it, 30-35 of 160 answers to 8 MiB bodies over a 1 MiB limit were lost:
//! the client failed writing its body on the reset). A body past its read
//! deadline is left unread and its connection closed at once, as before: a
//! client trickling it gets no more time. A request with `Expect:
//! 100-continue` is not drained either: its client waits for a `100
//! Continue` before sending the body, so answering at once spares it
//! sending the body at all (hyper then closes the connection, and nothing
//! is unread in it).
//!
//! What this costs: a request whose body is read to its end (every accepted
//! request with a body) pays two small allocations (the wrapper around its
//! body and the slot it would leave the rest in), no copy; every request,
//! with a body or without, carries its connection's [`Linger`] in its
//! extensions (one more small allocation). A refused client may
//! make the server read up to `--max-body-bytes` in at most
//! `--read-timeout-ms` before the refusal, chunk by chunk into no buffer:
//! that is what any client may make it read with an acceptable request
//! (enroll reads its body after its rate limit admits it), so a rate limit's
//! `429` still costs the server no database work and no memory, only the
//! bytes the client chose to send, which the kernel had received already.
//! A lingering close reads with no byte bound but for no longer than the
//! body could have taken to arrive (`--read-timeout-ms` from its first
//! read), into one 8 KiB buffer on the stack: a client makes the server read
//! as much by sending requests of `--max-body-bytes` one after another.

use std::future::Future;
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
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

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

/// Middleware (outside every layer that may answer, so that every answer
/// passes it; only request tracing is outside it): once
/// the inner service has answered, reads and discards what it left unread
/// of the request body, within [`Drain`]'s bounds, before the answer goes
/// out; past them the answer carries `Connection: close` (see the module
/// docs).
pub async fn drain_unread(State(drain): State<Drain>, req: Request, next: Next) -> Response {
    if req.body().is_end_stream() || expects_continue(req.headers()) {
        return next.run(req).await;
    }
    let linger = req.extensions().get::<Linger>().cloned();
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
        if let Err(left) = drain.discard(unread).await {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            if let (Some(linger), Left::TooLarge(deadline)) = (linger, left) {
                linger.until(deadline);
            }
        }
    }
    resp
}

/// Why a body was left unread.
enum Left {
    /// It would pass `--max-body-bytes`; its read deadline.
    TooLarge(Instant),
    /// Its read deadline passed, or its connection failed.
    Late,
}

impl Drain {
    /// Reads `unread` to its end, keeping nothing; `Err` when it would pass
    /// the byte limit or the read deadline first (it is left unread).
    async fn discard(self, mut unread: Unread) -> Result<(), Left> {
        let deadline = unread.first_read.unwrap_or_else(Instant::now) + self.read_timeout;
        let read = async {
            loop {
                // A length the client declared is known before it is read.
                let coming = usize::try_from(unread.body.size_hint().lower()).unwrap_or(usize::MAX);
                if unread.seen.saturating_add(coming) > self.limit {
                    return Err(Left::TooLarge(deadline));
                }
                let frame = std::future::poll_fn(|cx| Pin::new(&mut unread.body).poll_frame(cx));
                match frame.await {
                    None => return Ok(()),
                    Some(Ok(frame)) => unread.seen += frame.data_ref().map_or(0, Bytes::len),
                    Some(Err(_)) => return Err(Left::Late),
                }
            }
        };
        tokio::time::timeout_at(deadline, read)
            .await
            .unwrap_or(Err(Left::Late))
    }
}

/// Until when a connection closes lingering (see [`Lingering`]): set by
/// [`drain_unread`] for a body left unread because it is too large, read by
/// the connection's [`Lingering`] when it closes. One per connection, in
/// each of its requests' extensions.
#[derive(Debug, Clone, Default)]
pub struct Linger(Arc<Mutex<Option<Instant>>>);

impl Linger {
    fn until(&self, deadline: Instant) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(deadline);
    }

    fn deadline(&self) -> Option<Instant> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection that, once its [`Linger`] is set, closes lingering: its
/// shutdown sends the FIN after the answer and then reads and discards what
/// arrives until the client closes its side, the read fails, or the
/// deadline passes; only then is the socket closed. Closed with the rest
/// of a body unread in it, the socket would send a reset, which can reach
/// the client before it has read the answer or while it still writes its
/// body (a failed write is all it then reports).
pub struct Lingering<T> {
    io: T,
    linger: Linger,
    /// Armed once the sending side is shut and the connection lingers.
    until: Option<Pin<Box<Sleep>>>,
}

impl<T> Lingering<T> {
    /// `io`, closing lingering once `linger` is set.
    pub fn new(io: T, linger: Linger) -> Self {
        Lingering {
            io,
            linger,
            until: None,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Lingering<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Lingering<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.until.is_none() {
            std::task::ready!(Pin::new(&mut this.io).poll_shutdown(cx))?;
            match this.linger.deadline() {
                Some(deadline) if deadline > Instant::now() => {
                    this.until = Some(Box::pin(tokio::time::sleep_until(deadline)));
                }
                _ => return Poll::Ready(Ok(())),
            }
        }
        let until = this.until.as_mut().expect("armed above");
        if until.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Ok(()));
        }
        let mut discard = [0u8; 8192];
        loop {
            let mut buf = ReadBuf::new(&mut discard);
            match Pin::new(&mut this.io).poll_read(cx, &mut buf) {
                // Read on: tokio's cooperative budget makes this `Pending`
                // now and then, so it never holds its thread.
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => {}
                // The client closed its side, or the connection failed.
                Poll::Ready(_) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
