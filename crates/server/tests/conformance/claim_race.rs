//! Copies of one keyed claim racing each other (a client's retry arriving
//! while the first copy is still being answered, a browser sending the POST
//! again), on one instance or several.

use agentstore_protocol::lease::SettleState;
use agentstore_protocol::ErrorCode;
use agentstore_server::store::{Backend, Claimed, MIGRATIONS};
use agentstore_server::{Attempt, Store};
use serde_json::{json, Value};

use crate::common::{at_once, http_server, ttl, Kind, TestDb, ADMIN};

const LONG: u64 = 60_000;

/// Request-Attempt number `n` of `sender`.
fn at(sender: &str, n: i64) -> Attempt {
    Attempt {
        sender: sender.to_owned(),
        n,
    }
}

/// The ids of `queue`'s items in `state`, oldest first.
async fn ids_in(store: &Store, queue: &str, state: &str) -> Vec<i64> {
    ids_where(store, "state = $2", queue, state).await
}

/// The ids of the running items of `queue` that hold claim key `key`.
async fn keyed(store: &Store, queue: &str, key: &str) -> Vec<i64> {
    ids_where(store, "claim_key = $2 AND state = 'running'", queue, key).await
}

/// The ids of `queue`'s items matching `cond` (whose `$2` is `arg`), oldest first.
async fn ids_where(store: &Store, cond: &str, queue: &str, arg: &str) -> Vec<i64> {
    let sql = format!("SELECT id FROM items WHERE queue = $1 AND {cond} ORDER BY id");
    sqlx::query_as::<_, (i64,)>(&sql)
        .bind(queue)
        .bind(arg)
        .fetch_all(store.pool())
        .await
        .unwrap()
        .into_iter()
        .map(|(id,)| id)
        .collect()
}

/// Checks the answers of copies of one claim: all name one item, claimed
/// once (no attempt ended), exactly one copy not a replay, each answered
/// under an epoch of its own (1 for the claim, the next for each replay:
/// every token answered is a fencing token of its own), and exactly one
/// of the tokens answered, the one of the highest epoch, still holds the
/// lease (each replay rotates it, as a replay sent after the first answer
/// does). Returns the item.
async fn one_lease(
    store: &Store,
    copies: &[(Claimed, bool)],
    worker: Option<i64>,
    what: &str,
) -> i64 {
    let id = copies[0].0.item.id;
    for (c, _) in copies {
        assert_eq!(
            (c.item.id, c.item.epoch, c.item.attempts),
            (id, c.lease.epoch, 0),
            "{what}: every copy is answered with the one lease"
        );
    }
    let mut epochs: Vec<u64> = copies.iter().map(|(c, _)| c.lease.epoch).collect();
    epochs.sort_unstable();
    assert_eq!(
        epochs,
        (1..=copies.len() as u64).collect::<Vec<_>>(),
        "{what}: one epoch per token answered"
    );
    assert_eq!(
        copies.iter().filter(|(_, replayed)| !replayed).count(),
        1,
        "{what}: the copies after the first are replays"
    );
    let mut held = Vec::new();
    for (c, _) in copies {
        if store.heartbeat(id, &c.lease.token, worker).await.is_ok() {
            held.push(c.lease.epoch);
        }
    }
    assert_eq!(
        held,
        vec![copies.len() as u64],
        "{what}: the last token answered, of the highest epoch, holds the lease"
    );
    id
}

