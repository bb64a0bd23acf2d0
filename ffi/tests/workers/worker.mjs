// A Node.js worker of the mixed-language tests (ffi/tests/mixed.rs); the
// same roles and line protocol as worker.c (see there). Waits go through
// the binding's async calls, so the event loop stays free to read stdin.

import { createInterface } from 'node:readline';

import { Limiter, Region, Scheduler } from '../../../node/index.mjs';

const lines = createInterface({ input: process.stdin });
const queue = [];
let waiting = null;
let closed = false;
lines.on('line', (l) => { if (waiting) { const w = waiting; waiting = null; w(l); } else queue.push(l); });
lines.on('close', () => { closed = true; if (waiting) { const w = waiting; waiting = null; w(null); } });
function nextLine() {
  if (queue.length) return Promise.resolve(queue.shift());
  if (closed) return Promise.resolve(null);
  return new Promise((resolve) => { waiting = resolve; });
}
const say = (l) => process.stdout.write(`${l}\n`);

async function schedHold(path, prio) {
  const sched = Scheduler.attach(Region.open(path));
  sched.setLottery(0, false);
  say('ready');
  const permit = await sched.acquire(prio);
  say('got');
  await nextLine();
  permit.release();
  say('released');
  sched.close();
}

async function schedChurn(path, seconds) {
  const sched = Scheduler.attach(Region.open(path));
  say('ready');
  if ((await nextLine()) === null) return;
  const end = process.hrtime.bigint() + BigInt(Math.round(Number(seconds) * 1e9));
  let n = 0;
  while (process.hrtime.bigint() < end) {
    const permit = await sched.acquire(Math.floor(Math.random() * 7) - 3);
    const hold = process.hrtime.bigint() + BigInt(Math.floor(Math.random() * 200_000));
    while (process.hrtime.bigint() < hold) { /* hold */ }
    permit.release();
    n++;
  }
  say(`done ${n}`);
  sched.close();
}

async function limConsume(path, chunk) {
  const lim = Limiter.attach(Region.open(path));
  const n = Number(chunk);
  say('ready');
  const go = (await nextLine())?.split(' ');
  if (!go || go[0] !== 'go') return;
  const origin = BigInt(go[1]);
  let stop = false;
  nextLine().then(() => { stop = true; });
  const buckets = new Map();
  let total = 0;
  while (!stop) {
    await lim.consume(n, 'normal');
    const at = process.hrtime.bigint();
    total += n;
    if (at >= origin) {
      const i = Number((at - origin) / 10_000_000n);
      buckets.set(i, (buckets.get(i) ?? 0) + n);
    }
  }
  for (const i of [...buckets.keys()].sort((a, b) => a - b)) say(`bucket ${i} ${buckets.get(i)}`);
  say(`consumed ${total}`);
  lim.close();
  lines.close();
}

// Queues at `prio` with an AbortSignal; aborts on "abort" and reports how
// the wait ended ("aborted AbortError"), then waits for stdin to close.
async function schedAbort(path, prio) {
  const sched = Scheduler.attach(Region.open(path));
  const ac = new AbortController();
  const wait = sched.acquire(prio, { signal: ac.signal });
  say('ready');
  await nextLine();
  ac.abort();
  try {
    (await wait).release();
    say('got');
  } catch (e) {
    say(`aborted ${e.name}`);
  }
  await nextLine();
  sched.close();
}

const roles = {
  'sched-hold': schedHold, 'sched-churn': schedChurn, 'lim-consume': limConsume, 'sched-abort': schedAbort,
};
await roles[process.argv[2]](...process.argv.slice(3));
process.stdin.destroy();
