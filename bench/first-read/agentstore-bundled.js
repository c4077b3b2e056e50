// Time to first read, agentstore's store-only entry point as an app ships it:
// the glue bundled into the app's script (esbuild, as for Dexie), and the
// wasm fetched from a <link rel="preload"> in the page (see README, Package),
// so its download starts with the script's instead of after it.
import init, { AgentStore } from '../../pkg/store/agentstore.js';
await init({ module_or_path: '/pkg/store/agentstore_bg.wasm' });
const store = await AgentStore.open('first-read');
await store.get('agent-001/rec-0001');
window.firstRead = performance.now();
