//! Group commit: single-record writes (`put`, `delete`, `mutate`) issued while another
//! one of this connection is still open for joining share its readwrite
//! transaction, and each keeps its own compare-and-swap outcome and error.
//!
//! A write that finds no open group leads a new one: it starts the
//! transaction and registers the group. Writes issued before the leader has
//! run out of members (in practice: the same tick, or while the group's
//! requests are in flight) join it, as long as no other transaction was
//! started on this database since the group's, by any connection of this
//! module (so a write never runs ahead of a read or batch the caller issued
//! before it), and while the
//! group has fewer than [`MAX_GROUP`] members (bounding a member's wait).
//!
//! The leader applies the members strictly one after another: a member's
//! reads are issued after the previous member's writes, and IndexedDB
//! answers requests of one transaction in order, so every member reads what
//! the members before it wrote and decides its compare-and-swap exactly as
//! it would in a transaction of its own. A member refused on its own terms
//! (a revision conflict, an invalid `mutate` result, a throwing function, an
//! aborted signal) writes nothing and does not affect the others. When the
//! transaction itself fails (a failing request, a quota abort at commit,
//! a closed connection), nothing of it is kept, and each member of a group of
//! two or more is run again in a transaction of its own, so each one gets
//! the outcome it would have had alone (a `mutate` function may then run
//! twice) — unless another transaction on this database (by any connection
//! of this module; [`super::db::Db::seq`]) started after the group's: the
//! members would then take effect after it, out of the order they were
//! issued in, so each gets the transaction's error instead. One
//! change message is posted for the whole group after commit.
//!
//! This is the group commit of database write-ahead logs (e.g. PostgreSQL's
//! `commit_delay`, InnoDB's binary-log group commit), applied to IndexedDB
//! transactions: it is what lets independent writers of one page beat one
//! transaction per write.

use super::db::Tx;
use super::{index, read_current, Prepared, Store, Written};
use crate::error::{Result, StoreError};
use agentstore_protocol::rev::{decide_delete, decide_put, CasError, Current, Rev};
use js_sys::{Array, Function, JsString};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use wasm_bindgen::{JsCast, JsValue};
use web_sys::AbortSignal;

/// Members one group takes at most; later writes start the next group.
pub(crate) const MAX_GROUP: usize = 64;

/// One single-record write.
pub(crate) enum Job {
    /// `put` of a validated record.
    Put(Prepared),
    /// `delete(id, rev)`: a tombstone whose body digest is `digest`
    /// replaces the live record at `expected`.
    Delete {
        id: JsString,
        expected: Rev,
        digest: String,
    },
    /// `mutate(id, f)`: `f` is called inside the transaction.
    Mutate { id: JsString, f: Function },
}

/// What a member's write came to.
pub(crate) enum Done {
    /// Written with this revision.
    Written(Written),
    /// `mutate`'s function returned `undefined`: nothing written.
    Unchanged,
    /// `mutate`'s function returned a thenable: it is awaited outside any
    /// transaction; `rev` is the revision the function was given.
    Async {
        promise: js_sys::Promise,
        rev: Option<String>,
    },
}

impl Done {
    /// What a `put` or `delete` wrote (those end in nothing else).
    ///
    /// # Errors
    /// TransactionError for any other outcome.
    pub(crate) fn written(self) -> Result<Written> {
        match self {
            Done::Written(w) => Ok(w),
            _ => Err(StoreError::Transaction("the write wrote nothing".into())),
        }
    }
}

/// What the leader hands a member.
enum Delivered {
    Done(Result<Done>),
    /// The shared transaction failed: run again alone.
    Rerun,
}

struct Member {
    job: Job,
    /// The caller's signal: aborted before the member is [`Member::started`],
    /// the member writes nothing and its call rejects at once.
    signal: Option<AbortSignal>,
    /// The leader has reached it (its abort is checked there for the last
    /// time before its writes; a wait no longer ends on abort).
    started: Cell<bool>,
    /// Its call already rejected with AbortError (the signal fired `abort`,
    /// whatever `signal.aborted` says since): skipped when reached.
    cancelled: Cell<bool>,
    answered: Cell<bool>,
    out: RefCell<Option<Delivered>>,
    waker: RefCell<Option<Waker>>,
}

