// The waiting layer: a wait that cannot be served at once (an acquire or a
// consume) becomes a promise here, and this is the only file that knows how
// the library waits. The rest of the binding calls `waitAcquire` and
// `waitConsume` with checked arguments and gets back a promise of the
// permit token or of the grant.
//
// # How it works
//
// The process has one waitset of the library (`shmsched_waitset`, made on
// the first wait). A wait is started in it (`_acquire_start`,
// `_consume_start`): it is queued in the region at once, a real waiter at
// its priority, so the region's order holds across processes and
// languages, and it takes no thread. Each wait has a tag; `pending` maps
// tags to the promises' settle functions.
//
// While any wait is pending, exactly one asynchronous koffi call of
// `shmsched_waitset_wait` is in flight: it blocks one libuv thread-pool
// thread until some wait has something to collect (a grant, a failure, a
// cancellation, a deadline passed). Its callback, on the main thread,
// takes every completion (`shmsched_waitset_take`, in batches), settles
// the promises by tag, and issues the next wait if anything is still
// pending. So the cost of N pending waits is N entries in a map, one
// thread, and one event-loop callback per batch of completions.
//
// The in-flight call keeps the event loop alive (a pending wait must: its
// promise is what the program awaits). When the last wait ends while the
// call is in flight, `shmsched_waitset_interrupt` makes it return, so a
// process with nothing pending exits.
//
// An abort cancels the wait in the library (`shmsched_waitset_cancel`);
// the promise rejects with AbortError when the wait's CANCELLED completion
// is taken, so by the time a caller sees the rejection the wait is gone
// from the region and holds nothing (the library gives back a grant that
// raced the cancel). Timeouts are the library's (the waitset's timer).

import { AbortError, errorFor } from './errors.mjs';
import { C, koffi, lastError } from './native.mjs';

const FOREVER = 0xffff_ffff_ffff_ffffn;
const OK = 0;
const KIND_ACQUIRE = 1;
const BATCH = 256;

const T = koffi.type('shmsched_completion');
const SIZE = koffi.sizeof(T);
const at = (field) => koffi.offsetof(T, field);
const OFF = {
  tag: at('tag'),
  permit: at('permit'),
  status: at('status'),
  kind: at('kind'),
  grant: at('grant'),
  message: at('message'),
};
const MESSAGE_MAX = SIZE - OFF.message;

let ws = null;
const pending = new Map();
let nextTag = 1;
let inFlight = false;
const buf = Buffer.alloc(SIZE * BATCH);
// Outputs read in place (see lib/abi.mjs): the id a start writes, the
// count a take writes, the count the in-flight wait writes.
const idOut = new BigUint64Array(1);
const takenOut = new BigUint64Array(1);
const readyOut = new BigUint64Array(1);

function waitset() {
  if (ws === null) {
    const out = [null];
    const st = C.shmsched_waitset_create(out);
    if (st !== OK) throw lastError(st);
    ws = out[0];
  }
  return ws;
}

/** Waits started in this process and not yet settled. */
export function pendingWaits() {
  return pending.size;
}

function pump() {
  if (inFlight || pending.size === 0) return;
  inFlight = true;
  C.shmsched_waitset_wait.async(ws, FOREVER, readyOut, (err) => {
    inFlight = false;
    if (err) {
      failAll(err);
      return;
    }
    collect();
    pump();
  });
}

function failAll(err) {
  for (const e of pending.values()) {
    e.fail();
    e.reject(err);
  }
  pending.clear();
}

function collect() {
  for (;;) {
    const st = C.shmsched_waitset_take(ws, buf, BATCH, takenOut);
    if (st !== OK) {
      failAll(lastError(st));
      return;
    }
    const n = Number(takenOut[0]);
    for (let i = 0; i < n; i++) settle(i * SIZE);
    if (n < BATCH) return;
  }
}

function message(off) {
  const start = off + OFF.message;
  const end = buf.indexOf(0, start);
  return buf.toString('utf8', start, end < 0 || end > start + MESSAGE_MAX ? start + MESSAGE_MAX : end);
}

