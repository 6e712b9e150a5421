"""`gate.admit()` is a coroutine: every asyncio entry point that takes one
takes it, and its coroutine protocol (`send`, `throw`, `close`) keeps the
gate's cancellation rules. Real asyncio throughout."""

from __future__ import annotations

import asyncio
import collections.abc
import gc
import inspect
import sys
from typing import Any, Awaitable, Callable, List

import pytest

from loadgate import Admission, AdmissionGate, AtCapacity, ManualClock, Permit, QueueTimeout


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(main(), 20))


async def settle() -> None:
    """Lets every ready callback and task run."""
    for _ in range(5):
        await asyncio.sleep(0)


def permit_of(stop: pytest.ExceptionInfo[StopIteration]) -> Permit:
    value = stop.value.value
    assert isinstance(value, Permit)
    return value


def test_is_a_coroutine() -> None:
    g = AdmissionGate(1)
    a = g.admit()
    assert isinstance(a, Admission)
    assert isinstance(a, collections.abc.Coroutine)
    assert isinstance(a, collections.abc.Awaitable)
    assert asyncio.iscoroutine(a)
    assert inspect.isawaitable(a)
    awaited: object = a.__await__()
    assert awaited is a
    assert (a.__name__, a.__qualname__) == ("admit", "AdmissionGate.admit")
    assert a.cr_await is None
    a.close()  # never started: nothing to undo
    assert g.running == 0


def test_await() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 1)
        p = await g.admit()
        assert isinstance(p, Permit) and g.running == 1
        p.release()

    run(main)


def test_create_task() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 2)
        first = asyncio.create_task(g.admit())
        second = asyncio.get_running_loop().create_task(g.admit(priority=0))
        p = await first
        await settle()
        assert not second.done() and g.queued == 1
        assert "AdmissionGate.admit()" in repr(second)
        p.release()
        (await second).release()
        assert (g.running, g.queued) == (0, 0)

    run(main)


def test_ensure_future() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 1)
        task = asyncio.ensure_future(g.admit())
        assert isinstance(task, asyncio.Task)
        (await task).release()
        assert g.running == 0

    run(main)


def test_gather() -> None:
    async def main() -> None:
        g = AdmissionGate(2, 1)
        held = await g.admit()

        async def free_a_slot() -> None:
            await settle()
            held.release()

        # One admitted at once, one queued (until the slot is freed), one
        # refused: the queue is full.
        results = await asyncio.gather(g.admit(), g.admit(), g.admit(), free_a_slot(), return_exceptions=True)
        kinds = sorted(type(r).__name__ for r in results[:3])
        assert kinds == ["AtCapacity", "Permit", "Permit"]
        assert (g.running, g.queued) == (2, 0)
        for r in results[:3]:
            if isinstance(r, Permit):
                r.release()
        assert g.running == 0

    run(main)


def test_wait_for() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 2)
        p = await asyncio.wait_for(g.admit(), 10)
        assert isinstance(p, Permit)
        # Times out while queued: leaves the queue, as a cancellation.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(g.admit(), 0.01)
        assert g.queued == 0
        s = g.stats()
        assert (s["cancelled"], s["rejected_at_capacity"], s["expired"]) == (1, 0, 0)
        p.release()
        assert g.running == 0

    run(main)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.TaskGroup is new in 3.11")
def test_task_group() -> None:
    async def main() -> None:
        g = AdmissionGate(2, 4)
        async with asyncio.TaskGroup() as tg:  # type: ignore[attr-defined,unused-ignore]
            tasks = [tg.create_task(g.admit()) for _ in range(2)]
        permits = [t.result() for t in tasks]
        assert all(isinstance(p, Permit) for p in permits) and g.running == 2
        for p in permits:
            p.release()
        # A failing sibling cancels the queued admissions: they leave the queue.
        held = [await g.admit(), await g.admit()]

        async def fail() -> None:
            await settle()
            raise ValueError("sibling failed")

        with pytest.raises(BaseException) as info:
            async with asyncio.TaskGroup() as tg:  # type: ignore[attr-defined,unused-ignore]
                queued = [tg.create_task(g.admit()) for _ in range(3)]
                tg.create_task(fail())
        assert "sibling failed" in repr(info.value)
        assert all(t.cancelled() for t in queued)
        assert g.queued == 0 and g.stats()["cancelled"] == 3
        for p in held:
            p.release()
        assert g.running == 0

    run(main)


