"""Soak: 10^5 random asyncio admissions of several priority classes, with
cancellations, displacements and queue-deadline expiries, on a manual clock
(fast and the same on every run). The gate must end empty, and the live
object counts flat from one half of the run to the other. A shorter run in
real time does the same through the event loop's deadline timer."""

from __future__ import annotations

import asyncio
import gc
import random
import sys
from collections import Counter
from typing import Any, Awaitable, Callable, Dict, Tuple

from loadgate import AdmissionGate, ManualClock, Permit, PriorityClass

#: Admissions per measured half of the manual-clock soak.
HALF = 50_000


class Soak:
    """Random traffic against one gate on the running loop: every
    admission is a task, of one of three shapes (a coroutine awaiting
    `gate.admit()`, `async with gate.admit()`, or `gate.admit()` itself as
    the task's coroutine); tasks are cancelled at random, a permit is held
    over `hold(n)` for a random `n` from 0 to 3, and time moves by `tick`
    (which also runs expiry)."""

    def __init__(
        self,
        gate: AdmissionGate,
        seed: int,
        tick: Callable[[random.Random], Awaitable[None]],
        hold: Callable[[int], Awaitable[None]],
    ) -> None:
        self.gate = gate
        self.rng = random.Random(seed)
        self.tick = tick
        self.hold = hold
        self.outcomes: Counter[str] = Counter()
        # A dict, not a set: cancellation picks in a reproducible order.
        self.pending: Dict["asyncio.Task[Any]", None] = {}

    def done(self, task: "asyncio.Task[Any]") -> None:
        del self.pending[task]
        if task.cancelled():
            self.outcomes["cancelled"] += 1
            return
        exc = task.exception()
        if exc is not None:
            self.outcomes[type(exc).__name__] += 1
            return
        result = task.result()
        if isinstance(result, Permit):  # the admission itself was the task
            result.release()
            result = "served"
        self.outcomes[result] += 1

    async def awaiting(self, priority: int, ticks: int) -> str:
        permit = await self.gate.admit(priority=priority)
        try:
            await self.hold(ticks)
        finally:
            permit.release()
        return "served"

    async def entering(self, priority: int, ticks: int) -> str:
        async with self.gate.admit(priority=priority):
            await self.hold(ticks)
        return "served"

    def spawn(self) -> None:
        rng = self.rng
        priority = rng.randrange(4)  # 3 classes, and one past the last
        ticks = rng.randrange(4)
        shape = rng.random()
        coro: Any
        if shape < 0.4:
            coro = self.awaiting(priority, ticks)
        elif shape < 0.6:
            coro = self.entering(priority, ticks)
        else:
            coro = self.gate.admit(priority=priority)
        task = asyncio.get_running_loop().create_task(coro)
        self.pending[task] = None
        task.add_done_callback(self.done)

    async def run(self, admissions: int) -> None:
        rng = self.rng
        started = 0
        while started < admissions or self.pending:
            if started < admissions:
                # Quiet spells let the queue drain, so direct admissions
                # happen too.
                burst = min(rng.choice((0, 0, 1, 2, 4, 8)), admissions - started)
                for _ in range(burst):
                    self.spawn()
                started += burst
            await asyncio.sleep(0)
            if self.pending and rng.random() < 0.3:
                victims = list(self.pending)
                victims[rng.randrange(len(victims))].cancel()
            if rng.random() < 0.2 or started >= admissions:
                await self.tick(rng)


def live(*watched: object) -> Tuple[int, ...]:
    """Live objects after a full collection: tracked objects, allocated
    memory blocks, and the reference count of each watched object."""
    gc.collect()
    return (len(gc.get_objects()), sys.getallocatedblocks(), *(sys.getrefcount(o) for o in watched))


def check_flat(first: Tuple[int, ...], second: Tuple[int, ...]) -> None:
    # A leak of one object per admission would grow the counts by
    # thousands; the slack covers interpreter caches.
    assert second[0] - first[0] < 500, (first, second)
    assert second[1] - first[1] < 2_000, (first, second)
    assert second[2:] == first[2:], (first, second)  # refcounts of the watched objects


