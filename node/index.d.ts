// Type declarations of the shmsched package (index.mjs).

/** A priority name, any case (`'HIGH'` is `'high'`). */
export type PriorityName = 'lowest' | 'lower' | 'low' | 'normal' | 'high' | 'higher' | 'highest';
/** A priority: a name, or an integer -3..=3 (a number, a bigint, or a
 * string of digits). Anything else is rejected (RangeError or TypeError,
 * both InvalidPriorityError). */
export type Priority = PriorityName | Uppercase<PriorityName> | Capitalize<PriorityName>
  | -3 | -2 | -1 | 0 | 1 | 2 | 3 | bigint | string;
/** An integer given as a number or a bigint. */
export type Integer = number | bigint;

/** The C ABI version this binding speaks. */
export const ABI_VERSION: number;
/** The region layout version of the loaded library. */
export const LAYOUT_VERSION: number;
/** The path of the loaded libshmsched.so, as given to the loader. */
export const LIBRARY_PATH: string;
/** Priority values by name. */
export const PRIORITIES: Readonly<Record<PriorityName, -3 | -2 | -1 | 0 | 1 | 2 | 3>>;
/** Priority names by value + 3. */
export const PRIORITY_NAMES: readonly PriorityName[];
/** The largest shared scheduler max, and the largest weighted acquire. */
export const MAX_SHARED_SLOTS: 65536;
/** The largest child max or cap, rate, capacity and consume. */
export const MAX_I32: 2147483647;
/** The largest process table of a region. */
export const MAX_PROCESS_SLOTS: 4096;
/** The largest fair-share lease table. */
export const MAX_LEASE_CAPACITY: 1048576;
/** Status names by code (`SHMSCHED_STATUS_*`). */
export const STATUS: readonly StatusName[];
/** Status codes by name. */
export const STATUS_CODE: Readonly<Record<StatusName, number>>;

/** A priority as its integer value -3..=3; throws on anything else. */
export function priorityValue(priority: Priority): -3 | -2 | -1 | 0 | 1 | 2 | 3;
/** The library's one-line description of a status code. */
export function strerror(status: number): string;
/** For tests: a panic inside the library, returned as InternalError. */
export function debugPanic(): void;
/** Waits pending in this process (every handle). */
export function pendingWaits(): number;

// ---- errors ----------------------------------------------------------------

export type StatusName =
  | 'OK' | 'NULL_ARGUMENT' | 'INVALID_ARGUMENT' | 'INVALID_PRIORITY' | 'NOT_FOUND'
  | 'ALREADY_EXISTS' | 'IO' | 'BAD_REGION' | 'VERSION_MISMATCH' | 'WRONG_KIND'
  | 'MISMATCH' | 'PROCESS_TABLE_FULL' | 'ZERO_CONCURRENCY' | 'DISPOSED' | 'TIMEOUT'
  | 'WOULD_BLOCK' | 'FORKED' | 'ALREADY_RELEASED' | 'FOREIGN_PERMIT'
  | 'BUFFER_TOO_SMALL' | 'UNKNOWN_TENANT' | 'UNKNOWN_LEASE' | 'TIME_WENT_BACKWARDS'
  | 'CAPACITY_EXHAUSTED' | 'INTERNAL' | 'CANCELLED';

/** Every error of this package (also the TypeError and RangeError flavours
 * raised for bad arguments, through `Symbol.hasInstance`). */
export class ShmschedError extends Error {
  constructor(status: number | null, message: string, options?: ErrorOptions);
  /** The C status code; null for ClosedError. */
  readonly status: number | null;
  /** The status name, or `'CLOSED'`. */
  readonly code: StatusName | 'CLOSED';
}

interface StatusErrorClass<S extends number, C extends StatusName> {
  new (message: string, options?: ErrorOptions): ShmschedError & { readonly status: S; readonly code: C };
  readonly status: S;
}

