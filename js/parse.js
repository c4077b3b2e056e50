// agentstore: JSON.parse of an import's lines (the io module's only).
//
// Imports check each record with the write path's walk (js/walk.js) but
// store what JSON.parse made; JSON text may hold a negative zero, which the
// walk stores as 0 (JSON has none), so the parse makes it 0 too: `put`,
// `get` and an export then agree. A snippet of its own so that the entry
// points' glue (which never imports) does not carry it.
//
// scripts/package.mjs inlines this file into the io module's glue.

// Where a value starts, a negative number that may parse to negative zero:
// one whose integer part is 0 (`-0`, `-0.0`, `-0e5`, `-0.000…01` past the
// smallest double) or with a negative exponent (`-1e-400` underflows). A
// superset (`-0.5`, and such text inside a string): `parseLine` then only
// looks in vain.
const NEG_ZERO = /[:,[]\s*-(?:0|[\d.]+[eE]-)/;

/**
 * `JSON.parse(text)` of an import's line, with every `-0` made `0`, as the
 * walk stores a record (JSON has no negative zero: `put`, `get` and an
 * export agree). `undefined` (which JSON.parse never answers) when the
 * text is not JSON: no throw through the binding, which would keep a slot
 * of the module's externref table (js/promise.js `callInto1`). The values
 * are only visited when the text holds a `-0` number.
 */
export function parseLine(text) {
  let v;
  try {
    v = JSON.parse(text);
  } catch {
    return undefined;
  }
  return NEG_ZERO.test(text) ? positiveZeros(v, 0) : v;
}

// Deeper than a record may be (crates/protocol/src/record.rs, 64 levels;
// the line's own wrapper and `docs` array are two more): the walk refuses
// such a line as too deep, so it is not visited (no stack overflow).
const MAX_VISIT = 70;

function positiveZeros(v, depth) {
  if (typeof v === 'object' && v !== null && depth < MAX_VISIT) {
    for (const k of Object.keys(v)) {
      const x = v[k];
      if (Object.is(x, -0)) v[k] = 0;
      else positiveZeros(x, depth + 1);
    }
  }
  return v;
}

/**
 * Whether `Object.prototype.toString.call(v)` names a Uint8Array (of any
 * realm: the view's type, unless an own `Symbol.toStringTag` says
 * otherwise); false when reading the tag throws. Never throws.
 */
export function taggedUint8Array(v) {
  try {
    return Object.prototype.toString.call(v) === '[object Uint8Array]';
  } catch {
    return false;
  }
}
