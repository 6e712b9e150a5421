#!/usr/bin/env bash
# Builds libloadgate and installs the header, the shared and static
# libraries, loadgate.pc and the CMake package config under PREFIX:
#
#   PREFIX/include/loadgate.h
#   PREFIX/lib/libloadgate.so, PREFIX/lib/libloadgate.a
#   PREFIX/lib/pkgconfig/loadgate.pc
#   PREFIX/lib/cmake/loadgate/loadgateConfig.cmake (+ ConfigVersion)
#
# Usage: ffi-c/install.sh PREFIX [--debug] [--no-build]
#   --debug     install the debug build (target/debug) instead of release
#   --no-build  install what is already built
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"

prefix="" profile=release build=1
for arg in "$@"; do
    case "$arg" in
        --debug) profile=debug ;;
        --no-build) build=0 ;;
        -*) echo "unknown option $arg" >&2; exit 2 ;;
        *) prefix="$arg" ;;
    esac
done
[ -n "$prefix" ] || { echo "usage: $0 PREFIX [--debug] [--no-build]" >&2; exit 2; }

if [ "$build" = 1 ]; then
    # The etcd client inside is built from etcd's .proto files.
    command -v protoc >/dev/null || [ -n "${PROTOC:-}" ] || {
        echo "protoc not found: install it (Debian: apt-get install protobuf-compiler) or set PROTOC" >&2
        exit 1
    }
    flags=(-p loadgate-ffi)
    [ "$profile" = release ] && flags+=(--release)
    (cd "$root" && cargo build "${flags[@]}")
fi

target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
libs="$target/$profile"

version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)"
major="${version%%.*}"
# The ABI series: the major version, or major.minor while the major is 0.
if [ "$major" = 0 ]; then series="${version%.*}"; else series="$major"; fi

mkdir -p "$prefix/include" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/loadgate"
prefix="$(cd "$prefix" && pwd)"
install -m 644 "$here/include/loadgate.h" "$prefix/include/loadgate.h"
install -m 755 "$libs/libloadgate.so" "$prefix/lib/libloadgate.so"
install -m 644 "$libs/libloadgate.a" "$prefix/lib/libloadgate.a"
subst() { sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" -e "s|@VERSION_MAJOR@|$major|g" -e "s|@VERSION_SERIES@|$series|g" "$1" > "$2"; }
subst "$here/pkgconfig/loadgate.pc.in" "$prefix/lib/pkgconfig/loadgate.pc"
subst "$here/cmake/loadgateConfig.cmake.in" "$prefix/lib/cmake/loadgate/loadgateConfig.cmake"
subst "$here/cmake/loadgateConfigVersion.cmake.in" "$prefix/lib/cmake/loadgate/loadgateConfigVersion.cmake"
echo "installed loadgate $version ($profile) under $prefix"
