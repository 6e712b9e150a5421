#!/usr/bin/env bash
# Runs the threaded Rust stress tests under ThreadSanitizer.
#
# Usage: ci/sanitize.sh
#
# core/tests/monitor_stress.rs (reporters, a booking router and selectors on
# one model) and core/tests/gate_stress.rs (4 threads admitting, holding,
# releasing and cancelling on one gate) run with every crate, std included,
# rebuilt with -Zsanitizer=thread (-Zbuild-std: an uninstrumented std hides
# the happens-before edges of its own atomics and reports false races). A
# data race, or a lock-order inversion, fails the run.
#
# The tests run at their full size (200,000 monitor iterations, 10^6 gate
# operations); their own variables change it:
#   LOADGATE_STRESS_ITERATIONS=20000 LOADGATE_STRESS_OPS=100000 ci/sanitize.sh
#
# -Zbuild-std needs the source of the very std the compiler was built with.
# The toolchain is the first of:
#   1. a rustup nightly toolchain with the rust-src component;
#   2. the rustup default toolchain with rust-src, with RUSTC_BOOTSTRAP=1;
#   3. Debian's packages, installed with apt-get when missing (with sudo when
#      not root): rustc-web, cargo-web and rust-web-src, one Rust release
#      built from one source (the compiler at /usr/bin/rustc, its cargo, and
#      that source under $(rustc --print sysroot)/lib/rustlib/src/rust,
#      where -Zbuild-std looks), used with RUSTC_BOOTSTRAP=1; and
#      libclang-rt-N-dev, N being the LLVM major version that compiler is
#      built on, for the ThreadSanitizer runtime, which Debian's rustc does
#      not ship. rustc links the runtime from its sysroot under the name
#      librustc-stable_rt.tsan.a, so target/tsan/tsan-sysroot holds only a
#      link by that name to LLVM's libclang_rt.tsan, and the instrumented
#      crates are built with --sysroot pointing there (std itself comes from
#      -Zbuild-std, never from a sysroot).
# The machines that run this reach only the package registries, so a rustup
# component cannot be fetched; Debian's packages can. std's own dependencies
# come from crates.io. The first run builds std and every dependency with
# instrumentation (about 10 min in all on 2 cores); later runs reuse
# target/tsan (about 1 min at full size).
#
# Skipped, with the reason, on anything but x86_64 Linux.
set -euo pipefail
cd "$(dirname "$0")/.."

note() { printf '  [tsan] %s\n' "$*"; }
start=$SECONDS
target=x86_64-unknown-linux-gnu
on_exit() {
    local rc=$?
    [ "$rc" -eq 0 ] || note "FAILED (exit $rc) after $((SECONDS - start))s"
}
trap on_exit EXIT

if [ "$(uname -m)" != x86_64 ] || [ "$(uname -s)" != Linux ]; then
    note "SKIPPED: ThreadSanitizer runs here on x86_64 Linux only" \
        "(this is $(uname -s) $(uname -m))"
    exit 0
fi

