// The bad-input table: every public function and method of the package
// called with each kind of bad argument (wrong type, out of range, not an
// integer, NaN and the infinities, huge, negative, NUL, a lone surrogate,
// foreign objects and closed handles where a handle goes, misspelt
// options), one argument at a time, the others valid. Each call must fail
// with a typed error: a TypeError for a wrong type, a RangeError for a
// value out of range, both also ShmschedErrors (InvalidArgumentError or
// InvalidPriorityError); a ClosedError for a closed handle; the library's
// InvalidArgumentError for what only it can judge. A call that returns a
// promise must return it (never throw) and reject it. Nothing is silently
// accepted.
//
// The cases run in child processes (this file, re-executed with
// SHMSCHED_BAD_INPUT_BATCH set), a batch per group of functions, so that a
// crash (an abort or a segfault inside koffi or the library) is seen as a
// failure of the case it happened in instead of taking the test runner
// with it.

import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import assert from 'node:assert/strict';

import * as shmsched from 'shmsched';
import { FAIR } from './support.mjs';

const {
  ClosedError, FairShare, InvalidArgumentError, InvalidPriorityError, Limiter, Region, Scheduler,
  ShmschedError,
} = shmsched;

// ---- the values ----------------------------------------------------------

// Each bad value says what it should produce: 'T' a TypeError, 'R' a
// RangeError, 'P' an InvalidPriorityError that is a RangeError, 'PT' one
// that is a TypeError, 'C' a ClosedError, 'L' the library's refusal (an
// InvalidArgumentError, neither TypeError nor RangeError).

const common = (label) => [
  [`${label}: string "3"`, () => '3', 'T'],
  [`${label}: object`, () => ({}), 'T'],
  [`${label}: array`, () => [1], 'T'],
  [`${label}: boolean`, () => true, 'T'],
  [`${label}: symbol`, () => Symbol('s'), 'T'],
  [`${label}: function`, () => () => 1, 'T'],
  [`${label}: Date`, () => new Date(0), 'T'],
];

/** Bad values for an integer `min..=max` (required unless `optional`). */
function ints(min, max, { optional = false, nullable = false } = {}) {
  const out = [
    ...common('int'),
    ['int: NaN', () => NaN, 'R'],
    ['int: Infinity', () => Infinity, 'R'],
    ['int: -Infinity', () => -Infinity, 'R'],
    ['int: 2.5', () => 2.5, 'R'],
    ['int: 1e-9', () => 1e-9, 'R'],
    ['int: 2**32 + 2 (would wrap to 2)', () => 2 ** 32 + 2, 'R'],
    ['int: 2**53 + 2', () => 2 ** 53 + 2, 'R'],
    ['int: 1e300', () => 1e300, 'R'],
    ['int: 2n**64n', () => 2n ** 64n, 'R'],
    ['int: 2n**64n + 1n (would wrap to 1)', () => 2n ** 64n + 1n, 'R'],
    [`int: max + 1 (${max + 1})`, () => max + 1, 'R'],
    [`int: max + 1 as bigint`, () => BigInt(max) + 1n, 'R'],
    ['int: Number.MAX_VALUE', () => Number.MAX_VALUE, 'R'],
  ];
  if (min > Number.MIN_SAFE_INTEGER) {
    out.push([`int: min - 1 (${min - 1})`, () => min - 1, 'R'], ['int: -2**31', () => -(2 ** 31), 'R'],
      ['int: -1n - 2n**63n', () => -1n - 2n ** 63n, 'R'], ['int: -2**32 + 3', () => -(2 ** 32) + 3, 'R']);
  }
  if (!optional) out.push(['int: undefined', () => undefined, 'T']);
  if (!nullable) out.push(['int: null', () => null, 'T']);
  return out;
}

/** Bad values for an unsigned 64-bit integer. */
function u64s({ optional = false } = {}) {
  const out = [
    ...common('u64'),
    ['u64: NaN', () => NaN, 'R'],
    ['u64: Infinity', () => Infinity, 'R'],
    ['u64: 2.5', () => 2.5, 'R'],
    ['u64: -1', () => -1, 'R'],
    ['u64: -1n', () => -1n, 'R'],
    ['u64: 2**53 + 2 (not exact)', () => 2 ** 53 + 2, 'R'],
    ['u64: 2n**64n (would wrap to 0)', () => 2n ** 64n, 'R'],
    ['u64: null', () => null, 'T'],
  ];
  if (!optional) out.push(['u64: undefined', () => undefined, 'T']);
  return out;
}

