"""Threads: `admit_blocking` releases the GIL while it waits, and 8 threads
hammering one gate never exceed N running or N + Q in flight."""

from __future__ import annotations

import random
import threading
import time

import pytest

from loadgate import AdmissionGate, AtCapacity, QueueTimeout

THREADS = 8


@pytest.mark.parametrize("limit,queue", [(1, 0), (2, 1), (3, 16)])
def test_eight_threads_never_exceed_n(limit: int, queue: int) -> None:
    g = AdmissionGate(limit, queue)
    lock = threading.Lock()
    running = 0
    max_running = 0
    max_in_flight = 0
    counts = {"served": 0, "rejected": 0, "timed_out": 0}
    errors: list[BaseException] = []
    rng = random.Random(7)
    holds = [rng.random() * 0.0005 for _ in range(THREADS * 200)]

    def worker(index: int) -> None:
        nonlocal running, max_running, max_in_flight
        try:
            for i in range(150):
                try:
                    permit = g.admit_blocking(timeout=2.0)
                except AtCapacity:
                    with lock:
                        counts["rejected"] += 1
                    continue
                except QueueTimeout:
                    with lock:
                        counts["timed_out"] += 1
                    continue
                with permit:
                    with lock:
                        running += 1
                        max_running = max(max_running, running)
                        max_in_flight = max(max_in_flight, g.running + g.queued)
                        assert g.running <= limit
                    time.sleep(holds[index * 150 + i])
                    with lock:
                        running -= 1
                        counts["served"] += 1
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert max_running <= limit
    assert max_in_flight <= limit + queue
    assert counts["served"] > 0
    assert sum(counts.values()) == THREADS * 150
    assert (g.running, g.queued) == (0, 0)
    stats = g.stats()
    assert stats["rejected_at_capacity"] == counts["rejected"]


def test_admit_blocking_releases_the_gil() -> None:
    # While one thread waits for a slot, another keeps running Python code.
    g = AdmissionGate(1, 1)
    held = g.admit_blocking()
    progress = 0
    waited = threading.Event()

    def waiter() -> None:
        with g.admit_blocking():
            waited.set()

    t = threading.Thread(target=waiter)
    t.start()
    while g.queued == 0:
        time.sleep(0.001)
    # Python code runs here while the waiter is blocked; if the waiter held
    # the GIL this loop would stall, and the per-test timeout fail the test.
    while progress < 100_000:
        progress += 1
    # ... and the waiter was blocked in admit_blocking all that time.
    assert g.queued == 1 and not waited.is_set()
    held.release()
    t.join(30)  # a limit for a hang only
    assert waited.is_set() and g.running == 0