def classes(timeouts: Tuple[float, float, float]) -> list[PriorityClass]:
    return [PriorityClass(queue_timeout=t) for t in timeouts]


def test_soak_on_a_manual_clock() -> None:
    clock = ManualClock()
    # The least important class may fill only half the queue.
    gate = AdmissionGate(
        4,
        16,
        classes=[PriorityClass(queue_timeout=0.5), PriorityClass(queue_timeout=1), PriorityClass(queue_timeout=2, queue=8)],
        clock=clock,
    )

    async def tick(rng: random.Random) -> None:
        clock.advance(rng.choice((0.125, 0.25, 0.5, 1.0)))
        gate.expire()

    async def hold(ticks: int) -> None:
        for _ in range(ticks):
            await asyncio.sleep(0)

    async def main() -> Tuple[Counter[str], Tuple[int, ...], Tuple[int, ...], Tuple[int, ...]]:
        loop = asyncio.get_running_loop()
        soak = Soak(gate, 20240521, tick, hold)
        await soak.run(5_000)  # warm-up: caches and free lists fill
        before = live(gate, clock, loop)
        await soak.run(HALF)
        middle = live(gate, clock, loop)
        assert (gate.running, gate.queued) == (0, 0)
        await soak.run(HALF)
        after = live(gate, clock, loop)
        return soak.outcomes, before, middle, after

    outcomes, before, middle, after = asyncio.run(main())
    assert (gate.running, gate.queued) == (0, 0)
    assert sum(outcomes.values()) == 5_000 + 2 * HALF, outcomes
    # Every path was taken, many times.
    for outcome in ("served", "cancelled", "AtCapacity", "QueueTimeout", "Displaced"):
        assert outcomes[outcome] > 500, outcomes
    s = gate.stats()
    # (A task cancelled after its refusal, before it resumed, ends cancelled.)
    assert 0 <= s["expired"] - outcomes["QueueTimeout"] < outcomes["cancelled"]
    assert 0 <= s["displaced"] - outcomes["Displaced"] < outcomes["cancelled"]
    assert s["cancelled"] > 1_000
    assert all(c["expired"] > 0 for c in s["classes"]), s["classes"]
    check_flat(before, middle)
    check_flat(middle, after)


async def timers_passed(longest: float) -> None:
    """Returns once every timer set on the running loop so far, none longer
    than `longest` seconds, has had its time, and the loop has dropped it
    (a cancelled timer handle holds the loop until then): a marker set now
    for `longest` comes due after all of them, and the loop takes due
    timers in order of their time."""
    loop = asyncio.get_running_loop()
    marker = loop.create_future()
    loop.call_later(longest, marker.set_result, None)
    await marker


def test_soak_with_the_event_loop_deadline_timer() -> None:
    timeouts = (0.002, 0.004, 0.008)
    gate = AdmissionGate(4, 16, classes=classes(timeouts))
    hold_tick = 0.003

    async def tick(rng: random.Random) -> None:
        await asyncio.sleep(0)

    async def hold(ticks: int) -> None:
        # Held in real time, so that waiters reach their deadlines, which
        # the loop's timer expires.
        await asyncio.sleep(ticks * hold_tick)

    # The longest timer the soak sets: a hold of 3 ticks, or the gate's
    # deadline timer, never later than the longest queue timeout.
    longest = max(3 * hold_tick, *timeouts)

    async def main() -> Tuple[Counter[str], Tuple[int, ...], Tuple[int, ...]]:
        loop = asyncio.get_running_loop()
        soak = Soak(gate, 7, tick, hold)
        await soak.run(2_000)
        await timers_passed(longest)
        before = live(gate, loop)
        await soak.run(10_000)
        await timers_passed(longest)
        after = live(gate, loop)
        return soak.outcomes, before, after

    outcomes, before, after = asyncio.run(main())
    assert (gate.running, gate.queued) == (0, 0)
    assert sum(outcomes.values()) == 12_000
    assert outcomes["QueueTimeout"] > 0 and outcomes["served"] > 0, outcomes
    # The gate's timer entry for the loop goes with the loop's last waiter
    # (the entry holds the loop).
    check_flat(before, after)
