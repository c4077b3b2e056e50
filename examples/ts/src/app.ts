// Type-checked against pkg/agentstore.d.ts with `tsc --noEmit` (strict). Every
// value below has a real type from the package: no `any` is needed or allowed
// to creep in (see the `Exact` assertions).
import init, {
  AgentStore,
  LeaseClient,
  type AgentRecord,
  type AgentStoreError,
  type ClaimLostError,
  type ConflictError,
  type ErrorCode,
  type IndexVerification,
  type Lease,
  type LeaseError,
  type LeaseItem,
  type UnreadableItem,
  type ListPage,
  type OpenOptions,
  type PouchImportSummary,
  type PutResult,
  type Stored,
  type Recovery,
  type WatchChange,
  type WorkStats,
} from 'agentstore';

/** Compile-time equality: `Exact<A, B>` is `true` only when A and B are the same type. */
type Exact<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
const same = <A, B>(ok: Exact<A, B>): Exact<A, B> => ok;

interface Agent extends AgentRecord {
  recordType: 'agent';
  name: string;
  runs?: number;
}

export async function records(): Promise<void> {
  await init();
  const options: OpenOptions = {
    blockedTimeoutMs: 5000,
    onVersionChange: () => console.log('closed by another tab'),
    indexes: [{ name: 'byType', keys: ['recordType', 'updatedAt'] }],
  };
  const store: AgentStore = await AgentStore.open('agents', options);
  await AgentStore.open('agents'); // options are optional
  // Where import/export code comes from (by default: import() beside the package).
  AgentStore.setIoModule(() => import('agentstore/io'));

  const agent: Agent = { _id: 'agent:1', recordType: 'agent', name: 'Triage bot' };
  const written = await store.put(agent);
  same<typeof written, PutResult>(true);
  const rev: string = written.rev;

  try {
    await store.put({ ...agent, _rev: rev, name: 'v2' });
  } catch (e) {
    const err = e as AgentStoreError;
    const code: ErrorCode = err.code;
    if (err.code === 'conflict') {
      const conflict = e as ConflictError;
      const current: AgentRecord | null | undefined = conflict.current;
      console.log(code, conflict.status, conflict.currentRev, current?._rev, conflict.failures?.[0]?.index);
    }
  }

  const got = await store.get('agent:1');
  same<typeof got, Stored | null>(true);
  // What a read gives back has its `_rev`: delete and compare-and-swap with it as it is.
  if (got) await store.delete(got._id, got._rev);
  const bumped = await store.mutate('agent:1', (cur) => (cur ? { ...cur, runs: Number(cur['runs'] ?? 0) + 1 } : undefined), {
    retries: 8,
    signal: AbortSignal.timeout(5000),
  });
  same<typeof bumped, PutResult | null>(true);
  await store.mutate('agent:2', async (cur) => cur ?? { _id: 'agent:2', recordType: 'agent' });
  // The result's `_id` may be left out: it is the id mutated.
  await store.mutate('agent:2', () => ({ recordType: 'agent', runs: 1 }));

  // An app's own record type, declared without AgentRecord's index
  // signature: put, putMany, get and getMany take it as PouchDB's
  // `db.get<T>()` does (given, or inferred from where the result goes).
  interface Task { _id: string; _rev?: string; title: string; done: boolean }
  const task: Task = { _id: 'task:1', title: 'triage', done: false };
  await store.put(task);
  await store.putMany([task, { ...task, _id: 'task:2' }]);
  const t: Task | null = await store.get('task:1');
  const t2 = await store.get<Task>('task:2');
  same<typeof t2, Stored<Task> | null>(true);
  // Every write sets `updatedAt`, also on a type that does not declare it (docs/api.md, `get`).
  const when: string | undefined = t2?.updatedAt;
  const tasks = await store.getMany<Task>(['task:1', 'task:2']);
  same<typeof tasks, (Stored<Task> | null)[]>(true);
  const open = (await store.list({ prefix: 'task:' })) as unknown as ListPage<Task>;
  const titles: string[] = open.records.map((r) => r.title);
  console.log(t?.done, t2?.title, titles, when);

  const many = await store.putMany([{ _id: 'a' }, { _id: 'b', recordType: 'note' }]);
  same<typeof many, PutResult[]>(true);

  let page: ListPage = await store.list({ prefix: 'agent:', limit: 50, descending: false });
  while (page.next) page = await store.list({ prefix: 'agent:', limit: 50, after: page.next });
  const first: AgentRecord | undefined = page.records[0];
  await store.deleteMany(page.records.map((r) => ({ id: r._id, rev: r._rev })));
  const byType = await store.listBy('byType', { eq: 'agent', descending: true, limit: 10 });
  await store.listBy('byType', { range: { lower: 'a', upper: 'b', upperOpen: true } });
  console.log(first?._id, byType.records.length);

  const tomb: string = await store.delete('b', many[1]?.rev ?? '');
  const report: IndexVerification = await store.verifyIndexes();
  const rebuilt: number = await store.rebuildIndexes({ batchSize: 200, onProgress: (done, total) => console.log(done / total) });
  console.log(tomb, report.missing.length, rebuilt);

  const watch = store.watch({ prefix: 'agent:' }, (change) => {
    same<typeof change, WatchChange>(true);
    const deleted: boolean = change.deleted;
    console.log(change.id, change.rev, deleted);
  });
  watch.close();

  const dump: string = await store.exportSnapshot();
  const restored = await store.importSnapshot(dump, { onProgress: (d, t) => console.log(d, t) });
  const summary: PouchImportSummary = await store.importPouchDump('', { legacyIndexId: 'agent-index' });
  console.log(restored.written, restored.keptNewer, summary.legacyIndex?.lost);
  store.close();
}

