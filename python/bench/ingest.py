"""Report ingest of a Python `Monitor` fed over NATS, with and without
hundreds of requests waiting in its flow-control queue: a report never takes
the GIL or runs waiting requests' code (it only kicks the queue; the
monitor's maintenance thread sends what waits), so the shared I/O thread
should apply reports as fast either way, even while the main thread holds
the GIL most of the time.

How: a `nats-server` of its own (free loopback port) and a publisher process
(spawn) whose `Reporter`s, one per worker of model "m", report as fast as a
Python loop can: 95 of 100 KV blocks used (busy above half), except one
report in `--free-every` with 5, freeing the worker until its next report (a
Reporter coalesces reports made while it sends, so only part of them, frees
included, become messages). The main thread's asyncio loop computes pure
Python in `--chunk-ms` chunks, `await asyncio.sleep(0)` between them. Two
conditions, interleaved, `--rounds` windows of `--seconds` s each (after
`--settle` s): (a) no-queue, flow control off; (b) queue, flow control on
(queue_limit 1000) and `--waiters` tasks looping
`t = await monitor.dispatch("m", blocks=1)`; `t.complete()`.

Per window: reports applied/s (`Subscription.stats()["applied"]`); messages
the server took in/s (/varz `in_msgs`: where applied/s matches it, the
monitor kept up and the rate is the publisher's); requests sent/s and mean
waiting; main-thread chunks/s; from /proc (Linux) the CPU share of the I/O,
maintenance ("mon") and main threads, and the I/O thread's CPU per report.
`--main idle` sleeps instead of computing. Measurement only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, Iterator, List, Tuple
from urllib.request import urlopen

import loadgate

MODEL, NAMESPACE = "m", "ingest"
TOTAL_BLOCKS, BUSY_BLOCKS, FREE_BLOCKS = 100, 95, 5
CONDITIONS = ("no-queue", "queue")
# The table's columns: heading, key of a window's result, format.
COLUMNS = [("applied/s", "applied_per_s", "9.0f"), ("publ/s", "published_per_s", "9.0f"),
           ("sent/s", "sent_per_s", "7.0f"), ("waiting", "waiting", "7.0f"), ("chunks/s", "chunks_per_s", "8.0f"),
           ("io us/rep", "io_us_per_report", "9.2f"),
           ("cpu io", "cpu_io", "6.2f"), ("mon", "cpu_mon", "5.2f"), ("main", "cpu_main", "5.2f")]

# ----- the nats-server and the publisher process ------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def nats_server(log: str) -> Iterator[Tuple[str, str]]:
    """A `nats-server` on free loopback ports: yields its URL and that of its
    counters (/varz) once it greets, and always stops it on exit."""
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    port, http_port = free_port(), free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary, "-a", "127.0.0.1", "-p", str(port), "-m", str(http_port)],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                if s.recv(4).startswith(b"INFO"):
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("nats-server did not start:\n" + open(log, errors="replace").read())
            time.sleep(0.02)
        yield f"nats://127.0.0.1:{port}", f"http://127.0.0.1:{http_port}/varz"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def publish(url: str, workers: int, free_every: int, stop: Any, parent: int, budget: float) -> None:
    """The publisher process: reports as fast as it can until told to stop,
    its parent is gone or `budget` seconds have passed."""
    reporters = [loadgate.Reporter(url, w, MODEL, namespace=NAMESPACE, kv_total_blocks=TOTAL_BLOCKS)
                 for w in range(1, workers + 1)]
    # One cycle: each worker reports `free_every` times, one of them freeing
    # it, the frees staggered across workers. Repeated to ~1024 calls.
    cycle = [(reporters[w].report, FREE_BLOCKS if (k + w) % free_every == 0 else BUSY_BLOCKS)
             for k in range(free_every) for w in range(workers)]
    batch = cycle * max(1, 1024 // len(cycle))
    end = time.monotonic() + budget
    try:
        while not stop.is_set() and os.getppid() == parent and time.monotonic() < end:
            for report, used in batch:
                report(0, kv_used_blocks=used)
    finally:
        for r in reporters:
            r.close()


# ----- the frontend's windows ---------------------------------------------------


def thread_cpu() -> Dict[str, float]:
    """CPU seconds so far of this process's threads by name ("main": the
    main thread); empty without /proc."""
    cpu: Dict[str, float] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                with open(f"/proc/self/task/{tid}/comm") as f:
                    name = "main" if int(tid) == os.getpid() else f.read().strip()
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()  # utime, stime: fields 14, 15
                cpu[name] = cpu.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return cpu


def crunch(n: int) -> int:
    """Pure-Python arithmetic: holds the GIL throughout."""
    x = 0
    for i in range(n):
        x = (x * 31 + i) % 1_000_003
    return x


def calibrate(ms: float) -> int:
    """The `crunch` size that takes about `ms` milliseconds (best of 10:
    time the scheduler gives other processes is left out)."""
    n, best = 20_000, float("inf")
    for _ in range(10):
        start = time.perf_counter()
        crunch(n)
        best = min(best, time.perf_counter() - start)
    return max(1, int(n * ms / 1000 / best))


async def window(monitor: Any, sub: Any, varz: str, queue: bool, args: Any, size: int) -> Dict[str, float]:
    """One measured window of one condition; returns its rates."""
    stopping, sent, waiting = False, 0, 0

    async def waiter() -> None:
        nonlocal sent, waiting
        while not stopping:
            waiting += 1
            try:
                ticket = await monitor.dispatch(MODEL, blocks=1, deadline=args.deadline)
            except loadgate.LoadgateError:  # queue_deadline; queue_full once the queue is off
                pass
            else:
                ticket.complete()
                sent += 1
            finally:
                waiting -= 1
            await asyncio.sleep(0)  # one sent at once would otherwise never yield

    async def work(until: float) -> Tuple[int, int]:
        """Chunks of work until `until`; returns their number and the sum of
        the requests waiting (in `dispatch`) seen after each."""
        chunks = seen = 0
        while time.monotonic() < until:
            if args.main == "idle":
                await asyncio.sleep(args.chunk_ms / 1000)
            else:
                crunch(size)
                await asyncio.sleep(0)
            chunks, seen = chunks + 1, seen + waiting
        return chunks, seen

    def snapshot() -> Dict[str, Any]:
        with urlopen(varz, timeout=5) as r:  # the server's count of messages in
            published = json.load(r)["in_msgs"]
        return {"applied": sub.stats()["applied"], "published": published, "sent": sent, "cpu": thread_cpu(),
                "t": time.monotonic()}

    tasks: List["asyncio.Task[None]"] = []
    if queue:
        monitor.set_flow_control(MODEL, queue_limit=max(1000, args.waiters))
        tasks = [asyncio.ensure_future(waiter()) for _ in range(args.waiters)]
    try:
        await work(time.monotonic() + args.settle)  # the queue fills up
        s0 = snapshot()
        chunks, seen = await work(s0["t"] + args.seconds)
        s1 = snapshot()
    finally:
        stopping = True
        if queue:
            monitor.set_flow_control(MODEL, queue_limit=0)  # off: refuses what waits
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    el = float(s1["t"] - s0["t"])

    def rate(key: str) -> float:
        return float(s1[key] - s0[key]) / el

    def cpu(prefix: str) -> float:  # CPU seconds per second (thread names are cut at 15 characters)
        return float(sum(v - s0["cpu"].get(k, 0.0) for k, v in s1["cpu"].items() if k.startswith(prefix))) / el

    applied = rate("applied")
    return {
        "applied_per_s": applied, "published_per_s": rate("published"), "sent_per_s": rate("sent"),
        "waiting": seen / max(chunks, 1), "chunks_per_s": chunks / el,
        "io_us_per_report": cpu("loadgate-io") / applied * 1e6 if applied else 0.0,
        "cpu_io": cpu("loadgate-io"), "cpu_mon": cpu("loadgate-moni"), "cpu_main": cpu("main"),
    }


def table_line(label: str, condition: str, row: Dict[str, float]) -> str:
    return f"{label:>6} {condition:9} " + " ".join(f"{row[key]:{f}}" for _, key, f in COLUMNS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of both conditions (default 5)")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of a measured window (default 3)")
    parser.add_argument("--settle", type=float, default=0.5, help="unmeasured lead-in of a window (default 0.5)")
    parser.add_argument("--waiters", type=int, default=500, help="dispatching tasks in (b) (default 500)")
    parser.add_argument("--workers", type=int, default=4, help="reporting workers of model m (default 4)")
    parser.add_argument("--free-every", type=int, default=10, help="one report in this many frees (default 10)")
    parser.add_argument("--chunk-ms", type=float, default=2.0, help="main thread's chunk of work (default 2)")
    parser.add_argument("--deadline", type=float, default=5.0, help="a dispatch's queue deadline (default 5)")
    parser.add_argument("--main", choices=("compute", "idle"), default="compute",
                        help="the main thread computes between yields (default) or sleeps")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    if args.rounds < 1 or args.seconds <= 0 or args.workers < 1 or args.free_every < 1:
        parser.error("--rounds, --seconds, --workers and --free-every must be positive")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a terminated run still stops its processes
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    budget = args.rounds * 2 * (args.seconds + args.settle + 5) + 30  # the publisher's own bound
    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, nats_server(os.path.join(tmp, "nats-server.log")) as (url, varz):
        monitor = loadgate.Monitor()
        with monitor.subscribe_nats(url, NAMESPACE) as sub:
            proc = ctx.Process(target=publish, daemon=True,
                               args=(url, args.workers, args.free_every, stop, os.getpid(), budget))
            proc.start()
            try:
                deadline = time.monotonic() + 30
                while len(monitor.models()) == 0 or len(monitor.workers(MODEL)) < args.workers:
                    if not proc.is_alive() or time.monotonic() > deadline:
                        raise SystemExit("the publisher's workers did not show up")
                    time.sleep(0.02)
                monitor.set_thresholds(MODEL, active_decode_blocks_threshold=0.5)
                size = calibrate(args.chunk_ms)
                if not args.json:
                    print(f"loadgate {loadgate.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs,"
                          f" {args.rounds} rounds of {args.seconds} s, main thread: {args.main}")
                    print(f"{'round':>6} {'condition':9} " + " ".join(f"{h:>{f.split('.')[0]}}" for h, _, f in COLUMNS))
                for r in range(args.rounds):
                    for queue in ((False, True) if r % 2 == 0 else (True, False)):
                        row = asyncio.run(window(monitor, sub, varz, queue, args, size))
                        rows.append({"round": r + 1, "condition": CONDITIONS[queue], **row})
                        if not args.json:
                            print(table_line(str(r + 1), CONDITIONS[queue], row))
            finally:
                stop.set()
                proc.join(10)
                if proc.is_alive():
                    proc.terminate()
                    proc.join(5)

    medians = {c: {key: statistics.median(row[key] for row in rows if row["condition"] == c) for _, key, _ in COLUMNS}
               for c in CONDITIONS}
    a, b = medians["no-queue"]["applied_per_s"], medians["queue"]["applied_per_s"]
    ratio = b / a if a else float("inf")
    if args.json:
        print(json.dumps({"settings": vars(args), "cpus": os.cpu_count(), "rounds": rows, "medians": medians,
                          "ratio_queue_over_no_queue": ratio}, indent=2))
        return
    for c in CONDITIONS:
        print(table_line("median", c, medians[c]))
    print(f"\nmedian reports applied/s: (a) no-queue {a:.0f}, (b) queue {b:.0f}; (b)/(a) = {ratio:.3f}")
    for c in CONDITIONS:
        m = medians[c]
        print(f"  {c}: applied / published {m['applied_per_s'] / max(m['published_per_s'], 1):.3f},"
              f" I/O thread {m['io_us_per_report']:.2f} us of CPU per report")


if __name__ == "__main__":
    main()
