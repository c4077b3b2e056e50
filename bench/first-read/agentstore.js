// Time to first read, agentstore's store-only entry point: init, open, one get.
import init, { AgentStore } from '/pkg/store/agentstore.js';
await init();
const store = await AgentStore.open('first-read');
await store.get('agent-001/rec-0001');
window.firstRead = performance.now();
