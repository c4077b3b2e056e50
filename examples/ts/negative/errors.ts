// Deliberate type errors: `tsc --noEmit -p negative/tsconfig.json` must FAIL,
// with exactly the errors marked `// error TSxxxx` on each line
// (tests/e2e/ts.test.mjs checks both). If the .d.ts degraded to `any`, these
// lines would compile and the check would fail.
import { AgentStore, LeaseClient } from 'agentstore';

export async function wrong(): Promise<void> {
  const store = await AgentStore.open('agents', { blockedTimeoutMs: '5s' }); // error TS2322
  await store.put({ name: 'no id' }); // error TS2353 (TypeScript 5: TS2345)
  await store.list({ limit: '50' }); // error TS2322
  await store.get(42); // error TS2345
  const page = await store.list();
  const n: number = page.next; // error TS2322
  store.watch({ prefix: 'a' }, (change) => change.revision); // error TS2339
  const client = new LeaseClient('http://127.0.0.1:8787', { accesToken: 'typo' }); // error TS2561
  const lease = await client.claim('jobs');
  await lease?.settle('finished'); // error TS2345
  const epoch: string | undefined = lease?.epoch; // error TS2322
  client.work('jobs', async (l) => l.itemID); // error TS2551
  // "Not given" is undefined or null, nothing else; `_rev: null` and a required option are refused at runtime.
  await store.put({ _id: 'a', _rev: null }); // error TS2322
  await store.purgeTombstones(null); // error TS2345
  await store.purgeTombstones({ olderThanMs: undefined }); // error TS2322
  await store.mutate('a', () => null); // error TS2322
  await store.list({ after: 0 }); // error TS2322
  await client.claim('jobs', 'now'); // error TS2559
  const task = await store.get<{ _id: string; title: string }>('t');
  const done: boolean | undefined = task?.title; // error TS2322
  await store.put({ _id: 7, title: 'id not a string' }); // error TS2322
  // PouchDB's way to delete is refused by put (fields starting with `_` but _id and _rev).
  await store.put({ _id: 'a', _rev: '1-a', _deleted: true }); // error TS2322
  await store.mutate('a', (c) => (c ? { ...c, _deleted: true } : undefined)); // error TS2322
  // Every field `put` refuses at compile time, `mutate`'s result refuses too (runtime: a ValidationError).
  await store.mutate('a', (c) => (c ? { ...c, _local_seq: 1 } : undefined)); // error TS2322
  console.log(done);
  console.log(n, epoch);
}
