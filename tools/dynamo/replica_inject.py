"""Checks what a third party must publish on ``active_sequences_events`` for a
Dynamo 1.6.1 frontend with ``--router-mode kv --router-replica-sync`` to count
its bookings, by doing it.

Starts nats-server, two mocker workers (one rank, 64 blocks of 16 each) and
the frontend with ``--active-prefill-tokens-threshold 100``; then publishes
hand-made ``AddRequest`` / ``MarkPrefillCompleted`` / ``Free`` events over a
plain NATS socket (msgpack payload inside the event-plane envelope, as the
router itself writes them) and, after each step, sends one small probe
request (8-token prompt, 2 tokens out) and reads the frontend's
``dynamo_frontend_worker_active_{prefill_tokens,decode_blocks}`` gauges.

Writes to ``<out>/sequences-multitoken/``:

- ``accepted_add.jsonl``: every message this script published, in order:
  ``step``, ``subject``, ``payload_b64`` (the exact bytes on the wire),
  ``envelope`` and ``decoded`` (for reading), then what followed it:
  ``probe_status`` and ``gauges`` (per worker, ``prefill``/``blocks``).
- ``inject_steps.json``: per step: what it checks, what was published, the
  probe's status and body, the gauges, and the verdict.
- ``frontend_own_events.jsonl``: the frontend's (and workers') own messages on
  the subject during the run, to show its ``router_id``.

Run with the fixtures' virtualenv, from tools/dynamo:

    python replica_inject.py --out ../../core/tests/fixtures/dynamo-1.6.1
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import socket
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import msgpack

from common import BLOCKS, HOST, MODEL
from harness import Loopback, prompt
from record_sequences_multitoken import wait_new_worker

SUBJECT = "namespace.dynamo.component.backend.endpoint.generate.active_sequences_events"
TOPIC = "active_sequences_events"
PREFILL_THRESHOLD = 100
SETTLE_S = 0.6


class NatsPublisher:
    """PUB over a plain socket; each publish is flushed with PING/PONG."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port))
        self.file = self.sock.makefile("rb")
        self.file.readline()  # INFO
        connect = {"verbose": False, "pedantic": False, "name": "loadgate-replica-inject", "lang": "python",
                   "version": "1", "headers": False}
        self.sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\n")
        self.flush()

    def flush(self) -> None:
        self.sock.sendall(b"PING\r\n")
        while True:
            line = self.file.readline()
            if not line:
                raise OSError("NATS connection closed")
            if line.startswith(b"PONG"):
                return
            if line.startswith(b"PING"):
                self.sock.sendall(b"PONG\r\n")
            if line.startswith(b"-ERR"):
                raise OSError(line.decode())

    def publish(self, subject: str, payload: bytes) -> None:
        self.sock.sendall(f"PUB {subject} {len(payload)}\r\n".encode() + payload + b"\r\n")
        self.flush()

    def close(self) -> None:
        self.sock.close()


class Injector:
    """Builds envelopes as the 1.6.1 event plane writes them: a msgpack map
    {publisher_id, sequence, published_at, topic, payload: bin}."""

    def __init__(self, nats: NatsPublisher, publisher_id: int) -> None:
        self.nats = nats
        self.publisher_id = publisher_id
        self.sequence = 0
        self.sent: list[dict] = []

    def envelope(self, event: dict, topic: str = TOPIC, sequence: int | None = None) -> tuple[dict, bytes]:
        inner = msgpack.packb(event, use_bin_type=True)
        env = {
            "publisher_id": self.publisher_id,
            "sequence": self.sequence if sequence is None else sequence,
            "published_at": int(time.time() * 1000),
            "topic": topic,
            "payload": inner,
        }
        if sequence is None:
            self.sequence += 1
        return env, msgpack.packb(env, use_bin_type=True)

    def send(self, step: str, event: dict, raw: bytes | None = None, **env_kw) -> dict:
        env, wire = self.envelope(event, **env_kw)
        if raw is not None:
            wire = raw
        self.nats.publish(SUBJECT, wire)
        rec = {
            "step": step,
            "subject": SUBJECT,
            "payload_b64": base64.b64encode(wire).decode(),
            "envelope": {k: v for k, v in env.items() if k != "payload"},
            "decoded": event,
        }
        self.sent.append(rec)
        return rec