def test_async_with() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 1)
        async with g.admit() as p:
            assert isinstance(p, Permit) and g.running == 1 and not p.released
        assert p.released and g.running == 0
        # Queued, then admitted, inside `async with`.
        held = await g.admit()

        async def use() -> bool:
            async with g.admit() as q:
                return q.released

        task = asyncio.create_task(use())
        await settle()
        assert g.queued == 1
        held.release()
        assert await task is False
        assert g.running == 0
        # A refusal raises from `async with` and holds nothing.
        held = await g.admit()
        other = asyncio.create_task(g.admit())
        await settle()
        with pytest.raises(AtCapacity):
            async with g.admit():
                pass
        held.release()
        (await other).release()
        assert (g.running, g.queued) == (0, 0)

    run(main)


def test_task_cancel_while_queued_is_a_cancellation() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 2)
        held = await g.admit()
        task = asyncio.create_task(g.admit())
        await settle()
        assert g.queued == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert g.queued == 0
        s = g.stats()
        assert (s["cancelled"], s["rejected_at_capacity"], s["expired"]) == (1, 0, 0)
        # A task cancelled before its first step never queues.
        task = asyncio.create_task(g.admit())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert g.queued == 0 and g.stats()["received"] == 2
        held.release()
        assert g.running == 0

    run(main)


def test_throw_cancelled_error_cancels_the_queued_request() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 2)
        held = await g.admit()
        a = g.admit()
        fut = a.send(None)  # queued: yields the future it waits on
        assert isinstance(fut, asyncio.Future) and not fut.done()
        assert a.cr_await is fut and "queued" in repr(a)
        assert g.queued == 1
        with pytest.raises(asyncio.CancelledError):
            a.throw(asyncio.CancelledError())
        assert g.queued == 0 and g.stats()["cancelled"] == 1
        assert "done" in repr(a)
        with pytest.raises(RuntimeError, match="already awaited"):
            a.send(None)
        # The three-argument form, as `yield from` delegation calls it.
        b = g.admit()
        b.send(None)
        with pytest.raises(KeyError, match="x"):
            b.throw(KeyError, "x", None)
        assert g.queued == 0 and g.stats()["cancelled"] == 2
        held.release()
        assert g.running == 0

    run(main)


def test_send_and_next_return_the_permit_in_stop_iteration() -> None:
    # `send(None)` is the method a user calls; `next()` is the slot `await`
    # and asyncio's tasks step the coroutine through. Both end with
    # StopIteration carrying the permit, at once or after queueing.
    async def main() -> None:
        g = AdmissionGate(1, 2)
        for step in (lambda a: a.send(None), next):
            with pytest.raises(StopIteration) as stop:
                step(g.admit())
            held = stop.value.value
            assert isinstance(held, Permit) and g.running == 1
            a = g.admit()
            fut = step(a)
            assert isinstance(fut, asyncio.Future) and g.queued == 1
            held.release()
            with pytest.raises(StopIteration) as stop:
                step(a)
            assert isinstance(stop.value.value, Permit) and g.running == 1
            stop.value.value.release()
            assert (g.running, g.queued) == (0, 0)

    run(main)


def test_throw_after_the_grant_releases_the_permit() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 1)
        held = await g.admit()
        a = g.admit()
        fut = a.send(None)
        held.release()  # granted: the permit is in the future
        assert fut.done() and g.running == 1
        with pytest.raises(asyncio.CancelledError):
            a.throw(asyncio.CancelledError)
        assert g.running == 0 and g.stats()["cancelled"] == 0

    run(main)


