#!/usr/bin/env bash
# Installs the C ABI of shmsched under a prefix:
#   PREFIX/include/shmsched.h
#   PREFIX/lib/libshmsched.so, PREFIX/lib/libshmsched.a
#   PREFIX/lib/pkgconfig/shmsched.pc
# so that `cc prog.c $(pkg-config --cflags --libs shmsched)` works with
# PKG_CONFIG_PATH=PREFIX/lib/pkgconfig (add LD_LIBRARY_PATH=PREFIX/lib to
# run, unless PREFIX/lib is on the loader's path).
#
# usage: ffi/install.sh PREFIX [LIBDIR]
#   LIBDIR holds the built libraries (default: target/release; build them
#   with `cargo build --release -p shmsched-ffi`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
prefix="${1:?usage: ffi/install.sh PREFIX [LIBDIR]}"
libdir="${2:-$here/../target/release}"
for f in libshmsched.so libshmsched.a; do
  [ -f "$libdir/$f" ] || { echo "install.sh: $libdir/$f is missing: cargo build --release -p shmsched-ffi" >&2; exit 1; }
done
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/Cargo.toml" | head -n 1)"
mkdir -p "$prefix/include" "$prefix/lib/pkgconfig"
install -m 0644 "$here/include/shmsched.h" "$prefix/include/"
install -m 0755 "$libdir/libshmsched.so" "$prefix/lib/"
install -m 0644 "$libdir/libshmsched.a" "$prefix/lib/"
# What is installed carries no debug info: the release profile builds the
# shared object without it, but a static archive keeps the debug sections
# of the standard library's objects (and a debug build has its own).
if command -v strip >/dev/null 2>&1; then
  strip --strip-debug "$prefix/lib/libshmsched.so" "$prefix/lib/libshmsched.a"
fi
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" "$here/shmsched.pc.in" \
  > "$prefix/lib/pkgconfig/shmsched.pc"
echo "installed shmsched $version under $prefix"
