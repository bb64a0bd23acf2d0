// Finding and loading libshmsched.so, and binding the table of lib/abi.mjs.
//
// Where the library comes from, first match wins:
//
// 1. `SHMSCHED_LIB`: the path of a libshmsched.so to use (an error if it
//    does not exist: a set variable is never silently ignored).
// 2. The copy shipped inside this package, `native/<platform>-<arch>/`
//    (`npm pack` puts the library there, see scripts/bundle-native.mjs).
// 3. The source tree this package sits in (development): the newer of
//    `target/release` and `target/debug` (or `$CARGO_TARGET_DIR`).
// 4. The system's library path: `libshmsched.so` installed by
//    ffi/install.sh (or a distribution's package), found by the dynamic
//    loader (ld.so.cache, LD_LIBRARY_PATH).

import koffi from 'koffi';
import { existsSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { defineTypes, FUNCTIONS, functionName } from './abi.mjs';
import { errorFor } from './errors.mjs';

/** The C ABI version this binding was written for. */
export const ABI_VERSION = 1;

const PACKAGE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const FILE = 'libshmsched.so';

/** Where this package looks for the library, in order (for messages and
 * for scripts/bundle-native.mjs). */
export function candidates(env = process.env) {
  const out = [];
  if (env.SHMSCHED_LIB) return [{ how: 'SHMSCHED_LIB', path: env.SHMSCHED_LIB, required: true }];
  out.push({ how: 'shipped with the package', path: join(PACKAGE_DIR, 'native', `${process.platform}-${process.arch}`, FILE) });
  const tree = resolve(PACKAGE_DIR, '..');
  if (existsSync(join(tree, 'ffi', 'Cargo.toml'))) {
    const target = env.CARGO_TARGET_DIR ? resolve(tree, env.CARGO_TARGET_DIR) : join(tree, 'target');
    const built = ['release', 'debug']
      .map((p) => join(target, p, FILE))
      .filter((p) => existsSync(p))
      .sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs);
    for (const p of built) out.push({ how: 'the source tree\'s build', path: p });
  }
  out.push({ how: 'the system\'s library path', path: FILE, system: true });
  return out;
}

function load() {
  const tried = [];
  for (const c of candidates()) {
    if (!c.system && !existsSync(c.path)) {
      if (c.required) {
        throw new Error(`SHMSCHED_LIB is ${c.path}, which does not exist`);
      }
      tried.push(`${c.path} (${c.how}): not there`);
      continue;
    }
    try {
      return { lib: koffi.load(c.path), path: c.path };
    } catch (e) {
      if (c.required) throw new Error(`SHMSCHED_LIB is ${c.path}, which cannot be loaded: ${e.message}`);
      tried.push(`${c.path} (${c.how}): ${e.message}`);
    }
  }
  throw new Error(`shmsched: libshmsched.so was not found. Tried:\n  ${tried.join('\n  ')}\n`
    + 'Build it (cargo build --release -p shmsched-ffi in the source tree), install it '
    + '(ffi/install.sh), or set SHMSCHED_LIB to its path.');
}

const loaded = load();

/** The path of the loaded library (as given to the loader). */
export const LIBRARY_PATH = loaded.path;

defineTypes(koffi);

/** The bound functions by C name. */
export const C = Object.create(null);
for (const decl of FUNCTIONS) {
  C[functionName(decl)] = loaded.lib.func(decl);
}

if (C.shmsched_abi_version() !== ABI_VERSION) {
  throw new Error(`${LIBRARY_PATH} has C ABI version ${C.shmsched_abi_version()}, `
    + `and this binding speaks version ${ABI_VERSION}`);
}

/** The region layout version of the loaded library. */
export const LAYOUT_VERSION = C.shmsched_layout_version();

export { koffi };

/** The error of the last failed call on this thread, for `status`. */
export function lastError(status) {
  const n = Number(C.shmsched_last_error_message(null, 0));
  const buf = Buffer.alloc(n + 1);
  C.shmsched_last_error_message(buf, buf.length);
  return errorFor(status, buf.toString('utf8', 0, n));
}

/** Throws the typed error of a failed status. */
export function check(status) {
  if (status !== 0) throw lastError(status);
}

const BUFFER_TOO_SMALL = 19;

/** Calls a JSON-writing function `fn(...args, buf, len, &out_len)` with a
 * buffer large enough, and returns the text. */
export function text(fn, ...args) {
  let size = 4096;
  for (let tries = 0; ; tries++) {
    const buf = Buffer.alloc(size);
    const need = [0];
    const st = fn(...args, buf, size, need);
    if (st === BUFFER_TOO_SMALL && tries < 8) {
      size = Number(need[0]) + 1;
      continue;
    }
    check(st);
    return buf.toString('utf8', 0, Number(need[0]));
  }
}
