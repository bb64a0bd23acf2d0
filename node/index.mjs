// shmsched for Node.js: one concurrency budget (Scheduler), one byte-rate
// budget (Limiter) and one fair-share ceiling (FairShare) shared by many
// processes, in any language, through a memory-mapped region.
//
//   import { Region, Scheduler } from 'shmsched';
//   const region = Region.openOrCreate('pool');          // /dev/shm/shmsched.pool
//   const sched = Scheduler.shared(region, 8, { low: 2 });
//   const permit = await sched.acquire('high');           // never blocks the event loop
//   try { /* ... */ } finally { permit.release(); }
//
// A binding of libshmsched.so (the C ABI, ffi/ in the source tree) through
// koffi. How the pieces fit:
//
// - lib/abi.mjs is the table of every C function this binding declares;
//   lib/native.mjs finds and loads the library and binds that table.
// - lib/check.mjs checks every argument before koffi sees it (koffi would
//   convert anything to the C type, or crash on it): wrong type is a
//   TypeError, out of range a RangeError, both also ShmschedErrors.
// - lib/errors.mjs has one error class per C status, with the library's
//   message.
// - lib/wait.mjs turns a wait that cannot be served at once into a promise;
//   nothing else knows how the library waits.
// - Handles: the C pointers live in private fields of the objects made
//   here, checked by brand (never an object with a `handle` property), and
//   a closed handle is never passed to C again.
// - Every method that returns a promise reports bad input by rejecting it,
//   never by throwing.

import * as v from './lib/check.mjs';
import {
  AbortError, ClosedError, InvalidArgumentError, ShmschedTypeError,
} from './lib/errors.mjs';
import {
  ABI_VERSION, C, LAYOUT_VERSION, LIBRARY_PATH, check, koffi, lastError, text,
} from './lib/native.mjs';
import { pendingWaits, waitAcquire, waitConsume } from './lib/wait.mjs';

export {
  STATUS, STATUS_CODE, ShmschedError, ShmschedTypeError, ShmschedRangeError, ClosedError, AbortError,
  NullArgumentError, InvalidArgumentError, InvalidPriorityError, NotFoundError, AlreadyExistsError,
  IoError, BadRegionError, VersionMismatchError, WrongKindError, MismatchError, ProcessTableFullError,
  ZeroConcurrencyError, DisposedError, TimeoutError, WouldBlockError, ForkedError, AlreadyReleasedError,
  ForeignPermitError, BufferTooSmallError, UnknownTenantError, UnknownLeaseError, TimeWentBackwardsError,
  CapacityExhaustedError, InternalError, CancelledError,
} from './lib/errors.mjs';
export { ABI_VERSION, LAYOUT_VERSION, LIBRARY_PATH, pendingWaits };
export { PRIORITIES, PRIORITY_NAMES } from './lib/check.mjs';

const UNLIMITED = 0xffff_ffff;
const CAP_UNSET = 0xffff_ffff;
const FOREVER = v.FOREVER;
const WOULD_BLOCK = 15;
/** The largest shared scheduler (`max`), and the largest weighted acquire. */
export const MAX_SHARED_SLOTS = 65_536;
/** The largest child max or cap, rate, capacity and consume. */
export const MAX_I32 = 2_147_483_647;
/** The largest process table of a region. */
export const MAX_PROCESS_SLOTS = 4096;
/** The largest fair-share lease table. */
export const MAX_LEASE_CAPACITY = 1 << 20;

/** A priority as its integer value -3..=3: a name (any case) or an
 * integer; anything else throws (a RangeError or a TypeError). */
export function priorityValue(priority) {
  return v.priority(priority);
}

/** The library's one-line description of a status code. */
export function strerror(status) {
  return C.shmsched_strerror(v.int('status', status, 0, 0xffff_ffff));
}

/** For tests: the library panics; its boundary turns that into an
 * InternalError. */
export function debugPanic() {
  check(C.shmsched_debug_panic());
}

// ---- handles -------------------------------------------------------------

// A handle dropped without close() is closed when it is collected.
const handleRegistry = new FinalizationRegistry(({ ptr, close }) => close(ptr));