impl Member {
    fn new(job: Job, signal: Option<&AbortSignal>) -> Rc<Member> {
        Rc::new(Member {
            job,
            signal: signal.cloned(),
            started: Cell::new(false),
            cancelled: Cell::new(false),
            answered: Cell::new(false),
            out: RefCell::new(None),
            waker: RefCell::new(None),
        })
    }

    fn deliver(&self, d: Delivered) {
        self.answered.set(true);
        *self.out.borrow_mut() = Some(d);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

/// Waits for the leader's answer to a member.
struct Wait(Rc<Member>);

impl Future for Wait {
    type Output = Delivered;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Delivered> {
        match self.0.out.borrow_mut().take() {
            Some(d) => Poll::Ready(d),
            None => {
                *self.0.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// A group of writes sharing one readwrite transaction.
pub(crate) struct Group {
    /// The database's transaction count ([`super::db::Db::seq`]) when the
    /// group's started.
    seq: u32,
    open: Cell<bool>,
    /// The commit was asked for: from then on the outcome cannot be undone.
    committing: Cell<bool>,
    members: RefCell<Vec<Rc<Member>>>,
}

/// Answers every member not answered yet when the leader stops early (its
/// future dropped, which aborts the transaction): with
/// [`Delivered::Rerun`] before the commit was asked for (nothing of it is
/// kept), with a TransactionError after (the outcome is unknown: running
/// the members again could apply them twice). No member waits forever.
struct Unanswered<'a>(&'a Group);

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        self.0.open.set(false);
        let committing = self.0.committing.get();
        for m in self.0.members.borrow().iter() {
            if !m.answered.get() {
                m.deliver(if committing {
                    Delivered::Done(Err(StoreError::Transaction(
                        "commit outcome unknown (the leading call was dropped)".into(),
                    )))
                } else {
                    Delivered::Rerun
                });
            }
        }
    }
}

/// A committed change for `watch`: what was written, and whether it is a
/// tombstone.
type Change = (Written, bool);

/// Whether a member's outcome is final after its own decision, or the
/// shared transaction failed.
type Step = std::result::Result<(Result<Done>, Option<Change>), StoreError>;

impl Store {
    /// Runs one single-record write, in a shared transaction when a group
    /// is open for joining (see the module docs).
    ///
    /// `signal` aborting while the write waits for its turn (its
    /// transaction queued behind another tab's, members ahead of it) ends
    /// the call at once with AbortError; the write is then skipped when its
    /// turn comes (also when only its `abort` event fired and
    /// `signal.aborted` reads false). Once its turn came, the outcome is the
    /// write's.
    ///
    /// # Errors
    /// The member's own error (ConflictError, ValidationError, the value
    /// `f` threw, AbortError) or the transaction's (TransactionError,
    /// QuotaExceededError, ClosedError).
    pub(crate) async fn write_one(&self, job: Job, signal: Option<&AbortSignal>) -> Result<Done> {
        // A group still running on a closed connection would take it.
        self.db.check_open()?;
        let joinable = self
            .group
            .borrow()
            .as_ref()
            .filter(|g| {
                g.open.get() && g.seq == self.db.seq() && g.members.borrow().len() < MAX_GROUP
            })
            .cloned();
        let member = Member::new(job, signal);
        let lead = match joinable {
            Some(g) => {
                g.members.borrow_mut().push(member.clone());
                None
            }
            // A write with a signal leads a group of its own: its abort
            // drops the group it leads, and members that joined it would
            // run again after calls issued since (out of issue order).
            None => Some(signal.is_none()),
        };
        match until_started(self.turn(&member, lead), &member).await? {
            Delivered::Done(r) => r,
            Delivered::Rerun => {
                member.answered.set(false);
                member.started.set(false);
                match until_started(self.turn(&member, Some(false)), &member).await? {
                    Delivered::Done(r) => r,
                    Delivered::Rerun => Err(StoreError::Transaction(
                        "the write's transaction was interrupted".into(),
                    )),
                }
            }
        }
    }

    /// A member's turn: it leads a group first when `lead` says so
    /// (`Some(shared)`, see [`Store::lead`]), then waits for its answer.
    async fn turn(&self, m: &Rc<Member>, lead: Option<bool>) -> Delivered {
        if let Some(shared) = lead {
            self.lead(m.clone(), shared).await;
        }
        Wait(m.clone()).await
    }

    /// Starts a group with `first` (registered for joining when `shared`),
    /// applies its members in order, commits, and answers each member.
    async fn lead(&self, first: Rc<Member>, shared: bool) {
        let tx = match self.write_tx() {
            Ok(tx) => tx,
            Err(e) => return first.deliver(Delivered::Done(Err(e))),
        };
        let g = Rc::new(Group {
            seq: self.db.seq(),
            open: Cell::new(true),
            committing: Cell::new(false),
            members: RefCell::new(vec![first]),
        });
        if shared {
            *self.group.borrow_mut() = Some(g.clone());
        }
        let guard = Unanswered(&g);
        let outcome = self.apply_all(tx, &g).await;
        if shared {
            let mut cur = self.group.borrow_mut();
            if cur.as_ref().is_some_and(|c| Rc::ptr_eq(c, &g)) {
                *cur = None;
            }
        }
        let members = g.members.borrow().clone();
        match outcome {
            Ok(results) => {
                let changes = Array::new();
                for (_, w) in &results {
                    if let Some((w, deleted)) = w {
                        self.changes.change(&changes, &w.id, &w.rev, *deleted);
                    }
                }
                self.changes.post(&changes);
                for (m, (r, _)) in members.iter().zip(results) {
                    m.deliver(Delivered::Done(r));
                }
            }
            // Alone, or another transaction (of any connection) started
            // after the group's (a read or batch issued after these
            // writes): running them again would put them after it, out of
            // the order they were issued in. Each gets the error.
            Err(e) if members.len() == 1 || self.db.seq() != g.seq => {
                for m in &members {
                    m.deliver(Delivered::Done(Err(e.clone())));
                }
            }
            Err(_) => {
                for m in &members {
                    m.deliver(Delivered::Rerun);
                }
            }
        }
        drop(guard);
    }

    /// Applies the group's members one after another in `tx`, closes the
    /// group when none is left, and commits. `Err` = the transaction failed
    /// (nothing of it was kept).
    async fn apply_all(
        &self,
        tx: Tx,
        g: &Group,
    ) -> std::result::Result<Vec<(Result<Done>, Option<Change>)>, StoreError> {
        let mut gen = Some(index::issue_gen(&tx)?);
        let mut state = None;
        let mut results = Vec::new();
        loop {
            let next = g.members.borrow().get(results.len()).cloned();
            let Some(m) = next else { break };
            let id = match &m.job {
                Job::Put(p) => p.id.clone(),
                Job::Delete { id, .. } | Job::Mutate { id, .. } => id.clone(),
            };
            // A request that fails ends the transaction (`?`); a stored
            // revision that does not parse is this member's error alone.
            let read = read_current(&tx, &id).await?;
            m.started.set(true);
            let (current, stored) = match super::current_of(read) {
                Ok(r) => r,
                Err(e) => {
                    results.push((Err(e), None));
                    continue;
                }
            };
            // The last check of its signal before its writes (a `mutate`
            // function checks it again after it ran); a member whose call
            // rejected already is skipped whatever the signal says now.
            if let Err(e) = super::check_abort(m.signal.as_ref()) {
                results.push((Err(e), None));
                continue;
            }
            if m.cancelled.get() {
                results.push((Err(StoreError::Aborted(JsValue::UNDEFINED)), None));
                continue;
            }
            let st = match (&state, gen.take()) {
                (Some(s), _) => Rc::clone(s),
                (None, Some(gen)) => state
                    .insert(self.write_indexes_from(&tx, gen).await?)
                    .clone(),
                (None, None) => {
                    return Err(StoreError::Transaction("index state was not read".into()))
                }
            };
            results.push(self.apply(&tx, &st, &m, current, stored)?);
        }
        g.open.set(false);
        g.committing.set(true);
        self.finish(tx).await?;
        Ok(results)
    }

    /// One member's decision and writes, after its read. Issues no await:
    /// the next member's reads are issued after these writes.
    fn apply(
        &self,
        tx: &Tx,
        state: &index::Maintained,
        m: &Member,
        current: Current,
        stored: Option<JsValue>,
    ) -> Step {
        let p = match &m.job {
            Job::Put(p) => p,
            Job::Delete {
                id,
                expected,
                digest,
            } => return Self::tombstone(tx, state, id, expected, digest, &current, stored),
            Job::Mutate { id, f } => {
                match super::mutate::call(id, f, m.signal.as_ref(), &current, stored.as_ref()) {
                    Ok(super::mutate::Called::Write(p)) => {
                        return self.write(tx, state, &current, stored, &p)
                    }
                    Ok(super::mutate::Called::Done(d)) => return Ok((Ok(d), None)),
                    Err(e) => return Ok((Err(e), None)),
                }
            }
        };
        self.write(tx, state, &current, stored, p)
    }

    /// Decides `p` against `current` and, when it wins, issues its writes.
    fn write(
        &self,
        tx: &Tx,
        state: &index::Maintained,
        current: &Current,
        stored: Option<JsValue>,
        p: &Prepared,
    ) -> Step {
        let rev = match decide_put(current, p.expected.as_ref()) {
            Ok(base) => match p.stamp(base, stored.as_ref(), &super::now_iso(), state.purges()) {
                Ok(rev) => rev,
                Err(e) => return Ok((Err(e), None)),
            },
            Err(_) => return Ok((Err(super::conflict(p, current, stored)), None)),
        };
        super::write_record(tx, state, stored.as_ref(), p, current, false)?;
        Ok(written(&p.id, rev, false))
    }

    /// Decides a deletion of `id` at `expected` against `current` and, when
    /// it wins, issues its writes: the tombstone (revision from its body
    /// `digest`), the record's removal, its index entries' removal.
    fn tombstone(
        tx: &Tx,
        state: &index::Maintained,
        id: &JsString,
        expected: &Rev,
        digest: &str,
        current: &Current,
        stored: Option<JsValue>,
    ) -> Step {
        let base = match decide_delete(current, expected) {
            Ok(base) => base,
            Err(CasError::NotFound) => {
                return Ok((Err(StoreError::NotFound(id.into(), id.into())), None))
            }
            Err(CasError::Conflict) => {
                return Ok((
                    Err(StoreError::Conflict {
                        id: id.into(),
                        id_text: id.into(),
                        expected_rev: Some(expected.text()),
                        current_rev: current.rev().map(Rev::text),
                        current: stored.unwrap_or(JsValue::NULL),
                        attempts: None,
                    }),
                    None,
                ))
            }
        };
        let rev = match super::tombstone_rev(base, digest) {
            Ok(rev) => rev,
            Err(e) => return Ok((Err(e), None)),
        };
        super::write_tombstone(tx, state, stored.as_ref(), id, &rev)?;
        Ok(written(id, rev, true))
    }
}

/// A member's outcome when it wrote `rev` for `id` (`deleted`: a tombstone).
fn written(id: &JsString, rev: String, deleted: bool) -> (Result<Done>, Option<Change>) {
    let w = Written {
        id: id.clone(),
        rev,
    };
    (Ok(Done::Written(w.clone())), Some((w, deleted)))
}

/// Runs `fut` (the member's wait, or the group it leads) to its end; while
/// `m` has not [`Member::started`], its signal's abort ends it early with
/// AbortError, dropping `fut` (a group it leads, whose transaction then
/// aborts, has no other member: see [`Store::write_one`]) and marking `m`
/// [`Member::cancelled`]: the `abort` event alone ends the wait (a
/// synthetic one leaves `signal.aborted` false), so the leader must not
/// rely on the signal to skip it.
///
/// # Errors
/// AbortError.
async fn until_started<F: Future>(fut: F, m: &Member) -> Result<F::Output> {
    let Some(sig) = m.signal.as_ref() else {
        return Ok(fut.await);
    };
    // An abort before the wait began fired its event already.
    if let Err(e) = super::check_abort(Some(sig)) {
        m.cancelled.set(true);
        return Err(e);
    }
    let watch = super::mutate::abort_watch(sig);
    let stop: Function = watch.get(1).unchecked_into();
    let mut aborted = wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(watch.get(0)));
    let mut fut = std::pin::pin!(fut);
    let out = std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        if !m.started.get() && Pin::new(&mut aborted).poll(cx).is_ready() {
            m.cancelled.set(true);
            let reason = crate::options::abort_reason(sig).unwrap_or(JsValue::UNDEFINED);
            return Poll::Ready(Err(StoreError::Aborted(reason)));
        }
        Poll::Pending
    })
    .await;
    let _ = crate::value::call0(&stop, &JsValue::NULL);
    out
}