export const NullArgumentError: StatusErrorClass<1, 'NULL_ARGUMENT'>;
export type NullArgumentError = InstanceType<typeof NullArgumentError>;
export const InvalidArgumentError: StatusErrorClass<2, 'INVALID_ARGUMENT'>;
export type InvalidArgumentError = InstanceType<typeof InvalidArgumentError>;
export const InvalidPriorityError: StatusErrorClass<3, 'INVALID_PRIORITY'>;
export type InvalidPriorityError = InstanceType<typeof InvalidPriorityError>;
export const NotFoundError: StatusErrorClass<4, 'NOT_FOUND'>;
export type NotFoundError = InstanceType<typeof NotFoundError>;
export const AlreadyExistsError: StatusErrorClass<5, 'ALREADY_EXISTS'>;
export type AlreadyExistsError = InstanceType<typeof AlreadyExistsError>;
export const IoError: StatusErrorClass<6, 'IO'>;
export type IoError = InstanceType<typeof IoError>;
export const BadRegionError: StatusErrorClass<7, 'BAD_REGION'>;
export type BadRegionError = InstanceType<typeof BadRegionError>;
export const VersionMismatchError: StatusErrorClass<8, 'VERSION_MISMATCH'>;
export type VersionMismatchError = InstanceType<typeof VersionMismatchError>;
export const WrongKindError: StatusErrorClass<9, 'WRONG_KIND'>;
export type WrongKindError = InstanceType<typeof WrongKindError>;
export const MismatchError: StatusErrorClass<10, 'MISMATCH'>;
export type MismatchError = InstanceType<typeof MismatchError>;
export const ProcessTableFullError: StatusErrorClass<11, 'PROCESS_TABLE_FULL'>;
export type ProcessTableFullError = InstanceType<typeof ProcessTableFullError>;
export const ZeroConcurrencyError: StatusErrorClass<12, 'ZERO_CONCURRENCY'>;
export type ZeroConcurrencyError = InstanceType<typeof ZeroConcurrencyError>;
export const DisposedError: StatusErrorClass<13, 'DISPOSED'>;
export type DisposedError = InstanceType<typeof DisposedError>;
export const TimeoutError: StatusErrorClass<14, 'TIMEOUT'>;
export type TimeoutError = InstanceType<typeof TimeoutError>;
export const WouldBlockError: StatusErrorClass<15, 'WOULD_BLOCK'>;
export type WouldBlockError = InstanceType<typeof WouldBlockError>;
export const ForkedError: StatusErrorClass<16, 'FORKED'>;
export type ForkedError = InstanceType<typeof ForkedError>;
export const AlreadyReleasedError: StatusErrorClass<17, 'ALREADY_RELEASED'>;
export type AlreadyReleasedError = InstanceType<typeof AlreadyReleasedError>;
export const ForeignPermitError: StatusErrorClass<18, 'FOREIGN_PERMIT'>;
export type ForeignPermitError = InstanceType<typeof ForeignPermitError>;
export const BufferTooSmallError: StatusErrorClass<19, 'BUFFER_TOO_SMALL'>;
export type BufferTooSmallError = InstanceType<typeof BufferTooSmallError>;
export const UnknownTenantError: StatusErrorClass<20, 'UNKNOWN_TENANT'>;
export type UnknownTenantError = InstanceType<typeof UnknownTenantError>;
export const UnknownLeaseError: StatusErrorClass<21, 'UNKNOWN_LEASE'>;
export type UnknownLeaseError = InstanceType<typeof UnknownLeaseError>;
export const TimeWentBackwardsError: StatusErrorClass<22, 'TIME_WENT_BACKWARDS'>;
export type TimeWentBackwardsError = InstanceType<typeof TimeWentBackwardsError>;
export const CapacityExhaustedError: StatusErrorClass<23, 'CAPACITY_EXHAUSTED'>;
export type CapacityExhaustedError = InstanceType<typeof CapacityExhaustedError>;
export const InternalError: StatusErrorClass<24, 'INTERNAL'>;
export type InternalError = InstanceType<typeof InternalError>;
export const CancelledError: StatusErrorClass<25, 'CANCELLED'>;
export type CancelledError = InstanceType<typeof CancelledError>;

/** A handle used after close() or detach(). */
export class ClosedError extends ShmschedError {
  constructor(message: string);
  readonly status: null;
  readonly code: 'CLOSED';
}

/** An argument of the wrong type: a TypeError, and (by `instanceof`) an
 * InvalidArgumentError or, for a priority, an InvalidPriorityError. */
export class ShmschedTypeError extends TypeError {
  constructor(message: string, status?: 2 | 3);
  readonly status: 2 | 3;
  readonly code: 'INVALID_ARGUMENT' | 'INVALID_PRIORITY';
}

/** An argument of the right type out of range (or not an accepted name):
 * a RangeError, and an InvalidArgumentError or InvalidPriorityError. */
export class ShmschedRangeError extends RangeError {
  constructor(message: string, status?: 2 | 3);
  readonly status: 2 | 3;
  readonly code: 'INVALID_ARGUMENT' | 'INVALID_PRIORITY';
}