def add_event(request_id, worker_id, router_id, *, hashes=(), prefill=None, track=True, dp_rank=0,
              expected_output_tokens=None, lora_name=None, minimal=False) -> dict:
    add = {"token_sequence": list(hashes), "track_prefill_tokens": track}
    if not minimal:
        add["expected_output_tokens"] = expected_output_tokens
        add["prefill_load_hint"] = (
            None if prefill is None else {"initial_effective_prefill_tokens": prefill, "expected_prefill_duration": None}
        )
    elif prefill is not None:
        add["prefill_load_hint"] = {"initial_effective_prefill_tokens": prefill}
    ev = {
        "request_id": request_id,
        "worker": {"worker_id": worker_id, "dp_rank": dp_rank},
        "data": {"AddRequest": add},
        "router_id": router_id,
    }
    if not minimal:
        ev["lora_name"] = lora_name
    return ev


def unit_event(kind, request_id, worker_id, router_id, dp_rank=0) -> dict:
    return {
        "request_id": request_id,
        "worker": {"worker_id": worker_id, "dp_rank": dp_rank},
        "data": kind,
        "router_id": router_id,
        "lora_name": None,
    }


def hashes(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.getrandbits(64) for _ in range(n)]


def http(port, method, path, body=None, timeout=60.0) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{HOST}:{port}{path}", data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def probe(port: int, n: int) -> tuple[int, str]:
    return http(port, "POST", "/v1/completions",
                {"model": MODEL, "prompt": prompt(8, 500 + n), "max_tokens": 2, "stream": False})


def gauges(port: int) -> dict:
    status, text = http(port, "GET", "/metrics")
    out: dict[str, dict] = {}
    for line in text.splitlines():
        for name, key in (("dynamo_frontend_worker_active_prefill_tokens", "prefill"),
                          ("dynamo_frontend_worker_active_decode_blocks", "blocks")):
            if line.startswith(name + "{"):
                labels = dict(kv.split("=", 1) for kv in line[len(name) + 1:line.index("}")].split(","))
                wid = labels["worker_id"].strip('"')
                rank = labels["dp_rank"].strip('"')
                out.setdefault(f"{wid}/{rank}", {})[key] = float(line.rsplit(" ", 1)[1])
    return out


