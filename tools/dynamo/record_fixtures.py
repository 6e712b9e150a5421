#!/usr/bin/env python3
"""Record what a real Dynamo 1.6.1 deployment sends and answers, as test fixtures.

Brings up, on loopback only: a nats-server, two mocker workers (one with
``--data-parallel-size 2``) and a frontend with the KV router and both busy
thresholds set, all on the file discovery backend and the TCP request plane,
with a tiny tokenizer made here (no model is ever downloaded). Then:

- subscribes to NATS ``>`` and records every message (subject, headers, raw
  payload), while idle, under prefill and decode overload, while workers go
  away and while a worker rejects requests itself;
- copies the discovery records from the ``DYN_FILE_KV`` directory as they are
  on disk, and times their keep-alive and expiry;
- records exact HTTP answers (status, headers, body bytes): 529 for each
  threshold, 503 and 404 without workers, every ``/busy_threshold`` case, and
  the ``/metrics`` text of the frontend and the workers.

Run it with a Python that has ai-dynamo 1.6.1 installed (``record_fixtures.sh``
makes one). Everything is written under ``--out``; see its README.md.
"""

from __future__ import annotations

import argparse
import base64
import collections
import datetime
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HOST = "127.0.0.1"
MODEL = "tiny"
BLOCKS = 64  # --num-gpu-blocks-override, per data-parallel rank
BLOCK_SIZE = 16
DECODE_THRESHOLD = 0.5
PREFILL_THRESHOLD = 100
W3_ENGINE_LIMIT = 3  # DYN_ENGINE_REQUEST_LIMIT of the third worker
W3_MAX_BATCHED = 512  # its --max-num-batched-tokens

# Per (subject, phase): how many messages are kept in messages.jsonl.
KEEP_PER_SUBJECT_PHASE = 16
KEEP_PER_SUBJECT_PHASE_LARGE = 4  # subjects whose payloads are large (kv-events)


# ---------------------------------------------------------------- helpers


def free_port(below: int | None = None) -> int:
    """A free loopback port; below= bounds it (Dynamo reads DYN_SYSTEM_PORT as an i16)."""
    import random

    for _ in range(200):
        port = random.randint(20000, below - 1) if below else 0
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port")


