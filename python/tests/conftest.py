"""Shared helpers: a real uvicorn server on a free loopback port, Python
subprocesses with a chosen environment, and a model's frontend queue length
as the monitor reports it."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Iterator, Optional

import pytest


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """Runs `app` under uvicorn on 127.0.0.1 (a free port) in a thread with
    its own event loop; yields the base URL and stops the server after.

    The socket is made as TCP (`IPPROTO_TCP`, not protocol 0): asyncio turns
    on TCP_NODELAY only for sockets it sees as TCP, and without it each
    streamed answer stalls on delayed ACKs (tens of milliseconds on Linux)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app, http="h11", ws="none", lifespan="off", log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # reported to the test below
            errors.append(exc)

    thread = threading.Thread(target=run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if errors or not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start: {errors!r}")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"
        assert not errors, errors


def run_python(
    code: str, env: Optional[Dict[str, str]] = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter; `env` entries are added to the
    environment (a value of None removes the variable)."""
    full = dict(os.environ)
    for key in ("DYN_HTTP_OVERLOAD_STATUS_CODE", "DYN_DYNAMO_REQUEST_QUEUE_LIMIT", "DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS"):
        full.pop(key, None)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=timeout
    )


def flow_queued(monitor: Any, model: str) -> int:
    """Requests waiting in `model`'s frontend queue, read from the monitor's
    `frontend_queue_requests` gauge (0 while the model has no queue)."""
    pattern = r'^\w*frontend_queue_requests\{model="%s"\} (\d+)$' % re.escape(model)
    found = re.search(pattern, monitor.metrics_text(), re.MULTILINE)
    return int(found.group(1)) if found else 0


@pytest.fixture
def monitor() -> Any:
    """A monitor with model "m": workers 1 and 2, two ranks each, 100 KV blocks."""
    import loadgate

    m = loadgate.Monitor()
    m.add_worker("m", 1, dp_size=2, kv_total_blocks=100)
    m.add_worker("m", 2, dp_size=2, kv_total_blocks=100)
    return m
