//! The user callbacks of a read that runs in ONE read-only transaction
//! (an export's `onChunk`, the `onProgress` of an export or of
//! `verifyIndexes`), called in order, one at a time, each only once the
//! thenable the previous call returned has settled.
//!
//! The transaction cannot wait for such a thenable (it would commit under a
//! foreign await, CASES.md C-E3): the reads go on while one is pending, the
//! calls not made yet wait here (in JS memory, as JS values), and
//! [`Calls::finish`] waits for the rest once the reads are done.

use super::mutate::{check_abort, race_abort_or_close};
use super::Store;
use crate::error::{Result, StoreError};
use js_sys::{Array, Function, JsString};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use wasm_bindgen::JsValue;
use web_sys::AbortSignal;

/// What an `on_chunk` or `on_progress` thenable settles into, raced with
/// the signal and `close()`; with whether its rejection is ignored (the
/// last progress call) and whether it is a progress call's.
type Settling<'a> = (
    Pin<Box<dyn Future<Output = Result<std::result::Result<JsValue, JsValue>>> + 'a>>,
    bool,
    bool,
);

/// One call waiting for its turn.
enum Waiting {
    /// `on_chunk(chunk)`.
    Chunk(JsString),
    /// `on_progress(done, total)`; `true`: the last one (its failure is
    /// ignored: the work it reports is complete, as `rebuildIndexes` says).
    Progress(u32, u32, bool),
}

/// The callbacks of one read-only operation, and the chunks it keeps when
/// there is no `on_chunk`.
pub(crate) struct Calls<'a> {
    store: &'a Store,
    signal: Option<&'a AbortSignal>,
    on_chunk: Option<&'a Function>,
    on_progress: Option<&'a Function>,
    /// The chunks, when there is no `on_chunk` (else empty).
    parts: Array,
    queue: VecDeque<Waiting>,
    pending: Option<Settling<'a>>,
    /// Every read is done (set by [`Calls::finish`]): the work the progress
    /// calls report is complete.
    read: bool,
}

impl<'a> Calls<'a> {
    /// The callbacks of one operation on `store`: `on_chunk(chunk)` (none:
    /// the chunks are kept and returned), `on_progress(done, total)`, and
    /// the `signal` that ends them.
    pub(crate) fn new(
        store: &'a Store,
        on_chunk: Option<&'a Function>,
        on_progress: Option<&'a Function>,
        signal: Option<&'a AbortSignal>,
    ) -> Self {
        Calls {
            store,
            signal,
            on_chunk,
            on_progress,
            parts: Array::new(),
            queue: VecDeque::new(),
            pending: None,
            read: false,
        }
    }

    /// Fails once the store is closed or the signal aborted: looked at
    /// before each read of the operation and before each call (IndexedDB
    /// lets a read-only transaction finish, so neither ends it by itself).
    ///
    /// # Errors
    /// ClosedError; AbortError.
    pub(crate) fn check(&self) -> Result<()> {
        self.store.check_open()?;
        check_abort(self.signal)
    }

    /// Adds `chunk` and hands over what may go now.
    ///
    /// # Errors
    /// As [`Calls::check`]; what a call threw or its thenable rejected with.
    pub(crate) fn chunk(&mut self, chunk: JsString) -> Result<()> {
        self.check()?;
        if self.on_chunk.is_none() {
            self.parts.push(&chunk);
            return Ok(());
        }
        self.queue.push_back(Waiting::Chunk(chunk));
        self.pump()
    }

    /// Adds `on_progress(done, total)` (nothing without `on_progress`) and
    /// hands over what may go now. The call with `done == total` is the
    /// last: what it throws or rejects with is ignored.
    ///
    /// # Errors
    /// As [`Calls::chunk`].
    pub(crate) fn progress(&mut self, done: u32, total: u32) -> Result<()> {
        if self.on_progress.is_none() {
            return Ok(());
        }
        self.queue
            .push_back(Waiting::Progress(done, total, done >= total));
        self.pump()
    }

