//! Queue gauges: items by state and the oldest open item's age, read in one
//! grouped query. `GET /v1/queues/{queue}/stats` and `GET /metrics` both come
//! from here, so the demo's panel and a Prometheus scrape agree.

use std::collections::BTreeMap;

use agentstore_protocol::lease::{ItemState, QueueStats};

use super::{get, to_u64, Store, StoreError};

impl Store {
    /// Gauges of `queue`, or of every queue that has items when `None` (sorted
    /// by name). A queue without items has all counts zero.
    ///
    /// The age is measured on the database clock from the `updated_at` of the
    /// longest-waiting open item (set when it was enqueued or last reopened).
    ///
    /// # Errors
    /// The database failed, or a row holds an unknown state.
    pub async fn queue_stats(&self, queue: Option<&str>) -> Result<Vec<QueueStats>, StoreError> {
        let sql = self.sql(
            "SELECT queue, state, COUNT(*) AS n, MIN(updated_at) AS since, {now} AS now_ms
             FROM items WHERE ($1 = '' OR queue = $1)
             GROUP BY queue, state",
        );
        let rows = sqlx::query(&sql)
            .bind(queue.unwrap_or(""))
            .fetch_all(&self.pool)
            .await?;
        let mut by_queue: BTreeMap<String, QueueStats> = BTreeMap::new();
        if let Some(q) = queue {
            by_queue.insert(q.to_owned(), QueueStats::default());
        }
        for row in &rows {
            let name: String = get(row, "queue")?;
            let state: String = get(row, "state")?;
            let state = ItemState::parse(&state)
                .ok_or_else(|| StoreError::Corrupt(format!("state {state:?}")))?;
            let stats = by_queue.entry(name).or_default();
            *stats.count_mut(state) = to_u64(get(row, "n")?, "count")?;
            if state == ItemState::Open {
                let since: i64 = get(row, "since")?;
                let now: i64 = get(row, "now_ms")?;
                // Clamped: a row written by a clock a few ms ahead is not "negative".
                stats.oldest_open_age_ms = Some(u64::try_from(now - since).unwrap_or(0));
            }
        }
        Ok(by_queue
            .into_iter()
            .map(|(name, mut stats)| {
                stats.queue = name;
                stats
            })
            .collect())
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