/** The rejection of a wait whose signal aborted (`cause`: the signal's
 * reason). Nothing was taken and no waiter is left. */
export class AbortError extends Error {
  constructor(reason?: unknown);
  readonly name: 'AbortError';
  readonly code: 'ABORT_ERR';
}

// ---- handles ---------------------------------------------------------------

declare abstract class Handle {
  /** Closes the handle (idempotent); with waits pending, the library's
   * handle is freed once they settle. */
  close(): void;
  /** True once closed. */
  readonly closed: boolean;
}

export interface RegionOptions {
  /** The file's permission bits, 0o600..=0o777, never world-writable
   * (default 0o600). */
  mode?: number;
  /** Entries in the process table, 1..=4096 (default 128). */
  processSlots?: number;
}

export interface RegionInfo {
  /** The object the region holds; null before one was bound. */
  kind: 'scheduler' | 'limiter' | 'fair-share' | null | number;
  layoutVersion: number;
  processSlots: number;
  totalSize: number;
  createdAtUnixMs: number;
  createdPid: number;
}

/** A shared region (a named file or an anonymous memfd) holding one object. */
export class Region extends Handle {
  private constructor();
  /** Creates a new region file: a name maps to /dev/shm/shmsched.NAME, a
   * string with a `/` is a path. */
  static create(name: string, options?: RegionOptions): Region;
  /** Opens an existing region file. */
  static open(name: string): Region;
  /** Opens the region file, creating it if missing (race-free). */
  static openOrCreate(name: string, options?: RegionOptions): Region;
  /** An anonymous region (a memfd). */
  static anonymous(options?: Pick<RegionOptions, 'processSlots'>): Region;
  /** Opens the region behind a descriptor (the caller keeps `fd`). */
  static openFd(fd: number): Region;
  /** Removes a named region's file. */
  static remove(name: string): void;
  /** A new inheritable descriptor of an anonymous region, owned by the
   * caller. */
  dupFd(): number;
  /** The region's header. */
  info(): RegionInfo;
}

/** Caps per priority for one scheduler handle's tasks (null: unset). */
export type Caps = Partial<Record<PriorityName | string, number | bigint | null>>;

export interface WaitOptions {
  /** Seconds to wait at most (>= 0; undefined or Infinity: no limit). */
  timeout?: number;
  /** Aborting rejects the wait with AbortError, takes nothing and leaves
   * no waiter. */
  signal?: AbortSignal | null;
}

export interface SyncWaitOptions {
  /** Seconds to wait at most (>= 0; undefined or Infinity: no limit). */
  timeout?: number;
}

/** The right to run one task (or `units` of the budget); release it once. */
export class Permit {
  private constructor();
  /** The priority it was acquired at. */
  readonly priority: PriorityName;
  /** Units of the budget it holds. */
  readonly units: number;
  /** The C token, for logs. */
  readonly token: Readonly<{ process: bigint; serial: bigint }>;
  /** True once released. */
  readonly released: boolean;
  /** Gives the units back; a second call throws AlreadyReleasedError.
   * (Where the runtime has `Symbol.dispose`, a Permit also has a
   * `[Symbol.dispose]()` that releases it unless released: `using`.) */
  release(): void;
}

/** What the region knows about everyone sharing a scheduler. */
export interface SchedulerSharedStats {
  running: number;
  max: number;
  processes: number;
  waiters: number[];
  reclaimed: number;
  reaped_processes: number;
  stall_ns: number;
  [key: string]: unknown;
}

/** A scheduler's gauges and counters (the library's SchedulerStats). */
export interface SchedulerStats {
  running: number;
  concurrency: number | null;
  pending: number;
  total: QueueStats;
  queues: QueueStats[];
  stall_ns: number;
  shared: SchedulerSharedStats | null;
  [key: string]: unknown;
}

export interface QueueStats {
  count: number;
  deferred: number;
  completed: number;
  cancelled: number;
  [key: string]: unknown;
}

