// The agentstore package resolves through its package.json `exports`; Vite
// bundles the JS glue and emits agentstore_bg.wasm as an asset (the glue
// finds it with `new URL("agentstore_bg.wasm", import.meta.url)`).
import init, { AgentStore, LeaseClient } from 'agentstore';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
$('server').value = params.get('server') ?? 'http://127.0.0.1:8787';
$('token').value = params.get('enroll') ?? '';
$('queue').value = params.get('queue') ?? 'jobs';

const AGENTS = ['triage', 'summarise', 'reply'];

async function writeAndList(store) {
  for (const name of AGENTS) {
    // Read-modify-write with compare-and-swap, retried on conflict.
    await store.mutate(`agent:${name}`, (cur) => ({
      ...(cur ?? { _id: `agent:${name}`, recordType: 'agent', name }),
      runs: (cur?.runs ?? 0) + 1,
    }));
  }
  const { records } = await store.list({ prefix: 'agent:' });
  $('records').replaceChildren(
    ...records.map((r) => {
      const li = document.createElement('li');
      li.dataset.id = r._id;
      li.textContent = `${r._id} — runs ${r.runs} (rev ${r._rev})`;
      return li;
    }),
  );
}

async function holdLease(store) {
  const client = new LeaseClient($('server').value, {
    enrollmentToken: $('token').value,
    name: 'vite-example',
    // A real app persists the refresh token; the example keeps it for the tab.
    onCredentials: (c) => sessionStorage.setItem('agentstore-refresh', c.refreshToken),
  });
  try {
    const lease = await client.claim($('queue').value);
    if (!lease) {
      $('lease').textContent = 'queue empty';
      return;
    }
    $('lease').textContent = `claimed item ${lease.itemId} (epoch ${lease.epoch})`;
    // Fence the local write with the lease's epoch.
    await store.put({ _id: `job:${lease.itemId}`, recordType: 'job', epoch: lease.epoch, payload: lease.item.payload });
    const item = await lease.settle('done', { handledBy: 'vite-example' });
    $('lease').textContent = `settled item ${item.id}: ${item.state}`;
  } finally {
    await client.close();
  }
}

$('setup').addEventListener('submit', async (event) => {
  event.preventDefault();
  $('run').disabled = true;
  $('error').textContent = '';
  try {
    await init();
    const store = await AgentStore.open('vite-example');
    try {
      await writeAndList(store);
      // The first export loads the package's import/export module (a chunk
      // and a wasm asset of its own that Vite splits off the main bundle).
      const snapshot = await store.exportSnapshot();
      $('exported').textContent = `${snapshot.trim().split('\n').length - 1} records exported`;
      await holdLease(store);
    } finally {
      store.close();
    }
  } catch (err) {
    $('error').textContent = `${err.name} (${err.code ?? '-'}): ${err.message}`;
  } finally {
    $('run').disabled = false;
    document.body.dataset.runs = String(Number(document.body.dataset.runs ?? 0) + 1);
  }
});