def relative(arg: str) -> str:
    """A path argument shown relative to the working directory, when it is under it."""
    try:
        return str(Path(arg).resolve().relative_to(Path.cwd()))
    except ValueError:
        return arg


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Clock:
    """Seconds since the recording started."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 4)


CLOCK = Clock()
PHASE = {"name": "startup"}
TIMELINE: list[dict] = []


def mark(event: str, **extra) -> None:
    TIMELINE.append({"t": CLOCK.now(), "phase": PHASE["name"], "event": event, **extra})
    log(event + (f" {extra}" if extra else ""))


def set_phase(name: str) -> None:
    PHASE["name"] = name
    mark(f"phase {name}")


# ------------------------------------------------------- msgpack inspector


def mp_describe(buf: bytes):
    """Decode one msgpack value, keeping each value's wire format name.

    Returns (value, end) where value is {"type": ..., "value": ...}; maps keep
    their key order as a list of [key, value] pairs.
    """

    def rd(i: int):
        b = buf[i]
        if b <= 0x7F:
            return {"type": "positive_fixint", "value": b}, i + 1
        if 0x80 <= b <= 0x8F:
            return rd_map(i + 1, b & 0x0F, "fixmap")
        if 0x90 <= b <= 0x9F:
            return rd_arr(i + 1, b & 0x0F, "fixarray")
        if 0xA0 <= b <= 0xBF:
            n = b & 0x1F
            return {"type": "fixstr", "value": buf[i + 1 : i + 1 + n].decode("utf-8", "replace")}, i + 1 + n
        if b >= 0xE0:
            return {"type": "negative_fixint", "value": b - 256}, i + 1
        if b == 0xC0:
            return {"type": "nil", "value": None}, i + 1
        if b in (0xC2, 0xC3):
            return {"type": "bool", "value": b == 0xC3}, i + 1
        if b in (0xC4, 0xC5, 0xC6):
            w = {0xC4: 1, 0xC5: 2, 0xC6: 4}[b]
            n = int.from_bytes(buf[i + 1 : i + 1 + w], "big")
            s = i + 1 + w
            return {"type": f"bin{8 * w}", "len": n, "value": buf[s : s + n]}, s + n
        if b in (0xCA, 0xCB):
            if b == 0xCA:
                return {"type": "float32", "value": struct.unpack(">f", buf[i + 1 : i + 5])[0]}, i + 5
            return {"type": "float64", "value": struct.unpack(">d", buf[i + 1 : i + 9])[0]}, i + 9
        if 0xCC <= b <= 0xCF:
            w = 1 << (b - 0xCC)
            return {"type": f"uint{8 * w}", "value": int.from_bytes(buf[i + 1 : i + 1 + w], "big")}, i + 1 + w
        if 0xD0 <= b <= 0xD3:
            w = 1 << (b - 0xD0)
            v = int.from_bytes(buf[i + 1 : i + 1 + w], "big", signed=True)
            return {"type": f"int{8 * w}", "value": v}, i + 1 + w
        if b in (0xD9, 0xDA, 0xDB):
            w = {0xD9: 1, 0xDA: 2, 0xDB: 4}[b]
            n = int.from_bytes(buf[i + 1 : i + 1 + w], "big")
            s = i + 1 + w
            return {"type": f"str{8 * w}", "value": buf[s : s + n].decode("utf-8", "replace")}, s + n
        if b in (0xDC, 0xDD):
            w = 2 if b == 0xDC else 4
            return rd_arr(i + 1 + w, int.from_bytes(buf[i + 1 : i + 1 + w], "big"), f"array{8 * w}")
        if b in (0xDE, 0xDF):
            w = 2 if b == 0xDE else 4
            return rd_map(i + 1 + w, int.from_bytes(buf[i + 1 : i + 1 + w], "big"), f"map{8 * w}")
        raise ValueError(f"unsupported msgpack byte 0x{b:02x} at {i}")

    def rd_map(i: int, n: int, t: str):
        items = []
        for _ in range(n):
            k, i = rd(i)
            v, i = rd(i)
            items.append([k["value"], v])
        return {"type": t, "value": items}, i

    def rd_arr(i: int, n: int, t: str):
        items = []
        for _ in range(n):
            v, i = rd(i)
            items.append(v)
        return {"type": t, "value": items}, i

    return rd(0)


def mp_plain(node, inner_bin_keys=("payload",), key=None):
    """The decoded value as plain JSON, each leaf written as "<wire type>:<value>"."""
    t, v = node["type"], node["value"]
    if t.endswith("map"):
        return {str(k): mp_plain(val, inner_bin_keys, k) for k, val in v}
    if "array" in t:
        return [mp_plain(x, inner_bin_keys) for x in v]
    if t.startswith("bin"):
        if key in inner_bin_keys:
            try:
                inner, end = mp_describe(v)
                if end == len(v):
                    return {"<bin decoded as msgpack>": mp_plain(inner, inner_bin_keys)}
            except Exception:  # not msgpack: keep the bytes
                pass
        return f"{t}:{base64.b64encode(v).decode()}"
    return f"{t}:{json.dumps(v)}"


def mp_schema(node, prefix=""):
    """Flat {key path: wire type} of a decoded value (arrays: first element)."""
    out = {}
    t, v = node["type"], node["value"]
    if t.endswith("map"):
        out[prefix or "."] = t
        for k, val in v:
            out.update(mp_schema(val, f"{prefix}.{k}"))
    elif "array" in t:
        out[prefix or "."] = f"{t}[{len(v)}]"
        if v:
            out.update(mp_schema(v[0], f"{prefix}[0]"))
    elif t.startswith("bin") and prefix.endswith(".payload"):
        out[prefix] = t
        try:
            inner, end = mp_describe(v)
            if end == len(v):
                out.update(mp_schema(inner, prefix + "<msgpack>"))
        except Exception:
            pass
    else:
        out[prefix or "."] = t
    return out


def mp_get(node, *path):
    for p in path:
        if node is None or not node["type"].endswith("map"):
            return None
        node = next((v for k, v in node["value"] if k == p), None)
    return node


def compact_json(obj) -> str:
    """JSON with one line per entry of the outer two levels."""
    if not isinstance(obj, dict):
        return json.dumps(obj, separators=(",", ":")) + "\n"
    parts = []
    for k, v in obj.items():
        if isinstance(v, dict):
            inner = ",\n  ".join(f"{json.dumps(k2)}: {json.dumps(v2, separators=(',', ':'))}" for k2, v2 in v.items())
            parts.append(f"{json.dumps(k)}: {{\n  {inner}\n }}" if v else f"{json.dumps(k)}: {{}}")
        else:
            parts.append(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}")
    return "{\n " + ",\n ".join(parts) + "\n}\n"


def normalize_wire_type(t: str) -> str:
    """One name per msgpack family: every unsigned int is "uint", every str "str", ..."""
    if t in ("positive_fixint",) or t.startswith("uint"):
        return "uint"
    if t == "negative_fixint" or (t.startswith("int") and t[3:].isdigit()):
        return "int"
    for fam in ("str", "bin", "map"):
        if t == f"fix{fam}" or (t.startswith(fam) and t[len(fam):].isdigit()):
            return fam
    if "array" in t:
        return "array"
    return t


def load_score(subject: str, inner) -> float:
    """How much load a decoded inner payload shows, to pick a loaded example."""

    def num(*path):
        n = mp_get(inner, *path)
        return n["value"] if n is not None and isinstance(n["value"], (int, float)) else 0

    if subject.endswith(".forward-pass-metrics"):
        return 1e6 * num("queued_requests", "num_prefill_requests") + num("scheduled_requests", "sum_decode_kv_tokens") + num(
            "scheduled_requests", "sum_prefill_tokens"
        )
    if subject.endswith(".kv_metrics"):
        return num("kv_used_blocks")
    return 1.0


# ---------------------------------------------------------- NATS recorder


class NatsRecorder(threading.Thread):
    """Subscribes to ``>`` over a plain socket and keeps every message's raw bytes."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection((HOST, port))
        self.file = self.sock.makefile("rb")
        self.info = self.file.readline().decode().strip()
        connect = {
            "verbose": False,
            "pedantic": False,
            "headers": True,
            "no_responders": False,
            "name": "loadgate-fixture-recorder",
            "lang": "python",
            "version": "1",
        }
        self.sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nSUB > 1\r\nPING\r\n")
        self.messages: list[dict] = []
        self.stop = threading.Event()

    def run(self) -> None:
        # Blocking reads: close() shuts the socket down, which ends readline().
        while not self.stop.is_set():
            try:
                line = self.file.readline()
            except OSError:
                return
            if not line:
                return
            if line.startswith(b"PING"):
                self.sock.sendall(b"PONG\r\n")
                continue
            if not (line.startswith(b"MSG ") or line.startswith(b"HMSG ")):
                continue
            parts = line.split()
            if parts[0] == b"MSG":
                # MSG <subject> <sid> [reply] <size>
                reply = parts[3].decode() if len(parts) == 5 else None
                hlen, total = 0, int(parts[-1])
            else:
                # HMSG <subject> <sid> [reply] <hdr size> <total size>
                reply = parts[3].decode() if len(parts) == 6 else None
                hlen, total = int(parts[-2]), int(parts[-1])
            try:
                data = self.file.read(total + 2)
            except OSError:
                return
            if len(data) < total + 2:
                return
            data = data[:total]
            self.messages.append(
                {
                    "t": CLOCK.now(),
                    "wall_ms": int(time.time() * 1000),
                    "phase": PHASE["name"],
                    "subject": parts[1].decode(),
                    "reply": reply,
                    "headers": data[:hlen],
                    "payload": data[hlen:],
                }
            )

    def close(self) -> None:
        self.stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
        except OSError:
            pass
        self.join(5)


# ------------------------------------------------------------ HTTP helper

BODY_SHOWN_LIMIT = 4096


def describe_body(body: bytes | None, what: str | None = None):
    if body is None:
        return None
    if what is not None or len(body) > BODY_SHOWN_LIMIT:
        return {
            "size": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "description": what or "large body",
            "head": body[:64].decode("utf-8", "replace"),
        }
    try:
        return {"text": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(body).decode()}


def http_call(port, method, path, headers=None, body=None, body_what=None, timeout=120.0, raw=False):
    headers = dict(headers or {})
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    t = time.monotonic()
    rec = {
        "request": {
            "method": method,
            "path": path,
            "headers": [[k, v] for k, v in headers.items()],
            "body": describe_body(body, body_what),
        }
    }
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("content-length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        data = resp.read()
        rec.update(
            {
                "status": resp.status,
                "reason": resp.reason,
                "http_version": {10: "HTTP/1.0", 11: "HTTP/1.1"}.get(resp.version, str(resp.version)),
                "headers": [[k, v] for k, v in resp.getheaders()],
                "body": describe_body(data),
            }
        )
        if raw:
            rec["raw_body"] = data
    except Exception as e:  # recorded, not raised: the run goes on
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    rec["elapsed_s"] = round(time.monotonic() - t, 4)
    return rec


def body_text(rec) -> str:
    b = rec.get("body") or {}
    return b.get("text", "")


# ------------------------------------------------------------ processes


class Procs:
    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name, argv, env) -> subprocess.Popen:
        out = open(self.logdir / f"{name}.log", "wb")
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = p
        shown = {
            k: v
            for k, v in sorted(env.items())
            if k.startswith(("DYN_", "NATS_", "HF_", "TRANSFORMERS_")) or k in ("HOME", "NO_COLOR")
        }
        mark(f"started {name}", pid=p.pid, argv=[str(a) for a in argv], env=shown)
        return p

    def signal(self, name, sig) -> None:
        p = self.procs[name]
        if p.poll() is None:
            os.kill(p.pid, sig)
            mark(f"sent {signal.Signals(sig).name} to {name}", pid=p.pid)

    def wait(self, name, timeout=20.0) -> int | None:
        try:
            return self.procs[name].wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop_all(self) -> None:
        for name, p in reversed(list(self.procs.items())):
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for name, p in self.procs.items():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()