/// Copies of one claim (same `Idempotency-Key`, queue and caller) fired at
/// once, split over two instances and mixed with claims under other keys
/// and none, many rounds: the copies take ONE item between them and each is
/// answered with its lease (`201`, the copies after the first with
/// `Idempotent-Replayed: true`, the same item under the next epoch); the other claims
/// get an item each, and the rest stay open. Over HTTP too (the admin
/// token). Before, the key's index was not unique and each copy could take
/// an item, the extra ones running under tokens nobody held until their TTL
/// ran out, an attempt spent.
pub async fn copies_of_one_claim_racing_take_one_item(db: TestDb) {
    const ROUNDS: usize = 24;
    const COPIES: usize = 8;
    const OTHERS: usize = 8;
    const SPARE: usize = 2;
    let stores = [db.store(ttl(LONG)).await, db.store(ttl(LONG)).await];
    for round in 0..ROUNDS {
        let queue = format!("race{round}");
        for n in 0..COPIES + OTHERS + SPARE {
            stores[0].enqueue(&queue, &json!(n), None).await.unwrap();
        }
        let key = format!("copy-{round}");
        let answers = at_once(COPIES + OTHERS, |k| {
            let store = stores[k % 2].clone();
            let (queue, copy) = (queue.clone(), key.clone());
            async move {
                // The copies, then claims without a key and with keys of their own.
                let key = match k {
                    k if k < COPIES => Some(copy),
                    k if k % 2 == 0 => None,
                    k => Some(format!("other-{k}")),
                };
                store.claim_once(&queue, Some(7), key.as_deref()).await
            }
        })
        .await;
        let answers: Vec<(Claimed, bool)> = answers
            .into_iter()
            .map(|a| a.unwrap().expect("an item for every claim"))
            .collect();
        let (copies, others) = answers.split_at(COPIES);
        let what = format!("round {round}");
        let id = one_lease(&stores[0], copies, Some(7), &what).await;
        assert!(others.iter().all(|(_, replayed)| !replayed), "{what}");
        let mut taken: Vec<i64> = others.iter().map(|(c, _)| c.item.id).collect();
        taken.push(id);
        taken.sort_unstable();
        taken.dedup();
        assert_eq!(taken.len(), OTHERS + 1, "{what}: an item per claim");
        assert_eq!(ids_in(&stores[0], &queue, "running").await, taken, "{what}");
        assert_eq!(
            ids_in(&stores[0], &queue, "open").await.len(),
            COPIES + SPARE - 1,
            "{what}: the other items stay open"
        );
        assert_eq!(keyed(&stores[0], &queue, &key).await, vec![id], "{what}");
    }

    // Over HTTP: a browser sending its POST again.
    let server = http_server(&db).await;
    let http = reqwest::Client::new();
    for round in 0..5 {
        let queue = format!("hrace{round}");
        for _ in 0..COPIES + SPARE {
            crate::common::enqueue_over_http(&http, &server.url(), &queue).await;
        }
        let key = format!("http-{round}");
        let answers = at_once(COPIES, |_| {
            let req = http
                .post(format!("{}/v1/queues/{queue}/claims", server.url()))
                .bearer_auth(ADMIN)
                .header("Idempotency-Key", key.as_str());
            async move {
                let resp = req.send().await.unwrap();
                let replayed = resp
                    .headers()
                    .get("idempotent-replayed")
                    .is_some_and(|v| v == "true");
                (
                    resp.status().as_u16(),
                    replayed,
                    resp.json::<Value>().await.unwrap(),
                )
            }
        })
        .await;
        let what = format!("http round {round}");
        assert!(answers.iter().all(|(s, _, _)| *s == 201), "{what}");
        assert_eq!(answers.iter().filter(|(_, r, _)| !r).count(), 1, "{what}");
        let item = &answers[0].2["item"];
        let mut epochs = Vec::new();
        for (_, _, b) in &answers {
            assert_eq!(&b["item"]["id"], &item["id"], "{what}");
            epochs.push(b["lease"]["epoch"].as_u64().unwrap());
        }
        epochs.sort_unstable();
        assert_eq!(
            epochs,
            (1..=answers.len() as u64).collect::<Vec<_>>(),
            "{what}: one epoch per token answered"
        );
        let store = server.store();
        assert_eq!(
            keyed(store, &queue, &key).await,
            vec![item["id"].as_i64().unwrap()],
            "{what}"
        );
        assert_eq!(
            ids_in(store, &queue, "open").await.len(),
            COPIES + SPARE - 1,
            "{what}"
        );
    }
    server.stop().await.unwrap();
}

