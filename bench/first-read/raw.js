// Time to first read, raw IndexedDB: open, then one get.
const t = await new Promise((resolve, reject) => {
  const r = indexedDB.open('first-read', 1);
  r.onupgradeneeded = () => r.result.createObjectStore('records', { keyPath: '_id' });
  r.onerror = () => reject(r.error);
  r.onsuccess = () => {
    const g = r.result.transaction('records').objectStore('records').get('agent-001/rec-0001');
    g.onsuccess = () => resolve(performance.now());
    g.onerror = () => reject(g.error);
  };
});
window.firstRead = t;
