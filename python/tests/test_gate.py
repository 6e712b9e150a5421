"""Every synchronous `AdmissionGate` and `Permit` method, including bad input."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import pytest

import loadgate
from loadgate import AdmissionGate, AtCapacity, Closed, Displaced, ManualClock, PriorityClass, QueueTimeout


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


def blocked(g: AdmissionGate, *args: Any, **kwargs: Any) -> tuple[threading.Thread, list[BaseException]]:
    """Starts a thread blocked in `g.admit_blocking(*args, **kwargs)`; the
    list gets what it raised (a permit it got is released)."""
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            g.admit_blocking(*args, **kwargs).release()
        except BaseException as e:  # checked by the caller
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    return t, errors


def test_queue_deadline_for_blocking_waiters() -> None:
    # On a manual clock the deadline is the clock's: the waiter blocks (its
    # own timeout is real time, far away) until the clock passes it and
    # expire() runs.
    clock = ManualClock()
    g = AdmissionGate(1, 2, queue_timeout=30, clock=clock)
    p = g.admit_blocking()
    t, errors = blocked(g, 60)
    wait_queued(g, 1)
    clock.advance(29.5)
    assert g.expire() == 0 and g.queued == 1  # not due yet
    clock.advance(0.5)
    expired = g.expire()  # due at exactly 30 s after it queued
    if expired == 0 and g.queued == 1:
        # It queued later than 0: a waiter counts itself, then stamps its
        # queue time as it pushes, and a busy machine may run this thread's
        # first advance in between. It is due 30 s after that.
        clock.advance(30)
        expired = g.expire()
    # Expired by one of these calls, or by the waiter itself (its own
    # real-time wake-up, re-armed by a call above): exactly once either way.
    assert expired in (0, 1)
    t.join(30)
    assert len(errors) == 1 and isinstance(errors[0], QueueTimeout)
    assert "admission queue delay" in str(errors[0])
    assert g.stats()["expired"] == 1 and g.queued == 0
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
        "rejected_closed": 0, "expired": 0, "cancelled": 0, "displaced": 0,
        "classes": [{
            "queued": 0, "queue_limit": 0, "rejected_at_capacity": 1, "expired": 0,
            "rejected_closed": 0, "displaced": 0,
        }],
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


# ----- priority classes ------------------------------------------------------


def wait_queued(g: AdmissionGate, n: int) -> None:
    deadline = time.monotonic() + 30  # a limit for a hang only
    while g.queued < n and time.monotonic() < deadline:
        time.sleep(0.001)
    assert g.queued == n


def class_stat(g: AdmissionGate, field: str) -> list[int]:
    return [c[field] for c in g.stats()["classes"]]


def test_priority_class_object() -> None:
    c = PriorityClass(queue=3, queue_timeout=0.25, reserved=1)
    assert (c.queue, c.queue_timeout, c.reserved) == (3, 0.25, 1)
    assert repr(c) == "PriorityClass(queue=3, queue_timeout=0.25, reserved=1)"
    d = PriorityClass()
    assert (d.queue, d.queue_timeout, d.reserved) == (None, None, 0)
    assert repr(d) == "PriorityClass(queue=None, queue_timeout=None, reserved=0)"
    assert d == PriorityClass() and d != c and hash(d) == hash(PriorityClass())
    assert PriorityClass(queue=0).queue == 0  # a class that never waits
    with pytest.raises(AttributeError):
        c.queue = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        PriorityClass(3)  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"queue": -1}, ValueError, "queue = -1"),
        ({"queue": "4"}, TypeError, "queue"),
        ({"queue_timeout": 0}, ValueError, "queue_timeout = 0"),
        ({"queue_timeout": -0.5}, ValueError, "queue_timeout"),
        ({"queue_timeout": float("inf")}, ValueError, "queue_timeout"),
        ({"queue_timeout": "1"}, TypeError, "queue_timeout"),
        ({"reserved": -1}, ValueError, "reserved = -1"),
        ({"reserved": 1.0}, TypeError, "reserved"),
    ],
)
def test_priority_class_bad_input(kwargs: dict[str, Any], exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        PriorityClass(**kwargs)


def test_classes_accepted() -> None:
    assert AdmissionGate(2).classes == 1
    assert len(AdmissionGate(2).stats()["classes"]) == 1
    g = AdmissionGate(2, 5, classes=3)  # each may fill the whole queue
    assert g.classes == 3 and "classes=3" in repr(g)
    assert class_stat(g, "queue_limit") == [5, 5, 5]
    g = AdmissionGate(4, 6, classes=[PriorityClass(reserved=1), PriorityClass(queue=2), PriorityClass(queue=0)])
    assert g.classes == 3
    assert class_stat(g, "queue_limit") == [6, 2, 0]  # None: the whole queue
    g = AdmissionGate(2, 4, classes=(PriorityClass() for _ in range(8)))  # any iterable, up to 8
    assert g.classes == 8
    assert AdmissionGate(2, classes=None).classes == 1
    text = AdmissionGate(1, 2, classes=2).metrics_text()
    assert "dynamo_request_queue" in text


@pytest.mark.parametrize(
    "args,classes,exc,match",
    [
        ((2, 4), 0, ValueError, r"classes = 0 is invalid: must be an integer from 1 to 8"),
        ((2, 4), 9, ValueError, r"classes = 9 is invalid"),
        ((2, 4), -1, ValueError, r"classes = -1"),
        ((2, 4), 2**70, ValueError, r"classes = \d+ is invalid"),
        ((2, 4), [], ValueError, r"classes has no entries"),
        ((2, 4), [PriorityClass()] * 9, ValueError, r"classes has more than 8 entries"),
        ((2, 4), [PriorityClass(), PriorityClass(queue=5)], ValueError, r"class 1: queue = 5 is out of range: must be at most 4"),
        ((2, 4), [PriorityClass(reserved=3)], ValueError, r"class 0: reserved = 3 is out of range: must be at most 2"),
        ((2, 0), [PriorityClass(queue=1)], ValueError, r"class 0: queue = 1"),
        ((2, 4), 2.0, TypeError, r"classes must be an int or a sequence of loadgate.PriorityClass, not float"),
        ((2, 4), "ab", TypeError, r"classes must be an int or a sequence"),
        ((2, 4), [PriorityClass(), 1], TypeError, r"classes\[1\] must be a loadgate.PriorityClass, not int"),
    ],
)
def test_classes_refused(args: tuple[int, int], classes: Any, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        AdmissionGate(*args, classes=classes)


@pytest.mark.parametrize("priority", [-1, 256, 2**70, -(2**70)])
def test_priority_out_of_range(priority: int) -> None:
    g = AdmissionGate(1, 1, classes=2)
    match = rf"priority = {priority} is invalid: must be an integer from 0 to 255"
    with pytest.raises(ValueError, match=match):
        g.try_admit(priority=priority)
    with pytest.raises(ValueError, match=match):
        g.admit(priority=priority)
    with pytest.raises(ValueError, match=match):
        g.admit_blocking(priority=priority)
    with pytest.raises(TypeError, match="priority must be an int, not str"):
        g.admit_blocking(priority="0")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="priority must be an int, not float"):
        g.try_admit(priority=1.0)  # type: ignore[arg-type]
    assert (g.running, g.queued, g.stats()["received"]) == (0, 0, 0)  # nothing was admitted


def test_priority_past_the_last_class_is_the_last() -> None:
    g = AdmissionGate(1, 0, classes=3)
    p = g.try_admit(priority=255)
    assert p is not None
    with pytest.raises(AtCapacity):
        g.admit_blocking(priority=9)
    assert class_stat(g, "rejected_at_capacity") == [0, 0, 1]
    p.release()


def test_reserved_slots_over_try_admit() -> None:
    # N = 3; the last slot is for class 0 only.
    g = AdmissionGate(3, 2, classes=[PriorityClass(reserved=1), PriorityClass()])
    low = [g.try_admit(priority=1), g.try_admit(priority=1)]
    assert all(p is not None for p in low)
    assert g.try_admit(priority=1) is None  # only the reserved slot is left
    top = g.try_admit(priority=0)
    assert top is not None and g.running == 3
    for p in [top, *low]:
        assert p is not None
        p.release()


def test_more_important_blocked_waiter_goes_first_and_displacement() -> None:
    g = AdmissionGate(1, 2, classes=3)
    held = g.admit_blocking()
    results: dict[str, Any] = {}

    def wait(name: str, priority: int) -> None:
        try:
            results[name] = g.admit_blocking(10, priority=priority)
        except BaseException as e:  # checked below
            results[name] = e

    threads = {}
    for name, priority in (("low", 2), ("mid", 1), ("top", 0)):
        threads[name] = threading.Thread(target=wait, args=(name, priority))
        threads[name].start()
        if name != "top":
            wait_queued(g, len(threads))
    # The queue was full (low, mid): top displaced the newest waiter of the
    # least important class below it.
    threads["low"].join(30)
    e = results["low"]
    assert isinstance(e, Displaced) and isinstance(e, loadgate.Overloaded)
    assert (e.status_code, e.reason, e.retry_after) == (529, "displaced", 1.0)
    assert e.headers()["x-loadgate-reason"] == "displaced"
    # The classes' counts (what stats() sums) trail the state word by the few
    # instructions between an arrival's two counts: wait on them, not on
    # g.queued.
    deadline = time.monotonic() + 30  # a limit for a hang only
    while g.stats()["queued"] < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    s = g.stats()
    assert s["displaced"] == 1 and [c["displaced"] for c in s["classes"]] == [0, 0, 1]
    assert [c["queued"] for c in s["classes"]] == [1, 1, 0]
    # A class-2 arrival finds nobody below it: rejected at once.
    with pytest.raises(AtCapacity):
        g.admit_blocking(10, priority=2)
    held.release()  # to class 0 first, although class 1 waited longer
    threads["top"].join(30)
    assert isinstance(results["top"], loadgate.Permit) and "mid" not in results
    results["top"].release()
    threads["mid"].join(30)
    results["mid"].release()
    assert (g.running, g.queued) == (0, 0)
    assert class_stat(g, "rejected_at_capacity") == [0, 0, 1]


def test_class_queue_deadlines_for_blocking_waiters() -> None:
    clock = ManualClock()
    # Class 0 has its own deadline, class 1 none (the gate has none).
    g = AdmissionGate(1, 4, classes=[PriorityClass(queue_timeout=30), PriorityClass()], clock=clock)
    held = g.admit_blocking()
    hurried, hurried_errors = blocked(g, 60, priority=0)
    wait_queued(g, 1)
    patient, patient_errors = blocked(g, 60, priority=1)
    wait_queued(g, 2)
    clock.advance(30)
    assert g.expire() == 1
    hurried.join(30)
    assert len(hurried_errors) == 1 and isinstance(hurried_errors[0], QueueTimeout)
    assert "admission queue delay" in str(hurried_errors[0])
    clock.advance(3600)
    assert g.expire() == 0 and g.queued == 1
    with pytest.raises(QueueTimeout, match="timed out"):  # the caller's timeout, in real time
        g.admit_blocking(0.01, priority=1)
    assert class_stat(g, "expired") == [1, 0]
    held.release()
    patient.join(30)
    assert patient_errors == [] and g.running == 0
    # queue_timeout=None copies the gate's deadline.
    g = AdmissionGate(1, 4, queue_timeout=30, classes=[PriorityClass(queue_timeout=600), PriorityClass()], clock=clock)
    assert g.queue_timeout == 30
    held = g.admit_blocking()
    top, top_errors = blocked(g, 60, priority=0)
    wait_queued(g, 1)
    low, low_errors = blocked(g, 60, priority=1)
    wait_queued(g, 2)
    clock.advance(30)
    assert g.expire() == 1
    low.join(30)
    assert len(low_errors) == 1 and isinstance(low_errors[0], QueueTimeout)
    assert class_stat(g, "expired") == [0, 1]
    held.release()
    top.join(30)
    assert top_errors == [] and g.running == 0


def test_clock_argument() -> None:
    clock = ManualClock()
    assert clock.now() == 0.0 and "ManualClock" in repr(clock)
    clock.advance(1.5)
    clock.advance(0)
    assert clock.now() == 1.5
    for bad, exc in ((-1, ValueError), (float("nan"), ValueError), (float("inf"), ValueError), ("1", TypeError)):
        with pytest.raises(exc, match="seconds"):
            clock.advance(bad)  # type: ignore[arg-type]
    assert clock.now() == 1.5
    AdmissionGate(1, clock=None)
    AdmissionGate.from_env(1, clock=clock)
    for not_a_clock in (object(), 1.0, time.monotonic):
        with pytest.raises(TypeError, match="clock must be None or a loadgate.ManualClock"):
            AdmissionGate(1, clock=not_a_clock)  # type: ignore[arg-type]
    # One clock may drive several gates; each counts from when it queued.
    a = AdmissionGate(1, 1, queue_timeout=2, clock=clock)
    b = AdmissionGate(1, 1, queue_timeout=3, clock=clock)
    held = [a.admit_blocking(), b.admit_blocking()]
    ta, ea = blocked(a, 60)
    tb, eb = blocked(b, 60)
    wait_queued(a, 1)
    wait_queued(b, 1)
    clock.advance(2)
    a.expire()
    # b's 3 s have not passed since it queued: nobody may expire it yet.
    assert b.expire() == 0 and b.queued == 1
    # Then each expires once its own deadline has passed since it queued
    # (at 0, or a moment later on a busy machine: see the test above), by
    # expire() or by its waiter's own wake-up.
    for _ in range(5):
        clock.advance(1)
        a.expire()
        b.expire()
    for t in (ta, tb):
        t.join(30)
    assert [type(e) for e in ea + eb] == [QueueTimeout, QueueTimeout]
    assert a.stats()["expired"] == 1 and b.stats()["expired"] == 1
    for p in held:
        p.release()


def test_a_class_that_never_waits_and_per_class_stats() -> None:
    g = AdmissionGate(1, 2, classes=[PriorityClass(), PriorityClass(queue=0)])
    held = g.try_admit(priority=1)
    assert held is not None
    with pytest.raises(AtCapacity):
        g.admit_blocking(priority=1)  # never queued, though the queue has room
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            g.admit_blocking(10)
        except BaseException as e:  # checked below
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    wait_queued(g, 1)
    g.close()
    t.join(30)
    assert len(errors) == 1 and isinstance(errors[0], Closed)
    s = g.stats()
    assert s["rejected_closed"] == 1 and s["rejected_at_capacity"] == 1
    assert s["classes"] == [
        {"queued": 0, "queue_limit": 2, "rejected_at_capacity": 0, "expired": 0, "rejected_closed": 1, "displaced": 0},
        {"queued": 0, "queue_limit": 0, "rejected_at_capacity": 1, "expired": 0, "rejected_closed": 0, "displaced": 0},
    ]
    held.release()
