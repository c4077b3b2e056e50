// agentstore: the write path's one walk over a record, in JavaScript.
//
// `put`, `putMany`, `mutate` and the imports hand each record to
// `walkRecord` once (src/value.rs). In that pass it refuses what JSON cannot
// carry, checks the top-level fields whose type it can see, builds the plain
// copy the store writes, and writes the record's canonical JSON body: object
// keys sorted by their UTF-8 bytes (code points; a lone surrogate counts as
// U+FFFD, ties broken by UTF-16 units), no whitespace, `_rev` and `updatedAt`
// left out, strings and numbers exactly as `JSON.stringify` writes them
// (which is what crates/protocol/src/canonical.rs writes natively: the same
// escapes, lone surrogates as lower-case `\udxxx`, integers up to 2^53 as
// digits, others as JavaScript's `String(n)`). The wasm side hashes that text
// and checks what needs its rules (`_id`, `_rev`, `updatedAt`, the size).
//
// Walking here instead of in wasm costs one call per record instead of about
// fifteen calls across the boundary per field (BENCHMARKS.md, twelfth round).
// No message text lives here: a failure is a code that src/value.rs turns
// into its ValidationError, with the path to the field.
//
// scripts/package.mjs inlines this file into each glue that imports it.

// Failure codes: indexes of `WHY` in src/value.rs.
const GETTER_THREW = 0;
const PROPERTY_GETTER_THREW = 1;
const TOO_LARGE = 2;
const NOT_FINITE = 3;
const UNDEFINED = 4;
const BIGINT = 5;
const SYMBOL = 6;
const FUNCTION = 7;
const OTHER = 8;
const TOO_DEEP = 9;
const CYCLE = 10;
const NOT_PLAIN = 11;
const REV_NOT_STRING = 12;
const BAD_UPDATED_AT = 13;
const RECORD_TYPE_NOT_STRING = 14;
const RESERVED = 15;
const NOT_A_RECORD = 16;
const TO_JSON = 17;

// Limits (crates/protocol/src/record.rs): 64 MiB of JSON, 64 levels. The
// running length counts UTF-16 units, each at least one byte of UTF-8: a
// lower bound that stops a walk early; the exact byte count is checked in
// wasm.
const MAX_BYTES = 64 * 1024 * 1024;
const MAX_DEPTH = 64;
const OBJECT_PROTO = Object.prototype;
const OBJECT_TO_STRING = OBJECT_PROTO.toString;
// The body is handed over in pieces of about this many UTF-16 units: a
// string built by `+=` token by token keeps one rope node per token alive
// (hundreds of MB for a large record), and wasm copies and hashes one piece
// at a time, so its memory, which never shrinks, grows by a piece at most.
const PIECE = 1 << 16;

// A walk's failure: `{code, path, detail}`, made as a literal (fields
// defined, not assigned: an accessor without a setter of the same name on
// `Object.prototype` made a constructor's assignments throw) whose
// prototype is this class's, so `instanceof` tells it from what a
// record's getter throws.
class Fail {}

/**
 * Walks `record` for a write.
 *
 * Returns `[copy, body, id, rev, updatedAt]` (the plain copy to store, the
 * canonical JSON body as an array of strings to be read in order, and the
 * raw `_id`, `_rev` and `updatedAt` values, `undefined` when absent), or
 * `[code, path, detail]` on failure: `code` a number, `path` the keys and
 * indexes from the record down to the field, `detail` a constructor's name
 * or `undefined`.
 */
export function walkRecord(record) {
  const w = { out: '', pieces: [], len: 0, path: [], stack: [], id: undefined, rev: undefined, at: undefined };
  try {
    if (typeof record !== 'object' || record === null || isArray(record, w)) {
      fail(w, NOT_A_RECORD);
    }
    const copy = object(record, w, true);
    w.pieces.push(w.out);
    return [copy, w.pieces, w.id, w.rev, w.at];
  } catch (e) {
    if (e instanceof Fail) return [e.code, e.path, e.detail];
    // An engine's string length limit (a RangeError from a string far past
    // the record limit once escaped) is the size limit too.
    if (e instanceof RangeError) return [TOO_LARGE, [], undefined];
    throw e;
  } finally {
    lastId = w.id;
  }
}

