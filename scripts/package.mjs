#!/usr/bin/env node
// Completes pkg/package.json after `wasm-pack build --target web` (see
// scripts/build-pkg.sh, which builds both entry points first).
//
//   node scripts/package.mjs [pkg-dir]      (default: pkg)
//
// Two entry points: "." (store + lease client) and "./store" (the
// store-only build in <pkg-dir>/store/, built with --no-default-features):
// an app importing "agentstore/store" downloads no lease code.
//
// wasm-pack writes name, version, description, license, repository, keywords,
// `main`, `types` and `files` from Cargo.toml. This adds what it cannot:
// `exports` (one entry point that bundlers, Node-style resolvers and
// TypeScript agree on, plus the .wasm file as a subpath so a bundler can be
// asked for its URL), `module`, `sideEffects: false` (the glue only touches
// its own module state at load time, so an unused import can be dropped) and
// the README in `files`. It also makes the .d.ts reference the lib it needs,
// and drops the wasm's `name` and `producers` custom sections (function names
// for debuggers and the toolchain's versions: about 6.7 kB raw, 0.9 kB gzipped,
// that no browser or bundler reads; wasm-pack has no option to leave them out),
// and minifies the JS glue with esbuild (a source map with the original text
// ships beside it).
// Idempotent: running it twice writes the same files.

