// TypeScript checks of the generated pkg/agentstore.d.ts (examples/ts):
// `tsc --noEmit` passes on the example, and FAILS on negative/ with exactly
// the errors its lines are marked with (`// error TS2322`, alternatives in
// parentheses), so a .d.ts that degraded to `any` is caught.
//
//   node --test tests/e2e/ts.test.mjs     (needs pkg/ built + scripts/package.mjs)

import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from './helpers.mjs';

const EXAMPLE = join(ROOT, 'examples', 'ts');
const TSC = join(EXAMPLE, 'node_modules', 'typescript', 'bin', 'tsc');

function tsc(project) {
  const r = spawnSync(process.execPath, [TSC, '--noEmit', '--pretty', 'false', '-p', project], {
    cwd: EXAMPLE, encoding: 'utf8', timeout: 300_000,
  });
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

before(() => {
  assert.ok(existsSync(join(ROOT, 'pkg', 'agentstore.d.ts')), 'pkg/ must hold the built SDK (scripts/test.sh builds it)');
  if (!existsSync(TSC)) {
    const r = spawnSync('npm', ['ci', '--no-audit', '--no-fund'], { cwd: EXAMPLE, stdio: 'inherit', timeout: 300_000 });
    assert.equal(r.status, 0, 'npm ci in examples/ts');
  }
});

test('the generated .d.ts has no `any` in the public API', () => {
  const dts = readFileSync(join(ROOT, 'pkg', 'agentstore.d.ts'), 'utf8');
  // Only wasm-bindgen's own InitOutput (raw exports) may mention `any`.
  const publicPart = dts.split('export type InitInput')[0];
  const hits = publicPart.split('\n').filter((l) => /\bany\b/.test(l.replace(/\/\*.*?\*\/|^\s*\*.*$|\/\/.*$/g, '')));
  assert.deepEqual(hits, []);
});

test('tsc --noEmit passes on examples/ts', () => {
  const { status, out } = tsc('tsconfig.json');
  assert.equal(status, 0, out);
});

test('tsc --noEmit fails on examples/ts/negative with exactly the marked errors', () => {
  const file = join(EXAMPLE, 'negative', 'errors.ts');
  const expected = new Map();
  readFileSync(file, 'utf8').split('\n').forEach((line, i) => {
    const m = line.match(/\/\/ error (TS\d+)(?: \(.*?(TS\d+)\))?/);
    if (m) expected.set(i + 1, [m[1], m[2]].filter(Boolean));
  });
  assert.ok(expected.size >= 8, 'markers found');
  const { status, out } = tsc('negative/tsconfig.json');
  assert.notEqual(status, 0, 'the negative check must fail');
  const got = new Map();
  for (const m of out.matchAll(/^negative\/errors\.ts\((\d+),\d+\): error (TS\d+)/gm)) got.set(Number(m[1]), m[2]);
  const stray = out.split('\n').filter((l) => /error TS/.test(l) && !l.startsWith('negative/errors.ts('));
  assert.deepEqual(stray, [], 'errors outside the marked lines (a broken setup, not the deliberate ones)');
  assert.deepEqual([...got.keys()].sort((a, b) => a - b), [...expected.keys()], out);
  for (const [line, codes] of expected) assert.ok(codes.includes(got.get(line)), `line ${line}: ${got.get(line)} not ${codes}`);
});

// The README quickstart, as written (it is JavaScript a user pastes or puts in
// a module), type-checks against pkg/agentstore.d.ts with `checkJs` and the
// strict options of examples/ts: before, `lease.item.payload.task` failed
// (TS18046: `payload` is `unknown`) for anyone checking their JS.
test('the README quickstart type-checks as written (checkJs, strict)', () => {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const block = readme.split('## Quickstart (JavaScript)')[1]?.split('```js\n')[1]?.split('```')[0];
  assert.ok(block && block.includes('AgentStore.open'), 'the quickstart block');
  const dir = mkdtempSync(join(EXAMPLE, '.quickstart-'));
  try {
    writeFileSync(join(dir, 'quickstart.js'), `export {};\n${block}`);
    writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({
      extends: '../tsconfig.json',
      compilerOptions: {
        allowJs: true,
        checkJs: true,
        paths: { '/pkg/agentstore.js': [join(ROOT, 'pkg', 'agentstore.d.ts')] },
      },
      include: ['quickstart.js'],
    }));
    const { status, out } = tsc(join(dir, 'tsconfig.json'));
    assert.equal(status, 0, out);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
