#!/usr/bin/env bash
# Runs every loadgate check and test, installing what they need first.
# Usage: ./ci/test.sh            (the README's test command; CI runs it too)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "toolchain"
if ! command -v cargo >/dev/null; then
    echo "cargo not found: install Rust from https://rustup.rs first" >&2
    exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo --version

step "format"
cargo fmt --all -- --check

step "lint"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "unit, integration, differential and stress tests"
cargo test --workspace --locked

step "loom models (release, LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:=2})"
CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS \
    cargo test -p loadgate --release --locked --lib --test loom_gate --test loom_monitor

step "main job"
cargo run --release --locked --example overload >/dev/null
echo "example ran"
