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
# operations: about 30 s under TSan here); their own variables change it:
#   LOADGATE_STRESS_ITERATIONS=20000 LOADGATE_STRESS_OPS=100000 ci/sanitize.sh
#
# Needs a nightly toolchain with rust-src (for -Zbuild-std). Where there is
# none, the stable toolchain is tried with RUSTC_BOOTSTRAP=1 if it has
# rust-src; otherwise the run is skipped with the reason (no toolchain can be
# fetched on machines that only reach the package registries).
set -euo pipefail
cd "$(dirname "$0")/.."

note() { printf '  [tsan] %s\n' "$*"; }
start=$SECONDS
target=x86_64-unknown-linux-gnu

if [ "$(uname -m)" != x86_64 ] || [ "$(uname -s)" != Linux ]; then
    note "SKIPPED: ThreadSanitizer runs here on x86_64 Linux only"
    exit 0
fi

has_src() { [ -d "$(rustc "$@" --print sysroot)/lib/rustlib/src/rust/library" ]; }
if rustup toolchain list 2>/dev/null | grep -q '^nightly' && has_src +nightly; then
    toolchain=(+nightly)
elif has_src; then
    toolchain=()
    export RUSTC_BOOTSTRAP=1
    note "no nightly toolchain with rust-src: using stable with RUSTC_BOOTSTRAP=1"
else
    note "SKIPPED: ThreadSanitizer needs std rebuilt with instrumentation"
    note "(-Zbuild-std), which needs the rust-src component; neither a nightly"
    note "toolchain with it nor rust-src for $(rustc --version) is installed,"
    note "and toolchains cannot be fetched here. Install one and re-run:"
    note "  rustup toolchain install nightly --component rust-src"
    exit 0
fi
note "toolchain: $(rustc "${toolchain[@]}" --version)"

note "monitor iterations: ${LOADGATE_STRESS_ITERATIONS:-200000 (default)}," \
    "gate operations: ${LOADGATE_STRESS_OPS:-1000000 (default)}"

# halt_on_error: the first report fails the test binary (exit 66), with both
# stacks of the race printed.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
# Its own target directory: instrumented artifacts never mix with the
# normal ones, and repeated runs rebuild only what changed.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/tsan"
RUSTFLAGS="-Zsanitizer=thread" RUSTDOCFLAGS="-Zsanitizer=thread" \
    cargo "${toolchain[@]}" test -Zbuild-std --target "$target" -p loadgate \
    --test monitor_stress --test gate_stress

note "ThreadSanitizer found no data race ($((SECONDS - start))s)"