# --------------------------------------------------------------- tokenizer


def make_model_dir(d: Path) -> dict:
    """A tiny WordLevel tokenizer and the config files Dynamo reads, made here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    d.mkdir(parents=True, exist_ok=True)
    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(256)]
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.save(str(d / "tokenizer.json"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "vocab_size": len(vocab),
        "max_position_embeddings": 4096,
        "torch_dtype": "float16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (d / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 4096,
        "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
    }
    (d / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=1) + "\n")
    (d / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}) + "\n")
    return {"vocab_size": len(vocab), "files": sorted(p.name for p in d.iterdir())}


def prompt(n_tokens: int, salt: int) -> str:
    """A prompt of exactly n_tokens tokens (one vocabulary word each), distinct per salt."""
    return " ".join(f"w{(salt * 37 + i) % 256}" for i in range(n_tokens))


# ----------------------------------------------------------------- the run


class Recorder:
    def __init__(self, args) -> None:
        self.args = args
        self.out = Path(args.out).resolve()
        self.work = Path(tempfile.mkdtemp(prefix="dynamo-fixtures-"))
        self.kv = self.work / "kv"
        self.kv.mkdir()
        self.model = self.work / "model"
        (self.work / "home").mkdir()
        self.logs = self.work / "logs"
        self.logs.mkdir()
        self.procs = Procs(self.logs)
        self.ports = {
            "nats": free_port(),
            "http": free_port(),
            "w1_system": free_port(below=32768),
            "w2_system": free_port(below=32768),
            "w3_system": free_port(below=32768),
        }
        self.http_records: dict[str, dict] = {}
        self.loads: dict[str, dict] = {}
        self.metrics_lines: dict[str, list[str]] = {}
        self.discovery_notes: dict = {}
        self.metrics_full: dict[str, str] = {}
        self.model_info: dict = {}
        self.py = args.python or sys.executable

    # -- environment

    def dyn_env(self, **extra) -> dict:
        env = {
            k: v
            for k, v in os.environ.items()
            if not (k.startswith("DYN_") or k.startswith("NATS_") or k.startswith("ETCD_"))
        }
        env.update(
            {
                "HOME": str(self.work / "home"),
                "NATS_SERVER": f"nats://{HOST}:{self.ports['nats']}",
                "DYN_DISCOVERY_BACKEND": "file",
                "DYN_FILE_KV": str(self.kv),
                "DYN_REQUEST_PLANE": "tcp",
                "DYN_EVENT_PLANE": "nats",
                # Every listener on loopback (the default binds the first non-loopback address).
                "DYN_TCP_RPC_HOST": HOST,
                "DYN_TCP_RESPONSE_STREAM_HOST": HOST,
                "DYN_EVENT_PLANE_HOST": HOST,
                "DYN_SYSTEM_HOST": HOST,
                "DYN_LOGGING_CONSOLE_FORMAT": "plain",
                "NO_COLOR": "1",
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
            }
        )
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def mocker_argv(self, name_extra=()):
        return [
            self.py,
            "-m",
            "dynamo.mocker",
            "--model-path",
            str(self.model),
            "--model-name",
            MODEL,
            "--discovery-backend",
            "file",
            "--request-plane",
            "tcp",
            "--event-plane",
            "nats",
            "--num-gpu-blocks-override",
            str(BLOCKS),
            "--block-size",
            str(BLOCK_SIZE),
            *name_extra,
        ]

    def frontend_argv(self):
        return [
            self.py,
            "-m",
            "dynamo.frontend",
            "--http-host",
            HOST,
            "--http-port",
            str(self.ports["http"]),
            "--discovery-backend",
            "file",
            "--request-plane",
            "tcp",
            "--event-plane",
            "nats",
            "--router-mode",
            self.args.router_mode,
            "--active-decode-blocks-threshold",
            str(DECODE_THRESHOLD),
            "--active-prefill-tokens-threshold",
            str(PREFILL_THRESHOLD),
        ]

    # -- HTTP shortcuts

    def call(self, key, method, path, **kw):
        rec = http_call(self.ports["http"], method, path, **kw)
        rec["t"] = CLOCK.now()
        rec["phase"] = PHASE["name"]
        if key is not None:
            self.http_records[key] = rec
        log(f"  {method} {path} -> {rec.get('status', rec.get('error'))} {body_text(rec)[:110]}")
        return rec

    def post_json(self, key, obj, path="/busy_threshold", **kw):
        return self.call(
            key, "POST", path, headers={"content-type": "application/json"}, body=json.dumps(obj).encode(), **kw
        )

    def completion_body(self, n_tokens, salt, max_tokens, stream=False):
        return json.dumps(
            {"model": MODEL, "prompt": prompt(n_tokens, salt), "max_tokens": max_tokens, "stream": stream}
        ).encode()

    def chat_body(self, n_tokens, salt, max_tokens, stream=False):
        return json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": prompt(n_tokens, salt)}],
                "max_tokens": max_tokens,
                "stream": stream,
            }
        ).encode()

    def scrape(self, port, path="/metrics") -> str:
        rec = http_call(port, "GET", path, raw=True)
        return rec["raw_body"].decode() if rec.get("status") == 200 else ""

    def keep_metric_lines(self, key, text):
        wanted = (
            "dynamo_frontend_failures_total",
            "dynamo_frontend_model_rejection_total",
            "dynamo_frontend_worker_active_",
            "dynamo_frontend_model_total_kv_blocks",
            "dynamo_frontend_model_max_num_batched_tokens",
            "dynamo_frontend_model_ready",
            "dynamo_frontend_requests_total",
            "dynamo_frontend_router_",
            "dynamo_engine_request",
            "dynamo_request_queue",
            "dynamo_rejection_request_total",
        )
        lines = [
            ln
            for ln in text.splitlines()
            if not ln.startswith("#") and any(ln.startswith(w) for w in wanted) and "_bucket{" not in ln
        ]
        self.metrics_lines[key] = lines

    # -- waiting

    def wait_for(self, what, pred, timeout=90.0, every=0.25):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if pred():
                    mark(f"ready: {what}")
                    return True
            except Exception:
                pass
            time.sleep(every)
        raise RuntimeError(f"timed out waiting for {what}; logs in {self.logs}")

    def model_listed(self) -> bool:
        rec = http_call(self.ports["http"], "GET", "/v1/models", timeout=5)
        return rec.get("status") == 200 and f'"id":"{MODEL}"' in body_text(rec)

    def mdc_count(self) -> int:
        d = self.kv / "v1" / "mdc"
        return len(list(d.iterdir())) if d.is_dir() else 0

    # -- load

    def burst(self, key, specs, settle=None, stagger=0.0):
        """Send every request of specs at once, or stagger seconds apart (one thread each).

        specs: list of (label, path, body, keep_full). Keeps the first full answer
        of each (label, status) and a line per request. Returns the records in order.
        """
        results: list[dict | None] = [None] * len(specs)
        barrier = threading.Barrier(len(specs))

        def one(i, label, path, body):
            barrier.wait()
            time.sleep(i * stagger)
            rec = http_call(
                self.ports["http"], "POST", path, headers={"content-type": "application/json"}, body=body
            )
            rec["label"] = label
            rec["t_sent"] = CLOCK.now() - rec["elapsed_s"]
            results[i] = rec

        threads = [
            threading.Thread(target=one, args=(i, lab, path, body), daemon=True)
            for i, (lab, path, body, _) in enumerate(specs)
        ]
        mark(f"burst {key}", requests=len(specs))
        for th in threads:
            th.start()
        if settle is not None:
            settle()
        for th in threads:
            th.join(300)
        counts = collections.Counter(r.get("status", r.get("error")) for r in results)
        mark(f"burst {key} done", statuses=dict(counts))
        self.loads[key] = {
            "requests": [
                {
                    "label": r["label"],
                    "status": r.get("status"),
                    "error": r.get("error"),
                    "elapsed_s": r["elapsed_s"],
                    "body_head": body_text(r)[:100],
                }
                for r in results
            ],
            "statuses": {str(k): v for k, v in counts.items()},
        }
        # Keep the first full answer of each (label, status).
        seen = set()
        for r, (lab, _, _, keep) in zip(results, specs):
            k = (lab.split("#")[0], r.get("status"))
            if keep and k not in seen:
                seen.add(k)
                self.http_records[f"{key}:{k[0]}:{k[1]}"] = r
        return results

    # -- discovery

    def discovery_listing(self):
        out = []
        for p in sorted(self.kv.rglob("*")):
            if p.is_file():
                st = p.stat()
                out.append({"path": str(p.relative_to(self.kv)), "size": st.st_size, "mtime": st.st_mtime})
        return out

    def copy_discovery(self, dest: Path):
        if self.args.lite:
            return self.discovery_listing()
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(self.kv, dest)
        return self.discovery_listing()

    def time_keepalive(self, seconds):
        """Watch the discovery files' mtimes; returns each file's distinct touch times."""
        seen: dict[str, list[float]] = collections.defaultdict(list)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for item in self.discovery_listing():
                times = seen[item["path"]]
                if not times or times[-1] != item["mtime"]:
                    times.append(item["mtime"])
            time.sleep(0.2)
        gaps = []
        for times in seen.values():
            gaps += [round(b - a, 3) for a, b in zip(times, times[1:])]
        return {
            "watched_s": seconds,
            "files": len(seen),
            "touch_intervals_s": sorted(set(round(g, 1) for g in gaps)),
            "median_interval_s": statistics.median(gaps) if gaps else None,
        }

    # ------------------------------------------------------------- phases

    def run(self):
        log(f"work dir {self.work}")
        self.model_info = make_model_dir(self.model)
        nats_argv = ["nats-server", "-a", HOST, "-p", str(self.ports["nats"])]
        if self.args.jetstream:
            nats_argv += ["-js", "-sd", str(self.work / "jetstream")]
        self.procs.start("nats-server", nats_argv, os.environ.copy())
        self.wait_for("nats-server", lambda: socket.create_connection((HOST, self.ports["nats"]), 1).close() or True)
        self.nats = NatsRecorder(self.ports["nats"])
        self.nats.start()

        self.procs.start(
            "worker1", self.mocker_argv(), self.dyn_env(DYN_SYSTEM_PORT=self.ports["w1_system"])
        )
        self.procs.start(
            "worker2",
            self.mocker_argv(["--data-parallel-size", "2"]),
            self.dyn_env(DYN_SYSTEM_PORT=self.ports["w2_system"]),
        )
        self.wait_for("two model cards in discovery", lambda: self.mdc_count() >= 2)
        self.procs.start("frontend", self.frontend_argv(), self.dyn_env())
        self.wait_for("frontend lists the model", self.model_listed)
        time.sleep(2)

        # Idle: what the workers send when nothing happens.
        set_phase("idle")
        keepalive = self.time_keepalive(self.args.idle_seconds)
        self.discovery_notes["keepalive_while_running"] = keepalive
        self.discovery_notes["files_while_running"] = self.copy_discovery(self.out / "discovery" / "kv")
        self.metrics_full["frontend_idle"] = self.scrape(self.ports["http"])

        set_phase("http-probe")
        self.probe_http()

        set_phase("prefill-overload")
        self.prefill_overload()

        set_phase("cooldown")
        time.sleep(4)

        set_phase("decode-overload")
        self.decode_overload()

        set_phase("idle-after-load")
        time.sleep(self.args.idle_seconds)
        self.metrics_full["frontend_after_load"] = self.scrape(self.ports["http"])
        self.metrics_full["worker1"] = self.scrape(self.ports["w1_system"])
        self.metrics_full["worker2"] = self.scrape(self.ports["w2_system"])
        self.keep_metric_lines("frontend_after_load", self.metrics_full["frontend_after_load"])

        set_phase("no-workers")
        self.no_workers()

        set_phase("worker-gate")
        self.worker_gate()

        set_phase("shutdown")
        self.procs.stop_all()
        self.nats.close()

    def probe_http(self):
        J = {"content-type": "application/json"}
        self.call("busy_threshold GET", "GET", "/busy_threshold")
        self.call("busy_threshold HEAD", "HEAD", "/busy_threshold")
        self.post_json("busy_threshold POST read", {"model": MODEL})
        self.post_json("busy_threshold POST read unknown model", {"model": "no-such-model"})
        self.post_json(
            "busy_threshold POST set decode",
            {"model": MODEL, "active_decode_blocks_threshold": 0.75},
        )
        self.post_json(
            "busy_threshold POST set all three",
            {
                "model": MODEL,
                "active_decode_blocks_threshold": 0.6,
                "active_prefill_tokens_threshold": 200,
                "active_prefill_tokens_threshold_frac": 0.25,
            },
        )
        self.post_json(
            "busy_threshold POST set unknown model (404)",
            {"model": "no-such-model", "active_decode_blocks_threshold": 0.5},
        )
        self.post_json(
            "busy_threshold POST negative active_prefill_tokens_threshold",
            {"model": MODEL, "active_prefill_tokens_threshold": -5},
        )
        self.post_json(
            "busy_threshold POST fractional active_prefill_tokens_threshold",
            {"model": MODEL, "active_prefill_tokens_threshold": 1.5},
        )
        self.post_json(
            "busy_threshold POST negative active_prefill_tokens_threshold_frac",
            {"model": MODEL, "active_prefill_tokens_threshold_frac": -0.5},
        )
        self.post_json(
            "busy_threshold POST active_decode_blocks_threshold above 1",
            {"model": MODEL, "active_decode_blocks_threshold": 1.5},
        )
        self.post_json(
            "busy_threshold POST negative active_decode_blocks_threshold",
            {"model": MODEL, "active_decode_blocks_threshold": -0.1},
        )
        self.post_json(
            "busy_threshold POST string threshold (wrong type)",
            {"model": MODEL, "active_decode_blocks_threshold": "0.5"},
        )
        self.post_json("busy_threshold POST missing model", {"active_decode_blocks_threshold": 0.5})
        self.post_json(
            "busy_threshold POST unknown field clear",
            {"model": MODEL, "clear": ["active_decode_blocks_threshold"]},
        )
        self.post_json(
            "busy_threshold POST waiting_requests_threshold field",
            {"model": MODEL, "waiting_requests_threshold": 3},
        )
        self.call("busy_threshold POST malformed JSON", "POST", "/busy_threshold", headers=J, body=b'{"model": ')
        self.call("busy_threshold POST empty body", "POST", "/busy_threshold", headers=J, body=b"")
        self.call("busy_threshold POST JSON array", "POST", "/busy_threshold", headers=J, body=b"[]")
        self.call(
            "busy_threshold POST text/plain",
            "POST",
            "/busy_threshold",
            headers={"content-type": "text/plain"},
            body=json.dumps({"model": MODEL}).encode(),
        )
        self.call(
            "busy_threshold POST no content-type",
            "POST",
            "/busy_threshold",
            body=json.dumps({"model": MODEL}).encode(),
        )
        self.call(
            "busy_threshold POST application/json; charset=utf-8",
            "POST",
            "/busy_threshold",
            headers={"content-type": "application/json; charset=utf-8"},
            body=json.dumps({"model": MODEL}).encode(),
        )
        for size in (65537, 2 * 1024 * 1024, 2 * 1024 * 1024 + 1):
            head = json.dumps({"model": MODEL}).encode()[:-1]
            body = head + b" " * (size - len(head) - 1) + b"}"
            assert len(body) == size
            self.call(
                f"busy_threshold POST body of {size} bytes",
                "POST",
                "/busy_threshold",
                headers=J,
                body=body,
                body_what=f'{{"model":"{MODEL}"}} padded with spaces before the closing brace to {size} bytes',
            )
        for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
            self.call(f"busy_threshold {method}", method, "/busy_threshold", headers=J, body=b"{}")
        self.call("busy_threshold GET after the probes", "GET", "/busy_threshold")
        # Back to the command-line values for the overload phases.
        self.post_json(
            "busy_threshold POST restore",
            {
                "model": MODEL,
                "active_decode_blocks_threshold": DECODE_THRESHOLD,
                "active_prefill_tokens_threshold": PREFILL_THRESHOLD,
            },
        )
        self.call("models GET", "GET", "/v1/models")
        self.call("health GET", "GET", "/health")
        self.call("live GET", "GET", "/live")
        self.call(
            "completions unknown model (404)",
            "POST",
            "/v1/completions",
            headers=J,
            body=json.dumps({"model": "no-such-model", "prompt": "w1 w2", "max_tokens": 2}).encode(),
        )
        self.call(
            "chat unknown model (404)",
            "POST",
            "/v1/chat/completions",
            headers=J,
            body=json.dumps(
                {"model": "no-such-model", "messages": [{"role": "user", "content": "w1"}], "max_tokens": 2}
            ).encode(),
        )
        self.call("completions 200", "POST", "/v1/completions", headers=J, body=self.completion_body(8, 1, 4))
        self.call("chat 200", "POST", "/v1/chat/completions", headers=J, body=self.chat_body(8, 2, 4))
        self.call(
            "completions streamed 200", "POST", "/v1/completions", headers=J, body=self.completion_body(8, 3, 3, True)
        )

    def prefill_overload(self):
        # Decode check effectively off (no rank can use more than all its blocks);
        # every prompt alone is above the prefill threshold, so a rank is busy
        # from the moment one request is booked on it until its prefill completes.
        self.post_json(
            "prefill phase: busy_threshold POST set",
            {"model": MODEL, "active_decode_blocks_threshold": 1.0, "active_prefill_tokens_threshold": PREFILL_THRESHOLD},
        )
        n_tokens = 3 * PREFILL_THRESHOLD // 2  # 150 > 100
        specs = []
        for i in range(14):
            specs.append((f"completions#{i}", "/v1/completions", self.completion_body(n_tokens, 100 + i, 8), True))
        specs.append(("completions_stream", "/v1/completions", self.completion_body(n_tokens, 150, 8, True), True))
        specs.append(("chat", "/v1/chat/completions", self.chat_body(n_tokens, 151, 8), True))
        specs.append(("chat_stream", "/v1/chat/completions", self.chat_body(n_tokens, 152, 8, True), True))
        gauges = []

        def settle():
            for _ in range(6):
                time.sleep(0.05)
                text = self.scrape(self.ports["http"])
                gauges.append(
                    {"t": CLOCK.now(), "lines": [ln for ln in text.splitlines() if ln.startswith("dynamo_frontend_worker_active_")]}
                )

        self.burst("prefill-overload", specs, settle)
        self.loads["prefill-overload"]["gauges_during"] = gauges
        text = self.scrape(self.ports["http"])
        self.keep_metric_lines("frontend_after_prefill_overload", text)

    def decode_overload(self):
        # Prefill check effectively off; prompts of 300 tokens book 19 blocks
        # each (block size 16), so two on a rank exceed half of its 64 blocks.
        self.post_json(
            "decode phase: busy_threshold POST set",
            {
                "model": MODEL,
                "active_decode_blocks_threshold": DECODE_THRESHOLD,
                "active_prefill_tokens_threshold": 1_000_000,
            },
        )
        specs = []
        for i in range(9):
            specs.append((f"completions#{i}", "/v1/completions", self.completion_body(300, 200 + i, 160), True))
        gauges = []
        probes = {}

        def settle():
            time.sleep(3.0)
            text = self.scrape(self.ports["http"])
            gauges.append(
                {"t": CLOCK.now(), "lines": [ln for ln in text.splitlines() if ln.startswith("dynamo_frontend_worker_active_")]}
            )
            J = {"content-type": "application/json"}
            probes["completions"] = self.call(
                "decode-overload:probe completions", "POST", "/v1/completions", headers=J, body=self.completion_body(20, 250, 4)
            )
            probes["completions_stream"] = self.call(
                "decode-overload:probe completions streamed",
                "POST",
                "/v1/completions",
                headers=J,
                body=self.completion_body(20, 251, 4, True),
            )
            probes["chat"] = self.call(
                "decode-overload:probe chat", "POST", "/v1/chat/completions", headers=J, body=self.chat_body(20, 252, 4)
            )
            probes["chat_stream"] = self.call(
                "decode-overload:probe chat streamed",
                "POST",
                "/v1/chat/completions",
                headers=J,
                body=self.chat_body(20, 253, 4, True),
            )
            self.call("decode-overload:busy_threshold GET while loaded", "GET", "/busy_threshold")
            text = self.scrape(self.ports["http"])
            gauges.append(
                {"t": CLOCK.now(), "lines": [ln for ln in text.splitlines() if ln.startswith("dynamo_frontend_worker_active_")]}
            )
            self.keep_metric_lines("frontend_during_decode_overload", text)

        self.burst("decode-overload", specs, settle, stagger=0.25)
        self.loads["decode-overload"]["gauges_during"] = gauges
        self.keep_metric_lines("frontend_after_decode_overload", self.scrape(self.ports["http"]))

    def no_workers(self):
        """Stop worker1 gracefully and kill worker2; record every distinct answer."""
        answers = []
        listing_changes = []
        stop = threading.Event()
        J = {"content-type": "application/json"}

        def poll():
            last = None
            i = 0
            while not stop.is_set():
                i += 1
                rec = http_call(
                    self.ports["http"], "POST", "/v1/completions", headers=J, body=self.completion_body(4, 300 + i, 2), timeout=30
                )
                rec["t"] = CLOCK.now()
                key = (rec.get("status"), body_text(rec) if rec.get("status") != 200 else "")
                if key != last:
                    answers.append(rec)
                    log(f"  no-workers answer {key[0]} {key[1][:100]}")
                    last = key
                time.sleep(0.05)

        def watch():
            last = None
            while not stop.is_set():
                names = sorted(x["path"] for x in self.discovery_listing())
                if names != last:
                    listing_changes.append({"t": CLOCK.now(), "wall": time.time(), "files": names})
                    last = names
                time.sleep(0.1)

        threads = [threading.Thread(target=poll, daemon=True), threading.Thread(target=watch, daemon=True)]
        for th in threads:
            th.start()
        time.sleep(1.0)
        self.procs.signal("worker1", signal.SIGTERM)
        self.procs.wait("worker1", 30)
        mark("worker1 exited", code=self.procs.procs["worker1"].returncode)
        time.sleep(1.0)
        self.discovery_notes["files_after_worker1_sigterm"] = self.discovery_listing()
        before_kill = {x["path"]: x["mtime"] for x in self.discovery_listing()}
        self.procs.signal("worker2", signal.SIGKILL)
        wall_kill = time.time()
        self.procs.wait("worker2", 10)
        t_kill = CLOCK.now()
        # Until the killed worker's records expire and the model is gone for 3 s.
        end = time.monotonic() + 45
        while time.monotonic() < end:
            time.sleep(0.5)
            if answers and answers[-1].get("status") == 404 and CLOCK.now() - answers[-1]["t"] > 3:
                break
        stop.set()
        for th in threads:
            th.join(40)
        self.no_worker_answers = answers
        self.discovery_notes["listing_changes_during_no_workers"] = [
            {"t": c["t"], "t_since_sigkill_worker2": round(c["t"] - t_kill, 3), "files": c["files"]}
            for c in listing_changes
        ]
        # When each of the killed worker's files went away, after its last keep-alive touch.
        gone = {}
        for prev, cur in zip(listing_changes, listing_changes[1:]):
            for path in set(prev["files"]) - set(cur["files"]):
                if path in before_kill and cur["wall"] > wall_kill:
                    gone[path] = {
                        "removed_after_last_touch_s": round(cur["wall"] - before_kill[path], 2),
                        "removed_after_sigkill_s": round(cur["wall"] - wall_kill, 2),
                    }
        self.discovery_notes["killed_worker_files_removed"] = gone
        self.discovery_notes["killed_worker_files_never_removed"] = sorted(
            p for p in before_kill if p not in gone and p in (listing_changes[-1]["files"] if listing_changes else [])
        )
        self.discovery_notes["sigkill_worker2_t"] = t_kill
        for n, rec in enumerate(answers):
            self.http_records[f"no-workers:answer {n}:{rec.get('status')}"] = rec
        self.call("no-workers: busy_threshold GET", "GET", "/busy_threshold")
        self.post_json("no-workers: busy_threshold POST read", {"model": MODEL})
        self.call("no-workers: models GET", "GET", "/v1/models")
        self.keep_metric_lines("frontend_no_workers", self.scrape(self.ports["http"]))

    def worker_gate(self):
        """One worker that admits W3_ENGINE_LIMIT requests, runs one sequence at a time
        (so the others wait in its scheduler queue) and rejects the rest itself."""
        self.procs.start(
            "worker3",
            self.mocker_argv(["--max-num-seqs", "1", "--max-num-batched-tokens", str(W3_MAX_BATCHED)]),
            self.dyn_env(
                DYN_SYSTEM_PORT=self.ports["w3_system"],
                DYN_ENGINE_REQUEST_LIMIT=W3_ENGINE_LIMIT,
                DYN_DYNAMO_REQUEST_QUEUE_LIMIT=0,
            ),
        )
        self.wait_for("frontend lists the model again", self.model_listed)
        self.call("worker-gate: busy_threshold GET on the re-added model", "GET", "/busy_threshold")
        self.post_json(
            "worker-gate: busy_threshold POST set (frontend checks off)",
            {"model": MODEL, "active_decode_blocks_threshold": 1.0, "active_prefill_tokens_threshold": 1_000_000},
        )
        specs = [(f"completions#{i}", "/v1/completions", self.completion_body(20, 400 + i, 40), True) for i in range(8)]
        specs.append(("chat", "/v1/chat/completions", self.chat_body(20, 450, 40), True))
        specs.append(("completions_stream", "/v1/completions", self.completion_body(20, 451, 40, True), True))
        def settle():
            time.sleep(0.5)
            self.keep_metric_lines("worker3_during_worker_gate", self.scrape(self.ports["w3_system"]))

        self.burst("worker-gate", specs, settle)
        self.metrics_full["worker3"] = self.scrape(self.ports["w3_system"])
        self.metrics_full["frontend_after_worker_gate"] = self.scrape(self.ports["http"])
        self.keep_metric_lines("frontend_after_worker_gate", self.metrics_full["frontend_after_worker_gate"])
        self.keep_metric_lines("worker3_after_worker_gate", self.metrics_full["worker3"])
        self.discovery_notes["files_with_worker3"] = self.copy_discovery(self.out / "discovery" / "kv-worker3")

    # ------------------------------------------------------------- output

    def write(self):
        out = self.out
        (out / "nats").mkdir(parents=True, exist_ok=True)
        (out / "http").mkdir(parents=True, exist_ok=True)
        (out / "metrics").mkdir(parents=True, exist_ok=True)
        msgs = self.nats.messages
        (out / "nats" / "summary.json").write_text(compact_json(self._nats_summary(msgs)))
        answers = self.http_records
        if self.args.lite:
            answers = {k: v for k, v in answers.items() if "overload" in k or "worker-gate" in k}
        (out / "http" / "answers.json").write_text(json.dumps(answers, indent=1) + "\n")
        (out / "http" / "loads.json").write_text(json.dumps(self.loads, indent=1) + "\n")
        (out / "metrics" / "selected-lines.json").write_text(json.dumps(self.metrics_lines, indent=1) + "\n")
        self.write_run()
        if self.args.lite:
            return

        # NATS: a capped sample of raw messages, and statistics over all of them.
        kept = []
        per = collections.Counter()
        first_of_publisher = set()
        for m in msgs:
            large = m["subject"].endswith(".kv-events")
            cap = KEEP_PER_SUBJECT_PHASE_LARGE if large else KEEP_PER_SUBJECT_PHASE
            key = (m["subject"], m["phase"])
            env = self._decode(m["payload"])
            pub = mp_get(env, "publisher_id") if env else None
            pub_key = (m["subject"], pub["value"] if pub else None)
            if per[key] < cap or pub_key not in first_of_publisher:
                per[key] += 1
                first_of_publisher.add(pub_key)
                kept.append(m)
        with open(out / "nats" / "messages.jsonl", "w") as f:
            for m in kept:
                rec = {
                    "t": m["t"],
                    "wall_ms": m["wall_ms"],
                    "phase": m["phase"],
                    "subject": m["subject"],
                    "reply": m["reply"],
                    "headers_b64": base64.b64encode(m["headers"]).decode() if m["headers"] else None,
                    "payload_b64": base64.b64encode(m["payload"]).decode(),
                }
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        # One raw binary file per subject (its first message), for byte-level tests.
        raw_dir = out / "nats" / "raw"
        raw_dir.mkdir(exist_ok=True)
        firsts = {}
        for m in msgs:
            firsts.setdefault(m["subject"], m)
        examples = {}
        for subj, m in firsts.items():
            (raw_dir / f"{subj}.msgpack").write_bytes(m["payload"])
            env = self._decode(m["payload"])
            examples[subj] = {
                "phase": m["phase"],
                "size": len(m["payload"]),
                "decoded": mp_plain(env) if env else None,
            }
        # And, per subject, the message that shows the most load, taken under load.
        best = {}
        for m in msgs:
            if m["phase"] in ("idle", "startup", "idle-after-load"):
                continue
            env = self._decode(m["payload"])
            inner = mp_get(env, "payload") if env else None
            inner = self._decode(inner["value"]) if inner and inner["type"].startswith("bin") else None
            if inner is None:
                continue
            score = load_score(m["subject"], inner)
            if score > 0 and score > best.get(m["subject"], (0, None))[0]:
                best[m["subject"]] = (score, m, env)
        for subj, (score, m, env) in best.items():
            (raw_dir / f"{subj}.loaded.msgpack").write_bytes(m["payload"])
            examples[f"{subj} (most loaded)"] = {"phase": m["phase"], "size": len(m["payload"]), "decoded": mp_plain(env)}
        (out / "nats" / "decoded-examples.json").write_text(json.dumps(examples, indent=1) + "\n")

        # Metrics.
        for name, text in self.metrics_full.items():
            if name in ("frontend_after_load", "worker2", "worker3"):
                (out / "metrics" / f"{name}.prom").write_text(text)
        families = {}
        for name, text in self.metrics_full.items():
            if name not in ("frontend_after_load", "frontend_after_worker_gate", "worker2", "worker3"):
                continue
            fam = {}
            for ln in text.splitlines():
                if ln.startswith("# TYPE "):
                    _, _, n, t = ln.split(" ", 3)
                    fam[n] = {"type": t, "labels": set()}
                elif ln and not ln.startswith("#"):
                    n = ln.split("{", 1)[0].split(" ", 1)[0]
                    base = n
                    for suf in ("_bucket", "_sum", "_count"):
                        if n.endswith(suf) and n[: -len(suf)] in fam:
                            base = n[: -len(suf)]
                    if "{" in ln and base in fam:
                        inner = ln.split("{", 1)[1].rsplit("}", 1)[0]
                        for part in inner.split('",'):
                            if "=" in part:
                                fam[base]["labels"].add(part.split("=", 1)[0].strip(","))
            families[name] = {k: {"type": v["type"], "labels": sorted(v["labels"])} for k, v in sorted(fam.items())}
        (out / "metrics" / "families.json").write_text(compact_json(families))
        (out / "discovery" / "notes.json").write_text(json.dumps(self.discovery_notes, indent=1) + "\n")
        if self.args.keep_logs:
            shutil.copytree(self.logs, out / "logs", dirs_exist_ok=True)

    def write_run(self):
        run = {
            "recorded_at_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": ["record_fixtures.py", *(relative(a) for a in sys.argv[1:])],
            "versions": self.versions(),
            "ports": self.ports,
            "model_dir": self.model_info,
            "constants": {
                "model": MODEL,
                "num_gpu_blocks_override": BLOCKS,
                "block_size": BLOCK_SIZE,
                "active_decode_blocks_threshold": DECODE_THRESHOLD,
                "active_prefill_tokens_threshold": PREFILL_THRESHOLD,
                "router_mode": self.args.router_mode,
                "worker3_engine_request_limit": W3_ENGINE_LIMIT,
                "worker3_request_queue_limit": 0,
                "worker3_max_num_seqs": 1,
                "worker3_max_num_batched_tokens": W3_MAX_BATCHED,
                "jetstream": self.args.jetstream,
            },
            "nats_server_info": self.nats.info,
            "timeline": TIMELINE,
        }
        (self.out / "run.json").write_text(json.dumps(run, indent=1) + "\n")

    @staticmethod
    def _decode(payload):
        try:
            node, end = mp_describe(payload)
            return node if end == len(payload) else None
        except Exception:
            return None

    def _nats_summary(self, msgs):
        by_subject = collections.defaultdict(list)
        for m in msgs:
            by_subject[m["subject"]].append(m)
        phase_span = {}
        for ev in TIMELINE:
            if ev["event"].startswith("phase "):
                phase_span.setdefault(ev["phase"], [ev["t"], None])
        ordered = [e for e in TIMELINE if e["event"].startswith("phase ")]
        for a, b in zip(ordered, ordered[1:]):
            phase_span[a["phase"]][1] = b["t"]
        if ordered:
            phase_span[ordered[-1]["phase"]][1] = CLOCK.now()
        summary = {"phases_s": phase_span, "subjects": {}}
        for subj, ms in sorted(by_subject.items()):
            schemas = collections.Counter()
            schema_widths = collections.defaultdict(lambda: collections.defaultdict(set))
            per_phase = collections.Counter(m["phase"] for m in ms)
            streams = collections.defaultdict(list)  # (publisher, worker, rank) -> [(t, phase, seq)]
            nil_or_not = collections.defaultdict(collections.Counter)
            with_headers = sum(1 for m in ms if m["headers"])
            for m in ms:
                env = self._decode(m["payload"])
                if env is None:
                    schemas["<not msgpack>"] += 1
                    continue
                raw_schema = mp_schema(env)
                norm = {k: normalize_wire_type(t) for k, t in raw_schema.items()}
                norm_key = json.dumps(norm, sort_keys=False)
                schemas[norm_key] += 1
                for k, t in raw_schema.items():
                    schema_widths[norm_key][k].add(t)
                pub = mp_get(env, "publisher_id")
                seq = mp_get(env, "sequence")
                inner = None
                p = mp_get(env, "payload")
                if p is not None and p["type"].startswith("bin"):
                    inner = self._decode(p["value"])
                worker = mp_get(inner, "worker_id") if inner else None
                if worker is None and inner is not None:
                    worker = mp_get(inner, "worker", "worker_id")
                rank = mp_get(inner, "dp_rank") if inner else None
                if rank is None and inner is not None:
                    rank = mp_get(inner, "worker", "dp_rank")
                streams[
                    (
                        pub["value"] if pub else None,
                        str(worker["value"]) if worker else None,
                        rank["value"] if rank else None,
                    )
                ].append((m["t"], m["phase"], seq["value"] if seq else None))
                if inner is not None and inner["type"].endswith("map"):
                    for k, v in inner["value"]:
                        nil_or_not[k][v["type"]] += 1
                if inner is not None and subj.endswith("active_sequences_events"):
                    data = mp_get(inner, "data")
                    if data is not None:
                        kind = data["value"] if "str" in data["type"] else [k for k, _ in data["value"]][0]
                        nil_or_not["data kinds"][str(kind)] += 1
            stream_stats = []
            for (pub, worker, rank), pts in sorted(streams.items(), key=lambda kv: str(kv[0])):
                per = {}
                for ph in per_phase:
                    ts = [t for t, p, _ in pts if p == ph]
                    if not ts:
                        continue
                    span = phase_span.get(ph)
                    dur = (span[1] - span[0]) if span and span[1] else None
                    gaps = [round(b - a, 3) for a, b in zip(ts, ts[1:])]
                    per[ph] = {
                        "count": len(ts),
                        "per_second": round(len(ts) / dur, 3) if dur else None,
                        "median_gap_s": statistics.median(gaps) if gaps else None,
                        "max_gap_s": max(gaps) if gaps else None,
                    }
                seqs = [s for _, _, s in pts if s is not None]
                stream_stats.append(
                    {
                        "publisher_id": pub,
                        "worker_id": worker,
                        "dp_rank": rank,
                        "count": len(pts),
                        "sequence_first_last": [seqs[0], seqs[-1]] if seqs else None,
                        "sequence_strictly_increasing_by_1": all(b == a + 1 for a, b in zip(seqs, seqs[1:])),
                        "by_phase": per,
                    }
                )
            summary["subjects"][subj] = {
                "count": len(ms),
                "with_nats_headers": with_headers,
                "by_phase": dict(per_phase),
                "envelope_schemas": [
                    {
                        "count": c,
                        "schema": json.loads(sch) if sch.startswith("{") else sch,
                        "wire_types_seen": {
                            k: sorted(v) for k, v in schema_widths[sch].items() if len(v) > 1 or "int" in next(iter(v))
                        },
                    }
                    for sch, c in schemas.items()
                ],
                "payload_key_wire_types": {k: dict(v) for k, v in nil_or_not.items()},
                "streams": stream_stats,
            }
        return summary

    def versions(self):
        v = {}
        try:
            from importlib import metadata

            for dist in ("ai-dynamo", "ai-dynamo-runtime", "tokenizers", "pydantic", "uvloop"):
                try:
                    v[dist] = metadata.version(dist)
                except metadata.PackageNotFoundError:
                    v[dist] = None
        except Exception:
            pass
        try:
            v["nats-server"] = subprocess.run(["nats-server", "--version"], capture_output=True, text=True).stdout.strip()
        except OSError:
            v["nats-server"] = None
        v["python"] = sys.version.split()[0]
        v["platform"] = f"{os.uname().sysname} {os.uname().release} {os.uname().machine}"
        return v


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="fixture folder to (re)write")
    ap.add_argument("--python", help="Python with ai-dynamo installed (default: this one)")
    ap.add_argument("--router-mode", default="kv", help="frontend --router-mode (default kv)")
    ap.add_argument("--idle-seconds", type=float, default=12.0)
    ap.add_argument("--jetstream", action="store_true", help="start nats-server with -js")
    ap.add_argument("--keep-logs", action="store_true", help="copy the processes' logs into --out/logs")
    ap.add_argument(
        "--lite",
        action="store_true",
        help="write only run.json, the overload answers, the selected metric lines and the NATS summary",
    )
    args = ap.parse_args()
    out = Path(args.out)
    for sub in ("nats", "http", "metrics", "discovery", "logs"):
        if (out / sub).exists():
            shutil.rmtree(out / sub)
    out.mkdir(parents=True, exist_ok=True)
    rec = Recorder(args)
    ok = False
    try:
        rec.run()
        ok = True
    finally:
        rec.procs.stop_all()
        if hasattr(rec, "nats"):
            rec.nats.close()
            rec.write()
        if ok:
            shutil.rmtree(rec.work, ignore_errors=True)
            log(f"done; fixtures in {rec.out}")
        else:
            log(f"failed; the processes' logs are in {rec.logs}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
