"""Records the ``active_sequences_events`` of a Dynamo 1.6.1 KV router with
``--router-replica-sync`` in front of two mocker workers, under requests whose
answers are many tokens long (a sibling of ``record_sequences.py``, whose
answers are 3 tokens).

Starts nats-server, worker A (one rank) and worker B (two data-parallel
ranks), then the frontend (KV router, replica sync on); sends ~170-token
prompts with 20-40-token answers (completions and chats, streamed and not,
one at a time and several at once) and writes every message on the
``active_sequences_events`` subject to
``sequences-multitoken/active_sequences.jsonl``: subject, base64 payload, the
envelope's fields and the payload decoded, plus ``publisher`` (``router`` or
``worker:A``/``worker:B``, decided by ``router_id``). ``workers.json`` keeps
the worker ids (read from the discovery files as each worker registered), the
router ids seen, and the requests sent; ``counts.json`` the counts per event
kind and publisher. Run with the fixtures' virtualenv, from tools/dynamo:

    python record_sequences_multitoken.py --out ../../core/tests/fixtures/dynamo-1.6.1
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgpack

from common import HOST, MODEL
from harness import Loopback, prompt

SUBJECT_SUFFIX = ".active_sequences_events"
PROMPT_TOKENS = 170


def mdc_ids(kv: Path) -> set[int]:
    """instance_ids of the model cards in the discovery directory."""
    ids = set()
    d = kv / "v1" / "mdc"
    if not d.exists():
        return ids
    for f in d.iterdir():
        try:
            ids.add(int(json.loads(f.read_text())["instance_id"]))
        except (OSError, ValueError, KeyError):
            pass
    return ids


def wait_new_worker(kv: Path, known: set[int], work: Path, timeout=90.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        new = mdc_ids(kv) - known
        if new:
            assert len(new) == 1, new
            return new.pop()
        assert time.monotonic() < deadline, f"no new model card; logs in {work}"
        time.sleep(0.3)


def post(port: int, path: str, body: dict, timeout=120.0) -> dict:
    data = json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://{HOST}:{port}{path}", data=data, headers={"content-type": "application/json"}, method="POST"
    )
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    text = raw.decode("utf-8", "replace")
    out = {"status": status, "elapsed_s": round(time.monotonic() - t, 3)}
    if body.get("stream"):
        chunks = [l for l in text.splitlines() if l.startswith("data: ") and l != "data: [DONE]"]
        out["chunks"] = len(chunks)
        usage = None
        for c in chunks:
            try:
                u = json.loads(c[6:]).get("usage")
            except ValueError:
                continue
            usage = u or usage
        out["usage"] = usage
    else:
        try:
            out["usage"] = json.loads(text).get("usage")
        except ValueError:
            out["body"] = text[:200]
    return out


def request_body(kind: str, n: int, max_tokens: int, stream: bool) -> tuple[str, dict]:
    text = prompt(PROMPT_TOKENS, 100 + n)
    common = {"model": MODEL, "max_tokens": max_tokens, "min_tokens": max_tokens, "ignore_eos": True,
              "stream": stream}
    if stream:
        common["stream_options"] = {"include_usage": True}
    if kind == "chat":
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": text}]}
    return "/v1/completions", {**common, "prompt": text}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path, help="the dynamo-1.6.1 fixtures folder")
    args = parser.parse_args()
    out = args.out / "sequences-multitoken"
    out.mkdir(parents=True, exist_ok=True)
    lb = Loopback("dynamo-seq-multitoken-")
    work, kv, procs, http, recorder, env, common, mocker = (
        lb.work, lb.kv, lb.procs, lb.http, lb.recorder, lb.env, lb.common, lb.mocker)
    workers: dict[str, dict] = {}
    sent: list[dict] = []
    frontend_argv = [sys.executable, "-m", "dynamo.frontend", "--http-host", HOST, "--http-port", str(http),
                     *common, "--router-mode", "kv", "--router-replica-sync"]
    try:
        procs.start("worker-A", mocker, env)
        workers["A"] = {"worker_id": wait_new_worker(kv, set(), work), "data_parallel_size": 1}
        procs.start("worker-B", [*mocker, "--data-parallel-size", "2"], env)
        workers["B"] = {"worker_id": wait_new_worker(kv, {workers["A"]["worker_id"]}, work),
                        "data_parallel_size": 2}
        procs.start("frontend", frontend_argv, env)
        lb.wait_for_model()
        time.sleep(2.0)

        # (kind, max_tokens, stream): first one at a time, then bursts at once.
        plan = [
            [("completion", 24, False)],
            [("completion", 24, True)],
            [("chat", 32, False)],
            [("chat", 32, True)],
            [("completion", 20, False), ("completion", 28, True), ("chat", 24, False), ("chat", 36, True)],
            [("completion", 40, False), ("completion", 40, True), ("completion", 30, False),
             ("chat", 30, True), ("chat", 22, False), ("completion", 26, True)],
        ]
        n = 0
        for group in plan:
            results: list[dict] = [{} for _ in group]
            threads = []
            for i, (kind, max_tokens, stream) in enumerate(group):
                path, body = request_body(kind, n, max_tokens, stream)
                n += 1

                def run(i=i, path=path, body=body, kind=kind, max_tokens=max_tokens, stream=stream):
                    r = post(http, path, body)
                    results[i] = {"kind": kind, "path": path, "stream": stream, "max_tokens": max_tokens,
                                  "prompt_tokens": PROMPT_TOKENS, "concurrent": len(group), **r}

                threads.append(threading.Thread(target=run))
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            sent.extend(results)
            time.sleep(1.0)
        time.sleep(2.0)
    finally:
        procs.stop_all()
        recorder.close()

    worker_of = {w["worker_id"]: name for name, w in workers.items()}
    lines, counts = [], collections.Counter()
    per_request: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    router_ids: set[int] = set()
    for m in recorder.messages:
        if not m["subject"].endswith(SUBJECT_SUFFIX):
            continue
        envelope = msgpack.unpackb(m["payload"], raw=False)
        decoded = msgpack.unpackb(envelope["payload"], raw=False)
        data = decoded["data"]
        kind = data if isinstance(data, str) else next(iter(data))
        rid = decoded["router_id"]
        publisher = f"worker:{worker_of[rid]}" if rid in worker_of else "router"
        if publisher == "router":
            router_ids.add(rid)
        counts[(kind, publisher)] += 1
        per_request[decoded["request_id"]][f"{kind}@{publisher.split(':')[0]}"] += 1
        lines.append(
            json.dumps(
                {
                    "subject": m["subject"],
                    "payload_b64": base64.b64encode(m["payload"]).decode(),
                    "envelope": {k: v for k, v in envelope.items() if k != "payload"},
                    "publisher": publisher,
                    "decoded": decoded,
                },
                default=str,
            )
        )
    (out / "active_sequences.jsonl").write_text("\n".join(lines) + "\n")
    by_kind = collections.defaultdict(dict)
    for (kind, publisher), c in sorted(counts.items()):
        by_kind[kind][publisher] = c
    shapes = collections.Counter(json.dumps(dict(sorted(c.items()))) for c in per_request.values())
    summary = {
        "messages": len(lines),
        "requests_sent": len(sent),
        "request_ids_seen": len(per_request),
        "by_kind_and_publisher": by_kind,
        "per_request_event_shapes": {k: v for k, v in shapes.most_common()},
    }
    (out / "counts.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "workers.json").write_text(
        json.dumps(
            {
                "workers": workers,
                "router_ids": sorted(router_ids),
                "frontend_argv_tail": frontend_argv[3:],
                "requests": sent,
                "logs": str(work),
            },
            indent=1,
        )
        + "\n"
    )
    print(json.dumps(summary, indent=1))
    print(f"{len(lines)} active_sequences_events -> {out}")


if __name__ == "__main__":
    main()
