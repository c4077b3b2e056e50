#!/usr/bin/env node
// A tiny static server with the same layout as agentstore-server's demo host:
// `--www DIR` at `/` and `--pkg DIR` at `/pkg/`, `.wasm` as `application/wasm`.
// scripts/demo.sh falls back to it when the lease server does not build.
//
//   node tests/e2e/static-server.mjs --listen 127.0.0.1:8787 --www www --pkg pkg

import { createServer } from 'node:http';
import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { extname, join, resolve, sep } from 'node:path';

const MIME = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.ndjson': 'application/x-ndjson',
  '.wasm': 'application/wasm',
  '.ts': 'text/plain; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.txt': 'text/plain; charset=utf-8',
};

function parseArgs(argv) {
  const opts = { listen: '127.0.0.1:8787', www: 'www', pkg: 'pkg' };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    if (!(key in opts) || argv[i + 1] === undefined) {
      console.error(`usage: static-server.mjs [--listen HOST:PORT] [--www DIR] [--pkg DIR] (bad argument ${argv[i]})`);
      process.exit(2);
    }
    opts[key] = argv[i + 1];
  }
  return opts;
}

/** Maps a URL path into `root`, refusing anything that escapes it. */
function within(root, urlPath) {
  const full = resolve(root, '.' + urlPath);
  return full === root || full.startsWith(root + sep) ? full : null;
}

const opts = parseArgs(process.argv.slice(2));
const wwwRoot = resolve(opts.www);
const pkgRoot = resolve(opts.pkg);
const colon = opts.listen.lastIndexOf(':');
const host = opts.listen.slice(0, colon);
const port = Number(opts.listen.slice(colon + 1));

const server = createServer(async (req, res) => {
  try {
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD' }).end();
      return;
    }
    let path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    let file;
    if (path === '/pkg' || path.startsWith('/pkg/')) file = within(pkgRoot, path.slice(4) || '/');
    else file = within(wwwRoot, path);
    if (file === null) {
      res.writeHead(403).end('forbidden');
      return;
    }
    let info = await stat(file).catch(() => null);
    if (info?.isDirectory()) {
      file = join(file, 'index.html');
      info = await stat(file).catch(() => null);
    }
    if (!info?.isFile()) {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found');
      return;
    }
    res.writeHead(200, {
      'content-type': MIME[extname(file)] ?? 'application/octet-stream',
      'content-length': info.size,
      'cache-control': 'no-cache',
    });
    if (req.method === 'HEAD') res.end();
    else createReadStream(file).pipe(res);
  } catch (err) {
    res.writeHead(400, { 'content-type': 'text/plain' }).end(String(err.message));
  }
});

server.listen(port, host, () => {
  const { port: actual } = server.address();
  console.log(`static server: http://${host}:${actual}/ (www=${wwwRoot}, pkg=${pkgRoot})`);
});
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => {
    server.close();
    server.closeAllConnections?.();
    process.exit(0);
  });
}
