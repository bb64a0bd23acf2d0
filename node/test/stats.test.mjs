// The stats structs as this binding declares them to koffi (lib/abi.mjs),
// read from the library through the bound C functions: the layout matches
// the library's, and the limiter's per-priority token counters (per handle
// and region-wide) hold exact values after known consumes and refunds.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';

import { Limiter } from 'shmsched';
import { region, regionPath } from './support.mjs';

const require = createRequire(import.meta.url);
const pkgDir = dirname(require.resolve('shmsched/package.json'));
const { C, LIBRARY_PATH, check, koffi, text } = await import(
  new URL('lib/native.mjs', `file://${pkgDir}/`).href);

const FOREVER = 0xffffffffffffffffn;
const CANCELLED = 25;
const HIGH = 1;
const NORMAL = 0;
const LOW = -1;

/** A call's one handle output. */
function make(fn, ...args) {
  const out = [null];
  check(fn(...args, out));
  return out[0];
}

/** The limiter's stats through the koffi struct, 64-bit counters as Numbers. */
function stats(lim) {
  const type = 'shmsched_limiter_stats';
  const s = koffi.decode(Buffer.alloc(koffi.sizeof(type)), type);
  s.size = koffi.sizeof(type);
  check(C.shmsched_limiter_get_stats(lim, s));
  assert.equal(s.size, koffi.sizeof(type), 'the library filled the whole struct');
  const nums = (a) => a.map(Number);
  return {
    consumed: nums(s.consumed),
    refunded: nums(s.refunded),
    region: { consumed: nums(s.region.consumed), refunded: nums(s.region.refunded),
      processes: s.region.processes },
    hasRegion: s.has_region,
  };
}

test('the limiter stats struct has the library\'s size', () => {
  const r = make(C.shmsched_region_create, regionPath('limsize'), 0, 0);
  const lim = make(C.shmsched_limiter_shared, r, 1000);
  // Offered more room than any version needs, the library fills (and
  // reports in `size`) exactly its own sizeof.
  const raw = koffi.load(LIBRARY_PATH).func(
    'uint32_t shmsched_limiter_get_stats(shmsched_limiter *lim, void *out)');
  const buf = Buffer.alloc(4096);
  buf.writeUInt32LE(buf.length, 0);
  check(raw(lim, buf));
  assert.equal(buf.readUInt32LE(0), koffi.sizeof('shmsched_limiter_stats'));
  C.shmsched_limiter_close(lim);
  C.shmsched_region_close(r);
});

test('limiter stats: consumed and refunded per priority, per handle and region-wide', () => {
  const r = make(C.shmsched_region_create, regionPath('limctr'), 0, 0);
  const lim = make(C.shmsched_limiter_shared, r, 1000);
  const other = make(C.shmsched_limiter_attach, r);
  const ws = make(C.shmsched_waitset_create);
  // 360 of a full bucket of 1000: everything goes at once.
  check(C.shmsched_limiter_consume(lim, 200, HIGH, null));
  // Granted at start, cancelled before it is taken: refunded.
  const id = new BigUint64Array(1);
  check(C.shmsched_limiter_consume_start(lim, 100, HIGH, FOREVER, ws, 7n, id));
  check(C.shmsched_waitset_cancel(ws, id[0]));
  const size = koffi.sizeof('shmsched_completion');
  const buf = Buffer.alloc(2 * size);
  const taken = new BigUint64Array(1);
  check(C.shmsched_waitset_take(ws, buf, 2, taken));
  assert.equal(Number(taken[0]), 1);
  assert.equal(koffi.decode(buf, 'shmsched_completion').status, CANCELLED);
  check(C.shmsched_limiter_try_consume(lim, 10)); // counted at Normal
  check(C.shmsched_limiter_consume(other, 50, LOW, null));

  const hi = HIGH + 3;
  const normal = NORMAL + 3;
  const lo = LOW + 3;
  const at = (pairs) => {
    const a = [0, 0, 0, 0, 0, 0, 0];
    for (const [i, n] of pairs) a[i] = n;
    return a;
  };
  const s = stats(lim);
  assert.equal(s.hasRegion, 1);
  assert.equal(s.region.processes, 1);
  assert.deepEqual(s.consumed, at([[hi, 300], [normal, 10]]));
  assert.deepEqual(s.refunded, at([[hi, 100]]));
  assert.deepEqual(s.region.consumed, at([[hi, 300], [normal, 10], [lo, 50]]));
  assert.deepEqual(s.region.refunded, at([[hi, 100]]));
  const o = stats(other);
  assert.deepEqual(o.consumed, at([[lo, 50]]));
  assert.deepEqual(o.refunded, at([]));
  assert.deepEqual(o.region, s.region);
  // The JSON stats say the same.
  const j = JSON.parse(text(C.shmsched_limiter_stats_json, lim));
  assert.deepEqual(j.queues.map((q) => q.consumed), s.consumed);
  assert.deepEqual(j.queues.map((q) => q.refunded), s.refunded);
  assert.deepEqual(j.shared.consumed, s.region.consumed);
  assert.deepEqual(j.shared.refunded, s.region.refunded);

  C.shmsched_waitset_close(ws);
  C.shmsched_limiter_close(other);
  C.shmsched_limiter_close(lim);
  C.shmsched_region_close(r);
});

test('an async consume that goes at once counts at its priority, not at Normal', async () => {
  const r = region('limprio');
  // 1 token/s: nothing measurable refills while the test runs.
  const lim = Limiter.shared(r, 1, { capacity: 1000 });
  assert.deepEqual(await lim.consume(300, 'high'), { immediate: true, forced: false });
  assert.deepEqual(await lim.consume(200, 'low'), { immediate: true, forced: false });
  const want = [0, 0, 200, 0, 300, 0, 0];
  const j = lim.stats();
  assert.deepEqual(j.queues.map((q) => q.consumed), want);
  assert.deepEqual(j.shared.consumed, want);
  assert.deepEqual(j.queues.map((q) => q.refunded), [0, 0, 0, 0, 0, 0, 0]);
  // tryConsumeAt: the same counting; a child refused at the emptied root
  // is refunded at the priority.
  assert.equal(lim.tryConsumeAt(500, 'higher'), true);
  const child = lim.child(1, { capacity: 1000 });
  assert.equal(child.tryConsumeAt(250, 'low'), false);
  const c = child.stats();
  assert.deepEqual(c.queues.map((q) => q.consumed), [0, 0, 250, 0, 0, 0, 0]);
  assert.deepEqual(c.queues.map((q) => q.refunded), [0, 0, 250, 0, 0, 0, 0]);
  assert.deepEqual(lim.stats().queues.map((q) => q.consumed), [0, 0, 200, 0, 300, 500, 0]);
  child.close();
  lim.close();
  r.close();
});
