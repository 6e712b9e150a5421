"""`await gate.admit()`: N + Q exactness, FIFO, cancellation, deadlines,
set_limit and close, on a real asyncio event loop. Deadline logic runs on a
manual clock; one test checks the event loop's own deadline timer in real
time."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, List

import pytest

import loadgate
from loadgate import AdmissionGate, AtCapacity, Closed, Displaced, ManualClock, Permit, PriorityClass, QueueTimeout


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(main(), 20))


async def settle() -> None:
    """Lets every ready callback and task run."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_admit_await_and_async_with() -> None:
    async def main() -> None:
        g = AdmissionGate(2, 2)
        p = await g.admit()
        assert isinstance(p, Permit) and g.running == 1
        async with g.admit() as q:
            assert isinstance(q, Permit) and g.running == 2
        assert q.released and g.running == 1
        with pytest.raises(ZeroDivisionError):
            async with g.admit():
                1 / 0
        assert g.running == 1
        p.release()
        admission = g.admit()
        assert "not awaited" in repr(admission)
        permit = await admission
        with pytest.raises(RuntimeError, match="already awaited"):
            await admission
        permit.release()
        assert g.running == 0

    run(main)


def test_a_queued_admission_waits_on_the_loops_own_future() -> None:
    # asyncio's own loop gets an asyncio.Future bound to it; a loop that
    # overrides create_future (a subclass, as uvloop's own class does) is
    # asked for its future.
    made: List[asyncio.Future[Any]] = []

    class CustomFuture(asyncio.Future):  # type: ignore[type-arg]
        pass

    class CustomLoop(asyncio.SelectorEventLoop):
        def create_future(self) -> asyncio.Future[Any]:
            fut: asyncio.Future[Any] = CustomFuture(loop=self)
            made.append(fut)
            return fut

    async def main() -> asyncio.Future[Any]:
        g = AdmissionGate(1, 1)
        held = await g.admit()
        a = g.admit()
        fut: asyncio.Future[Any] = a.send(None)
        assert fut.get_loop() is asyncio.get_running_loop()
        held.release()
        with pytest.raises(StopIteration) as stop:
            a.send(None)
        stop.value.value.release()
        assert g.running == 0
        return fut

    fut = asyncio.run(main())
    assert type(fut) is asyncio.Future and made == []
    loop = CustomLoop()
    try:
        fut = loop.run_until_complete(main())
    finally:
        loop.close()
    assert type(fut) is CustomFuture and made == [fut]


def test_admit_waits_only_on_a_running_loop() -> None:
    g = AdmissionGate(1)
    with pytest.raises(StopIteration) as stop:
        g.admit().send(None)  # a free slot is taken without a loop
    permit = stop.value.value
    assert isinstance(permit, Permit) and g.running == 1
    with pytest.raises(RuntimeError):
        g.admit().send(None)  # waiting needs one
    assert g.queued == 0
    permit.release()
    assert g.running == 0


@pytest.mark.parametrize("limit,queue", [(1, 0), (1, 1), (3, 2), (4, 16)])
def test_n_plus_q_exact_with_many_tasks(limit: int, queue: int) -> None:
    async def main() -> None:
        g = AdmissionGate(limit, queue)
        release = asyncio.Event()
        running = 0
        max_running = 0
        outcomes: List[str] = []

        async def request() -> None:
            nonlocal running, max_running
            try:
                async with g.admit():
                    running += 1
                    max_running = max(max_running, running)
                    assert g.running <= limit
                    await release.wait()
                    running -= 1
                outcomes.append("served")
            except AtCapacity:
                outcomes.append("rejected")

        n = 5 * (limit + queue) + 3
        tasks = [asyncio.ensure_future(request()) for _ in range(n)]
        await settle()
        # Exactly N running and Q queued; everyone else refused at once.
        assert (g.running, g.queued) == (limit, queue)
        assert outcomes.count("rejected") == n - limit - queue
        release.set()
        await asyncio.gather(*tasks)
        assert outcomes.count("served") == limit + queue
        assert max_running == limit
        assert (g.running, g.queued) == (0, 0)
        s = g.stats()
        assert s["rejected_at_capacity"] == n - limit - queue
        assert s["admitted_queued"] == queue

    run(main)


def test_fifo_order() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 10)
        first = await g.admit()
        order: List[int] = []

        async def waiter(i: int) -> None:
            async with g.admit():
                order.append(i)
                await asyncio.sleep(0)

        tasks = []
        for i in range(10):
            tasks.append(asyncio.ensure_future(waiter(i)))
            await settle()  # queue them in a known order
        assert g.queued == 10
        first.release()
        await asyncio.gather(*tasks)
        assert order == list(range(10))

    run(main)


