"""loadgate's Python hot paths against what a user would otherwise write.

Measures, in one run:

* **asyncio queued admission**: two tasks contending for a gate of one
  slot, each looping admit, yield (``asyncio.sleep(0)``), release, so that
  every admission but the first waits in the queue and is handed the slot
  by the other task's release. loadgate's ``await gate.admit()`` against
  ``asyncio.Semaphore(1)`` and against :class:`PyGate`, a ~30-line
  pure-Python gate (a deque of futures, with the same N + Q rule and a
  permit object), and against the floor: the same cycle with the gate
  replaced by what any FIFO gate of one slot must do per queued admission
  (one future created, awaited and settled, inline), so that what is left
  is the event loop's share, which no gate removes;
* **try_admit() + release()** on a gate with a free slot: loadgate against
  :class:`PyGate`;
* **Monitor.select("m")**, round-robin over 8 free workers: loadgate
  against :class:`PyRouter`, a pure-Python router that caches its free
  list per model;
* **Route.select()**, the same pick through a handle from
  ``monitor.route("m")``: against the same :class:`PyRouter` call.

Each case is timed with ``time.perf_counter_ns`` in interleaved rounds (so
that a busy machine slows every case alike) and reports the median round,
in nanoseconds per operation, and the ratios. With ``--instructions`` each
case runs under ``valgrind --tool=callgrind`` instead and reports
instructions per operation: the same on every run, however loaded the
machine. Measurement only: nothing here asserts a time.

Usage: ``python python/bench/compare.py [--rounds R] [--scale S]
[--instructions] [--json] [--loop uvloop]`` (``--scale`` multiplies every
case's iterations; ``--loop uvloop`` runs the queued cases on uvloop, the
event loop vLLM and ``uvicorn[standard]`` use, if it is installed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import loadgate

# ----- the pure-Python designs -------------------------------------------


class AtCapacity(Exception):
    pass


class PyPermit:
    __slots__ = ("gate",)

    def __init__(self, gate: "PyGate") -> None:
        self.gate: Optional[PyGate] = gate

    def release(self) -> None:
        gate, self.gate = self.gate, None
        if gate is not None:
            gate.free_slot()


class PyGate:
    """At most `limit` running and `queue` waiting, FIFO; a deque of futures."""

    def __init__(self, limit: int, queue: int) -> None:
        self.limit, self.queue, self.running = limit, queue, 0
        self.waiters: Deque["asyncio.Future[None]"] = deque()

    def try_admit(self) -> Optional[PyPermit]:
        if self.running < self.limit and not self.waiters:
            self.running += 1
            return PyPermit(self)
        return None

    async def admit(self) -> PyPermit:
        permit = self.try_admit()
        if permit is not None:
            return permit
        if len(self.waiters) >= self.queue:
            raise AtCapacity()
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            await fut  # the releaser hands its slot over
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.free_slot()  # handed over, but nobody will take it
            else:
                self.waiters.remove(fut)
            raise
        return PyPermit(self)

    def free_slot(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.running -= 1


class Baton:
    """The floor case's state: who holds the one slot, who waits for it."""

    def __init__(self) -> None:
        self.held = False
        self.waiter: Optional["asyncio.Future[None]"] = None


class PyRouter:
    """Round-robin over each model's free workers, the free list cached
    until a worker's state changes."""

    def __init__(self) -> None:
        self.workers: Dict[str, List[int]] = {}
        self.busy: set[int] = set()
        self.free: Dict[str, List[int]] = {}
        self.next = 0

    def add_worker(self, model: str, worker: int) -> None:
        self.workers.setdefault(model, []).append(worker)
        self.free.pop(model, None)

    def set_busy(self, model: str, worker: int, busy: bool) -> None:
        (self.busy.add if busy else self.busy.discard)(worker)
        self.free.pop(model, None)

    def select(self, model: str) -> int:
        free = self.free.get(model)
        if free is None:
            free = self.free[model] = [w for w in self.workers.get(model, ()) if w not in self.busy]
        if not free:
            raise AtCapacity()
        self.next += 1
        return free[self.next % len(free)]


# ----- cases ---------------------------------------------------------------

#: Runs a coroutine to completion on a new event loop: asyncio's own, or
#: uvloop's with ``--loop uvloop``.
run_loop: Callable[[Any], Any] = asyncio.run


