// What the binding's tests share: regions under names unique to the test
// process (removed at exit), and polling for states that have no event.

import { unlinkSync } from 'node:fs';

import { Region } from 'shmsched';

let n = 0;
const paths = [];
process.on('exit', () => {
  for (const p of paths) {
    try { unlinkSync(p); } catch { /* already gone */ }
  }
});

/** A fresh named region, removed when the process exits. */
export function region(tag) {
  const p = `/dev/shm/shmsched-nodetest-${tag}-${process.pid}-${n++}`;
  paths.push(p);
  return Region.create(p);
}

/** A region path that will be removed at exit (not created). */
export function regionPath(tag) {
  const p = `/dev/shm/shmsched-nodetest-${tag}-${process.pid}-${n++}`;
  paths.push(p);
  return p;
}

/** Polls `cond` on the event loop until true (a waiter queued in the
 * library shows only in the region's gauges). */
export async function until(what, cond, ms = 30_000) {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 1));
  }
}

/** A fair-share configuration of two tenants of equal weight. */
export const FAIR = Object.freeze({
  ceiling: 100,
  fairness_unit: 'cost',
  tenants: [{ id: 'a', weight: 1 }, { id: 'b', weight: 1 }],
  reclaim_horizon_ms: 100,
  idle_after_ms: 1000,
  started_at_ms: 0,
});