/** A concurrency budget shared by every process bound to the region. */
export class Scheduler extends Handle {
  private constructor();
  /** Binds the scheduler in `region` with a global `max` (0..=65536). */
  static shared(region: Region, max: Integer, caps?: Caps): Scheduler;
  /** Joins the scheduler in `region`, whatever its max. */
  static attach(region: Region): Scheduler;
  /** A child: a local cap (0..=2147483647, null for none) on top of this. */
  child(max?: Integer | null, caps?: Caps): Scheduler;
  /** A permit once a slot is free at `priority`. */
  acquire(priority?: Priority, options?: WaitOptions): Promise<Permit>;
  /** A permit for `n` units (1..=max) taken all at once. */
  acquireMany(n: Integer, priority?: Priority, options?: WaitOptions): Promise<Permit>;
  /** Blocks the thread until a slot is free. */
  acquireSync(priority?: Priority, options?: SyncWaitOptions): Permit;
  /** Blocks the thread until `n` units are free. */
  acquireManySync(n: Integer, priority?: Priority, options?: SyncWaitOptions): Permit;
  /** A permit if a slot is free now, else null. */
  tryAcquire(priority?: Priority): Permit | null;
  /** A permit for `n` units if they are free now, else null. */
  tryAcquireMany(n: Integer, priority?: Priority): Permit | null;
  /** Acquires, awaits `fn()`, releases. */
  run<T>(fn: () => T | PromiseLike<T>, priority?: Priority, options?: WaitOptions): Promise<T>;
  /** Disposes this handle and its children. */
  dispose(): void;
  readonly disposed: boolean;
  /** Gives back the slots of dead processes. */
  reap(): { processes: number; slots: number };
  /** Slots held now across every process. */
  readonly globalRunning: number;
  /** This level's max, null when unlimited. */
  readonly concurrency: number | null;
  /** The region's effective ceiling. */
  readonly ceiling: number;
  /** Moves the region's ceiling (0..=max); whether it holds now. */
  setCeiling(target: Integer): boolean;
  /** Reseeds the starvation lottery, or turns it off. */
  setLottery(seed?: Integer, enabled?: boolean): void;
  stats(): SchedulerStats;
  /** Leaves the region's process table now and closes the handle. */
  detach(): void;
}

export interface Grant {
  /** Charged at once, without queueing. */
  immediate: boolean;
  /** Left the bucket in debt (force-through, or more than the capacity). */
  forced: boolean;
}

export interface LimiterOptions {
  /** The bucket's capacity (burst), 1..=2147483647; default one second
   * of rate. */
  capacity?: number | bigint;
}

/** A byte-rate budget (token bucket) shared by every process bound to the
 * region. */
export class Limiter extends Handle {
  private constructor();
  static shared(region: Region, tokensPerSecond: Integer, options?: LimiterOptions): Limiter;
  static attach(region: Region): Limiter;
  child(tokensPerSecond: Integer, options?: LimiterOptions): Limiter;
  /** Resolves once `n` tokens (0..=2147483647) are charged. */
  consume(n: Integer, priority?: Priority, options?: WaitOptions): Promise<Grant>;
  /** Blocks the thread until charged. */
  consumeSync(n: Integer, priority?: Priority, options?: SyncWaitOptions): Grant;
  /** Consumes only if available now; whether it did. */
  tryConsume(n: Integer): boolean;
  /** `tryConsume`, counted at `priority` in the stats. */
  tryConsumeAt(n: Integer, priority: Priority): boolean;
  readonly tokens: number;
  readonly tokensPerSecond: number;
  readonly capacity: number;
  setRate(tokensPerSecond: Integer): void;
  setCapacity(capacity: Integer): void;
  reap(): number;
  stats(): Record<string, unknown>;
  detach(): void;
}

export interface FairConfig {
  ceiling: number;
  fairness_unit: 'cost' | 'requests';
  tenants: { id: string; weight: number }[];
  reclaim_horizon_ms: number;
  idle_after_ms: number;
  started_at_ms: number;
}

export type FairOutcome =
  | { granted: true; id: string; deadlineMs: number }
  | { granted: false; reason: string; retryAfterMs: number | null; explanation: string };

/** A fair-share ceiling split between weighted tenants. */
export class FairShare extends Handle {
  private constructor();
  static shared(region: Region, config: FairConfig | string, options?: { leaseCapacity?: number }): FairShare;
  static attach(region: Region): FairShare;
  /** The clock of the calls without `nowMs` (CLOCK_MONOTONIC, ms). */
  static monotonicMs(): number;
  acquire(tenant: string, cost: number, holdMs: Integer, nowMs?: Integer): FairOutcome;
  release(lease: string | { id: string }, nowMs?: Integer): void;
  stats(nowMs?: Integer): Record<string, unknown>;
  reap(): { processes: number; leases: number };
}
