// Tests of the Node.js binding: `node --test` (in node/), run against the
// library named by SHMSCHED_LIB (ffi/tests/node.rs sets it to the freshly
// built one), else target/release or target/debug.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { unlinkSync } from 'node:fs';

import {
  ABI_VERSION, FairShare, Limiter, Region, Scheduler, ShmschedError, debugPanic,
} from '../index.mjs';

let n = 0;
const paths = [];
function region(tag) {
  const p = `/dev/shm/shmsched-nodetest-${tag}-${process.pid}-${n++}`;
  paths.push(p);
  return Region.create(p);
}
process.on('exit', () => {
  for (const p of paths) {
    try { unlinkSync(p); } catch { /* already gone */ }
  }
});

/** Polls `cond` on the event loop until true (for states with no event:
 * a waiter queued in the library shows only in the region's gauges). */
async function until(what, cond) {
  const deadline = Date.now() + 30_000;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 1));
  }
}

test('the loaded library speaks this ABI', () => {
  assert.equal(ABI_VERSION, 1);
});

test('acquire resolves a permit; release gives it back once', async () => {
  const sched = Scheduler.shared(region('basic'), 2);
  const permit = await sched.acquire('high');
  assert.equal(sched.globalRunning, 1);
  permit.release();
  assert.equal(sched.globalRunning, 0);
  assert.throws(() => permit.release(), (e) => e instanceof ShmschedError
    && e.code === 'ALREADY_RELEASED' && /already released/.test(e.message));
  sched.close();
});

test('a waiting acquire does not block the event loop', async () => {
  const sched = Scheduler.shared(region('loop'), 1);
  const held = sched.acquireSync('normal');
  let ticked = false;
  const waiting = sched.acquire('high');
  // The release happens in a timer callback: the event loop runs while the
  // acquire waits on a library thread.
  setTimeout(() => { ticked = true; held.release(); }, 5);
  const permit = await waiting;
  assert.ok(ticked);
  assert.equal(sched.globalRunning, 1);
  permit.release();
  sched.close();
});

test('higher priority is served first among waiting acquires', async () => {
  const sched = Scheduler.shared(region('prio'), 1);
  sched.setLottery(0, false);
  const held = sched.acquireSync();
  const order = [];
  const low = sched.acquire('low').then((p) => { order.push('low'); return p; });
  await until('low queued', () => sched.stats().shared.waiters[2] === 1);
  const high = sched.acquire('highest').then((p) => { order.push('highest'); return p; });
  await until('highest queued', () => sched.stats().shared.waiters[6] === 1);
  held.release();
  const first = await high;
  assert.deepEqual(order, ['highest']);
  first.release();
  (await low).release();
  assert.deepEqual(order, ['highest', 'low']);
  sched.close();
});

test('timeouts, invalid priorities and errors carry the library text', async () => {
  const r = region('errors');
  const sched = Scheduler.shared(r, 1);
  const held = sched.acquireSync();
  await assert.rejects(sched.acquire('low', { timeout: 0.005 }), (e) => e.code === 'TIMEOUT'
    && /timed out/.test(e.message));
  assert.equal(sched.tryAcquire('highest'), null);
  assert.throws(() => sched.acquireSync(7), (e) => e.code === 'INVALID_PRIORITY'
    && /priority 7 is out of range: expected -3..=3/.test(e.message));
  assert.throws(() => Limiter.shared(r, 1000), (e) => e.code === 'WRONG_KIND');
  assert.throws(() => Scheduler.shared(r, 2), (e) => e.code === 'MISMATCH');
  assert.throws(() => debugPanic(), (e) => e.code === 'INTERNAL' && /panicked/.test(e.message));
  held.release();
  sched.dispose();
  await assert.rejects(sched.acquire(), (e) => e.code === 'DISPOSED');
  sched.close();
  assert.equal(r.info().kind, 'scheduler');
});

test('limiter: consume, tryConsume, timeout', async () => {
  const lim = Limiter.shared(region('lim'), 1000);
  assert.equal(lim.tokensPerSecond, 1000);
  const g = await lim.consume(1000, 'normal');
  assert.equal(g.immediate, true);
  assert.equal(lim.tryConsume(900), false);
  await assert.rejects(lim.consume(900, 'low', { timeout: 0.001 }), (e) => e.code === 'TIMEOUT');
  const later = await lim.consume(10, 'high');
  assert.equal(later.forced, false);
  lim.close();
});

test('fair share: lease, refusal, release, stats', () => {
  const fair = FairShare.shared(region('fair'), {
    ceiling: 100,
    fairness_unit: 'cost',
    tenants: [{ id: 'a', weight: 1 }, { id: 'b', weight: 1 }],
    reclaim_horizon_ms: 100,
    idle_after_ms: 1000,
    started_at_ms: 0,
  });
  const own = fair.acquire('b', 50, 1000, 2000);
  assert.deepEqual(own, { granted: true, id: 'b1', deadlineMs: 3000 });
  const loan = fair.acquire('b', 50, 100, 2000);
  assert.equal(loan.granted, true);
  const refused = fair.acquire('a', 50, 100, 2010);
  assert.equal(refused.granted, false);
  assert.equal(refused.reason, 'guarantee_on_loan');
  assert.equal(refused.retryAfterMs, 90);
  fair.release(loan, 2020);
  assert.throws(() => fair.release(loan, 2021), (e) => e.code === 'ALREADY_RELEASED');
  assert.throws(() => fair.acquire('nobody', 1, 1, 2022), (e) => e.code === 'UNKNOWN_TENANT');
  assert.equal(fair.stats(2030).tenants.b.held, 50);
  fair.close();
});
