// agentstore demo page, workers panel: in-page workers holding work leases
// from the agentstore server (the one serving this page).
//
// - Each worker enrolls with a single-use token from /runtime/demo.json
//   (written by scripts/demo.sh, served on loopback only), then runs
//   `client.work(queue, handler, {concurrency: 1})`.
// - The handler "works" for `payload.ms` milliseconds in 100 ms steps under
//   `lease.signal`, and returns `{by, epoch, …}`: work() settles it `done`.
// - Pause heartbeats: `lease.setHeartbeatsPaused(true)` and the work freezes.
//   At its local deadline the lease is lost (`expired_locally`): its signal
//   aborts at once and the frozen work stops there, never delivering a result;
//   after the TTL the server reopens the item for another worker.
// - Cut off: a fetch wrapper rejects every request that carries this worker's
//   access token, as a dropped network would (nothing is sent).
// - Poison items: the handler gives the lease back (`lease.release()`, one
//   attempt counted) until the server fails the item with `retry_limit`
//   (after the first delivery and `max_redeliveries` re-deliveries).
//
// Least privilege: each worker's enrollment token makes a *worker* scoped to
// the demo queue (it may claim there and act on its own leases only). The
// panel's own reads and writes (queue gauges from /v1/queues/{q}/stats — the
// query behind the server's /metrics —, listing, enqueue) use a *producer*
// scoped to the demo queue, enrolled from demo.json's producer tokens, through
// the unwrapped fetch.

import { clearError, demoError, describeError, showError, showStatus } from './messages.js';

const RUNTIME_URL = 'runtime/demo.json';
const WORKERS_PER_PAGE = 3;
/** Display refresh (countdowns, counters). */
const TICK_MS = 200;
/** Queue overview refresh. */
const QUEUE_POLL_MS = 1500;
/** Largest batch the enqueue form accepts. */
const MAX_ENQUEUE = 500;
/** Rows in the "Latest items" table. */
const LATEST_ITEMS = 8;
/** Events kept per worker card. */
const EVENTS_KEPT = 2;

const $ = (id) => document.getElementById(id);

/** Short id of this page, in worker names (`tab-1a2b/w1`) and results. */
const TAB = `tab-${Array.from(crypto.getRandomValues(new Uint8Array(2)), (b) => b.toString(16).padStart(2, '0')).join('')}`;

/** The page's fetch before the cut-off wrapper: the panel's own requests use it. */
const realFetch = globalThis.fetch.bind(globalThis);

/** @type {any} the SDK module */
let sdk = null;
/** @type {{queue: string, ttlMs: number, heartbeatMs: number, reaperMs: number, maxRedeliveries: number, enrollmentTokens: string[], producerTokens: string[]} | null} */
let runtime = null;
/** In-page workers (see `newWorker`). */
const workers = [];
/** Poison items enqueued from this page, by id → announced final state. */
const poison = new Map();

// ------------------------------------------------------- cut-off wrapper

/** The bearer token a fetch call carries, if any. */
function bearerOf(input, init) {
  const headers = init?.headers ?? (input instanceof Request ? input.headers : null);
  if (!headers) return null;
  const value = new Headers(headers).get('authorization');
  return value && value.startsWith('Bearer ') ? value.slice(7) : null;
}

/**
 * Fails every request carrying the access token of a worker that is cut off,
 * the way a dropped connection fails (a TypeError, nothing sent). The SDK looks
 * `fetch` up on the global scope for each request, so this covers its claims,
 * heartbeats, settles and releases.
 */
function installCutOffWrapper() {
  globalThis.fetch = function demoFetch(input, init) {
    const token = bearerOf(input, init);
    if (token) {
      const w = workers.find((x) => x.cutOff && x.client && x.client.credentials.accessToken === token);
      if (w) {
        w.blocked += 1;
        return Promise.reject(new TypeError('Failed to fetch (cut off by the demo page: nothing was sent)'));
      }
    }
    return realFetch(input, init);
  };
}

// ------------------------------------------------------------ server calls

function errorFromAnswer(status, body) {
  const code = body?.code ?? 'http';
  const name = {
    unauthorized: 'UnauthorizedError', forbidden: 'ForbiddenError', validation: 'ValidationError',
    not_found: 'NotFoundError', rate_limited: 'RateLimitedError', payload_too_large: 'PayloadTooLargeError',
    bad_request: 'BadRequestError', conflict: 'ConflictError',
  }[code] ?? 'ServerError';
  return demoError(name, code, body?.message ?? `HTTP ${status}`, status);
}

