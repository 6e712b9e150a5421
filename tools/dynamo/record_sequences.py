"""Records the ``active_sequences_events`` a Dynamo 1.6.1 KV router publishes
with ``--router-replica-sync``: one ``AddRequest`` per routed request (its
worker and rank, its blocks' hashes, its prefill tokens), the
``MarkPrefillCompleted`` of the router and of the worker, and ``Free``.

Starts nats-server, one mocker worker with two data-parallel ranks and the
frontend (KV router, replica sync on), sends a few completions of different
prompt lengths, streamed and not, and writes every message on that subject
to ``nats/active_sequences.jsonl`` (subject, base64 payload, and the decoded
payload for reading). Run by ``record_fixtures.sh`` with the fixtures'
virtualenv:

    python tools/dynamo/record_sequences.py --out core/tests/fixtures/dynamo-1.6.1
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
import urllib.request
from pathlib import Path

import msgpack

from common import HOST, MODEL
from harness import Loopback, prompt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    lb = Loopback("dynamo-sequences-")
    work, kv, procs, http, recorder, env, common = (
        lb.work, lb.kv, lb.procs, lb.http, lb.recorder, lb.env, lb.common)
    try:
        procs.start("worker", [*lb.mocker, "--data-parallel-size", "2"], env)
        deadline = time.monotonic() + 90
        while not (kv / "v1" / "mdc").exists() or not any((kv / "v1" / "mdc").iterdir()):
            assert time.monotonic() < deadline, f"no model card; logs in {work}"
            time.sleep(0.5)
        procs.start(
            "frontend",
            [sys.executable, "-m", "dynamo.frontend", "--http-host", HOST, "--http-port", str(http), *common,
             "--router-mode", "kv", "--router-replica-sync"],
            env,
        )
        lb.wait_for_model(limit=deadline + 60 - time.monotonic())
        time.sleep(1.0)
        for n, (tokens, stream) in enumerate([(40, False), (100, True), (17, False), (300, True)]):
            body = json.dumps(
                {"model": MODEL, "prompt": prompt(tokens, n), "max_tokens": 3, "stream": stream}
            ).encode()
            request = urllib.request.Request(
                f"http://{HOST}:{http}/v1/completions", data=body,
                headers={"content-type": "application/json"}, method="POST",
            )
            with urllib.request.urlopen(request, timeout=60) as r:
                r.read()
        time.sleep(1.5)
    finally:
        procs.stop_all()
        recorder.close()
    lines = []
    for m in recorder.messages:
        if not m["subject"].endswith(".active_sequences_events"):
            continue
        envelope = msgpack.unpackb(m["payload"], raw=False)
        decoded = msgpack.unpackb(envelope["payload"], raw=False)
        lines.append(
            json.dumps(
                {
                    "subject": m["subject"],
                    "payload_b64": base64.b64encode(m["payload"]).decode(),
                    "decoded": decoded,
                },
                default=str,
            )
        )
    out = args.out / "nats" / "active_sequences.jsonl"
    out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} active_sequences_events -> {out}")


if __name__ == "__main__":
    main()
