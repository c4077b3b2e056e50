//! Queue gauges: items by state and the oldest open item's age, read in one
//! grouped query. `GET /v1/queues/{queue}/stats` and `GET /metrics` both come
//! from here, so the demo's panel and a Prometheus scrape agree.

use std::collections::BTreeMap;

use agentstore_protocol::lease::{ItemState, QueueStats};
use sqlx::any::AnyRow;

use super::{get, to_u64, Store, StoreError};

/// One `(queue, state)` group of [`Store::queue_stats`]: the queue, the
/// state, its count, and for `open` the age of the longest-waiting item (ms).
type Group = (String, ItemState, u64, Option<u64>);

fn group_from_row(row: &AnyRow) -> Result<Group, StoreError> {
    let name: String = get(row, "queue")?;
    let state: String = get(row, "state")?;
    let state =
        ItemState::parse(&state).ok_or_else(|| StoreError::Corrupt(format!("state {state:?}")))?;
    let n = to_u64(get(row, "n")?, "count")?;
    let age = match state {
        ItemState::Open => {
            let since: i64 = get(row, "since")?;
            let now: i64 = get(row, "now_ms")?;
            // Clamped: a row written by a clock a few ms ahead is not "negative".
            Some(u64::try_from(now - since).unwrap_or(0))
        }
        _ => None,
    };
    Ok((name, state, n, age))
}

impl Store {
    /// Gauges of `queue`, or of every queue that has items when `None` (sorted
    /// by name). A queue without items has all counts zero.
    ///
    /// The age is measured on the database clock from when the
    /// longest-waiting open item became claimable: its `updated_at` (set when
    /// it was enqueued or last reopened), or, for an item reopened with a
    /// redelivery backoff, its `available_at` (an item backing off waits for
    /// its delay, not for a worker: 0 while it is the only one and not due).
    ///
    /// Rows of an unknown state are left out (logged; counted by
    /// [`Store::queue_stats_and_unreadable`]).
    ///
    /// # Errors
    /// The database failed.
    pub async fn queue_stats(&self, queue: Option<&str>) -> Result<Vec<QueueStats>, StoreError> {
        Ok(self.queue_stats_and_unreadable(queue).await?.0)
    }

    /// [`Store::queue_stats`] and how many rows it left out (an unknown
    /// state): what the `agentstore_unreadable_item_rows` gauge shows at
    /// each scrape. A gauge, not a counter: the same rows are met again by
    /// every scrape, which is no new event.
    ///
    /// # Errors
    /// The database failed.
    pub async fn queue_stats_and_unreadable(
        &self,
        queue: Option<&str>,
    ) -> Result<(Vec<QueueStats>, u64), StoreError> {
        let sql = self.sql(
            "SELECT queue, state, COUNT(*) AS n,
                 MIN(CASE WHEN available_at > updated_at THEN available_at ELSE updated_at END) AS since,
                 {now} AS now_ms
             FROM items WHERE ($1 = '' OR queue = $1)
             GROUP BY queue, state",
        );
        let rows = sqlx::query(&sql)
            .bind(queue.unwrap_or(""))
            .fetch_all(&self.pool)
            .await?;
        let mut by_queue: BTreeMap<String, QueueStats> = BTreeMap::new();
        let mut unreadable = 0;
        if let Some(q) = queue {
            by_queue.insert(q.to_owned(), QueueStats::default());
        }
        for row in &rows {
            // Each group on its own: one that does not decode (an unknown
            // state) is left out, not every queue's gauges.
            match group_from_row(row) {
                Ok((name, state, n, age)) => {
                    let stats = by_queue.entry(name).or_default();
                    *stats.count_mut(state) = n;
                    if age.is_some() {
                        stats.oldest_open_age_ms = age;
                    }
                }
                Err(e) => {
                    // A count that does not decode either counts as one row.
                    let n = get::<i64>(row, "n")
                        .ok()
                        .and_then(|n| u64::try_from(n).ok());
                    unreadable += n.unwrap_or(1);
                    tracing::warn!(
                        queue = get::<String>(row, "queue").ok(),
                        error = %e,
                        "stats: a group of item rows cannot be read; it is left out"
                    );
                }
            }
        }
        let stats = by_queue
            .into_iter()
            .map(|(name, mut stats)| {
                stats.queue = name;
                stats
            })
            .collect();
        Ok((stats, unreadable))
    }

    /// Connections of this instance's pool: `(in use, open, maximum)`.
    pub fn pool_usage(&self) -> (u32, u32, u32) {
        let size = self.pool.size();
        let idle = u32::try_from(self.pool.num_idle()).unwrap_or(size);
        (
            size.saturating_sub(idle),
            size,
            self.pool.options().get_max_connections(),
        )
    }
}
