import { Region, Scheduler, Limiter, FairShare, TimeoutError, AbortError, ShmschedError, InvalidArgumentError, type Permit, PRIORITIES } from 'shmsched';
async function main() {
  const r = Region.openOrCreate('pool', { mode: 0o600 });
  const s = Scheduler.shared(r, 8, { low: 2, HIGH: null });
  const ac = new AbortController();
  const p: Permit = await s.acquire('high', { timeout: 1, signal: ac.signal });
  p.release();
  const n: number = s.globalRunning;
  const m = await s.acquireMany(2n, -1);
  m.release();
  const out: string = await s.run(async () => 'x', 'low');
  const l = Limiter.shared(r, 1000, { capacity: 10 });
  const g = await l.consume(10, 'normal');
  const b: boolean = g.forced;
  const f = FairShare.shared(r, { ceiling: 1, fairness_unit: 'cost', tenants: [{ id: 'a', weight: 1 }], reclaim_horizon_ms: 1, idle_after_ms: 2, started_at_ms: 0 });
  const o = f.acquire('a', 1, 10);
  if (o.granted) f.release(o); else console.log(o.reason, o.retryAfterMs);
  try { s.setCeiling(1); } catch (e) {
    if (e instanceof TimeoutError) { const c: 'TIMEOUT' = e.code; }
    if (e instanceof ShmschedError) console.log(e.status, e.code);
    if (e instanceof InvalidArgumentError) console.log(e.status);
    if (e instanceof AbortError) console.log(e.code);
  }
  console.log(n, out, b, PRIORITIES.high);
}
main();

// What must not type-check.
function misuse(r: Region, s: Scheduler, l: Limiter) {
  // @ts-expect-error: max is required
  Scheduler.shared(r);
  // @ts-expect-error: the constructor is private (handles come from the factories)
  new Region();
  // @ts-expect-error: a count is a number or a bigint
  l.consume('10');
  // @ts-expect-error: options are checked
  s.acquire('high', { timout: 1 });
  // @ts-expect-error: a Permit is read-only
  s.tryAcquire()!.units = 3;
}
void misuse;