let ptrOf;
let enter;
let leave;
let forget;

class Handle {
  #ptr;
  #kind;
  #close;
  #busy = 0;
  #closing = false;

  constructor(kind, ptr, close) {
    this.#kind = kind;
    this.#ptr = ptr;
    this.#close = close;
    handleRegistry.register(this, { ptr, close }, this);
  }

  static {
    // Module-private access to the pointer: a user cannot reach it, so it
    // can never be forged, swapped or used after close.
    ptrOf = (x, kind, what) => {
      if (x === null || typeof x !== 'object' || !(#kind in x) || x.#kind !== kind) {
        throw new ShmschedTypeError(`${what} must be a ${kind} of this package, got ${v.describe(x)}`);
      }
      if (x.#closing || x.#ptr === null) throw new ClosedError(`${what}: this ${kind} is closed`);
      return x.#ptr;
    };
    // A pending wait keeps the C handle open past close() (the library
    // needs it until the wait completes).
    enter = (x) => {
      x.#busy++;
    };
    leave = (x) => {
      if (--x.#busy === 0 && x.#closing) x.#release();
    };
    // Gives the pointer up to a C call that closes it (detach).
    forget = (x, kind, what) => {
      const p = ptrOf(x, kind, what);
      if (x.#busy > 0) {
        throw new InvalidArgumentError(`${kind}.detach() with ${x.#busy} waits pending: `
          + 'let them settle (or abort them) first');
      }
      x.#ptr = null;
      handleRegistry.unregister(x);
      return p;
    };
  }

  #release() {
    const p = this.#ptr;
    if (p === null) return;
    this.#ptr = null;
    handleRegistry.unregister(this);
    this.#close(p);
  }

  /** Closes the handle (idempotent). With waits pending, the library's
   * handle is freed once they settle; the object is unusable at once. */
  close() {
    if (this === null || typeof this !== 'object' || !(#kind in this)) {
      throw new ShmschedTypeError(`close() must be called on a handle of this package, got ${v.describe(this)}`);
    }
    if (this.#ptr === null || this.#closing) return;
    this.#closing = true;
    if (this.#busy === 0) this.#release();
  }

  /** True once closed. */
  get closed() {
    if (this === null || typeof this !== 'object' || !(#kind in this)) {
      throw new ShmschedTypeError(`closed must be read on a handle of this package, got ${v.describe(this)}`);
    }
    return this.#closing || this.#ptr === null;
  }

}

function make(fn, ...args) {
  const out = [null];
  check(fn(...args, out));
  return out[0];
}

/** An out-parameter call returning its one output. */
function get(fn, ...args) {
  const out = [0];
  check(fn(...args, out));
  return out[0];
}

/** A call with two outputs (a count and a 64-bit count). */
function get2(fn, ptr) {
  const a = [0];
  const b = [0];
  check(fn(ptr, a, b));
  return [a[0], Number(b[0])];
}

// ---- Region --------------------------------------------------------------

const REGION_OPTIONS = ['mode', 'processSlots'];

function regionOptions(what, opts, keys = REGION_OPTIONS) {
  const o = v.options(what, opts, keys);
  return {
    mode: o.mode === undefined ? 0o600 : v.int('mode', o.mode, 0o600, 0o777),
    slots: o.processSlots === undefined ? 128 : v.int('processSlots', o.processSlots, 1, MAX_PROCESS_SLOTS),
  };
}

/** A shared region (a named file, or an anonymous memfd) holding one
 * object. */
export class Region extends Handle {
  constructor(ptr) {
    super('Region', ptr, C.shmsched_region_close);
  }

  /** Creates a new region file (a name maps to /dev/shm/shmsched.<name>;
   * a string with a `/` is a path). `mode` 0o600..=0o777 (never
   * world-writable), `processSlots` 1..=4096 (128). */
  static create(name, options) {
    const n = v.string('name', name);
    const o = regionOptions('Region.create', options);
    return new Region(make(C.shmsched_region_create, n, o.mode, o.slots));
  }

  /** Opens an existing region file. */
  static open(name) {
    return new Region(make(C.shmsched_region_open, v.string('name', name)));
  }

  /** Opens the region file, creating it if missing (race-free). */
  static openOrCreate(name, options) {
    const n = v.string('name', name);
    const o = regionOptions('Region.openOrCreate', options);
    return new Region(make(C.shmsched_region_open_or_create, n, o.mode, o.slots));
  }

  /** An anonymous region (a memfd); pass `dupFd()` to child processes. */
  static anonymous(options) {
    const o = regionOptions('Region.anonymous', options, ['processSlots']);
    return new Region(make(C.shmsched_region_anonymous, o.slots));
  }

  /** Opens the region behind a file descriptor (the caller keeps `fd`). */
  static openFd(fd) {
    return new Region(make(C.shmsched_region_open_fd, v.int('fd', fd, 0, MAX_I32)));
  }

  /** Removes a named region's file. */
  static remove(name) {
    check(C.shmsched_region_remove(v.string('name', name)));
  }

  /** A new inheritable descriptor of an anonymous region, owned by the
   * caller (pass it in `stdio` of child_process.spawn; close it after). */
  dupFd() {
    return get(C.shmsched_region_dup_fd, ptrOf(this, 'Region', 'this'));
  }

  /** The region's header (`kind` is null before an object was bound). */
  info() {
    const p = ptrOf(this, 'Region', 'this');
    const i = {
      size: koffi.sizeof('shmsched_region_info'), kind: 0, layout_version: 0, process_slots: 0, total_size: 0,
      created_at_unix_ms: 0, created_pid: 0, reserved: 0,
    };
    check(C.shmsched_region_get_info(p, i));
    const kinds = [null, 'scheduler', 'limiter', 'fair-share'];
    return {
      kind: i.kind < kinds.length ? kinds[i.kind] : i.kind,
      layoutVersion: i.layout_version,
      processSlots: i.process_slots,
      totalSize: Number(i.total_size),
      createdAtUnixMs: Number(i.created_at_unix_ms),
      createdPid: i.created_pid,
    };
  }
}

// ---- Scheduler -----------------------------------------------------------

function capsOf(what, caps) {
  if (caps === undefined) return [];
  if (caps === null || typeof caps !== 'object' || Array.isArray(caps)) {
    throw new ShmschedTypeError(`${what} caps must be an object mapping priorities to caps, `
      + `got ${v.describe(caps)}`);
  }
  const seen = new Map();
  for (const key of Reflect.ownKeys(caps)) {
    if (typeof key === 'symbol') throw new ShmschedTypeError(`${what} caps: a symbol key is not a priority`);
    const p = v.priority(key, 'cap priority');
    if (seen.has(p)) {
      throw new InvalidArgumentError(`${what} caps: priority ${v.PRIORITY_NAMES[p + 3]} is given twice `
        + `(${JSON.stringify(seen.get(p))} and ${JSON.stringify(key)})`);
    }
    seen.set(p, key);
  }
  return [...seen].map(([p, key]) => {
    const cap = caps[key];
    return [p, cap === null ? CAP_UNSET : v.int(`cap for ${key}`, cap, 0, MAX_I32)];
  });
}

function concurrency(what, max, caps, { limit, unlimited }) {
  const m = max === null && unlimited ? UNLIMITED : v.int('max', max, 0, limit);
  const entries = capsOf(what, caps);
  const c = C.shmsched_concurrency_max(m);
  for (const [p, cap] of entries) check(C.shmsched_concurrency_set_cap(c, p, cap));
  return c;
}

// A permit dropped without release() gives its slot back when collected,
// with a warning (a leak of capacity in the meantime).
const permitRegistry = new FinalizationRegistry((token) => {
  if (C.shmsched_permit_release(token) === 0) {
    process.emitWarning('a shmsched Permit was garbage-collected without release(): its slot '
      + 'was held until then', { type: 'ShmschedWarning', code: 'SHMSCHED_PERMIT_LEAKED' });
  }
});

/** The right to run one task (or `units` of the budget); release it exactly
 * once. */
export class Permit {
  #token;
  #units;
  #priority;
  #released = false;

  /** @internal Permits are made by the Scheduler only. */
  constructor(key, token, priority, units) {
    if (key !== PERMIT_KEY) throw new TypeError('Permit is not constructible: acquire one from a Scheduler');
    this.#token = Object.freeze({ process: token.process, serial: token.serial });
    this.#priority = v.PRIORITY_NAMES[priority + 3];
    this.#units = units;
    permitRegistry.register(this, this.#token, this);
  }

  static #of(x) {
    if (x === null || typeof x !== 'object' || !(#token in x)) {
      throw new ShmschedTypeError(`this must be a Permit of this package, got ${v.describe(x)}`);
    }
    return x;
  }

  /** The priority it was acquired at (a name). */
  get priority() {
    return Permit.#of(this).#priority;
  }

  /** How many units of the budget it holds. */
  get units() {
    return Permit.#of(this).#units;
  }

  /** The C token (`{process, serial}`), for logs. */
  get token() {
    return Permit.#of(this).#token;
  }

  /** True once released. */
  get released() {
    return Permit.#of(this).#released;
  }

  /** Gives the units back; a second release throws AlreadyReleasedError. */
  release() {
    check(C.shmsched_permit_release(Permit.#of(this).#token));
    this.#released = true;
    permitRegistry.unregister(this);
  }
}
const PERMIT_KEY = Symbol('permit');
if (Symbol.dispose) {
  Permit.prototype[Symbol.dispose] = function dispose() {
    if (!this.released) this.release();
  };
}

const WAIT_OPTIONS = ['timeout', 'signal'];

function abortedError(signal) {
  return new AbortError(signal.reason);
}

// The acquire paths, outside the class so that a foreign `this` meets the
// brand check first (a private method would throw its own TypeError).

// The permit a try_acquire writes, read in place (see lib/abi.mjs).
const permitOut = new BigUint64Array(2);

function tryTake(ptr, p, n) {
  return n === 1
    ? C.shmsched_scheduler_try_acquire(ptr, p, permitOut)
    : C.shmsched_scheduler_try_acquire_many(ptr, p, n, permitOut);
}

function taken(p, n) {
  return new Permit(PERMIT_KEY, { process: permitOut[0], serial: permitOut[1] }, p, n);
}

/** The promise of an acquire: one promise per call, resolved with the
 * Permit (a rejected one for bad input, never a throw). */
function acquire(self, what, n, priority, options) {
  try {
    const ptr = ptrOf(self, 'Scheduler', 'this');
    const units = v.int('n', n, 1, MAX_SHARED_SLOTS);
    const p = v.priority(priority);
    const o = v.options(what, options, WAIT_OPTIONS);
    const timeout = v.timeoutNs(o.timeout);
    const signal = v.signal(o.signal);
    if (signal?.aborted) throw abortedError(signal);
    const st = tryTake(ptr, p, units);
    if (st === 0) return Promise.resolve(taken(p, units));
    if (st !== WOULD_BLOCK) throw lastError(st);
    enter(self);
    return waitAcquire(ptr, p, units, timeout, signal, (token) => {
      leave(self);
      return new Permit(PERMIT_KEY, token, p, units);
    }, () => leave(self));
  } catch (e) {
    return Promise.reject(e);
  }
}

function acquireSync(self, what, n, priority, options) {
  const ptr = ptrOf(self, 'Scheduler', 'this');
  const p = v.priority(priority);
  const timeout = v.timeoutNs(v.options(what, options, ['timeout']).timeout);
  const out = {};
  let st;
  if (n === 1) {
    st = timeout === FOREVER
      ? C.shmsched_scheduler_acquire(ptr, p, out)
      : C.shmsched_scheduler_acquire_timeout(ptr, p, timeout, out);
  } else {
    st = timeout === FOREVER
      ? C.shmsched_scheduler_acquire_many(ptr, p, n, out)
      : C.shmsched_scheduler_acquire_many_timeout(ptr, p, n, timeout, out);
  }
  check(st);
  return new Permit(PERMIT_KEY, out, p, n);
}

function tryAcquire(self, n, priority) {
  const ptr = ptrOf(self, 'Scheduler', 'this');
  const p = v.priority(priority);
  const st = tryTake(ptr, p, n);
  if (st === WOULD_BLOCK) return null;
  check(st);
  return taken(p, n);
}

/** A concurrency budget shared by every process bound to the region. */
export class Scheduler extends Handle {
  constructor(ptr) {
    super('Scheduler', ptr, C.shmsched_scheduler_close);
  }

  /** Binds the scheduler in `region` with a global `max` (0..=65536);
   * `caps` maps priorities (names or -3..=3) to per-priority caps for this
   * handle's tasks (null: unset). */
  static shared(region, max, caps) {
    const r = ptrOf(region, 'Region', 'region');
    const c = concurrency('Scheduler.shared', max, caps, { limit: MAX_SHARED_SLOTS, unlimited: false });
    return new Scheduler(make(C.shmsched_scheduler_shared_with, r, c));
  }

  /** Joins the scheduler in `region`, whatever its max. */
  static attach(region) {
    return new Scheduler(make(C.shmsched_scheduler_attach, ptrOf(region, 'Region', 'region')));
  }

  /** A child scheduler: a local cap (`max` 0..=2147483647, or null for
   * none) on top of this one, in this process. */
  child(max = null, caps = undefined) {
    const p = ptrOf(this, 'Scheduler', 'this');
    const c = concurrency('Scheduler.child', max, caps, { limit: MAX_I32, unlimited: true });
    return new Scheduler(make(C.shmsched_scheduler_child_with, p, c));
  }

  /** Resolves a Permit once a slot is free at `priority`. Rejects with
   * TimeoutError after `timeout` seconds, with AbortError when `signal`
   * aborts (nothing held, no waiter left). Never blocks the event loop. */
  acquire(priority = 'normal', options = undefined) {
    return acquire(this, 'acquire', 1, priority, options);
  }

  /** Like acquire, for `n` units (1..=max) taken all at once. */
  acquireMany(n, priority = 'normal', options = undefined) {
    return acquire(this, 'acquireMany', n, priority, options);
  }

  /** Blocks the calling thread until a slot is free (for scripts and
   * worker threads; never on the main thread of a server). */
  acquireSync(priority = 'normal', options = undefined) {
    return acquireSync(this, 'acquireSync', 1, priority, options);
  }

  /** Like acquireSync, for `n` units. */
  acquireManySync(n, priority = 'normal', options = undefined) {
    ptrOf(this, 'Scheduler', 'this');
    return acquireSync(this, 'acquireManySync', v.int('n', n, 1, MAX_SHARED_SLOTS), priority, options);
  }

  /** A Permit if a slot is free at `priority` now (and nobody waits at it
   * or above), else null. */
  tryAcquire(priority = 'normal') {
    return tryAcquire(this, 1, priority);
  }

  /** Like tryAcquire, for `n` units. */
  tryAcquireMany(n, priority = 'normal') {
    ptrOf(this, 'Scheduler', 'this');
    return tryAcquire(this, v.int('n', n, 1, MAX_SHARED_SLOTS), priority);
  }

  /** Acquires, awaits `fn()`, releases (also when it throws). */
  async run(fn, priority = 'normal', options = undefined) {
    ptrOf(this, 'Scheduler', 'this');
    if (typeof fn !== 'function') throw new ShmschedTypeError(`fn must be a function, got ${v.describe(fn)}`);
    const permit = await acquire(this, 'run', 1, priority, options);
    try {
      return await fn();
    } finally {
      permit.release();
    }
  }

  /** Disposes this handle (and its children): pending waits reject with
   * DisposedError, later acquires fail at once. */
  dispose() {
    check(C.shmsched_scheduler_dispose(ptrOf(this, 'Scheduler', 'this')));
  }

  /** True once this handle (or a parent) was disposed. */
  get disposed() {
    return get(C.shmsched_scheduler_is_disposed, ptrOf(this, 'Scheduler', 'this'));
  }

  /** Gives back now the slots of dead processes: `{processes, slots}`. */
  reap() {
    const [processes, slots] = get2(C.shmsched_scheduler_reap, ptrOf(this, 'Scheduler', 'this'));
    return { processes, slots };
  }

  /** Slots held now across every process. */
  get globalRunning() {
    return get(C.shmsched_scheduler_global_running, ptrOf(this, 'Scheduler', 'this'));
  }

  /** This level's max, null when unlimited. */
  get concurrency() {
    const m = get(C.shmsched_scheduler_concurrency, ptrOf(this, 'Scheduler', 'this'));
    return m === UNLIMITED ? null : m;
  }

  /** The region's effective ceiling (its max unless moved by setCeiling). */
  get ceiling() {
    return get(C.shmsched_scheduler_ceiling, ptrOf(this, 'Scheduler', 'this'));
  }

  /** Moves the region's ceiling to `target` (0..=max) for every process:
   * lowering it revokes nothing, raising it serves waiters at once.
   * Returns whether it holds now. */
  setCeiling(target) {
    const ptr = ptrOf(this, 'Scheduler', 'this');
    const t = v.int('target', target, 0, MAX_SHARED_SLOTS);
    const out = [false];
    check(C.shmsched_scheduler_set_ceiling(ptr, t, out));
    return out[0];
  }

  /** Reseeds the starvation lottery (`seed` 0 keeps the generator), or
   * turns it off (tests and replays). */
  setLottery(seed = 0, enabled = true) {
    const ptr = ptrOf(this, 'Scheduler', 'this');
    check(C.shmsched_scheduler_set_lottery(ptr, v.u64('seed', seed), v.bool('enabled', enabled)));
  }

  /** Gauges and counters (`shared` holds the region-wide figures). */
  stats() {
    return JSON.parse(text(C.shmsched_scheduler_stats_json, ptrOf(this, 'Scheduler', 'this')));
  }

  /** Leaves the region's process table now and closes the handle. */
  detach() {
    check(C.shmsched_scheduler_detach(forget(this, 'Scheduler', 'this')));
  }
}

// ---- Limiter -------------------------------------------------------------

function rateArgs(what, tps, options) {
  const rate = v.int('tokensPerSecond', tps, 1, MAX_I32);
  const o = v.options(what, options, ['capacity']);
  return [rate, o.capacity === undefined ? null : v.int('capacity', o.capacity, 1, MAX_I32)];
}

/** A byte-rate budget (a token bucket) shared by every process bound to
 * the region. */
export class Limiter extends Handle {
  constructor(ptr) {
    super('Limiter', ptr, C.shmsched_limiter_close);
  }

  /** Binds the limiter in `region`: `tokensPerSecond` (1..=2147483647)
   * and a bucket of `capacity` tokens (default: one second of rate). */
  static shared(region, tokensPerSecond, options = undefined) {
    const r = ptrOf(region, 'Region', 'region');
    const [rate, cap] = rateArgs('Limiter.shared', tokensPerSecond, options);
    return new Limiter(cap === null
      ? make(C.shmsched_limiter_shared, r, rate)
      : make(C.shmsched_limiter_shared_with_capacity, r, rate, cap));
  }

  /** Joins the limiter in `region`, whatever its rate. */
  static attach(region) {
    return new Limiter(make(C.shmsched_limiter_attach, ptrOf(region, 'Region', 'region')));
  }

  /** A child limiter: a bucket of its own in this process on top of this
   * one; a consume through it is charged on every level. */
  child(tokensPerSecond, options = undefined) {
    const p = ptrOf(this, 'Limiter', 'this');
    const [rate, cap] = rateArgs('Limiter.child', tokensPerSecond, options);
    return new Limiter(cap === null
      ? make(C.shmsched_limiter_child, p, rate)
      : make(C.shmsched_limiter_child_with_capacity, p, rate, cap));
  }

  /** Resolves `{immediate, forced}` once `n` tokens (0..=2147483647) are
   * charged at `priority`. Rejects with TimeoutError after `timeout`
   * seconds, with AbortError when `signal` aborts (nothing charged, no
   * waiter left). Never blocks the event loop. */
  consume(n, priority = 'normal', options = undefined) {
    try {
      const ptr = ptrOf(this, 'Limiter', 'this');
      const tokens = v.int('n', n, 0, MAX_I32);
      const p = v.priority(priority);
      const o = v.options('consume', options, WAIT_OPTIONS);
      const timeout = v.timeoutNs(o.timeout);
      const signal = v.signal(o.signal);
      if (signal?.aborted) throw abortedError(signal);
      // At the caller's priority, so the stats count it there.
      const st = C.shmsched_limiter_try_consume_at(ptr, tokens, p);
      if (st === 0) return Promise.resolve({ immediate: true, forced: false });
      if (st !== WOULD_BLOCK) throw lastError(st);
      enter(this);
      return waitConsume(ptr, tokens, p, timeout, signal, (g) => {
        leave(this);
        return g;
      }, () => leave(this));
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** Blocks the calling thread until charged (scripts, worker threads). */
  consumeSync(n, priority = 'normal', options = undefined) {
    const ptr = ptrOf(this, 'Limiter', 'this');
    const tokens = v.int('n', n, 0, MAX_I32);
    const p = v.priority(priority);
    const timeout = v.timeoutNs(v.options('consumeSync', options, ['timeout']).timeout);
    const out = {};
    check(timeout === FOREVER
      ? C.shmsched_limiter_consume(ptr, tokens, p, out)
      : C.shmsched_limiter_consume_timeout(ptr, tokens, p, timeout, out));
    return { immediate: out.immediate, forced: out.forced };
  }

  /** Consumes `n` only if every level holds it now and nobody waits; true
   * if it did. Counted at normal in the stats (see `tryConsumeAt`). */
  tryConsume(n) {
    const ptr = ptrOf(this, 'Limiter', 'this');
    const st = C.shmsched_limiter_try_consume(ptr, v.int('n', n, 0, MAX_I32));
    if (st === WOULD_BLOCK) return false;
    check(st);
    return true;
  }

  /** `tryConsume`, counted at `priority` in the stats' `consumed` (the
   * rule is the same: it refuses while anything waits at any priority). */
  tryConsumeAt(n, priority) {
    const ptr = ptrOf(this, 'Limiter', 'this');
    const tokens = v.int('n', n, 0, MAX_I32);
    const st = C.shmsched_limiter_try_consume_at(ptr, tokens, v.priority(priority));
    if (st === WOULD_BLOCK) return false;
    check(st);
    return true;
  }

  /** The balance now (negative while in debt). */
  get tokens() {
    return Number(get(C.shmsched_limiter_tokens, ptrOf(this, 'Limiter', 'this')));
  }

  /** The rate in force. */
  get tokensPerSecond() {
    return get(C.shmsched_limiter_tokens_per_second, ptrOf(this, 'Limiter', 'this'));
  }

  /** The capacity (burst) in force. */
  get capacity() {
    return get(C.shmsched_limiter_capacity, ptrOf(this, 'Limiter', 'this'));
  }

  /** Changes this level's rate from now on (for every process, on a
   * shared limiter); tokens already refilled are kept. */
  setRate(tokensPerSecond) {
    const ptr = ptrOf(this, 'Limiter', 'this');
    check(C.shmsched_limiter_set_rate(ptr, v.int('tokensPerSecond', tokensPerSecond, 1, MAX_I32)));
  }

  /** Changes this level's capacity (burst) from now on. */
  setCapacity(capacity) {
    const ptr = ptrOf(this, 'Limiter', 'this');
    check(C.shmsched_limiter_set_capacity(ptr, v.int('capacity', capacity, 1, MAX_I32)));
  }

  /** Frees the process-table entries of dead processes; returns how many. */
  reap() {
    return get(C.shmsched_limiter_reap, ptrOf(this, 'Limiter', 'this'));
  }

  /** Gauges and counters (`shared` holds the region-wide figures). */
  stats() {
    return JSON.parse(text(C.shmsched_limiter_stats_json, ptrOf(this, 'Limiter', 'this')));
  }

  /** Leaves the region's process table now and closes the handle. */
  detach() {
    check(C.shmsched_limiter_detach(forget(this, 'Limiter', 'this')));
  }
}

// ---- FairShare -----------------------------------------------------------

function nowArg(nowMs) {
  return nowMs === undefined ? undefined : v.u64('nowMs', nowMs);
}

/** A fair-share ceiling split between weighted tenants, shared through a
 * region. `nowMs` is explicit (a trace replays), or the shared clock when
 * omitted. */
export class FairShare extends Handle {
  constructor(ptr) {
    super('FairShare', ptr, C.shmsched_fair_close);
  }

  /** Binds the ledger in `region` with `config` (an object, or its JSON
   * text): `ceiling`, `fairness_unit`, `tenants`, `reclaim_horizon_ms`,
   * `idle_after_ms`, `started_at_ms`. `leaseCapacity` 1..=1048576 (4096). */
  static shared(region, config, options = undefined) {
    const r = ptrOf(region, 'Region', 'region');
    let json;
    if (typeof config === 'string') {
      json = v.string('config', config);
    } else if (config !== null && typeof config === 'object' && !Array.isArray(config)) {
      try {
        json = JSON.stringify(config);
      } catch (e) {
        throw new ShmschedTypeError(`config cannot be written as JSON: ${e.message}`);
      }
      v.string('config', json);
    } else {
      throw new ShmschedTypeError(`config must be an object or a JSON string, got ${v.describe(config)}`);
    }
    const o = v.options('FairShare.shared', options, ['leaseCapacity']);
    const cap = o.leaseCapacity === undefined ? 0 : v.int('leaseCapacity', o.leaseCapacity, 1, MAX_LEASE_CAPACITY);
    return new FairShare(make(C.shmsched_fair_shared, r, json, cap));
  }

  /** Joins the ledger in `region`, whatever its configuration. */
  static attach(region) {
    return new FairShare(make(C.shmsched_fair_attach, ptrOf(region, 'Region', 'region')));
  }

  /** The clock the calls without `nowMs` read (CLOCK_MONOTONIC, ms). */
  static monotonicMs() {
    return Number(C.shmsched_monotonic_ms());
  }

  /** `{granted: true, id, deadlineMs}` or `{granted: false, reason,
   * retryAfterMs, explanation}`. */
  acquire(tenant, cost, holdMs, nowMs = undefined) {
    const ptr = ptrOf(this, 'FairShare', 'this');
    const t = v.string('tenant', tenant);
    const c = v.finite('cost', cost);
    const hold = v.u64('holdMs', holdMs);
    const now = nowArg(nowMs);
    const out = {};
    const why = Buffer.alloc(4096);
    check(now === undefined
      ? C.shmsched_fair_acquire_now(ptr, t, c, hold, out, why, why.length)
      : C.shmsched_fair_acquire(ptr, t, c, hold, now, out, why, why.length));
    if (out.granted) return { granted: true, id: out.lease_id, deadlineMs: Number(out.deadline_ms) };
    const end = why.indexOf(0);
    return {
      granted: false,
      reason: C.shmsched_refusal_reason_name(out.reason),
      retryAfterMs: Number(out.retry_after_ms) < 0 ? null : Number(out.retry_after_ms),
      explanation: why.toString('utf8', 0, end < 0 ? why.length : end),
    };
  }

  /** Releases a lease (the object `acquire` returned, or its id). */
  release(lease, nowMs = undefined) {
    const ptr = ptrOf(this, 'FairShare', 'this');
    let id = lease;
    if (lease !== null && typeof lease === 'object' && !Array.isArray(lease)) id = lease.id;
    if (typeof id !== 'string') {
      throw new ShmschedTypeError(`lease must be a lease id (a string) or a granted lease, got ${v.describe(lease)}`);
    }
    v.string('lease id', id);
    const now = nowArg(nowMs);
    check(now === undefined
      ? C.shmsched_fair_release_now(ptr, id)
      : C.shmsched_fair_release(ptr, id, now));
  }

  /** The ledger's stats at `nowMs` (or now). */
  stats(nowMs = undefined) {
    const ptr = ptrOf(this, 'FairShare', 'this');
    const now = nowArg(nowMs);
    return JSON.parse(now === undefined
      ? text(C.shmsched_fair_stats_json_now, ptr)
      : text(C.shmsched_fair_stats_json, ptr, now));
  }

  /** Releases the leases of dead processes now: `{processes, leases}`. */
  reap() {
    const [processes, leases] = get2(C.shmsched_fair_reap, ptrOf(this, 'FairShare', 'this'));
    return { processes, leases };
  }
}