/** One request to the lease server: JSON in and out, `{code, message}` errors as Errors. */
async function request(method, path, { body, token } = {}) {
  const headers = {};
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res;
  try {
    res = await realFetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: 'no-store' });
  } catch (err) {
    throw demoError('NetworkError', 'network', `the agentstore server could not be reached (${err.message})`, 503);
  }
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { /* not JSON: reported below */ }
  if (!res.ok) {
    const err = errorFromAnswer(res.status, data);
    const retryAfter = Number(res.headers.get('retry-after'));
    if (retryAfter > 0) err.retryAfterS = retryAfter;
    throw err;
  }
  return data;
}

/**
 * The panel's credential: a producer scoped to the demo queue, as a promise of
 * `{access_token, refresh_token}`. Enrolled on first use; with `staleToken` (an
 * access token the server just refused) it is refreshed once for every caller
 * that saw the same refusal, or enrolled again if the refresh token is spent.
 */
let producer = null;
function panelCredentials(staleToken) {
  if (producer && staleToken === undefined) return producer;
  const previous = producer;
  producer = (async () => {
    const old = previous && await previous.catch(() => null);
    if (old && old.access_token !== staleToken) return old; // renewed by another call
    return renewed(async () => {
      if (old) {
        try {
          return await request('POST', '/v1/workers/refresh', { body: { refresh_token: old.refresh_token } });
        } catch (err) {
          if (err.status !== 401) throw err;
        }
      }
      return enrollWith(runtime.producerTokens ?? [], 'producer', 'demo panel', RENEWAL_ENROLLS);
    });
  })();
  const mine = producer;
  mine.catch(() => { if (producer === mine) producer = null; });
  return mine;
}

/** Enrollment tokens one renewal tries (each refused one is a credential request spent). */
const RENEWAL_ENROLLS = 2;
/** Backoff of renewals that failed: random(base, min(cap, base·2^n)) ms after the n-th failure in a row. */
const RENEWAL_BASE_MS = 2000;
const RENEWAL_CAP_MS = 60_000;
/** Renewals that failed in a row, and when (performance.now()) the next may be tried. */
const renewal = { failures: 0, notBefore: 0 };

/**
 * Runs `renew` (a refresh, or an enrollment: credential requests, which the
 * server limits per client address with `--auth-rate`) unless a failed
 * renewal's backoff is still running: then the panel call fails at once
 * with nothing sent. A failure backs off with jitter, as the SDK's
 * reconnects do (random(base, min(cap, base·2^n)), and at least the
 * `Retry-After` of a 429); a success resets it. Before, after a server
 * restart every poll (1.5 s) spent a refresh and up to 12 enrollments,
 * every one refused: the page drained the address's auth rate, and the
 * enrollments of the new run's workers got 429.
 */
async function renewed(renew) {
  const wait = renewal.notBefore - performance.now();
  if (wait > 0) {
    throw demoError('UnauthorizedError', 'unauthorized',
      `the server refused the panel's credentials; renewing them again in ${seconds(wait)}`, 401);
  }
  try {
    const creds = await renew();
    renewal.failures = 0;
    return creds;
  } catch (err) {
    renewal.failures += 1;
    const ceiling = Math.min(RENEWAL_CAP_MS, RENEWAL_BASE_MS * 2 ** renewal.failures);
    const delay = RENEWAL_BASE_MS + Math.random() * (ceiling - RENEWAL_BASE_MS);
    const retryAfterMs = err.status === 429 ? (err.retryAfterS ?? 1) * 1000 : 0;
    renewal.notBefore = performance.now() + Math.max(delay, retryAfterMs);
    throw err;
  }
}

/**
 * A panel call as the producer; one renewal after a 401 (its access token
 * expired). A 401 that renewal cannot cure may mean the demo server was
 * restarted (every credential of its last run is unknown to the new one):
 * then the panel and the workers start again on its new run, and the call is
 * made once more.
 */
async function panelCall(method, path, body, again = true) {
  try {
    const creds = await panelCredentials();
    try {
      return await request(method, path, { body, token: creds.access_token });
    } catch (err) {
      if (err.status !== 401) throw err;
      const renewed = await panelCredentials(creds.access_token);
      return await request(method, path, { body, token: renewed.access_token });
    }
  } catch (err) {
    if (err.status === 401 && again && await adoptRestartedServer()) return panelCall(method, path, body, false);
    throw err;
  }
}

/**
 * Whether the demo server was restarted (`runId` in demo.json changed) and
 * the panel moved to its new run: the new runtime adopted, the producer and
 * every worker enrolled again with its fresh tokens (each worker's loop and
 * client of the old run stopped first). One check at a time.
 */