function settle(off) {
  const tag = Number(buf.readBigUInt64LE(off + OFF.tag));
  const status = buf.readUInt32LE(off + OFF.status);
  const e = pending.get(tag);
  const permit = () => ({
    process: buf.readBigUInt64LE(off + OFF.permit), serial: buf.readBigUInt64LE(off + OFF.permit + 8),
  });
  if (e === undefined) {
    // A wait whose promise was settled already (its cancel failed): a
    // permit it was granted is nobody's; give it back.
    if (status === OK && buf.readUInt32LE(off + OFF.kind) === KIND_ACQUIRE) C.shmsched_permit_release(permit());
    return;
  }
  pending.delete(tag);
  if (e.signal) unwatch(e);
  if (status === OK) {
    const value = e.kind === 'acquire'
      ? permit()
      : { immediate: buf[off + OFF.grant] !== 0, forced: buf[off + OFF.grant + 1] !== 0 };
    if (e.aborted) {
      // Cancelled too late to stop the grant: not the caller's any more.
      if (e.kind === 'acquire') C.shmsched_permit_release(value);
      e.fail();
      e.reject(new AbortError(e.signal.reason));
    } else {
      e.resolve(e.finish(value));
    }
    return;
  }
  e.fail();
  // An aborted wait rejects with AbortError whatever ended it (CANCELLED,
  // or a timeout that came first): the caller asked for the abort.
  if (e.aborted) e.reject(new AbortError(e.signal.reason));
  else e.reject(errorFor(status, message(off)));
}

// One abort listener per signal, however many waits share it (a shutdown
// signal for thousands of waits): the waits of a signal are a set.
const bySignal = new WeakMap();

function watch(signal, e) {
  let set = bySignal.get(signal);
  if (set === undefined) {
    set = new Set();
    const onAbort = () => {
      bySignal.delete(signal);
      for (const w of set) abort(w);
    };
    set.onAbort = onAbort;
    bySignal.set(signal, set);
    signal.addEventListener('abort', onAbort, { once: true });
  }
  set.add(e);
}

function unwatch(e) {
  const set = bySignal.get(e.signal);
  if (set === undefined) return;
  set.delete(e);
  if (set.size === 0) {
    bySignal.delete(e.signal);
    e.signal.removeEventListener('abort', set.onAbort);
  }
}

function abort(e) {
  e.aborted = true;
  const c = C.shmsched_waitset_cancel(ws, e.id);
  if (c !== OK) {
    // Nothing to cancel: the wait was taken already. Takes run on this
    // thread and unwatch first, so this cannot happen; report it rather
    // than leave the promise pending.
    pending.delete(e.tag);
    e.fail();
    e.reject(lastError(c));
    if (pending.size === 0 && inFlight) C.shmsched_waitset_interrupt(ws);
  }
}

function start(kind, begin, signal, finish, fail) {
  return new Promise((resolve, reject) => {
    const tag = nextTag++;
    let st;
    try {
      st = begin(waitset(), tag);
    } catch (err) {
      fail();
      reject(err);
      return;
    }
    if (st !== OK) {
      fail();
      reject(lastError(st));
      return;
    }
    const e = { kind, tag, id: idOut[0], resolve, reject, finish, fail, signal, aborted: false };
    if (signal) watch(signal, e);
    pending.set(tag, e);
    pump();
  });
}

/** A promise of `finish(token)` for an acquire of `units` at `priority`
 * (checked values); the token is the permit `{process, serial}`. `fail()`
 * runs when the wait ends without a grant. */
export function waitAcquire(sched, priority, units, timeoutNs, signal, finish, fail) {
  return start('acquire',
    (w, tag) => C.shmsched_scheduler_acquire_start(sched, priority, units, timeoutNs, w, tag, idOut),
    signal, finish, fail);
}

/** A promise of `finish(grant)` for a consume of `n` tokens; the grant is
 * `{immediate, forced}`. */
export function waitConsume(lim, n, priority, timeoutNs, signal, finish, fail) {
  return start('consume',
    (w, tag) => C.shmsched_limiter_consume_start(lim, n, priority, timeoutNs, w, tag, idOut),
    signal, finish, fail);
}
