#!/usr/bin/env bash
# Builds the Python module the way users do (`pip install ./python`) into a
# virtualenv and runs its tests. Needs only python3 (with venv and pip), Rust
# and PyPI; installs the test tools itself.
# Usage: python/tests/run.sh [pytest arguments...]  (test files or node ids
#   given run alone; with options only, the whole suite runs)
#   LOADGATE_VENV=/path  virtualenv to use (default python/.venv, created if missing)
#   PYTHON=python3.X     interpreter that creates it
set -euo pipefail
pkg="$(cd "$(dirname "$0")/.." && pwd)"
root="$(cd "$pkg/.." && pwd)"
venv="${LOADGATE_VENV:-$pkg/.venv}"

# nats-server and etcd for the tests; protoc to build the module's etcd
# client (etcd-client compiles etcd's .proto files).
missing=()
command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || missing+=(nats-server)
command -v etcd >/dev/null || missing+=(etcd-server)
command -v etcdctl >/dev/null || missing+=(etcd-client)
command -v protoc >/dev/null || missing+=(protobuf-compiler)
if [ "${#missing[@]}" -gt 0 ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install --quiet --disable-pip-version-check \
    "maturin>=1.5,<2" "pytest>=7.4,<10" "pytest-timeout>=2.1,<3" "httpx>=0.24,<1" \
    "uvicorn>=0.23,<1" "prometheus_client>=0.17,<1" "mypy>=1.8,<3" \
    "cryptography>=41" \
    "fastapi>=0.115,<1" "openai>=1.40,<4" "anthropic>=0.50,<3"
# cryptography: test_nats_auth.py makes its CA and server certificate.
# fastapi, openai, anthropic: test_frameworks.py serves a FastAPI app to the
# official clients.

cd "$root"
start=$SECONDS
"$py" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps ./python
echo "pip install ./python: $((SECONDS - start)) s"

# From the repository root, so that the source tree's loadgate/ (which has no
# native module) is not importable in place of the installed package.
start=$SECONDS
set +e
# Test files or node ids given run alone; options alone run the whole suite.
targets=(python/tests)
for arg in "$@"; do
    case "$arg" in
        -*) ;;
        *) targets=() ;;
    esac
done
"$py" -m pytest -c python/pyproject.toml "${targets[@]}" "$@"
status=$?
set -e
echo "pytest: $((SECONDS - start)) s"
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing on purpose" >&2
    exit 1
fi
exit "$status"
