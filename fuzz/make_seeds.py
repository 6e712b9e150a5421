#!/usr/bin/env python3
"""Writes the committed seed corpora under fuzz/corpus/<target>/.

Deterministic: running it again rewrites the same files. Structured targets
get hand-written inputs (wire envelopes, HTTP requests); targets that read
operation sequences through `arbitrary` (gate_ops, monitor_ops, c_abi,
subscriber) get a
few fixed-seed pseudo-random inputs of different lengths, which decode to
mixed operation sequences, plus the inputs of past findings and of states
the random ones rarely reach.

Usage: python3 fuzz/make_seeds.py
"""

import base64
import json
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- msgpack, just what the envelopes need ------------------------------------


def mp_uint(n):
    if n < 0x80:
        return bytes([n])
    if n < 1 << 8:
        return b"\xcc" + struct.pack(">B", n)
    if n < 1 << 16:
        return b"\xcd" + struct.pack(">H", n)
    if n < 1 << 32:
        return b"\xce" + struct.pack(">I", n)
    return b"\xcf" + struct.pack(">Q", n)


def mp_str(s):
    b = s.encode()
    assert len(b) < 32
    return bytes([0xA0 | len(b)]) + b


def mp_map(fields):
    assert len(fields) < 16
    out = bytes([0x80 | len(fields)])
    for k, v in fields.items():
        out += mp_str(k)
        if v is None:
            out += b"\xc0"
        elif isinstance(v, str):
            out += mp_str(v)
        elif isinstance(v, int) and v < 0:
            out += b"\xd0" + struct.pack(">b", v)
        else:
            out += mp_uint(v)
    return out


def wire():
    envelope = {
        "v": 1,
        "instance": 77,
        "seq": 5,
        "worker_id": 3,
        "model": "llama",
        "dp_start": 2,
        "dp_size": 2,
        "dp_rank": 3,
        "kv_total_blocks": 1000,
        "max_num_seqs": 256,
        "kv_used_blocks": 10,
        "active_prefill_tokens": 0,
    }
    active_load = {"worker_id": 9, "dp_rank": 1, "active_decode_blocks": 12,
                   "active_prefill_tokens": None}
    write("wire_decode", "envelope.msgpack", mp_map(envelope))
    write("wire_decode", "envelope.json", json.dumps(envelope))
    write("wire_decode", "active_load.msgpack", mp_map(active_load))
    write("wire_decode", "active_load.json", json.dumps(active_load))
    big = dict(envelope, seq=2**64 - 1, worker_id=2**63, kv_used_blocks=2**53 + 1,
               max_num_batched_tokens=None)
    write("wire_decode", "edges.msgpack", mp_map(big))
    write("wire_decode", "bad_rank.json", json.dumps(dict(envelope, dp_rank=9)))
    write("wire_decode", "bad_version.msgpack", mp_map(dict(envelope, v=2)))
    write("wire_decode", "negative.msgpack", mp_map(dict(active_load, worker_id=-1)))


def http():
    ct = "application/json"
    requests = {
        "set_then_read": [
            ("POST", ct, {"model": "llama", "active_decode_blocks_threshold": 0.9,
                          "active_prefill_tokens_threshold": 2048}),
            ("POST", ct, {"model": "llama"}),
            ("GET", "", None),
        ],
        "clear": [
            ("POST", ct, {"model": "mistral", "active_prefill_tokens_threshold_frac": 1.5}),
            ("POST", ct + "; charset=utf-8",
             {"model": "mistral", "clear": ["active_prefill_tokens_threshold_frac"]}),
        ],
        "waiting": [
            ("POST", ct, {"model": "llama", "waiting_requests_threshold": 8}),
            ("POST", ct, {"model": "llama", "waiting_requests_threshold": -1}),
            ("POST", ct, {"model": "llama", "waiting_requests_threshold": 1.5}),
            ("POST", ct, {"model": "llama", "clear": ["waiting_requests_threshold"]}),
        ],
        "errors": [
            ("POST", ct, {"model": "nope", "active_decode_blocks_threshold": 0.5}),
            ("POST", ct, {"model": "llama", "active_decode_blocks_threshold": 1.5}),
            ("POST", ct, {"model": "llama", "active_prefill_tokens_threshold": -1}),
            ("POST", ct, {"model": 7}),
        ],
        "wrong_shapes": [
            ("POST", "text/plain", {"model": "llama"}),
            ("PUT", ct, {"model": "llama"}),
            ("POST", ct, {"model": "llama", "clear": "all"}),
            ("POST", "", None),
        ],
    }
    for name, reqs in requests.items():
        chunks = []
        for method, content_type, body in reqs:
            text = "" if body is None else json.dumps(body)
            chunks.append(f"{method}\n{content_type}\n{text}".encode())
        write("busy_threshold_http", name, b"\0".join(chunks))
    write("busy_threshold_http", "malformed", b"POST\napplication/json\n{\"model\": \"llama\",")


