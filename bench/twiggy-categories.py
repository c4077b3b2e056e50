#!/usr/bin/env python3
"""Groups `twiggy top` rows of one or two wasm modules (with their name
section: scripts/twiggy.sh builds one) into categories and prints a Markdown
table of raw bytes per category, e.g. before/after a change:

    python3 bench/twiggy-categories.py BEFORE.wasm AFTER.wasm

Categories are by the leading crate/module of each function's name (rows
whose name is a generic instantiation count for the crate that defines the
function), so they are approximate; the total is exact.
"""
import csv,sys,re,subprocess,collections
def lead(n):
    m=re.match(r'[<&\s]*(?:mut\s+|dyn\s+)?([A-Za-z_][A-Za-z0-9_]*)(?:\[[0-9a-f]+\])?(?:::([A-Za-z_][A-Za-z0-9_]*))?',n)
    return (m.group(1), m.group(2) or '') if m else ('','')
def cats(path):
    out=subprocess.run(['twiggy','top','-n','100000','-f','csv',path],capture_output=True,text=True).stdout
    c=collections.Counter()
    for r in csv.DictReader(out.splitlines()):
        n=r['Name']; b=int(r['ShallowSize'])
        if 'function names' in n: continue
        crate,mod=lead(n)
        if n.startswith('data segment'): k='data (strings, tables)'
        elif 'future_to_promise' in n or (crate=='agentstore' and mod=='options' and '::run' in n): k='exported async bodies (one state machine per method)'
        elif re.search(r'flt2dec|float_to_decimal|fmt::float|dec2flt|bignum',n): k='float formatting'
        elif crate in ('futures_util','futures_channel','futures_core','futures_task','gloo_timers'): k='futures / gloo-timers'
        elif crate=='hashbrown': k='hashbrown'
        elif 'collections::btree' in n or '::btree::' in n: k='BTreeMap/BTreeSet'
        elif crate=='dlmalloc' or n.startswith('__rdl') or n.startswith('__rust_'): k='allocator'
        elif crate in ('core','std','alloc','__rustc') and re.search(r'fmt|panic|Debug|Display|unicode',n): k='core::fmt, Debug, panics'
        elif crate=='agentstore' and mod=='store': k='store code (agentstore::store)'
        elif crate in ('agentstore_protocol','md5','digest'): k='protocol crate + md5'
        elif crate=='agentstore': k='other SDK code (api, value, errors, options)'
        elif crate in ('wasm_bindgen','js_sys','web_sys','wasm_bindgen_futures') or re.match(r'import |export |type\[|elem|table|__wbindgen|__externref',n) or 'externref' in n: k='wasm-bindgen glue, imports, exports'
        else: k='std/core/alloc (Vec, String, slices, sorting, drop glue)'
        c[k]+=b
    return c
mods = [cats(p) for p in sys.argv[1:]]
keys = sorted(set().union(*mods), key=lambda k: -mods[0].get(k, 0))
print('| code/data (twiggy top, name section excluded, raw bytes) | ' + ' | '.join(sys.argv[1:]) + ' |')
print('|---|' + '---:|' * len(mods))
for k in keys:
    print(f'| {k} | ' + ' | '.join(f'{m.get(k, 0):,}' for m in mods) + ' |')
print('| **total** | ' + ' | '.join(f'{sum(m.values()):,}' for m in mods) + ' |')
