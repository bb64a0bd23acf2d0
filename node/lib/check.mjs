// Argument checks, run before koffi sees a value: koffi converts what it is
// given to the C type without asking (a string into a uint32_t aborts the
// process, 2 ** 32 + 2 becomes 2, 2.5 becomes 2, a number where a handle
// goes is dereferenced), so every value is checked here for its type and
// its range, and passed on only in a form the C type holds exactly.
//
// The rule (see errors.mjs): a value of the wrong type is a TypeError; a
// value of the right type that is out of range, not an integer, NaN, or not
// one of the accepted names is a RangeError. Both carry the C status they
// stand for (INVALID_ARGUMENT, or INVALID_PRIORITY for a priority), and the
// message names the argument, the value and the limit, as the library's
// own messages do.

import { ShmschedRangeError, ShmschedTypeError } from './errors.mjs';

const INVALID_PRIORITY = 3;
const U64_MAX = 0xffff_ffff_ffff_ffffn;

/** A short rendering of any value, for messages. */
export function describe(v) {
  switch (typeof v) {
    case 'string': {
      const s = v.length > 60 ? `${v.slice(0, 57)}...` : v;
      return `string ${JSON.stringify(s)}`;
    }
    case 'number': return `number ${Object.is(v, -0) ? '-0' : String(v)}`;
    case 'bigint': return `bigint ${v}n`;
    case 'boolean': return `boolean ${v}`;
    case 'undefined': return 'undefined';
    case 'symbol': return 'a symbol';
    case 'function': return 'a function';
    default:
      if (v === null) return 'null';
      if (Array.isArray(v)) return 'an array';
      try {
        const name = Object.getPrototypeOf(v)?.constructor?.name;
        return name && name !== 'Object' ? `an instance of ${name}` : 'an object';
      } catch {
        return 'an object';
      }
  }
}

function fmt(v) {
  return typeof v === 'bigint' ? String(v) : (Object.is(v, -0) ? '0' : String(v));
}

/** An integer `min..=max` (number or bigint), returned as a number; `max`
 * must be a safe integer. */
export function int(what, v, min, max) {
  if (typeof v === 'number') {
    if (!Number.isInteger(v)) {
      throw new ShmschedRangeError(`${what} ${fmt(v)} is not an integer: must be an integer ${min}..=${max}`);
    }
  } else if (typeof v !== 'bigint') {
    throw new ShmschedTypeError(`${what} must be an integer ${min}..=${max}, got ${describe(v)}`);
  }
  if (v < min || v > max) {
    throw new ShmschedRangeError(`${what} ${fmt(v)} is out of range: must be an integer ${min}..=${max}`);
  }
  return Number(v);
}

/** An unsigned 64-bit integer `min..=max` (a number that is a safe integer,
 * or a bigint), returned as a bigint. */
export function u64(what, v, min = 0n, max = U64_MAX) {
  if (typeof v === 'number') {
    if (!Number.isInteger(v)) {
      throw new ShmschedRangeError(`${what} ${fmt(v)} is not an integer: must be an integer ${min}..=${max}`);
    }
    if (!Number.isSafeInteger(v) && v > 0) {
      throw new ShmschedRangeError(`${what} ${fmt(v)} is above 2 ** 53 - 1, where numbers lose precision: `
        + 'pass a bigint');
    }
  } else if (typeof v !== 'bigint') {
    throw new ShmschedTypeError(`${what} must be an integer ${min}..=${max}, got ${describe(v)}`);
  }
  const b = BigInt(v);
  if (b < min || b > max) {
    throw new ShmschedRangeError(`${what} ${fmt(v)} is out of range: must be an integer ${min}..=${max}`);
  }
  return b;
}

/** A finite number. */
export function finite(what, v) {
  if (typeof v !== 'number') throw new ShmschedTypeError(`${what} must be a number, got ${describe(v)}`);
  if (!Number.isFinite(v)) throw new ShmschedRangeError(`${what} ${v} is not a finite number`);
  return v;
}

/** A boolean. */
export function bool(what, v) {
  if (typeof v !== 'boolean') throw new ShmschedTypeError(`${what} must be a boolean, got ${describe(v)}`);
  return v;
}

/** A string that C can take whole: no NUL (C would cut it there) and
 * well-formed UTF-16 (a lone surrogate would be replaced on the way to
 * UTF-8). Emptiness and length are the library's to judge. */
