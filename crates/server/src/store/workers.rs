//! Workers and their credentials: enrollment tokens, refresh tokens, access tokens.
//!
//! Single-use tokens are burnt by a conditional `UPDATE … WHERE used_at IS NULL`
//! that opens the transaction, so two concurrent uses serialize on that row and
//! exactly one sees it unused. The verifier is checked in constant time before the
//! transaction commits; a wrong verifier rolls the burn back.

use agentstore_protocol::lease::WorkerCredentials;
use agentstore_protocol::ErrorCode;
use sqlx::{Any, Transaction};

use super::{ms, Store, StoreError};
use crate::tokens::{self, ct_eq, Kind, Secret};

fn unauthorized(what: &str) -> StoreError {
    StoreError::rejected(
        ErrorCode::Unauthorized,
        format!("{what} is invalid, expired or already used"),
    )
}

impl Store {
    /// Creates a single-use enrollment token valid for `expires_in_ms` (default from
    /// [`super::Settings`]). The secret is returned once and stored hashed.
    ///
    /// # Errors
    /// The database failed.
    pub async fn create_enrollment_token(
        &self,
        expires_in_ms: Option<u64>,
    ) -> Result<(Secret, u64), StoreError> {
        let ttl = expires_in_ms.unwrap_or(self.settings.enrollment_ttl_ms);
        let cred = tokens::new_credential(Kind::Enrollment);
        let sql = self.sql(
            "INSERT INTO enrollment_tokens (selector, verifier_hash, created_at, expires_at)
             VALUES ($1, $2, {now}, {now} + $3)",
        );
        sqlx::query(&sql)
            .bind(&cred.selector)
            .bind(&cred.verifier_hash)
            .bind(ms(ttl))
            .execute(&self.pool)
            .await?;
        Ok((cred.secret, ttl))
    }

    /// Enrolls a worker with a single-use enrollment token: creates the worker,
    /// burns the token and issues credentials in ONE transaction.
    ///
    /// # Errors
    /// `unauthorized` when the token is malformed, wrong, expired or used.
    pub async fn enroll(
        &self,
        token: &str,
        name: Option<&str>,
    ) -> Result<WorkerCredentials, StoreError> {
        let presented = tokens::parse_credential(Kind::Enrollment, token)
            .ok_or_else(|| unauthorized("enrollment token"))?;
        let mut tx = self.begin_write().await?;
        let burn = self.sql(
            "UPDATE enrollment_tokens SET used_at = {now}
             WHERE selector = $1 AND used_at IS NULL AND expires_at > {now}
             RETURNING verifier_hash",
        );
        let stored: Option<(String,)> = sqlx::query_as(&burn)
            .bind(&presented.selector)
            .fetch_optional(&mut *tx)
            .await?;
        if !stored.is_some_and(|(h,)| ct_eq(&h, &presented.verifier_hash)) {
            tx.rollback().await?;
            return Err(unauthorized("enrollment token"));
        }
        let insert =
            self.sql("INSERT INTO workers (name, created_at) VALUES ($1, {now}) RETURNING id");
        let (worker_id,): (i64,) = sqlx::query_as(&insert)
            .bind(name)
            .fetch_one(&mut *tx)
            .await?;
        sqlx::query("UPDATE enrollment_tokens SET worker_id = $2 WHERE selector = $1")
            .bind(&presented.selector)
            .bind(worker_id)
            .execute(&mut *tx)
            .await?;
        let creds = self.issue(&mut tx, worker_id).await?;
        tx.commit().await?;
        Ok(creds)
    }

    /// Exchanges a refresh token for new credentials, burning it, in one
    /// transaction; a second use of the same refresh token is rejected.
    ///
    /// # Errors
    /// `unauthorized` when the token is malformed, wrong, expired or used.
    pub async fn refresh(&self, refresh_token: &str) -> Result<WorkerCredentials, StoreError> {
        let presented = tokens::parse_credential(Kind::Refresh, refresh_token)
            .ok_or_else(|| unauthorized("refresh token"))?;
        let mut tx = self.begin_write().await?;
        let burn = self.sql(
            "UPDATE refresh_tokens SET used_at = {now}
             WHERE selector = $1 AND used_at IS NULL AND expires_at > {now}
             RETURNING verifier_hash, worker_id",
        );
        let stored: Option<(String, i64)> = sqlx::query_as(&burn)
            .bind(&presented.selector)
            .fetch_optional(&mut *tx)
            .await?;
        let Some((hash, worker_id)) = stored else {
            tx.rollback().await?;
            return Err(unauthorized("refresh token"));
        };
        if !ct_eq(&hash, &presented.verifier_hash) {
            tx.rollback().await?;
            return Err(unauthorized("refresh token"));
        }
        let creds = self.issue(&mut tx, worker_id).await?;
        tx.commit().await?;
        Ok(creds)
    }

    /// The worker an access token belongs to, if it is valid and unexpired on the
    /// database clock.
    ///
    /// # Errors
    /// `unauthorized` otherwise.
    pub async fn authenticate(&self, access_token: &str) -> Result<i64, StoreError> {
        let presented = tokens::parse_credential(Kind::Access, access_token)
            .ok_or_else(|| unauthorized("access token"))?;
        let sql = self.sql(
            "SELECT verifier_hash, worker_id FROM access_tokens
             WHERE selector = $1 AND expires_at > {now}",
        );
        let row: Option<(String, i64)> = sqlx::query_as(&sql)
            .bind(&presented.selector)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some((hash, worker)) if ct_eq(&hash, &presented.verifier_hash) => Ok(worker),
            _ => Err(unauthorized("access token")),
        }
    }

    /// Deletes expired and used credentials; returns how many rows went.
    ///
    /// # Errors
    /// The database failed.
    pub async fn purge_credentials(&self) -> Result<u64, StoreError> {
        let mut n = 0;
        for table in ["access_tokens", "refresh_tokens", "enrollment_tokens"] {
            let sql = self.sql(&format!("DELETE FROM {table} WHERE expires_at <= {{now}}"));
            n += sqlx::query(&sql).execute(&self.pool).await?.rows_affected();
        }
        Ok(n)
    }

    async fn issue(
        &self,
        tx: &mut Transaction<'static, Any>,
        worker_id: i64,
    ) -> Result<WorkerCredentials, StoreError> {
        let access = tokens::new_credential(Kind::Access);
        let refresh = tokens::new_credential(Kind::Refresh);
        for (table, cred, ttl) in [
            ("access_tokens", &access, self.settings.access_ttl_ms),
            ("refresh_tokens", &refresh, self.settings.refresh_ttl_ms),
        ] {
            let sql = self.sql(&format!(
                "INSERT INTO {table} (selector, verifier_hash, worker_id, created_at, expires_at)
                 VALUES ($1, $2, $3, {{now}}, {{now}} + $4)"
            ));
            sqlx::query(&sql)
                .bind(&cred.selector)
                .bind(&cred.verifier_hash)
                .bind(worker_id)
                .bind(ms(ttl))
                .execute(&mut **tx)
                .await?;
        }
        Ok(WorkerCredentials {
            worker_id,
            access_token: access.secret.0,
            access_expires_in_ms: self.settings.access_ttl_ms,
            refresh_token: refresh.secret.0,
        })
    }
}
