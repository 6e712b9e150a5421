#!/usr/bin/env bash
# The C ABI test suite: header drift, then the C11 API program (tests/c/*.c:
# api.c's main() and the groups of tests beside it) and the C++17 threaded
# program, built against an installed copy of libloadgate through
# pkg-config (and CMake), with -Wall -Wextra -Wpedantic -Werror, run plain,
# under valgrind memcheck and built with -fsanitize=address,undefined.
# The C11 program's NATS round trip runs against a nats-server this script
# starts on a free loopback port (LG_NATS_URL), and its authentication check
# against a second one that wants user "loadgate", password "s3cret"
# (LG_NATS_AUTH_URL); both are stopped on exit.
#
# Usage: ffi-c/tests/run.sh [--install | --install-only]
#   --install       install missing tools first (cbindgen from crates.io;
#                   valgrind, pkg-config, cmake, libasan/libubsan, nats-server
#                   from Debian), then run.
#   --install-only  install them and stop (ci/test.sh does this before
#                   `cargo test`, whose tests/c_suite.rs runs this script).
#   without either, a missing tool skips its step with a note (this is how
#   `cargo test -p loadgate-ffi` runs the suite), unless LOADGATE_NO_SKIP=1
#   is set, which makes a skipped step fail the suite (CI sets it); a failing
#   step always fails.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ffi="$(cd "$here/.." && pwd)"
root="$(cd "$ffi/.." && pwd)"
cd "$root"

CBINDGEN_VERSION=0.29.4
install=0 install_only=0
case "${1:-}" in
    --install) install=1 ;;
    --install-only) install=1 install_only=1 ;;
    "") ;;
    *) echo "usage: $0 [--install | --install-only]" >&2; exit 2 ;;
esac

note() { printf '  [ffi-c] %s\n' "$*"; }
skipped=()
skip() { skipped+=("$1"); note "SKIPPED: $1"; }
have() { command -v "$1" >/dev/null 2>&1; }
apt_install() {
    [ "$install" = 1 ] || return 1
    note "installing Debian packages: $*"
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    if [ -z "${apt_updated:-}" ]; then $sudo apt-get update -qq >/dev/null; apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}
start=$SECONDS
step() { printf '  [ffi-c] == %s (%ss)\n' "$*" "$((SECONDS - start))"; }

# ---- tools ------------------------------------------------------------------
cbindgen_ok() { have cbindgen && [ "$(cbindgen --version)" = "cbindgen $CBINDGEN_VERSION" ]; }
if ! cbindgen_ok && [ "$install" = 1 ]; then
    note "installing cbindgen $CBINDGEN_VERSION"
    cargo install cbindgen --locked --version "$CBINDGEN_VERSION" --force --quiet
fi
have valgrind || apt_install valgrind || true
have pkg-config || apt_install pkg-config || true
have cmake || apt_install cmake || true
have g++ || apt_install g++ || true
have nats-server || apt_install nats-server || true
# The library's etcd discovery (etcd-client) is built from .proto files, and
# its tests run against a real etcd.
have protoc || apt_install protobuf-compiler || true
have etcd || apt_install etcd-server || true
have etcdctl || apt_install etcd-client || true
sanitizers_ok() {
    echo 'int main(void){return 0;}' > "$work/san.c"
    gcc -fsanitize=address,undefined "$work/san.c" -o "$work/san" >/dev/null 2>&1 && "$work/san"
}

