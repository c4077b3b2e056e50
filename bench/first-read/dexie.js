// Time to first read, Dexie 4: open, then one get.
import Dexie from 'dexie';
const db = new Dexie('first-read');
db.version(1).stores({ records: '_id' });
await db.records.get('agent-001/rec-0001');
window.firstRead = performance.now();
