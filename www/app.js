// agentstore demo page, records panel: import a PouchDB dump, count, browse,
// edit with CAS. The workers panel lives in workers.js.
//
// Plain ES module, no framework. The SDK is loaded with a dynamic import so
// that a missing or broken `/pkg/` build shows a message instead of a blank
// page. `www/` is served at `/` and the wasm-pack output at `/pkg/`.

import { clearError, demoError, showError, showStatus } from './messages.js';
import { startWorkersPanel } from './workers.js';

const SDK_URL = '/pkg/agentstore.js';
const DUMP_URL = 'data/agent-records.pouchdump.ndjson';
const DEFAULT_STORE = 'agentstore-demo';
/** Page size used when counting every record (max allowed by list() is 10 000). */
const COUNT_PAGE = 1000;

const $ = (id) => document.getElementById(id);

/** @type {import('../pkg/agentstore.js').AgentStore | null} */
let store = null;
/**
 * Why `store` is null, as an Error with the SDK's shape, for any action that
 * needs the store: the SDK did not load, the store could not be opened, or
 * it was open and has been closed (see `closedError`).
 */
let unavailable = new Error('the SDK is not loaded (see the message above)');
// Settles once main() has opened the store (or failed to): a click that
// comes while the SDK still loads waits for it instead of failing.
let opened;
const opening = new Promise((resolve) => { opened = resolve; });

// ---------------------------------------------------------------- messages

/**
 * Runs a user action: clears the previous error, disables the trigger while
 * it runs, and turns any failure into a message on the page.
 */
function action(button, context, fn) {
  return async (event) => {
    event?.preventDefault?.();
    if (!store) await opening;
    if (!store) {
      showError(unavailable, context);
      return;
    }
    clearError();
    const buttons = button ? [button].flat() : [];
    for (const b of buttons) b.disabled = true;
    try {
      await fn(event);
    } catch (err) {
      // The store closed under the action (another tab's upgrade landed
      // while it ran): say so, and what to do, as a later click would.
      showError(err?.code === 'closed' ? storeClosed(err.message) : err, context);
    } finally {
      for (const b of buttons) b.disabled = false;
      updatePager();
    }
  };
}

window.addEventListener('error', (e) => showError(e.error ?? e.message, 'Unexpected error'));
window.addEventListener('unhandledrejection', (e) => showError(e.reason, 'Unexpected error'));

/**
 * The store was closed under this page (`why`: the SDK's reason): nothing can
 * be read or written through it any more, and reloading opens it again.
 * Marks the page's store state `closed` and drops the store.
 */
function storeClosed(why) {
  store = null;
  $('sdk-state').textContent = 'closed';
  const name = $('store-name').textContent;
  unavailable = demoError('ClosedError', 'closed',
    `the store “${name}” is closed in this tab (${why}), so nothing was read or written; reload the page to open it again`, 410);
  return unavailable;
}

// ------------------------------------------------------------------ import

async function importDump() {
  const progress = $('import-progress');
  const label = $('import-progress-label');
  const summaryEl = $('import-summary');
  summaryEl.hidden = true;
  progress.hidden = false;
  progress.removeAttribute('value'); // indeterminate while downloading
  label.textContent = 'Downloading…';
  showStatus('Downloading the sample dump…');

  const res = await fetch(DUMP_URL, { cache: 'no-cache' });
  if (!res.ok) throw new Error(`could not download ${DUMP_URL}: HTTP ${res.status}`);
  const text = await res.text();

  label.textContent = 'Importing…';
  showStatus('Importing…');
  const started = performance.now();
  const summary = await store.importPouchDump(text, {
    onProgress(done, total) {
      progress.max = Math.max(total, 1);
      progress.value = done;
      label.textContent = `${done} / ${total}`;
    },
  });
  const ms = Math.round(performance.now() - started);
  progress.max = 1;
  progress.value = 1;
  label.textContent = `Done in ${ms} ms`;

  renderSummary(summaryEl, [
    ['Documents read', summary.documentsRead, 'documentsRead'],
    ['Live', summary.live, 'live'],
    ['Tombstones', summary.tombstones, 'tombstones'],
    ['_local skipped', summary.localSkipped, 'localSkipped'],
    ['Conflicts resolved to PouchDB\'s winner', summary.conflictsResolved, 'conflictsResolved'],
    ['Last sequence', summary.lastSeq ?? '–', 'lastSeq'],
    ['Written', summary.written, 'written'],
    ['Kept (newer here)', summary.keptNewer, 'keptNewer'],
    // The old, unguarded index document's drift (SDKs that report it).
    ...(summary.legacyIndex ? [
      [`Old index “${summary.legacyIndex.id}” listed`, summary.legacyIndex.listed, 'legacyListed'],
      ['…live records it lost', summary.legacyIndex.lost, 'legacyLost'],
      ['…stale ids it kept', summary.legacyIndex.stale, 'legacyStale'],
    ] : []),
  ]);
  showStatus(`Imported ${summary.documentsRead} documents in ${ms} ms.`);
  await refreshCounts();
}