work="$(mktemp -d "${TMPDIR:-/tmp}/loadgate-ffi.XXXXXX")"
nats_pids=()
cleanup() {
    for pid in "${nats_pids[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT
if ! sanitizers_ok; then
    apt_install libasan8 libubsan1 || true
fi
if [ "$install_only" = 1 ]; then
    note "tools installed"
    exit 0
fi

# ---- header drift -----------------------------------------------------------
step "header matches cbindgen $CBINDGEN_VERSION output"
if cbindgen_ok; then
    cbindgen --quiet --config "$ffi/cbindgen.toml" --crate loadgate-ffi \
        --output "$work/loadgate.h" "$ffi"
    if ! diff -u "$ffi/include/loadgate.h" "$work/loadgate.h"; then
        echo "ffi-c/include/loadgate.h is stale; regenerate it with:" >&2
        echo "  cbindgen --config ffi-c/cbindgen.toml --crate loadgate-ffi --output ffi-c/include/loadgate.h ffi-c" >&2
        exit 1
    fi
else
    skip "header drift check (needs cbindgen $CBINDGEN_VERSION: cargo install cbindgen --locked --version $CBINDGEN_VERSION)"
fi

# The C11 program's sources: api.c (main) and every other .c file beside it,
# each a group of tests, over check.h and check.c.
api_src=("$here"/c/*.c)

# Every function the header declares is called by the C11 program.
missing=0
for fn in $(sed -n 's/^[a-z].*[ *]\(lg_[a-z_]*\)(.*/\1/p' "$ffi/include/loadgate.h"); do
    if ! grep -q "\b$fn(" "${api_src[@]}"; then
        echo "tests/c/*.c never call $fn" >&2
        missing=1
    fi
done
[ "$missing" = 0 ] || exit 1

# ---- build and install --------------------------------------------------------
step "build libloadgate and install it into a scratch prefix"
"$ffi/install.sh" "$work/prefix" --debug
have pkg-config || { echo "pkg-config is required (apt-get install pkg-config)" >&2; exit 1; }
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
cflags="$(pkg-config --cflags loadgate)"
libs="$(pkg-config --libs loadgate)"
libdir="$(pkg-config --variable=libdir loadgate)"
static_libs="$(pkg-config --static --libs-only-l loadgate | sed 's/-lloadgate//')"
warn=(-Wall -Wextra -Wpedantic -Werror -g)
c_std=(-std=c11)
cxx_std=(-std=c++17)

build() { # build NAME COMPILER FLAGS... -- SOURCES...
    local name="$1" cc="$2"; shift 2
    local flags=()
    while [ "$1" != -- ]; do flags+=("$1"); shift; done
    shift
    "$cc" "${flags[@]}" -o "$work/$name" "$@" $cflags $libs -Wl,-rpath,"$libdir" -pthread
}

step "compile (pkg-config: $cflags $libs)"
build api gcc "${c_std[@]}" "${warn[@]}" -O1 -- "${api_src[@]}"
build threads g++ "${cxx_std[@]}" "${warn[@]}" -O1 -- "$here/c/threads.cpp"
# The static library links on its own too.
gcc "${c_std[@]}" "${warn[@]}" -O1 -o "$work/api-static" "${api_src[@]}" $cflags \
    -L"$libdir" -l:libloadgate.a $static_libs -pthread
if ldd "$work/api-static" | grep -q libloadgate; then
    echo "api-static is linked to the shared library" >&2
    exit 1
fi

# ---- nats-server ----------------------------------------------------------------
# start_nats NAME [nats-server options...]: a server on a port the kernel
# picks (-p -1), read back from the ports file into $nats_url.
start_nats() {
    local name="$1" dir="$work/$1"; shift
    mkdir -p "$dir"
    nats-server -a 127.0.0.1 -p -1 --ports_file_dir "$dir" -l "$dir/log" "$@" &
    local pid=$!
    nats_pids+=("$pid")
    local ports="$dir/nats-server_$pid.ports"
    for _ in $(seq 100); do
        [ -s "$ports" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    nats_url="$(sed -n 's/.*"\(nats:\/\/[^"]*\)".*/\1/p' "$ports" 2>/dev/null || true)"
    if [ -z "$nats_url" ]; then
        cat "$dir/log" >&2 || true
        echo "nats-server did not start" >&2
        exit 1
    fi
    note "nats-server $name (pid $pid) at $nats_url"
}
if have nats-server; then
    step "start nats-servers on free loopback ports"
    start_nats nats
    export LG_NATS_URL="$nats_url"
    start_nats nats-auth --user loadgate --pass s3cret
    export LG_NATS_AUTH_URL="$nats_url"
else
    skip "NATS round trip (apt-get install nats-server)"
fi

# ---- etcd ------------------------------------------------------------------------
# One etcd on free loopback ports, holding the model card a Dynamo 1.6.1
# worker wrote to etcd (the recorded fixture); the C11 program learns its
# worker from it.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
if have etcd && have etcdctl; then
    step "start etcd on free loopback ports"
    etcd_client="http://127.0.0.1:$(free_port)"
    etcd_peer="http://127.0.0.1:$(free_port)"
    etcd --data-dir "$work/etcd" --name default --listen-client-urls "$etcd_client" \
        --advertise-client-urls "$etcd_client" --listen-peer-urls "$etcd_peer" \
        --initial-advertise-peer-urls "$etcd_peer" --initial-cluster "default=$etcd_peer" \
        >"$work/etcd.log" 2>&1 &
    nats_pids+=("$!")
    for _ in $(seq 200); do
        ETCDCTL_API=3 etcdctl --endpoints "$etcd_client" endpoint health >/dev/null 2>&1 && break
        sleep 0.05
    done
    card="$(python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))["while_running"]
c = next(x for x in r if x["key"].startswith("v1/mdc/"))
print(c["key"]); print(c["value"]); print(int(c["key"].rsplit("/", 1)[1], 16))' "$ffi/../core/tests/fixtures/dynamo-1.6.1/discovery/etcd/records.json")"
    ETCDCTL_API=3 etcdctl --endpoints "$etcd_client" put "$(sed -n 1p <<<"$card")" "$(sed -n 2p <<<"$card")" >/dev/null
    export LG_ETCD_URL="$etcd_client"
    LG_ETCD_WORKER="$(sed -n 3p <<<"$card")"
    export LG_ETCD_WORKER
    note "etcd at $etcd_client with worker $LG_ETCD_WORKER's card"
else
    skip "etcd discovery (apt-get install etcd-server etcd-client)"
fi

step "run"
"$work/api"
"$work/api-static"
"$work/threads"

# ---- valgrind -------------------------------------------------------------------
if have valgrind; then
    step "valgrind memcheck"
    vg=(valgrind --quiet --fair-sched=yes --error-exitcode=1 --leak-check=full --show-leak-kinds=definite,indirect
        --errors-for-leak-kinds=definite,indirect --track-origins=yes)
    "${vg[@]}" "$work/api"
    # The threaded program's NATS part runs plain and under ASan, not here:
    # valgrind runs one thread at a time, ~50x slower, which starves the
    # reporters' 1 s heartbeats past the subscription's 3 s expiry. The C11
    # program's NATS round trip above covers those calls under memcheck.
    LG_STRESS_ROUNDS=300 LG_NATS_URL= "${vg[@]}" "$work/threads"
else
    skip "valgrind (apt-get install valgrind)"
fi

# ---- sanitizers -------------------------------------------------------------------
if sanitizers_ok; then
    step "ASan + UBSan"
    san=(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
    build api-asan gcc "${c_std[@]}" "${warn[@]}" -O1 "${san[@]}" -- "${api_src[@]}"
    build threads-asan g++ "${cxx_std[@]}" "${warn[@]}" -O1 "${san[@]}" -- "$here/c/threads.cpp"
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    "$work/api-asan"
    LG_STRESS_ROUNDS=1000 "$work/threads-asan"
    unset ASAN_OPTIONS UBSAN_OPTIONS
else
    skip "ASan + UBSan (apt-get install libasan8 libubsan1)"
fi

# ---- CMake consumer -----------------------------------------------------------------
if have cmake; then
    step "CMake find_package(loadgate)"
    cmake -S "$here/cmake" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$work/prefix" \
        -DLOADGATE_TEST_SOURCE="$(IFS=';'; echo "${api_src[*]}")" >/dev/null
    cmake --build "$work/cmake-build" >/dev/null
    "$work/cmake-build/api-cmake"
    "$work/cmake-build/api-cmake-static"
else
    skip "CMake consumer (apt-get install cmake)"
fi

step "done"
if [ "${#skipped[@]}" -gt 0 ]; then
    note "passed, with ${#skipped[@]} step(s) skipped: ${skipped[*]}"
    if [ "${LOADGATE_NO_SKIP:-0}" = 1 ]; then
        echo "LOADGATE_NO_SKIP=1: no step may be skipped (install the tools with ffi-c/tests/run.sh --install-only)" >&2
        exit 1
    fi
else
    note "all steps passed"
fi