let adopting = null;
function adoptRestartedServer() {
  adopting ??= (async () => {
    let fresh;
    try {
      fresh = await request('GET', RUNTIME_URL);
    } catch {
      return false;
    }
    if (!fresh?.runId || fresh.runId === runtime?.runId || !fresh.enrollmentTokens?.length) return false;
    runtime = fresh;
    producer = null;
    Object.assign(renewal, { failures: 0, notBefore: 0 }); // fresh tokens: try them at once
    tail.after = null; // the new run numbers its items from 1 again
    // The old run's poison item is not the new run's (its id may name
    // another item there, or none).
    poison.clear();
    $('poison-status').hidden = true;
    showStatus('The demo server was restarted: the panel and the workers enrolled again with its new tokens.');
    await Promise.all(workers.map(async (w) => {
      // The old run's loop and client are stopped without waiting for them
      // (a handler of theirs may run on, and its lease's calls fail, until
      // its local deadline); what they still do is left off the card.
      const { worker, client } = w;
      Object.assign(w, { gen: w.gen + 1, worker: null, client: null, job: null, pending: [], error: null, failing: false, stall: false });
      client?.close().catch(() => {});
      worker?.stop().catch(() => {});
      try {
        await startWorker(w);
      } catch (err) {
        w.error = err;
        showError(err, `${label(w)} could not start again`);
      }
    }));
    return true;
  })().finally(() => { adopting = null; });
  return adopting;
}

/**
 * Takes a token of `pool` (`kind`: "worker" or "producer") that no page of
 * this browser profile took before in this demo run: each pool is walked in
 * order from a random start kept in localStorage, under a Web Lock so two
 * tabs never take the same one. A token used twice is not merely refused:
 * within a minute the server takes the second use for a retry of the first
 * and revokes the credentials the first holder got, and later for a stolen
 * token, revoking the worker it enrolled (a live worker of another tab).
 * `null` when the pool is spent. (Pages of another browser or profile start
 * elsewhere in the pool; they may still meet, which is why demo.sh makes far
 * more tokens than a page uses.)
 */
async function takeToken(pool, kind) {
  const key = `agentstore-demo-tokens-${kind}`;
  const take = () => {
    let taken = null;
    try { taken = JSON.parse(localStorage.getItem(key) ?? 'null'); } catch { /* none kept */ }
    if (taken?.run !== runtime?.runId || !Array.isArray(taken.used)) {
      taken = { run: runtime?.runId, start: Math.floor(Math.random() * pool.length), used: [] };
    }
    const used = new Set(taken.used);
    for (let i = 0; i < pool.length; i++) {
      const token = pool[(taken.start + i) % pool.length];
      if (used.has(token)) continue;
      taken.used.push(token);
      try { localStorage.setItem(key, JSON.stringify(taken)); } catch { /* this page alone, then */ }
      return token;
    }
    return null;
  };
  try {
    if (navigator.locks) return await navigator.locks.request(key, take);
  } catch { /* no Web Locks here (an opaque origin): this tab alone */ }
  return take();
}

/**
 * Enrolls with a token of `pool` (`kind`: see `takeToken`). A token a page of
 * another browser used already answers 401: take the next one.
 */
async function enrollWith(pool, kind, name, attempts = 12) {
  for (let attempt = 0; attempt < attempts; attempt++) {
    const token = await takeToken(pool, kind);
    if (token === null) break;
    try {
      return await request('POST', '/v1/workers/enroll', { body: { token, name } });
    } catch (err) {
      if (err.status !== 401) throw err;
    }
  }
  throw demoError('UnauthorizedError', 'unauthorized',
    'no unused enrollment token found (each one enrolls once); restart `bash scripts/demo.sh` for fresh ones', 401);
}

// ----------------------------------------------------------------- helpers

/** Waits `ms`; rejects with the signal's reason when it aborts. */
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) { reject(signal.reason); return; }
    const t = setTimeout(() => { signal?.removeEventListener('abort', onAbort); resolve(); }, ms);
    function onAbort() { clearTimeout(t); reject(signal.reason); }
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

function el(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
}

const seconds = (ms) => `${(ms / 1000).toFixed(1)} s`;

// ------------------------------------------------------------------ worker

/**
 * One in-page worker.
 * `job`: the lease being worked on (see `handle`); `pending`: jobs whose end
 * (settled, lost, released) has not been shown yet.
 */
function newWorker(slot) {
  return {
    slot,
    name: `${TAB}/w${slot}`,
    workerId: null,
    client: null,
    worker: null,
    /** Pause heartbeats pressed: applies to the current and next lease until one ends. */
    stall: false,
    /** Cut off pressed. */
    cutOff: false,
    /** Requests the wrapper failed. */
    blocked: 0,
    job: null,
    pending: [],
    error: null,
    /** The server run its client and jobs belong to (see adoptRestartedServer). */
    gen: 0,
    /** Claims failing now (see `failingNow`), and the counts last seen. */
    failing: false,
    seen: { claimed: 0, polls: '', failures: 0 },
    ui: null,
  };
}