function renderSummary(dl, rows) {
  dl.replaceChildren();
  for (const [term, value, key] of rows) {
    const div = document.createElement('div');
    const dt = document.createElement('dt');
    const dd = document.createElement('dd');
    dt.textContent = term;
    dd.textContent = String(value);
    dd.dataset.testid = `summary-${key}`;
    div.append(dt, dd);
    dl.append(div);
  }
  dl.hidden = false;
}

// ------------------------------------------------------------------ counts

/** Pages through every live record and counts them per `recordType`. */
async function countAll() {
  const counts = new Map();
  let untyped = 0;
  let total = 0;
  let after;
  do {
    const page = await store.list({ limit: COUNT_PAGE, after });
    for (const r of page.records) {
      total += 1;
      if (typeof r.recordType === 'string') counts.set(r.recordType, (counts.get(r.recordType) ?? 0) + 1);
      else untyped += 1;
    }
    after = page.next ?? undefined;
  } while (after);
  return { counts, untyped, total };
}

/** Bumped by every refresh so that a slow, older count never overwrites a newer one. */
let countGeneration = 0;

async function refreshCounts() {
  const generation = ++countGeneration;
  $('counts-state').textContent = 'Counting…';
  const { counts, untyped, total } = await countAll();
  if (generation !== countGeneration) return;
  const body = $('counts-body');
  body.replaceChildren();
  const types = [...counts.keys()].sort();
  for (const type of types) body.append(countRow(type, counts.get(type), `count-${type}`));
  if (untyped) body.append(countRow(null, untyped, 'count-untyped'));
  $('count-total').textContent = String(total);

  const options = $('type-options');
  options.replaceChildren(...types.map((t) => Object.assign(document.createElement('option'), { value: t })));
  $('counts-state').textContent = total
    ? `${types.length} record type(s); counted at ${new Date().toLocaleTimeString()}.`
    : 'The store is empty: import the sample dump above.';
}

function countRow(type, n, testid) {
  const tr = document.createElement('tr');
  tr.dataset.recordType = type ?? '';
  const th = document.createElement('th');
  th.scope = 'row';
  if (type === null) {
    const em = document.createElement('em');
    em.textContent = '(no recordType)';
    th.append(em);
  } else {
    th.textContent = type;
  }
  const td = document.createElement('td');
  td.className = 'num';
  td.dataset.testid = testid;
  td.textContent = String(n);
  const act = document.createElement('td');
  if (type !== null) {
    const b = document.createElement('button');
    b.type = 'button';
    b.className = 'link';
    b.textContent = 'List';
    b.setAttribute('aria-label', `List records of type ${type}`);
    b.addEventListener('click', action(b, 'List', async () => {
      $('browse-prefix').value = '';
      $('browse-type').value = type;
      await startListing();
      $('browse-title').scrollIntoView({ block: 'start' });
    }));
    act.append(b);
  }
  tr.append(th, td, act);
  return tr;
}

// ------------------------------------------------------------------ browse

/**
 * Paging state. `cursors[i]` is the `after` cursor that loads page i
 * (undefined for the first page); `next` is the cursor of the page after the
 * one shown, or null on the last page.
 */
const paging = { query: null, cursors: [], index: 0, next: null, shown: 0, loading: false };

function readQuery() {
  const prefix = $('browse-prefix').value;
  const type = $('browse-type').value.trim();
  const q = { limit: Number($('browse-limit').value), descending: $('browse-desc').checked };
  if (prefix) q.prefix = prefix;
  if (type) q.type = type;
  return q;
}

async function startListing() {
  paging.query = readQuery();
  paging.cursors = [undefined];
  paging.index = 0;
  await loadPage();
}

async function loadPage() {
  paging.loading = true;
  updatePager();
  try {
    const page = await store.list({ ...paging.query, after: paging.cursors[paging.index] });
    paging.next = page.next;
    paging.shown = page.records.length;
    renderRecords(page.records);
  } finally {
    paging.loading = false;
    updatePager();
  }
}