/// Copies of one claim fired at once, split over two instances, for the
/// ONLY open item (and, in other rounds, with one spare item and no other
/// claimant): every copy is answered with the one lease the first took,
/// never `None` ("nothing open", `204`). Before, a copy that looked for
/// the key's lease before the first copy committed, then found every open
/// item taken (by that copy, or locked by a sibling on another PostgreSQL
/// instance that was waiting on the key's unique index), was told nothing
/// was open, and the lease ran under a token nobody held until its TTL.
pub async fn copies_of_one_claim_racing_for_the_last_open_items_are_never_told_none_is_open(
    db: TestDb,
) {
    const ROUNDS: usize = 30;
    const COPIES: usize = 8;
    let stores = [db.store(ttl(LONG)).await, db.store(ttl(LONG)).await];
    for round in 0..ROUNDS {
        let items = 1 + round % 2;
        let queue = format!("last{round}");
        for n in 0..items {
            stores[0].enqueue(&queue, &json!(n), None).await.unwrap();
        }
        let key = format!("only-{round}");
        let answers = at_once(COPIES, |k| {
            let store = stores[k % 2].clone();
            let (queue, key) = (queue.clone(), key.clone());
            async move { store.claim_once(&queue, Some(7), Some(&key)).await }
        })
        .await;
        let what = format!("round {round} ({items} open)");
        let answers: Vec<(Claimed, bool)> = answers
            .into_iter()
            .map(|a| {
                a.unwrap()
                    .unwrap_or_else(|| panic!("{what}: a copy was told nothing is open"))
            })
            .collect();
        let id = one_lease(&stores[0], &answers, Some(7), &what).await;
        assert_eq!(keyed(&stores[0], &queue, &key).await, vec![id], "{what}");
        assert_eq!(
            ids_in(&stores[0], &queue, "open").await.len(),
            items - 1,
            "{what}: the spare item stays open"
        );
    }
}

/// One `Idempotency-Key` sent at once by three callers (two workers and the
/// admin token), three copies each, over two instances, many rounds: each
/// caller's copies take one item of their own and are answered with it; no
/// caller is blocked by another's use of the key or handed its lease (keys
/// are random per claim, so another caller's is a collision on purpose).
pub async fn a_claim_key_racing_from_other_callers_takes_one_item_per_caller(db: TestDb) {
    const ROUNDS: usize = 20;
    const CALLERS: [Option<i64>; 3] = [Some(7), Some(8), None];
    const EACH: usize = 3;
    let stores = [db.store(ttl(LONG)).await, db.store(ttl(LONG)).await];
    for round in 0..ROUNDS {
        let queue = format!("shared{round}");
        for n in 0..CALLERS.len() * EACH {
            stores[0].enqueue(&queue, &json!(n), None).await.unwrap();
        }
        let answers = at_once(CALLERS.len() * EACH, |k| {
            let store = stores[k % 2].clone();
            let queue = queue.clone();
            async move {
                let worker = CALLERS[k % CALLERS.len()];
                (
                    worker,
                    store.claim_once(&queue, worker, Some("shared")).await,
                )
            }
        })
        .await;
        let mut answers: Vec<(Option<i64>, (Claimed, bool))> = answers
            .into_iter()
            .map(|(w, a)| (w, a.expect("not blocked").expect("an item")))
            .collect();
        let mut ids = Vec::new();
        for caller in CALLERS {
            let copies: Vec<(Claimed, bool)>;
            (copies, answers) = {
                let (mine, rest): (Vec<_>, Vec<_>) =
                    answers.into_iter().partition(|(w, _)| *w == caller);
                (mine.into_iter().map(|(_, c)| c).collect(), rest)
            };
            assert_eq!(copies.len(), EACH);
            let what = format!("round {round}, caller {caller:?}");
            ids.push(one_lease(&stores[0], &copies, caller, &what).await);
        }
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(
            ids.len(),
            CALLERS.len(),
            "round {round}: an item per caller"
        );
        assert_eq!(
            keyed(&stores[0], &queue, "shared").await,
            ids,
            "round {round}"
        );
        assert_eq!(
            ids_in(&stores[0], &queue, "open").await.len(),
            CALLERS.len() * (EACH - 1),
            "round {round}"
        );
    }
}