/** The work loop's handler: simulated work under the lease, stall-aware. */
async function handle(w, lease) {
  const payload = lease.item?.payload ?? {};
  const job = {
    gen: w.gen,
    lease,
    itemId: lease.itemId,
    epoch: lease.epoch,
    attempts: lease.item?.attempts ?? 0,
    maxDeliveries: 1 + (lease.item?.max_redeliveries ?? runtime.maxRedeliveries),
    task: payload.poison ? 'poison' : String(payload.task ?? 'job'),
    totalMs: payload.poison ? 600 : Math.min(60_000, Math.max(100, Number(payload.ms) || 1500)),
    progressMs: 0,
    stalled: false,
    delivered: false,
    outcome: null,
  };
  w.job = job;
  w.pending.push(job);
  lease.signal.addEventListener('abort', () => onLeaseEnded(w, job), { once: true });
  if (w.stall) stallJob(w, job);

  await simulateWork(w, job);
  if (payload.poison) {
    // "Fails" every time, retryably: give it back (one attempt counted).
    job.outcome = 'released';
    await giveBack(lease);
    const attempt = job.attempts + 1;
    addEvent(w, 'poison', job, attempt >= job.maxDeliveries
      ? `poison item failed its last delivery (${attempt} of ${job.maxDeliveries}): gave it back, the server fails it (retry_limit)`
      : `poison item failed delivery ${attempt} of ${job.maxDeliveries}: gave it back (lease.release)`);
    return undefined;
  }
  job.delivered = true;
  return { by: w.name, workerId: w.workerId, epoch: lease.epoch, task: job.task };
}

/**
 * `lease.release()`, retried until it lands or the lease ends some other way.
 * The signal aborts when the first release is sent (fenced work stops then),
 * so the loop watches `status`: `held` after a failed release means the
 * server still holds the item for this worker.
 */
async function giveBack(lease) {
  for (;;) {
    try {
      await lease.release();
      return;
    } catch {
      if (lease.status !== 'held') return;
      await sleep(1000);
    }
  }
}

/** Advances in 100 ms steps; frozen while stalled, until it is time to wake up. */
async function simulateWork(w, job) {
  while (job.progressMs < job.totalMs) {
    await sleep(100, job.lease.signal);
    // A stalled job makes no progress; at the local deadline the signal
    // aborts and the sleep above rejects: the work stops there.
    if (!job.stalled) job.progressMs += 100;
  }
}

function stallJob(w, job) {
  job.stalled = true;
  job.lease.setHeartbeatsPaused(true);
  addEvent(w, 'info', job, 'heartbeats paused and work frozen');
}

function unstallJob(w, job) {
  job.stalled = false;
  job.lease.setHeartbeatsPaused(false);
  addEvent(w, 'info', job, 'heartbeats resumed');
}

/** The lease's signal aborted: say why, in words. */
function onLeaseEnded(w, job) {
  if (job.gen !== w.gen) return; // a job of the server's last run (see adoptRestartedServer)
  const reason = job.lease.signal.reason?.reason ?? 'claim_lost';
  if (job.outcome === 'released' || reason === 'released') {
    job.outcome = 'released';
  } else if (job.delivered && reason === 'claim_lost') {
    job.outcome = 'rejected';
    addEvent(w, 'rejected', job, 'late result REJECTED by the server (claim_lost): the lease had expired and the item was handed out again; nothing was written');
    showStatus(`${label(w)}: its late result for item #${job.itemId} (epoch ${job.epoch}) was rejected by the server (claim_lost).`);
  } else if (reason === 'expired_locally' && job.delivered) {
    // The server never answered the settle: nothing was rejected, nothing
    // got through (a server outage, the worker cut off).
    job.outcome = 'expired';
    addEvent(w, 'expired', job, 'result NOT saved: its settle did not reach the server before the local deadline (expired_locally); the item will be handed out again');
    showStatus(`${label(w)}: its result for item #${job.itemId} (epoch ${job.epoch}) could not reach the server before the local deadline (expired_locally).`);
  } else if (reason === 'expired_locally') {
    job.outcome = 'expired';
    addEvent(w, 'expired', job, 'cancelled: no heartbeat got through before the local deadline (expired_locally); work stopped');
  } else {
    job.outcome = 'cancelled';
    addEvent(w, 'cancelled', job, 'cancelled: the server says the lease is gone (claim_lost); work stopped, result discarded');
  }
  if (job.stalled) w.stall = false; // one stalled lease per press
}

/** Picks up settles (work() does them after the handler returns). */
function reap(w) {
  for (const job of w.pending) {
    if (!job.outcome && job.lease.status === 'settled') {
      job.outcome = 'settled';
      addEvent(w, 'settled', job, 'done');
      if (job.stalled) w.stall = false;
    }
  }
  w.pending = w.pending.filter((j) => !j.outcome);
  if (w.job && w.job.outcome) w.job = null;
}