export function string(what, v) {
  if (typeof v !== 'string') throw new ShmschedTypeError(`${what} must be a string, got ${describe(v)}`);
  const nul = v.indexOf('\0');
  if (nul >= 0) {
    throw new ShmschedRangeError(`${what} ${JSON.stringify(v.length > 60 ? `${v.slice(0, 57)}...` : v)} `
      + `contains a NUL character (at index ${nul}), which C strings cannot hold`);
  }
  if (!v.isWellFormed()) {
    throw new ShmschedRangeError(`${what} is not well-formed UTF-16 (it has a lone surrogate), so it has no UTF-8 form`);
  }
  return v;
}

/** Priority names and values, lowest first. */
export const PRIORITIES = Object.freeze({
  lowest: -3,
  lower: -2,
  low: -1,
  normal: 0,
  high: 1,
  higher: 2,
  highest: 3,
});

const NAMES = Object.keys(PRIORITIES);
const EXPECTED = 'expected -3..=3 or a name (lowest, lower, low, normal, high, higher, highest)';

/** Priority names by value + 3. */
export const PRIORITY_NAMES = Object.freeze(NAMES);

/** A priority as its integer value: a name (any case, spaces around
 * ignored) or an integer -3..=3 (a number, a bigint, or a string of
 * digits), as the library parses them. */
export function priority(v, what = 'priority') {
  let n;
  if (typeof v === 'number' || typeof v === 'bigint') {
    if (typeof v === 'number' && !Number.isInteger(v)) {
      throw new ShmschedRangeError(`${what} ${v} is not a priority: ${EXPECTED}`, INVALID_PRIORITY);
    }
    n = v;
  } else if (typeof v === 'string') {
    const t = v.trim().toLowerCase();
    if (Object.hasOwn(PRIORITIES, t)) return PRIORITIES[t];
    if (!/^[+-]?\d{1,20}$/.test(t)) {
      throw new ShmschedRangeError(`${what} ${JSON.stringify(v.length > 60 ? `${v.slice(0, 57)}...` : v)} `
        + `is not a priority: ${EXPECTED}`, INVALID_PRIORITY);
    }
    n = BigInt(t);
  } else {
    throw new ShmschedTypeError(`${what} must be a priority name or an integer -3..=3, got ${describe(v)}`,
      INVALID_PRIORITY);
  }
  if (n < -3 || n > 3) {
    throw new ShmschedRangeError(`${what} ${n} is out of range: ${EXPECTED}`, INVALID_PRIORITY);
  }
  return Number(n);
}

/** An options bag: undefined, or an object whose own keys are all in
 * `allowed` (a misspelt option is an error, not a silent default). */
export function options(what, v, allowed) {
  if (v === undefined) return {};
  if (v === null || typeof v !== 'object' || Array.isArray(v)) {
    throw new ShmschedTypeError(`${what} options must be an object, got ${describe(v)}`);
  }
  for (const k of Reflect.ownKeys(v)) {
    if (!allowed.includes(k)) {
      const name = typeof k === 'symbol' ? k.toString() : JSON.stringify(k);
      throw new ShmschedTypeError(`${what}: unknown option ${name} (the options are ${allowed.join(', ')})`);
    }
  }
  return v;
}

/** `SHMSCHED_FOREVER`: no timeout. */
export const FOREVER = U64_MAX;

/** A timeout in seconds as nanoseconds: undefined, null and Infinity mean
 * no limit; otherwise a number >= 0 (rounded to the nanosecond). */
export function timeoutNs(v, what = 'timeout') {
  if (v === undefined || v === null || v === Infinity) return FOREVER;
  if (typeof v !== 'number') {
    throw new ShmschedTypeError(`${what} must be a number of seconds (or Infinity), got ${describe(v)}`);
  }
  if (Number.isNaN(v) || v < 0) {
    throw new ShmschedRangeError(`${what} ${fmt(v)} s is out of range: must be a number of seconds >= 0 `
      + '(Infinity or undefined: no limit)');
  }
  const ns = v * 1e9;
  return ns >= 1.8e19 ? FOREVER - 1n : BigInt(Math.round(ns));
}

/** An AbortSignal, or null when none is given. */
export function signal(v, what = 'signal') {
  if (v === undefined || v === null) return null;
  if (!(v instanceof AbortSignal)) {
    throw new ShmschedTypeError(`${what} must be an AbortSignal, got ${describe(v)}`);
  }
  return v;
}