def test_close_cancels_the_queued_request() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 2)
        held = await g.admit()
        a = g.admit()
        a.send(None)
        assert g.queued == 1
        a.close()
        a.close()  # idempotent
        assert g.queued == 0 and g.stats()["cancelled"] == 1
        # Closing the coroutine that awaits it closes it too.

        async def outer() -> Permit:
            return await g.admit()

        c = outer()
        c.send(None)
        assert g.queued == 1
        c.close()
        assert g.queued == 0 and g.stats()["cancelled"] == 2
        held.release()

    run(main)


def test_collected_while_queued_leaves_the_queue() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 2)
        held = await g.admit()
        a = g.admit()
        a.send(None)
        assert g.queued == 1
        del a
        gc.collect()
        assert g.queued == 0 and g.stats()["cancelled"] == 1
        held.release()

    run(main)


def test_protocol_errors() -> None:
    g = AdmissionGate(1)
    a = g.admit()
    with pytest.raises(TypeError, match="non-None"):
        a.send(1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="BaseException"):
        a.throw(1)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="separate value"):
        a.throw(ValueError(), 1)  # type: ignore[call-overload]
    assert "not awaited" in repr(a)  # none of these started it
    # Thrown into before it starts: raises, and it is finished.
    with pytest.raises(ValueError, match="early"):
        a.throw(ValueError("early"))
    with pytest.raises(RuntimeError, match="already awaited"):
        a.send(None)
    assert (g.running, g.queued) == (0, 0)


def test_driven_by_hand_without_a_loop() -> None:
    g = AdmissionGate(1, 1)
    with pytest.raises(StopIteration) as stop:
        g.admit().send(None)  # a free slot needs no event loop
    permit = permit_of(stop)
    assert g.running == 1
    with pytest.raises(RuntimeError, match="no running event loop"):
        g.admit().send(None)  # a wait does; the request leaves the queue
    assert g.queued == 0 and g.stats()["cancelled"] == 1
    permit.release()
    with pytest.raises(StopIteration) as stop:
        next(g.admit())
    permit_of(stop).release()
    assert g.running == 0


def test_resumed_before_the_outcome_waits_again() -> None:
    async def main() -> None:
        g = AdmissionGate(1, 1)
        held = await g.admit()
        a = g.admit()
        fut = a.send(None)
        assert a.send(None) is fut  # not done yet: the same future again
        held.release()
        with pytest.raises(StopIteration) as stop:
            a.send(None)
        permit_of(stop).release()
        assert g.running == 0

    run(main)


def test_entry_points_with_a_deadline_on_a_manual_clock() -> None:
    async def main() -> None:
        clock = ManualClock()
        g = AdmissionGate(1, 4, queue_timeout=1, clock=clock)
        held = await g.admit()
        loop = asyncio.get_running_loop()
        waiters: List["asyncio.Future[Permit]"] = [
            asyncio.create_task(g.admit()),
            asyncio.ensure_future(g.admit()),
            loop.create_task(g.admit()),
            asyncio.ensure_future(asyncio.wait_for(g.admit(), 10)),
        ]
        await settle()
        assert g.queued == 4
        clock.advance(1)
        assert g.expire() == 4
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(r, QueueTimeout) for r in results), results
        assert g.stats()["expired"] == 4
        held.release()

    run(main)


def test_a_permit_granted_to_an_abandoned_task_is_released_by_gc() -> None:
    g = AdmissionGate(1, 4)
    held = g.try_admit()
    assert held is not None
    loop = asyncio.new_event_loop()

    async def use() -> None:
        async with g.admit():
            await asyncio.sleep(60)

    task = loop.create_task(use())
    loop.run_until_complete(asyncio.sleep(0.01))
    held.release()  # granted: the permit is in the future the task waits on
    assert (g.running, g.queued) == (1, 0)
    loop.close()  # the task never resumes
    del task, loop
    gc.collect()  # the task, its admission and the future form a cycle
    assert g.running == 0