// The `_id` value the last `walkRecord` read, as it read it (`undefined`
// when it failed before): a batch's report of a refused record names it by
// this, never by reading `_id` again, whose getter may answer another id or
// throw the second time. (Set when the walk returns: a nested walk, run by
// a getter that calls the store, ends before the walk that ran it.)
let lastId;

/** `walkedId()`: the `_id` value the last `walkRecord` read. */
export function walkedId() {
  return lastId;
}

/**
 * Walks `v`, any JSON value (a lease's settle result), with the record
 * walk's rules but no top-level field checks. Returns `[copy]` (the plain
 * copy) or `[code, path, detail]` on failure, as `walkRecord`.
 */
export function walkValue(v) {
  const w = { out: '', pieces: [], len: 0, path: [], stack: [] };
  try {
    return [value(v, w)];
  } catch (e) {
    if (e instanceof Fail) return [e.code, e.path, e.detail];
    if (e instanceof RangeError) return [TOO_LARGE, [], undefined];
    throw e;
  }
}

function fail(w, code, detail) {
  throw { __proto__: Fail.prototype, code, path: w.path.slice(), detail };
}

function isArray(v, w) {
  try {
    return Array.isArray(v); // a revoked Proxy throws
  } catch {
    return fail(w, GETTER_THREW);
  }
}

/** Hands the current piece over once it is long; fails past the limit. */
function checkSize(w) {
  const s = w.out;
  if (s.length > PIECE) {
    // A long token (a large string value or key) is cut too, so no piece
    // is much longer than PIECE — never between the halves of a surrogate
    // pair (wasm converts each piece to UTF-8 on its own; JSON.stringify
    // escapes lone surrogates, so every other cut is exact).
    let i = 0;
    while (s.length - i > PIECE) {
      let end = i + PIECE;
      const c = s.charCodeAt(end - 1);
      if (c >= 0xd800 && c <= 0xdbff) end--;
      w.pieces.push(s.slice(i, end));
      i = end;
    }
    w.len += i;
    w.out = s.slice(i);
  }
  if (w.len + w.out.length > MAX_BYTES) fail(w, TOO_LARGE);
}

/** Writes `v`'s JSON to `w.out`; returns what to store in its place. */
function value(v, w) {
  switch (typeof v) {
    case 'string':
      if (v.length > MAX_BYTES) fail(w, TOO_LARGE);
      w.out += JSON.stringify(v);
      return v;
    case 'number':
      if (!Number.isFinite(v)) fail(w, NOT_FINITE);
      w.out += String(v); // what JSON.stringify writes for a finite number
      // JSON has no negative zero: -0 is stored as 0 (`-0 === 0`).
      return v === 0 ? 0 : v;
    case 'boolean':
      w.out += v ? 'true' : 'false';
      return v;
    case 'object':
      if (v === null) {
        w.out += 'null';
        return null;
      }
      return object(v, w, false);
    case 'undefined':
      return fail(w, v === undefined ? UNDEFINED : OTHER);
    case 'bigint':
      return fail(w, BIGINT);
    case 'symbol':
      return fail(w, SYMBOL);
    case 'function':
      return fail(w, FUNCTION);
    default:
      return fail(w, OTHER);
  }
}

function object(v, w, top) {
  if (w.stack.length >= MAX_DEPTH) fail(w, TOO_DEEP);
  if (w.stack.includes(v)) fail(w, CYCLE);
  const arr = isArray(v, w);
  if (arr) noToJSON(v, w); // a plain object's: in fieldsOf, after its prototype's check
  w.stack.push(v);
  const out = arr ? array(v, w) : plain(v, w, top);
  w.stack.pop();
  return out;
}

function array(a, w) {
  let len;
  try {
    len = a.length;
  } catch {
    fail(w, GETTER_THREW);
  }
  if (typeof len !== 'number' || !(len >= 0 && len <= 0xffffffff)) fail(w, GETTER_THREW);
  len = Math.floor(len); // a Proxy may answer a fraction
  // Every element is at least one byte and a comma: an array that cannot
  // fit is refused before any of it is read (a sparse `[].length = 2 ** 29`).
  if (len > MAX_BYTES / 2) fail(w, TOO_LARGE);
  // The copy holds exactly the values read here, once each.
  const copy = [];
  w.out += '[';
  for (let i = 0; i < len; i++) {
    if (i > 0) w.out += ',';
    w.path.push(i);
    let item;
    try {
      item = a[i];
    } catch {
      fail(w, GETTER_THREW);
    }
    copy.push(value(item, w));
    w.path.pop();
    checkSize(w);
  }
  w.out += ']';
  return copy;
}