const priorities = (optional = true) => [
  ['priority: "urgent"', () => 'urgent', 'P'],
  ['priority: ""', () => '', 'P'],
  ['priority: "high\\0"', () => 'high\0', 'P'],
  ['priority: "1.0"', () => '1.0', 'P'],
  ['priority: "0x1"', () => '0x1', 'P'],
  ['priority: "99999999999999999999999"', () => '99999999999999999999999', 'P'],
  ['priority: 9', () => 9, 'P'],
  ['priority: -4', () => -4, 'P'],
  ['priority: -100', () => -100, 'P'],
  ['priority: 1.5', () => 1.5, 'P'],
  ['priority: NaN', () => NaN, 'P'],
  ['priority: Infinity', () => Infinity, 'P'],
  ['priority: 2**32 + 1 (would wrap to 1)', () => 2 ** 32 + 1, 'P'],
  ['priority: 2n**32n + 1n', () => 2n ** 32n + 1n, 'P'],
  ['priority: object', () => ({}), 'PT'],
  ['priority: null', () => null, 'PT'],
  ['priority: boolean', () => true, 'PT'],
  ['priority: array', () => ['high'], 'PT'],
  ['priority: symbol', () => Symbol('high'), 'PT'],
  ['priority: String object', () => new String('high'), 'PT'], // eslint-disable-line no-new-wrappers
  ...(optional ? [] : [['priority: undefined', () => undefined, 'PT']]),
];

const strings = (label, { optional = false } = {}) => [
  [`${label}: number`, () => 123, 'T'],
  [`${label}: null`, () => null, 'T'],
  [`${label}: object`, () => ({}), 'T'],
  [`${label}: Buffer`, () => Buffer.from('x'), 'T'],
  [`${label}: symbol`, () => Symbol('x'), 'T'],
  [`${label}: String object`, () => new String('x'), 'T'], // eslint-disable-line no-new-wrappers
  [`${label}: with NUL (C would cut it)`, () => 'name\0tail', 'R'],
  [`${label}: only NUL`, () => '\0', 'R'],
  [`${label}: lone surrogate`, () => 'x\ud800y', 'R'],
  ...(optional ? [] : [[`${label}: undefined`, () => undefined, 'T']]),
];

/** Bad values where a handle of `kind` goes. */
const handles = (kind) => [
  [`${kind}: {handle: 5}`, () => ({ handle: 5 }), 'T'],
  [`${kind}: {handle: 5n}`, () => ({ handle: 5n }), 'T'],
  [`${kind}: {}`, () => ({}), 'T'],
  [`${kind}: 5`, () => 5, 'T'],
  [`${kind}: 5n (an address)`, () => 5n, 'T'],
  [`${kind}: null`, () => null, 'T'],
  [`${kind}: undefined`, () => undefined, 'T'],
  [`${kind}: string`, () => 'pool', 'T'],
  [`${kind}: Object.create(${kind}.prototype)`, () => Object.create(shmsched[kind].prototype), 'T'],
  [`${kind}: a Proxy of a real one`, (f) => new Proxy(f.handle(kind), {}), 'T'],
  [`${kind}: another kind of handle`, (f) => f.handle(kind === 'Region' ? 'Limiter' : 'Region'), 'T'],
  [`${kind}: another kind with its prototype swapped`, (f) => {
    const h = f.handle(kind === 'Scheduler' ? 'Limiter' : 'Scheduler', true);
    Object.setPrototypeOf(h, shmsched[kind].prototype);
    return h;
  }, 'T'],
  [`${kind}: closed`, (f) => f.closed(kind), 'C'],
];

/** Bad option bags with `allowed` keys, and bad values for some keys. */
function optionBags(allowed, extra = []) {
  return [
    ['options: string', () => 'x', 'T'],
    ['options: number', () => 5, 'T'],
    ['options: null', () => null, 'T'],
    ['options: array', () => [], 'T'],
    ['options: misspelt key', () => ({ [`${allowed[0]}x`]: 1 }), 'T'],
    ['options: symbol key', () => ({ [Symbol('k')]: 1 }), 'T'],
    ...extra,
  ];
}

