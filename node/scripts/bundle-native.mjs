// `npm pack` / `npm publish` (prepack): puts into the package what lives
// outside node/ in the source tree, so that the tarball installs and runs
// with nothing else on the machine:
//
// - native/<platform>-<arch>/libshmsched.so: the library, from
//   SHMSCHED_LIB when set, else built now with
//   `cargo build --release -p shmsched-ffi`;
// - LICENSE, from the repository root.
//
// With --clean (postpack) it removes them again, so that in the source tree
// the package keeps finding the freshly built library, not a stale copy.
//
// The tarball carries the library for the platform it was packed on; on
// another one, a user points SHMSCHED_LIB at a libshmsched.so built there,
// or installs the library (ffi/install.sh) where the loader finds it.

import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, rmSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const pkg = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const repo = resolve(pkg, '..');
const nativeDir = join(pkg, 'native');
const license = join(pkg, 'LICENSE');

if (process.argv.includes('--clean')) {
  rmSync(nativeDir, { recursive: true, force: true });
  if (existsSync(join(repo, 'LICENSE'))) rmSync(license, { force: true });
  process.exit(0);
}

function fail(msg) {
  process.stderr.write(`bundle-native: ${msg}\n`);
  process.exit(1);
}

let lib = process.env.SHMSCHED_LIB;
if (lib) {
  if (!existsSync(lib)) fail(`SHMSCHED_LIB is ${lib}, which does not exist`);
} else {
  if (!existsSync(join(repo, 'ffi', 'Cargo.toml'))) {
    fail('not in the source tree (no ../ffi/Cargo.toml) and SHMSCHED_LIB is not set: '
      + 'set it to the libshmsched.so to ship');
  }
  const r = spawnSync('cargo', ['build', '--release', '-p', 'shmsched-ffi'], { cwd: repo, stdio: 'inherit' });
  if (r.error) fail(`cannot run cargo (${r.error.message}); set SHMSCHED_LIB to a built libshmsched.so`);
  if (r.status !== 0) fail('cargo build --release -p shmsched-ffi failed');
  const target = process.env.CARGO_TARGET_DIR ? resolve(repo, process.env.CARGO_TARGET_DIR) : join(repo, 'target');
  lib = join(target, 'release', 'libshmsched.so');
  if (!existsSync(lib)) fail(`${lib} was not built`);
}

const dest = join(nativeDir, `${process.platform}-${process.arch}`);
mkdirSync(dest, { recursive: true });
copyFileSync(lib, join(dest, 'libshmsched.so'));
if (existsSync(join(repo, 'LICENSE'))) copyFileSync(join(repo, 'LICENSE'), license);
process.stderr.write(`bundle-native: packed ${lib} as native/${process.platform}-${process.arch}/libshmsched.so\n`);