export async function leases(save: (refreshToken: string) => void): Promise<void> {
  const client = new LeaseClient('http://127.0.0.1:8787', {
    enrollmentToken: 'single-use',
    onCredentials: (c) => save(c.refreshToken),
    requestTimeoutMs: 30_000,
    journal: 'agentstore-leases',
  });
  const recovery: Recovery = await client.recover();
  console.log(recovery.released.length, recovery.resumed.map((l) => l.itemId));

  const lease = await client.claim('jobs', { signal: AbortSignal.timeout(10_000) });
  same<typeof lease, Lease | null>(true);
  if (lease) {
    const item: LeaseItem = lease.item;
    lease.signal.addEventListener('abort', () => {
      const why = lease.signal.reason as ClaimLostError;
      const reason: 'claim_lost' | 'expired_locally' | 'released' = why.reason;
      console.log(reason, why.itemId);
    });
    const ttl: number = await lease.heartbeat();
    const res: Response = await lease.fetch('/api/run', { method: 'POST', body: JSON.stringify(item.payload) });
    const settled: LeaseItem | UnreadableItem = await lease.settle('done', await res.json(), { error: 'none' });
    console.log(ttl, settled.state, lease.status, lease.epoch, lease.msToDeadline);
  }

  const worker = client.work(
    'jobs',
    async (l) => {
      l.throwIfLost();
      return { handled: l.itemId };
    },
    { concurrency: 4, pollIntervalMs: 5000 },
  );
  const stats: WorkStats = worker.stats;
  await worker.stop();
  const creds = client.credentials;
  same<typeof creds.refreshToken, string | null>(true);
  try {
    await client.close();
  } catch (e) {
    const err = e as LeaseError;
    console.log(err.name, err.code, err.status, err.retryAfterMs, stats.done);
  }
}