const waitOptions = optionBags(['timeout', 'signal'], [
  ['timeout: -1', () => ({ timeout: -1 }), 'R'],
  ['timeout: -Infinity', () => ({ timeout: -Infinity }), 'R'],
  ['timeout: NaN', () => ({ timeout: NaN }), 'R'],
  ['timeout: "1"', () => ({ timeout: '1' }), 'T'],
  ['timeout: 1n', () => ({ timeout: 1n }), 'T'],
  ['timeout: object', () => ({ timeout: {} }), 'T'],
  ['signal: object', () => ({ signal: {} }), 'T'],
  ['signal: string', () => ({ signal: 'abort' }), 'T'],
  ['signal: AbortController', () => ({ signal: new AbortController() }), 'T'],
]);
const syncWaitOptions = optionBags(['timeout'], [
  ['timeout: -1', () => ({ timeout: -1 }), 'R'],
  ['timeout: NaN', () => ({ timeout: NaN }), 'R'],
  ['timeout: "1"', () => ({ timeout: '1' }), 'T'],
  ['signal (not a sync option)', () => ({ signal: new AbortController().signal }), 'T'],
]);
const regionOptions = optionBags(['mode', 'processSlots'], [
  ['mode: "0o600"', () => ({ mode: '0o600' }), 'T'],
  ['mode: 0o1000', () => ({ mode: 0o1000 }), 'R'],
  ['mode: 0o400 (no owner write)', () => ({ mode: 0o400 }), 'R'],
  ['mode: 0', () => ({ mode: 0 }), 'R'],
  ['mode: 2**32 + 0o600 (would wrap to 0o600)', () => ({ mode: 2 ** 32 + 0o600 }), 'R'],
  ['mode: 0o602 (world-writable)', () => ({ mode: 0o602 }), 'L'],
  ['mode: 6.5e2', () => ({ mode: 650.5 }), 'R'],
  ['processSlots: 0', () => ({ processSlots: 0 }), 'R'],
  ['processSlots: 4097', () => ({ processSlots: 4097 }), 'R'],
  ['processSlots: 2**32 + 1 (would wrap to 1)', () => ({ processSlots: 2 ** 32 + 1 }), 'R'],
  ['processSlots: 2.5', () => ({ processSlots: 2.5 }), 'R'],
  ['processSlots: NaN', () => ({ processSlots: NaN }), 'R'],
  ['processSlots: "8"', () => ({ processSlots: '8' }), 'T'],
]);
const anonOptions = optionBags(['processSlots'], [
  ['processSlots: 0', () => ({ processSlots: 0 }), 'R'],
  ['processSlots: -1', () => ({ processSlots: -1 }), 'R'],
  ['processSlots: 2**32 + 1', () => ({ processSlots: 2 ** 32 + 1 }), 'R'],
  ['mode (not an option here)', () => ({ mode: 0o600 }), 'T'],
]);
const caps = [
  ['caps: string', () => 'low', 'T'],
  ['caps: number', () => 2, 'T'],
  ['caps: null', () => null, 'T'],
  ['caps: array', () => [1], 'T'],
  ['caps: unknown priority', () => ({ urgent: 1 }), 'P'],
  ['caps: priority 7', () => ({ 7: 1 }), 'P'],
  ['caps: symbol key', () => ({ [Symbol('low')]: 1 }), 'T'],
  ['caps: -1', () => ({ low: -1 }), 'R'],
  ['caps: 2**32 (would be UNSET)', () => ({ low: 2 ** 32 - 1 }), 'R'],
  ['caps: 2**32 + 1 (would wrap to 1)', () => ({ low: 2 ** 32 + 1 }), 'R'],
  ['caps: 1.5', () => ({ low: 1.5 }), 'R'],
  ['caps: NaN', () => ({ low: NaN }), 'R'],
  ['caps: "1"', () => ({ low: '1' }), 'T'],
  ['caps: undefined value', () => ({ low: undefined }), 'T'],
  ['caps: the same priority twice', () => ({ low: 1, LOW: 2 }), 'L'],
];
const limiterOptions = optionBags(['capacity'], [
  ['capacity: 0', () => ({ capacity: 0 }), 'R'],
  ['capacity: -1', () => ({ capacity: -1 }), 'R'],
  ['capacity: 2**31', () => ({ capacity: 2 ** 31 }), 'R'],
  ['capacity: 2**32 + 5 (would wrap to 5)', () => ({ capacity: 2 ** 32 + 5 }), 'R'],
  ['capacity: 2n**64n + 5n (would wrap to 5)', () => ({ capacity: 2n ** 64n + 5n }), 'R'],
  ['capacity: 2.5', () => ({ capacity: 2.5 }), 'R'],
  ['capacity: "10"', () => ({ capacity: '10' }), 'T'],
  ['capacity: null', () => ({ capacity: null }), 'T'],
]);
const fairConfigs = [
  ['config: number', () => 5, 'T'],
  ['config: null', () => null, 'T'],
  ['config: undefined', () => undefined, 'T'],
  ['config: array', () => [], 'T'],
  ['config: with a bigint', () => ({ ceiling: 1n }), 'T'],
  ['config: cyclic', () => { const o = {}; o.o = o; return o; }, 'T'],
  ['config: text with NUL', () => '{"ceiling":\u0000}', 'R'],
  ['config: not JSON', () => 'not json', 'L'],
  ['config: a ceiling of "x"', () => ({ ...FAIR, ceiling: 'x' }), 'L'],
  ['config: a negative weight', () => ({ ...FAIR, tenants: [{ id: 'a', weight: -1 }] }), 'L'],
];
const fairOptions = optionBags(['leaseCapacity'], [
  ['leaseCapacity: 0', () => ({ leaseCapacity: 0 }), 'R'],
  ['leaseCapacity: 2**20 + 1', () => ({ leaseCapacity: 2 ** 20 + 1 }), 'R'],
  ['leaseCapacity: 2**32 + 1 (would wrap to 1)', () => ({ leaseCapacity: 2 ** 32 + 1 }), 'R'],
  ['leaseCapacity: 1.5', () => ({ leaseCapacity: 1.5 }), 'R'],
  ['leaseCapacity: "8"', () => ({ leaseCapacity: '8' }), 'T'],
]);
const costs = [
  ['cost: "1"', () => '1', 'T'],
  ['cost: null', () => null, 'T'],
  ['cost: undefined', () => undefined, 'T'],
  ['cost: 1n', () => 1n, 'T'],
  ['cost: NaN', () => NaN, 'R'],
  ['cost: Infinity', () => Infinity, 'R'],
  ['cost: -Infinity', () => -Infinity, 'R'],
  ['cost: -1', () => -1, 'L'],
];
const bools = [
  ['bool: "true"', () => 'true', 'T'],
  ['bool: 1', () => 1, 'T'],
  ['bool: null', () => null, 'T'],
  ['bool: object', () => ({}), 'T'],
];
const fns = [
  ['fn: number', () => 5, 'T'],
  ['fn: null', () => null, 'T'],
  ['fn: undefined', () => undefined, 'T'],
  ['fn: string', () => 'f', 'T'],
];
const leases = [
  ['lease: number', () => 5, 'T'],
  ['lease: null', () => null, 'T'],
  ['lease: undefined', () => undefined, 'T'],
  ['lease: {}', () => ({}), 'T'],
  ['lease: {id: 5}', () => ({ id: 5 }), 'T'],
  ['lease: with NUL', () => 'a1\0', 'R'],
  ['lease: {id} with NUL', () => ({ id: 'a1\0' }), 'R'],
  ['lease: lone surrogate', () => '\udc00', 'R'],
];