/// A database upgraded from a schema whose claim-key index was not unique
/// (version 14), holding running leases that racing copies of one claim
/// took under one key: the upgrade keeps the key on the oldest lease of
/// each (queue, key, caller), which the next copy gets back, clears it on
/// the others (they run until settled or reaped, as before), and claims
/// work on.
pub async fn keyed_leases_left_doubled_by_older_code_upgrade_to_one_per_key(db: TestDb) {
    let b = match db.kind {
        Kind::Sqlite => Backend::Sqlite,
        Kind::Postgres => Backend::Postgres,
    };
    let raw = db.raw_pool().await;
    sqlx::query(
        "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL,
             applied_at BIGINT NOT NULL)",
    )
    .execute(&raw)
    .await
    .unwrap();
    for m in MIGRATIONS.iter().filter(|m| m.version <= 14) {
        for stmt in b.sql(m.sql).split(';').filter(|s| !s.trim().is_empty()) {
            sqlx::query(stmt).execute(&raw).await.unwrap();
        }
        sqlx::query("INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, 0)")
            .bind(m.version)
            .bind(m.name)
            .execute(&raw)
            .await
            .unwrap();
    }
    // (worker, key) of each running row, in id order; then one open item.
    let rows: [(Option<i64>, &str); 7] = [
        (Some(7), "k"),
        (Some(7), "k"),
        (Some(8), "k"),
        (Some(7), "k"),
        (None, "k"),
        (None, "k"),
        (Some(7), "j"),
    ];
    for (worker, key) in rows {
        sqlx::query(&b.sql(
            "INSERT INTO items (queue, state, payload, attempts, max_redeliveries, epoch,
                 token_hash, worker_id, claim_key, claimed_at, heartbeat_at, lease_ttl_ms,
                 created_at, updated_at)
             VALUES ('q', 'running', '1', 0, 5, 1, 'h', $1, $2, {now}, {now}, 60000, 0, 0)",
        ))
        .bind(worker)
        .bind(key)
        .execute(&raw)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO items (queue, state, payload, attempts, max_redeliveries, epoch,
             created_at, updated_at) VALUES ('q', 'open', '2', 0, 5, 0, 0, 0)",
    )
    .execute(&raw)
    .await
    .unwrap();
    let ids: Vec<i64> = sqlx::query_as::<_, (i64,)>("SELECT id FROM items ORDER BY id")
        .fetch_all(&raw)
        .await
        .unwrap()
        .into_iter()
        .map(|(id,)| id)
        .collect();

    let store = db.store(ttl(LONG)).await; // migrates on connect
    let kept: Vec<(i64, Option<String>)> =
        sqlx::query_as("SELECT id, claim_key FROM items ORDER BY id")
            .fetch_all(store.pool())
            .await
            .unwrap();
    let key = |k: &str| Some(String::from(k));
    assert_eq!(
        kept,
        vec![
            (ids[0], key("k")),
            (ids[1], None),
            (ids[2], key("k")),
            (ids[3], None),
            (ids[4], key("k")),
            (ids[5], None),
            (ids[6], key("j")),
            (ids[7], None),
        ],
        "the oldest lease of each (queue, key, caller) keeps the key"
    );
    for (worker, id) in [(Some(7), ids[0]), (Some(8), ids[2]), (None, ids[4])] {
        let (c, replayed) = store
            .claim_once("q", worker, Some("k"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((c.item.id, replayed), (id, true), "{worker:?}");
    }
    let (c, replayed) = store
        .claim_once("q", Some(9), Some("k"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((c.item.id, replayed), (ids[7], false));
    assert_eq!(
        agentstore_server::store::pending(&store).await.unwrap(),
        0,
        "every migration recorded"
    );
    raw.close().await;
}

/// A copy of a keyed claim that reaches the server after a later copy of
/// it was answered (its request held up in the network while the client
/// gave up on it and sent the key again, with a higher `Request-Attempt`)
/// changes nothing: `409 conflict`, and the token the later copy handed
/// out still holds the lease. Before, the late copy was answered as a
/// replay and rotated the token: the client's lease was lost at its next
/// heartbeat and the item ran on under a token nobody held until its TTL
/// ran out. A copy with the same attempt (the same request resent, as a
/// browser resends a POST on a reset socket) or a higher one still
/// replays, and so does any copy of a claim sent without the header or by
/// another sender (a reloaded page numbers its requests from 1 again).
/// Raced too: copies 1..=8 of one key fired at once over two instances,
/// many rounds: one item is taken and copy 8's token holds it. Over HTTP,
/// a malformed header is `400 validation`.
pub async fn a_late_copy_of_a_claim_never_takes_the_lease_from_a_later_copy(db: TestDb) {
    let store = db.store(ttl(LONG)).await;
    for n in 0..3 {
        store.enqueue("late", &json!(n), None).await.unwrap();
    }
    // Copies numbered n by sender "page" (or sent without the header).
    let copy = |n: Option<i64>| {
        let store = store.clone();
        async move {
            let attempt = n.map(|n| at("page", n));
            store
                .claim_attempt("late", Some(7), Some("k"), attempt.as_ref())
                .await
        }
    };
    // Copy 2 gets there first and claims; copy 1 arrives after it.
    let (second, replayed) = copy(Some(2)).await.unwrap().expect("claimed");
    assert!(!replayed);
    let late = copy(Some(1)).await;
    assert_eq!(
        late.err().and_then(|e| e.code()),
        Some(ErrorCode::Conflict),
        "the late copy is refused"
    );
    store
        .heartbeat(second.item.id, &second.lease.token, Some(7))
        .await
        .expect("copy 2's token still holds the lease");
    assert_eq!(
        ids_in(&store, "late", "running").await,
        vec![second.item.id]
    );
    // The same attempt again (a resent request) and a later one replay.
    let (same, replayed) = copy(Some(2)).await.unwrap().unwrap();
    assert!(replayed);
    assert_eq!(same.item.id, second.item.id);
    let (third, replayed) = copy(Some(3)).await.unwrap().unwrap();
    assert!(replayed);
    assert_eq!(
        (third.item.id, third.item.epoch),
        (second.item.id, 3),
        "claimed at 1, replayed at 2 and 3; the refused copy took none"
    );
    assert_eq!(
        store
            .heartbeat(second.item.id, &same.lease.token, Some(7))
            .await
            .err()
            .and_then(|e| e.code()),
        Some(ErrorCode::ClaimLost),
        "copy 3 rotated the token"
    );
    assert!(copy(Some(2)).await.is_err(), "copy 2 is now older than 3");
    store
        .heartbeat(third.item.id, &third.lease.token, Some(7))
        .await
        .expect("copy 3's token holds the lease");
    assert!(
        crate::common::render(&store)
            .await
            .unwrap()
            .lines()
            .any(|l| l == "agentstore_claim_late_copies_total 2"),
        "the refused copies are counted"
    );
    // Without the header every copy replays, as before; so does a copy of
    // another sender (numbers of two senders are not ordered). The first
    // sender's numbers are still remembered after it: its copy 1 stays
    // late.
    let (bare, replayed) = copy(None).await.unwrap().unwrap();
    assert!(replayed);
    assert_eq!(bare.item.id, second.item.id);
    let (other, replayed) = store
        .claim_attempt("late", Some(7), Some("k"), Some(&at("reloaded", 1)))
        .await
        .unwrap()
        .unwrap();
    assert!(replayed);
    assert_eq!(other.item.id, second.item.id);
    assert_eq!(
        copy(Some(1)).await.err().and_then(|e| e.code()),
        Some(ErrorCode::Conflict)
    );
    assert_eq!(ids_in(&store, "late", "open").await.len(), 2);
    assert_eq!(
        ids_in(&store, "late", "running").await,
        vec![second.item.id]
    );

    // Raced: copies 1..=8 at once over two instances.
    const ROUNDS: usize = 16;
    const COPIES: usize = 8;
    let stores = [db.store(ttl(LONG)).await, db.store(ttl(LONG)).await];
    for round in 0..ROUNDS {
        let queue = format!("laterace{round}");
        for n in 0..COPIES {
            stores[0].enqueue(&queue, &json!(n), None).await.unwrap();
        }
        let answers = at_once(COPIES, |k| {
            let store = stores[k % 2].clone();
            let queue = queue.clone();
            async move {
                store
                    .claim_attempt(&queue, Some(7), Some("race"), Some(&at("s", k as i64 + 1)))
                    .await
            }
        })
        .await;
        let what = format!("round {round}");
        let mut ids = Vec::new();
        for a in &answers {
            match a {
                Ok(Some((c, _))) => ids.push(c.item.id),
                Ok(None) => panic!("{what}: an item was open"),
                Err(e) => assert_eq!(e.code(), Some(ErrorCode::Conflict), "{what}"),
            }
        }
        ids.dedup();
        assert_eq!(ids.len(), 1, "{what}: one item between the copies");
        assert_eq!(ids_in(&stores[0], &queue, "running").await, ids, "{what}");
        let (last, _) = answers[COPIES - 1]
            .as_ref()
            .ok()
            .and_then(|a| a.as_ref())
            .expect("the last copy is never refused");
        stores[0]
            .heartbeat(last.item.id, &last.lease.token, Some(7))
            .await
            .unwrap_or_else(|e| panic!("{what}: the last copy's token holds the lease: {e}"));
    }

    // Over HTTP.
    let server = http_server(&db).await;
    let http = reqwest::Client::new();
    crate::common::enqueue_over_http(&http, &server.url(), "hlate").await;
    let claim = |attempt: &'static str| {
        let req = http
            .post(format!("{}/v1/queues/hlate/claims", server.url()))
            .bearer_auth(ADMIN)
            .header("Idempotency-Key", "h")
            .header("Request-Attempt", attempt);
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap_or_default();
            (status, body["code"].as_str().map(str::to_owned))
        }
    };
    assert_eq!(claim("p1.5").await.0, 201);
    assert_eq!(claim("p1.4").await, (409, Some("conflict".to_owned())));
    assert_eq!(claim("p1.5").await.0, 201);
    assert_eq!(claim("p2.1").await.0, 201, "another sender");
    assert_eq!(claim("a-Z_9.p.0").await.0, 400);
    for bad in [
        "",
        "5",
        "x",
        ".5",
        "p.",
        "p.-1",
        "p.1.5",
        "p q.1",
        "p.9007199254740992",
        "p.00000000000000001",
    ] {
        assert_eq!(
            claim(bad).await,
            (400, Some("validation".to_owned())),
            "Request-Attempt {bad:?}"
        );
    }
    server.stop().await.unwrap();
}

/// A copy of a keyed claim held up in the network that arrives after a
/// later copy was answered AND that copy's lease ended (settled, released,
/// reaped, paused) claims nothing: `409 conflict`, as while the lease ran.
/// Before, every end of a lease cleared the key, so the copy found no lease
/// under it and claimed a second item under a token nobody received: the
/// item ran for the TTL and then spent an attempt (with no redeliveries
/// left, it failed `retry_limit` unseen). The late copy arrives at another
/// instance. A later copy of the key (a higher number) still claims as a
/// new claim, and so does one of another sender.
pub async fn a_late_copy_of_a_claim_after_its_lease_ended_claims_nothing(db: TestDb) {
    let short = db.store(ttl(50)).await;
    let other = db.store(ttl(LONG)).await;
    for ending in ["done", "released", "reaped", "paused"] {
        let queue = format!("ended-{ending}");
        let x = short.enqueue(&queue, &json!("x"), None).await.unwrap().id;
        let y = short.enqueue(&queue, &json!("y"), None).await.unwrap().id;
        short.enqueue(&queue, &json!("z"), None).await.unwrap();
        let (c, replayed) = short
            .claim_attempt(&queue, Some(7), Some("k"), Some(&at("s", 2)))
            .await
            .unwrap()
            .expect("claimed");
        assert_eq!((c.item.id, replayed), (x, false), "{ending}");
        match ending {
            "done" => {
                short
                    .settle(x, &c.lease.token, Some(7), SettleState::Done, None, None)
                    .await
                    .unwrap();
            }
            "released" => {
                short.release(x, &c.lease.token, Some(7)).await.unwrap();
            }
            "reaped" => {
                crate::common::sleep_ms(150).await;
                assert_eq!(short.reap().await.unwrap(), (1, 0), "{ending}");
            }
            _ => {
                short.pause(x).await.unwrap();
            }
        }
        let before = (
            ids_in(&short, &queue, "open").await,
            ids_in(&short, &queue, "running").await,
        );
        let late = other
            .claim_attempt(&queue, Some(7), Some("k"), Some(&at("s", 1)))
            .await;
        assert_eq!(
            late.err().and_then(|e| e.code()),
            Some(ErrorCode::Conflict),
            "{ending}: the late copy is refused"
        );
        assert_eq!(
            (
                ids_in(&short, &queue, "open").await,
                ids_in(&short, &queue, "running").await
            ),
            before,
            "{ending}: the late copy changed nothing"
        );
        assert!(before.0.contains(&y), "{ending}: y is still open");
        // A later copy is a new claim.
        let (next, replayed) = other
            .claim_attempt(&queue, Some(7), Some("k"), Some(&at("s", 3)))
            .await
            .unwrap()
            .expect("a later copy claims");
        assert!(!replayed, "{ending}");
        assert_eq!(next.item.id, before.0[0], "{ending}: the oldest open item");
        other
            .settle(
                next.item.id,
                &next.lease.token,
                Some(7),
                SettleState::Done,
                None,
                None,
            )
            .await
            .unwrap();
        // Now copy 2 is late as well, and another sender's copy is not.
        assert!(other
            .claim_attempt(&queue, Some(7), Some("k"), Some(&at("s", 2)))
            .await
            .is_err());
        let (fresh, _) = other
            .claim_attempt(&queue, Some(7), Some("k"), Some(&at("reloaded", 1)))
            .await
            .unwrap()
            .expect("another sender's copy claims");
        other
            .settle(
                fresh.item.id,
                &fresh.lease.token,
                Some(7),
                SettleState::Done,
                None,
                None,
            )
            .await
            .unwrap();
    }
}

/// Two copies of one keyed claim racing over two instances, the later one
/// (copy 2) settled as soon as it is answered: whatever the order, no
/// lease is left running under a token nobody holds, and one item is done.
/// Copy 1 either came first (copy 2 replayed its lease), or is refused: by
/// the lookup before it claims, by the key's running lease, or, when it
/// claimed after copy 2's lease had ended, by the upsert that remembers it
/// (its claim undone, the item open again with no attempt counted).
pub async fn racing_copies_of_a_claim_leave_no_lease_behind(db: TestDb) {
    const ROUNDS: usize = 40;
    let stores = [db.store(ttl(LONG)).await, db.store(ttl(LONG)).await];
    for round in 0..ROUNDS {
        let queue = format!("endrace{round}");
        for n in 0..2 {
            stores[0].enqueue(&queue, &json!(n), None).await.unwrap();
        }
        let answers = at_once(2, |k| {
            let store = stores[k].clone();
            let queue = queue.clone();
            async move {
                let claimed = store
                    .claim_attempt(&queue, Some(7), Some("k"), Some(&at("s", k as i64 + 1)))
                    .await;
                if k == 1 {
                    let (c, _) = claimed.as_ref().unwrap().as_ref().expect("copy 2 claims");
                    store
                        .settle(
                            c.item.id,
                            &c.lease.token,
                            Some(7),
                            SettleState::Done,
                            None,
                            None,
                        )
                        .await
                        .unwrap();
                }
                claimed.map(|c| c.map(|(c, replayed)| (c.item.id, replayed)))
            }
        })
        .await;
        let what = format!("round {round}");
        assert!(
            ids_in(&stores[0], &queue, "running").await.is_empty(),
            "{what}: no lease left behind ({answers:?})"
        );
        assert_eq!(ids_in(&stores[0], &queue, "done").await.len(), 1, "{what}");
        assert_eq!(ids_in(&stores[0], &queue, "open").await.len(), 1, "{what}");
        if let Err(e) = &answers[0] {
            assert_eq!(e.code(), Some(ErrorCode::Conflict), "{what}");
        }
    }
}

/// The interleaving that left a lease running under a token nobody held:
/// copy 1 of a key claimed X, then copy 3 (on another instance) was seen
/// (stood in for here by raising the remembered number to 3 with SQL, as
/// copy 3's write does once it claimed), then copy 2 arrived. Copy 2 used
/// to find X running with attempt 1, ignore the remembered 3 and replay X
/// (its remembering write refused, but a replay was answered anyway: `201`
/// to nobody, X's token rotated so copy 1's undo fenced nothing). Copy 2 is
/// refused before it claims and X's token is untouched (copy 1's undo,
/// fenced on it, still takes effect).
pub async fn a_copy_older_than_one_seen_does_not_replay_the_running_lease(db: TestDb) {
    let a = db.store(ttl(LONG)).await;
    let b = db.store(ttl(LONG)).await;
    let queue = "late-replay";
    let x = a.enqueue(queue, &json!("x"), None).await.unwrap().id;
    a.enqueue(queue, &json!("y"), None).await.unwrap();
    let (c1, replayed) = a
        .claim_attempt(queue, Some(7), Some("k"), Some(&at("s", 1)))
        .await
        .unwrap()
        .expect("copy 1 claims");
    assert_eq!((c1.item.id, replayed), (x, false));
    let raised = sqlx::query(
        "UPDATE claim_keys SET attempt = 3
         WHERE queue = $1 AND caller = 7 AND claim_key = 'k' AND sender = 's'",
    )
    .bind(queue)
    .execute(a.pool())
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(raised, 1, "copy 1's number is remembered");
    let late = b
        .claim_attempt(queue, Some(7), Some("k"), Some(&at("s", 2)))
        .await;
    assert_eq!(
        late.err().and_then(|e| e.code()),
        Some(ErrorCode::Conflict),
        "copy 2 came after copy 3 was seen"
    );
    assert_eq!(ids_in(&a, queue, "running").await, vec![x]);
    // X still runs under copy 1's token: copy 2 rotated nothing.
    a.heartbeat(x, &c1.lease.token, Some(7))
        .await
        .expect("copy 1's token still holds X");
}

/// Another sender's copy of a key does not erase what a sender's copies
/// remembered: copy `s.2` claims and settles, a copy of sender `r` claims
/// and settles, and a late `s.1` is still refused. (The remembered row was
/// one per key; `r`'s write overwrote `s`'s number, and `s.1` claimed a
/// second item under a token nobody received.)
pub async fn another_senders_copy_does_not_erase_a_remembered_copy(db: TestDb) {
    let a = db.store(ttl(LONG)).await;
    let b = db.store(ttl(LONG)).await;
    let queue = "two-senders";
    for n in 0..3 {
        a.enqueue(queue, &json!(n), None).await.unwrap();
    }
    for (sender, n) in [("s", 2), ("r", 1)] {
        let (c, replayed) = a
            .claim_attempt(queue, Some(7), Some("k"), Some(&at(sender, n)))
            .await
            .unwrap()
            .expect("claims");
        assert!(!replayed, "{sender}.{n}");
        a.settle(
            c.item.id,
            &c.lease.token,
            Some(7),
            SettleState::Done,
            None,
            None,
        )
        .await
        .unwrap();
    }
    let before = ids_in(&a, queue, "open").await;
    assert_eq!(before.len(), 1);
    let late = b
        .claim_attempt(queue, Some(7), Some("k"), Some(&at("s", 1)))
        .await;
    assert_eq!(
        late.err().and_then(|e| e.code()),
        Some(ErrorCode::Conflict),
        "s.1 came after s.2 was answered"
    );
    assert_eq!(ids_in(&a, queue, "open").await, before);
    assert!(ids_in(&a, queue, "running").await.is_empty());
}

/// The claim attempts remembered past [`CLAIM_KEY_MEMORY_MS`] are purged,
/// the others kept.
///
/// [`CLAIM_KEY_MEMORY_MS`]: agentstore_server::store::CLAIM_KEY_MEMORY_MS
pub async fn remembered_claim_attempts_are_purged_after_their_hour(db: TestDb) {
    let store = db.store(ttl(LONG)).await;
    for (sender, at_ms) in [("old1", 0_i64), ("old2", 1), ("old3", 2)] {
        sqlx::query(
            "INSERT INTO claim_keys (queue, caller, claim_key, sender, attempt, answered_at)
             VALUES ('purge', 7, 'k', $1, 1, $2)",
        )
        .bind(sender)
        .bind(at_ms)
        .execute(store.pool())
        .await
        .unwrap();
    }
    store.enqueue("purge", &json!(1), None).await.unwrap();
    store
        .claim_attempt("purge", Some(7), Some("k"), Some(&at("fresh", 1)))
        .await
        .unwrap()
        .expect("claims");
    assert_eq!(store.forget_claim_keys().await.unwrap(), 3);
    let left: Vec<(String,)> = sqlx::query_as("SELECT sender FROM claim_keys")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(left, vec![("fresh".to_owned(),)]);
}