// What the docs and the runtime accept as "not given" (docs/api.md: `undefined`
// or `null`, for the options object or for one option), under
// exactOptionalPropertyTypes: a value that may be absent passes straight
// through, as the README Quickstart writes it.
export async function notGiven(maybe: { prefix?: string; limit?: number; signal?: AbortSignal }): Promise<void> {
  await init();
  const store = await AgentStore.open('quickstart');
  const cur = await store.get('agent:1');
  await store.put({ _id: 'agent:1', _rev: cur?._rev, recordType: 'agent', name: 'Triage bot' }); // README Quickstart line
  const page = await store.list({ prefix: 'run:', limit: 10 });
  await store.list({ prefix: 'run:', limit: 10, after: page.next }); // next is string | null
  await store.listBy('byType', { after: page.next });
  store.watch(null, () => {}).close();
  store.watch(undefined, () => {}).close();
  for (let after: string | null = null; ; ) {
    const p = await store.list({ after });
    console.log(p.records.length);
    if (!p.next) break;
    after = p.next;
  }
  for (let after: string | null = null; ; ) {
    const p: ListPage = await store.listBy('byType', { eq: ['agent'], after, limit: maybe.limit });
    if (!p.next) break;
    after = p.next;
  }

  // Every options object may be null, and every option undefined or null.
  await AgentStore.open('quickstart', null);
  await AgentStore.open('quickstart', { blockedTimeoutMs: undefined, onVersionChange: null, indexes: null });
  await AgentStore.destroy('scratch', null);
  await AgentStore.destroy('scratch', { blockedTimeoutMs: undefined });
  await store.list(null);
  await store.list({ prefix: maybe.prefix, type: null, limit: maybe.limit, descending: undefined });
  await store.listBy('byType', null);
  await store.listBy('byType', { eq: null, prefix: maybe.prefix, range: undefined, descending: null });
  await store.listBy('byType', { range: { lower: undefined, upper: null, lowerOpen: undefined, upperOpen: null } });
  await store.count(null);
  await store.count({ prefix: maybe.prefix, type: null });
  store.watch({ prefix: maybe.prefix }, () => {}).close();
  store.watch({ prefix: null }, () => {}).close();
  await store.mutate('agent:1', (c) => c ?? undefined, null);
  await store.mutate('agent:1', (c) => c ?? undefined, { retries: maybe.limit, signal: maybe.signal });
  await store.rebuildIndexes(null);
  await store.rebuildIndexes({ batchSize: undefined, onProgress: null, signal: maybe.signal, restart: null });
  await store.importSnapshot('', null);
  await store.importPouchDump('', { onProgress: undefined, signal: null, batchSize: maybe.limit, legacyIndexId: null });
  await store.exportSnapshot(null);
  await store.exportSnapshotBlob({ batchSize: maybe.limit });
  await store.exportSnapshotChunks((chunk) => console.log(chunk.length), { batchSize: null });
  // Callbacks written as docs/api.md writes them: an expression-bodied arrow
  // whose value is ignored (`progress.push(…)` returns a number), and a
  // thenable (PromiseLike), which the runtime awaits as it awaits a Promise.
  const progress: string[] = [];
  const chunks: string[] = [];
  const later: PromiseLike<void> = { then: (ok) => Promise.resolve().then(ok) };
  await store.importSnapshot('', { onProgress: (d, t) => progress.push(`${d}/${t}`) });
  await store.exportSnapshotChunks((c) => chunks.push(c));
  await store.exportSnapshotChunks(() => later, { onProgress: () => later });
  const stored: PromiseLike<AgentRecord | undefined> = { then: (ok) => Promise.resolve(undefined).then(ok) };
  await store.mutate('agent:1', () => stored);
  // Long calls take a signal and an onProgress, a returned Promise awaited.
  await store.exportSnapshot({ signal: maybe.signal, onProgress: async (done, total) => console.log(done / total) });
  await store.exportSnapshotChunks(async () => {}, { onProgress: null, signal: null });
  await store.verifyIndexes({ onProgress: (done, total) => console.log(done, total), signal: maybe.signal });
  await store.verifyIndexes(null);
  await store.dropIndex('old', { signal: maybe.signal });
  await store.dropIndex('old', null);
  await store.purgeTombstones({ olderThanMs: 0, onProgress: undefined, signal: maybe.signal });
  // A record's own optional fields may be given as undefined (dropped, as JSON.stringify does).
  const draft: AgentRecord = { _id: 'agent:3', _rev: cur?._rev, recordType: maybe.prefix, updatedAt: undefined };
  await store.putMany([draft, { _id: 'agent:4', _rev: undefined }]);
  await store.mutate('agent:3', (c) => (c ? { ...c, _rev: c._rev, updatedAt: undefined } : undefined));
  store.close();

  const client = new LeaseClient('http://127.0.0.1:8787', null);
  new LeaseClient('http://127.0.0.1:8787', {
    accessToken: undefined,
    refreshToken: null,
    enrollmentToken: maybe.prefix,
    name: null,
    onCredentials: undefined,
    requestTimeoutMs: maybe.limit,
    journal: null,
    webLocks: undefined,
    releaseOnPagehide: null,
    lockWaitMs: undefined,
    leaseHeaderOrigins: null,
    testTimerDelay: undefined,
  });
  await client.recover(null);
  await client.recover({ resume: undefined });
  const lease = await client.claim('jobs', { signal: maybe.signal }); // the lease option case
  await client.claim('jobs', null);
  if (lease) {
    await lease.fetch('/api/run', null);
    lease.prepareRequest('/api/run', null);
    await lease.settle('failed', undefined, { error: maybe.prefix });
    await lease.settle('done', null, null);
  }
  const worker = client.work('jobs', async () => null, null);
  client.work('jobs', async () => null, { concurrency: maybe.limit, pollIntervalMs: null, reconnectBaseMs: undefined, reconnectCapMs: null });
  await worker.stop();
  await client.close();
}

// Input arrays are only read (docs/api.md: arguments are read during the
// call), so readonly ones are taken as they are: a config constant declared
// `as const`, a `ReadonlyArray` from the app's state.
const INDEXES = [{ name: 'byType', keys: ['recordType', 'updatedAt'] }] as const;
export async function readonlyInputs(ids: readonly string[], tasks: ReadonlyArray<{ _id: string; title: string }>): Promise<void> {
  const store = await AgentStore.open('agents', { indexes: INDEXES });
  await store.getMany(ids);
  await store.putMany(tasks);
  const page = await store.list();
  const items: readonly { id: string; rev: string }[] = page.records.map((r) => ({ id: r._id, rev: r._rev }));
  await store.deleteMany(items);
  const key = ['agent', 3] as const;
  await store.listBy('byType', { eq: key });
  const origins: readonly string[] = ['https://api.example'];
  await new LeaseClient('http://127.0.0.1:8787', { leaseHeaderOrigins: origins }).close();
}