async function startWorker(w) {
  const creds = await enrollWith(runtime.enrollmentTokens, 'worker', w.name);
  w.workerId = creds.worker_id;
  w.client = new sdk.LeaseClient(location.origin, {
    accessToken: creds.access_token,
    refreshToken: creds.refresh_token,
    name: w.name,
  });
  w.worker = w.client.work(runtime.queue, (lease) => handle(w, lease), {
    concurrency: 1,
    pollIntervalMs: 1000,
    // Short, so that reconnecting after "Cut off" is quick to see.
    reconnectBaseMs: 2000,
    reconnectCapMs: 8000,
  });
  // A refusal retrying cannot cure (the worker's credentials revoked, its
  // token out of scope) stops the worker: its card says why, instead of
  // "reconnecting" for ever. (A stop of an old run's worker is not shown.)
  const { gen, worker } = w;
  worker.finished?.catch((err) => {
    if (w.gen === gen && w.worker === worker) w.error = err;
  });
}

// -------------------------------------------------------------------- cards

const label = (w) => `Worker ${w.slot}`;

function buildCard(w) {
  const id = `worker-${w.slot}`;
  const title = el('h3', { id: `${id}-title`, textContent: label(w) });
  const badge = el('span', { className: 'badge' });
  badge.dataset.testid = `${id}-state`;
  const who = el('span', { className: 'muted who' });
  const lease = el('p', { className: 'lease' });
  lease.dataset.testid = `${id}-lease`;
  const bar = el('div', { className: 'deadline' }, el('span'));
  bar.setAttribute('aria-hidden', 'true');
  const counters = el('span', { className: 'muted counters' });
  counters.dataset.testid = `${id}-counters`;
  const pause = el('button', { type: 'button', className: 'secondary' });
  pause.dataset.testid = `${id}-pause`;
  pause.setAttribute('aria-pressed', 'false');
  const cut = el('button', { type: 'button', className: 'secondary' });
  cut.dataset.testid = `${id}-cut`;
  cut.setAttribute('aria-pressed', 'false');
  const events = el('ul', { className: 'events' });
  events.dataset.testid = `${id}-events`;
  events.setAttribute('aria-label', `${label(w)}: latest events`);
  const card = el('article', { className: 'worker', id },
    el('div', { className: 'worker-head' }, title, who, badge), lease, bar,
    el('div', { className: 'row' }, pause, cut, counters), events);
  card.setAttribute('aria-labelledby', title.id);
  card.dataset.testid = id;
  card.dataset.workerName = w.name;

  pause.addEventListener('click', () => {
    clearError();
    w.stall = !w.stall;
    const job = w.job && !w.job.outcome ? w.job : null;
    if (job && w.stall && !job.stalled) stallJob(w, job);
    if (job && !w.stall && job.stalled) unstallJob(w, job);
    if (!job) addEvent(w, 'info', null, w.stall ? 'heartbeats will pause on the next lease' : 'heartbeats will not pause');
    render(w);
  });
  cut.addEventListener('click', () => {
    clearError();
    w.cutOff = !w.cutOff;
    addEvent(w, 'info', w.job, w.cutOff ? 'cut off: its requests now fail as if the network were down' : 'reconnected: its requests go through again');
    render(w);
  });
  w.ui = { card, badge, who, lease, bar: bar.firstChild, counters, pause, cut, events };
  return card;
}

function addEvent(w, kind, job, text) {
  if (job && job.gen !== w.gen) return; // a job of the server's last run
  if (!w.ui) return;
  const li = el('li', { className: `event event-${kind}` });
  const time = new Date().toLocaleTimeString();
  li.dataset.kind = kind;
  if (job) {
    li.dataset.item = String(job.itemId);
    li.dataset.epoch = String(job.epoch);
    li.append(el('strong', { textContent: `#${job.itemId} e${job.epoch}` }), ` ${text} `, el('span', { className: 'muted', textContent: time }));
  } else {
    li.append(`${text} `, el('span', { className: 'muted', textContent: time }));
  }
  w.ui.events.prepend(li);
  while (w.ui.events.children.length > EVENTS_KEPT) w.ui.events.lastChild.remove();
}

/**
 * Whether the worker's claims are failing now: a connection failure counted
 * since the last claim or poll that got through (`stats` counts failures
 * and claims since the worker started; `pollDelaysMs`, its last 32 empty
 * polls, changes at each one).
 */
function failingNow(w, stats) {
  if (!stats) return false;
  const polls = stats.pollDelaysMs.join(',');
  const through = stats.claimed !== w.seen.claimed || polls !== w.seen.polls;
  const failed = stats.connectionFailures !== w.seen.failures;
  if (through) w.failing = false;
  else if (failed) w.failing = true;
  w.seen = { claimed: stats.claimed, polls, failures: stats.connectionFailures };
  return w.failing;
}