    /// Makes the waiting calls while no thenable of them is pending (looked
    /// at without waiting: the caller goes on reading).
    fn pump(&mut self) -> Result<()> {
        loop {
            if let Some((p, last, progress)) = self.pending.as_mut() {
                // A poll with a no-op waker: only whether it has settled.
                let cx = &mut Context::from_waker(Waker::noop());
                match p.as_mut().poll(cx) {
                    Poll::Pending => return Ok(()),
                    Poll::Ready(r) => {
                        let (last, done) = (*last, *progress && self.read);
                        self.pending = None;
                        settled(r, last, done)?;
                    }
                }
            }
            let Some(next) = self.queue.pop_front() else {
                return Ok(());
            };
            if self.read && matches!(next, Waiting::Progress(..)) {
                // Every read is done and every chunk collected or handed
                // over: an abort only stops the progress calls left.
                self.store.check_open()?;
                if check_abort(self.signal).is_err() {
                    continue;
                }
            } else {
                self.check()?;
            }
            let (called, ignored, progress) = match next {
                Waiting::Chunk(c) => (
                    self.on_chunk
                        .map(|f| crate::value::call1(f, &JsValue::NULL, &c)),
                    false,
                    false,
                ),
                Waiting::Progress(done, total, last) => (
                    self.on_progress.map(|f| {
                        crate::value::call2(f, &JsValue::NULL, &done.into(), &total.into())
                    }),
                    last,
                    true,
                ),
            };
            let out = match called {
                Some(Ok(v)) => v,
                Some(Err(e)) if !ignored => return Err(StoreError::Thrown(e)),
                _ => continue,
            };
            if let Some(p) = crate::value::as_promise(&out) {
                // Polled at once (the loop): its rejection has a handler
                // before this returns, never an unhandled rejection.
                let settling = race_abort_or_close(p, self.signal, self.store);
                self.pending = Some((Box::pin(settling), ignored, progress));
            }
        }
    }

    /// Makes the rest of the calls, waiting for each thenable; the chunks
    /// when there is no `on_chunk` (else an empty array).
    ///
    /// # Errors
    /// As [`Calls::chunk`]; ClosedError when the store closed meanwhile.
    pub(crate) async fn finish(mut self) -> Result<Array> {
        // Called once every read is done.
        self.read = true;
        loop {
            self.pump()?;
            match self.pending.take() {
                Some((p, last, progress)) => settled(p.await, last, progress)?,
                None => break,
            };
        }
        self.store.check_open()?;
        Ok(self.parts)
    }
}

/// What a settled call's thenable means for the operation: what it
/// rejected with, unless the call was the `last` progress call, which
/// reports complete work. An abort that ended the wait fails the operation
/// unless the work is `done`: the last progress call's, or any progress
/// call's once every read is done (an AbortError then would report done
/// work as not done, as `rebuildIndexes` and the imports avoid too).
///
/// # Errors
/// What the thenable rejected with (not `last`); AbortError (not `done`);
/// ClosedError.
fn settled(r: Result<std::result::Result<JsValue, JsValue>>, last: bool, done: bool) -> Result<()> {
    match r {
        Ok(Err(e)) if !last => Err(StoreError::Thrown(e)),
        Err(StoreError::Aborted(_)) if last || done => Ok(()),
        Err(e) => Err(e),
        Ok(_) => Ok(()),
    }
}

/// Up to `batch` objects of `store` after key `after` (from the start when
/// `None`), in key order: one request of an operation that reads a whole
/// store in batches within one transaction.
///
/// # Errors
/// TransactionError / ClosedError from IndexedDB.
pub(crate) async fn read_after(
    store: &super::db::ObjectStore,
    after: Option<&JsValue>,
    batch: u32,
) -> Result<Vec<JsValue>> {
    let query = match after {
        Some(k) => Some(super::db::Query::KeyRange(
            super::db::KeyRange::lower_bound(k, Some(true))?,
        )),
        None => None,
    };
    store.get_all(query, Some(batch))?.await
}
