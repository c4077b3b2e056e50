import { defineConfig, searchForWorkspaceRoot } from 'vite';
// `agentstore` is linked from ../../pkg ("file:../../pkg"): outside this root, so the
// dev server must be allowed to serve it (its .wasm files are fetched by URL).
export default defineConfig({ server: { fs: { allow: [searchForWorkspaceRoot(process.cwd()), '../../pkg'] } } });