/** Redraws one card from the worker's state (every tick). */
function render(w) {
  const ui = w.ui;
  if (!ui) return;
  const job = w.job && !w.job.outcome ? w.job : null;
  const stats = w.worker?.stats;
  let state;
  if (w.error) state = 'error';
  else if (!w.worker) state = 'enrolling';
  else if (w.cutOff) state = 'cut off';
  else if (job?.stalled) state = 'heartbeats paused';
  else if (job) state = 'working';
  else if (failingNow(w, stats) && !job) state = 'reconnecting';
  else state = 'polling';
  ui.badge.textContent = state;
  ui.badge.dataset.state = state;
  ui.who.textContent = w.error
    ? describeError(w.error)
    : `${w.name}${w.workerId ? ` · worker id ${w.workerId}` : ''}`;
  ui.card.classList.toggle('has-error', Boolean(w.error));

  ui.card.dataset.itemId = job ? String(job.itemId) : '';
  ui.card.dataset.epoch = job ? String(job.epoch) : '';
  if (job) {
    const left = job.lease.msToDeadline;
    const deadline = left >= 0
      ? `local deadline in ${seconds(left)}`
      : `${seconds(-left)} past the local deadline`;
    const progress = Math.min(100, Math.round((100 * job.progressMs) / job.totalMs));
    ui.lease.textContent = `Item #${job.itemId} · epoch ${job.epoch} · ${job.task} ${progress}% · ${deadline}`;
    const span = Math.max(1, runtime.ttlMs);
    ui.bar.style.width = `${Math.max(0, Math.min(100, (100 * left) / span))}%`;
    ui.bar.parentElement.dataset.level = left < 0 ? 'over' : left < 2000 ? 'low' : 'ok';
  } else {
    ui.lease.textContent = w.worker ? 'No lease: polling the queue.' : 'No lease.';
    ui.bar.style.width = '0%';
    ui.bar.parentElement.dataset.level = 'none';
  }
  if (stats) {
    const failures = stats.connectionFailures
      ? ` · connection failures ${stats.connectionFailures}${w.cutOff && stats.backoffsMs.length ? ` (next try after ${seconds(stats.backoffsMs.at(-1))})` : ''}`
      : '';
    ui.counters.textContent = `claimed ${stats.claimed} · done ${stats.done} · lost ${stats.lost}${failures}`;
  }
  ui.pause.textContent = w.stall ? 'Resume heartbeats' : 'Pause heartbeats';
  ui.pause.setAttribute('aria-pressed', String(w.stall));
  ui.pause.disabled = !w.worker;
  ui.cut.textContent = w.cutOff ? 'Reconnect' : 'Cut off from server';
  ui.cut.setAttribute('aria-pressed', String(w.cutOff));
  ui.cut.disabled = !w.worker;
}

// -------------------------------------------------------------------- queue

let queueBusy = false;

/**
 * One poll: the gauges (counts per state, one row of the server's), the
 * newest items (`tailItems`) and the poison item last enqueued here, read
 * by id. Nothing in it grows with the queue: a queue of a million items
 * costs the same few small answers per poll as one of ten.
 */
async function refreshQueue() {
  if (queueBusy || !workers.some((w) => w.client)) return;
  queueBusy = true;
  try {
    const queue = encodeURIComponent(runtime.queue);
    const lastPoison = [...poison.keys()].at(-1);
    const [stats, items, poisoned] = await Promise.all([
      panelCall('GET', `/v1/queues/${queue}/stats`),
      tailItems(queue),
      // Not fatal: an item the server no longer has only leaves the line as it is.
      lastPoison === undefined ? null : panelCall('GET', `/v1/items/${lastPoison}`).catch(() => null),
    ]);
    renderGauges(stats);
    renderLatest(items.slice().reverse());
    if (poisoned) renderPoison(poisoned);
    const total = ['open', 'running', 'paused', 'blocked', 'done', 'failed'].reduce((n, k) => n + (stats[k] ?? 0), 0);
    setPanelState(`${total} item(s) in queue “${runtime.queue}”; updated ${new Date().toLocaleTimeString()}.`);
  } catch (err) {
    setPanelState(`Could not read the queue: ${describeError(err)}`);
  } finally {
    queueBusy = false;
  }
}

/**
 * Where the newest items start: `after` is a listing cursor (an item id, 0
 * for the start) with the `LATEST_ITEMS` newest items of the queue, and
 * whatever came since, after it. Null until the first poll finds it.
 */
const tail = { after: null };

/** Items the poll lists at most; more new ones than that since the last poll, and the tail is searched for again. */
const TAIL_PAGE = 50;

/** One page of the listing of `queue` (URI-encoded): items with ids above `after`, in id order. */
function listPage(queue, after, limit) {
  return panelCall('GET', `/v1/queues/${queue}/items?limit=${limit}&after=${after}`);
}

