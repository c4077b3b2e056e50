// Glue between a contender module and the Node driver (run-browser.mjs):
// exposes window.bench = {name, init, seed, run(workload, run)}.
// A workload returns {ms, ok, note?}: ms covers only the measured work;
// opening, creating and deleting databases happen outside the timer.

export const now = () => performance.now();

export async function timed(fn) {
  const t0 = now();
  const out = await fn();
  return { ms: now() - t0, out };
}

export function deleteDb(name) {
  return new Promise((resolve, reject) => {
    const r = indexedDB.deleteDatabase(name);
    r.onsuccess = () => resolve();
    r.onerror = () => reject(r.error);
    r.onblocked = () => setTimeout(resolve, 50);
  });
}

export function register(impl) {
  window.bench = {
    name: impl.name,
    has: (w) => typeof impl[`w${w}`] === 'function',
    init: async () => {
      if (impl.init) await impl.init();
      return true;
    },
    seed: async () => {
      const t0 = now();
      await impl.seed();
      return now() - t0;
    },
    // 100 one-record readwrite transactions on a scratch database (ms): the
    // driver repeats it after seeding until the disk has settled.
    probe: async () => {
      await deleteDb('bench-probe');
      const db = await new Promise((res, rej) => {
        const r = indexedDB.open('bench-probe', 1);
        r.onupgradeneeded = () => r.result.createObjectStore('s');
        r.onsuccess = () => res(r.result);
        r.onerror = () => rej(r.error);
      });
      const t0 = now();
      for (let i = 0; i < 100; i++) {
        await new Promise((res, rej) => {
          const tx = db.transaction('s', 'readwrite');
          tx.objectStore('s').put({ i }, 'k');
          tx.oncomplete = res;
          tx.onabort = () => rej(tx.error);
        });
      }
      const ms = now() - t0;
      db.close();
      await deleteDb('bench-probe');
      return ms;
    },
    run: async (w, run) => {
      try {
        return await impl[`w${w}`](run);
      } catch (e) {
        return { ms: NaN, ok: false, note: `${e && e.name}: ${e && e.message}` };
      }
    },
  };
}
