#!/usr/bin/env bash
# Runs every loadgate check and test, installing what they need first.
# Usage: ./ci/test.sh            (the README's test command; CI runs it too)
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage prints the run's elapsed seconds, so a slow stage shows.
step() { printf '\n==> %s  [%d s]\n' "$*" "$SECONDS"; }

# With LOADGATE_PRUNE_TARGETS=1 (CI sets it), a stage's own target directory
# is deleted once the stage has passed, so the run's peak disk use stays low.
prune() {
    if [ "${LOADGATE_PRUNE_TARGETS:-0}" = 1 ]; then
        rm -rf "$@"
        echo "  pruned $*; $(df -h --output=avail . | tail -1 | tr -d ' ') free"
    fi
}

step "toolchain"
echo "disk: $(df -h --output=avail . | tail -1 | tr -d ' ') free"
if ! command -v cargo >/dev/null; then
    echo "cargo not found: install Rust from https://rustup.rs first" >&2
    exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo --version

# The tools the tests run against: nats-server, etcd, valgrind, pkg-config,
# cmake, the sanitizer runtimes, protoc (for the etcd client's build; Debian
# packages) and cbindgen (crates.io).
step "test tools: nats-server, etcd, protoc, valgrind, cmake, cbindgen, ..."
./ffi-c/tests/run.sh --install-only

step "format"
cargo fmt --all -- --check

step "lint"
cargo clippy --workspace --all-targets --features loadgate/nats,loadgate/scrape,loadgate/etcd -- -D warnings

# No broken or private links in the crate's docs. The README's Rust code runs
# as doctests in the next step (core/src/lib.rs includes it under cfg(doctest)).
step "API docs"
RUSTDOCFLAGS="-D warnings" cargo doc -p loadgate --no-deps --features nats,scrape,etcd

# Includes the C ABI suite (ffi-c/tests/run.sh via tests/c_suite.rs): header
# drift check, then the C11 and C++17 programs built through pkg-config and
# CMake, run plain, under valgrind memcheck and with ASan+UBSan.
step "unit, integration, differential, stress, nats-server and C ABI tests"
LOADGATE_NO_SKIP=1 cargo test --workspace --features loadgate/nats,loadgate/scrape,loadgate/etcd

step "loom models (release, LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:=2})"
CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS \
    cargo test -p loadgate --release --lib --test loom_gate --test loom_gate_counted --test loom_monitor --test loom_flow
prune target/loom


# ---- benches -----------------------------------------------------------------
# The criterion benches must compile and `compare` must run in its short mode
# (seconds). Timings are printed, never asserted; compare fails only when a
# loadgate hot path allocated. Release profile, shared with the main job.
step "benches: compile; compare --quick"
cargo bench --no-run -p loadgate-benches
cargo run --release -p loadgate-benches --bin compare -- --quick
# ---- end benches -------------------------------------------------------------

# ---- overload lab (benches/lab) ----------------------------------------------
# The emulator's tests ran with the workspace above. The whole matrix in its
# short mode (seconds of virtual-time simulation): it fails if any run's
# accounting does not balance. It writes into target/, never over the
# committed docs/overload.md (a full run does: cargo run --release -p loadgate-lab).
# Builds the `engine` binary too (the emulator over HTTP), which the Python
# suite's test_lab_engine.py drives.
step "overload lab --quick"
cargo build --release -p loadgate-lab
cargo run --release -p loadgate-lab -- --quick --docs target/lab-quick \
    --json target/lab-quick/overload.json
# Booking sync at fleet scale (docs/replicas.md, "Traffic and cost"), short:
# it fails if an admission breaks shared mode's bound, a leased frontend books
# past a line, or whole states go out with the changes.
cargo run --release -p loadgate-lab --bin sync-scale -- --quick
cargo run --release -p loadgate-lab --bin sync-scale -- --quick --mode leased --workers 8,64
# ---- end overload lab --------------------------------------------------------

# ---- Python module (python/) -------------------------------------------------
# `pip install ./python` (maturin, abi3 wheel) into python/.venv, then pytest:
# API and bad input, asyncio and threads, real HTTP (uvicorn + httpx), env
# vars in subprocesses, stubtest. Installs its tools from PyPI.
step "Python module: pip install ./python; pytest"
./python/tests/run.sh
# ---- end Python module -------------------------------------------------------

# ---- fuzzing and ThreadSanitizer ---------------------------------------------
# Every fuzz target for 30 s (FUZZ_SECONDS), one per core at a time, from its committed seeds
# (cargo-fuzz on nightly, installed from crates.io when missing), then the
# threaded stress tests under ThreadSanitizer with an instrumented std.
# docs/verification.md lists every check.
step "fuzz targets (${FUZZ_SECONDS:=30}s each)"
./ci/fuzz.sh "$FUZZ_SECONDS"
# cargo-fuzz builds in fuzz/target unless CARGO_TARGET_DIR moves it.
[ -n "${CARGO_TARGET_DIR:-}" ] || prune fuzz/target
step "ThreadSanitizer: threaded stress tests"
./ci/sanitize.sh
prune "${CARGO_TARGET_DIR:-target}/tsan"
# ---- end fuzzing and ThreadSanitizer -----------------------------------------

step "main job"
cargo run --release --example overload >/dev/null
echo "example ran"
# A frontend shedding in front of simulated engines that only expose
# /metrics; exits 1 if the overload was not shed (its real-time checks are
# printed; they fail the run only with --strict).
cargo run --release -p loadgate --features scrape --example scrape_demo -- --quick
echo "scrape demo ran"
step "done"