/**
 * The `LATEST_ITEMS` newest items of `queue`, oldest first, as they are now.
 * The listing only goes forward in id order, so the poll lists from the
 * cursor before them (`tail.after`): those items and the few enqueued since,
 * one small page. The cursor is found once by a search (`tailStart`: a few
 * dozen pages of `LATEST_ITEMS` items, however long the queue), and again
 * only when more than a page of items arrived between two polls. Before,
 * every poll downloaded the whole queue (a 10,000-item queue: 10,000 items
 * every 1.5 s).
 */
async function tailItems(queue) {
  // A cursor found while the server restarted (adoptRestartedServer reset
  // it) names the old run's items: dropped, the next poll searches again.
  const run = runtime.runId;
  const search = async (from) => {
    const at = await tailStart(queue, from);
    if (runtime.runId === run) tail.after = at;
    return runtime.runId === run;
  };
  if (tail.after == null && !(await search(0))) return [];
  let page = await listPage(queue, tail.after, TAIL_PAGE);
  if (page.next != null) {
    if (!(await search(tail.after))) return [];
    page = await listPage(queue, tail.after, TAIL_PAGE);
  }
  const items = page.items;
  if (items.length > LATEST_ITEMS) tail.after = items[items.length - LATEST_ITEMS - 1].id;
  return items.slice(-LATEST_ITEMS);
}

/**
 * The largest cursor from `from` on with at least `LATEST_ITEMS` items of
 * `queue` after it (`from` when there are fewer): steps that double until
 * one has fewer after it, then a binary search between the last two, each
 * probe one page of at most `LATEST_ITEMS` items (a page cut short by the
 * server's byte budget counts as full).
 */
async function tailStart(queue, from) {
  const enoughAfter = async (after) => {
    const page = await listPage(queue, after, LATEST_ITEMS);
    return page.items.length >= LATEST_ITEMS || page.next != null;
  };
  if (!await enoughAfter(from)) return from;
  let lo = from;
  let step = 64;
  let hi = lo + step;
  while (await enoughAfter(hi)) {
    lo = hi;
    step *= 2;
    hi = lo + step;
  }
  while (hi - lo > 1) {
    const mid = lo + Math.floor((hi - lo) / 2);
    if (await enoughAfter(mid)) lo = mid;
    else hi = mid;
  }
  return lo;
}

/**
 * The queue gauges, as the server computes them for `/metrics`
 * (`agentstore_queue_items`, `agentstore_queue_oldest_open_age_seconds`).
 */
function renderGauges(stats) {
  for (const k of ['open', 'running', 'paused', 'done', 'failed']) {
    const dd = document.querySelector(`[data-testid=queue-${k}]`);
    if (dd) dd.textContent = String(stats[k]);
  }
  const age = document.querySelector('[data-testid=queue-oldest-open]');
  age.textContent = stats.oldest_open_age_ms == null ? '–' : seconds(stats.oldest_open_age_ms);
  age.dataset.ms = stats.oldest_open_age_ms == null ? '' : String(stats.oldest_open_age_ms);
}

function renderLatest(items) {
  const body = $('items-body');
  body.replaceChildren(...items.map((it) => {
    const tr = el('tr');
    tr.dataset.item = String(it.id);
    tr.dataset.state = it.state;
    const who = it.state === 'done' ? (it.result?.by ?? '')
      : it.state === 'running' ? `worker id ${it.worker_id ?? '?'}${it.last_error ? ` (before: ${it.last_error})` : ''}`
        : it.last_error ?? '';
    const name = it.payload?.poison ? 'poison' : (it.payload?.task ?? '');
    tr.append(
      el('td', { textContent: `#${it.id} ${name}` }),
      el('td', { textContent: it.state, className: `state state-${it.state}` }),
      el('td', { textContent: String(it.epoch), className: 'num' }),
      el('td', { textContent: `${it.attempts}/${it.max_redeliveries + 1}`, className: 'num' }),
      el('td', { textContent: who, className: 'by' }),
    );
    return tr;
  }));
}

/** The poison item last enqueued from this page, `it` as read now. */
function renderPoison(it) {
  const lastId = [...poison.keys()].at(-1);
  if (it.id !== lastId) return;
  const p = $('poison-status');
  p.hidden = false;
  p.dataset.item = String(it.id);
  p.dataset.state = it.state;
  if (it.state === 'failed') {
    p.textContent = `Poison item #${it.id} stopped at the retry cap: failed (${it.last_error}) after ${it.attempts} of ${it.max_redeliveries + 1} deliveries.`;
    if (!poison.get(lastId)) {
      poison.set(lastId, true);
      showStatus(p.textContent);
    }
  } else {
    p.textContent = `Poison item #${it.id}: ${it.state}, ${it.attempts} of ${it.max_redeliveries + 1} deliveries used${it.last_error ? ` (last: ${it.last_error})` : ''}.`;
  }
}

