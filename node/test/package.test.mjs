// The package as a user installs it: its package.json (publishable, with
// types, exports, files and engines), its type declarations (every export
// and every method declared; a usage file type-checks under `strict`
// against the installed index.d.ts, and misuse does not), and the table of
// bound C functions.

import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import assert from 'node:assert/strict';

import * as shmsched from 'shmsched';

const require = createRequire(import.meta.url);
const here = dirname(fileURLToPath(import.meta.url));
const pkgDir = dirname(require.resolve('shmsched/package.json'));
const pkg = JSON.parse(readFileSync(join(pkgDir, 'package.json'), 'utf8'));
const dts = readFileSync(join(pkgDir, pkg.types), 'utf8');

test('package.json: publishable, with exports, types, files and engines', () => {
  assert.equal(pkg.private, undefined);
  assert.equal(pkg.name, 'shmsched');
  assert.equal(pkg.type, 'module');
  assert.equal(pkg.exports['.'].types, './index.d.ts');
  assert.equal(pkg.exports['.'].default, './index.mjs');
  assert.equal(pkg.types, './index.d.ts');
  for (const f of ['index.mjs', 'index.d.ts', 'lib/', 'native/', 'README.md']) {
    assert.ok(pkg.files.includes(f), `files lists ${f}`);
  }
  assert.match(pkg.engines.node, /^>=20/);
  assert.deepEqual(pkg.os, ['linux']);
  assert.ok(pkg.dependencies.koffi, 'koffi is a dependency');
});

test('index.d.ts declares every export, and every export it declares exists', () => {
  const declared = new Set([...dts.matchAll(/^export (?:declare )?(?:const|function|class) (\w+)/gm)].map((m) => m[1]));
  const exported = Object.keys(shmsched);
  assert.deepEqual(exported.filter((k) => !declared.has(k)), [], 'exports missing from index.d.ts');
  assert.deepEqual([...declared].filter((k) => !(k in shmsched)), [], 'declared but not exported');
});

test('index.d.ts declares every method and property of the classes', () => {
  const missing = [];
  for (const cls of ['Region', 'Scheduler', 'Limiter', 'FairShare', 'Permit']) {
    const body = dts.match(new RegExp(`^export class ${cls} [^{]*\\{\\n([\\s\\S]*?)^\\}`, 'm'))?.[1] ?? '';
    const members = new Set([...body.matchAll(/^ {2}(?:static |readonly )?(\w+)[(<:?]/gm)].map((m) => m[1]));
    for (const k of Object.getOwnPropertyNames(shmsched[cls].prototype)) {
      if (k !== 'constructor' && !members.has(k)) missing.push(`${cls}#${k}`);
    }
    for (const k of Object.getOwnPropertyNames(shmsched[cls])) {
      if (typeof shmsched[cls][k] === 'function' && !members.has(k)) missing.push(`${cls}.${k}`);
    }
  }
  assert.deepEqual(missing, []);
});

test('a usage file type-checks against the installed declarations (strict), and misuse does not', () => {
  const tsc = require.resolve('typescript/bin/tsc');
  try {
    execFileSync(process.execPath, [tsc, '-p', join(here, 'types')], { encoding: 'utf8', timeout: 120_000 });
  } catch (e) {
    assert.fail(`tsc failed:\n${e.stdout}${e.stderr}`);
  }
});

test('the bound C functions are one table, each a function of the loaded library', async () => {
  const abi = await import(new URL('lib/abi.mjs', `file://${pkgDir}/`).href);
  const { C } = await import(new URL('lib/native.mjs', `file://${pkgDir}/`).href);
  assert.ok(abi.FUNCTION_NAMES.length >= 70, `${abi.FUNCTION_NAMES.length} functions`);
  assert.equal(new Set(abi.FUNCTION_NAMES).size, abi.FUNCTION_NAMES.length, 'no function twice');
  for (const n of abi.FUNCTION_NAMES) {
    assert.match(n, /^shmsched_[a-z0-9_]+$/);
    assert.equal(typeof C[n], 'function', `${n} is bound`);
  }
  assert.deepEqual(Object.keys(C).sort(), [...abi.FUNCTION_NAMES].sort());
});
