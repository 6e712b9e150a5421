"""Every synchronous `AdmissionGate` and `Permit` method, including bad input."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import pytest

import loadgate
from loadgate import AdmissionGate, AtCapacity, Closed, QueueTimeout


def test_properties_and_repr() -> None:
    g = AdmissionGate(2)
    assert (g.limit, g.queue_limit, g.running, g.queued, g.closed, g.queue_timeout) == (2, 16, 0, 0, False, None)
    g = AdmissionGate(3, 0, queue_timeout=0.25, adaptive_lifo=True, metrics_prefix="w")
    assert (g.limit, g.queue_limit, g.queue_timeout) == (3, 0, 0.25)
    assert "limit=3" in repr(g) and "queue_limit=0" in repr(g)
    assert "w_engine_request_limit 3" in g.metrics_text()


@pytest.mark.parametrize(
    "args,kwargs,exc,match",
    [
        ((0,), {}, ValueError, "limit"),
        ((-1,), {}, ValueError, "limit"),
        ((2**21,), {}, ValueError, "limit"),
        (("4",), {}, TypeError, "limit"),
        ((4.0,), {}, TypeError, "limit"),
        ((None,), {}, TypeError, "limit"),
        ((1, -1), {}, ValueError, "queue"),
        ((1, 2**21), {}, ValueError, "queue"),
        ((1, "2"), {}, TypeError, "queue"),
        ((1,), {"queue_timeout": 0}, ValueError, "queue_timeout"),
        ((1,), {"queue_timeout": -1.0}, ValueError, "queue_timeout"),
        ((1,), {"queue_timeout": float("nan")}, ValueError, "queue_timeout"),
        ((1,), {"queue_timeout": "1"}, TypeError, "queue_timeout"),
        ((1,), {"adaptive_lifo": 1}, TypeError, "adaptive_lifo"),
        ((1,), {"metrics_prefix": "a-b"}, ValueError, "metrics_prefix"),
        ((1,), {"metrics_prefix": 5}, TypeError, "metrics_prefix"),
        ((1,), {"wait_limit": 0}, ValueError, "wait_limit"),
        ((1,), {"wait_limit": 2**21}, ValueError, "wait_limit"),
        ((1,), {"wait_limit": "1"}, TypeError, "wait_limit"),
    ],
)
def test_constructor_bad_input(args: tuple[Any, ...], kwargs: dict[str, Any], exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        AdmissionGate(*args, **kwargs)


def test_try_admit_release_and_no_barging() -> None:
    g = AdmissionGate(2, 1)
    a = g.try_admit()
    b = g.try_admit()
    assert a is not None and b is not None
    assert g.try_admit() is None  # no slot: never queues, never counts as a rejection
    assert g.running == 2
    a.release()
    assert a.released and g.running == 1
    a.release()  # idempotent
    assert g.running == 1
    assert repr(a) == "<loadgate.Permit released>" and repr(b) == "<loadgate.Permit held>"
    # A waiter is owed the next slot: try_admit must not take it.
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(g.admit_blocking(5)))
    c = g.try_admit()
    assert c is not None
    t.start()
    while g.queued == 0:
        time.sleep(0.001)
    c.release()  # handed straight to the waiter
    t.join()
    assert g.try_admit() is None
    assert g.running == 2
    for p in (b, got[0]):
        p.release()
    assert g.running == 0
    s = g.stats()
    assert s["admitted_queued"] == 1 and s["rejected_at_capacity"] == 0


def test_permit_context_manager_and_gc() -> None:
    g = AdmissionGate(1, 0)
    with g.admit_blocking() as p:
        assert g.running == 1
        assert not p.released
    assert p.released and g.running == 0
    with pytest.raises(RuntimeError):
        with g.admit_blocking():
            raise RuntimeError("body failed")
    assert g.running == 0
    g.try_admit()  # dropped at once
    gc.collect()
    assert g.running == 0
    permit = g.try_admit()
    assert permit is not None
    del permit
    assert g.running == 0


def test_admit_blocking_rejections_and_timeout() -> None:
    g = AdmissionGate(1, 1)
    p = g.admit_blocking()
    start = time.monotonic()
    with pytest.raises(QueueTimeout, match="timed out") as info:
        g.admit_blocking(timeout=0.05)
    assert time.monotonic() - start >= 0.04
    assert info.value.status_code == 529
    assert g.queued == 0 and g.stats()["cancelled"] == 1  # left the queue: not a rejection
    with pytest.raises(QueueTimeout):
        g.admit_blocking(timeout=0)
    # Fill the queue from another thread, then a third request is refused at once.
    waiter_done = threading.Event()

    def waiter() -> None:
        with g.admit_blocking(timeout=10):
            pass
        waiter_done.set()

    t = threading.Thread(target=waiter)
    t.start()
    while g.queued == 0:
        time.sleep(0.001)
    with pytest.raises(AtCapacity) as capacity:
        g.admit_blocking(timeout=10)
    assert capacity.value.reason == "worker_at_capacity"
    assert g.stats()["rejected_at_capacity"] == 1
    p.release()
    t.join()
    assert waiter_done.is_set() and g.running == 0
    for bad, exc in ((-1, ValueError), (float("nan"), ValueError), ("1", TypeError)):
        with pytest.raises(exc, match="timeout"):
            g.admit_blocking(bad)  # type: ignore[arg-type]


def test_queue_deadline_for_blocking_waiters() -> None:
    g = AdmissionGate(1, 2, queue_timeout=0.05)
    p = g.admit_blocking()
    with pytest.raises(QueueTimeout, match="admission queue delay"):
        g.admit_blocking(timeout=5)
    assert g.stats()["expired"] == 1
    assert g.expire() == 0
    p.release()


def test_set_limit() -> None:
    g = AdmissionGate(1, 4)
    p = g.admit_blocking()
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(g.admit_blocking(10))) for _ in range(3)]
    for t in threads:
        t.start()
    while g.queued < 3:
        time.sleep(0.001)
    g.set_limit(3)  # raising admits waiters at once
    deadline = time.monotonic() + 30  # a limit for a hang only
    while len(results) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert (g.limit, g.running, g.queued, len(results)) == (3, 3, 1, 2)
    g.set_limit(1)  # lowering revokes nothing
    assert g.running == 3
    for q in results[:2]:
        q.release()
    assert g.running == 1 and g.queued == 1  # drained down to the new limit
    p.release()
    for t in threads:
        t.join()
    results[2].release()
    assert g.running == 0
    for bad, exc in ((0, ValueError), (2**21, ValueError), (-3, ValueError), ("2", TypeError)):
        with pytest.raises(exc, match="limit"):
            g.set_limit(bad)  # type: ignore[arg-type]


def test_close() -> None:
    g = AdmissionGate(1, 2)
    p = g.admit_blocking()
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            g.admit_blocking(10)
        except BaseException as e:  # checked below
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    while g.queued == 0:
        time.sleep(0.001)
    g.close()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], Closed)
    assert errors[0].status_code == 503 and errors[0].reason == "closed"
    assert g.closed
    with pytest.raises(Closed):
        g.try_admit()
    with pytest.raises(Closed):
        g.admit_blocking()
    p.release()  # permits held stay valid
    assert g.running == 0
    g.close()  # twice is harmless
    assert "closed" in repr(g)


def test_stats_and_metrics() -> None:
    g = AdmissionGate(1, 0)
    p = g.try_admit()
    with pytest.raises(AtCapacity):
        g.admit_blocking()
    s = g.stats()
    assert s == {
        "running": 1, "queued": 0, "limit": 1, "queue_limit": 0, "closed": False,
        "waiting": 0, "wait_limit": None, "received": 2,
        "admitted_direct": 1, "admitted_queued": 0, "rejected_at_capacity": 1,
        "rejected_closed": 0, "expired": 0, "cancelled": 0,
    }
    text = g.metrics_text()
    for line in (
        "dynamo_rejection_request_total 1",
        "dynamo_engine_request 1",
        "dynamo_request_queue 0",
        'dynamo_request_rejection_by_reason_total{reason="worker_at_capacity"} 1',
        "# TYPE dynamo_request_queue_wait_seconds histogram",
    ):
        assert line in text
    assert p is not None
    p.release()


def test_wait_limit_first_response_hands_off_to_a_blocked_thread() -> None:
    g = AdmissionGate(2, 1, wait_limit=1)
    assert (g.wait_limit, g.waiting) == (1, 0)
    assert AdmissionGate(2).wait_limit is None
    p = g.try_admit()
    assert p is not None and g.waiting == 1
    assert g.try_admit() is None  # a request slot is free, a wait slot is not
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(g.admit_blocking()))
    t.start()
    deadline = time.monotonic() + 30  # a limit for a hang only
    while g.queued == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert g.queued == 1
    with pytest.raises(AtCapacity):
        g.admit_blocking()  # the queue is full
    p.first_response()
    t.join(30)
    assert len(got) == 1 and (g.running, g.waiting, g.queued) == (2, 1, 0)
    p.first_response()  # idempotent
    assert g.waiting == 1
    got[0].release()  # never responded: frees both
    p.release()
    p.first_response()  # after release: a no-op
    s = g.stats()
    assert (s["running"], s["waiting"], s["wait_limit"], s["admitted_queued"]) == (0, 0, 1, 1)
    assert "dynamo_backend_admission_engine_wait_count 0" in g.metrics_text()
    assert "dynamo_backend_admission_request_receive_total 3" in g.metrics_text()


def test_first_response_is_a_no_op_without_a_wait_limit() -> None:
    g = AdmissionGate(1, 0)
    p = g.try_admit()
    assert p is not None
    p.first_response()
    assert (g.running, g.waiting) == (1, 0)
    p.release()


def test_from_env_in_process() -> None:
    # The variables themselves are tested in subprocesses (test_env.py);
    # this checks the call shape with whatever the environment holds.
    with pytest.raises(ValueError, match="limit"):
        AdmissionGate.from_env()
    with pytest.raises(ValueError, match="limit"):
        AdmissionGate.from_env(0)
    with pytest.raises(TypeError, match="limit"):
        AdmissionGate.from_env("3")  # type: ignore[arg-type]


def test_objects_are_shareable_between_threads() -> None:
    # frozen classes: no borrow errors when used from many threads at once
    g = AdmissionGate(4, 64)
    seen = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(500):
            with g.admit_blocking(10):
                with lock:
                    seen.append(g.running)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(seen) <= 4 and g.running == 0 and g.queued == 0
    assert isinstance(loadgate.Permit, type)