// ---- the functions -------------------------------------------------------

// Each signature: how to call it with its arguments (the receiver first,
// for methods), whether it returns a promise, and per argument its valid
// value and its bad values. Valid values are chosen so that the valid call
// would succeed at once (never block), so a bad value that got through
// shows as a success, not as a hang.

const getter = (cls, name) => {
  for (let o = shmsched[cls].prototype; o; o = Object.getPrototypeOf(o)) {
    const d = Object.getOwnPropertyDescriptor(o, name);
    if (d) return d.get;
  }
  throw new Error(`no getter ${cls}#${name}`);
};
const method = (cls, name) => shmsched[cls].prototype[name];

const T = (kind) => ['this', (f) => f.handle(kind), handles(kind)];
// close() and closed are the same for every kind of handle (a Limiter
// closed through Region.prototype.close is closed, rightly), and closing
// twice is allowed: what must fail is a receiver that is no handle.
const notHandles = (kind) => ['this', (f) => f.handle(kind),
  handles(kind).filter(([label, , k]) => k !== 'C' && !label.includes('another kind'))];
const SIGNATURES = {
  module: [
    ['priorityValue', (p) => shmsched.priorityValue(p), false, [['priority', () => 'high', priorities(false)]]],
    ['strerror', (s) => shmsched.strerror(s), false, [['status', () => 2, ints(0, 2 ** 32 - 1)]]],
    ['Region.create', (n, o) => Region.create(n, o), false, [
      ['name', (f) => f.path(), strings('name')],
      ['options', () => undefined, regionOptions],
    ]],
    ['Region.open', (n) => Region.open(n), false, [['name', (f) => f.existing(), strings('name')]]],
    ['Region.openOrCreate', (n, o) => Region.openOrCreate(n, o), false, [
      ['name', (f) => f.path(), strings('name')],
      ['options', () => undefined, regionOptions],
    ]],
    ['Region.anonymous', (o) => Region.anonymous(o), false, [['options', () => undefined, anonOptions]]],
    ['Region.openFd', (fd) => Region.openFd(fd), false, [['fd', (f) => f.fd(), ints(0, 2 ** 31 - 1)]]],
    ['Region.remove', (n) => Region.remove(n), false, [['name', (f) => f.existing(), strings('name')]]],
    ['Region#dupFd', (t) => method('Region', 'dupFd').call(t), false, [T('Region')]],
    ['Region#info', (t) => method('Region', 'info').call(t), false, [T('Region')]],
    ['Region#close', (t) => method('Region', 'close').call(t), false, [notHandles('Region')]],
    ['FairShare.monotonicMs (no arguments)', () => FairShare.monotonicMs(), false, []],
  ],
  scheduler: [
    ['Scheduler.shared', (r, m, c) => Scheduler.shared(r, m, c), false, [
      ['region', (f) => f.fresh(), handles('Region')],
      ['max', () => 4, ints(0, 65536)],
      ['caps', () => undefined, caps],
    ]],
    ['Scheduler.attach', (r) => Scheduler.attach(r), false, [['region', (f) => f.bound('Scheduler'), handles('Region')]]],
    ['Scheduler#child', (t, m, c) => method('Scheduler', 'child').call(t, m, c), false, [
      T('Scheduler'), ['max', () => 2, ints(0, 2 ** 31 - 1, { optional: true, nullable: true })], ['caps', () => undefined, caps]]],
    ['Scheduler#acquire', (t, p, o) => method('Scheduler', 'acquire').call(t, p, o), true, [
      T('Scheduler'), ['priority', () => 'high', priorities()], ['options', () => undefined, waitOptions]]],
    ['Scheduler#acquireMany', (t, n, p, o) => method('Scheduler', 'acquireMany').call(t, n, p, o), true, [
      T('Scheduler'), ['n', () => 2, ints(1, 65536)], ['priority', () => 'high', priorities()],
      ['options', () => undefined, waitOptions]]],
    ['Scheduler#acquireSync', (t, p, o) => method('Scheduler', 'acquireSync').call(t, p, o), false, [
      T('Scheduler'), ['priority', () => 'high', priorities()], ['options', () => undefined, syncWaitOptions]]],
    ['Scheduler#acquireManySync', (t, n, p, o) => method('Scheduler', 'acquireManySync').call(t, n, p, o), false, [
      T('Scheduler'), ['n', () => 2, ints(1, 65536)], ['priority', () => 'high', priorities()],
      ['options', () => undefined, syncWaitOptions]]],
    ['Scheduler#tryAcquire', (t, p) => method('Scheduler', 'tryAcquire').call(t, p), false, [
      T('Scheduler'), ['priority', () => 'high', priorities()]]],
    ['Scheduler#tryAcquireMany', (t, n, p) => method('Scheduler', 'tryAcquireMany').call(t, n, p), false, [
      T('Scheduler'), ['n', () => 2, ints(1, 65536)], ['priority', () => 'high', priorities()]]],
    ['Scheduler#run', (t, fn, p, o) => method('Scheduler', 'run').call(t, fn, p, o), true, [
      T('Scheduler'), ['fn', () => () => 1, fns], ['priority', () => 'high', priorities()],
      ['options', () => undefined, waitOptions]]],
    ['Scheduler#dispose', (t) => method('Scheduler', 'dispose').call(t), false, [T('Scheduler')]],
    ['Scheduler#disposed', (t) => getter('Scheduler', 'disposed').call(t), false, [T('Scheduler')]],
    ['Scheduler#reap', (t) => method('Scheduler', 'reap').call(t), false, [T('Scheduler')]],
    ['Scheduler#globalRunning', (t) => getter('Scheduler', 'globalRunning').call(t), false, [T('Scheduler')]],
    ['Scheduler#concurrency', (t) => getter('Scheduler', 'concurrency').call(t), false, [T('Scheduler')]],
    ['Scheduler#ceiling', (t) => getter('Scheduler', 'ceiling').call(t), false, [T('Scheduler')]],
    ['Scheduler#setCeiling', (t, c) => method('Scheduler', 'setCeiling').call(t, c), false, [
      T('Scheduler'), ['target', () => 4, ints(0, 65536)]]],
    ['Scheduler#setLottery', (t, s, e) => method('Scheduler', 'setLottery').call(t, s, e), false, [
      T('Scheduler'), ['seed', () => 1, u64s({ optional: true })], ['enabled', () => true, bools]]],
    ['Scheduler#stats', (t) => method('Scheduler', 'stats').call(t), false, [T('Scheduler')]],
    ['Scheduler#detach', (t) => method('Scheduler', 'detach').call(t), false, [T('Scheduler')]],
    ['Scheduler#close', (t) => method('Scheduler', 'close').call(t), false, [notHandles('Scheduler')]],
    ['Scheduler#closed', (t) => getter('Scheduler', 'closed').call(t), false, [notHandles('Scheduler')]],
    ['Permit#release', (t) => shmsched.Permit.prototype.release.call(t), false, [
      ['this', (f) => f.permit(), [
        ['permit: {}', () => ({}), 'T'],
        ['permit: a token-shaped object', () => ({ token: { process: 1n, serial: 1n } }), 'T'],
        ['permit: null', () => null, 'T'],
        ['permit: Object.create(Permit.prototype)', () => Object.create(shmsched.Permit.prototype), 'T'],
        ['permit: a Scheduler', (f) => f.handle('Scheduler'), 'T'],
      ]]]],
    ...['units', 'priority', 'token', 'released'].map((k) => [`Permit#${k}`,
      (t) => Object.getOwnPropertyDescriptor(shmsched.Permit.prototype, k).get.call(t), false, [
        ['this', (f) => f.permit(), [['permit: {}', () => ({}), 'T'], ['permit: null', () => null, 'T']]]]]),
  ],
  limiter: [
    ['Limiter.shared', (r, n, o) => Limiter.shared(r, n, o), false, [
      ['region', (f) => f.fresh(), handles('Region')],
      ['tokensPerSecond', () => 1000, ints(1, 2 ** 31 - 1)],
      ['options', () => undefined, limiterOptions],
    ]],
    ['Limiter.attach', (r) => Limiter.attach(r), false, [['region', (f) => f.bound('Limiter'), handles('Region')]]],
    ['Limiter#child', (t, n, o) => method('Limiter', 'child').call(t, n, o), false, [
      T('Limiter'), ['tokensPerSecond', () => 100, ints(1, 2 ** 31 - 1)], ['options', () => undefined, limiterOptions]]],
    ['Limiter#consume', (t, n, p, o) => method('Limiter', 'consume').call(t, n, p, o), true, [
      T('Limiter'), ['n', () => 1, ints(0, 2 ** 31 - 1)], ['priority', () => 'high', priorities()],
      ['options', () => undefined, waitOptions]]],
    ['Limiter#consumeSync', (t, n, p, o) => method('Limiter', 'consumeSync').call(t, n, p, o), false, [
      T('Limiter'), ['n', () => 1, ints(0, 2 ** 31 - 1)], ['priority', () => 'high', priorities()],
      ['options', () => undefined, syncWaitOptions]]],
    ['Limiter#tryConsume', (t, n) => method('Limiter', 'tryConsume').call(t, n), false, [
      T('Limiter'), ['n', () => 1, ints(0, 2 ** 31 - 1)]]],
    ['Limiter#tryConsumeAt', (t, n, p) => method('Limiter', 'tryConsumeAt').call(t, n, p), false, [
      T('Limiter'), ['n', () => 1, ints(0, 2 ** 31 - 1)], ['priority', () => 'high', priorities(false)]]],
    ['Limiter#tokens', (t) => getter('Limiter', 'tokens').call(t), false, [T('Limiter')]],
    ['Limiter#tokensPerSecond', (t) => getter('Limiter', 'tokensPerSecond').call(t), false, [T('Limiter')]],
    ['Limiter#capacity', (t) => getter('Limiter', 'capacity').call(t), false, [T('Limiter')]],
    ['Limiter#setRate', (t, n) => method('Limiter', 'setRate').call(t, n), false, [
      T('Limiter'), ['tokensPerSecond', () => 1000, ints(1, 2 ** 31 - 1)]]],
    ['Limiter#setCapacity', (t, n) => method('Limiter', 'setCapacity').call(t, n), false, [
      T('Limiter'), ['capacity', () => 1000, ints(1, 2 ** 31 - 1)]]],
    ['Limiter#reap', (t) => method('Limiter', 'reap').call(t), false, [T('Limiter')]],
    ['Limiter#stats', (t) => method('Limiter', 'stats').call(t), false, [T('Limiter')]],
    ['Limiter#detach', (t) => method('Limiter', 'detach').call(t), false, [T('Limiter')]],
  ],
  fair: [
    ['FairShare.shared', (r, c, o) => FairShare.shared(r, c, o), false, [
      ['region', (f) => f.fresh(), handles('Region')],
      ['config', () => FAIR, fairConfigs],
      ['options', () => undefined, fairOptions],
    ]],
    ['FairShare.attach', (r) => FairShare.attach(r), false, [['region', (f) => f.bound('FairShare'), handles('Region')]]],
    ['FairShare#acquire', (t, ten, c, h, now) => method('FairShare', 'acquire').call(t, ten, c, h, now), false, [
      T('FairShare'), ['tenant', () => 'a', strings('tenant')], ['cost', () => 1, costs],
      ['holdMs', () => 10, u64s()], ['nowMs', () => undefined, u64s({ optional: true })]]],
    ['FairShare#release', (t, l, now) => method('FairShare', 'release').call(t, l, now), false, [
      T('FairShare'), ['lease', (f) => f.lease(), leases], ['nowMs', () => undefined, u64s({ optional: true })]]],
    ['FairShare#stats', (t, now) => method('FairShare', 'stats').call(t, now), false, [
      T('FairShare'), ['nowMs', () => undefined, u64s({ optional: true })]]],
    ['FairShare#reap', (t) => method('FairShare', 'reap').call(t), false, [T('FairShare')]],
  ],
};

