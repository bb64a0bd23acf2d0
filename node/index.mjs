// shmsched for Node.js: one concurrency budget, one byte-rate budget and one
// fair-share ceiling shared by many processes (in any language) through a
// memory-mapped region.
//
// A binding of libshmsched.so (the C ABI built from ffi/) through koffi:
//
//   import { Region, Scheduler } from 'shmsched';
//   const region = Region.openOrCreate('pool');          // /dev/shm/shmsched.pool
//   const sched = Scheduler.shared(region, 8, { low: 2 });
//   const permit = await sched.acquire('high');           // never blocks the event loop
//   try { /* ... */ } finally { permit.release(); }
//
// Waiting never blocks the event loop: an acquire (or consume) that cannot
// go at once waits on a thread of the library, as a real waiter in the
// region (so priorities hold across processes and languages), and settles
// the promise from there. Errors are ShmschedError with the library's
// status and message.
//
// The library is found through SHMSCHED_LIB (a path to libshmsched.so),
// else target/release then target/debug of the source tree this package
// sits in, else the system's library path.

import koffi from 'koffi';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The C ABI version this binding was written for. */
export const ABI_VERSION = 1;

/** Priority names and their values, lowest first. */
export const PRIORITIES = Object.freeze({
  lowest: -3,
  lower: -2,
  low: -1,
  normal: 0,
  high: 1,
  higher: 2,
  highest: 3,
});

const UNLIMITED = 0xffffffff;
const CAP_UNSET = 0xffffffff;
const FOREVER = 0xffffffffffffffffn;
const OK = 0;
const WOULD_BLOCK = 15;
const BUFFER_TOO_SMALL = 19;

/** Status names by code (SHMSCHED_STATUS_*). */
export const STATUS = Object.freeze([
  'OK', 'NULL_ARGUMENT', 'INVALID_ARGUMENT', 'INVALID_PRIORITY', 'NOT_FOUND',
  'ALREADY_EXISTS', 'IO', 'BAD_REGION', 'VERSION_MISMATCH', 'WRONG_KIND',
  'MISMATCH', 'PROCESS_TABLE_FULL', 'ZERO_CONCURRENCY', 'DISPOSED', 'TIMEOUT',
  'WOULD_BLOCK', 'FORKED', 'ALREADY_RELEASED', 'FOREIGN_PERMIT',
  'BUFFER_TOO_SMALL', 'UNKNOWN_TENANT', 'UNKNOWN_LEASE', 'TIME_WENT_BACKWARDS',
  'CAPACITY_EXHAUSTED', 'INTERNAL',
]);

/** A failed call: `status` is the C status code, `code` its name, and the
 * message is the library's (the same text a Rust caller sees). */
export class ShmschedError extends Error {
  constructor(status, message) {
    super(message);
    this.name = 'ShmschedError';
    this.status = status;
    this.code = STATUS[status] ?? `STATUS_${status}`;
  }
}

function findLibrary() {
  if (process.env.SHMSCHED_LIB) return process.env.SHMSCHED_LIB;
  const root = join(dirname(fileURLToPath(import.meta.url)), '..');
  for (const profile of ['release', 'debug']) {
    const p = join(root, 'target', profile, 'libshmsched.so');
    if (existsSync(p)) return p;
  }
  return 'libshmsched.so';
}

/** The path of the loaded library. */
export const LIBRARY_PATH = findLibrary();
const lib = koffi.load(LIBRARY_PATH);

