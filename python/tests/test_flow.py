"""Frontend flow control from Python: `Monitor.set_flow_control`, `await
Monitor.dispatch(...)` and its `FlowTicket` (docs/flow-control.md): sent at
once or queued, woken from the loop's thread and from another thread,
cancelled, refused at its deadline, shed for a lighter tenant, refused at once
when asked, and bad input."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable

import pytest

from conftest import flow_queued
from loadgate import FlowTicket, Monitor, Overloaded, QueueTimeout, Unavailable


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(main(), 20))


def fleet(**flow: Any) -> Monitor:
    """One worker (id 1) of 100 KV blocks, busy above half, with a queue."""
    m = Monitor()
    m.add_worker("m", 1, kv_total_blocks=100)
    m.set_thresholds("m", active_decode_blocks_threshold=0.5)
    m.set_flow_control("m", **{"queue_limit": 8, **flow})
    return m


def busy(m: Monitor) -> None:
    m.report(1, kv_used_blocks=90)


def free(m: Monitor) -> None:
    m.report(1, kv_used_blocks=0)


def waiting(m: Monitor) -> int:
    """Requests waiting in model m's queue."""
    return flow_queued(m, "m")


async def until(cond: Callable[[], bool]) -> None:
    """Waits until `cond()` holds (the limit only turns a hang into a
    failure). It first lets the loop run once, so that every task made
    before the call has taken its first step: a dispatch wrapped in a task
    has been polled and, if it waits, is parked until a wake-up."""
    await asyncio.sleep(0)
    for _ in range(2000):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


def test_a_free_worker_is_sent_at_once_and_completion_frees_it() -> None:
    m = fleet()

    async def main() -> None:
        t = await m.dispatch("m", tenant="a", prompt_tokens=100, max_tokens=50, blocks=60)
        assert isinstance(t, FlowTicket)
        assert t.worker == 1
        assert m.is_busy(1), "60 of 100 blocks booked"
        t.report_output(10)
        t.complete(20)
        assert t.completed
        assert not m.is_busy(1)
        async with await m.dispatch("m", blocks=60) as t2:
            assert m.is_busy(1)
        assert t2.completed and not m.is_busy(1)

    run(main)


def test_output_blocks_grow_the_booking_on_the_rank_the_ticket_names() -> None:
    m = Monitor()
    m.add_worker("m", 2, dp_start=4, dp_size=2, kv_total_blocks=100)
    m.set_thresholds("m", active_decode_blocks_threshold=0.5)
    m.set_flow_control("m", queue_limit=8)
    held = m.book(2, 4, 60)  # rank 4 busy

    async def main() -> None:
        t = await m.dispatch("m", blocks=3)
        assert t.dp_rank == 5, "the less loaded rank"
        assert not m.is_busy(2)
        t.add_output_blocks(48)
        assert m.is_busy(2), "51 of 100 blocks booked on rank 5"
        with pytest.raises((TypeError, ValueError, OverflowError)):
            t.add_output_blocks(-1)
        t.complete()
        assert not m.is_busy(2)
        t.add_output_blocks(60)  # completed: nothing is booked
        assert not m.is_busy(2)

    run(main)
    held.release()


def test_with_a_scale_up_limit_requests_wait_for_a_worker_to_join() -> None:
    m = fleet(scale_up_limit=1)
    m.remove_worker(1)

    async def main() -> None:
        task = asyncio.ensure_future(m.dispatch("m", tenant="a", blocks=1))
        await until(lambda: waiting(m) == 1)
        assert not task.done()
        with pytest.raises(Unavailable) as e:
            await m.dispatch("m", tenant="b", blocks=1)
        assert e.value.reason == "no_workers"
        m.add_worker("m", 2, kv_total_blocks=100)
        t = await task
        assert t.worker == 2
        t.complete()

    run(main)
    with pytest.raises(ValueError, match="scale_up_limit"):
        m.set_flow_control("m", queue_limit=2, scale_up_limit=3)


def test_a_queued_request_goes_when_a_report_frees_the_worker() -> None:
    m = fleet()
    busy(m)

    async def main() -> None:
        task = asyncio.ensure_future(m.dispatch("m", tenant="a", blocks=1))
        await until(lambda: waiting(m) == 1)
        assert not task.done()
        free(m)
        t = await task
        assert t.worker == 1
        t.complete()

    run(main)


def test_a_report_from_another_thread_wakes_the_loop() -> None:
    m = fleet()
    busy(m)

    async def main() -> None:
        task = asyncio.ensure_future(m.dispatch("m", blocks=1))
        await until(lambda: waiting(m) == 1)
        threading.Thread(target=free, args=(m,)).start()
        t = await task
        t.complete()

    run(main)


def test_requests_wait_in_order_and_a_release_sends_the_next() -> None:
    m = fleet()

    async def main() -> None:
        first = await m.dispatch("m", tenant="a", blocks=60)
        b = asyncio.ensure_future(m.dispatch("m", tenant="b", blocks=60))
        await until(lambda: waiting(m) == 1)
        c = asyncio.ensure_future(m.dispatch("m", tenant="c", blocks=60))
        await until(lambda: waiting(m) == 2)
        assert not b.done() and not c.done()
        first.complete()
        second = await b
        assert not c.done()
        second.complete()
        (await c).complete()

    run(main)