/** The cases of a batch: [label, signature name, build args, async, expected]. */
function casesOf(batch) {
  const out = [];
  for (const [name, call, isAsync, params] of SIGNATURES[batch]) {
    if (params.length === 0) {
      out.push({ label: `${name}()`, name, call, isAsync, args: () => [], expect: 'ok' });
    }
    params.forEach(([param, , bad], i) => {
      for (const [what, make, expect] of bad) {
        out.push({
          label: `${name} ${param} ← ${what}`,
          name,
          call,
          isAsync,
          args: (f) => params.map(([, valid], j) => (j === i ? make(f) : valid(f))),
          expect,
        });
      }
    });
  }
  return out;
}

const BATCHES = Object.keys(SIGNATURES);

// ---- the child -----------------------------------------------------------

/** What the child knows how to make (fresh for each case). */
function fixtures() {
  const made = [];
  const paths = [];
  let n = 0;
  const keep = (h) => { made.push(h); return h; };
  const path = () => {
    const p = `/dev/shm/shmsched-nodetest-bad-${process.pid}-${n++}`;
    paths.push(p);
    return p;
  };
  const f = {
    path,
    existing: () => { const p = path(); keep(Region.create(p)); return p; },
    fresh: () => keep(Region.anonymous()),
    fd: () => { const r = keep(Region.anonymous()); return r.dupFd(); },
    bound(kind) {
      const r = keep(Region.anonymous());
      if (kind === 'Scheduler') keep(Scheduler.shared(r, 64));
      if (kind === 'Limiter') keep(Limiter.shared(r, 1_000_000));
      if (kind === 'FairShare') keep(FairShare.shared(r, FAIR));
      return r;
    },
    handle(kind, unkept = false) {
      const r = keep(Region.anonymous());
      let h;
      if (kind === 'Region') h = r;
      else if (kind === 'Scheduler') h = Scheduler.shared(r, 64);
      else if (kind === 'Limiter') h = Limiter.shared(r, 1_000_000);
      else h = FairShare.shared(r, FAIR);
      return unkept ? h : keep(h);
    },
    closed(kind) { const h = f.handle(kind, true); h.close(); return h; },
    permit() { return f.handle('Scheduler').tryAcquire(); },
    lease() {
      const fair = f.handle('FairShare');
      const l = fair.acquire('a', 1, 10);
      return l;
    },
    cleanup() {
      for (const h of made.reverse()) {
        try { h.close(); } catch { /* a case closed it or swapped its prototype */ }
      }
      for (const p of paths) {
        try { Region.remove(p); } catch { /* never created */ }
      }
    },
  };
  return f;
}

