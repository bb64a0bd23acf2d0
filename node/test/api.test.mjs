// The binding's behaviour, through the package's public entry point
// (`import ... from 'shmsched'` resolves to this package: in the source
// tree by self-reference, in a project that installed it from
// node_modules), against the library it finds: SHMSCHED_LIB when set
// (ffi/tests/node.rs sets it to the freshly built one), else the copy
// shipped in the package, else the source tree's build.

import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
  ABI_VERSION, AbortError, AlreadyReleasedError, ClosedError, DisposedError, FairShare,
  InternalError, InvalidArgumentError, InvalidPriorityError, LIBRARY_PATH, Limiter,
  MismatchError, Region, Scheduler, ShmschedError, TimeoutError, UnknownTenantError,
  WrongKindError, debugPanic, priorityValue, strerror,
} from 'shmsched';
import { FAIR, region, until } from './support.mjs';

test('the loaded library speaks this ABI, and is the one expected', () => {
  assert.equal(ABI_VERSION, 1);
  if (process.env.SHMSCHED_EXPECT_LIB) {
    assert.ok(LIBRARY_PATH.includes(process.env.SHMSCHED_EXPECT_LIB),
      `loaded ${LIBRARY_PATH}, expected a path containing ${process.env.SHMSCHED_EXPECT_LIB}`);
  }
});

test('acquire resolves a permit; release gives it back once', async () => {
  const sched = Scheduler.shared(region('basic'), 2);
  const permit = await sched.acquire('high');
  assert.equal(permit.priority, 'high');
  assert.equal(permit.units, 1);
  assert.equal(sched.globalRunning, 1);
  permit.release();
  assert.equal(permit.released, true);
  assert.equal(sched.globalRunning, 0);
  assert.throws(() => permit.release(), (e) => e instanceof AlreadyReleasedError
    && e instanceof ShmschedError && e.code === 'ALREADY_RELEASED' && /already released/.test(e.message));
  sched.close();
});

test('a waiting acquire does not block the event loop', async () => {
  const sched = Scheduler.shared(region('loop'), 1);
  const held = sched.acquireSync('normal');
  let ticked = false;
  const waiting = sched.acquire('high');
  // The release happens in a timer callback: the event loop runs while the
  // acquire waits.
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
  const high = sched.acquire('HIGHEST').then((p) => { order.push('highest'); return p; });
  await until('highest queued', () => sched.stats().shared.waiters[6] === 1);
  held.release();
  const first = await high;
  assert.deepEqual(order, ['highest']);
  first.release();
  (await low).release();
  assert.deepEqual(order, ['highest', 'low']);
  sched.close();
});

test('errors are typed and carry the library text', async () => {
  const r = region('errors');
  const sched = Scheduler.shared(r, 1);
  const held = sched.acquireSync();
  await assert.rejects(sched.acquire('low', { timeout: 0.005 }), (e) => e instanceof TimeoutError
    && e.code === 'TIMEOUT' && /timed out/.test(e.message));
  assert.equal(sched.tryAcquire('highest'), null);
  assert.throws(() => sched.acquireSync(7), (e) => e instanceof InvalidPriorityError
    && e instanceof RangeError && /priority 7 is out of range: expected -3..=3/.test(e.message));
  assert.throws(() => Limiter.shared(r, 1000), (e) => e instanceof WrongKindError);
  assert.throws(() => Scheduler.shared(r, 2), (e) => e instanceof MismatchError && e.status === 10);
  assert.throws(() => debugPanic(), (e) => e instanceof InternalError && /panicked/.test(e.message));
  assert.throws(() => Region.create(r.info() && `/dev/shm/shmsched-nodetest-x-${process.pid}`, { mode: 0o606 }),
    (e) => e instanceof InvalidArgumentError && !(e instanceof RangeError) && /world-writable/.test(e.message));
  held.release();
  sched.dispose();
  assert.equal(sched.disposed, true);
  await assert.rejects(sched.acquire(), (e) => e instanceof DisposedError);
  sched.close();
  assert.equal(r.info().kind, 'scheduler');
  assert.match(strerror(14), /timed out/);
});