koffi.opaque('shmsched_region');
koffi.opaque('shmsched_scheduler');
koffi.opaque('shmsched_limiter');
koffi.opaque('shmsched_fair');
const Permit_t = koffi.struct('shmsched_permit', { process: 'uint64_t', serial: 'uint64_t' });
koffi.struct('shmsched_concurrency', { max: 'uint32_t', caps: koffi.array('uint32_t', 7, 'Array') });
koffi.struct('shmsched_grant', { immediate: 'bool', forced: 'bool' });
koffi.struct('shmsched_region_info', {
  size: 'uint32_t', kind: 'uint32_t', layout_version: 'uint32_t', process_slots: 'uint32_t',
  total_size: 'uint64_t', created_at_unix_ms: 'uint64_t', created_pid: 'int32_t', reserved: 'uint32_t',
});
koffi.struct('shmsched_fair_outcome', {
  granted: 'bool', reason: 'uint32_t', retry_after_ms: 'int64_t', deadline_ms: 'uint64_t',
  lease_id: koffi.array('char', 64, 'String'),
});
const AcquireCallback = koffi.proto(
  'void shmsched_acquire_callback(void *ctx, uint32_t status, shmsched_permit permit, const char *message)');
const ConsumeCallback = koffi.proto(
  'void shmsched_consume_callback(void *ctx, uint32_t status, shmsched_grant grant, const char *message)');

