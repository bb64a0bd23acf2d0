// The errors of the binding: one class per status code of the C ABI, all
// of them `ShmschedError`s carrying the C `status`, its name as `code`,
// and the library's message (the same sentence a Rust or C caller gets,
// naming the bad value and the limit).
//
// Arguments are checked in JavaScript before the library sees them, and
// those failures follow the language's conventions as well: a value of the
// wrong type is a `TypeError`, a value of the right type out of range (or
// not one of the accepted names) a `RangeError`. They are also
// `ShmschedError`s, and `InvalidArgumentError`s (or `InvalidPriorityError`s
// for a priority), through `Symbol.hasInstance`, so a caller can catch
// either way:
//
//   try { Scheduler.shared(region, 2 ** 40); }
//   catch (e) { e instanceof RangeError; e instanceof InvalidArgumentError; e.code; }

/** Status names by code (`SHMSCHED_STATUS_*`, in the header's order). */
export const STATUS = Object.freeze([
  'OK', 'NULL_ARGUMENT', 'INVALID_ARGUMENT', 'INVALID_PRIORITY', 'NOT_FOUND',
  'ALREADY_EXISTS', 'IO', 'BAD_REGION', 'VERSION_MISMATCH', 'WRONG_KIND',
  'MISMATCH', 'PROCESS_TABLE_FULL', 'ZERO_CONCURRENCY', 'DISPOSED', 'TIMEOUT',
  'WOULD_BLOCK', 'FORKED', 'ALREADY_RELEASED', 'FOREIGN_PERMIT',
  'BUFFER_TOO_SMALL', 'UNKNOWN_TENANT', 'UNKNOWN_LEASE', 'TIME_WENT_BACKWARDS',
  'CAPACITY_EXHAUSTED', 'INTERNAL', 'CANCELLED',
]);

/** The status code of a name (`STATUS_CODE.TIMEOUT === 14`). */
export const STATUS_CODE = Object.freeze(Object.fromEntries(STATUS.map((n, i) => [n, i])));

const BRAND = Symbol('shmsched.error');

/** Every error of this package. `status` is the C status code (null for
 * the binding's own `CLOSED`), `code` its name. */
export class ShmschedError extends Error {
  constructor(status, message, options) {
    super(message, options);
    initError(this, status);
  }

  // `instanceof ShmschedError` (or of a status class) also holds for the
  // TypeError and RangeError flavours below, which cannot inherit from it.
  static [Symbol.hasInstance](x) {
    if (x === null || (typeof x !== 'object' && typeof x !== 'function') || x[BRAND] !== true) {
      return false;
    }
    if (this === ShmschedError) return true;
    if (Object.hasOwn(this, 'status') && this.status !== null) return x.status === this.status;
    return Function.prototype[Symbol.hasInstance].call(this, x);
  }
}

function initError(e, status, name) {
  Object.defineProperty(e, BRAND, { value: true });
  e.status = status;
  e.code = status === null ? 'CLOSED' : (STATUS[status] ?? `STATUS_${status}`);
  if (name) e.name = name;
}

const classes = new Map();
function statusClass(status, name) {
  const cls = {
    [name]: class extends ShmschedError {
      constructor(message, options) {
        super(status, message, options);
        this.name = name;
      }
    },
  }[name];
  Object.defineProperty(cls, 'status', { value: status });
  classes.set(status, cls);
  return cls;
}