def ops(target, count=4):
    rng = random.Random(target)
    for i, length in enumerate([16, 64, 256, 1024][:count]):
        write(target, f"random-{i}", bytes(rng.randrange(256) for _ in range(length)))


# Minimized inputs of past findings (core/tests/fuzz_regressions.rs).
FINDINGS = {
    # N=1, Q=47, deadline 1 ms: 47 callbacks queue, time passes, one more
    # admission finds the queue full with 47 overdue waiters.
    ("gate_ops", "finding-full-queue-expiry"):
        "f8002f2f00102f2f2f2f2f982f2f2f2f2f2f982f2f2f2f2f982f2f",
    # A worker declared with no ranks, and a dispatch that picks it: it has
    # nothing to book (a panic on an empty rank list before).
    ("c_abi", "finding-dispatch-to-a-worker-without-ranks"):
        "292c010000000000241a35cf2199165b49bf4141404048bfbfbf7ebf01000000bfffffffffff41404048bfbf7ebfbfbfbfbfaf",
}


# Inputs that reach a state the random seeds rarely do, for the fuzzer to
# start from. They decode through the targets' `arbitrary` enums (see them
# with `cargo +nightly fuzz fmt <target> <file>`), so a change to those
# enums changes what they decode to: find and minimize a new one then.
STATES = {
    # A monitor whose one worker is busy, with a queue (flow::Call::Fleet),
    # and a dispatch that waits in it (and gives up at its zero timeout).
    ("c_abi", "flow-a-request-waits"): "1561616940dd9961616100006161165b4961610fc7e1e5ff7b000061",
}


def recorded():
    """What a real Dynamo 1.6.1 sent (core/tests/fixtures/dynamo-1.6.1/nats/raw):
    its kv_metrics and forward-pass-metrics envelopes, and the two topics
    loadgate does not read; and each kind of its routers' bookings
    (nats/active_sequences.jsonl)."""
    raw = os.path.join(HERE, "..", "core", "tests", "fixtures", "dynamo-1.6.1", "nats", "raw")
    prefix = "namespace.dynamo.component.backend.endpoint.generate."
    for name in sorted(os.listdir(raw)):
        with open(os.path.join(raw, name), "rb") as f:
            data = f.read()
        write("wire_decode", "dynamo-1.6.1." + name[len(prefix):], data)
    events = os.path.join(raw, "..", "active_sequences.jsonl")
    kinds = set()
    with open(events) as f:
        for line in f:
            event = json.loads(line)
            data = event["decoded"]["data"]
            kind = data if isinstance(data, str) else next(iter(data))
            if kind not in kinds:
                kinds.add(kind)
                payload = base64.b64decode(event["payload_b64"])
                write("wire_decode", "dynamo-1.6.1.active_sequences_events." + kind, payload)


def findings():
    for (target, name), hexbytes in {**FINDINGS, **STATES}.items():
        write(target, name, bytes.fromhex(hexbytes))


def main():
    wire()
    recorded()
    http()
    ops("monitor_ops")
    ops("gate_ops")
    ops("flow_ops")
    ops("c_abi")
    ops("subscriber")
    ops("booking_sync")
    findings()


if __name__ == "__main__":
    main()