const C = {};
for (const decl of [
  'uint32_t shmsched_abi_version()',
  'uint64_t shmsched_monotonic_ms()',
  'size_t shmsched_last_error_message(_Out_ uint8_t *buf, size_t len)',
  'uint32_t shmsched_debug_panic()',
  'uint32_t shmsched_region_create(const char *name, uint32_t mode, uint32_t slots, _Out_ shmsched_region **out)',
  'uint32_t shmsched_region_open(const char *name, _Out_ shmsched_region **out)',
  'uint32_t shmsched_region_open_or_create(const char *name, uint32_t mode, uint32_t slots, _Out_ shmsched_region **out)',
  'uint32_t shmsched_region_anonymous(uint32_t slots, _Out_ shmsched_region **out)',
  'uint32_t shmsched_region_open_fd(int32_t fd, _Out_ shmsched_region **out)',
  'uint32_t shmsched_region_dup_fd(shmsched_region *region, _Out_ int32_t *fd)',
  'uint32_t shmsched_region_remove(const char *name)',
  'uint32_t shmsched_region_get_info(shmsched_region *region, _Inout_ shmsched_region_info *out)',
  'void shmsched_region_close(shmsched_region *region)',
  'uint32_t shmsched_scheduler_shared_with(shmsched_region *region, shmsched_concurrency *c, _Out_ shmsched_scheduler **out)',
  'uint32_t shmsched_scheduler_attach(shmsched_region *region, _Out_ shmsched_scheduler **out)',
  'uint32_t shmsched_scheduler_child_with(shmsched_scheduler *parent, shmsched_concurrency *c, _Out_ shmsched_scheduler **out)',
  'uint32_t shmsched_scheduler_acquire(shmsched_scheduler *s, int32_t priority, _Out_ shmsched_permit *out)',
  'uint32_t shmsched_scheduler_acquire_timeout(shmsched_scheduler *s, int32_t priority, uint64_t ns, _Out_ shmsched_permit *out)',
  'uint32_t shmsched_scheduler_try_acquire(shmsched_scheduler *s, int32_t priority, _Out_ shmsched_permit *out)',
  'uint32_t shmsched_scheduler_acquire_async(shmsched_scheduler *s, int32_t priority, uint64_t ns, shmsched_acquire_callback *cb, void *ctx)',
  'uint32_t shmsched_permit_release(shmsched_permit permit)',
  'uint32_t shmsched_scheduler_dispose(shmsched_scheduler *s)',
  'uint32_t shmsched_scheduler_is_disposed(shmsched_scheduler *s, _Out_ bool *out)',
  'uint32_t shmsched_scheduler_reap(shmsched_scheduler *s, _Out_ uint32_t *procs, _Out_ uint64_t *slots)',
  'uint32_t shmsched_scheduler_global_running(shmsched_scheduler *s, _Out_ uint32_t *out)',
  'uint32_t shmsched_scheduler_concurrency(shmsched_scheduler *s, _Out_ uint32_t *out)',
  'uint32_t shmsched_scheduler_set_lottery(shmsched_scheduler *s, uint64_t seed, bool enabled)',
  'uint32_t shmsched_scheduler_stats_json(shmsched_scheduler *s, _Out_ uint8_t *buf, size_t len, _Out_ size_t *out_len)',
  'uint32_t shmsched_scheduler_detach(shmsched_scheduler *s)',
  'void shmsched_scheduler_close(shmsched_scheduler *s)',
  'uint32_t shmsched_limiter_shared(shmsched_region *region, uint64_t tps, _Out_ shmsched_limiter **out)',
  'uint32_t shmsched_limiter_attach(shmsched_region *region, _Out_ shmsched_limiter **out)',
  'uint32_t shmsched_limiter_child(shmsched_limiter *parent, uint64_t tps, _Out_ shmsched_limiter **out)',
  'uint32_t shmsched_limiter_consume(shmsched_limiter *l, uint64_t n, int32_t priority, _Out_ shmsched_grant *out)',
  'uint32_t shmsched_limiter_consume_async(shmsched_limiter *l, uint64_t n, int32_t priority, uint64_t ns, shmsched_consume_callback *cb, void *ctx)',
  'uint32_t shmsched_limiter_try_consume(shmsched_limiter *l, uint64_t n)',
  'uint32_t shmsched_limiter_tokens(shmsched_limiter *l, _Out_ int64_t *out)',
  'uint32_t shmsched_limiter_tokens_per_second(shmsched_limiter *l, _Out_ uint32_t *out)',
  'uint32_t shmsched_limiter_reap(shmsched_limiter *l, _Out_ uint32_t *out)',
  'uint32_t shmsched_limiter_stats_json(shmsched_limiter *l, _Out_ uint8_t *buf, size_t len, _Out_ size_t *out_len)',
  'void shmsched_limiter_close(shmsched_limiter *l)',
  'uint32_t shmsched_fair_shared(shmsched_region *region, const char *config, uint32_t capacity, _Out_ shmsched_fair **out)',
  'uint32_t shmsched_fair_attach(shmsched_region *region, _Out_ shmsched_fair **out)',
  'uint32_t shmsched_fair_acquire(shmsched_fair *f, const char *tenant, double cost, uint64_t hold, uint64_t now, _Out_ shmsched_fair_outcome *out, _Out_ uint8_t *why, size_t why_len)',
  'uint32_t shmsched_fair_acquire_now(shmsched_fair *f, const char *tenant, double cost, uint64_t hold, _Out_ shmsched_fair_outcome *out, _Out_ uint8_t *why, size_t why_len)',
  'uint32_t shmsched_fair_release(shmsched_fair *f, const char *lease, uint64_t now)',
  'uint32_t shmsched_fair_release_now(shmsched_fair *f, const char *lease)',
  'uint32_t shmsched_fair_stats_json(shmsched_fair *f, uint64_t now, _Out_ uint8_t *buf, size_t len, _Out_ size_t *out_len)',
  'uint32_t shmsched_fair_stats_json_now(shmsched_fair *f, _Out_ uint8_t *buf, size_t len, _Out_ size_t *out_len)',
  'void shmsched_fair_close(shmsched_fair *f)',
  'const char *shmsched_refusal_reason_name(uint32_t reason)',
]) {
  const fn = lib.func(decl);
  const name = decl.match(/(shmsched_\w+)\(/)[1];
  C[name] = fn;
}

if (C.shmsched_abi_version() !== ABI_VERSION) {
  throw new Error(`${LIBRARY_PATH} has C ABI version ${C.shmsched_abi_version()}, `
    + `and this binding speaks version ${ABI_VERSION}`);
}

function lastError(status) {
  const n = Number(C.shmsched_last_error_message(null, 0));
  const buf = Buffer.alloc(n + 1);
  C.shmsched_last_error_message(buf, buf.length);
  return new ShmschedError(status, buf.toString('utf8', 0, n));
}

function check(status) {
  if (status !== OK) throw lastError(status);
}

function text(fn, ...args) {
  let size = 4096;
  for (;;) {
    const buf = Buffer.alloc(size);
    const need = [0];
    const st = fn(...args, buf, size, need);
    if (st === BUFFER_TOO_SMALL) {
      size = Number(need[0]) + 1;
      continue;
    }
    check(st);
    return buf.toString('utf8', 0, Number(need[0]));
  }
}

/** A priority as its integer value: a name (case-insensitive) or an integer
 * -3..3 (other integers are left for the library to refuse). */
export function priorityValue(priority) {
  if (Number.isInteger(priority)) return priority;
  if (typeof priority === 'string') {
    const v = PRIORITIES[priority.trim().toLowerCase()];
    if (v !== undefined) return v;
    if (/^\s*-?\d+\s*$/.test(priority)) return Number(priority);
  }
  throw new ShmschedError(3, `priority ${JSON.stringify(priority)} is not a priority: expected `
    + 'lowest, lower, low, normal, high, higher, highest or -3..=3');
}

function nanos(seconds) {
  if (seconds === undefined || seconds === null) return FOREVER;
  if (!(seconds >= 0)) throw new ShmschedError(2, `timeout ${seconds} s is not a non-negative number`);
  return BigInt(Math.min(Math.round(seconds * 1e9), Number.MAX_SAFE_INTEGER));
}

// A ref'ed timer keeps the process alive while a wait is pending on a
// library thread (nothing else in the event loop may be waiting).
let pending = 0;
let keepAlive = null;
function waitStarted() {
  if (pending++ === 0) keepAlive = setInterval(() => {}, 1 << 30);
}
function waitEnded() {
  if (--pending === 0) {
    clearInterval(keepAlive);
    keepAlive = null;
  }
}

class Handle {
  #ptr;
  #close;
  constructor(ptr, close) {
    this.#ptr = ptr;
    this.#close = close;
  }
  get handle() {
    if (this.#ptr === null) throw new ShmschedError(1, `this ${this.constructor.name} is closed`);
    return this.#ptr;
  }
  /** Closes the handle (idempotent). */
  close() {
    if (this.#ptr !== null) {
      this.#close(this.#ptr);
      this.#ptr = null;
    }
  }
  /** Gives the pointer up without closing it (the C call closed it). */
  forget() {
    const p = this.handle;
    this.#ptr = null;
    return p;
  }
}

function make(fn, ...args) {
  const out = [null];
  check(fn(...args, out));
  return out[0];
}

/** A shared region (a named file, or an anonymous memfd) holding one object. */
export class Region extends Handle {
  constructor(ptr) {
    super(ptr, C.shmsched_region_close);
  }
  /** Creates a new region file (a name maps to /dev/shm/shmsched.<name>). */
  static create(name, { mode = 0o600, processSlots = 128 } = {}) {
    return new Region(make(C.shmsched_region_create, name, mode, processSlots));
  }
  /** Opens an existing region file. */
  static open(name) {
    return new Region(make(C.shmsched_region_open, name));
  }
  /** Opens the region file, creating it if missing (race-free). */
  static openOrCreate(name, { mode = 0o600, processSlots = 128 } = {}) {
    return new Region(make(C.shmsched_region_open_or_create, name, mode, processSlots));
  }
  /** An anonymous region (memfd); pass dupFd() to child processes. */
  static anonymous({ processSlots = 128 } = {}) {
    return new Region(make(C.shmsched_region_anonymous, processSlots));
  }
  /** Opens the region behind a descriptor (the caller keeps `fd`). */
  static openFd(fd) {
    return new Region(make(C.shmsched_region_open_fd, fd));
  }
  /** Removes a named region's file. */
  static remove(name) {
    check(C.shmsched_region_remove(name));
  }
  /** A new inheritable descriptor of an anonymous region, owned by the
   * caller (pass it in `stdio` of child_process.spawn; close it after). */
  dupFd() {
    const fd = [-1];
    check(C.shmsched_region_dup_fd(this.handle, fd));
    return fd[0];
  }
  /** The region's header (`kind` is null before an object was created). */
  info() {
    const i = { size: koffi.sizeof('shmsched_region_info'), kind: 0, layout_version: 0, process_slots: 0, total_size: 0,
      created_at_unix_ms: 0, created_pid: 0, reserved: 0 };
    check(C.shmsched_region_get_info(this.handle, i));
    const kinds = [null, 'scheduler', 'limiter', 'fair-share'];
    return {
      kind: kinds[i.kind] ?? i.kind,
      layoutVersion: i.layout_version,
      processSlots: i.process_slots,
      totalSize: Number(i.total_size),
      createdPid: i.created_pid,
    };
  }
}

function concurrency(max, caps) {
  const c = { max: max === null || max === undefined ? UNLIMITED : max, caps: new Array(7).fill(CAP_UNSET) };
  for (const [name, cap] of Object.entries(caps ?? {})) {
    const v = priorityValue(name);
    if (!(v >= -3 && v <= 3)) throw new ShmschedError(3, `priority ${name} is out of range: expected -3..=3`);
    c.caps[v + 3] = cap === null ? CAP_UNSET : cap;
  }
  return c;
}

/** The right to run one task; release it exactly once. */
export class Permit {
  #token;
  #released = false;
  constructor(token, priority) {
    this.#token = { process: token.process, serial: token.serial };
    this.priority = priority;
    Object.freeze(this.#token);
  }
  /** The C token. */
  get token() {
    return this.#token;
  }
  /** True once released. */
  get released() {
    return this.#released;
  }
  /** Gives the slot back; a second release throws ALREADY_RELEASED. */
  release() {
    check(C.shmsched_permit_release(this.#token));
    this.#released = true;
  }
}

/** A concurrency budget shared by every process bound to the region. */
export class Scheduler extends Handle {
  #waits = 0;
  #closing = false;
  constructor(ptr) {
    super(ptr, C.shmsched_scheduler_close);
  }
  /** Binds the scheduler in `region` with a global `max`; `caps` maps
   * priority names to per-priority caps for this handle's tasks. */
  static shared(region, max, caps = {}) {
    return new Scheduler(make(C.shmsched_scheduler_shared_with, region.handle, concurrency(max, caps)));
  }
  /** Joins the scheduler in `region`, whatever its max. */
  static attach(region) {
    return new Scheduler(make(C.shmsched_scheduler_attach, region.handle));
  }
  /** A child scheduler: a local cap on top of this one. */
  child(max = null, caps = {}) {
    return new Scheduler(make(C.shmsched_scheduler_child_with, this.handle, concurrency(max, caps)));
  }
  /** Resolves a Permit once a slot is free at `priority`; rejects with
   * TIMEOUT after `timeout` seconds. Never blocks the event loop. */
  acquire(priority = 'normal', { timeout } = {}) {
    const p = priorityValue(priority);
    const out = {};
    const st = C.shmsched_scheduler_try_acquire(this.handle, p, out);
    if (st === OK) return Promise.resolve(new Permit(out, priority));
    if (st !== WOULD_BLOCK) return Promise.reject(lastError(st));
    return new Promise((resolve, reject) => {
      const cb = koffi.register((ctx, status, permit, message) => {
        koffi.unregister(cb);
        this.#waitEnded();
        if (status === OK) resolve(new Permit(permit, priority));
        else reject(new ShmschedError(status, message));
      }, koffi.pointer(AcquireCallback));
      const started = C.shmsched_scheduler_acquire_async(this.handle, p, nanos(timeout), cb, null);
      if (started !== OK) {
        koffi.unregister(cb);
        reject(lastError(started));
        return;
      }
      this.#waits++;
      waitStarted();
    });
  }
  /** Blocks the calling thread until a slot is free (for scripts). */
  acquireSync(priority = 'normal', { timeout } = {}) {
    const p = priorityValue(priority);
    const out = {};
    const st = timeout === undefined
      ? C.shmsched_scheduler_acquire(this.handle, p, out)
      : C.shmsched_scheduler_acquire_timeout(this.handle, p, nanos(timeout), out);
    check(st);
    return new Permit(out, priority);
  }
  /** A Permit if a slot is free now, else null. */
  tryAcquire(priority = 'normal') {
    const out = {};
    const st = C.shmsched_scheduler_try_acquire(this.handle, priorityValue(priority), out);
    if (st === WOULD_BLOCK) return null;
    check(st);
    return new Permit(out, priority);
  }
  /** Acquires, awaits `fn()`, releases. */
  async run(fn, priority = 'normal') {
    const permit = await this.acquire(priority);
    try {
      return await fn();
    } finally {
      permit.release();
    }
  }
  /** Disposes this handle: waiters reject with DISPOSED. */
  dispose() {
    check(C.shmsched_scheduler_dispose(this.handle));
  }
  get disposed() {
    const out = [false];
    check(C.shmsched_scheduler_is_disposed(this.handle, out));
    return out[0];
  }
  /** Gives back the slots of dead processes: { processes, slots }. */
  reap() {
    const procs = [0];
    const slots = [0];
    check(C.shmsched_scheduler_reap(this.handle, procs, slots));
    return { processes: procs[0], slots: Number(slots[0]) };
  }
  /** Slots held now across every process. */
  get globalRunning() {
    const out = [0];
    check(C.shmsched_scheduler_global_running(this.handle, out));
    return out[0];
  }
  /** This level's max, null when unlimited. */
  get concurrency() {
    const out = [0];
    check(C.shmsched_scheduler_concurrency(this.handle, out));
    return out[0] === UNLIMITED ? null : out[0];
  }
  /** Reseeds the starvation lottery, or turns it off (tests). */
  setLottery(seed = 0, enabled = true) {
    check(C.shmsched_scheduler_set_lottery(this.handle, seed, enabled));
  }
  /** Gauges and counters (`shared` holds the region-wide figures). */
  stats() {
    return JSON.parse(text(C.shmsched_scheduler_stats_json, this.handle));
  }
  /** Leaves the region's process table now and closes the handle. */
  detach() {
    check(C.shmsched_scheduler_detach(this.forget()));
  }
  /** Closes the handle; with waits pending, once the last one settles. */
  close() {
    if (this.#waits > 0) this.#closing = true;
    else super.close();
  }
  #waitEnded() {
    waitEnded();
    if (--this.#waits === 0 && this.#closing) super.close();
  }
}

/** A byte-rate budget (token bucket) shared by every process bound to the
 * region. */
export class Limiter extends Handle {
  #waits = 0;
  #closing = false;
  constructor(ptr) {
    super(ptr, C.shmsched_limiter_close);
  }
  static shared(region, tokensPerSecond) {
    return new Limiter(make(C.shmsched_limiter_shared, region.handle, tokensPerSecond));
  }
  static attach(region) {
    return new Limiter(make(C.shmsched_limiter_attach, region.handle));
  }
  child(tokensPerSecond) {
    return new Limiter(make(C.shmsched_limiter_child, this.handle, tokensPerSecond));
  }
  /** Resolves { immediate, forced } once `n` tokens are charged. Never
   * blocks the event loop. */
  consume(n, priority = 'normal', { timeout } = {}) {
    const p = priorityValue(priority);
    const st = C.shmsched_limiter_try_consume(this.handle, n);
    if (st === OK) return Promise.resolve({ immediate: true, forced: false });
    if (st !== WOULD_BLOCK) return Promise.reject(lastError(st));
    return new Promise((resolve, reject) => {
      const cb = koffi.register((ctx, status, grant, message) => {
        koffi.unregister(cb);
        this.#waitEnded();
        if (status === OK) resolve({ immediate: grant.immediate, forced: grant.forced });
        else reject(new ShmschedError(status, message));
      }, koffi.pointer(ConsumeCallback));
      const started = C.shmsched_limiter_consume_async(this.handle, n, p, nanos(timeout), cb, null);
      if (started !== OK) {
        koffi.unregister(cb);
        reject(lastError(started));
        return;
      }
      this.#waits++;
      waitStarted();
    });
  }
  /** Blocks the calling thread until charged (for scripts). */
  consumeSync(n, priority = 'normal') {
    const out = {};
    check(C.shmsched_limiter_consume(this.handle, n, priorityValue(priority), out));
    return out;
  }
  /** Consumes `n` only if available now; true if it did. */
  tryConsume(n) {
    const st = C.shmsched_limiter_try_consume(this.handle, n);
    if (st === WOULD_BLOCK) return false;
    check(st);
    return true;
  }
  get tokens() {
    const out = [0];
    check(C.shmsched_limiter_tokens(this.handle, out));
    return Number(out[0]);
  }
  get tokensPerSecond() {
    const out = [0];
    check(C.shmsched_limiter_tokens_per_second(this.handle, out));
    return out[0];
  }
  reap() {
    const out = [0];
    check(C.shmsched_limiter_reap(this.handle, out));
    return out[0];
  }
  stats() {
    return JSON.parse(text(C.shmsched_limiter_stats_json, this.handle));
  }
  close() {
    if (this.#waits > 0) this.#closing = true;
    else super.close();
  }
  #waitEnded() {
    waitEnded();
    if (--this.#waits === 0 && this.#closing) super.close();
  }
}

/** A fair-share ceiling split between weighted tenants, shared through a
 * region. `nowMs` is explicit (a trace replays), or the shared clock when
 * omitted. */
export class FairShare extends Handle {
  constructor(ptr) {
    super(ptr, C.shmsched_fair_close);
  }
  static shared(region, config, { leaseCapacity = 0 } = {}) {
    const json = typeof config === 'string' ? config : JSON.stringify(config);
    return new FairShare(make(C.shmsched_fair_shared, region.handle, json, leaseCapacity));
  }
  static attach(region) {
    return new FairShare(make(C.shmsched_fair_attach, region.handle));
  }
  /** The clock the calls without `nowMs` read (CLOCK_MONOTONIC ms). */
  static monotonicMs() {
    return Number(C.shmsched_monotonic_ms());
  }
  /** { granted: true, id, deadlineMs } or { granted: false, reason,
   * retryAfterMs, explanation }. */
  acquire(tenant, cost, holdMs, nowMs) {
    const out = {};
    const why = Buffer.alloc(4096);
    const st = nowMs === undefined
      ? C.shmsched_fair_acquire_now(this.handle, tenant, cost, holdMs, out, why, why.length)
      : C.shmsched_fair_acquire(this.handle, tenant, cost, holdMs, nowMs, out, why, why.length);
    check(st);
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
  release(lease, nowMs) {
    const id = typeof lease === 'string' ? lease : lease.id;
    check(nowMs === undefined
      ? C.shmsched_fair_release_now(this.handle, id)
      : C.shmsched_fair_release(this.handle, id, nowMs));
  }
  stats(nowMs) {
    return JSON.parse(nowMs === undefined
      ? text(C.shmsched_fair_stats_json_now, this.handle)
      : text(C.shmsched_fair_stats_json, this.handle, nowMs));
  }
}

/** For tests: the library panics; the boundary turns it into an error. */
export function debugPanic() {
  check(C.shmsched_debug_panic());
}
