"""End-to-end demo: ``python -m loadgate.demo`` (needs ``uvicorn`` and ``httpx``).

A real HTTP frontend (uvicorn on a loopback port) routes completions through
a :class:`~loadgate.Monitor` to a few in-process workers, each guarded by an
:class:`~loadgate.AdmissionGate`, and streams each answer while the worker's
permit is held. A load generator (httpx) ramps up the number of concurrent
users phase by phase while a live table shows throughput, 529/503 counts,
busy workers and every worker's running/queued requests:

* ``warm-up`` .. ``overload``: more users than slots; the frontend routes
  around full workers and answers 529 ``all_workers_busy`` when all are;
* ``no threshold``: an operator clears the busy threshold through ``POST
  /busy_threshold``; now the workers' own gates refuse with 529
  ``worker_at_capacity`` and the frontend puts those workers on a lease;
* ``drained``: every worker is removed; the frontend answers 503.

It ends with a summary per phase and a few checks (slots never exceeded,
529s under overload, 503s once drained); the exit code is 1 if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Dict, List, Optional, Sequence, Tuple

import loadgate
from loadgate.asgi import ControlApp, LoadgateMiddleware, Receive, Scope, Send, hold_permit

MODEL = "demo-model"
#: KV blocks one running request occupies.
BLOCKS_PER_REQUEST = 16


class Worker:
    """An in-process engine with `slots` slots and a queue of `queue`."""

    def __init__(self, worker_id: int, slots: int, queue: int, tokens: int, token_time: float) -> None:
        self.id = worker_id
        self.slots = slots
        self.gate = loadgate.AdmissionGate(slots, queue, metrics_prefix=f"worker{worker_id}")
        self.tokens = tokens
        self.token_time = token_time
        self.max_running = 0

    @property
    def kv_total_blocks(self) -> int:
        return self.slots * BLOCKS_PER_REQUEST

    def kv_used_blocks(self) -> int:
        return self.gate.running * BLOCKS_PER_REQUEST

    async def generate(self) -> AsyncIterator[bytes]:
        """Streams `tokens` server-sent events, one per `token_time`."""
        self.max_running = max(self.max_running, self.gate.running)
        for i in range(self.tokens):
            await asyncio.sleep(self.token_time)
            yield f"data: {json.dumps({'worker': self.id, 'token': i})}\n\n".encode()
        yield b"data: [DONE]\n\n"


class Frontend:
    """The HTTP frontend: ``POST /v1/completions`` routed by the monitor."""

    def __init__(self, monitor: loadgate.Monitor, workers: Dict[int, Worker]) -> None:
        self.monitor = monitor
        self.workers = workers

    def publish_load(self) -> None:
        """What each worker would publish: its KV use (here, its running requests)."""
        for worker in list(self.workers.values()):
            try:
                self.monitor.report(worker.id, kv_used_blocks=worker.kv_used_blocks())
            except KeyError:
                pass  # removed meanwhile

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/completions" or scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        while (await receive()).get("more_body", False):
            pass
        worker_id = self.monitor.select(MODEL)  # Overloaded (529) / Unavailable (503)
        worker = self.workers[worker_id]
        try:
            permit = await worker.gate.admit()
        except loadgate.AtCapacity:
            self.monitor.mark_overloaded(worker_id)
            raise
        self.publish_load()
        stream = hold_permit(permit, worker.generate())
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"x-worker-id", str(worker_id).encode())],
                }
            )
            async for chunk in stream:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await stream.aclose()  # releases the permit if the client left early
            self.publish_load()


@dataclass
class Phase:
    name: str
    users: int
    ok: int = 0
    unavailable: int = 0
    errors: int = 0
    overloaded: Counter = field(default_factory=Counter)  # type: ignore[type-arg]
    latencies: List[float] = field(default_factory=list)

    @property
    def total_529(self) -> int:
        return sum(self.overloaded.values())


@dataclass
class Stats:
    phase: Phase
    phases: List[Phase] = field(default_factory=list)

    def record(self, status: Optional[int], reason: Optional[str], latency: float) -> None:
        p = self.phase
        if status == 200:
            p.ok += 1
            p.latencies.append(latency)
        elif status == 503:
            p.unavailable += 1
        elif status is not None and status == loadgate.overload_status_code():
            p.overloaded[reason or "?"] += 1
        else:
            p.errors += 1


async def user(client: Any, url: str, stats: Stats, stop: asyncio.Event, backoff: float) -> None:
    """One client: request, read the whole stream, repeat; back off a little after a rejection."""
    while not stop.is_set():
        start = time.perf_counter()
        status: Optional[int] = None
        reason: Optional[str] = None
        try:
            async with client.stream("POST", url, json={"model": MODEL, "prompt": "hi"}) as response:
                async for _ in response.aiter_bytes():
                    pass
                status = response.status_code
                reason = response.headers.get(loadgate.REASON_HEADER)
        except Exception:  # a connection error counts as an error, not a crash
            status = None
        stats.record(status, reason, time.perf_counter() - start)
        if status != 200:
            await asyncio.sleep(backoff)


def bind_loopback(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(args: argparse.Namespace, out: Any) -> int:
    import httpx
    import uvicorn

    monitor = loadgate.Monitor(lease_seconds=0.25)
    workers = {
        wid: Worker(wid, args.slots, args.queue, args.tokens, args.token_time)
        for wid in range(1, args.workers + 1)
    }
    for w in workers.values():
        monitor.add_worker(MODEL, w.id, kv_total_blocks=w.kv_total_blocks)
    # Busy when more than 75 % of the KV cache is in use: here, all slots full.
    monitor.set_thresholds(MODEL, active_decode_blocks_threshold=0.75)
    frontend = Frontend(monitor, workers)
    app = LoadgateMiddleware(ControlApp(monitor, [w.gate for w in workers.values()], app=frontend))

    sock = bind_loopback(args.port)
    host, port = sock.getsockname()[:2]
    base = f"http://{host}:{port}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
    # The server gets its own thread and event loop, so that the load
    # generator (this loop) does not slow the frontend down as much.
    server_thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="frontend", daemon=True)
    server_thread.start()
    while not server.started:
        if not server_thread.is_alive():
            print("the frontend failed to start", file=out)
            return 1
        await asyncio.sleep(0.01)

    phase_time = args.duration / 6
    plan: List[Tuple[str, int]] = [
        ("warm-up", max(1, args.workers // 2)),
        ("rising", args.workers * args.slots // 2),
        ("peak", args.workers * args.slots),
        ("overload", args.workers * (args.slots + args.queue) * 2),
        ("no threshold", args.workers * (args.slots + args.queue) * 2),
        ("drained", args.workers * args.slots),
    ]
    stats = Stats(Phase(*plan[0]))
    print(f"loadgate {loadgate.__version__} demo: frontend on {base}, {args.workers} workers x "
          f"{args.slots} slots + {args.queue} queued, {args.tokens} tokens x {args.token_time * 1000:.0f} ms",
          file=out)
    header = f"{'t':>5} {'phase':<13}{'users':>6}{'ok/s':>8}{'529/s':>8}{'503/s':>8}  {'busy':<10}running/queued per worker"
    print(header, file=out)
    print("-" * len(header), file=out)

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=30.0, limits=limits) as client:
        url = f"{base}/v1/completions"
        tasks: List["asyncio.Task[None]"] = []
        stop = asyncio.Event()
        started = time.perf_counter()
        for name, users in plan:
            phase = Phase(name, users)
            stats.phase = phase
            stats.phases.append(phase)
            if name == "no threshold":
                r = await client.post(
                    f"{base}/busy_threshold",
                    json={"model": MODEL, "clear": ["active_decode_blocks_threshold"]},
                )
                r.raise_for_status()
            if name == "drained":
                for wid in list(workers):
                    monitor.remove_worker(wid)
            while len(tasks) < users:
                tasks.append(asyncio.ensure_future(user(client, url, stats, stop, args.backoff)))
            while len(tasks) > users:
                tasks.pop().cancel()
            phase_end = time.perf_counter() + phase_time
            last = (phase.ok, phase.total_529, phase.unavailable, time.perf_counter())
            while time.perf_counter() < phase_end:
                await asyncio.sleep(min(args.interval, max(0.0, phase_end - time.perf_counter())))
                frontend.publish_load()
                now = time.perf_counter()
                dt = max(now - last[3], 1e-9)
                rates = ((phase.ok - last[0]) / dt, (phase.total_529 - last[1]) / dt, (phase.unavailable - last[2]) / dt)
                last = (phase.ok, phase.total_529, phase.unavailable, now)
                busy = ",".join(map(str, monitor.busy_workers(MODEL))) or "-"
                per_worker = " ".join(f"{w.gate.running}/{w.gate.queued}" for w in workers.values())
                print(f"{now - started:5.1f} {name:<13}{users:>6}{rates[0]:>8.0f}{rates[1]:>8.0f}{rates[2]:>8.0f}  "
                      f"{busy:<10}{per_worker}", file=out)
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        metrics = (await client.get(f"{base}/metrics")).text

    server.should_exit = True
    await asyncio.get_running_loop().run_in_executor(None, server_thread.join)

    print(file=out)
    print(f"{'phase':<13}{'users':>6}{'ok':>7}{'529':>7}{'503':>7}{'p50 ms':>8}{'p99 ms':>8}  529 reasons", file=out)
    for p in stats.phases:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(p.overloaded.items())) or "-"
        print(f"{p.name:<13}{p.users:>6}{p.ok:>7}{p.total_529:>7}{p.unavailable:>7}"
              f"{percentile(p.latencies, 0.5) * 1000:>8.0f}{percentile(p.latencies, 0.99) * 1000:>8.0f}  {reasons}",
              file=out)
    rejections = [line for line in metrics.splitlines()
                  if line.startswith(("dynamo_frontend_model_rejection_total", "worker1_rejection_request_total"))]
    print("\nfrom /metrics: " + "; ".join(rejections), file=out)

    by_name = {p.name: p for p in stats.phases}
    checks = [
        ("requests served", sum(p.ok for p in stats.phases) > 0),
        ("no worker ran more than its slots", all(w.max_running <= w.slots for w in workers.values())),
        ("529 under overload", by_name["overload"].total_529 + by_name["no threshold"].total_529 > 0),
        ("503 once drained", by_name["drained"].unavailable > 0),
        ("no transport errors", sum(p.errors for p in stats.phases) == 0),
    ]
    print("checks: " + ", ".join(f"{name} {'ok' if good else 'FAILED'}" for name, good in checks), file=out)
    return 0 if all(good for _, good in checks) else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadgate.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3, help="in-process workers (default 3)")
    parser.add_argument("--slots", type=int, default=4, help="engine slots N per worker (default 4)")
    parser.add_argument("--queue", type=int, default=2, help="queue size Q per worker (default 2)")
    parser.add_argument("--tokens", type=int, default=25, help="tokens streamed per request (default 25)")
    parser.add_argument("--token-time", type=float, default=0.016, help="seconds per token (default 0.016)")
    parser.add_argument("--duration", type=float, default=18.0, help="seconds of load (default 18)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between table rows (default 1)")
    parser.add_argument("--backoff", type=float, default=0.05, help="client pause after a rejection (default 0.05)")
    parser.add_argument("--port", type=int, default=0, help="frontend port on 127.0.0.1 (default: any free)")
    parser.add_argument("--quick", action="store_true", help="a short run (for tests)")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.interval, args.token_time = 4.5, 0.25, 0.008
    if min(args.workers, args.slots, args.tokens) < 1 or args.queue < 0 or args.duration <= 0:
        parser.error("--workers, --slots and --tokens must be >= 1, --queue >= 0, --duration > 0")
    try:
        import httpx  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        print("the demo needs uvicorn and httpx: pip install uvicorn httpx", file=sys.stderr)
        return 2
    return asyncio.run(run(args, sys.stdout))


if __name__ == "__main__":
    raise SystemExit(main())