function classify(e) {
  return {
    name: e?.name,
    message: String(e?.message ?? e),
    code: e?.code,
    shmsched: e instanceof ShmschedError,
    type: e instanceof TypeError,
    range: e instanceof RangeError,
    closed: e instanceof ClosedError,
    invalid: e instanceof InvalidArgumentError,
    priority: e instanceof InvalidPriorityError,
  };
}

async function runChild(batch) {
  const cases = casesOf(batch);
  const say = (o) => process.stdout.write(`${JSON.stringify(o)}\n`);
  for (let i = 0; i < cases.length; i++) {
    const c = cases[i];
    const f = fixtures();
    let result;
    try {
      const args = c.args(f);
      let value;
      try {
        value = c.call(...args);
      } catch (e) {
        result = { how: 'threw', ...classify(e) };
      }
      if (!result) {
        if (value instanceof Promise) {
          result = await value.then(
            (x) => ({ how: 'resolved', value: String(x) }),
            (e) => ({ how: 'rejected', ...classify(e) }),
          );
        } else {
          result = { how: 'returned', value: String(value) };
        }
      }
    } catch (e) {
      result = { how: 'setup failed', message: String(e?.stack ?? e) };
    }
    f.cleanup();
    say({ i, ...result });
  }
  say({ done: cases.length });
}