/**
 * JSON.stringify stores what a `toJSON` returns, own (enumerable or not) or
 * inherited (a polluted Object.prototype or Array.prototype): a copy built
 * from the fields would not be that, so such a value is refused.
 */
function noToJSON(v, w) {
  let toJSON;
  try {
    toJSON = v.toJSON;
  } catch {
    fail(w, GETTER_THREW);
  }
  if (typeof toJSON === 'function') fail(w, TO_JSON);
  return toJSON;
}

/**
 * The plain object `o`'s fields as `[key, value, …]`: its enumerable own
 * string keys in the caller's order, each value read once, `undefined`
 * left out (as JSON.stringify does). A record's (`top`) `_id` is kept in
 * `w.id` as soon as it is read, also when a later field fails.
 */
function fieldsOf(o, w, top) {
  let proto;
  try {
    proto = Object.getPrototypeOf(o);
  } catch {
    fail(w, GETTER_THREW);
  }
  // Date, Map, Set, typed arrays, boxed primitives and class instances would
  // be silently changed by JSON; a plain object of another realm (an
  // iframe's) is plain. A `JSON.rawJSON` value (null-prototype, frozen) is
  // written by JSON.stringify as its raw text, which its fields are not.
  if (proto === null ? isRawJSON(o) : proto !== OBJECT_PROTO && !isObjectProto(proto)) {
    fail(w, NOT_PLAIN, proto === null ? 'JSON.rawJSON' : ctorName(o));
  }
  // Read once: an own enumerable `toJSON` (not a function) is this value.
  const toJSON = noToJSON(o, w);
  let keys;
  try {
    keys = Object.keys(o);
  } catch {
    fail(w, GETTER_THREW);
  }
  const fields = [];
  for (let j = 0; j < keys.length; j++) {
    const k = keys[j];
    if (k.length > MAX_BYTES) fail(w, TOO_LARGE);
    let item = toJSON;
    if (k !== 'toJSON') {
      try {
        item = o[k];
        if (top && k === '_id') w.id = item;
      } catch {
        w.path.push(k);
        fail(w, PROPERTY_GETTER_THREW);
      }
    }
    if (item !== undefined) fields.push(k, item);
  }
  return fields;
}

/**
 * A copy of the plain object `o`'s fields (one level, each read once) with
 * no prototype, for a value the store walks after setting fields of its
 * own (`mutate`'s result, given its `_id` and `_rev`): the copy, or
 * `[code, path, detail]` as `walkRecord` fails.
 */
export function shallowCopy(o) {
  const w = { path: [] };
  try {
    const fields = fieldsOf(o, w);
    const copy = Object.create(null);
    for (let i = 0; i < fields.length; i += 2) copy[fields[i]] = fields[i + 1];
    return copy;
  } catch (e) {
    if (e instanceof Fail) return [e.code, e.path, e.detail];
    throw e;
  }
}

function plain(o, w, top) {
  const fields = fieldsOf(o, w, top);
  const n = fields.length / 2;
  const order = orderOf(fields, n, w.stack.length);
  // What to store for each field: its copy; `_rev` and `updatedAt` as given.
  const stored = new Array(n);
  let first = true;
  w.out += '{';
  for (let j = 0; j < n; j++) {
    const i = order[j];
    const k = fields[2 * i];
    const item = fields[2 * i + 1];
    stored[i] = item;
    w.path.push(k);
    if (!top || topField(k, item, w)) {
      if (!first) w.out += ',';
      first = false;
      w.out += keyJSON(k);
      stored[i] = value(item, w);
    }
    w.path.pop();
    checkSize(w);
  }
  w.out += '}';
  // No prototype: every key, "__proto__" included, is an own data field.
  const copy = Object.create(null);
  for (let i = 0; i < n; i++) copy[fields[2 * i]] = stored[i];
  return copy;
}

// The records of a batch, and the writes of one app, mostly share their
// shapes: the key list last sorted at each depth is kept with its order, and
// the JSON text of short keys is kept once made. Together they halve the
// walk of a 10,000-record batch in V8 (BENCHMARKS.md, thirty-sixth round).
// Both are bounded: one shape per depth (at most 64), at most 1,024 keys of
// at most 64 units.
const SHAPES = [];
const KEYS = new Map();