test('bad arguments: TypeError or RangeError, also ShmschedErrors; async calls reject', async () => {
  const sched = Scheduler.shared(region('args'), 2);
  assert.throws(() => Scheduler.shared(region('args2'), '3'), (e) => e instanceof TypeError
    && e instanceof InvalidArgumentError && e.code === 'INVALID_ARGUMENT' && /max must be an integer/.test(e.message));
  assert.throws(() => Scheduler.shared(region('args3'), 2 ** 32 + 2), (e) => e instanceof RangeError
    && /max 4294967298 is out of range: must be an integer 0..=65536/.test(e.message));
  assert.throws(() => Scheduler.shared({ handle: 5 }, 3), (e) => e instanceof TypeError
    && /region must be a Region/.test(e.message));
  assert.throws(() => Region.create(`/dev/shm/shmsched-nodetest-nul-${process.pid}\0tail`), (e) => e instanceof RangeError
    && /NUL/.test(e.message));
  for (const p of ['urgent', 1.5, -100, 2 ** 32 + 1]) {
    const pr = sched.acquire(p);
    assert.ok(pr instanceof Promise, `acquire(${p}) returned a promise`);
    await assert.rejects(pr, (e) => e instanceof InvalidPriorityError && e instanceof RangeError);
  }
  await assert.rejects(sched.acquire('normal', { timeout: -1 }), RangeError);
  await assert.rejects(sched.acquire('normal', { timout: 1 }), (e) => e instanceof TypeError && /unknown option "timout"/.test(e.message));
  assert.equal(priorityValue(' High '), 1);
  assert.equal(priorityValue(-3n), -3);
  assert.equal(priorityValue('2'), 2);
  assert.equal(sched.globalRunning, 0, 'nothing was taken by a refused call');
  sched.close();
});

test('closed handles are refused, never passed to the library', async () => {
  const r = region('closed');
  const sched = Scheduler.shared(r, 1);
  sched.close();
  sched.close();
  assert.equal(sched.closed, true);
  assert.throws(() => sched.globalRunning, (e) => e instanceof ClosedError && e.code === 'CLOSED');
  await assert.rejects(sched.acquire(), ClosedError);
  r.close();
  assert.throws(() => Scheduler.attach(r), ClosedError);
  // A handle of one kind where another goes is a TypeError, even with the
  // prototype swapped.
  const lim = Limiter.shared(region('closed2'), 10);
  Object.setPrototypeOf(lim, Scheduler.prototype);
  assert.throws(() => lim.globalRunning, (e) => e instanceof TypeError && /must be a Scheduler/.test(e.message));
  assert.throws(() => Scheduler.prototype.tryAcquire.call(Object.create(Scheduler.prototype)), TypeError);
});