if (process.env.SHMSCHED_BAD_INPUT_BATCH) {
  await runChild(process.env.SHMSCHED_BAD_INPUT_BATCH);
} else {
  // ---- the parent --------------------------------------------------------

  const CHILD_TIMEOUT_MS = 120_000;

  /** Runs one batch in a child; its result lines, exit code and signal. */
  function runBatch(batch) {
    return new Promise((resolve) => {
      const kid = spawn(process.execPath, [fileURLToPath(import.meta.url)], {
        env: { ...process.env, SHMSCHED_BAD_INPUT_BATCH: batch, RUST_BACKTRACE: '0' },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      let err = '';
      kid.stdout.on('data', (d) => { out += d; });
      kid.stderr.on('data', (d) => { err += d; });
      const timer = setTimeout(() => kid.kill('SIGKILL'), CHILD_TIMEOUT_MS);
      kid.on('close', (code, signal) => {
        clearTimeout(timer);
        const lines = out.split('\n').filter(Boolean).map((l) => JSON.parse(l));
        resolve({ lines, code, signal, stderr: err });
      });
    });
  }

  function verdict(c, r) {
    if (!r) return 'no result (the child died before or during this case)';
    if (r.how === 'setup failed') return `setup failed: ${r.message}`;
    if (c.expect === 'ok') {
      return r.how === 'returned' || r.how === 'resolved' ? null : `failed: ${r.message}`;
    }
    if (r.how === 'returned' || r.how === 'resolved') return `was accepted (${r.how} ${r.value})`;
    if (c.isAsync && r.how === 'threw') return `threw synchronously instead of rejecting: ${r.message}`;
    if (!c.isAsync && r.how === 'rejected') return `rejected, but ${c.name} is synchronous`;
    if (!r.shmsched) return `not a ShmschedError: ${r.name}: ${r.message}`;
    const want = {
      T: r.type && r.invalid,
      R: r.range && r.invalid,
      P: r.range && r.priority,
      PT: r.type && r.priority,
      C: r.closed && r.code === 'CLOSED',
      L: r.invalid && !r.type && !r.range,
    }[c.expect];
    return want ? null : `expected ${c.expect}, got ${r.name} (${r.code}): ${r.message}`;
  }

  test('bad input: every public function × each kind of bad argument, in child processes', async () => {
    const results = await Promise.all(BATCHES.map(async (b) => [b, await runBatch(b)]));
    const failures = [];
    let total = 0;
    for (const [batch, { lines, code, signal, stderr }] of results) {
      const cases = casesOf(batch);
      total += cases.length;
      const byIndex = new Map(lines.filter((l) => 'i' in l).map((l) => [l.i, l]));
      cases.forEach((c, i) => {
        const why = verdict(c, byIndex.get(i));
        if (why) failures.push(`[${batch}] ${c.label}: ${why}`);
      });
      if (code !== 0 || signal) {
        failures.push(`[${batch}] child exited with code ${code}, signal ${signal}:\n${stderr.slice(-2000)}`);
      }
    }
    assert.ok(total > 900, `the table has ${total} cases`);
    assert.deepEqual(failures, [], `${failures.length} of ${total} cases failed:\n${failures.join('\n')}`);
  });

  test('the table covers every public function and method of the package', () => {
    const named = new Set(Object.values(SIGNATURES).flat().map(([name]) => name.split(' ')[0]));
    const missing = [];
    for (const cls of ['Region', 'Scheduler', 'Limiter', 'FairShare', 'Permit']) {
      const proto = shmsched[cls].prototype;
      for (const k of Object.getOwnPropertyNames(proto)) {
        if (k === 'constructor') continue;
        if (!named.has(`${cls}#${k}`)) missing.push(`${cls}#${k}`);
      }
      for (const k of Object.getOwnPropertyNames(shmsched[cls])) {
        if (['length', 'name', 'prototype', 'status'].includes(k)) continue;
        if (typeof shmsched[cls][k] === 'function' && !named.has(`${cls}.${k}`)) missing.push(`${cls}.${k}`);
      }
    }
    // Handle's own methods are inherited: close and closed are in the table
    // through Region#close, Scheduler#close and Scheduler#closed.
    const inherited = ['Limiter#close', 'Limiter#closed', 'FairShare#close', 'FairShare#closed', 'Region#closed'];
    for (const k of Object.keys(shmsched)) {
      if (typeof shmsched[k] === 'function' && /^[a-z]/.test(k) && !named.has(k)
        && !['debugPanic', 'pendingWaits'].includes(k)) {
        missing.push(k);
      }
    }
    assert.deepEqual(missing.filter((m) => !inherited.includes(m)), []);
  });
}