import { createHash } from 'node:crypto';
import { existsSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { basename, join, relative, resolve, sep } from 'node:path';
import { transformSync } from 'esbuild';

const dir = resolve(process.argv[2] ?? 'pkg');
const path = join(dir, 'package.json');
if (!existsSync(path)) {
  console.error(`${path} is missing: run scripts/build-pkg.sh (wasm-pack build --target web --out-dir pkg) first`);
  process.exit(1);
}
const pkg = JSON.parse(readFileSync(path, 'utf8'));
const need = (field) => {
  if (pkg[field] === undefined) throw new Error(`pkg/package.json has no ${field} (check Cargo.toml)`);
};
['name', 'version', 'description', 'license', 'repository', 'keywords'].forEach(need);

const bare = (f) => f.replace(/^\.\//, ''); // a second run reads "./x.js"
const js = bare(pkg.main ?? `${pkg.name}.js`);
const types = bare(pkg.types ?? js.replace(/\.js$/, '.d.ts'));
const wasm = js.replace(/\.js$/, '_bg.wasm');
for (const f of [js, types, wasm]) {
  if (!existsSync(join(dir, f))) throw new Error(`${f} is missing from ${dir}`);
}
// wasm-pack lists ./snippets/* as side-effectful when the crate has JS
// snippets; keep that, otherwise nothing is.
const hasSnippets = () => existsSync(join(dir, 'snippets'));

// wasm-bindgen's classes declare `[Symbol.dispose]()`, which only type-checks
// with the `esnext.disposable` lib; reference it from the .d.ts so projects
// on `lib: ["es2022", "dom"]` without `skipLibCheck` compile too.
const REF = '/// <reference lib="esnext.disposable" />\n';
const NOTE = {
  full:
    '/**\n * Entry point "agentstore": the record store (AgentStore) and the lease client\n' +
    ' * (LeaseClient, LeaseWorker). An app that uses only AgentStore should import\n' +
    ' * "agentstore/store" instead: the same store API, without the lease code.\n */\n',
  store:
    '/**\n * Entry point "agentstore/store": the record store only (AgentStore, its\n' +
    ' * options and errors). The lease client lives in "agentstore".\n */\n',
  io:
    '/**\n * "agentstore/io": the import/export module both entry points load on the\n' +
    ' * first import or export. Import it only to hand it to\n' +
    ' * AgentStore.setIoModule (e.g. in a service worker, where import() is not allowed).\n */\n',
};
// The record methods take and give the app's own record type, as PouchDB's
// `db.get<T>()` does: `store.get<Agent>(id)`, or inferred from where the
// result goes (`const a: Agent | null = await store.get(id)`), and
// `put(agent)` for an `interface Agent { _id: string; ... }`, which
// `AgentRecord`'s index signature refused (TS2345). wasm-bindgen cannot
// declare a method's type parameters, so they are written in here; a
// signature not found (the Rust side changed) fails the build. `list` and
// `listBy` stay as they are: a generic call has no return type until its
// arguments are checked, so the usual paging loop (`const p = await
// store.list({after}); ... after = p.next;`) would stop compiling (TS7022).
const T = 'T extends RecordInput = AgentRecord';
const TYPED = [
  ['getMany(ids: readonly string[]): Promise<(Stored | null)[]>;', `getMany<${T}>(ids: readonly string[]): Promise<(Stored<T> | null)[]>;`],
  ['get(id: string): Promise<Stored | null>;', `get<${T}>(id: string): Promise<Stored<T> | null>;`],
  ['putMany(records: readonly AgentRecord[]): Promise<PutResult[]>;', `putMany<${T}>(records: readonly T[]): Promise<PutResult[]>;`],
  ['put(record: AgentRecord): Promise<PutResult>;', `put<${T}>(record: T): Promise<PutResult>;`],
];
const typedRecords = (text, file) => {
  if (!text.includes('export class AgentStore {') || !text.includes('    getMany(')) return text;
  for (const [from, to] of TYPED) {
    if (text.includes(to)) continue;
    if (!text.includes(`    ${from}`)) throw new Error(`${file}: no \`${from}\` to give its type parameter`);
    text = text.replace(`    ${from}`, `    ${to}`);
  }
  return text;
};
// The classes whose free() and [Symbol.dispose]() start a teardown method
// (see __agentstoreGuard in minifyGlue), and the doc comments their .d.ts
// gets for it, with [Symbol.asyncDispose]().
const TEARDOWN = { LeaseClient: 'close', LeaseWorker: 'stop' };
const TEARDOWN_DOCS = {
  LeaseClient:
    'Closes the client: starts `close()` (its leases settled or released, its `work()` loops\n' +
    '     * ended), then frees the object. `using client = new LeaseClient(…)` closes it at the end\n' +
    '     * of the block, `await using` also waits for `close()`. The garbage collector frees an\n' +
    '     * unreachable client without closing it.',
  LeaseWorker:
    'Stops the worker: starts `stop()` (nothing more is claimed; running handlers finish and\n' +
    '     * settle), then frees the object. `using worker = client.work(…)` stops it at the end of\n' +
    '     * the block, `await using` also waits for `stop()`. The garbage collector frees an\n' +
    '     * unreachable worker without stopping it: it runs until `stop()`, `client.close()` or an\n' +
    '     * error ends it.',
};
const documentTeardown = (text) => {
  for (const [cls, method] of Object.entries(TEARDOWN)) {
    const head = `export class ${cls} {`;
    const at = text.indexOf(head);
    if (at < 0) continue;
    const end = text.indexOf('\n}', at);
    const body = text.slice(at, end);
    if (body.includes('[Symbol.asyncDispose]')) continue;
    const plain = '    free(): void;\n    [Symbol.dispose](): void;\n';
    if (!body.includes(plain)) throw new Error(`${cls}: free() and [Symbol.dispose]() not found in the .d.ts: update package.mjs`);
    const doc = `    /**\n     * ${TEARDOWN_DOCS[cls]}\n     */\n`;
    const typed =
      `${doc}    free(): void;\n` +
      `${doc}    [Symbol.dispose](): void;\n` +
      `    /**\n     * As \`[Symbol.dispose]()\`, and resolves when \`${method}()\` does (\`await using\`).\n     */\n` +
      '    [Symbol.asyncDispose](): Promise<void>;\n';
    text = text.slice(0, at) + body.replace(plain, typed) + text.slice(end);
  }
  return text;
};
const completeDts = (file, note) => {
  let text = typedRecords(readFileSync(file, 'utf8'), file);
  if (!text.includes(note)) text = note + text;
  text = documentTeardown(text);
  if (text.includes('Symbol.dispose') && !text.startsWith(REF)) text = REF + text;
  writeFileSync(file, text);
};
completeDts(join(dir, types), NOTE.full);
const sub = 'store';
const hasStore = existsSync(join(dir, sub, js));
if (hasStore) completeDts(join(dir, sub, types), NOTE.store);

// A wasm module is an 8-byte header and then sections: an id byte, a LEB128
// byte size and the payload; a custom section (id 0) starts its payload with
// its name (LEB128 length + UTF-8). Copies every section but the dropped
// ones, and renames the module's imports from its own glue.
//
// The import names wasm-bindgen writes (`__wbg_get_7ce8eee7fd327545`: the
// binding's name and a 16-digit hash) are spelled twice, in the .wasm's
// import section and as the keys of the glue's import object, and the hex
// hashes do not compress: 142 imports cost about 2.7 kB of the store
// module gzipped and 2.2 kB of its glue. Each import of `glueModule` (the
// glue's own module name, e.g. "./agentstore_bg.js") becomes `$` and its
// index in base 36, in the .wasm and in `glue` alike (replaced as whole
// identifiers; they are unique). Snippet imports (js/*.js) keep their
// field names; their module names (`./snippets/<crate>-<hash>/js/promise.js`,
// once per import) become `$0`, `$1`, … too, and so do the exports (see
// `exportSection`). Renamed names start with `$`, so a second run renames nothing.
const DROP = new Set(['name', 'producers', 'target_features']);

// wasm-bindgen's closure invocation shims that nothing can call.
//
// Every `#[wasm_bindgen]` import taking a closure (`&mut dyn FnMut(…)`) has
// a descriptor function that takes the address of its shim
// (`wasm_bindgen::convert::closures::_::invoke::<…>`), which puts the shim
// in the function table. js-sys declares dozens of such imports (the typed
// arrays' `forEach`/`find`/…, `Array.prototype.flatMap`, `Map.forEach`): the
// CLI runs the descriptors and removes them and the unused imports, but keeps
// the table whole, so each of those shims stays in the module with nothing
// left to call it (42 shims, 4.4 kB of code in the store module; the same
// retention is wasm-bindgen/wasm-bindgen#2535). The glue calls the shims it
// uses by export name, never through the table, and Rust code reaches the
// table only through vtables and function pointers it took itself.
//
// A function is dead here when the name section (present: build-pkg.sh
// builds with `strip = false`; the section is dropped below) names it as
// such a shim, it is not exported, and no `call`, `return_call` or
// `ref.func` of its index appears anywhere in the code section (a scan of
// every byte for the opcode and the index's LEB128: it may find references
// that are not there, never miss one). Its body becomes `unreachable`; its
// index, table slot and type stay, so nothing else in the module moves.
// Returns the set of dead function indices, with `firstBody` (the index of
// the code section's first body: the imported functions come first).
const deadClosureShims = (b, leb, file) => {
  const sections = new Map();
  let names = null;
  const at = { p: 8 };
  while (at.p < b.length) {
    const id = b[at.p++];
    const size = leb(at);
    const start = at.p;
    at.p += size;
    if (id !== 0) {
      sections.set(id, [start, at.p]);
      continue;
    }
    const q = { p: start };
    const n = leb(q);
    if (b.subarray(q.p, q.p + n).toString('utf8') === 'name') names = [q.p + n, at.p];
  }
  const dead = new Set();
  let firstBody = 0;
  if (sections.has(2)) {
    const q = { p: sections.get(2)[0] };
    // (`skip` reads the length before it moves: `q.p += leb(q)` would add
    // the length to the position before the LEB128.)
    const skip = (r) => {
      const n = leb(r);
      r.p += n;
    };
    for (let i = leb(q); i > 0; i--) {
      skip(q);
      skip(q);
      const kind = b[q.p++];
      if (kind === 0) {
        leb(q);
        firstBody++;
      } else if (kind === 1) {
        q.p++;
        const flags = b[q.p++];
        leb(q);
        if (flags & 1) leb(q);
      } else if (kind === 2) {
        const flags = b[q.p++];
        leb(q);
        if (flags & 1) leb(q);
      } else if (kind === 3) q.p += 2;
      else if (kind === 4) {
        q.p++;
        leb(q);
      } else throw new Error(`${file}: an import of unknown kind ${kind}`);
    }
  }
  dead.firstBody = firstBody;
  if (!names || !sections.has(10)) return dead;
  const shim = /^wasm_bindgen\[[0-9a-f]+\]::convert::closures::_::invoke::<.*>$/;
  const q = { p: names[0] };
  while (q.p < names[1]) {
    const sub = b[q.p++];
    const size = leb(q);
    const end = q.p + size;
    if (sub === 1) {
      for (let i = leb(q); i > 0; i--) {
        const idx = leb(q);
        const n = leb(q);
        if (shim.test(b.subarray(q.p, q.p + n).toString('utf8'))) dead.add(idx);
        q.p += n;
      }
    }
    q.p = end;
  }
  if (sections.has(7)) {
    const e = { p: sections.get(7)[0] };
    for (let i = leb(e); i > 0; i--) {
      const n = leb(e);
      e.p += n;
      const kind = b[e.p++];
      const idx = leb(e);
      if (kind === 0) dead.delete(idx);
    }
  }
  const [codeStart, codeEnd] = sections.get(10);
  for (let p = codeStart; p < codeEnd && dead.size > 0; p++) {
    const op = b[p];
    if (op !== 0x10 && op !== 0x12 && op !== 0xd2) continue;
    let idx = 0;
    let shift = 0;
    for (let r = p + 1; r < codeEnd && shift < 35; r++, shift += 7) {
      idx += (b[r] & 0x7f) * 2 ** shift;
      if (!(b[r] & 0x80)) break;
    }
    dead.delete(idx);
  }
  return dead;
};
const slimWasm = (file, glue, glueModule) => {
  const b = readFileSync(file);
  const leb = (at) => {
    let n = 0;
    let shift = 0;
    let byte;
    do {
      byte = b[at.p++];
      n += (byte & 0x7f) * 2 ** shift;
      shift += 7;
    } while (byte & 0x80);
    return n;
  };
  const encLeb = (n) => {
    const out = [];
    do {
      let byte = n & 0x7f;
      n = Math.floor(n / 128);
      if (n > 0) byte |= 0x80;
      out.push(byte);
    } while (n > 0);
    return Buffer.from(out);
  };
  const encName = (text) => {
    const bytes = Buffer.from(text, 'utf8');
    return Buffer.concat([encLeb(bytes.length), bytes]);
  };
  const renamed = new Map();
  // Snippet module names (`./snippets/<crate>-<hash>/js/promise.js`) and
  // their short names.
  const modules = new Map();
  // Exports renamed (see `exportSection`), and their short names.
  const exportsRenamed = new Map();
  const glueText = readFileSync(glue, 'utf8');
  // The export section: a count, then per export its name, a kind byte and
  // an index. `memory` keeps its name (a caller of `init()` may read it);
  // any other export the glue reads only as `wasm.<name>` (or not at all)
  // becomes `$` and a number in base 36 (renamed exports start with `$`,
  // so a second run renames nothing). The names (`agentstore_putMany`,
  // `__wasm_bindgen_func_elem_1364`) are spelled in the .wasm and again in
  // the glue.
  const exportSection = (start, end) => {
    const at = { p: start };
    const count = leb(at);
    const parts = [encLeb(count)];
    for (let i = 0; i < count; i++) {
      const n = leb(at);
      const field = b.subarray(at.p, at.p + n).toString('utf8');
      at.p += n;
      const descStart = at.p;
      at.p++;
      leb(at);
      let out = field;
      const name = field.replace(/\$/g, '\\$');
      const count = (re) => (glueText.match(new RegExp(re, 'g')) ?? []).length;
      // Every property read of the name is `wasm.<name>` and no string
      // spells it (a JS function of the same name that calls the export
      // is the glue's own identifier, not a read of the export).
      const safe = count(`\\.${name}\\b`) === count(`\\bwasm\\.${name}\\b`) && count(`["'\`]${name}["'\`]`) === 0;
      if (field !== 'memory' && !field.startsWith('$') && safe) {
        out = `$${exportsRenamed.size.toString(36)}`;
        exportsRenamed.set(field, out);
      }
      parts.push(encName(out), b.subarray(descStart, at.p));
    }
    if (at.p !== end) throw new Error(`${file}: the export section did not parse to its end`);
    return Buffer.concat(parts);
  };
  // The import section: a count, then per import its module and field
  // names and a description (kind byte and its kind's fields).
  const importSection = (start, end) => {
    const at = { p: start };
    const name = () => {
      const n = leb(at);
      const text = b.subarray(at.p, at.p + n).toString('utf8');
      at.p += n;
      return text;
    };
    const count = leb(at);
    const parts = [encLeb(count)];
    for (let i = 0; i < count; i++) {
      const module = name();
      const field = name();
      const descStart = at.p;
      const kind = b[at.p++];
      if (kind === 0) leb(at); // function: type index
      else if (kind === 1) {
        at.p++; // table: reference type, then limits
        const flags = b[at.p++];
        leb(at);
        if (flags & 1) leb(at);
      } else if (kind === 2) {
        const flags = b[at.p++]; // memory: limits
        leb(at);
        if (flags & 1) leb(at);
      } else if (kind === 3) at.p += 2; // global: value type, mutability
      else if (kind === 4) {
        at.p++; // tag: attribute, type index
        leb(at);
      } else throw new Error(`${file}: import ${module}.${field} of unknown kind ${kind}`);
      let out = field;
      if (module === glueModule && !field.startsWith('$')) {
        out = `$${renamed.size.toString(36)}`;
        renamed.set(field, out);
      }
      let outModule = module;
      if (module.startsWith('./snippets/')) {
        if (!modules.has(module)) modules.set(module, `$${modules.size.toString(36)}`);
        outModule = modules.get(module);
      }
      parts.push(encName(outModule), encName(out), b.subarray(descStart, at.p));
    }
    if (at.p !== end) throw new Error(`${file}: the import section did not parse to its end`);
    return Buffer.concat(parts);
  };
  const dead = deadClosureShims(b, leb, file);
  // The code section: a count, then per function a LEB128 size and its
  // body; the bodies of `dead` functions become `unreachable`.
  const codeSection = (start, end) => {
    const at = { p: start };
    const count = leb(at);
    const parts = [encLeb(count)];
    for (let i = 0; i < count; i++) {
      const size = leb(at);
      if (dead.has(dead.firstBody + i)) parts.push(Buffer.from([3, 0, 0x00, 0x0b]));
      else parts.push(encLeb(size), b.subarray(at.p, at.p + size));
      at.p += size;
    }
    if (at.p !== end) throw new Error(`${file}: the code section did not parse to its end`);
    return Buffer.concat(parts);
  };
  const kept = [b.subarray(0, 8)];
  const at = { p: 8 };
  while (at.p < b.length) {
    const start = at.p;
    const id = b[at.p++];
    const size = leb(at);
    const end = at.p + size;
    let name = null;
    if (id === 0) {
      const n = leb(at);
      name = b.subarray(at.p, at.p + n).toString('utf8');
    }
    if (id === 2 || id === 7 || (id === 10 && dead.size > 0)) {
      const payload = (id === 2 ? importSection : id === 7 ? exportSection : codeSection)(at.p, end);
      kept.push(Buffer.from([id]), encLeb(payload.length), payload);
    } else if (!DROP.has(name)) kept.push(b.subarray(start, end));
    at.p = end;
  }
  if (renamed.size + modules.size + exportsRenamed.size > 0) {
    let text = glueText;
    for (const [from, to] of renamed) {
      const re = new RegExp(`\\b${from.replace(/\$/g, '\\$')}\\b`, 'g');
      if (!re.test(text)) throw new Error(`${glue} does not name the import ${from}`);
      text = text.replace(re, () => to);
    }
    for (const [from, to] of exportsRenamed) {
      text = text.replace(new RegExp(`\\bwasm\\.${from.replace(/\$/g, '\\$')}\\b`, 'g'), () => `wasm.${to}`);
    }
    // The import object names each snippet once per binding that uses it
    // (`"./snippets/…/promise.js": import3,` four times, the same
    // namespace): the first entry is kept, under the short name.
    for (const [from, to] of modules) {
      const quoted = from.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
      let first = true;
      const re = new RegExp(`^(\\s*)(["'])${quoted}\\2: ([\\w$]+),?\\n`, 'gm');
      const before = text;
      text = text.replace(re, (_, indent, _q, value) => {
        const line = first ? `${indent}"${to}": ${value},\n` : '';
        first = false;
        return line;
      });
      if (text === before) throw new Error(`${glue} does not list the snippet module ${from} in its imports`);
    }
    writeFileSync(glue, text);
  }
  // The declarations of the exports (`InitOutput` in the glue's .d.ts, what
  // `init()` resolves to; the .wasm's own .d.ts) follow the new names.
  for (const dts of [glue.replace(/\.js$/, '.d.ts'), `${file}.d.ts`]) {
    if (exportsRenamed.size === 0 || !existsSync(dts)) continue;
    let text = readFileSync(dts, 'utf8');
    for (const [from, to] of exportsRenamed) {
      const name = from.replace(/\$/g, '\\$');
      text = text.replace(new RegExp(`(readonly |export const )${name}:`, 'g'), (_, pre) => `${pre}${to}:`);
    }
    writeFileSync(dts, text);
  }
  const out = Buffer.concat(kept);
  // Every rewrite above must leave a module the engine takes.
  if (!WebAssembly.validate(out)) throw new Error(`${file}: the slimmed module does not validate`);
  writeFileSync(file, out);
  stubbed.push(`${file.slice(dir.length + 1)} ${dead.size}`);
};
// Per module, how many unreachable closure shims lost their code.
const stubbed = [];
slimWasm(join(dir, wasm), join(dir, js), `./${wasm.replace(/\.wasm$/, '.js')}`);
if (hasStore) slimWasm(join(dir, sub, wasm), join(dir, sub, js), `./${wasm.replace(/\.wasm$/, '.js')}`);
// pkg/io/: the `io` build both entry points load on the first import or
// export (through io-loader.js); not an entry point of its own.
const ioSub = 'io';
const ioJs = 'agentstore_io.js';
const ioTypes = 'agentstore_io.d.ts';
const ioWasm = 'agentstore_io_bg.wasm';
const hasIo = existsSync(join(dir, ioSub, ioJs));
if (hasIo) {
  slimWasm(join(dir, ioSub, ioWasm), join(dir, ioSub, ioJs), `./${ioWasm.replace(/\.wasm$/, '.js')}`);
  completeDts(join(dir, ioSub, ioTypes), NOTE.io);
}

// One id for this build: a digest of every wasm file of the package. The
// loader inlined below compares it with the io module's AGENTSTORE_RELEASE
// and refuses an io module of another build before fetching its wasm.
const release = (() => {
  const h = createHash('sha256');
  for (const f of [join(dir, wasm), join(dir, sub, wasm), join(dir, ioSub, ioWasm)]) {
    if (existsSync(f)) h.update(readFileSync(f));
  }
  return h.digest('hex').slice(0, 16);
})();
if (hasIo) {
  const ioGlue = join(dir, ioSub, ioJs);
  const line = `export const AGENTSTORE_RELEASE = '${release}';\n`;
  const text = readFileSync(ioGlue, 'utf8');
  // Once minified (a second run), the glue already exports it.
  if (!text.includes(`//# sourceMappingURL=${ioJs}.map`)) {
    writeFileSync(ioGlue, text.replace(/^export const AGENTSTORE_RELEASE = .*\n/m, '') + line);
  }
  const types = join(dir, ioSub, ioTypes);
  const decl = '/** The build this module belongs to (compared by the entry points before they load it). */\nexport const AGENTSTORE_RELEASE: string;\n';
  const dts = readFileSync(types, 'utf8');
  if (!dts.includes('AGENTSTORE_RELEASE')) writeFileSync(types, dts + decl);
}

// Inlines the wasm-bindgen snippet `js/<name>` into the glue `root/<glue>`
// as a module-local object (one module request fewer before `init` can
// start), passing its text through `edit` first. Idempotent: a glue that no
// longer imports the snippet is left alone. The snippets directory goes once
// no glue import names it.
const inlineSnippet = (root, glue, name, edit = (body) => body) => {
  const file = join(root, glue);
  const quoted = name.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  let text = readFileSync(file, 'utf8');
  // wasm-bindgen imports a snippet's functions by name when they need a JS
  // shim (`import { a, b } from '…'`) and as a namespace handed straight to
  // the wasm imports when they do not (`import * as import1 from "…"`).
  const IMPORT = new RegExp(
    `import (?:\\{ ([\\w$, ]+) \\}|\\* as ([\\w$]+)) from (['"])(\\./snippets/[^'"]+/js/${quoted})\\3;?\\n`,
    'g',
  );
  const found = [...text.matchAll(IMPORT)];
  if (found.length) {
    const snippet = readFileSync(join(root, found[0][4]), 'utf8');
    const exported = [...snippet.matchAll(/^export (?:async )?function ([\w$]+)/gm)].map((x) => x[1]);
    const body = edit(snippet.replace(/^export (async )?function /gm, '$1function '));
    if (/^(export|import) /m.test(body)) throw new Error(`js/${name} has imports or non-function exports: update inlineSnippet`);
    const local = `__agentstore_${name.replace(/\W/g, '_')}`;
    const def = `const ${local} = (() => {\n${body}\nreturn { ${exported.join(', ')} };\n})();\n`;
    let first = true;
    text = text.replace(IMPORT, (_, names, ns) => {
      const bind = names ? `const { ${names} } = ${local};\n` : `const ${ns} = ${local};\n`;
      const out = (first ? def : '') + bind;
      first = false;
      return out;
    });
    writeFileSync(file, text);
    if (!/from ['"]\.\/snippets\//.test(text)) rmSync(join(root, 'snippets'), { recursive: true, force: true });
  }
  // A glue still naming the snippet (wasm-bindgen changed how it imports
  // snippets) would load it from a path where it is not.
  // (The wasm's import module names, keys of the imports object, were
  // already shortened by `slimWasm` and are not touched here.)
  if (new RegExp(`from\\s*['"][^'"]*/${quoted}['"]`).test(readFileSync(file, 'utf8'))) {
    throw new Error(`${file}: js/${name} was not inlined`);
  }
};

// The import/export loader (js/io-loader.js, a wasm-bindgen snippet of both
// entry points) is inlined into each entry's glue: as a snippet file it
// would be one more module request before `init` can start (two round trips
// on a slow link, as the glue's import of it is discovered only after the
// glue arrives). Its `import('./io/agentstore_io.js')` is rewritten relative to
// the glue's own directory, so that bundlers still see a literal path and
// split pkg/io/ into a chunk of its own.
const inlineIoLoader = (root) =>
  inlineSnippet(root, js, 'io-loader.js', (body) => {
    let rel = relative(root, join(dir, ioSub, ioJs)).split(sep).join('/');
    if (!rel.startsWith('.')) rel = `./${rel}`;
    const target = "import('./io/agentstore_io.js')";
    const out = body.replace("const RELEASE = '__AGENTSTORE_RELEASE__';", `const RELEASE = '${release}';`);
    if (!out.includes(target) || !out.includes(`const RELEASE = '${release}';`)) throw new Error('js/io-loader.js changed: update inlineIoLoader');
    return out.replace(target, `import('${rel}')`);
  });
// The write path's walk (js/walk.js) and the Promises made in JS
// (js/promise.js), snippets of every build (the io module's too), and the
// lease client's (js/lease.js) are inlined the same way.
for (const [root, glue] of [[dir, js], ...(hasStore ? [[join(dir, sub), js]] : []), ...(hasIo ? [[join(dir, ioSub), ioJs]] : [])]) {
  inlineSnippet(root, glue, 'walk.js');
  inlineSnippet(root, glue, 'promise.js');
  // The lease client's glue (the full entry point only).
  inlineSnippet(root, glue, 'lease.js');
  // The imports' line parser (the io module only).
  inlineSnippet(root, glue, 'parse.js');
}
if (hasIo) {
  inlineIoLoader(dir);
  if (hasStore) inlineIoLoader(join(dir, sub));
}

// The JS glue wasm-bindgen writes (and its snippets) ship minified, with an
// external source map that carries the original text: the code a bundler or
// a <script type=module> pulls in is the minified one (gzip -9, store-only
// entry: 10.8 kB as written, 6.5 kB minified), and a debugger still shows
// the original. esbuild keeps export names; the exported classes
// (AgentStore, LeaseClient, ...) get their `.name` back from one
// `Object.defineProperty` each. esbuild's `keepNames` would do that for
// every function of the glue (each of the module's imports too): about
// 1 kB of the store glue gzipped, for names nothing reads. A file that
// already names its map is left alone.
const minifyGlue = (file) => {
  let text = readFileSync(file, 'utf8');
  const name = basename(file);
  if (text.includes(`//# sourceMappingURL=${name}.map`)) return;
  // A method called on an object after its free() (or `using` disposal)
  // would reach wasm-bindgen's null-pointer check inside the module, whose
  // throw skips the code that gives the call's shadow-stack frame back:
  // each such call lost 48-144 B of the module's 1 MiB stack for good, and
  // after about 8,000 of them every call of the module failed ("memory
  // access out of bounds"). So each exported class's methods, getters and
  // setters check the pointer in JS first and throw a ClosedError with
  // `code` and `status`, as every other error of the package is
  // (docs/api.md, Errors), before the module is entered; a second free()
  // (or dispose) does nothing, and so does a teardown call (`close()`,
  // `stop()`) on a freed object (or one whose free() waits for its call to
  // return): teardown runs in any order, any number of times, without
  // throwing (one typed `Promise<…>` resolves, or returns the Promise of
  // the teardown free() started, see below). A
  // method called on something that is not an
  // instance (`const { get } = store; get(id)`) throws a ValidationError
  // naming the method, not a TypeError from reading `__wbg_ptr` of
  // `undefined`, nor "freed" for an object that never was one.
  // A method or static given more arguments than it declares (`putMany(docs,
  // {signal})`, PouchDB's `get(id, {revs: true})`) is refused with a
  // ValidationError naming it, as an option a call does not take is
  // (docs/api.md, Options): the generated glue would drop them, so the call
  // ran, wrote, and ignored what the caller asked for. Trailing `undefined`s
  // count as absent (forwarded `...args`). The error is a rejection for a
  // method whose .d.ts type returns a Promise, thrown by the others.
  // Teardown (`close()`, `stop()`) is exempt: its arguments are ignored, so
  // `button.onclick = store.close.bind(store)` (called with the event)
  // closes, as teardown never throws.
  // A static or `new` before `init()` resolved (the module's `wasm` is not
  // set) fails with a ClosedError saying to call and await init() first,
  // not a TypeError reading a minified export of `undefined`; every class
  // is exported as a Proxy whose `apply` refuses a call without `new` with
  // a ValidationError naming the class, not V8's "Class constructor St
  // cannot be invoked without 'new'" (the minified name).
  const classes = [...text.matchAll(/^export class (\w+)/gm)].map((m) => m[1]);
  const dtsFile = file.replace(/\.js$/, '.d.ts');
  const dts = existsSync(dtsFile) ? readFileSync(dtsFile, 'utf8') : '';
  const classBody = (cls) => dts.split(`export class ${cls} {`)[1]?.split('\n}')[0] ?? '';
  // The names of `cls`'s methods (and statics) that do not return a
  // Promise, and of its properties (getters and setters).
  // Accessors count as sync in every form a .d.ts writes them (`readonly x:
  // T`, `x: T`, `get x(): T`, `set x(v: T)`): a getter of a freed object
  // must throw, never hand back a rejected Promise.
  const syncMethods = (cls) => {
    const body = classBody(cls);
    return [
      ...[...body.matchAll(/^ {4}(?:static |readonly |get )?(\w+)(?:\(.*\))?: (.+);$/gm)]
        .filter((m) => !m[2].startsWith('Promise<') || /^ {4}(readonly|get) /.test(m[0]))
        .map((m) => m[1]),
      ...[...body.matchAll(/^ {4}set (\w+)\(/gm)].map((m) => m[1]),
    ].join(' ');
  };
  // A getter typed `Promise<…>` (LeaseWorker's `finished`: "the same
  // Promise on every read") is read as the object is freed and kept on it
  // as an own property, so a read after free() (or a `using` block) gives
  // that same Promise instead of a ClosedError.
  const keptGetters = (cls) => [...classBody(cls).matchAll(/^ {4}(?:readonly |get )(\w+)(?:\(\))?: Promise</gm)].map((m) => m[1]);
  const kept = classes.some((cls) => keptGetters(cls).length);
  const constructible = classes.some((cls) => /^ {4}constructor\(/m.test(classBody(cls)));
  // Whether a class of this glue has a teardown that free() starts (see
  // TEARDOWN): the store-only glue carries none of that code.
  const teardowns = classes.some((cls) => TEARDOWN[cls]);
  // The typed Errors of the guard and of the null-pointer throw below: the
  // fields defined, not assigned (Object.assign is [[Set]]: an accessor
  // without a setter of that name on Object.prototype made it throw a
  // TypeError in the error's place). Dropped by esbuild where unused.
  text += `function __agentstoreErr(name, code, status, m) {
  const e = new Error(m);
  for (const [k, value] of [['name', name], ['code', code], ['status', status]]) {
    Reflect.defineProperty(e, k, { __proto__: null, value, writable: true, enumerable: true, configurable: true });
  }
  return e;
}
`;
  if (classes.length) {
    text += `function __agentstoreGuard(C, an, sync${teardowns || kept ? ', teardown' : ''}${kept ? ', kept' : ''}) {
  const err = __agentstoreErr;
  const closed = (m) => err('ClosedError', 'closed', 410, m);
  const early = () => closed('agentstore is not initialised: await init() first');
  const freed = () => closed('this object was freed (free() or a using block): it cannot be used any more');
  // Teardown, whose arguments are ignored.
  const down = (k) => k === 'close' || k === 'stop';
  const invalid = (m) => err('ValidationError', 'validation', 400, m);
  // More arguments than \`f\` declares, trailing undefineds aside: refused.
  const tooMany = (f, k, args) => {
    let n = args.length;
    while (n > f.length && args[n - 1] === undefined) n--;
    return n > f.length && invalid(\`\${C.name}.\${k} takes \${f.length} arguments, not \${n}: one it does not take is refused, not ignored\`);
  };
  // A refusal is thrown by a synchronous method, a getter or a setter, and
  // is the rejection of the Promise a method typed \`Promise<…>\` returns.
  const refuse = (e, k) => {
    if (sync.includes(\` \${k} \`)) throw e;
    return Promise.reject(e);
  };
  const checked = (f, k, self, args) => {
    const e = !down(k) && tooMany(f, k, args);
    return e ? refuse(e, k) : f.apply(self, args);
  };
  // The objects whose methods are running now (how deep), and those whose
  // free() came meanwhile (a getter of an argument, a callback): freed once
  // the outermost call returns, since the module holds the object during
  // it (wasm-bindgen's free threw a plain Error there, and the object was
  // left neither usable nor dropped).
  const busy = new Map(), later = new Set();
  const wrap = (f, k) => function (...args) {
    if (!(this instanceof C)) return refuse(invalid(\`\${C.name}.\${k} was called on something that is not \${an} \${C.name} (a method taken off its object: call it on the object, or bind it)\`), k);
    if (!this.__wbg_ptr || later.has(this)) return !down(k) ? refuse(freed(), k) : sync.includes(\` \${k} \`) ? undefined : ${teardowns ? '(ended.get(this) || Promise.resolve())' : 'Promise.resolve()'};
    busy.set(this, (busy.get(this) || 0) + 1);
    try { return checked(f, k, this, args); } finally {
      const n = busy.get(this) - 1;
      if (n) busy.set(this, n); else { busy.delete(this); if (later.delete(this)) ${teardowns ? 'drop(this)' : 'this.free()'}; }
    }
  };
  for (const k of Object.getOwnPropertyNames(C.prototype)) {
    if (k === 'constructor' || k === 'free' || k.startsWith('__')) continue;
    const d = Object.getOwnPropertyDescriptor(C.prototype, k);
    if (typeof d.value === 'function') d.value = wrap(d.value, k);
    if (d.get) d.get = wrap(d.get, k);
    if (d.set) d.set = wrap(d.set, k);
    Object.defineProperty(C.prototype, k, d);
  }
  for (const k of Object.getOwnPropertyNames(C)) {
    const f = C[k];
    if (typeof f === 'function' && !k.startsWith('__')) C[k] = function (...args) { return wasm ? checked(f, k, this, args) : refuse(early(), k); };
  }
  const free = C.prototype.free;
${kept ? `  const keep = (o) => { if (o.__wbg_ptr && !later.has(o)) for (const g of kept) Object.defineProperty(o, g, { value: o[g] }); };
` : ''}${teardowns ? `  // Frees \\\`o\\\` now, or once its outermost running call returns.
  function drop(o) { ${kept ? 'keep(o); ' : ''}if (busy.has(o)) later.add(o); else if (o.__wbg_ptr) free.call(o); }
  // A class with a teardown (LeaseClient's close(), LeaseWorker's stop()):
  // free() and [Symbol.dispose]() start it, then free the object (its
  // Promise holds what it needs), and [Symbol.asyncDispose]() returns its
  // Promise, for \\\`await using\\\`. Only an explicit call does: the garbage
  // collector's finalizer frees the object without it, so a worker the
  // page keeps no reference to runs on. The teardown's Promise is kept:
  // close(), stop() or [Symbol.asyncDispose]() on the freed object return
  // it, so \\\`worker.free(); await worker.stop()\\\` waits for the stop.
  const end = teardown && C.prototype[teardown], ended = new WeakMap();
  const ending = (o) => {
    if (!o.__wbg_ptr || later.has(o)) return ended.get(o) || Promise.resolve();
    const p = end.call(o);
    ended.set(o, p);
    return p;
  };
  C.prototype.free = function () { if (end) ending(this); drop(this); };
  if (end && typeof Symbol.asyncDispose === 'symbol') C.prototype[Symbol.asyncDispose] = function () { const p = ending(this); drop(this); return p; };
` : `  C.prototype.free = function () { ${kept ? 'keep(this); ' : ''}if (busy.has(this)) later.add(this); else if (this.__wbg_ptr) free.call(this); };
`}  if (typeof Symbol.dispose === 'symbol') C.prototype[Symbol.dispose] = C.prototype.free;
  // What the class is exported as: a call without \\\`new\\\` refused, and
  // (where a class has a public constructor) \\\`new\\\` checked as a method is.
  return new Proxy(C, {
${constructible ? `    construct(t, args, nt) { if (!wasm) throw early(); const e = tooMany(t, 'constructor', args); if (e) throw e; return Reflect.construct(t, args, nt); },
` : ''}    apply() { throw invalid(\`\${C.name} cannot be called without new\`); },
  });
}
`;
  }
  for (const cls of classes) {
    // The article of the class's name in its messages ("not an AgentStore", "not a Lease").
    const an = /^[AEIOU]/.test(cls) ? 'an' : 'a';
    const teardown = TEARDOWN[cls] ? `, '${TEARDOWN[cls]}'` : '';
    const keep = kept ? `${teardown || ', 0'}, [${keptGetters(cls).map((g) => `'${g}'`).join(', ')}]` : teardown;
    const guard = `__agentstoreGuard(${cls}, '${an}', ' ${syncMethods(cls)} '${keep})`;
    text += `Object.defineProperty(${cls}, 'name', { value: '${cls}' });\n`;
    // Each class is exported as the guard's Proxy; the glue itself keeps
    // the class.
    text = text.replace(`export class ${cls} `, `class ${cls} `);
    text += `const __${cls} = ${guard};\nexport { __${cls} as ${cls} };\n`;
  }
  // The module's own null-pointer throw (reached only by a call the guard
  // above does not cover) is a ClosedError too.
  const THROW = 'throw new Error(getStringFromWasm0(arg0, arg1));';
  if (text.split(THROW).length === 2) {
    text = text.replace(
      THROW,
      "const m = getStringFromWasm0(arg0, arg1); if (m === 'null pointer passed to rust') throw __agentstoreErr('ClosedError', 'closed', 410, 'this object was freed (free() or a using block): it cannot be used any more'); throw new Error(m);",
    );
  } else if (name === js) {
    throw new Error(`${file}: wasm-bindgen's throw import not found once: update package.mjs`);
  }
  // wasm-bindgen wraps each import that may throw (`catch`: every
  // IndexedDB request, every Reflect.get/set the module makes) as
  // `function() { return handleError(function (arg0, …) { … }, arguments); }`:
  // a new closure, an `arguments` object and an `apply` on every call (in a
  // profile of 10,000 `add`s, the wrapper's own time was a fifth of `add`'s).
  // The same try/catch written into the import does the same without them.
  if (text.includes('function handleError(f, args) {')) {
    const HANDLE = /function handleError\(f, args\) \{\n\s*try \{\n\s*return f\.apply\(this, args\);\n\s*\} catch \(e\) \{\n([\s\S]*?)\n\s*\}\n\}/;
    const caught = text.match(HANDLE);
    if (!caught) throw new Error(`${file}: wasm-bindgen's handleError changed: update package.mjs`);
    text = text.replace(HANDLE, () => `function handleError(e) {\n${caught[1]}\n}`);
    text = text.replace(
      /function\(\) \{ return handleError\(function \(([^)]*)\) \{\n([\s\S]*?)\n\s*\}, arguments\); \}/g,
      (_, params, body) => `function(${params}) { try {\n${body}\n} catch (e) { handleError(e); } }`,
    );
    if (text.includes('handleError(function')) throw new Error(`${file}: a handleError wrapper was not rewritten: update package.mjs`);
  }
  // A wrapper of that shape under another name (a wasm-bindgen that renamed
  // handleError) fails the build instead of shipping unrewritten.
  if (text.includes('}, arguments); }')) throw new Error(`${file}: an import wrapper applied to \`arguments\` was not rewritten: update package.mjs`);
  const r = transformSync(text, {
    minify: true,
    treeShaking: true,
    target: 'es2020',
    format: 'esm',
    sourcemap: 'external',
    sourcefile: name,
    sourcesContent: true,
  });
  writeFileSync(file, `${r.code}//# sourceMappingURL=${name}.map\n`);
  writeFileSync(`${file}.map`, r.map);
};
const snippetFiles = (root) => {
  const out = [];
  const walk = (d) => {
    if (!existsSync(d)) return;
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const f = join(d, e.name);
      if (e.isDirectory()) walk(f);
      else if (f.endsWith('.js')) out.push(f);
    }
  };
  walk(join(root, 'snippets'));
  return out;
};
for (const root of [dir, ...(hasStore ? [join(dir, sub)] : [])]) {
  minifyGlue(join(root, js));
  snippetFiles(root).forEach(minifyGlue);
}
if (hasIo) minifyGlue(join(dir, ioSub, ioJs));
const snippets = hasSnippets();
const storeSnippets = hasStore && existsSync(join(dir, sub, 'snippets'));
const subFiles = hasStore
  ? [js, `${js}.map`, types, wasm, ...(storeSnippets ? ['snippets'] : [])].map((f) => `${sub}/${f}`)
  : [];
const ioFiles = hasIo ? [ioJs, `${ioJs}.map`, ioTypes, ioWasm].map((f) => `${ioSub}/${f}`) : [];

const out = {
  name: pkg.name,
  version: pkg.version,
  description: pkg.description,
  license: pkg.license,
  repository: pkg.repository,
  keywords: pkg.keywords,
  type: 'module',
  main: `./${js}`,
  module: `./${js}`,
  types: `./${types}`,
  exports: {
    '.': { types: `./${types}`, import: `./${js}`, default: `./${js}` },
    [`./${js}`]: { types: `./${types}`, import: `./${js}`, default: `./${js}` },
    [`./${wasm}`]: `./${wasm}`,
    ...(hasStore
      ? {
          [`./${sub}`]: { types: `./${sub}/${types}`, import: `./${sub}/${js}`, default: `./${sub}/${js}` },
          [`./${sub}/${wasm}`]: `./${sub}/${wasm}`,
        }
      : {}),
    // For a <link rel="preload"> or a bundler asked for the file's URL.
    ...(hasIo
      ? {
          [`./${ioSub}`]: { types: `./${ioSub}/${ioTypes}`, import: `./${ioSub}/${ioJs}`, default: `./${ioSub}/${ioJs}` },
          [`./${ioSub}/${ioWasm}`]: `./${ioSub}/${ioWasm}`,
        }
      : {}),
    './package.json': './package.json',
  },
  files: [
    ...new Set([
      // wasm-pack lists "snippets", gone once the loader is inlined.
      ...(pkg.files ?? [js, types, wasm]).map(bare).filter((f) => f !== 'snippets'),
      `${js}.map`,
      ...subFiles,
      ...ioFiles,
      ...(snippets ? ['snippets'] : []),
      'README.md',
    ]),
  ],
  sideEffects:
    snippets || storeSnippets
      ? [...(snippets ? ['./snippets/*'] : []), ...(storeSnippets ? ['./store/snippets/*'] : [])]
      : false,
};
writeFileSync(path, JSON.stringify(out, null, 2) + '\n');
console.log(`completed ${path}: exports ${Object.keys(out.exports).join(', ')}; closure shims nothing calls, emptied: ${stubbed.join(', ')}`);