def test_cancellation_frees_the_place() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 2)
        held = await g.admit()
        t1 = asyncio.ensure_future(g.admit())
        t2 = asyncio.ensure_future(g.admit())
        await settle()
        assert g.queued == 2
        with pytest.raises(AtCapacity):
            await g.admit()  # queue full
        t1.cancel()
        await settle()
        assert g.queued == 1  # the place is free at once
        t3 = asyncio.ensure_future(g.admit())
        await settle()
        assert g.queued == 2  # and can be taken
        s = g.stats()
        assert s["cancelled"] == 1 and s["rejected_at_capacity"] == 1  # a cancel is not a rejection
        held.release()
        p2 = await t2  # FIFO: t2 was ahead of t3
        assert g.running == 1 and g.queued == 1
        p2.release()
        (await t3).release()
        assert t1.cancelled()
        assert (g.running, g.queued) == (0, 0)

    run(main)


def test_cancel_racing_a_grant_gives_the_slot_back() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 1)
        held = await g.admit()
        t = asyncio.ensure_future(g.admit())
        await settle()
        held.release()  # grants the waiter: its future now holds a permit
        t.cancel()  # ... but the task is cancelled before it resumes
        with pytest.raises(asyncio.CancelledError):
            await t
        assert (g.running, g.queued) == (0, 0)  # given back at once, no gc needed
        (await g.admit()).release()

    run(main)


def test_grant_from_another_thread() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 4)
        held = g.try_admit()
        assert held is not None
        tasks = [asyncio.ensure_future(g.admit()) for _ in range(3)]
        await settle()
        assert g.queued == 3

        def releaser() -> None:
            held.release()  # runs the core callback on this thread

        threading.Thread(target=releaser).start()
        p = await tasks[0]  # delivered with call_soon_threadsafe
        assert g.running == 1 and g.queued == 2
        threading.Thread(target=p.release).start()
        q = await tasks[1]
        q.release()
        (await tasks[2]).release()
        assert (g.running, g.queued) == (0, 0)

    run(main)


def test_first_response_admits_an_awaiting_task() -> None:
    async def main() -> None:
        g = AdmissionGate(2, 2, wait_limit=1)
        p = await g.admit()
        waiter = asyncio.ensure_future(g.admit())
        await settle()
        assert not waiter.done() and g.queued == 1  # held back by the wait limit
        p.first_response()
        q = await waiter
        assert (g.running, g.waiting, g.queued) == (2, 1, 0)
        # A task cancelled while held back leaves the queue at once.
        late = asyncio.ensure_future(g.admit())
        await settle()
        assert g.queued == 1
        late.cancel()
        await settle()
        assert g.queued == 0 and g.stats()["cancelled"] == 1
        q.release()  # never responded: frees both slots
        p.release()
        assert (g.running, g.waiting) == (0, 0)

    run(main)


def test_wait_for_timeout_leaves_the_queue() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 4)
        held = await g.admit()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(g.admit(), 0.05)
        assert g.queued == 0 and g.stats()["cancelled"] == 1
        held.release()

    run(main)


def test_queue_deadline_on_a_manual_clock() -> None:
    async def main() -> None:
        clock = ManualClock()
        g = AdmissionGate(1, 4, queue_timeout=2, clock=clock)
        held = await g.admit()
        first = asyncio.ensure_future(g.admit())
        await settle()
        clock.advance(1)
        second = asyncio.ensure_future(g.admit())
        third = asyncio.ensure_future(g.admit())
        await settle()
        assert g.expire() == 0  # nobody is due
        clock.advance(1)  # the first waiter's deadline
        await settle()
        assert not first.done()  # no timer on a manual clock: expire() does it
        assert g.expire() == 1
        with pytest.raises(QueueTimeout) as info:
            await first
        e = info.value
        assert (e.status_code, e.reason) == (529, "queue_timeout")
        assert g.queued == 2
        clock.advance(0.5)
        assert g.expire() == 0
        clock.advance(0.5)
        assert g.expire() == 2
        results = await asyncio.gather(second, third, return_exceptions=True)
        assert all(isinstance(r, QueueTimeout) for r in results), results
        assert g.queued == 0 and g.stats()["expired"] == 3
        # A waiter granted before its deadline is not expired.
        t = asyncio.ensure_future(g.admit())
        await settle()
        held.release()
        held = await t
        clock.advance(60)
        assert g.expire() == 0 and g.stats()["expired"] == 3
        held.release()

    run(main)