# Its own target directory: instrumented artifacts never mix with the
# normal ones, and repeated runs rebuild only what changed.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/tsan"
case $CARGO_TARGET_DIR in /*) ;; *) CARGO_TARGET_DIR="$PWD/$CARGO_TARGET_DIR" ;; esac

# --- Debian's toolchain -------------------------------------------------------
apt_updated=
apt_install() {
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || {
            note "cannot install $* from Debian: not root and no sudo" >&2
            return 1
        }
        sudo=(sudo)
    fi
    command -v apt-get >/dev/null || {
        note "cannot install $*: no apt-get (not Debian). Install a rustup" >&2
        note "nightly with rust-src instead and re-run:" >&2
        note "  rustup toolchain install nightly --component rust-src" >&2
        return 1
    }
    note "installing from Debian: $*"
    if [ -z "$apt_updated" ]; then
        # The current rustc-web is in bookworm-security: the lists must be fresh.
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -qq update ||
            note "apt-get update reported errors; trying the install anyway"
        apt_updated=1
    fi
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get -qq -y -o Dpkg::Use-Pty=0 install --no-install-recommends "$@" >/dev/null
}
deb_version() {
    { dpkg-query -W -f='${Status} ${Version}' "$1" 2>/dev/null || true; } |
        sed -n 's/^install ok installed //p'
}
same_rust_versions() {
    v=$(deb_version rustc-web)
    [ -n "$v" ] && [ "$(deb_version cargo-web)" = "$v" ] && [ "$(deb_version rust-web-src)" = "$v" ]
}

debian_toolchain() {
    local v llvm rt_pkg rt sym
    # The compiler, its cargo and its std source: present and of one version,
    # or installed together.
    if ! same_rust_versions; then
        apt_install rustc-web cargo-web rust-web-src
        same_rust_versions || {
            note "rustc-web, cargo-web and rust-web-src differ in version after the install" >&2
            return 1
        }
    fi
    export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1
    cargo_cmd=(/usr/bin/cargo)

    local src
    src="$("$RUSTC" --print sysroot)/lib/rustlib/src/rust/library"
    [ -d "$src/std" ] || { note "no std source at $src (rust-web-src $v)" >&2; return 1; }

    llvm=$("$RUSTC" -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
    rt_pkg="libclang-rt-$llvm-dev"
    [ -n "$(deb_version "$rt_pkg")" ] || apt_install "$rt_pkg"
    rt=$(dpkg -L "$rt_pkg" | grep -E '/libclang_rt\.tsan-x86_64\.a$|/x86_64[^/]*/libclang_rt\.tsan\.a$' | head -n1)
    [ -n "$rt" ] || { note "no ThreadSanitizer runtime in $rt_pkg" >&2; return 1; }

    local libdir="$CARGO_TARGET_DIR/tsan-sysroot/lib/rustlib/$target/lib"
    mkdir -p "$libdir"
    ln -sfn "$rt" "$libdir/librustc-stable_rt.tsan.a"
    extra_flags=("--sysroot=$CARGO_TARGET_DIR/tsan-sysroot")

    # Debian's runtime looks for llvm-symbolizer-N only; name the one there is
    # (installing llvm-N for it when there is none), so reports have lines.
    for sym in "llvm-symbolizer-$llvm" "/usr/lib/llvm-$llvm/bin/llvm-symbolizer" llvm-symbolizer; do
        sym=$(command -v "$sym") && break
    done
    if [ -z "$sym" ]; then
        apt_install "llvm-$llvm"
        sym=$(command -v "llvm-symbolizer-$llvm" || true)
    fi
    [ -z "$sym" ] || symbolizer="external_symbolizer_path=$sym"

    toolchain_desc="$("$RUSTC" --version), $(/usr/bin/cargo --version) (Debian rustc-web,"
    toolchain_desc+=" cargo-web, rust-web-src $v; RUSTC_BOOTSTRAP=1); std source $src;"
    toolchain_desc+=" runtime $rt ($rt_pkg $(deb_version "$rt_pkg")); symbolizer $sym"
}

# --- pick the toolchain -------------------------------------------------------
# A rustup toolchain fits if it has rust-src and its own ThreadSanitizer runtime.
has_src() {
    local sysroot
    sysroot=$(rustc "$@" --print sysroot) &&
        [ -d "$sysroot/lib/rustlib/src/rust/library" ] &&
        compgen -G "$sysroot/lib/rustlib/$target/lib/librustc-*_rt.tsan.a" >/dev/null
}
cargo_cmd=(cargo) extra_flags=() symbolizer="" toolchain_desc=""
if command -v rustup >/dev/null && grep -q '^nightly' <<<"$(rustup toolchain list 2>/dev/null)" &&
    has_src +nightly; then
    cargo_cmd=(cargo +nightly)
    toolchain_desc="$(rustc +nightly --version) (rustup nightly with rust-src)"
elif command -v rustc >/dev/null && has_src; then
    export RUSTC_BOOTSTRAP=1
    toolchain_desc="$(rustc --version) (rustup default with rust-src; RUSTC_BOOTSTRAP=1)"
else
    note "no rustup toolchain with rust-src: using Debian's rustc-web with its std source"
    debian_toolchain
fi
note "toolchain: $toolchain_desc"
note "setup took $((SECONDS - start))s"

note "monitor iterations: ${LOADGATE_STRESS_ITERATIONS:-200000 (default)}," \
    "gate operations: ${LOADGATE_STRESS_OPS:-1000000 (default)}"

# halt_on_error: the first report fails the test binary (exit 66), with both
# stacks of the race printed.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 $symbolizer ${TSAN_OPTIONS:-}"
# (Encoded: one flag per field, so a path with spaces stays one flag.)
rustflags=(-Zsanitizer=thread "${extra_flags[@]}")
encoded=$(IFS=$'\x1f'; echo "${rustflags[*]}")
CARGO_ENCODED_RUSTFLAGS=$encoded CARGO_ENCODED_RUSTDOCFLAGS=$encoded \
    "${cargo_cmd[@]}" test -Zbuild-std --target "$target" -p loadgate \
    --test monitor_stress --test gate_stress

note "ThreadSanitizer found no data race (${toolchain_desc%%,*}; $((SECONDS - start))s in all)"
