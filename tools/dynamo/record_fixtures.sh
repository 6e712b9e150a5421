#!/usr/bin/env bash
# Records the Dynamo 1.6.1 fixtures in core/tests/fixtures/dynamo-1.6.1/.
#
# Makes a scratch virtualenv outside the repository (DYNAMO_VENV, default
# /tmp/dynamo-venv) with ai-dynamo and ai-dynamo-runtime 1.6.1 installed
# without their dependency list, plus only the packages the frontend and the
# mocker import; installs nats-server and etcd-server from Debian when they
# are missing; then runs record_fixtures.py twice: with the KV router (the
# full fixture set) and with the round-robin router (answers, metric lines
# and NATS counts only); record_etcd.py (a worker's etcd records),
# record_sequences.py (a replica-synced router's bookings),
# record_sequences_multitoken.py (the same with two workers and long answers)
# and replica_inject.py (bookings published by a third party, and their expiry).
#
# Usage: tools/dynamo/record_fixtures.sh [extra record_fixtures.py flags]
# Nothing is downloaded but packages: the tokenizer is made locally.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/core/tests/fixtures/dynamo-1.6.1"
venv="${DYNAMO_VENV:-/tmp/dynamo-venv}"
python="${PYTHON:-python3}"

# ai-dynamo declares heavy dependencies (kubernetes, transformers, aisimulate,
# ...) that the frontend and the mocker do not import on this path; aisimulate
# cannot be installed here at all. So: --no-deps, then what the imports need.
# pydantic is capped as ai-dynamo-runtime 1.6.1 requires.
deps=(
    "pydantic>=2.10.6,<=2.13.5" uvloop packaging msgspec "prometheus-client>=0.23.1,<1.0"
    "aiohttp>=3.14.3,<4.0" pyzmq tqdm "zstandard>=0.23,<1.0" pyyaml
    tokenizers msgpack
)
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import dynamo.frontend, dynamo.mocker, tokenizers' 2>/dev/null \
    || [ "$("$venv/bin/python" -c 'from importlib.metadata import version; print(version("ai-dynamo"))' 2>/dev/null)" != "1.6.1" ]; then
    "$venv/bin/pip" install --quiet --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1
    "$venv/bin/pip" install --quiet "${deps[@]}"
fi

if ! command -v nats-server >/dev/null || ! command -v etcd >/dev/null; then
    apt-get update -qq && apt-get install -y -qq nats-server etcd-server etcd-client
fi

"$venv/bin/python" "$here/record_fixtures.py" --out "$out" "$@"
"$venv/bin/python" "$here/record_fixtures.py" --out "$out/router-round-robin" \
    --router-mode round-robin --lite "$@"
(cd "$here" && "$venv/bin/python" record_etcd.py --out "$out")
(cd "$here" && "$venv/bin/python" record_sequences.py --out "$out")
(cd "$here" && "$venv/bin/python" record_sequences_multitoken.py --out "$out")
(cd "$here" && "$venv/bin/python" replica_inject.py --out "$out")
(cd "$here" && "$venv/bin/python" replica_inject.py --out "$out" --expiry-secs 10)
(cd "$here" && "$venv/bin/python" replica_inject.py --out "$out" --expiry-secs 10 --keepalive-secs 4)
echo "fixtures written to $out ($(du -sh "$out" | cut -f1))"