def contended(make_gate: Callable[[], Any], kind: str, n: int) -> int:
    """Runs two tasks for `n` admit/yield/release cycles each; returns the
    elapsed nanoseconds (event loop setup excluded)."""

    async def gate_worker(gate: Any) -> None:
        for _ in range(n):
            permit = await gate.admit()
            await asyncio.sleep(0)
            permit.release()

    async def floor_worker(baton: Baton) -> None:
        # The least any FIFO gate of one slot does per queued admission:
        # one future created, awaited and settled, inline (no call, no
        # count, no limit, no permit). What is left is the event loop's
        # share of the cycle (the wake-up and the `sleep(0)`), which no gate
        # removes.
        create_future = asyncio.get_running_loop().create_future
        for _ in range(n):
            if baton.held:
                fut = baton.waiter = create_future()
                await fut
            else:
                baton.held = True
            await asyncio.sleep(0)
            waiter = baton.waiter
            if waiter is None:
                baton.held = False
            else:
                baton.waiter = None
                waiter.set_result(None)

    async def semaphore_worker(sem: asyncio.Semaphore) -> None:
        for _ in range(n):
            await sem.acquire()
            await asyncio.sleep(0)
            sem.release()

    async def main() -> int:
        gate = make_gate()
        worker: Callable[[Any], Any] = gate_worker
        if kind == "semaphore":
            worker = semaphore_worker
        elif kind == "floor":
            worker = floor_worker
        start = time.perf_counter_ns()
        await asyncio.gather(worker(gate), worker(gate))
        elapsed = time.perf_counter_ns() - start
        if kind == "loadgate":
            s = gate.stats()
            # Every admission but the first waited for the other's release.
            assert s["admitted_queued"] >= 2 * n - 2, s
            assert gate.running == 0
        return elapsed

    return int(run_loop(main()))


def timed(fn: Callable[[], None]) -> int:
    start = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - start


def sync_cases() -> Dict[str, Callable[[int], int]]:
    """The synchronous cases: each runs `n` operations, returns nanoseconds."""
    gate = loadgate.AdmissionGate(8, 16)
    py_gate = PyGate(8, 16)
    monitor = loadgate.Monitor()
    router = PyRouter()
    for w in range(8):
        monitor.add_worker("m", w)
        router.add_worker("m", w)
    route = monitor.route("m")

    def try_admit_loadgate(n: int) -> None:
        try_admit = gate.try_admit
        for _ in range(n):
            try_admit().release()  # type: ignore[union-attr]

    def try_admit_python(n: int) -> None:
        try_admit = py_gate.try_admit
        for _ in range(n):
            try_admit().release()  # type: ignore[union-attr]

    def select_loadgate(n: int) -> None:
        select = monitor.select
        for _ in range(n):
            select("m")

    def select_python(n: int) -> None:
        select = router.select
        for _ in range(n):
            select("m")

    def route_select_loadgate(n: int) -> None:
        select = route.select
        for _ in range(n):
            select()

    def empty_loop(n: int) -> None:
        for _ in range(n):
            pass

    def case(fn: Callable[[int], None]) -> Callable[[int], int]:
        return lambda n: timed(lambda: fn(n))

    return {
        "try_admit+release/loadgate": case(try_admit_loadgate),
        "try_admit+release/PyGate": case(try_admit_python),
        "select/loadgate": case(select_loadgate),
        "select/PyRouter": case(select_python),
        "Route.select/loadgate": case(route_select_loadgate),
        "loop": case(empty_loop),
    }


def all_cases() -> Dict[str, Tuple[Callable[[int], int], int]]:
    """Every case: (run `n` iterations returning nanoseconds, operations per
    iteration)."""
    cases: Dict[str, Tuple[Callable[[int], int], int]] = {
        "queued/loadgate": (lambda n: contended(lambda: loadgate.AdmissionGate(1, 16), "loadgate", n), 2),
        "queued/asyncio.Semaphore": (lambda n: contended(lambda: asyncio.Semaphore(1), "semaphore", n), 2),
        "queued/PyGate": (lambda n: contended(lambda: PyGate(1, 16), "pygate", n), 2),
        "queued/floor": (lambda n: contended(Baton, "floor", n), 2),
    }
    for name, run in sync_cases().items():
        cases[name] = (run, 1)
    return cases


def is_sync(name: str) -> bool:
    return not name.startswith("queued/")


def measure_time(rounds: int, scale: float) -> Tuple[Dict[str, float], Dict[str, List[float]]]:
    """Median nanoseconds per operation of each case over interleaved
    rounds (after a warm-up round), and every round's figure."""
    cases = all_cases()
    iterations = {name: max(1, int((200_000 if is_sync(name) else 20_000) * scale)) for name in cases}
    samples: Dict[str, List[float]] = {name: [] for name in cases}
    for name, (run, _) in cases.items():
        run(iterations[name])
    for _ in range(rounds):
        for name, (run, ops) in cases.items():
            samples[name].append(run(iterations[name]) / (iterations[name] * ops))
    return {name: statistics.median(s) for name, s in samples.items()}, samples


