"""What the recorder runs and talks to: the NATS recorder thread, the HTTP
helper, the processes, and the tokenizer made locally."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import BLOCK_SIZE, BLOCKS, CLOCK, HOST, MODEL, PHASE, dynamo_env, free_port, mark

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


class Loopback:
    """A scratch directory with the tiny model, nats-server on a free port
    with a recorder on every subject, and what every Dynamo process here is
    started with: file discovery, the TCP request plane, the NATS event
    plane (``common``), and a mocker's command line (``mocker``)."""

    def __init__(self, prefix: str) -> None:
        self.work = Path(tempfile.mkdtemp(prefix=prefix))
        (self.work / "home").mkdir()
        self.kv = self.work / "kv"
        self.model = self.work / "model"
        make_model_dir(self.model)
        self.procs = Procs(self.work)
        self.nats, self.http = free_port(), free_port()
        self.procs.start("nats", ["nats-server", "-a", HOST, "-p", str(self.nats)], dict(os.environ))
        time.sleep(0.5)
        self.recorder = NatsRecorder(self.nats)
        self.recorder.start()
        self.env = dynamo_env(self.work / "home", self.nats, DYN_DISCOVERY_BACKEND="file", DYN_FILE_KV=str(self.kv))
        self.common = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "nats"]
        self.mocker = [sys.executable, "-m", "dynamo.mocker", "--model-path", str(self.model), "--model-name",
                       MODEL, *self.common, "--num-gpu-blocks-override", str(BLOCKS), "--block-size",
                       str(BLOCK_SIZE)]

    def wait_for_model(self, limit: float = 90.0) -> None:
        """Waits until the frontend on ``self.http`` lists the model."""
        import urllib.request

        deadline = time.monotonic() + limit
        while True:
            try:
                with urllib.request.urlopen(f"http://{HOST}:{self.http}/v1/models", timeout=2) as r:
                    if MODEL in r.read().decode():
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, f"the frontend never listed the model; logs in {self.work}"
            time.sleep(0.5)