/** The panel's state line: not a live region (it refreshes every poll); outcomes of user actions go to the status line. */
function setPanelState(text) {
  const s = $('workers-state');
  if (s.textContent !== text) s.textContent = text;
}

// ----------------------------------------------------------------- actions

/** Runs a panel action with the same rules as the records panel: errors become messages. */
function action(button, context, fn) {
  return async (event) => {
    event?.preventDefault?.();
    clearError();
    button.disabled = true;
    try {
      await fn();
    } catch (err) {
      showError(err, context);
    } finally {
      button.disabled = false;
    }
  };
}

async function enqueueItems() {
  const raw = $('enqueue-count').value.trim();
  const n = Number(raw);
  if (!/^\d+$/.test(raw) || n < 1 || n > MAX_ENQUEUE) {
    throw demoError('ValidationError', 'validation', `enter a whole number of items from 1 to ${MAX_ENQUEUE} (got “${raw}”)`);
  }
  if (!runtime) throw demoError('NetworkError', 'network', 'the workers panel is not connected to an agentstore server');
  showStatus(`Enqueueing ${n} item(s)…`);
  const tasks = ['summarise', 'classify', 'translate', 'extract', 'triage', 'review'];
  const ids = [];
  // A few requests at a time keeps the order roughly stable and the server relaxed.
  for (let i = 0; i < n; i += 10) {
    const batch = Array.from({ length: Math.min(10, n - i) }, (_, k) => panelCall('POST', `/v1/queues/${encodeURIComponent(runtime.queue)}/items`, {
      payload: { task: tasks[(i + k) % tasks.length], n: i + k + 1, ms: 400 + Math.floor(Math.random() * 1200), source: TAB },
    }));
    ids.push(...(await Promise.all(batch)).map((it) => it.id));
  }
  // The requests of a batch race: the ids come back in no order.
  showStatus(`Enqueued ${n} item(s): #${Math.min(...ids)}–#${Math.max(...ids)}.`);
  await refreshQueue();
}

async function enqueuePoison() {
  if (!runtime) throw demoError('NetworkError', 'network', 'the workers panel is not connected to an agentstore server');
  const it = await panelCall('POST', `/v1/queues/${encodeURIComponent(runtime.queue)}/items`, {
    payload: { poison: true, note: 'fails on every attempt', source: TAB },
  });
  poison.set(it.id, false);
  $('poison-status').hidden = false;
  $('poison-status').dataset.item = String(it.id);
  $('poison-status').dataset.state = it.state;
  $('poison-status').textContent = `Poison item #${it.id} enqueued: retry cap ${it.max_redeliveries} re-deliveries after the first delivery.`;
  showStatus(`Enqueued poison item #${it.id}.`);
}

// --------------------------------------------------------------------- init

/** Starts the panel; `sdkModule` is null when the SDK could not load. */
export async function startWorkersPanel(sdkModule) {
  $('enqueue-form').addEventListener('submit', action($('enqueue-submit'), 'Enqueue', enqueueItems));
  $('poison-button').addEventListener('click', action($('poison-button'), 'Enqueue poison item', enqueuePoison));
  $('workers-count').textContent = String(WORKERS_PER_PAGE);
  if (!sdkModule) {
    setPanelState('Workers need the SDK, which did not load (see the message above).');
    return;
  }
  sdk = sdkModule;
  try {
    runtime = await request('GET', RUNTIME_URL);
  } catch {
    runtime = null;
  }
  if (!runtime?.enrollmentTokens?.length) {
    runtime = null;
    setPanelState('Workers need the agentstore demo server and its enrollment tokens (/runtime/demo.json): start the page with `bash scripts/demo.sh`.');
    return;
  }
  $('workers-queue').textContent = runtime.queue;
  $('workers-settings').textContent = `Demo settings: lease TTL ${seconds(runtime.ttlMs)}, heartbeat ${seconds(runtime.heartbeatMs)}, reaper ${seconds(runtime.reaperMs)}, retry cap ${runtime.maxRedeliveries} re-deliveries.`;
  installCutOffWrapper();
  const list = $('worker-list');
  for (let slot = 1; slot <= WORKERS_PER_PAGE; slot++) {
    const w = newWorker(slot);
    workers.push(w);
    list.append(buildCard(w));
    render(w);
  }
  setPanelState('Enrolling workers…');
  await Promise.all(workers.map(async (w) => {
    try {
      await startWorker(w);
    } catch (err) {
      w.error = err;
      showError(err, `${label(w)} could not start`);
    }
  }));
  setInterval(() => { for (const w of workers) { reap(w); render(w); } }, TICK_MS);
  setInterval(refreshQueue, QUEUE_POLL_MS);
  await refreshQueue();
  document.body.dataset.workersReady = String(workers.every((w) => w.worker));
}
