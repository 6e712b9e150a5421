#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for the same time each.
#
# Usage: ci/fuzz.sh [seconds-per-target]     (default 30; CI uses the default)
#        FUZZ_TARGETS="gate_ops wire_decode" ci/fuzz.sh 300   (a subset)
#        FUZZ_JOBS=1 ci/fuzz.sh              (one target at a time; default: one per core)
#
# Each target starts from its committed seeds (fuzz/corpus/<target>/, read
# only) plus a scratch corpus that is thrown away, so the work tree stays
# clean. A crash, a panic (every assertion in a target is a differential or
# robustness check), a leak or a hang fails the run; the input is kept under
# fuzz/artifacts/<target>/ and the script prints how to replay it. Every
# target runs even after one fails.
#
# Needs a nightly toolchain (libFuzzer's instrumentation flags are unstable).
# Without one, the stable toolchain is used with RUSTC_BOOTSTRAP=1, which
# unlocks the same flags; its AddressSanitizer runtime ships with it.
# Installs cargo-fuzz from crates.io when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-30}"
case "$seconds" in
'' | *[!0-9]*)
    echo "usage: ci/fuzz.sh [seconds-per-target]" >&2
    exit 2
    ;;
esac

note() { printf '  [fuzz] %s\n' "$*"; }
start=$SECONDS

if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    toolchain=(+nightly)
    note "toolchain: $(rustc +nightly --version)"
else
    toolchain=()
    export RUSTC_BOOTSTRAP=1
    note "no nightly toolchain: using $(rustc --version) with RUSTC_BOOTSTRAP=1"
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    note "installing cargo-fuzz (crates.io)"
    cargo install cargo-fuzz --locked --quiet
fi
note "$(cargo fuzz --version)"

cd fuzz
# One cargo invocation builds every target (release, debug assertions on,
# AddressSanitizer, libFuzzer coverage).
build_start=$SECONDS
cargo "${toolchain[@]}" fuzz build
note "built every target in $((SECONDS - build_start))s"

if [ -n "${FUZZ_TARGETS:-}" ]; then
    read -r -a targets <<<"$FUZZ_TARGETS"
else
    mapfile -t targets < <(cargo "${toolchain[@]}" fuzz list)
fi

scratch="$(mktemp -d "${TMPDIR:-/tmp}/loadgate-fuzz.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT

# Runs target $1 for $seconds; writes its summary line to $scratch/$1.result
# and, on failure, its libFuzzer output and how to replay it to
# $scratch/$1.failed.
run_target() {
    local t=$1 log="$scratch/$1.log" t0=$SECONDS
    mkdir -p "$scratch/$t" "corpus/$t"
    # -timeout: one input running over 10 s counts as a hang.
    # -rss_limit_mb: a leak or runaway allocation fails instead of swapping.
    if cargo "${toolchain[@]}" fuzz run "$t" "$scratch/$t" "corpus/$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
        -print_final_stats=1 >"$log" 2>&1; then
        local runs cov
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
        cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
        printf '%-22s ok      %4ss  %9s runs  %s\n' "$t" "$((SECONDS - t0))" "${runs:-?}" "$cov" \
            >"$scratch/$t.result"
    else
        printf '%-22s FAILED  %4ss\n' "$t" "$((SECONDS - t0))" >"$scratch/$t.result"
        {
            echo "---- $t: libFuzzer output (last 60 lines) ----"
            tail -n 60 "$log"
            local artifact
            artifact=$(grep -o 'artifacts/[^ ]*' "$log" | tail -1 || true)
            if [ -n "$artifact" ]; then
                echo "replay: (cd fuzz && cargo +nightly fuzz run $t $artifact)"
                echo "minimize: (cd fuzz && cargo +nightly fuzz tmin $t $artifact)"
            fi
        } >"$scratch/$t.failed"
    fi
}

# libFuzzer runs one process on one core: as many targets at once as there
# are cores (FUZZ_JOBS), each for the whole of its time.
jobs_max="${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}"
case "$jobs_max" in
'' | *[!0-9]* | 0)
    echo "FUZZ_JOBS must be a positive number, not '$jobs_max'" >&2
    exit 2
    ;;
esac
for t in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do
        wait -n || true
    done
    run_target "$t" &
done
wait

failed=()
summary=()
for t in "${targets[@]}"; do
    summary+=("$(cat "$scratch/$t.result")")
    if [ -f "$scratch/$t.failed" ]; then
        failed+=("$t")
        cat "$scratch/$t.failed" >&2
    fi
done

echo
note "${#targets[@]} targets x ${seconds}s, $jobs_max at a time, $((SECONDS - start))s in all"
printf '    %s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzzing failed: ${failed[*]}" >&2
    exit 1
fi
