#!/usr/bin/env bash
# C-vs-Rust timing of the hot paths. Builds libloadgate (release), the C
# timing program against it (-O2; linked to the shared and to the static
# library) and the Rust example that makes the same calls on the core crate;
# runs the three in turn ROUNDS times (default 5) and keeps each one's best
# ns of thread CPU time per call, so other load on the machine does not
# decide the ratio; prints the table.
#
# Usage: ffi-c/bench/run.sh [iterations] [rounds]   (default 2000000 5)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ffi="$(cd "$here/.." && pwd)"
root="$(cd "$ffi/.." && pwd)"
iters="${1:-2000000}"
rounds="${2:-5}"
work="$(mktemp -d "${TMPDIR:-/tmp}/loadgate-bench.XXXXXX")"
trap 'rm -rf "$work"' EXIT

"$ffi/install.sh" "$work/prefix" >/dev/null
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
libdir="$(pkg-config --variable=libdir loadgate)"
gcc -std=c11 -O2 -Wall -Wextra -Wpedantic -Werror -o "$work/c-so" "$here/timing.c" \
    $(pkg-config --cflags --libs loadgate) -Wl,-rpath,"$libdir"
gcc -std=c11 -O2 -Wall -Wextra -Wpedantic -Werror -o "$work/c-a" "$here/timing.c" \
    $(pkg-config --cflags loadgate) -L"$libdir" -l:libloadgate.a \
    $(pkg-config --static --libs-only-l loadgate | sed 's/-lloadgate//') -pthread
(cd "$root" && cargo build --release -q -p loadgate-ffi --example timing)
cp "${CARGO_TARGET_DIR:-$root/target}/release/examples/timing" "$work/rust"

for _ in $(seq "$rounds"); do
    for prog in rust c-so c-a; do
        "$work/$prog" "$iters" >> "$work/$prog.txt"
    done
done

best() { awk -v k="$2" '$1 == k { if (m == "" || $2 < m) m = $2 } END { print m }' "$work/$1.txt"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
printf '%-30s %9s %9s %9s %9s %9s\n' "best ns per call" "rust" "c (.so)" "c (.a)" ".so/rust" ".a/rust"
for k in select try_admit+release; do
    r="$(best rust "$k")" s="$(best c-so "$k")" a="$(best c-a "$k")"
    printf '%-30s %9s %9s %9s %9s %9s\n' "$k" "$r" "$s" "$a" "$(ratio "$s" "$r")" "$(ratio "$a" "$r")"
done
printf '%-30s %9s   (rust only: permit borrowed from the gate)\n' \
    "try_admit+release(borrowed)" "$(best rust "try_admit+release(borrowed)")"