def test_deadline_timer_on_the_event_loop() -> None:
    """Real time: the loop timer set by the gate's next deadline expires
    waiters of every class, and is set again for the next one."""

    async def main() -> None:
        g = AdmissionGate(1, 4, classes=[PriorityClass(queue_timeout=0.05), PriorityClass(queue_timeout=60)])
        held = await g.admit()
        patient = asyncio.ensure_future(g.admit(priority=1))  # the timer is set 60 s ahead
        await settle()
        loop = asyncio.get_running_loop()
        start = loop.time()
        first = asyncio.ensure_future(g.admit(priority=0))  # ... and now 0.05 s
        await asyncio.sleep(0.02)
        second = asyncio.ensure_future(g.admit(priority=0))  # due 0.02 s after the first
        with pytest.raises(QueueTimeout):
            await first
        first_at = loop.time() - start
        with pytest.raises(QueueTimeout):
            await second
        second_at = loop.time() - start
        assert first_at >= 0.045 and second_at >= 0.065  # not before their time
        assert not patient.done() and g.queued == 1
        assert [c["expired"] for c in g.stats()["classes"]] == [2, 0]
        held.release()
        (await patient).release()
        assert (g.running, g.queued) == (0, 0)

    run(main)


def test_adaptive_lifo_after_an_expiry() -> None:
    async def main() -> None:
        clock = ManualClock()
        g = AdmissionGate(1, 3, queue_timeout=2.0, adaptive_lifo=True, clock=clock)
        held = await g.admit()
        old = asyncio.ensure_future(g.admit())
        await settle()
        clock.advance(1)
        middle = asyncio.ensure_future(g.admit())
        newest = asyncio.ensure_future(g.admit())
        await settle()
        clock.advance(1)
        assert g.expire() == 1
        with pytest.raises(QueueTimeout):
            await old  # expired at 2 s, the others are due at 3 s
        held.release()  # one handoff, to the newest waiter
        p = await newest
        assert not middle.done()
        p.release()
        (await middle).release()

    run(main)


def test_set_limit_releases_waiters() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 4)
        held = await g.admit()
        tasks = [asyncio.ensure_future(g.admit()) for _ in range(3)]
        await settle()
        g.set_limit(3)
        # The timeout is a limit for a hang only (run() allows 20 s in all).
        done, pending = await asyncio.wait(tasks, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        await settle()
        assert sum(t.done() for t in tasks) == 2 and g.running == 3 and g.queued == 1
        g.set_limit(1)
        assert g.running == 3  # lowering revokes nothing
        for t in tasks[:2]:
            t.result().release()
        held.release()
        (await tasks[2]).release()
        assert (g.running, g.queued) == (0, 0)

    run(main)


def test_close_rejects_waiters_and_later_admits() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 4)
        held = await g.admit()
        tasks = [asyncio.ensure_future(g.admit()) for _ in range(3)]
        await settle()
        g.close()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, Closed) for r in results)
        with pytest.raises(Closed) as info:
            await g.admit()
        assert info.value.status_code == 503
        async def use() -> None:
            async with g.admit():
                pass
        with pytest.raises(Closed):
            await use()
        held.release()
        assert (g.running, g.queued) == (0, 0)

    run(main)


def test_waiter_on_a_closed_loop_does_not_leak_the_slot() -> None:
    g = AdmissionGate(1, 1)
    held = g.try_admit()
    assert held is not None
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(_admit_and_hold(g))
        loop.run_until_complete(asyncio.sleep(0.01))
        assert g.queued == 1
        task.cancel()
        loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
    finally:
        loop.close()
    assert g.queued == 0
    held.release()
    assert g.running == 0


async def _admit_and_hold(g: AdmissionGate) -> None:
    async with g.admit():
        await asyncio.sleep(10)