function renderRecords(records) {
  const body = $('records-body');
  body.replaceChildren();
  for (const r of records) {
    const tr = document.createElement('tr');
    const idCell = document.createElement('td');
    const b = document.createElement('button');
    b.type = 'button';
    b.className = 'link id';
    b.textContent = r._id;
    b.dataset.id = r._id;
    b.addEventListener('click', action(b, 'Open', () => openRecord(r._id)));
    idCell.append(b);
    tr.append(idCell, cell(r.recordType ?? ''), cell(r.updatedAt ?? '', 'col-updated'), cell(r._rev ?? '', 'rev col-rev'));
    body.append(tr);
  }
}

function cell(text, className) {
  const td = document.createElement('td');
  td.textContent = typeof text === 'string' ? text : JSON.stringify(text);
  if (className) td.className = className;
  return td;
}

function updatePager() {
  const prev = $('page-prev');
  const next = $('page-next');
  prev.disabled = !store || paging.loading || paging.index === 0;
  next.disabled = !store || paging.loading || !paging.next;
  if (!paging.query) return;
  if (paging.loading) {
    $('page-info').textContent = `Loading page ${paging.index + 1}…`;
    return;
  }
  const q = paging.query;
  const what = [q.prefix ? `prefix “${q.prefix}”` : null, q.type ? `type “${q.type}”` : null]
    .filter(Boolean).join(', ') || 'all records';
  const first = paging.index * q.limit;
  $('page-info').textContent = paging.shown
    ? `Page ${paging.index + 1} of ${what}: ${first + 1}–${first + paging.shown}${paging.next ? '' : ' (last page)'}`
    : `No records for ${what}.`;
}

// ------------------------------------------------------------------ editor

/** What the editor was loaded from: the id and the revision a save is CAS'd against. */
const editing = { id: null, rev: null, mine: null, conflict: null };

async function openRecord(id) {
  const record = await store.get(id);
  if (record === null) {
    throw Object.assign(new Error(`no live record with id “${id}”`), { name: 'NotFoundError', code: 'not_found', status: 404 });
  }
  loadEditor(record);
  $('editor-text').focus();
}

function loadEditor(record) {
  editing.id = record._id;
  editing.rev = record._rev;
  editing.conflict = null;
  $('editor').hidden = false;
  $('editor-id').textContent = record._id;
  $('editor-rev').textContent = record._rev;
  $('editor-text').value = JSON.stringify(record, null, 2);
  $('open-id').value = record._id;
  hideConflict();
  showStatus(`Opened ${record._id} at revision ${record._rev}.`);
}

/** Parses the textarea; the record is always saved against the loaded revision. */
function readEditor() {
  let record;
  try {
    record = JSON.parse($('editor-text').value);
  } catch (err) {
    throw Object.assign(new Error(`the record is not valid JSON: ${err.message}`), { name: 'ValidationError', code: 'validation' });
  }
  if (record === null || typeof record !== 'object' || Array.isArray(record)) {
    throw Object.assign(new Error('the record must be a JSON object'), { name: 'ValidationError', code: 'validation' });
  }
  if (record._id !== editing.id) {
    throw Object.assign(new Error(`_id can't be changed here (loaded “${editing.id}”)`), { name: 'ValidationError', code: 'validation' });
  }
  if ($('editor-touch').checked) record.updatedAt = new Date().toISOString();
  return record;
}

async function save(record, rev) {
  const toWrite = { ...record };
  if (rev) toWrite._rev = rev;
  else delete toWrite._rev; // the other side deleted it: re-create over the tombstone
  try {
    const res = await store.put(toWrite);
    const saved = await store.get(res.id);
    loadEditor(saved ?? { ...toWrite, _rev: res.rev });
    showStatus(`Saved ${res.id}: revision ${res.rev}.`);
    if (paging.query) await loadPage();
  } catch (err) {
    if (err?.name !== 'ConflictError') throw err;
    showConflict(record, err);
  }
}

function showConflict(mine, err) {
  editing.mine = mine;
  editing.conflict = { currentRev: err.currentRev ?? null, current: err.current ?? null };
  const theirs = err.current ?? null;
  $('conflict-text').textContent = theirs
    ? `You edited revision ${err.expectedRev ?? '(none)'}, but another tab or writer saved revision ${err.currentRev} meanwhile. Nothing of yours was written.`
    : `You edited revision ${err.expectedRev ?? '(none)'}, but the record was deleted elsewhere meanwhile. Nothing of yours was written.`;
  $('conflict-mine-rev').textContent = `(based on ${err.expectedRev ?? 'nothing'})`;
  $('conflict-theirs-rev').textContent = theirs ? `(revision ${err.currentRev})` : '(deleted)';
  $('conflict-mine').textContent = JSON.stringify({ ...mine, _rev: err.expectedRev ?? undefined }, null, 2);
  $('conflict-theirs').textContent = theirs ? JSON.stringify(theirs, null, 2) : 'The record was deleted.';
  const differing = theirs ? diffKeys(mine, theirs) : [];
  $('conflict-diff').textContent = differing.length ? `Fields that differ: ${differing.join(', ')}` : '';
  $('conflict-take-theirs').textContent = theirs ? 'Take theirs' : 'Take theirs (discard mine)';
  $('conflict').hidden = false;
  $('conflict').scrollIntoView({ block: 'nearest' });
  showStatus(`Conflict on ${mine._id}: choose a version.`);
}