/** A required argument was missing (NULL in C). */
export const NullArgumentError = statusClass(1, 'NullArgumentError');
/** An argument was out of range or malformed. */
export const InvalidArgumentError = statusClass(2, 'InvalidArgumentError');
/** A priority that is not one of the seven. */
export const InvalidPriorityError = statusClass(3, 'InvalidPriorityError');
/** The region file does not exist. */
export const NotFoundError = statusClass(4, 'NotFoundError');
/** The region file already exists. */
export const AlreadyExistsError = statusClass(5, 'AlreadyExistsError');
/** Another operating-system error. */
export const IoError = statusClass(6, 'IoError');
/** The region's contents are not a valid shmsched region. */
export const BadRegionError = statusClass(7, 'BadRegionError');
/** The region was written with another layout version. */
export const VersionMismatchError = statusClass(8, 'VersionMismatchError');
/** The region holds another kind of object. */
export const WrongKindError = statusClass(9, 'WrongKindError');
/** The region holds the same kind of object with other parameters. */
export const MismatchError = statusClass(10, 'MismatchError');
/** The region's process table is full. */
export const ProcessTableFullError = statusClass(11, 'ProcessTableFullError');
/** The scheduler's concurrency is 0: nothing can ever be admitted. */
export const ZeroConcurrencyError = statusClass(12, 'ZeroConcurrencyError');
/** The scheduler was disposed. */
export const DisposedError = statusClass(13, 'DisposedError');
/** A wait's `timeout` expired; nothing was taken. */
export const TimeoutError = statusClass(14, 'TimeoutError');
/** No capacity now (the `try` calls answer null or false instead). */
export const WouldBlockError = statusClass(15, 'WouldBlockError');
/** A handle used in a forked child. */
export const ForkedError = statusClass(16, 'ForkedError');
/** The permit or lease was already released (or never issued). */
export const AlreadyReleasedError = statusClass(17, 'AlreadyReleasedError');
/** The permit belongs to another process. */
export const ForeignPermitError = statusClass(18, 'ForeignPermitError');
/** A buffer was too small (handled inside the binding). */
export const BufferTooSmallError = statusClass(19, 'BufferTooSmallError');
/** A fair-share call named a tenant that is not configured. */
export const UnknownTenantError = statusClass(20, 'UnknownTenantError');
/** A fair-share release named a lease id that was never issued. */
export const UnknownLeaseError = statusClass(21, 'UnknownLeaseError');
/** A fair-share call's `nowMs` is earlier than the last accepted one. */
export const TimeWentBackwardsError = statusClass(22, 'TimeWentBackwardsError');
/** A fixed-capacity table is full. */
export const CapacityExhaustedError = statusClass(23, 'CapacityExhaustedError');
/** A panic inside the library, caught at its boundary. */
export const InternalError = statusClass(24, 'InternalError');

/** A wait cancelled in the library (what an aborted wait is, underneath:
 * the binding rejects it with AbortError). */
export const CancelledError = statusClass(25, 'CancelledError');

/** A handle used after `close()` (or `detach()`). Raised by the binding
 * itself: `status` is null, `code` is `'CLOSED'`. */
export class ClosedError extends ShmschedError {
  constructor(message) {
    super(null, message);
    this.name = 'ClosedError';
  }
}
Object.defineProperty(ClosedError, 'status', { value: null });

/** An argument of the wrong type (checked before the library is called):
 * a `TypeError`, and an `InvalidArgumentError` (or `InvalidPriorityError`). */
export class ShmschedTypeError extends TypeError {
  constructor(message, status = 2) {
    super(message);
    initError(this, status);
  }
}

/** An argument of the right type out of range, or not one of the accepted
 * names (checked before the library is called): a `RangeError`, and an
 * `InvalidArgumentError` (or `InvalidPriorityError`). */
export class ShmschedRangeError extends RangeError {
  constructor(message, status = 2) {
    super(message);
    initError(this, status);
  }
}

/** The rejection of a wait whose `signal` was aborted: `name` is
 * `'AbortError'` and `code` `'ABORT_ERR'`, as Node's own APIs reject, and
 * `cause` is the signal's reason. Nothing was taken and no waiter is left. */
export class AbortError extends Error {
  constructor(reason) {
    super('The operation was aborted', { cause: reason });
    this.name = 'AbortError';
    this.code = 'ABORT_ERR';
  }
}

/** The error for a failed call's status and message. */
export function errorFor(status, message) {
  const cls = classes.get(status);
  return cls ? new cls(message) : new ShmschedError(status, message);
}