def test_two_event_loops_share_one_gate() -> None:
    g = AdmissionGate(1, 8)
    served: List[str] = []

    async def client(name: str) -> None:
        for _ in range(20):
            async with g.admit():
                assert g.running == 1
                served.append(name)
                await asyncio.sleep(0)

    threads = [threading.Thread(target=lambda n=n: asyncio.run(client(n))) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert sorted(served) == ["a"] * 20 + ["b"] * 20
    assert (g.running, g.queued) == (0, 0)


def test_no_threads_started() -> None:
    before = threading.active_count()

    async def main() -> None:
        g = AdmissionGate(1, 2, queue_timeout=0.02)
        held = await g.admit()
        with pytest.raises(QueueTimeout):
            await g.admit()
        held.release()

    run(main)
    assert threading.active_count() == before
    assert isinstance(loadgate.Admission, type)


# ----- priority classes ------------------------------------------------------


def test_a_more_important_waiter_is_served_before_an_older_less_important_one() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 8, classes=3)
        held = await g.admit(priority=2)
        order: List[str] = []

        async def waiter(name: str, priority: int) -> None:
            async with g.admit(priority=priority):
                order.append(name)
                await asyncio.sleep(0)

        tasks = []
        for name, priority in (("low-1", 2), ("mid", 1), ("low-2", 2), ("top-1", 0), ("top-2", 0)):
            tasks.append(asyncio.ensure_future(waiter(name, priority)))
            await settle()  # queue them in a known order
        assert g.queued == 5
        assert [c["queued"] for c in g.stats()["classes"]] == [2, 1, 2]
        held.release()
        await asyncio.gather(*tasks)
        # Most important class first, FIFO within a class.
        assert order == ["top-1", "top-2", "mid", "low-1", "low-2"]
        assert (g.running, g.queued) == (0, 0)

    run(main)


def test_an_arrival_never_barges_past_a_waiter_of_its_class_or_above() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 4, classes=2)
        held = await g.admit()
        low = asyncio.ensure_future(g.admit(priority=1))
        await settle()
        assert g.try_admit(priority=0) is None  # no slot free: class 0 waits too
        high = asyncio.ensure_future(g.admit(priority=0))
        await settle()
        held.release()
        p = await high
        assert not low.done()
        p.release()
        (await low).release()

    run(main)


def test_displacement_raises_displaced_in_the_displaced_waiter() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 2, classes=2)
        held = await g.admit(priority=0)
        old = asyncio.ensure_future(g.admit(priority=1))
        new = asyncio.ensure_future(g.admit(priority=1))
        await settle()
        assert g.queued == 2
        with pytest.raises(AtCapacity):
            await g.admit(priority=1)  # full, and nobody below class 1
        top = asyncio.ensure_future(g.admit(priority=0))
        await settle()
        # The newest waiter of the least important class lost its place.
        with pytest.raises(Displaced) as info:
            await new
        e = info.value
        assert isinstance(e, loadgate.Overloaded)
        assert (e.status_code, e.reason, e.retry_after) == (529, "displaced", 1.0)
        assert e.message.startswith("Server overloaded")
        assert not old.done() and g.queued == 2
        s = g.stats()
        assert s["displaced"] == 1
        assert [(c["displaced"], c["rejected_at_capacity"]) for c in s["classes"]] == [(0, 0), (1, 1)]
        held.release()
        (await top).release()
        (await old).release()
        assert (g.running, g.queued) == (0, 0)

    run(main)


def test_class_deadlines_on_a_manual_clock() -> None:
    async def main() -> None:
        clock = ManualClock()
        # Class 0 waits at most 1 s; class 1 (and the gate) has no deadline.
        g = AdmissionGate(1, 4, classes=[PriorityClass(queue_timeout=1), PriorityClass()], clock=clock)
        assert g.queue_timeout is None
        held = await g.admit()
        patient = asyncio.ensure_future(g.admit(priority=1))
        hurried = asyncio.ensure_future(g.admit(priority=0))
        await settle()
        clock.advance(1)
        assert g.expire() == 1
        with pytest.raises(QueueTimeout):
            await hurried
        clock.advance(3600)
        assert g.expire() == 0
        assert not patient.done() and g.queued == 1
        assert [c["expired"] for c in g.stats()["classes"]] == [1, 0]
        held.release()
        (await patient).release()
        # The gate's deadline is the classes' default.
        g = AdmissionGate(1, 4, queue_timeout=1, classes=[PriorityClass(queue_timeout=30), PriorityClass()], clock=clock)
        held = await g.admit()
        patient = asyncio.ensure_future(g.admit(priority=0))
        late = asyncio.ensure_future(g.admit(priority=7))  # past the last class: class 1
        await settle()
        clock.advance(1)
        assert g.expire() == 1
        with pytest.raises(QueueTimeout):
            await late
        assert not patient.done()
        assert [c["expired"] for c in g.stats()["classes"]] == [0, 1]
        held.release()
        (await patient).release()

    run(main)