function hideConflict() {
  $('conflict').hidden = true;
}

/** Top-level fields whose JSON differs (`_rev` excluded). */
function diffKeys(a, b) {
  const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
  keys.delete('_rev');
  return [...keys].filter((k) => JSON.stringify(a[k]) !== JSON.stringify(b[k])).sort();
}

async function takeTheirs() {
  const c = editing.conflict;
  if (!c) return;
  if (c.current) {
    loadEditor(c.current);
    showStatus(`Took their version: revision ${c.currentRev}.`);
  } else {
    hideConflict();
    $('editor').hidden = true;
    showStatus(`${editing.id} was deleted elsewhere; closed the editor.`);
  }
}

async function overwriteMine() {
  const c = editing.conflict;
  if (!c) return;
  // CAS again, now against the revision we were shown: if a third write
  // happened meanwhile this conflicts again and the new versions are shown.
  await save(editing.mine, c.currentRev);
}

// -------------------------------------------------------------------- init

function bind() {
  $('error-dismiss').addEventListener('click', clearError);
  $('import-button').addEventListener('click', action($('import-button'), 'Import', importDump));
  $('counts-refresh').addEventListener('click', action($('counts-refresh'), 'Counting', refreshCounts));
  $('browse-form').addEventListener('submit', action($('browse-form').querySelector('[type=submit]'), 'List', startListing));
  $('page-next').addEventListener('click', action(null, 'Next page', async () => {
    if (!paging.next) return;
    paging.cursors[paging.index + 1] = paging.next;
    paging.index += 1;
    await loadPage();
  }));
  $('page-prev').addEventListener('click', action(null, 'Previous page', async () => {
    if (paging.index === 0) return;
    paging.index -= 1;
    await loadPage();
  }));
  $('open-form').addEventListener('submit', action($('open-form').querySelector('[type=submit]'), 'Open', async () => {
    const id = $('open-id').value;
    if (!id) throw Object.assign(new Error('enter a record id'), { name: 'ValidationError', code: 'validation' });
    await openRecord(id);
  }));
  $('editor-save').addEventListener('click', action($('editor-save'), 'Save', async () => {
    hideConflict();
    await save(readEditor(), editing.rev);
  }));
  $('editor-reload').addEventListener('click', action($('editor-reload'), 'Reload', () => openRecord(editing.id)));
  $('conflict-take-theirs').addEventListener('click', action($('conflict-take-theirs'), 'Take theirs', takeTheirs));
  $('conflict-overwrite').addEventListener('click', action($('conflict-overwrite'), 'Overwrite', overwriteMine));
}

async function main() {
  bind();
  try {
    await start();
  } finally {
    opened();
  }
}

async function start() {
  const name = new URLSearchParams(location.search).get('db') || DEFAULT_STORE;
  $('store-name').textContent = name;
  let sdk;
  try {
    sdk = await import(SDK_URL);
    await sdk.default();
  } catch (err) {
    $('sdk-state').textContent = 'unavailable';
    showError(err, `Could not load the SDK from ${SDK_URL} (build it with \`bash scripts/build-pkg.sh\` and serve pkg/ at /pkg/)`);
    startWorkersPanel(null);
    return;
  }
  startWorkersPanel(sdk); // independent of the records store; shows its own errors
  try {
    store = await sdk.AgentStore.open(name, {
      blockedTimeoutMs: 5000,
      onVersionChange() {
        showError(storeClosed('another tab upgraded or deleted its database'), 'Store closed');
      },
    });
  } catch (err) {
    $('sdk-state').textContent = 'could not open the store';
    unavailable = new Error(`the store “${name}” could not be opened (see the message above); reload the page to try again`);
    showError(err, `Could not open the store “${name}”`);
    return;
  }
  $('sdk-state').textContent = 'ready';
  updatePager();
  try {
    await refreshCounts();
  } catch (err) {
    showError(err, 'Counting');
  }
  document.body.dataset.ready = 'true';
}

main();