def test_a_cancelled_request_leaves_the_queue() -> None:
    m = fleet()
    busy(m)

    async def main() -> None:
        task = asyncio.ensure_future(m.dispatch("m", blocks=1))
        await until(lambda: waiting(m) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert waiting(m) == 0
        free(m)
        # Nothing of it is left: the next request goes at once.
        t = await asyncio.wait_for(m.dispatch("m", blocks=1), 5)
        t.complete()

    run(main)


def test_a_request_is_refused_at_its_deadline() -> None:
    m = fleet(deadline=0.05)
    busy(m)

    async def main() -> None:
        with pytest.raises(QueueTimeout) as e:
            await m.dispatch("m", blocks=1)
        assert e.value.reason == "queue_deadline"
        assert e.value.status_code == 529
        assert e.value.retry_after is not None and e.value.retry_after >= 1
        assert e.value.headers()["x-loadgate-reason"] == "queue_deadline"
        # A request's own deadline, shorter.
        m.set_flow_control("m", queue_limit=8, deadline=30)
        with pytest.raises(QueueTimeout):
            await m.dispatch("m", blocks=1, deadline=0.02)

    run(main)


def test_a_full_queue_sheds_the_heavy_tenant_for_a_light_one() -> None:
    m = fleet(queue_limit=2)
    busy(m)

    async def main() -> None:
        h1 = asyncio.ensure_future(m.dispatch("m", tenant="heavy", blocks=1))
        h2 = asyncio.ensure_future(m.dispatch("m", tenant="heavy", blocks=1))
        await until(lambda: waiting(m) == 2)
        light = asyncio.ensure_future(m.dispatch("m", tenant="light", blocks=1))
        with pytest.raises(Overloaded) as e:
            await h2
        assert e.value.reason == "queue_full"
        # heavy's own next arrival is the heaviest: refused itself.
        with pytest.raises(Overloaded):
            await m.dispatch("m", tenant="heavy", blocks=1)
        free(m)
        (await h1).complete()
        (await light).complete()

    run(main)


def test_the_opt_out_no_workers_and_turning_the_queue_off() -> None:
    m = fleet()
    busy(m)

    async def main() -> None:
        with pytest.raises(Overloaded) as e:
            await m.dispatch("m", queue=False)
        assert e.value.reason == "all_workers_busy"
        pending = asyncio.ensure_future(m.dispatch("m", blocks=1))
        await until(lambda: waiting(m) == 1)
        m.set_flow_control("m", queue_limit=0)
        with pytest.raises(Overloaded) as e:
            await pending
        assert e.value.reason == "queue_full"
        m.set_flow_control("m", queue_limit=4)
        pending = asyncio.ensure_future(m.dispatch("m", blocks=1))
        await until(lambda: waiting(m) == 1)
        m.remove_worker(1)
        with pytest.raises(Unavailable) as e2:
            await pending
        assert e2.value.reason == "no_workers"
        with pytest.raises(Unavailable):
            await m.dispatch("unknown-model")

    run(main)


def test_awaiting_twice_and_bad_input() -> None:
    m = fleet()

    async def main() -> None:
        d = m.dispatch("m", blocks=1)
        (await d).complete()
        with pytest.raises(RuntimeError):
            await d

    run(main)
    with pytest.raises(KeyError):
        m.set_flow_control("nope", queue_limit=4)
    for kwargs, exc in [
        ({"queue_limit": -1}, ValueError),
        ({"queue_limit": "4"}, TypeError),
        ({"queue_limit": 4, "deadline": 0}, ValueError),
        ({"queue_limit": 4, "prompt_weight": float("nan")}, ValueError),
        ({"queue_limit": 4, "tenant_weights": {"t": 0}}, ValueError),
        ({"queue_limit": 4, "tenant_weights": [1]}, ValueError),
        ({"queue_limit": 4, "policy": "best"}, ValueError),
        ({"queue_limit": 2**21}, ValueError),
    ]:
        with pytest.raises(exc):
            m.set_flow_control("m", **kwargs)

    async def long_tenant() -> None:
        with pytest.raises(ValueError, match="256 bytes"):
            await m.dispatch("m", tenant="x" * 300)

    run(long_tenant)
    with pytest.raises(ValueError):
        m.dispatch("m", prompt_tokens=-1)
    with pytest.raises(TypeError):
        m.dispatch("m", priority="high")


def test_a_workers_refusal_is_routed_once_more_then_refused() -> None:
    m = Monitor(reroutes=1)
    for w in (1, 2):
        m.add_worker("m", w, kv_total_blocks=100)
    m.set_thresholds("m", active_decode_blocks_threshold=0.5)

    async def main() -> None:
        ticket = await m.dispatch("m", blocks=60)
        refuser = ticket.worker
        assert m.is_busy(refuser)
        again = await m.redispatch(ticket)
        assert again.worker != refuser
        assert m.is_leased(refuser)
        assert not m.is_busy(refuser), "the refuser keeps the booking"
        assert m.is_busy(again.worker)
        with pytest.raises(ValueError, match="handed back"):
            m.redispatch(ticket)
        with pytest.raises(Overloaded) as e:
            await m.redispatch(again)
        assert e.value.reason == "all_workers_busy"
        assert not m.is_busy(1) and not m.is_busy(2)
        with pytest.raises(ValueError, match="ticket"):
            m.redispatch("not a ticket")

    run(main)
    with pytest.raises(ValueError, match="reroutes"):
        Monitor(reroutes=17)
    with pytest.raises(ValueError, match="policy"):
        Monitor(routing="fastest")


def test_a_workers_refusal_goes_back_into_the_queue_first() -> None:
    m = fleet()

    async def main() -> None:
        ticket = await m.dispatch("m", tenant="a", blocks=60)
        later = asyncio.ensure_future(m.dispatch("m", tenant="a", blocks=60))
        await until(lambda: waiting(m) == 1)
        back = asyncio.ensure_future(m.redispatch(ticket))
        await until(lambda: waiting(m) == 2)
        # The refuser's next report ends its lease: the refused request
        # goes first, ahead of the one that came after it.
        free(m)
        sent = await back
        assert sent.worker == 1
        assert not later.done()
        sent.complete()
        (await later).complete()

    run(main)
