"""The recorder's shared settings and helpers: ports, logging, the run's clock,
phases and timeline."""

from __future__ import annotations

import os
import socket
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


def dynamo_env(home: Path, nats_port: int, **settings: str) -> dict:
    """The environment of a Dynamo process on loopback: this one's, less its
    DYN_*, NATS_* and ETCD_* variables, with HOME, the NATS server, the TCP
    request plane and every listener on 127.0.0.1 (the default binds the
    first non-loopback address), offline, plain logs; then `settings`
    (DYN_DISCOVERY_BACKEND, DYN_FILE_KV, ETCD_ENDPOINTS, DYN_SYSTEM_PORT...)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "NATS_", "ETCD_"))}
    env.update(
        {
            "HOME": str(home),
            "NATS_SERVER": f"nats://{HOST}:{nats_port}",
            "DYN_REQUEST_PLANE": "tcp",
            "DYN_EVENT_PLANE": "nats",
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
    env.update({k: str(v) for k, v in settings.items()})
    return env


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
