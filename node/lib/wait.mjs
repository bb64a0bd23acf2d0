// The waiting layer: a wait that cannot be served at once (an acquire or a
// consume) becomes a promise here, and this is the only file that knows how
// the library waits for it. The rest of the binding calls `waitAcquire` and
// `waitConsume` with checked arguments and gets back a promise of the
// permit token or of the grant.
//
// Interim mechanism: the library's `_async` calls, one library thread per
// pending wait, reporting through a koffi callback (the waitset replaces
// it). An abort rejects at once; a permit granted after the abort is given
// straight back.

import { AbortError, errorFor } from './errors.mjs';
import { C, koffi, lastError } from './native.mjs';

// A ref'ed timer keeps the process alive while a wait is pending on a
// library thread (nothing else in the event loop may be waiting).
let pending = 0;
let keepAlive = null;
function started() {
  if (pending++ === 0) keepAlive = setInterval(() => {}, 1 << 30);
}
function ended() {
  if (--pending === 0) {
    clearInterval(keepAlive);
    keepAlive = null;
  }
}

/** Waits pending in this process (all handles). */
export function pendingWaits() {
  return pending;
}

function wait(start, proto, onGranted, signal) {
  return new Promise((resolve, reject) => {
    let aborted = false;
    const onAbort = () => {
      aborted = true;
      reject(new AbortError(signal.reason));
    };
    const cb = koffi.register((ctx, status, value, message) => {
      koffi.unregister(cb);
      ended();
      signal?.removeEventListener('abort', onAbort);
      if (aborted) {
        if (status === 0) onGranted(value);
        return;
      }
      if (status === 0) resolve(value);
      else reject(errorFor(status, message ?? ''));
    }, koffi.pointer(proto));
    const st = start(cb);
    if (st !== 0) {
      koffi.unregister(cb);
      reject(lastError(st));
      return;
    }
    started();
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** A promise of a permit token `{process, serial}` for `units` at
 * `priority` (checked values). */
export function waitAcquire(sched, priority, units, timeoutNs, signal) {
  if (units !== 1) {
    return Promise.reject(new Error('weighted waits need the waitset'));
  }
  return wait(
    (cb) => C.shmsched_scheduler_acquire_async(sched, priority, timeoutNs, cb, null),
    'shmsched_acquire_callback',
    (permit) => C.shmsched_permit_release(permit),
    signal,
  );
}

/** A promise of a grant `{immediate, forced}` for `n` tokens. */
export function waitConsume(lim, n, priority, timeoutNs, signal) {
  return wait(
    (cb) => C.shmsched_limiter_consume_async(lim, n, priority, timeoutNs, cb, null),
    'shmsched_consume_callback',
    () => {},
    signal,
  );
}