def expiry_run(port, inj, wa, wb, router_id, expiry_secs, out: Path, keepalive: float | None) -> None:
    """Books once, never frees, and watches when the frontend admits again (or,
    with `keepalive`, whether periodic MarkPrefillCompleted keeps the blocks booked)."""
    t0 = time.monotonic()
    ra, rb = str(uuid.uuid4()), str(uuid.uuid4())
    inj.send("expiry-add", add_event(ra, wa, router_id, prefill=500, hashes=hashes(4, 1)))
    inj.send("expiry-add", add_event(rb, wb, router_id, prefill=500, hashes=hashes(4, 2)))
    time.sleep(SETTLE_S)
    samples = []
    n = 1000
    last_keepalive = time.monotonic()
    while time.monotonic() - t0 < 6 * expiry_secs + 10:
        n += 1
        if keepalive is not None and time.monotonic() - last_keepalive >= keepalive:
            inj.send("keepalive-mark", unit_event("MarkPrefillCompleted", ra, wa, router_id))
            inj.send("keepalive-mark", unit_event("MarkPrefillCompleted", rb, wb, router_id))
            last_keepalive = time.monotonic()
        g = gauges(port)
        status, _ = probe(port, n)
        samples.append({"t_s": round(time.monotonic() - t0, 2), "probe_status": status, "gauges": g})
        print(f"[expiry t={samples[-1]['t_s']}] probe={status} gauges={g}", flush=True)
        if keepalive is None and status == 200 and len(samples) > 1 and samples[-2]["probe_status"] == 200:
            break
        time.sleep(2.0)
    first_200 = next((s["t_s"] for s in samples if s["probe_status"] == 200), None)
    name = "inject_expiry.json" if keepalive is None else "inject_expiry_keepalive.json"
    (out / name).write_text(json.dumps({
        "DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS": expiry_secs,
        "keepalive_mark_every_s": keepalive,
        "published": [r["decoded"] for r in inj.sent],
        "first_admitted_after_s": first_200,
        "samples": samples,
    }, indent=1, default=str) + "\n")
    print(f"expiry {expiry_secs}s: first admitted after {first_200}s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path, help="the dynamo-1.6.1 fixtures folder")
    parser.add_argument("--expiry-secs", type=int, default=None,
                        help="instead of the steps: start the frontend with DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS set "
                             "to this, book 500 prefill tokens on both workers once, and probe every 2 s until "
                             "admitted (writes inject_expiry.json)")
    parser.add_argument("--keepalive-secs", type=float, default=None,
                        help="with --expiry-secs: publish MarkPrefillCompleted for the bookings every this many "
                             "seconds (does a replicated lifecycle event refresh a peer booking?); watches the "
                             "blocks gauge for 6 expiry periods (writes inject_expiry_keepalive.json)")
    args = parser.parse_args()
    out = args.out / "sequences-multitoken"
    out.mkdir(parents=True, exist_ok=True)
    lb = Loopback("dynamo-replica-inject-")
    work, kv, procs, nats_port, port, recorder, env, common, mocker = (
        lb.work, lb.kv, lb.procs, lb.nats, lb.http, lb.recorder, lb.env, lb.common, lb.mocker)
    frontend_argv = [sys.executable, "-m", "dynamo.frontend", "--http-host", HOST, "--http-port", str(port),
                     *common, "--router-mode", "kv", "--router-replica-sync",
                     "--active-prefill-tokens-threshold", str(PREFILL_THRESHOLD)]
    steps: list[dict] = []
    nats = None
    try:
        procs.start("worker-A", mocker, env)
        wa = wait_new_worker(kv, set(), work)
        procs.start("worker-B", mocker, env)
        wb = wait_new_worker(kv, {wa}, work)
        fenv = env if args.expiry_secs is None else {**env, "DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS": str(args.expiry_secs)}
        procs.start("frontend", frontend_argv, fenv)
        lb.wait_for_model()
        time.sleep(2.0)
        nats = NatsPublisher(nats_port)
        # Our publisher id: any u64 (not registered anywhere); our router id: any u64
        # that is neither the frontend's router id nor a worker id.
        inj = Injector(nats, publisher_id=random.getrandbits(52))
        third_router = random.getrandbits(64)
        n_probe = [0]

        def step(name: str, what: str, events: list[tuple[dict, dict]], expect: int | None,
                 settle: float = SETTLE_S) -> dict:
            recs = [inj.send(name, ev, **kw) for ev, kw in events]
            time.sleep(settle)
            g_before_probe = gauges(port)
            n_probe[0] += 1
            status, body = probe(port, n_probe[0])
            time.sleep(0.3)
            for r in recs:
                r["probe_status"] = status
                r["gauges"] = g_before_probe
            rec = {"step": name, "checks": what, "published": [r["decoded"] for r in recs],
                   "gauges_before_probe": g_before_probe, "probe_status": status,
                   "probe_body": body[:300], "expected_status": expect,
                   "verdict": None if expect is None else ("as expected" if status == expect else "UNEXPECTED")}
            steps.append(rec)
            print(f"[{name}] probe={status} expected={expect} gauges={g_before_probe}", flush=True)
            return rec

        def rid() -> str:
            return str(uuid.uuid4())

        if args.expiry_secs is not None:
            expiry_run(port, inj, wa, wb, third_router, args.expiry_secs, out, args.keepalive_secs)
            return

        # 0. Baseline: nothing booked; the probe also makes the frontend publish its own
        # AddRequest/Mark/Free, which tells us its router_id.
        step("baseline", "no bookings: the probe is admitted", [], 200)
        time.sleep(0.5)
        own = [msgpack.unpackb(msgpack.unpackb(m["payload"])["payload"]) for m in recorder.messages
               if m["subject"] == SUBJECT]
        frontend_router_ids = sorted({e["router_id"] for e in own} - {wa, wb})

        # 1. Prefill tokens: 500 on each worker's rank 0 -> both above 100 -> 529.
        r1a, r1b = rid(), rid()
        step("add-prefill", "AddRequest with prefill_load_hint 500 tokens, empty token_sequence, on both workers",
             [(add_event(r1a, wa, third_router, prefill=500), {}),
              (add_event(r1b, wb, third_router, prefill=500), {})], 529)
        # 2. A worker-style MarkPrefillCompleted (router_id = the worker id) for one of them.
        step("mark-by-worker-A", "MarkPrefillCompleted for A's booking with router_id = worker A's id",
             [(unit_event("MarkPrefillCompleted", r1a, wa, wa), {})], None)
        # A replica Mark changes the booking but (see the report) does not republish A's load;
        # any later replica Add/Free on A does. An empty untracked AddRequest is such a nudge.
        step("nudge-A-after-mark", "empty untracked AddRequest on A (0 blocks, 0 prefill): A's load is republished",
             [(add_event(rid(), wa, third_router, track=False), {})], 200)
        step("free-both", "Free (from our router id) for both bookings",
             [(unit_event("Free", r1a, wa, third_router), {}),
              (unit_event("Free", r1b, wb, third_router), {})], 200)

        # 3. Book again, then Free only: admits again.
        r3a, r3b = rid(), rid()
        step("add-prefill-again", "AddRequest 500 prefill tokens on both workers, 10 block hashes each",
             [(add_event(r3a, wa, third_router, prefill=500, hashes=hashes(10, 3)), {}),
              (add_event(r3b, wb, third_router, prefill=500, hashes=hashes(10, 4)), {})], 529)
        step("free-again", "Free both: admitted again",
             [(unit_event("Free", r3a, wa, third_router), {}),
              (unit_event("Free", r3b, wb, third_router), {})], 200)

        # 4. Which fields are needed: a minimal AddRequest (no lora_name, no expected_output_tokens,
        # hint without expected_prefill_duration).
        r4a, r4b = rid(), rid()
        step("add-minimal", "AddRequest without lora_name/expected_output_tokens/expected_prefill_duration",
             [(add_event(r4a, wa, third_router, prefill=500, minimal=True), {}),
              (add_event(r4b, wb, third_router, prefill=500, minimal=True), {})], None)
        step("free-minimal", "Free both", [(unit_event("Free", r4a, wa, third_router), {}),
                                           (unit_event("Free", r4b, wb, third_router), {})], 200)

        # 5. track_prefill_tokens false: the hint is ignored?
        r5a, r5b = rid(), rid()
        step("add-untracked", "AddRequest with prefill hint 500 but track_prefill_tokens false",
             [(add_event(r5a, wa, third_router, prefill=500, track=False), {}),
              (add_event(r5b, wb, third_router, prefill=500, track=False), {})], None)
        step("free-untracked", "Free both", [(unit_event("Free", r5a, wa, third_router), {}),
                                             (unit_event("Free", r5b, wb, third_router), {})], 200)

        # 6. Tracked, but no hint: what prefill is booked?
        r6a, r6b = rid(), rid()
        step("add-no-hint", "AddRequest track_prefill_tokens true, prefill_load_hint nil, 12 hashes",
             [(add_event(r6a, wa, third_router, hashes=hashes(12, 6)), {}),
              (add_event(r6b, wb, third_router, hashes=hashes(12, 7)), {})], None)
        step("free-no-hint", "Free both", [(unit_event("Free", r6a, wa, third_router), {}),
                                           (unit_event("Free", r6b, wb, third_router), {})], 200)

        # 7. The frontend's own router id: ignored.
        if frontend_router_ids:
            fr = frontend_router_ids[0]
            r7a, r7b = rid(), rid()
            step("add-as-frontend", "AddRequest 500 prefill with router_id = the frontend's own router id",
                 [(add_event(r7a, wa, fr, prefill=500), {}), (add_event(r7b, wb, fr, prefill=500), {})], 200)
            step("free-as-frontend", "Free them (same router id)",
                 [(unit_event("Free", r7a, wa, fr), {}), (unit_event("Free", r7b, wb, fr), {})], 200)

        # 8. Unknown worker id.
        unknown = random.getrandbits(63)
        r8 = rid()
        step("add-unknown-worker", "AddRequest 500 prefill for a worker id no one registered",
             [(add_event(r8, unknown, third_router, prefill=500, hashes=hashes(5, 8)), {})], 200)
        step("free-unknown-worker", "Free it", [(unit_event("Free", r8, unknown, third_router), {})], 200)

        # 9. Free for a request no one booked: ignored.
        step("free-unknown-request", "Free for an unknown request id",
             [(unit_event("Free", rid(), wa, third_router), {})], 200)

        # 10. Mark/Free naming the wrong worker: applied by request id or not?
        r10a, r10b = rid(), rid()
        step("add-for-mismatch", "AddRequest 500 prefill on both",
             [(add_event(r10a, wa, third_router, prefill=500), {}),
              (add_event(r10b, wb, third_router, prefill=500), {})], 529)
        step("mark-wrong-worker", "MarkPrefillCompleted for A's booking naming worker B (router_id = B)",
             [(unit_event("MarkPrefillCompleted", r10a, wb, wb), {})], None)
        step("nudge-A-after-wrong-mark", "empty untracked AddRequest on A: is A's prefill still 500?",
             [(add_event(rid(), wa, third_router, track=False), {})], 529)
        step("mark-by-third-router", "MarkPrefillCompleted for B's booking from our router id, then nudge B",
             [(unit_event("MarkPrefillCompleted", r10b, wb, third_router), {}),
              (add_event(rid(), wb, third_router, track=False), {})], None)
        step("free-wrong-worker", "Free for A's booking naming worker B, and B's naming A",
             [(unit_event("Free", r10a, wb, third_router), {}), (unit_event("Free", r10b, wa, third_router), {})],
             None)
        step("free-right-worker", "Free both naming the right workers",
             [(unit_event("Free", r10a, wa, third_router), {}), (unit_event("Free", r10b, wb, third_router), {})],
             200)

        # 11. A Free from another router id than the one that booked.
        r11a, r11b = rid(), rid()
        other_router = random.getrandbits(64)
        step("add-for-other-free", "AddRequest 500 prefill on both (router R)",
             [(add_event(r11a, wa, third_router, prefill=500), {}),
              (add_event(r11b, wb, third_router, prefill=500), {})], 529)
        step("free-by-other-router", "Free both from router R' != R",
             [(unit_event("Free", r11a, wa, other_router), {}), (unit_event("Free", r11b, wb, other_router), {})],
             None)
        step("free-by-booking-router", "Free both from R (cleanup)",
             [(unit_event("Free", r11a, wa, third_router), {}), (unit_event("Free", r11b, wb, third_router), {})],
             200)

        # 12. Duplicate AddRequest for the same request id.
        r12 = rid()
        step("add-dup-1", "AddRequest on A: 20 distinct hashes, prefill 60", [
            (add_event(r12, wa, third_router, prefill=60, hashes=hashes(20, 12)), {})], None)
        step("add-dup-2", "the same request id again on A: 20 other hashes, prefill 60", [
            (add_event(r12, wa, third_router, prefill=60, hashes=hashes(20, 13)), {})], None)
        step("free-dup", "one Free", [(unit_event("Free", r12, wa, third_router), {})], 200)
        step("free-dup-2", "a second Free", [(unit_event("Free", r12, wa, third_router), {})], 200)

        # 13. Envelope: do the topic field, the sequence and the publisher id matter?
        r13a, r13b = rid(), rid()
        step("add-wrong-topic", "envelope topic 'kv_metrics' instead of active_sequences_events",
             [(add_event(r13a, wa, third_router, prefill=500), {"topic": "kv_metrics"}),
              (add_event(r13b, wb, third_router, prefill=500), {"topic": "kv_metrics"})], None)
        step("free-wrong-topic", "Free both (normal envelope)",
             [(unit_event("Free", r13a, wa, third_router), {}), (unit_event("Free", r13b, wb, third_router), {})],
             200)
        r13c, r13d = rid(), rid()
        step("add-sequence-0-again", "normal topic, but envelope sequence 0 again (already used)",
             [(add_event(r13c, wa, third_router, prefill=500), {"sequence": 0}),
              (add_event(r13d, wb, third_router, prefill=500), {"sequence": 0})], None)
        step("free-sequence-0", "Free both (sequence 0 again)",
             [(unit_event("Free", r13c, wa, third_router), {"sequence": 0}),
              (unit_event("Free", r13d, wb, third_router), {"sequence": 0})], None)
        saved_pid = inj.publisher_id
        inj.publisher_id = 0
        r13e, r13f = rid(), rid()
        step("add-publisher-0", "envelope publisher_id 0",
             [(add_event(r13e, wa, third_router, prefill=500), {}),
              (add_event(r13f, wb, third_router, prefill=500), {})], None)
        step("free-publisher-0", "Free both (publisher_id 0)",
             [(unit_event("Free", r13e, wa, third_router), {}), (unit_event("Free", r13f, wb, third_router), {})],
             200)
        inj.publisher_id = saved_pid

        # 14. Decode blocks: threshold 0.5 of 64 blocks (prefill threshold out of the way).
        status, body = http(port, "POST", "/busy_threshold",
                            {"model": MODEL, "active_decode_blocks_threshold": 0.5,
                             "active_prefill_tokens_threshold": 1000000})
        steps.append({"step": "set-decode-threshold", "status": status, "body": body[:300]})
        r14a, r14b = rid(), rid()
        step("add-40-blocks", "AddRequest 40 distinct hashes, track_prefill_tokens false, on both",
             [(add_event(r14a, wa, third_router, hashes=hashes(40, 14), track=False), {}),
              (add_event(r14b, wb, third_router, hashes=hashes(40, 15), track=False), {})], None)
        step("free-40-blocks", "Free both",
             [(unit_event("Free", r14a, wa, third_router), {}), (unit_event("Free", r14b, wb, third_router), {})],
             200)
        r15a, r15b = rid(), rid()
        same = hashes(1, 16)[0]
        step("add-40-same-hash", "AddRequest with one hash repeated 40 times, on both",
             [(add_event(r15a, wa, third_router, hashes=[same] * 40, track=False), {}),
              (add_event(r15b, wb, third_router, hashes=[same] * 40, track=False), {})], None)
        step("free-40-same-hash", "Free both",
             [(unit_event("Free", r15a, wa, third_router), {}), (unit_event("Free", r15b, wb, third_router), {})],
             200)
        # 16. Two requests sharing 30 hashes on one rank: counted once?
        shared = hashes(30, 17)
        r16 = [rid() for _ in range(4)]
        step("add-shared-prefix", "two requests per worker with the same 30 hashes",
             [(add_event(r16[0], wa, third_router, hashes=shared, track=False), {}),
              (add_event(r16[1], wa, third_router, hashes=shared, track=False), {}),
              (add_event(r16[2], wb, third_router, hashes=shared, track=False), {}),
              (add_event(r16[3], wb, third_router, hashes=shared, track=False), {})], None)
        step("free-shared-prefix", "Free all four",
             [(unit_event("Free", r, w, third_router), {}) for r, w in zip(r16, [wa, wa, wb, wb])], 200)
        # 17. Prefix sharing or hash sets? Same 29 hashes after a different first hash.
        tail = hashes(30, 18)
        r17a, r17b = rid(), rid()
        step("add-same-tail", "two requests on A: [h1..h30] and [g, h2..h30]",
             [(add_event(r17a, wa, third_router, hashes=tail, track=False), {}),
              (add_event(r17b, wa, third_router, hashes=[hashes(1, 19)[0]] + tail[1:], track=False), {})], None)
        step("free-same-tail", "Free both",
             [(unit_event("Free", r17a, wa, third_router), {}), (unit_event("Free", r17b, wa, third_router), {})],
             200)
        time.sleep(1.0)
    finally:
        if nats is not None:
            nats.close()
        procs.stop_all()
        recorder.close()

    own_lines = []
    for m in recorder.messages:
        if m["subject"] != SUBJECT:
            continue
        env_ = msgpack.unpackb(m["payload"], raw=False)
        if env_.get("publisher_id") == inj.publisher_id:
            continue
        own_lines.append(json.dumps({"subject": m["subject"], "payload_b64": base64.b64encode(m["payload"]).decode(),
                                     "envelope": {k: v for k, v in env_.items() if k != "payload"},
                                     "decoded": msgpack.unpackb(env_["payload"], raw=False)}, default=str))
    (out / "frontend_own_events.jsonl").write_text("\n".join(own_lines) + "\n")
    (out / "accepted_add.jsonl").write_text("\n".join(json.dumps(r, default=str) for r in inj.sent) + "\n")
    (out / "inject_steps.json").write_text(json.dumps({
        "workers": {"A": wa, "B": wb},
        "frontend_router_ids": frontend_router_ids,
        "injector_router_id": third_router,
        "injector_publisher_id": inj.publisher_id,
        "subject": SUBJECT,
        "frontend_argv_tail": frontend_argv[3:],
        "prefill_threshold": PREFILL_THRESHOLD,
        "blocks_per_rank": BLOCKS,
        "steps": steps,
        "logs": str(work),
    }, indent=1, default=str) + "\n")
    bad = [s["step"] for s in steps if s.get("verdict") == "UNEXPECTED"]
    print(f"{len(inj.sent)} published, {len(steps)} steps, unexpected: {bad or 'none'}; logs in {work}")


if __name__ == "__main__":
    main()
