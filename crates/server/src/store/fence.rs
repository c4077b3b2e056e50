//! Why a fenced write (heartbeat, settle, release) matched no row.
//!
//! The write itself is one conditional statement that changed nothing; the
//! item is then read to tell `claim_lost` from `state_conflict` from
//! `forbidden` from `not_found` with the pure rules of
//! `agentstore_protocol::lease`. Many writes that failed together (a batched
//! heartbeat, a coalesced settle statement) are told with ONE read of every
//! item they name, never one read after another: a batch of 500 bogus leases
//! costs two statements, not 501.

use std::collections::{BTreeSet, HashMap};

use agentstore_protocol::lease::{fence_error, ItemState};
use agentstore_protocol::ErrorCode;
use sqlx::any::AnyRow;

use super::coalesce::for_each_call;
use super::{get, Store, StoreError};
use crate::tokens::ct_eq;

/// `not_found` for item `id`.
pub(super) fn not_found(id: i64) -> StoreError {
    StoreError::rejected(ErrorCode::NotFound, format!("item {id} does not exist"))
}

/// `forbidden`: a current token of another worker's lease.
pub(super) fn forbidden(id: i64) -> StoreError {
    StoreError::rejected(
        ErrorCode::Forbidden,
        format!("item {id} is leased to another worker"),
    )
}

/// The rejection `code` for item `id`, with its client-safe message.
pub(super) fn rejection(code: ErrorCode, id: i64) -> StoreError {
    let message = match code {
        ErrorCode::ClaimLost => format!("the lease token is no longer current for item {id}"),
        ErrorCode::StateConflict => format!("item {id} is no longer running"),
        _ => format!("item {id}: {code}"),
    };
    StoreError::rejected(code, message)
}

/// `claim_lost` for item `id`: also the answer to a tokenless release of a
/// missing item, so that only a holder of the token learns anything (see
/// `routes::release`).
pub(crate) fn claim_lost(id: i64) -> StoreError {
    rejection(ErrorCode::ClaimLost, id)
}

/// What decides a fence: the stored state, token hash and holder.
#[derive(Debug, Clone)]
pub(super) struct Fence {
    state: String,
    token_hash: Option<String>,
    worker_id: Option<i64>,
}

impl Fence {
    /// Reads the `state`, `token_hash` and `worker_id` columns of `row`.
    pub(super) fn from_row(row: &AnyRow) -> Result<Fence, StoreError> {
        Ok(Fence {
            state: get(row, "state")?,
            token_hash: get(row, "token_hash")?,
            worker_id: get(row, "worker_id")?,
        })
    }

    /// Whether the holder of `hash` (as `owner`, if a worker) holds this
    /// lease: running under that token, by that worker. A fenced write
    /// that matched no row while its row reads so was passed over, not
    /// refused (a coalesced statement skips a row another session locks).
    pub(super) fn held_by(&self, hash: &str, owner: Option<i64>) -> bool {
        self.state == ItemState::Running.as_str()
            && self.token_hash.as_deref().is_some_and(|s| ct_eq(s, hash))
            && (owner.is_none() || self.worker_id == owner)
    }

    /// Why a write by the holder of `hash` (as `owner`, if a worker) did not
    /// apply to item `id` in this state: compares the token hash in constant
    /// time and applies [`fence_error`]; a current token of another worker's
    /// lease is `forbidden`.
    pub(super) fn rejection(&self, id: i64, hash: &str, owner: Option<i64>) -> StoreError {
        let current = self.token_hash.as_deref().is_some_and(|s| ct_eq(s, hash));
        if current && owner.is_some() && self.worker_id != owner {
            return forbidden(id);
        }
        let state = ItemState::parse(&self.state).unwrap_or(ItemState::Failed);
        rejection(fence_error(current, state), id)
    }
}

/// `$first, $first+1, …` for `n` values.
pub(super) fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|k| format!("${k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The distinct ids of `ids`, in order.
pub(super) fn distinct(ids: impl IntoIterator<Item = i64>) -> Vec<i64> {
    ids.into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

impl Store {
    /// Why the write of `(id, token hash)` matched no row (see
    /// [`Store::classify_many`]).
    pub(super) async fn classify(&self, id: i64, hash: &str, owner: Option<i64>) -> StoreError {
        self.classify_many(&[(id, hash)], owner)
            .await
            .pop()
            .unwrap_or_else(|| not_found(id))
    }

    /// Why each of `calls` (`(id, token hash)`, by a holder that is `owner`
    /// if a worker) matched no row, in call order, from ONE read of every
    /// item named. A row that does not decode is its own calls' error; a
    /// failed read is every call's.
    pub(super) async fn classify_many(
        &self,
        calls: &[(i64, &str)],
        owner: Option<i64>,
    ) -> Vec<StoreError> {
        self.classify_or_skipped(calls, owner, false)
            .await
            .into_iter()
            .zip(calls)
            .map(|(e, &(id, _))| e.unwrap_or_else(|| not_found(id)))
            .collect()
    }

    /// [`Store::classify_many`]; with `skipped` (the calls a statement that
    /// skips locked rows did not apply), a call whose lease the read finds
    /// still held by it ([`Fence::held_by`]) gets `None`: its row was
    /// locked by another session, and the call must be run alone.
    pub(super) async fn classify_or_skipped(
        &self,
        calls: &[(i64, &str)],
        owner: Option<i64>,
        skipped: bool,
    ) -> Vec<Option<StoreError>> {
        if calls.is_empty() {
            return Vec::new();
        }
        let ids = distinct(calls.iter().map(|&(id, _)| id));
        let fences = match self.fences(&ids).await {
            Ok(fences) => fences,
            Err(e) => return calls.iter().map(|_| Some(for_each_call(&e))).collect(),
        };
        calls
            .iter()
            .map(|&(id, hash)| match fences.get(&id) {
                None => Some(not_found(id)),
                Some(Ok(fence)) if skipped && fence.held_by(hash, owner) => None,
                Some(Ok(fence)) => Some(fence.rejection(id, hash, owner)),
                Some(Err(e)) => Some(StoreError::Corrupt(e.clone())),
            })
            .collect()
    }

    /// The fences of the existing items among `ids` (distinct), in one
    /// statement; each decoded on its own.
    async fn fences(&self, ids: &[i64]) -> Result<HashMap<i64, Result<Fence, String>>, StoreError> {
        let sql = format!(
            "SELECT id, state, token_hash, worker_id FROM items WHERE id IN ({})",
            placeholders(1, ids.len())
        );
        let mut q = sqlx::query(&sql);
        for id in ids {
            q = q.bind(*id);
        }
        let rows = q.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                let id: i64 = get(row, "id")?;
                Ok((id, Fence::from_row(row).map_err(|e| e.to_string())))
            })
            .collect()
    }
}