def measure_instructions(scale: float, loop: str) -> Dict[str, float]:
    """Instructions per operation of each case under callgrind: the
    difference between a run of `2k` and one of `k` iterations, so that
    start-up and setup cancel out."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    result: Dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (_, ops) in all_cases().items():
            k = max(1, int((20_000 if is_sync(name) else 2_000) * scale))
            counts = []
            for n in (k, 2 * k):
                out = os.path.join(tmp, "callgrind.out")
                # Counted: only what runs inside `exec` (see run_case).
                cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=builtin_exec",
                       f"--callgrind-out-file={out}",
                       sys.executable, os.path.abspath(__file__), "--run-case", name, "--number", str(n),
                       "--loop", loop]
                # A fixed hash seed: the same dict and set layouts in both runs.
                env = {**os.environ, "PYTHONHASHSEED": "0"}
                r = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
                match = re.search(r"Collected : (\d+)", r.stderr)
                if match is None:
                    raise SystemExit(f"no instruction count from callgrind:\n{r.stderr}")
                if int(match.group(1)) == 0:
                    raise SystemExit("callgrind counted nothing: this Python has no builtin_exec symbol")
                counts.append(int(match.group(1)))
            result[name] = (counts[1] - counts[0]) / (k * ops)
    return result


def run_case(name: str, n: int) -> None:
    """One case, `n` iterations, for `--instructions`: everything that
    varies from run to run (imports, the clock's one-time calibration) is
    done first, so that callgrind, counting only inside `exec`, sees the
    same work but for the iterations."""
    run = all_cases()[name][0]
    loadgate.AdmissionGate(1)  # calibrates the gate clock
    run(1)
    exec("run(n)", {"run": run, "n": n})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (default 7)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every case's iterations")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per operation with callgrind instead of timing")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help="the event loop of the queued cases (uvloop: pip install uvloop)")
    parser.add_argument("--run-case", help=argparse.SUPPRESS)
    parser.add_argument("--number", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loop == "uvloop":
        global run_loop
        import uvloop

        run_loop = uvloop.run
    if args.run_case:
        run_case(args.run_case, args.number)
        return

    samples: Dict[str, List[float]] = {}
    if args.instructions:
        unit = "instr/op"
        raw = measure_instructions(args.scale, args.loop)
    else:
        unit = "ns/op"
        raw, samples = measure_time(args.rounds, args.scale)
    # The for-loop's own cost is taken out of the synchronous cases; the
    # queued cases are whole cycles (event loop included).
    cost = {name: (max(v - raw["loop"], 0.0) if is_sync(name) and name != "loop" else v) for name, v in raw.items()}

    def ratio(ours: str, theirs: str) -> float:
        return cost[theirs] / cost[ours] if cost[ours] else float("inf")

    def above_floor(theirs: str) -> float:
        # The gates' own share of the cycle: each cost less the floor's.
        ours = cost["queued/loadgate"] - cost["queued/floor"]
        return (cost[theirs] - cost["queued/floor"]) / ours if ours > 0 else float("inf")

    ratios = {
        "queued: asyncio.Semaphore / loadgate": ratio("queued/loadgate", "queued/asyncio.Semaphore"),
        "queued: PyGate / loadgate": ratio("queued/loadgate", "queued/PyGate"),
        "queued: asyncio.Semaphore / floor": ratio("queued/floor", "queued/asyncio.Semaphore"),
        "queued above the floor: asyncio.Semaphore / loadgate": above_floor("queued/asyncio.Semaphore"),
        "queued above the floor: PyGate / loadgate": above_floor("queued/PyGate"),
        "try_admit+release: PyGate / loadgate": ratio("try_admit+release/loadgate", "try_admit+release/PyGate"),
        "select: PyRouter / loadgate": ratio("select/loadgate", "select/PyRouter"),
        "Route.select: PyRouter / loadgate": ratio("Route.select/loadgate", "select/PyRouter"),
    }
    if args.json:
        print(json.dumps({"unit": unit, "cost": cost, "ratios": ratios}, indent=2))
        return
    how = "callgrind" if args.instructions else f"{args.rounds} rounds, medians"
    print(f"loadgate {loadgate.__version__}, Python {sys.version.split()[0]}, {how}, queued cases on {args.loop}")
    header = f"{'case':30} {unit:>10}"
    if samples:
        header += f"  {'fastest':>10}  {'slowest':>10}"
    print(header)
    for name in cost:
        line = f"{name:30} {cost[name]:10.1f}"
        if samples:
            offset = raw[name] - cost[name]
            line += f"  {min(samples[name]) - offset:10.1f}  {max(samples[name]) - offset:10.1f}"
        print(line)
    print("(try_admit, select and Route.select: the empty loop's cost taken out; queued: per admission,")
    print(" each an admit/yield/release cycle with its share of the event loop)")
    print()
    print("ratio: the other design's cost / loadgate's (above 1: loadgate is cheaper)")
    for label, r in ratios.items():
        print(f"  {label:54} {r:6.2f}")


if __name__ == "__main__":
    main()
