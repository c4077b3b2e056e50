//! The lease server conformance suite: every behaviour below runs unchanged on
//! SQLite (`sqlite::…`) and on PostgreSQL (`postgres::…`, needs
//! `AGENTSTORE_TEST_PG_URL`; in CI its absence fails the run).

#![allow(
    clippy::disallowed_methods,
    reason = "tests read rows and seed them; the write path's rule is the server's own (clippy.toml)"
)]

mod auth;
mod backoff;
mod beacon;
mod cancel;
mod claim_race;
mod common;
mod fence;
mod input;
mod instances;
mod lease;
mod listing;
mod metrics;
mod migrate;
mod outage;
mod refusals;
mod requeue;
mod resume;
mod retention;
mod revoke;
mod roles;
mod settled;
mod unreadable;

macro_rules! conformance {
    ($($module:ident :: $name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    crate::common::run(crate::common::Kind::Sqlite, crate::$module::$name).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    crate::common::run(crate::common::Kind::Postgres, crate::$module::$name).await;
                }
            )*
        }
    };
}

conformance! {
    backoff::an_expired_item_with_a_retry_backoff_is_not_claimed_before_its_delay,
    backoff::a_released_item_with_a_retry_backoff_is_claimed_after_its_delay,
    backoff::an_item_without_a_retry_backoff_is_claimable_again_at_once,
    backoff::a_queue_whose_only_open_items_back_off_answers_no_item,
    backoff::an_enqueue_with_a_bad_retry_backoff_is_refused_400,
    backoff::a_requeued_item_is_claimable_at_once_whatever_its_backoff,
    backoff::a_backing_off_item_ages_the_queue_only_from_when_it_is_due,
    retention::the_first_reaper_pass_after_a_start_sweeps,
    input::a_payload_or_result_nests_at_most_127_deep,
    listing::a_listing_page_stays_near_its_byte_budget_when_errors_need_escaping,
    retention::settled_items_past_the_retention_are_deleted_and_nothing_else,
    retention::a_server_with_a_retention_deletes_old_settled_items_by_itself,
    retention::a_keyed_enqueue_replayed_while_retention_deletes_its_item_is_answered,
    retention::two_sweeps_of_a_backlog_the_planner_underestimates_delete_it_all,
    retention::a_sweep_failing_partway_counts_the_pages_it_deleted,
    lease::a_claim_is_atomic_and_raises_the_epoch,
    lease::every_pooled_connection_commits_durably_so_no_answered_epoch_is_reissued,
    lease::a_claim_sent_again_with_its_idempotency_key_gets_its_lease_back,
    claim_race::copies_of_one_claim_racing_take_one_item,
    claim_race::copies_of_one_claim_racing_for_the_last_open_items_are_never_told_none_is_open,
    claim_race::a_claim_key_racing_from_other_callers_takes_one_item_per_caller,
    claim_race::keyed_leases_left_doubled_by_older_code_upgrade_to_one_per_key,
    claim_race::a_late_copy_of_a_claim_never_takes_the_lease_from_a_later_copy,
    claim_race::a_late_copy_of_a_claim_after_its_lease_ended_claims_nothing,
    claim_race::racing_copies_of_a_claim_leave_no_lease_behind,
    claim_race::a_copy_older_than_one_seen_does_not_replay_the_running_lease,
    claim_race::another_senders_copy_does_not_erase_a_remembered_copy,
    claim_race::remembered_claim_attempts_are_purged_after_their_hour,
    lease::a_live_claim_is_not_reclaimed_by_any_instance_reaper_or_fresh_claim,
    lease::an_expired_claim_is_reclaimed_and_the_new_token_differs,
    lease::a_lease_expires_after_the_ttl_it_was_granted_whichever_instance_looks,
    lease::a_claim_whose_answer_cannot_be_read_hands_out_nothing_more,
    lease::a_claim_with_no_heartbeat_recorded_counts_as_expired,
    lease::a_heartbeat_past_the_ttl_but_before_takeover_renews_the_lease,
    lease::stale_heartbeat_settle_and_blocked_settle_are_claim_lost_and_change_nothing,
    lease::a_settle_sent_again_by_its_lease_is_answered_and_changes_nothing,
    lease::a_settle_sent_again_after_its_item_moved_on_is_still_a_replay,
    lease::settle_with_current_token_on_an_item_paused_elsewhere_is_state_conflict,
    lease::resume_of_a_paused_item_issues_a_new_token_and_fences_the_old_one,
    resume::a_resume_sent_again_after_it_landed_is_answered_and_changes_nothing,
    resume::two_operators_resuming_at_once_get_one_lease_and_one_replay,
    resume::a_resume_racing_a_claim_and_the_reaper_keeps_its_lease,
    requeue::an_operator_requeues_a_failed_or_blocked_item_and_nothing_else,
    requeue::a_requeued_item_failed_at_the_retry_cap_gets_its_attempts_back,
    requeue::a_settle_sent_again_after_a_requeue_answers_its_own_outcome,
    cancel::an_operator_cancels_an_item_that_has_not_ended_and_nothing_else,
    cancel::a_cancel_racing_the_holder_s_settle_has_one_winner,
    cancel::a_lease_s_other_settle_after_a_cancel_of_its_blocked_item_is_already_settled,
    cancel::a_resume_of_a_paused_item_an_operator_cancelled_is_refused_not_replayed,
    lease::a_heartbeat_racing_a_takeover_has_exactly_one_winner,
    lease::a_takeover_of_an_item_settled_after_it_was_read_changes_nothing,
    lease::a_stalled_worker_that_comes_back_is_fenced_and_the_new_attempt_is_untouched,
    lease::every_expiry_counts_an_attempt_and_the_cap_fails_the_item_with_retry_limit,
    lease::with_max_attempts_3_the_third_expiry_fails_the_item_with_retry_limit,
    lease::release_reopens_the_item_and_counts_an_attempt,
    lease::a_release_sent_again_by_its_lease_is_answered_and_changes_nothing,
    lease::a_release_after_its_leases_own_settle_landed_says_so_and_changes_nothing,
    lease::a_release_racing_its_leases_own_settle_is_answered_with_that_settle,
    settled::a_settle_after_its_leases_own_settle_landed_is_already_settled_and_changes_nothing,
    settled::a_settle_after_its_leases_own_settle_landed_and_the_item_moved_on_is_already_settled,
    settled::an_already_settled_answer_is_409_and_names_the_landed_state,
    settled::settles_after_their_leases_own_settle_landed_are_already_settled_in_one_batch,
    settled::a_settle_replayed_after_its_item_moved_on_answers_that_settle_not_the_later_lease,
    settled::settles_made_in_one_statement_are_replayed_with_their_own_epoch_and_attempts,
    lease::an_item_is_redelivered_at_most_five_times_after_its_first_delivery,
    lease::lease_expiry_is_measured_only_on_the_database_clock,
    lease::concurrent_claims_and_settles_each_keep_their_own_outcome,
    fence::a_batch_of_failed_heartbeats_is_classified_in_one_statement,
    fence::a_batch_naming_rows_its_caller_does_not_hold_locks_none_of_them,
    listing::a_listing_page_stops_at_its_byte_budget_and_pages_return_payloads_byte_for_byte,
    listing::a_state_filtered_listing_skips_no_item_that_stays_in_the_state,
    listing::a_listing_with_limit_zero_is_refused_not_answered_as_an_empty_last_page,
    listing::a_queue_tail_never_misses_an_item_committed_out_of_order,
    beacon::a_tokenless_release_of_a_missing_item_is_answered_as_a_wrong_token,
    beacon::tokenless_releases_past_the_auth_rate_are_refused_before_the_database,
    auth::an_enrollment_token_used_twice_concurrently_enrolls_exactly_one_worker,
    auth::a_refresh_token_used_twice_leaves_exactly_one_valid_pair,
    auth::a_lost_enrollment_or_refresh_answer_can_be_sent_again,
    auth::a_late_copy_of_an_enrollment_or_refresh_never_revokes_what_a_later_copy_issued,
    auth::remembered_token_attempts_are_purged_with_their_token,
    auth::a_refresh_token_reused_after_the_grace_revokes_the_worker_whatever_attempt_number_came_first,
    auth::an_enrollment_token_reused_after_the_grace_revokes_the_worker_whatever_attempt_number_came_first,
    auth::a_replayed_token_is_detected_when_its_holder_comes_back,
    auth::a_revoked_access_token_is_refused_at_once_though_it_was_just_verified,
    auth::a_wrong_verifier_neither_enrolls_nor_burns_the_token,
    auth::access_tokens_expire_on_the_database_clock,
    auth::random_and_forged_tokens_open_no_write_transaction,
    auth::a_flood_of_random_tokens_is_refused_while_every_heartbeat_is_answered,
    migrate::an_older_schema_upgrades_in_place_and_keeps_its_rows,
    migrate::columns_added_by_a_later_edit_of_a_recorded_migration_are_added_at_start,
    migrate::a_database_migrated_by_a_newer_server_is_refused_at_start,
    migrate::running_migrations_twice_is_a_no_op,
    migrate::concurrent_starts_apply_each_migration_exactly_once,
    migrate::readiness_is_503_while_a_migration_is_not_recorded,
    unreadable::an_unreadable_running_row_does_not_stop_the_reaper_taking_over_the_others,
    unreadable::an_unreadable_row_is_left_out_of_listings_and_gauges_and_the_rest_is_answered,
    unreadable::negative_retry_counts_left_by_older_migrations_are_clamped_to_zero,
    unreadable::ids_and_epochs_never_pass_the_largest_safe_integer,
    unreadable::a_claim_fails_an_unreadable_row_and_answers_the_next_readable_item,
    unreadable::a_settle_or_release_of_an_unreadable_row_is_answered_and_so_is_its_retry,
    unreadable::a_resume_of_an_unreadable_row_fails_it_and_is_answered_and_so_is_its_retry,
    unreadable::a_pause_of_an_unreadable_row_is_answered_and_so_is_its_retry,
    unreadable::a_lease_whose_stored_ttl_does_not_decode_is_renewed_kept_by_the_reaper_and_releasable,
    unreadable::a_release_of_a_lease_whose_epoch_does_not_decode_fails_the_item_once,
    unreadable::a_read_of_an_unreadable_row_is_answered_to_those_who_may_read_it,
    unreadable::an_enrolment_whose_stored_scope_does_not_decode_writes_nothing,
    instances::two_instances_with_eight_claimers_settle_every_item_exactly_once,
    revoke::an_admin_revoke_refuses_every_credential_of_the_worker_at_once,
    revoke::revoking_needs_the_admin_and_a_known_id,
    revoke::an_unused_enrollment_token_revoked_by_the_admin_enrolls_nothing,
    revoke::an_enrollment_racing_the_revoke_of_its_token_ends_one_way,
    roles::every_endpoint_allows_exactly_its_roles_and_a_refusal_changes_nothing,
    roles::a_refused_caller_is_refused_whatever_its_body,
    refusals::a_refusal_reaches_a_client_that_sent_a_large_body,
    refusals::an_answer_to_a_body_over_the_limit_reaches_the_client,
    roles::a_worker_enrolled_for_one_queue_claims_there_and_nowhere_else,
    roles::an_enrolled_caller_cannot_tell_a_missing_item_from_one_it_may_not_touch,
    input::out_of_range_numbers_are_400_before_they_reach_sql,
    input::bodies_that_are_not_objects_of_the_documented_fields_are_refused,
    input::json_no_client_can_read_back_is_refused_in_payloads_and_results,
    input::an_enqueue_giving_both_max_redeliveries_and_max_attempts_is_refused,
    input::an_enqueue_max_attempts_out_of_1_to_1001_is_refused_naming_the_range,
    input::dot_segment_queue_names_are_refused,
    input::an_enqueue_sent_again_with_its_idempotency_key_adds_one_item,
    input::an_idempotency_key_is_scoped_to_the_producer_that_sent_it,
    input::a_failure_report_containing_nul_is_kept_and_the_item_leaves_running,
    input::framework_answers_are_code_and_message_too,
    input::a_batched_heartbeat_entry_with_a_non_positive_id_is_bad_request_as_alone,
    input::a_connection_closed_under_the_server_is_a_503_and_then_replaced,
    input::generated_requests_never_get_a_5xx_and_a_refusal_changes_nothing,
    metrics::a_scrape_counts_exactly_what_a_scripted_workload_did,
    metrics::metrics_listen_serves_metrics_without_a_token_only_there,
    metrics::concurrent_scrapes_each_report_every_queue_gauge,
    metrics::a_scrape_answers_when_the_queue_gauges_cannot_be_read,
    metrics::a_scrape_overlapping_a_read_in_flight_shares_it,
    metrics::a_claim_and_a_settle_whose_client_went_away_are_counted_once_committed,
    metrics::an_enqueue_pause_or_resume_whose_client_went_away_is_counted_once_committed,
    metrics::a_settle_whose_answer_cannot_be_read_is_counted_and_not_a_replay,
    metrics::per_queue_series_are_bounded_and_the_rest_summed,
    metrics::empty_polls_of_unknown_queues_take_no_queue_series,
    metrics::every_answer_is_counted_by_route_and_code_and_every_enqueue_by_queue,
    outage::a_row_locked_by_a_stuck_session_is_a_bounded_503_and_stalls_nothing_else,
    outage::an_expired_lease_locked_by_another_session_does_not_stop_the_reaper,
    outage::a_stop_ends_though_the_reaper_waits_on_a_locked_row,
    outage::a_backend_terminated_mid_request_is_a_503_and_the_next_request_is_served,
    outage::a_stop_ends_though_a_statement_of_a_request_gone_stays_blocked,
    outage::a_stop_waits_for_a_statement_of_a_request_gone_to_end,
    outage::keyed_claims_behind_a_locked_open_item_wait_out_one_lock_timeout_not_one_each,
    outage::settles_sharing_a_statement_with_a_locked_row_are_answered_while_it_stays_locked,
    outage::a_batched_heartbeat_renews_the_leases_not_locked_at_once,
    outage::sweeps_leave_a_locked_row_for_later_and_delete_the_rest,
    outage::a_settle_waiting_for_a_locked_row_holds_up_no_other_settle,
    outage::a_write_refused_by_a_read_only_database_is_a_503_and_then_served,
    outage::a_canceled_statement_is_a_503_and_the_next_request_is_served,
    outage::a_keyed_claim_waiting_for_a_locked_item_holds_up_no_other_claim,
    outage::calls_passed_over_for_locked_rows_never_hold_the_pool_past_one_lock_timeout,
}