/**
 * The order in which the `n` keys of `fields` are written (indexes into the
 * fields, by `compareKeys`): the order kept for `depth` when its key list is
 * the same, key by key; else sorted, and kept.
 */
function orderOf(fields, n, depth) {
  const last = SHAPES[depth];
  if (last !== undefined && last.keys.length === n) {
    let i = 0;
    while (i < n && fields[2 * i] === last.keys[i]) i++;
    if (i === n) return last.order;
  }
  const order = [];
  for (let i = 0; i < n; i++) order.push(i);
  if (n > 1) order.sort((a, b) => compareKeys(fields[2 * a], fields[2 * b]));
  const keys = [];
  for (let i = 0; i < n; i++) keys.push(fields[2 * i]);
  SHAPES[depth] = { keys, order };
  return order;
}

/** `k` as a JSON string followed by `:`. */
function keyJSON(k) {
  let text = KEYS.get(k);
  if (text === undefined) {
    text = JSON.stringify(k) + ':';
    if (k.length <= 64 && KEYS.size < 1024) KEYS.set(k, text);
  }
  return text;
}

/** Whether `o` is a `JSON.rawJSON` value (where the engine has them). */
function isRawJSON(o) {
  return typeof JSON.isRawJSON === 'function' && JSON.isRawJSON(o);
}

/**
 * Whether `p` is a realm's `Object.prototype`: its own prototype is null and
 * its `constructor` is a function named `Object` whose `prototype` is `p`
 * (`Object.prototype.toString` of it is then `[object Object]`, no exotic
 * object). Read through a caught access: `p` may be anything.
 */
function isObjectProto(p) {
  try {
    const c = p.constructor;
    return (
      Object.getPrototypeOf(p) === null &&
      typeof c === 'function' &&
      c.name === 'Object' &&
      c.prototype === p &&
      OBJECT_TO_STRING.call(p) === '[object Object]'
    );
  } catch {
    return false;
  }
}

function ctorName(o) {
  try {
    const c = o.constructor;
    const name = c !== null && (typeof c === 'object' || typeof c === 'function') ? c.name : undefined;
    return typeof name === 'string' ? name : 'object';
  } catch {
    return 'object';
  }
}

/**
 * A top-level field's check (crates/protocol/src/record.rs, `top_field`):
 * `false` keeps it out of the body (`_rev`, `updatedAt`).
 */
function topField(k, item, w) {
  switch (k) {
    case '_id':
      return true;
    case '_rev':
      if (typeof item !== 'string') fail(w, REV_NOT_STRING);
      w.rev = item;
      return false;
    case 'updatedAt':
      if (typeof item !== 'string' || item.length > 64) fail(w, BAD_UPDATED_AT);
      w.at = item;
      return false;
    case 'recordType':
      if (typeof item !== 'string') fail(w, RECORD_TYPE_NOT_STRING);
      return true;
    default:
      if (k.charCodeAt(0) === 0x5f) fail(w, RESERVED); // `_`
      return true;
  }
}

/**
 * Orders keys by their UTF-8 bytes, that is by code point, with a lone
 * surrogate counted as U+FFFD; keys equal that way (lone surrogates against
 * U+FFFD) by their UTF-16 units. Code points are decoded only from the first
 * unit that differs (one before it when that one may start a pair).
 */
function compareKeys(a, b) {
  const n = Math.min(a.length, b.length);
  let x = 0;
  while (x < n && a.charCodeAt(x) === b.charCodeAt(x)) x++;
  if (x > 0 && (a.charCodeAt(x - 1) & 0xfc00) === 0xd800) x--;
  let y = x;
  while (x < a.length && y < b.length) {
    const p = codePoint(a, x);
    const q = codePoint(b, y);
    if (p !== q) return p < q ? -1 : 1;
    x += p > 0xffff ? 2 : 1;
    y += q > 0xffff ? 2 : 1;
  }
  if (x < a.length || y < b.length) return x < a.length ? 1 : -1;
  return a < b ? -1 : a > b ? 1 : 0;
}

/** The code point at `i`; a lone surrogate reads as U+FFFD. */
function codePoint(s, i) {
  const c = s.codePointAt(i);
  return c >= 0xd800 && c <= 0xdfff ? 0xfffd : c;
}