test('weighted acquires take n units at once; the ceiling moves for every handle', async () => {
  const r = region('weighted');
  const sched = Scheduler.shared(r, 4);
  const other = Scheduler.attach(r);
  const two = await sched.acquireMany(2, 'high');
  assert.equal(two.units, 2);
  assert.equal(sched.globalRunning, 2);
  assert.equal(sched.tryAcquireMany(3), null);
  const three = sched.acquireMany(3, 'normal');
  await until('the weighted waiter queued', () => sched.stats().shared.waiters[3] === 1);
  two.release();
  (await three).release();
  assert.throws(() => sched.acquireManySync(5), (e) => e instanceof RangeError === false
    && e instanceof InvalidArgumentError && /can never be admitted: the max is 4/.test(e.message));
  assert.equal(sched.ceiling, 4);
  assert.equal(other.setCeiling(1), true);
  assert.equal(sched.ceiling, 1);
  const one = sched.tryAcquire();
  assert.ok(one);
  assert.equal(sched.tryAcquire(), null, 'the lowered ceiling holds through another handle');
  one.release();
  assert.throws(() => sched.setCeiling(5), (e) => e instanceof InvalidArgumentError && /above the region's max 4/.test(e.message));
  sched.setCeiling(4);
  const child = sched.child(1, { low: 0 });
  assert.equal(child.concurrency, 1);
  const c1 = child.tryAcquire('high');
  assert.ok(c1);
  assert.equal(child.tryAcquire('high'), null, 'the child\'s local cap');
  c1.release();
  child.close();
  sched.close();
  other.close();
});

test('limiter: consume, tryConsume, timeout, burst, live rate and capacity', async () => {
  const lim = Limiter.shared(region('lim'), 1000);
  assert.equal(lim.tokensPerSecond, 1000);
  assert.equal(lim.capacity, 1000);
  const g = await lim.consume(1000, 'normal');
  assert.equal(g.immediate, true);
  assert.equal(lim.tryConsume(900), false);
  await assert.rejects(lim.consume(900, 'low', { timeout: 0.001 }), TimeoutError);
  const later = await lim.consume(10, 'high');
  assert.equal(later.forced, false);
  lim.setRate(500);
  lim.setCapacity(50);
  assert.equal(lim.tokensPerSecond, 500);
  assert.equal(lim.capacity, 50);
  await assert.rejects(lim.consume(1, 9), InvalidPriorityError);
  lim.close();
  const burst = Limiter.shared(region('burst'), 1000, { capacity: 10 });
  assert.equal(burst.capacity, 10);
  assert.equal(burst.tryConsume(10), true);
  assert.equal(burst.tryConsume(1), false);
  const child = burst.child(100, { capacity: 5 });
  assert.equal(child.capacity, 5);
  child.close();
  burst.close();
});

test('fair share: lease, refusal, release, stats, reap', () => {
  const fair = FairShare.shared(region('fair'), FAIR);
  const own = fair.acquire('b', 50, 1000, 2000);
  assert.deepEqual(own, { granted: true, id: 'b1', deadlineMs: 3000 });
  const loan = fair.acquire('b', 50, 100, 2000);
  assert.equal(loan.granted, true);
  const refused = fair.acquire('a', 50, 100, 2010);
  assert.equal(refused.granted, false);
  assert.equal(refused.reason, 'guarantee_on_loan');
  assert.equal(refused.retryAfterMs, 90);
  fair.release(loan, 2020);
  assert.throws(() => fair.release(loan, 2021), AlreadyReleasedError);
  assert.throws(() => fair.acquire('nobody', 1, 1, 2022), UnknownTenantError);
  assert.equal(fair.stats(2030).tenants.b.held, 50);
  assert.deepEqual(fair.reap(), { processes: 0, leases: 0 });
  fair.close();
});

test('an aborted wait rejects with AbortError and leaves nothing behind', async () => {
  const sched = Scheduler.shared(region('abort'), 1);
  const held = sched.acquireSync();
  const ac = new AbortController();
  const w = sched.acquire('low', { signal: ac.signal });
  await until('queued', () => sched.stats().shared.waiters[2] === 1);
  ac.abort(new Error('no longer needed'));
  await assert.rejects(w, (e) => e instanceof AbortError && e.name === 'AbortError'
    && e.code === 'ABORT_ERR' && e.cause.message === 'no longer needed');
  await until('the aborted waiter is gone', () => sched.stats().shared.waiters[2] === 0);
  assert.equal(sched.globalRunning, 1);
  const pre = new AbortController();
  pre.abort();
  await assert.rejects(sched.acquire('high', { signal: pre.signal }), AbortError);
  held.release();
  assert.equal(sched.globalRunning, 0, 'the aborted wait holds nothing');
  sched.close();
});

test('a permit dropped without release gives its slot back when collected, with a warning', async () => {
  const { spawnSync } = await import('node:child_process');
  const code = `
    import { Region, Scheduler } from 'shmsched';
    const sched = Scheduler.shared(Region.anonymous(), 1);
    const warnings = [];
    process.on('warning', (w) => warnings.push(w.code));
    (() => { sched.tryAcquire(); })();
    const before = sched.globalRunning;
    for (let i = 0; i < 20 && sched.globalRunning > 0; i++) {
      globalThis.gc();
      await new Promise((r) => setTimeout(r, 10));
    }
    console.log(JSON.stringify({ before, after: sched.globalRunning, warnings }));
  `;
  // Run beside this file, where 'shmsched' resolves to the package tested.
  const r = spawnSync(process.execPath, ['--expose-gc', '--input-type=module', '-e', code], {
    encoding: 'utf8', timeout: 30_000, cwd: new URL('.', import.meta.url),
  });
  assert.equal(r.status, 0, r.stderr);
  assert.deepEqual(JSON.parse(r.stdout), { before: 1, after: 0, warnings: ['SHMSCHED_PERMIT_LEAKED'] });
});
